"""Issue 24: the tensor-core backward grid kernel (cuda_src/persistent_mma_bwd.cu; a training key
of family 'mma' with PlanKey.backward 'persistent') against the typed FMA persistent backward
(backward 'grid', persistent_bwd.cu's typed grid kernel), the per-step backward (backward
None: cuBLAS GEMMs on tensor cores at bf16 / fp16, fused pointwise kernels a step), the
per-step tensor-core schedule throughout (the paper rung 'ib10') and cuDNN at the same dtype
(torch, TF32 off), one layer, in one process on one device. The first three run the same
forward (the tensor-core grid kernel, family 'mma'), so their differences are the
backward's.

Each point: the three plans built (no fallback allowed: a declined variant is recorded with
the reason), one forward + backward of each on the same random inputs (graph executor),
dx / dh0 / the weight gradients of the other variants checked against the mma forward's
per-step backward (the precision's tolerance; the weight gradients' absolute part widened by
check.reduction_atol); then forward + backward and forward alone timed with CUDA events
(warm-up, median of --repeats); the backward's time is their difference.

Usage (GPU, repo root): python experiments/scripts/mma_bwd_bench.py --out DIR
  [--cells lstm,gru] [--dtypes bfloat16,float16] [--hidden 256,512,1024] [--batches 8,64]
  [--steps 100] [--repeats 15] [--no-cudnn]
Prints a table last (backward ms, and fwd+bwd ms with the ratio to cuDNN); writes
DIR/persistent-mma-bwd-bench-L1-T<steps>-<device>-<stamp>.json (kind 'mma_bwd_bench').
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import rnnrt  # noqa: E402
from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.check import compare, reduction_atol  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.kernels import choice as C  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402
from rnnrt.session import time_events  # noqa: E402

VARIANTS = {"mma": ("mma", "persistent"), "fma": ("mma", "grid"), "step": ("mma", None),
            "ib10": ("ib10", None)}
"""rnnrt's variants: (the forward's schedule, the PlanKey.backward it names): the tensor-core
forward ('mma') with the tensor-core, the typed FMA and the per-step backward; and the
per-step tensor-core schedule throughout (the paper rung 'ib10': cuBLAS GEMMs at the dtype,
fused pointwise kernels, input chunks of 10)."""


def build(runner, T, B, forward, backward):
    """(forward plan, backward plan, {fit, kernels}) of schedule ``forward`` ('mma' or a
    paper schedule's name) with ``backward``; raises where a persistent part falls back (a
    declined variant: no silent substitute)."""
    from rnnrt.plan.backward import backward_plan
    from rnnrt.plan.forward import forward_plan
    if forward == "mma":
        sched = C.persistent_schedule("mma")
    else:
        sched = C.paper_schedule(forward)
    key = runner.new_key(T, B, True, sched.switches, sched.family, backward)
    fplan, bplan = forward_plan(key), backward_plan(key)
    if fplan.fallback:
        raise RuntimeError(f"forward declined: {fplan.fallback}")
    if bplan.fallback:
        raise RuntimeError(f"backward declined: {bplan.fallback}")
    kernels = sorted({op.name for op in bplan.ops if getattr(op, "kind", "") == "persistent"})
    return fplan, bplan, {"fit": bplan.fit, "kernels": kernels}


def run_variant(cp, runner, T, B, variant, inputs, repeats):
    """{fwdbwd_ms, fwd_ms, bwd_ms, outputs {dx, dh0, grads}, fit, kernels} of one variant
    (VARIANTS' (forward, backward))."""
    fplan, bplan, info = build(runner, T, B, *variant)
    ses = runner.session
    ws = ses.workspace(bplan, runner.params)
    # every input the plans have: ``inputs``' where given, else zeros (h0, c0, dh_n, dc_n;
    # the workspace starts poisoned)
    ws.load(**{k: inputs.get(k) for k in fplan.inputs})
    fx, bx = ses.executor("graph", fplan, ws), ses.executor("graph", bplan, ws)
    fx.run()
    ws.load(**{k: inputs.get(k) for k in bplan.inputs if k not in fplan.inputs})
    bx.run()
    cp.cuda.Device().synchronize()
    outs = {n: cp.asnumpy(ws.read(n)) for n in ("dx", "dh0", "grads") if n in bplan.outputs}

    def both():
        fx.run()
        bx.run()

    fb = statistics.median(time_events(cp, both, fx.stream, repeats, 3))
    f = statistics.median(time_events(cp, fx.run, fx.stream, repeats, 3))
    del fx, bx, ws
    return {**info, "fwdbwd_ms": fb, "fwd_ms": f, "bwd_ms": fb - f, "outputs": outs}


def cudnn_ms(model, dtype, T, B, repeats):
    """cuDNN forward + backward at ``dtype`` (torch; TF32 off), median ms; None without
    torch."""
    try:
        import torch
    except ImportError:
        return None
    from rnnrt.bench.cudnn import torch_module
    from rnnrt.bench.timing import time_torch
    m = torch_module(torch, model, dtype)
    tdt = next(m.parameters()).dtype
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, B, model.input_size, device="cuda", generator=g).to(tdt)
    x.requires_grad_(True)
    dy = torch.randn(T, B, model.hidden_size, device="cuda", generator=g).to(tdt)

    def run():
        y, _ = m(x)
        y.backward(dy)

    return time_torch(torch, run, repeats=repeats, warmup=3).ms_median


def check(got, ref, dtype, rows):
    """The persistent variant's dx, dh0, grads against the per-step one's (both the rungs'
    math at ``dtype``): {ok, text} of the worst."""
    p = get_precision(dtype)
    worst = None
    for name in ("dx", "dh0", "grads"):
        atol = reduction_atol(rows, p.atol) if name == "grads" else p.atol
        c = compare(got[name], ref[name], atol, p.rtol, name=name)
        if worst is None or c.max_excess > worst.max_excess:
            worst = c
    return {"ok": worst.ok, "text": str(worst)}


def point(cp, cell, dtype, H, B, T, repeats, cudnn):
    model = (rnnrt.LSTM if cell == "lstm" else rnnrt.GRU)(H, H, seed=0)
    runner = GpuRunner(model, schedule_cache=False, dtype=dtype)
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((T, B, H)).astype(np.float32),
              "dy": rng.standard_normal((T, B, H)).astype(np.float32)}
    row = {"cell": cell, "layers": 1, "hidden": H, "batch": B, "steps": T, "dtype": dtype}
    for name, variant in VARIANTS.items():
        try:
            row[name] = run_variant(cp, runner, T, B, variant, inputs, repeats)
        except Exception as e:  # noqa: BLE001 - a declined or failed variant is recorded
            row[name] = {"error": repr(e)}
    ref = row["step"].get("outputs")
    for name in ("mma", "fma", "ib10"):
        if ref is not None and "outputs" in row[name]:
            row[name]["check"] = check(row[name]["outputs"], ref, dtype, T * B)
    for name in VARIANTS:
        row[name].pop("outputs", None)
    row["cudnn_fwdbwd_ms"] = cudnn_ms(model, dtype, T, B, repeats) if cudnn else None
    runner.close()
    return row


def table(rows) -> str:
    def f(v):
        return f"{v:.3f}" if isinstance(v, float) else "-"

    out = [f"{'cell':<5}{'dtype':<9}{'H':>5}{'B':>4} | {'bwd ms: mma':>11}{'fma':>8}"
           f"{'step':>8} | {'fwd+bwd: mma':>12}{'fma':>8}{'step':>8}{'ib10':>8}{'cuDNN':>8} | "
           f"{'cuDNN/mma':>9}{'fma/mma':>8}  ok"]
    for r in rows:
        g = {k: r[k].get("bwd_ms") for k in VARIANTS}
        fb = {k: r[k].get("fwdbwd_ms") for k in VARIANTS}
        cd = r["cudnn_fwdbwd_ms"]
        ratio = f(cd / fb["mma"]) if cd and fb["mma"] else "-"
        vs = f(g["fma"] / g["mma"]) if g["fma"] and g["mma"] else "-"
        ok = all("error" not in r[k] and (r[k].get("check") or {}).get("ok", True)
                 for k in VARIANTS)
        out.append(f"{r['cell']:<5}{r['dtype']:<9}{r['hidden']:>5}{r['batch']:>4} | "
                   f"{f(g['mma']):>11}{f(g['fma']):>8}{f(g['step']):>8} | "
                   f"{f(fb['mma']):>12}{f(fb['fma']):>8}{f(fb['step']):>8}{f(fb['ib10']):>8}"
                   f"{f(cd):>8} | "
                   f"{ratio:>9}{vs:>8}  {'ok' if ok else 'FAILED'}")
    return "\n".join(out)


def main(argv=None) -> int:
    import cupy as cp
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="lstm,gru")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--hidden", default="256,512,1024")
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-cudnn", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for cell in args.cells.split(","):
        for dtype in args.dtypes.split(","):
            for H in map(int, args.hidden.split(",")):
                for B in map(int, args.batches.split(",")):
                    row = point(cp, cell, dtype, H, B, args.steps, args.repeats,
                                not args.no_cudnn)
                    rows.append(row)
                    print(f"{cell} {dtype} H{H} B{B}: bwd ms mma "
                          f"{row['mma'].get('bwd_ms')} fma {row['fma'].get('bwd_ms')} step "
                          f"{row['step'].get('bwd_ms')}"
                          + "".join(f"; {k}: {row[k]['error']}" for k in VARIANTS
                                    if "error" in row[k]), flush=True)
    from rnnrt.session import device_info
    device = device_info()
    record = {"schema": "rnnrt.mma_bwd_bench/1", "kind": "mma_bwd_bench", "created": now_iso(),
              "command": " ".join(sys.argv), "device": device, "versions": versions(cp),
              "config": vars(args), "rows": rows,
              "note": "rnnrt: graph executor, one layer, the mma forward in every variant; "
                      "bwd_ms = fwd+bwd - fwd (CUDA events, medians); cuDNN fwd+bwd at the "
                      "same dtype, TF32 off, same process"}
    path = Path(args.out) / (f"persistent-mma-bwd-bench-L1-T{args.steps}-"
                             f"{device_slug(device['device'])}-{stamp(record['created'])}.json")
    write_json(record, path)
    print(f"\nrecord: {path}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
