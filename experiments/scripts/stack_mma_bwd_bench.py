"""Issue 24: stack_mma_bench.py --backward (this module is its training half; run that script):
a training step (forward + backward, graph executor) of the tensor-core stack forward with
each backward, checked first against the rounding-aware float64 reference, then timed with
CUDA events (warm-up, median of --repeats), beside the cuBLAS rung's training step and cuDNN's
forward + backward at the same precision, in one process on one device. See
stack_mma_bench.py's docstring for the schedules and the record.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

import rnnrt
from rnnrt import reference
from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json
from rnnrt.bench.timing import time_gpu
from rnnrt.check import compare, reduction_atol
from rnnrt.gpu import GpuRunner
from rnnrt.kernels import choice as C
from rnnrt.params import per_layer, to_flat
from rnnrt.precision import get_precision
from stack_mma_bench import RUNG, cuda_torch, host   # this folder: sys.path[0]

# name -> the schedule the selector is given (its one candidate); None: the cuBLAS rung
SCHEDULES = {
    "stack+sbwd": dataclasses.replace(C.persistent_schedule("stack"), name="stack+sbwd",
                                      backward="stack"),
    "stack+step": C.persistent_schedule("stack"),
    "stack+grid": dataclasses.replace(C.persistent_schedule("stack"), name="stack+grid",
                                      backward="grid"),
    # the selector's own candidate: the backward the rule picks ('persistent': the stack
    # backward where it pays, else the per-layer persistent backward)
    "stack+pbwd": dataclasses.replace(C.persistent_schedule("stack"), name="stack+pbwd",
                                      backward="persistent"),
    "rung": None,
}


def case(m, T, B, dtype, seed=1):
    """Random x, dy, dh_n, dc_n (fp32) and the reference gradients at ``dtype`` (float64,
    its rounding points). -> (inputs dict, reference dict {dx, dh0, dc0, grads})."""
    rng = np.random.default_rng(seed)
    L, H = m.num_layers, m.hidden_size
    f32, f64 = np.float32, np.float64
    data = {"x": rng.standard_normal((T, B, H)).astype(f32),
            "dy": rng.standard_normal((T, B, H)).astype(f32),
            "dhn": rng.standard_normal((L, B, H)).astype(f32),
            "dcn": rng.standard_normal((L, B, H)).astype(f32)}
    p64 = per_layer(np.asarray(m.flat, f64), m.layout)
    _, _, _, cache = reference.forward("lstm", p64, data["x"].astype(f64), None, None,
                                       dtype=dtype)
    g = reference.backward("lstm", p64, cache, data["dy"].astype(f64),
                           data["dhn"].astype(f64), data["dcn"].astype(f64))
    ref = {"dx": g["dx"], "dh0": g["dh0"], "dc0": g["dc0"],
           "grads": to_flat(g["params"], m.layout)}
    return data, ref


def check_grads(got, ref, m, dtype, T, B, what) -> dict:
    """Every gradient within the precision's tolerance (the weight gradients' atol grown for
    their T*B-term sums: check.reduction_atol); the worst one reported."""
    p = get_precision(dtype)
    worst, ok, texts = 0.0, True, []
    parts = [(n, got[n], ref[n], p.atol) for n in ("dx", "dh0", "dc0")]
    parts += [(e.name, got["grads"][e.offset:e.end], ref["grads"][e.offset:e.end],
               reduction_atol(T * B, p.atol)) for e in m.layout.entries]
    for name, g, r, atol in parts:
        c = compare(g, r, atol, p.rtol, name=f"{what} {name}")
        ok &= c.ok
        worst = max(worst, float(c.max_abs_err))
        if not c.ok:
            texts.append(str(c))
    return {"ok": ok, "max_abs_err": worst, "text": "; ".join(texts)}


def train_point(cp, m, name, dtype, data, ref, repeats) -> dict:
    T, B = data["x"].shape[:2]
    sched = SCHEDULES[name]
    if sched is None:
        r = GpuRunner(m, switches=RUNG, schedule_cache=False, dtype=dtype)
    else:
        r = GpuRunner(m, schedule_cache=False, dtype=dtype)
        r.selector.candidates_fn = lambda shape, device: (sched,)
    from rnnrt.plan.backward import backward_plan
    bplan = backward_plan(r.plan_key(T, B, True))
    kernels = sorted({op.name for op in bplan.ops if getattr(op, "kind", "") == "persistent"})
    out = {"fit": bplan.fit, "fallback": bplan.fallback, "kernels": kernels}
    if name == "stack+sbwd" and bplan.fallback is not None:
        return {**out, "declined": bplan.fallback}
    x, dy = cp.asarray(data["x"]), cp.asarray(data["dy"])
    dhx = (cp.asarray(data["dhn"]), cp.asarray(data["dcn"]))

    def step():
        _, _, tape = r.forward(x, train=True)
        return r.backward(tape, dy, dhx)

    g = step()
    got = {"dx": host(g.dx), "dh0": host(g.dh0), "dc0": host(g.dc0), "grads": host(g.flat)}
    out["check"] = check_grads(got, ref, m, dtype, T, B, f"{name} {dtype}")
    out["ms"] = time_gpu(cp, step, cp.cuda.get_current_stream(), repeats=repeats).ms_median
    return out


def cudnn_train_point(m, dtype, data, ref, repeats) -> dict | None:
    torch = cuda_torch()
    if torch is None:
        return None
    from rnnrt.bench.cudnn import TORCH_DTYPES, torch_module
    from rnnrt.bench.timing import time_torch
    net = torch_module(torch, m, dtype)
    tdt = TORCH_DTYPES[dtype](torch)
    dev = {n: torch.as_tensor(v).cuda().to(tdt) for n, v in data.items()}
    x = dev["x"].requires_grad_(True)

    def step():
        net.zero_grad(set_to_none=False)
        x.grad = None
        y, (hn, cn) = net(x)
        torch.autograd.backward([y, hn, cn], [dev["dy"], dev["dhn"], dev["dcn"]])

    step()
    T, B = data["x"].shape[:2]
    grads = np.zeros_like(ref["grads"])
    sd = {n: p.grad.float().cpu().numpy() for n, p in net.named_parameters()}
    rm = rnnrt.LSTM(m.input_size, m.hidden_size, num_layers=m.num_layers, seed=0)
    rm.load_state_dict(sd)   # torch names -> the flat layout
    grads[...] = np.asarray(rm.flat)
    got = {"dx": x.grad.float().cpu().numpy(), "dh0": None, "dc0": None, "grads": grads}
    chk = check_grads({**got, "dh0": ref["dh0"], "dc0": ref["dc0"]}, ref, m, dtype, T, B,
                      f"cuDNN {dtype}")   # cuDNN's dh0 / dc0 are not asked for
    return {"ms": time_torch(torch, step, repeats=repeats).ms_median, "check": chk}


def main_backward(cp, args) -> int:
    names = list(SCHEDULES) if args.schedules is None else args.schedules.split(",")
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown or names[:1] != ["stack+sbwd"]:
        raise SystemExit(f"--schedules: expected stack+sbwd first, then any of "
                         f"{list(SCHEDULES)[1:]}; got {args.schedules!r}")
    from rnnrt.session import device_info
    device = device_info()
    record = {"schema": "rnnrt.stack_mma_bench/1", "kind": "stack_mma_bench",
              "mode": "fwdbwd", "created": now_iso(), "command": " ".join(sys.argv),
              "device": device, "versions": versions(cp), "rows": []}
    path = Path(args.out) / (f"stack-bench-mma-fwdbwd-{device_slug(device['device'])}"
                             f"-{stamp(record['created'])}.json")
    rows = record["rows"]
    for spec in args.shapes.split(","):
        L, H, B, T = map(int, spec.lower().split("x"))
        m = rnnrt.LSTM(H, H, num_layers=L, seed=0)
        for dtype in args.dtypes.split(","):
            data, ref = case(m, T, B, dtype)
            row = {"cell": "lstm", "layers": L, "hidden": H, "batch": B, "steps": T,
                   "dtype": dtype}
            for name in names:
                try:
                    row[name] = train_point(cp, m, name, dtype, data, ref, args.repeats)
                except Exception as e:  # noqa: BLE001 - a failed point is recorded
                    row[name] = {"error": repr(e)}
            row["cudnn"] = None if args.no_cudnn else cudnn_train_point(m, dtype, data, ref,
                                                                        args.repeats)
            s = row["stack+sbwd"].get("ms")
            for other in names[1:] + ["cudnn"]:
                o = (row.get(other) or {}).get("ms")
                row[f"{other}_over_sbwd"] = o / s if o and s else None
            rows.append(row)
            write_json(record, path)   # after every point: a run cut short keeps its rows
            print(f"{dtype} L{L} H{H} B{B} T{T}: " + ", ".join(
                f"{n} {(row[n] or {}).get('ms')} ms" for n in names + ["cudnn"])
                + f"; {row['stack+sbwd'].get('fit') or row['stack+sbwd'].get('declined')}",
                flush=True)
    write_json(record, path)
    print(f"\nrecord: {path}")
    names = names + ["cudnn"]
    print(f"{'dtype':<10}{'shape':>16}" + "".join(f"{n + ' ms':>14}" for n in names)
          + "  errors (max |err|)  ok")

    def f(v, w=".3f"):
        return format(v, w) if isinstance(v, float) else "-"
    for r in rows:
        shape = f"L{r['layers']}H{r['hidden']}B{r['batch']}T{r['steps']}"
        pts = [r[n] or {} for n in names]
        # 'ok' judges rnnrt's schedules; cuDNN's own check (its bf16 / fp16 bias gradients
        # can fall outside the precision's tolerance) is reported beside it, not as ours
        ok = all(p.get("check", {}).get("ok", True) and "error" not in p for p in pts[:-1])
        cu_ok = pts[-1].get("check", {}).get("ok", True)
        errs = " ".join(f(p.get("check", {}).get("max_abs_err"), ".1e") for p in pts)
        print(f"{r['dtype']:<10}{shape:>16}" + "".join(f"{f(p.get('ms')):>14}" for p in pts)
              + f"  {errs}  {'ok' if ok else 'FAILED'}"
              + ("" if cu_ok else " (cuDNN outside the tolerance)"))
    return 0
