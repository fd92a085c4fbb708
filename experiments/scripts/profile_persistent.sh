#!/usr/bin/env bash
# Profile one persistent launch (LSTM H 512 B 64, 20 steps) with Nsight Compute and dump the
# kernel's SASS: where a step's time goes, instruction by instruction. On the device, from the
# repo root: OUT=dir [KERNEL=name] bash experiments/scripts/profile_persistent.sh [persistent_bench args]
# (KERNEL: the kernel to profile, default lstm_persistent_fwd; e.g. KERNEL=
# lstm_persistent_cluster_fwd with --hidden 128 --batch 32 --kinds cluster; KERNEL=
# lstm_persistent_stack_fwd BENCH=experiments/scripts/stack_bench.py with --no-cudnn)
# Writes $OUT/prof.ncu-rep, details.txt (speed of light, warp states, scheduler, memory),
# source.csv (per-SASS-line stall samples), top-stalls.txt (the 40 lines with most samples),
# lstm.sass. --clock-control none: the clocks are left as the benchmarks see them.
set -u -o pipefail
OUT=${OUT:-prof-out}; mkdir -p "$OUT"
KERNEL=${KERNEL:-lstm_persistent_fwd}
BENCH=${BENCH:-experiments/scripts/persistent_bench.py}
[ "$BENCH" = experiments/scripts/persistent_bench.py ] && set -- --units '' "$@"   # the fit's U only
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvcc -arch=sm_90 -std=c++17 -cubin -o "$OUT/pk.cubin" cuda_src/persistent.cu && \
  cuobjdump -sass -fun "$KERNEL" "$OUT/pk.cubin" > "$OUT/lstm.sass"
ncu --clock-control none --set full --import-source no -k "regex:^$KERNEL\$" -c 1 \
    -o "$OUT/prof" -f python3 "$BENCH" --steps 20 --repeats 1 "$@" > "$OUT/ncu.log" 2>&1
ncu -i "$OUT/prof.ncu-rep" --page details > "$OUT/details.txt" 2>&1
ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv" 2>&1
python3 - "$OUT" <<'PY'
import csv, sys
out = sys.argv[1]
lines = open(f"{out}/source.csv").read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0)
rows = list(csv.DictReader(lines[start:]))   # (ncu 2025+ puts a "Kernel Name" line first)
key = next((k for k in rows[0] if "Warp Stall Sampling (All" in k), None) if rows else None
if key is None:
    print("no stall-sampling column; columns:", list(rows[0])[:40] if rows else "none")
    sys.exit()
def num(v):
    try: return float(str(v).replace(",", ""))
    except ValueError: return 0.0
total = sum(num(r[key]) for r in rows) or 1
top = sorted(rows, key=lambda r: -num(r[key]))[:40]
with open(f"{out}/top-stalls.txt", "w") as f:
    for r in top:
        f.write(f"{100 * num(r[key]) / total:5.1f}%  {r.get('Address', '')}  {r.get('Source', '')}\n")
print(open(f"{out}/top-stalls.txt").read())
PY
