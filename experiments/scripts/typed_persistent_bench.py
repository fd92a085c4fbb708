"""Issue 24 step 1 on the GPU: `auto` at float32 / tf32 / bfloat16 / float16 against cuDNN at
the same precision, in one process (rnnrt.bench.ladder: the `auto` row, cuDNN timed in turn
with it; fp32 cuDNN with TF32 off), at a few small shapes where the typed persistent kernels
(grid, cluster; forward) are new candidates, and the paper shape. Every row is checked
against the rounding-aware reference by the ladder (row check.ok).

Usage (device, repo root): python experiments/scripts/typed_persistent_bench.py --out DIR
  [--shapes lstm:1:128:8,...] [--dtypes float32,bfloat16] [--backward] [--repeats 10]
Prints a table last; writes DIR/persistent-typed-bench-<device>-<stamp>.json (kind
"typed_persistent_bench": the device, versions, one row per shape x dtype with auto's
schedule and fit, its time, cuDNN's, the ratio, the check).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.ladder import LadderConfig, run_ladder  # noqa: E402
from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402

SHAPES = ("lstm:1:128:8", "lstm:1:128:64", "lstm:4:128:64", "gru:1:128:8", "gru:1:128:64",
          "gru:4:128:64", "lstm:4:512:64")
DTYPES = ("float32", "tf32", "bfloat16", "float16")


def one(cell, layers, hidden, batch, dtype, args):
    cfg = LadderConfig(cell=cell, layers=layers, hidden=hidden, batch=batch, steps=100,
                       repeats=args.repeats, executors=("graph",), rungs=("auto",),
                       interleave=True, dtype=dtype, backward=args.backward)
    rec = run_ladder(cfg, progress=lambda m: None)
    auto = next(r for r in rec["rows"] if r["rung"] == "auto")
    cud = rec.get("cudnn", {})
    plan = auto.get("plan", {})
    return {"cell": cell, "layers": layers, "hidden": hidden, "batch": batch, "steps": 100,
            "pass": rec["pass"], "dtype": dtype, "auto_ms": auto.get("ms_median"),
            "refused": auto.get("refused"),
            "cudnn_ms": cud.get("ms_median"), "ratio_vs_cudnn": auto.get("ratio_vs_cudnn"),
            "schedule": auto.get("schedule"), "tune_s": auto.get("tune_s"),
            "candidates": (auto.get("selection") or {}).get("candidates"),
            "fit": plan.get("fit") or auto.get("fit"),
            "fallback": auto.get("fallback"), "check": auto.get("check"),
            "device": rec["device"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the JSON record")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="cell:layers:hidden:batch,...")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--backward", action="store_true", help="time forward+backward")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    rows, failed = [], 0
    for spec in args.shapes.split(","):
        cell, layers, hidden, batch = spec.split(":")
        for dtype in args.dtypes.split(","):
            try:
                r = one(cell, int(layers), int(hidden), int(batch), dtype, args)
            except Exception as e:  # noqa: BLE001 - a failed point is recorded, not fatal
                r = {"cell": cell, "layers": int(layers), "hidden": int(hidden),
                     "batch": int(batch), "dtype": dtype, "error": repr(e)}
            ok = "error" not in r and (r.get("check") or {}).get("ok", False)
            failed += not ok
            rows.append(r)
            print(f"{spec} {dtype}: {'ok' if ok else 'FAILED'}", flush=True)
    import cupy
    device = next((r["device"] for r in rows if "device" in r), {})
    record = {"schema": "rnnrt.typed_persistent_bench/1", "kind": "typed_persistent_bench",
              "created": now_iso(), "command": " ".join(sys.argv), "device": device,
              "versions": versions(cupy), "rows": [{k: v for k, v in r.items() if k != "device"}
                                                   for r in rows]}
    name = device.get("device") or device.get("name") or "gpu"   # the session's device dict
    path = (Path(args.out) / f"persistent-typed-bench-{device_slug(name)}-"
                             f"{stamp(record['created'])}.json")
    write_json(record, path)
    print(f"\nrecord: {path}")
    print(f"{'shape':<16}{'dtype':<10}{'auto ms':>9}{'cuDNN ms':>10}{'ratio':>7}  ok  schedule")
    for r in rows:
        shape = f"{r['cell']} L{r['layers']} H{r['hidden']} B{r['batch']}"
        if "error" in r:
            print(f"{shape:<16}{r['dtype']:<10}  ERROR {r['error'][:60]}")
            continue
        fmt = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
        print(f"{shape:<16}{r['dtype']:<10}{fmt(r['auto_ms'], '9.3f')}"
              f"{fmt(r['cudnn_ms'], '10.3f')}{fmt(r['ratio_vs_cudnn'], '7.2f')}  "
              f"{'y ' if (r['check'] or {}).get('ok') else 'NO'}  {r['schedule'] or r['fit']}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
