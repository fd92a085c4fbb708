"""Issue 24: the tensor-core grid kernel (family 'mma', cuda_src/persistent_mma.cu) against the
typed FMA grid kernel (family 'grid') on one layer, bf16 and fp16, H in {256, 512, 1024}, B in
{8, 64, 256}, T 100, in one process on one device; plus cuDNN at the same dtype (torch, where
it imports). ``--families`` times others too (e.g. 'mmac,mma,cluster': the tensor-core
cluster kernel, persistent_mmac.cu), ``--cells`` LSTM and / or GRU. Each point: GpuRunner forward (graph executor) with the selector's one
candidate the named family (no fallback allowed: a declined point is recorded with the fit's
reason), y checked against the runner's cuBLAS rung at the same precision (the precision's
tolerance) before timing; then timed with CUDA events (warm-up, median of --repeats). The
per-step figure is the forward's time / T: the one input GEMM a layer is the same in both
families, so the difference is the recurrent kernel's.

Usage (GPU, repo root): python experiments/scripts/mma_bench.py --out DIR
  [--dtypes bfloat16,float16] [--hidden 256,512,1024] [--batches 8,64,256] [--steps 100]
  [--repeats 20] [--no-cudnn] [--families mma,grid] [--cells lstm] [--tag TAG]
Prints a table last; writes DIR/persistent-mma-bench[-TAG]-L1-T<T>-<device>-<stamp>.json
(kind 'mma_bench': device, versions, one row per point: us a step of each family and of
cuDNN, each family's fit or the reason it declined, the checks).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import rnnrt  # noqa: E402
from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.check import compare  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.kernels import choice as C  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

RUNG = ladder(input_batch=4)[-2].switches   # the cuBLAS schedule the check compares with


def family_runner(m, family, dtype):
    r = GpuRunner(m, schedule_cache=False, dtype=dtype)
    r.selector.candidates_fn = lambda shape, device: (C.persistent_schedule(family),)
    return r


def point(cp, m, family, dtype, x, y_ref, repeats):
    """{us_step, check, fit | fallback} of ``family`` on the model ``m``."""
    T, B = x.shape[:2]
    r = family_runner(m, family, dtype)
    choice = C.choose_persistent(r.plan_key(T, B, False))
    if choice.fallback is not None:
        return {"declined": choice.fallback}
    y, _ = r.forward(x)
    y = np.asarray(y.get() if hasattr(y, "get") else y)
    p = get_precision(dtype)
    c = compare(y, y_ref, p.atol, p.rtol, name=f"{family} y")
    # timed on a device copy of x: a NumPy x would add its host-to-device copy to every run
    xd = cp.asarray(x)
    stream = cp.cuda.get_current_stream()
    t = time_gpu(cp, lambda: r.forward(xd), stream, repeats=repeats)
    return {"us_step": 1e3 * t.ms_median / T, "check": {"ok": c.ok, "text": str(c)},
            "fit": choice.describe()}


def cudnn_point(m, dtype, x, repeats):
    try:
        import torch
    except ImportError:
        return None
    from rnnrt.bench.timing import time_torch
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    H = m.hidden_size
    net = (torch.nn.LSTM if m.cell_name == "lstm" else torch.nn.GRU)(H, H).cuda().to(tdt)
    xt = torch.as_tensor(x).cuda().to(tdt)
    with torch.no_grad():
        t = time_torch(torch, lambda: net(xt), repeats=repeats)
    return 1e3 * t.ms_median / x.shape[0]


def main(argv=None) -> int:
    import cupy as cp
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--hidden", default="256,512,1024")
    ap.add_argument("--batches", default="8,64,256")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--families", default="mma,grid")
    ap.add_argument("--cells", default="lstm")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    fams = args.families.split(",")
    rows = []
    points = [(d, c, H, B) for d in args.dtypes.split(",") for c in args.cells.split(",")
              for H in map(int, args.hidden.split(",")) for B in map(int, args.batches.split(","))]
    for dtype, cell, H, B in points:
        m = (rnnrt.LSTM if cell == "lstm" else rnnrt.GRU)(H, H, seed=0)
        x = np.random.default_rng(1).standard_normal((args.steps, B, H)).astype(np.float32)
        base = GpuRunner(m, switches=RUNG, schedule_cache=False, dtype=dtype)
        y_ref, _ = base.forward(x)
        y_ref = np.asarray(y_ref.get() if hasattr(y_ref, "get") else y_ref)
        row = {"cell": cell, "layers": 1, "hidden": H, "batch": B, "steps": args.steps,
               "dtype": dtype}
        for fam in fams:
            try:
                row[fam] = point(cp, m, fam, dtype, x, y_ref, args.repeats)
            except Exception as e:  # noqa: BLE001 - a failed point is recorded
                row[fam] = {"error": repr(e)}
        row["cudnn_us_step"] = None if args.no_cudnn else cudnn_point(m, dtype, x, args.repeats)
        if "mma" in row and "grid" in row:
            a, g = row["mma"].get("us_step"), row["grid"].get("us_step")
            row["mma_vs_grid"] = g / a if a and g else None
        rows.append(row)
        print(f"{dtype} {cell} H{H} B{B}: " + ", ".join(
            f"{f} {row[f].get('us_step')}" for f in fams), flush=True)
    from rnnrt.session import device_info
    device = device_info()
    record = {"schema": "rnnrt.mma_bench/1", "kind": "mma_bench", "created": now_iso(),
              "command": " ".join(sys.argv), "device": device, "versions": versions(cp),
              "rows": rows}
    tag = f"-{args.tag}" if args.tag else ""
    path = Path(args.out) / (f"persistent-mma-bench{tag}-L1-T{args.steps}-"
                             f"{device_slug(device['device'])}-{stamp(record['created'])}.json")
    write_json(record, path)
    print(f"\nrecord: {path}")
    print(f"{'dtype':<10}{'cell':<6}{'H':>6}{'B':>5}" + "".join(f"{f + ' us':>11}" for f in fams)
          + f"{'cuDNN us':>10}  ok (us a step; - declined)")
    for r in rows:
        def f(v):
            return f"{v:.2f}" if isinstance(v, float) else "-"
        ok = all((r[k].get("check") or {}).get("ok", True) and "error" not in r[k]
                 for k in fams)
        print(f"{r['dtype']:<10}{r['cell']:<6}{r['hidden']:>6}{r['batch']:>5}"
              + "".join(f"{f(r[k].get('us_step')):>11}" for k in fams)
              + f"{f(r['cudnn_us_step']):>10}  {'ok' if ok else 'FAILED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
