"""Issue 24: the tensor-core stack kernel (family 'stack' at bfloat16 / float16:
cuda_src/persistent_stack_mma.cu, every layer of an LSTM stack in one launch, the product on
tensor cores) against the cuBLAS rung at the same precision and cuDNN at the same precision
(torch, where it imports), at the paper shape (LSTM L4 H512 B64 T100) by default, in one
process on one device.

Each point: GpuRunner forward (graph executor) with the selector's one candidate the named
schedule ('stack': no fallback allowed, a declined point is recorded with the fit's reason;
the rung: the fused cuBLAS schedule), y checked against the float64 rounding-aware reference
(rnnrt.reference.forward(..., dtype)) within the precision's tolerance BEFORE timing (the
worst element reported), and cuDNN's y against the same reference (its error beside ours);
then each timed with CUDA events (warm-up, median of --repeats).

--backward: a training step (forward + backward, graph executor) instead, each schedule
checked first (dx, dh0, dc0 and every weight and bias gradient against the rounding-aware
float64 reference.backward, the worst element reported) then timed: the tensor-core stack
forward with the tensor-core stack backward ('stack+sbwd': PlanKey.backward 'stack', the
plan's fit must be lstm_persistent_stack_mma_bwd's, else the point is recorded declined),
with the per-step backward ('stack+step': what backward None runs) and with the typed FMA
per-layer grid backward ('stack+grid': what 'stack+pbwd' ran at 16 bits before the
tensor-core stack backward), the cuBLAS rung's training step, and cuDNN's forward + backward
(torch autograd, y, h_n, c_n all given gradients) at the same precision.

Usage (GPU, repo root): PYTHONPATH=$PWD python experiments/scripts/stack_mma_bench.py
  --out DIR [--dtypes bfloat16,float16] [--shapes 4x512x64x100,...] [--repeats 20]
  [--no-cudnn] [--backward]   (a shape: LxHxBxT, input size = hidden)
Prints a table last; writes DIR/stack-bench-mma-<device>-<stamp>.json (kind
'stack_mma_bench': device, versions, one row per point: ms of the stack kernel, the rung and
cuDNN, the ratios, each one's error against the reference, the fit); with --backward
DIR/stack-bench-mma-fwdbwd-<device>-<stamp>.json (the same kind, "mode": "fwdbwd": ms of a
training step of each schedule, its check, its backward plan's fit).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import rnnrt  # noqa: E402
from rnnrt import reference  # noqa: E402
from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.check import compare  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.kernels import choice as C  # noqa: E402
from rnnrt.params import per_layer  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

RUNG = ladder(input_batch=10)[-2].switches   # the fused cuBLAS schedule (+wavefront)


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def check(y, y_ref, dtype, what) -> dict:
    p = get_precision(dtype)
    c = compare(y, y_ref, p.atol, p.rtol, name=what)
    return {"ok": c.ok, "max_abs_err": float(c.max_abs_err), "text": str(c)}


def timed_runner(cp, r, x, y_ref, dtype, what, repeats) -> dict:
    y, _ = r.forward(x)
    chk = check(host(y), y_ref, dtype, what)
    xd = cp.asarray(x)   # a NumPy x would add its host-to-device copy to every run
    t = time_gpu(cp, lambda: r.forward(xd), cp.cuda.get_current_stream(), repeats=repeats)
    return {"ms": t.ms_median, "check": chk}


def stack_point(cp, m, dtype, x, y_ref, repeats) -> dict:
    T, B = x.shape[:2]
    r = GpuRunner(m, schedule_cache=False, dtype=dtype)
    r.selector.candidates_fn = lambda shape, device: (C.persistent_schedule("stack"),)
    choice = C.choose_persistent(r.plan_key(T, B, False))
    if choice.fallback is not None:
        return {"declined": choice.fallback}
    out = timed_runner(cp, r, x, y_ref, dtype, f"stack {dtype} y", repeats)
    out.update(fit=choice.describe(), kernel=choice.stack.kernel if choice.stack else None)
    return out


def cuda_torch():
    """torch where it imports with CUDA, else None (cuDNN's points are then left out)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def cudnn_point(m, dtype, x, y_ref, repeats) -> dict | None:
    torch = cuda_torch()
    if torch is None:
        return None
    from rnnrt.bench.cudnn import TORCH_DTYPES, torch_module
    from rnnrt.bench.timing import time_torch
    net = torch_module(torch, m, dtype)
    xt = torch.as_tensor(x).cuda().to(TORCH_DTYPES[dtype](torch))
    with torch.no_grad():
        y = net(xt)[0].float().cpu().numpy()
        t = time_torch(torch, lambda: net(xt), repeats=repeats)
    return {"ms": t.ms_median, "check": check(y, y_ref, dtype, f"cuDNN {dtype} y")}


def main(argv=None) -> int:
    import cupy as cp
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--shapes", default="4x512x64x100", help="LxHxBxT, comma separated")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--schedules", default=None,
                    help="with --backward: the training schedules to time, comma separated "
                         "(default all: stack+sbwd,stack+step,stack+grid,rung; stack+sbwd "
                         "first, the others' ratios are to it)")
    ap.add_argument("--backward", action="store_true",
                    help="time training steps (forward + backward) instead")
    args = ap.parse_args(argv)
    if args.backward:
        from stack_mma_bwd_bench import main_backward   # this folder: sys.path[0]
        return main_backward(cp, args)
    rows = []
    for spec in args.shapes.split(","):
        L, H, B, T = map(int, spec.lower().split("x"))
        m = rnnrt.LSTM(H, H, num_layers=L, seed=0)
        x = np.random.default_rng(1).standard_normal((T, B, H)).astype(np.float32)
        p64 = per_layer(np.asarray(m.flat, np.float64), m.layout)
        for dtype in args.dtypes.split(","):
            y_ref = reference.forward("lstm", p64, x.astype(np.float64), None, None,
                                      dtype=dtype)[0]
            row = {"cell": "lstm", "layers": L, "hidden": H, "batch": B, "steps": T,
                   "dtype": dtype}
            try:
                row["stack"] = stack_point(cp, m, dtype, x, y_ref, args.repeats)
            except Exception as e:  # noqa: BLE001 - a failed point is recorded
                row["stack"] = {"error": repr(e)}
            try:
                rung = GpuRunner(m, switches=RUNG, schedule_cache=False, dtype=dtype)
                row["rung"] = timed_runner(cp, rung, x, y_ref, dtype, f"rung {dtype} y",
                                           args.repeats)
            except Exception as e:  # noqa: BLE001
                row["rung"] = {"error": repr(e)}
            row["cudnn"] = None if args.no_cudnn else cudnn_point(m, dtype, x, y_ref,
                                                                  args.repeats)
            s = row["stack"].get("ms")
            for other in ("rung", "cudnn"):
                o = (row.get(other) or {}).get("ms")
                row[f"{other}_over_stack"] = o / s if o and s else None
            rows.append(row)
            print(f"{dtype} L{L} H{H} B{B} T{T}: stack {s} ms, rung {row['rung'].get('ms')} ms,"
                  f" cuDNN {(row['cudnn'] or {}).get('ms')} ms; {row['stack'].get('fit')}",
                  flush=True)
    from rnnrt.session import device_info
    device = device_info()
    record = {"schema": "rnnrt.stack_mma_bench/1", "kind": "stack_mma_bench",
              "created": now_iso(), "command": " ".join(sys.argv), "device": device,
              "versions": versions(cp), "rows": rows}
    path = Path(args.out) / (f"stack-bench-mma-{device_slug(device['device'])}"
                             f"-{stamp(record['created'])}.json")
    write_json(record, path)
    print(f"\nrecord: {path}")
    print(f"{'dtype':<10}{'shape':>16}{'stack ms':>10}{'rung ms':>9}{'cuDNN ms':>10}"
          f"{'x rung':>8}{'x cuDNN':>9}{'err stack':>11}{'err cuDNN':>11}  ok")

    def f(v, w=".3f"):
        return format(v, w) if isinstance(v, float) else "-"
    for r in rows:
        st, cu = r["stack"], r["cudnn"] or {}
        ok = all((r[k] or {}).get("check", {}).get("ok", True) and "error" not in (r[k] or {})
                 for k in ("stack", "rung"))
        shape = f"L{r['layers']}H{r['hidden']}B{r['batch']}T{r['steps']}"
        print(f"{r['dtype']:<10}{shape:>16}{f(st.get('ms')):>10}{f(r['rung'].get('ms')):>9}"
              f"{f(cu.get('ms')):>10}{f(r['rung_over_stack'], '.2f'):>8}"
              f"{f(r['cudnn_over_stack'], '.2f'):>9}"
              f"{f(st.get('check', {}).get('max_abs_err'), '.2e'):>11}"
              f"{f(cu.get('check', {}).get('max_abs_err'), '.2e'):>11}  "
              f"{'ok' if ok else 'FAILED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
