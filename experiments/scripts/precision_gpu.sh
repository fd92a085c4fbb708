#!/usr/bin/env bash
# Issue 23's user-facing GPU part, one device call (~4 minutes on an H100, compiles included):
# the paper-shape ladder (LSTM 4 x 512, batch 64, 100 steps) at tf32, bfloat16 and float16,
# forward and forward+backward, the persistent rung (its fallback said at 16 bits) and auto
# beside cuDNN at the same precision; `rnnrt precision` (four dtypes, T 100 and 1000, and the
# T 10000 16-bit forwards); the rnnrt.nn precision tests against cuDNN.
# Usage (on the device, from the repo root): bash experiments/scripts/precision_gpu.sh
# Records go to $RNNRT_OUT (default experiments: experiments/results/{ladder,precision}/);
# logs under $OUT (or ./gpu-out): precision-ladder.log, precision-report.log,
# pytest-nn-precision.log. Exit status: the number of steps that failed.
set -u -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 RNNRT_OUT=${RNNRT_OUT:-experiments}
failed=0
for d in tf32 bfloat16 float16; do
  for pass in "" --backward; do
    python3 -m rnnrt ladder --dtype "$d" $pass --rungs +persistent,auto --executor graph \
      --repeats 10 2>&1 | tee -a "$OUT/precision-ladder.log" | tail -12
    [ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))
  done
done
python3 -m rnnrt precision 2>&1 | tee "$OUT/precision-report.log" | tail -30
[ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))
python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_nn_precision.py 2>&1 \
  | tee "$OUT/pytest-nn-precision.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))
echo "precision_gpu.sh: $failed step(s) failed"
exit "$failed"
