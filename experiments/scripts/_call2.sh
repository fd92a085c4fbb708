set -u
export RNNRT_CACHE_DIR=/tmp/rc PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_typed_persistent.py tests/gpu/test_gpu_precision.py tests/gpu/test_gpu_runner_dtype.py 2>&1 | tee $OUT/r/gpu-tests-typed.log | tail -15
python experiments/scripts/typed_persistent_bench.py --out $OUT/r --dtypes float32,tf32,bfloat16,float16 2>&1 | tail -32
python -m rnnrt sweep --preset wide --dtype bfloat16 --pass fwd --time-budget 200 --out $OUT/r/wide-bf16.jsonl 2>&1 | grep -v "^\[#" | tail -8
cd $OUT && tar czf call2.tgz r && rm -rf r
