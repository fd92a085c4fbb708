#!/usr/bin/env bash
# One device call's first part: environment facts and the GPU tests (extra pytest arguments
# are passed on). Usage (on the device, from the repo root): bash experiments/scripts/gpu_session.sh
# Writes under $OUT (or ./gpu-out when OUT is unset): env.txt, pytest-gpu.log.
set -u -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import json, rnnrt.session as s; print(json.dumps(s.device_info()))"; } 2>&1 | tee "$OUT/env.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest-gpu.log" | tail -40
echo "pytest exit: ${PIPESTATUS[0]}"
