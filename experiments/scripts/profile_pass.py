"""Where one pass's time goes, kernel by kernel, under Nsight Compute: the schedule the
selector picks for a shape at a precision (GpuRunner, switches='auto'), warmed up, then one
pass (forward, or forward + backward with --train) run with the profiler on
(cudaProfilerStart / Stop: ncu --profile-from-start off sees only that pass).

Usage (GPU, from the repo root):
  ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats --csv --page raw \
      python experiments/scripts/profile_pass.py --cell lstm --layers 4 --hidden 512 \
      --batch 64 --dtype bfloat16 [--schedule ib2] > raw.csv
  python experiments/scripts/profile_pass.py --summarize raw.csv [--out DIR]
The second form reads ncu's raw CSV and prints, per kernel name: launches, total and mean
duration, share of the pass, SM and memory throughput (% of peak), achieved occupancy, and
the two largest warp-stall reasons; with --out it writes a JSON record (kind 'ncu_pass').
Without ncu the first form just runs the pass (the schedule is printed to stderr).
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

DURATION = "gpu__time_duration.sum"
COLUMNS = {"sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
           "mem_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
           "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active"}
STALL_WORD = "issue_stalled_"   # smsp__average_warps_issue_stalled_<reason>_per_issue_active


def run_pass(a):
    import cupy as cp

    import rnnrt
    from rnnrt.gpu import GpuRunner
    cls = {"lstm": rnnrt.LSTM, "gru": rnnrt.GRU}[a.cell]
    model = cls(a.hidden, a.hidden, num_layers=a.layers, seed=0)
    from rnnrt.kernels.schedules import paper_schedule
    # under ncu (even with profiling off) launches are slower, which can tilt the selector:
    # name the schedule measured without the profiler where it is a cuBLAS one
    switches = paper_schedule(a.schedule).switches if a.schedule else "auto"
    runner = GpuRunner(model, switches=switches, dtype=a.dtype, schedule_cache=False)
    sel = runner.schedule(a.steps, a.batch, train=a.train)
    print(f"schedule: {a.schedule or sel.schedule.name} ({a.dtype}, "
          f"{'fwd+bwd' if a.train else 'fwd'})", file=sys.stderr)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.steps, a.batch, a.hidden)).astype(np.float32)
    dy = cp.asarray(rng.standard_normal((a.steps, a.batch, a.hidden)).astype(np.float32))

    def one():
        out = runner.forward(x, train=a.train)
        if a.train:
            runner.backward(out[2], dy)

    for _ in range(3):
        one()
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStart()
    one()
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStop()
    runner.close()


def number(v) -> float:
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return float("nan")


def summarize(path: str) -> list[dict]:
    """Per kernel name (ncu's 'Kernel Name'), from ncu's --page raw --csv output: the
    launches and their duration, throughput, occupancy, the two largest stall reasons."""
    lines = Path(path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))[1:]   # the second line holds the units
    by = defaultdict(list)
    for r in rows:
        by[r["Kernel Name"]].append(r)
    total_ns = sum(number(r[DURATION]) for r in rows)
    out = []
    for name, rs in by.items():
        d = [number(r[DURATION]) for r in rs]
        stalls = defaultdict(float)
        for r in rs:
            for k, v in r.items():
                if STALL_WORD in k and k.endswith(".ratio") and "not_issued" not in k:
                    reason = k.split(STALL_WORD, 1)[1].split("_per_")[0]
                    stalls[reason] += number(v) / len(rs)
        top = sorted(((v, k) for k, v in stalls.items() if v == v), reverse=True)[:2]
        row = {"kernel": name[:80], "launches": len(rs), "total_us": sum(d) / 1e3,
               "mean_us": sum(d) / len(d) / 1e3, "share": sum(d) / total_ns,
               "stalls": [f"{k} {v:.1f}" for v, k in top]}
        for key, col in COLUMNS.items():
            vals = [number(r.get(col, "nan")) for r in rs]
            vals = [v for v in vals if v == v]
            row[key] = sum(vals) / len(vals) if vals else None
        out.append(row)
    return sorted(out, key=lambda r: -r["total_us"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="lstm", choices=("lstm", "gru"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--schedule", default=None,
                    help="a cuBLAS schedule by name (paper, ib2, ib10, ...; default: the "
                         "selector's choice, made under the profiler)")
    ap.add_argument("--summarize", default=None, help="ncu raw CSV to summarize")
    ap.add_argument("--label", default="", help="what was profiled (for the record)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.summarize is None:
        run_pass(a)
        return
    rows = summarize(a.summarize)
    fmt = lambda v: "-" if v is None else f"{v:.0f}"   # noqa: E731
    print(f"| kernel | launches | total us | mean us | share | SM % | mem % | occ % | stalls |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows[:12]:
        print(f"| {r['kernel'][:60]} | {r['launches']} | {r['total_us']:.0f} | "
              f"{r['mean_us']:.1f} | {100 * r['share']:.0f}% | {fmt(r['sm_pct'])} | "
              f"{fmt(r['mem_pct'])} | {fmt(r['occupancy_pct'])} | {'; '.join(r['stalls'])} |")
    if a.out:
        import cupy as cp

        from rnnrt.bench import records
        from rnnrt.session import device_info
        info = device_info(cp)
        created = records.now_iso()
        rec = {"kind": "ncu_pass", "created": created, "device": info,
               "versions": records.versions(cp), "label": a.label, "kernels": rows,
               "note": "ncu --profile-from-start off (one warmed-up pass), sections "
                       "SpeedOfLight, Occupancy, WarpStateStats, LaunchStats; durations "
                       "under the profiler's serialization (kernels do not overlap)"}
        slug = records.device_slug(info["device"])
        path = Path(a.out) / f"ncu-pass-{a.label or 'pass'}-{slug}-{records.stamp(created)}.json"
        records.write_json(rec, path)
        print(f"record: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
