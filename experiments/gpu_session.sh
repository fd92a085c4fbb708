#!/usr/bin/env bash
# One device call: environment facts, the GPU tests, with any extra pytest arguments.
# Usage (on the device, from the repo root): bash experiments/gpu_session.sh [pytest args ...]
# Writes everything under $OUT (or ./gpu-out when OUT is unset).
set -u -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -c "import json, rnnrt.device as d; print(json.dumps(d.device_info()))" | tee "$OUT/device.json"
python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest-gpu.log" | tail -40
echo "pytest exit: ${PIPESTATUS[0]}"
