"""Where a forward+backward pass's backward time goes, and what splitting its recurrent GEMM
along K buys: per shape, the selector's training schedule (and the forward's choice, where
another) timed forward + backward with the per-step backward's dh GEMM split S ways
(PlanKey.bwd_splits; 'rule': kernels/gemm_split.py), optionally the backward traced op by
op (sums by kind); cuDNN forward and forward + backward (TF32 off) in the same process.

Usage (GPU): python experiments/scripts/backward_probe.py --shapes lstm:4:512:64,gru:1:1024:8
    [--dtype float32] [--fold on,off]
    [--steps 100] [--splits 1,2,4,8,16,rule] [--chunks 1,2,5,10] [--bwd-clusters rule,2,4,8]
    [--wgrad-steps 100,50,25,10,rule [--wgrad-backward cluster]] [--wgrad-streams 1,2,3]
    [--trace] [--out DIR]
    [--backwards step,stack,grid [--fwd-family stack] [--trace-backwards]]
--backwards: the forward of --fwd-family (default 'stack', where it fits; 'regs': the
register-resident cluster forward, the rule's count) with each backward named
(PlanKey.backward: 'step' the per-step one, 'stack' the stack backward, 'grid' / 'cluster' /
'persistent', 'pair' the grid kernel in cluster pairs, 'regs' the register-resident cluster
backward), timed forward + backward and
the backward alone, beside cuDNN; with --trace-backwards each of those backward plans traced
op by op (sums by kind). E.g. the regs backward against the cluster backward:
--fwd-family regs --backwards cluster,regs --splits rule; the grid backward against its
cluster pairs: --fwd-family grid --backwards grid,pair --splits rule.
--fold on,off: the chosen schedule with its per-step backward as planned ('on': step t-1's
pointwise kernel sums the split GEMM's partial products, plan/backward.py sums_splits) and
with the sum as a launch of its own every step ('off': inside plan/backward.py
split_sums_unfolded, the plan before the fold), in one process; the gradients are the same
bits either way.
--dtype: the runner's and cuDNN's precision (float32: TF32 off; float16, bfloat16).
Prints a table last; writes a JSON record (kind 'backward_probe') into --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import rnnrt  # noqa: E402
from rnnrt.bench import records  # noqa: E402
from rnnrt.bench.cudnn import torch_module  # noqa: E402
from rnnrt.bench.timing import time_torch  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.session import time_events  # noqa: E402


def time_key(runner, key, repeats, backward_alone=False):
    """Median ms of ``key``'s forward + backward and forward alone (graph executor, all
    steps, random inputs), and with ``backward_alone`` its backward's graph alone, re-run on
    one forward's outputs (it only reads them): -> ({fwdbwd_ms, fwd_ms[, bwd_ms]}, the
    backward plan)."""
    from rnnrt.plan.backward import backward_plan
    from rnnrt.plan.forward import forward_plan
    cp, ses = runner.cp, runner.session
    bplan, fplan = backward_plan(key), forward_plan(key)
    ws = ses.workspace(bplan, runner.params)
    rng = cp.random.default_rng(0)
    ws.load(**{name: rng.standard_normal(b.shape, dtype=cp.float32)
               for name, b in bplan.inputs.items()})
    fx, bx = ses.executor("graph", fplan, ws), ses.executor("graph", bplan, ws)

    def both():
        fx.run()
        bx.run()

    out = {"fwdbwd_ms": statistics.median(time_events(cp, both, fx.stream, repeats, 2)),
           "fwd_ms": statistics.median(time_events(cp, fx.run, fx.stream, repeats, 2))}
    if backward_alone:
        out["bwd_ms"] = statistics.median(time_events(cp, bx.run, bx.stream, repeats, 2))
    return out, bplan


def time_backwards(runner, T, B, names, repeats, trace=False, family="stack"):
    """{name: {fwdbwd_ms, fwd_ms, bwd_ms, fit, fallback[, kinds]}} of the ``family`` forward
    (persistent_schedule(family): 'stack', 'regs', ...) with each backward of ``names``
    ('step': None, the per-step backward; else a PlanKey.backward), graph executor, all T
    steps; bwd_ms: the backward's graph alone, re-run on one forward's outputs (it only
    reads them)."""
    from rnnrt.kernels.schedules import persistent_schedule
    base = persistent_schedule(family)
    out = {}
    for name in names:
        backward = None if name == "step" else name
        key = runner.new_key(T, B, True, base.switches, base.family, backward)
        row, bplan = time_key(runner, key, repeats, backward_alone=True)
        row.update(fit=bplan.fit, fallback=bplan.fallback)
        print(f"  {family} forward + {name} backward: fwd+bwd {row['fwdbwd_ms']:.3f} ms, fwd "
              f"{row['fwd_ms']:.3f}, bwd {row['bwd_ms']:.3f} ({bplan.fit or bplan.fallback})",
              file=sys.stderr, flush=True)
        if trace:
            sc = dataclasses.replace(base, backward=backward)
            kinds, _, traced = trace_backward(runner, sc, T, B)
            row.update(kinds=kinds, traced_ms=traced)
        out[name] = row
    return out


def trace_backward(runner, sched, T, B, splits="rule"):
    """The backward plan of ``sched`` traced op by op (after one forward on random inputs):
    (sums by kind {kind: [ops, busy ms]}, the traced ops, total ms)."""
    from rnnrt.exec.cuda_exec import EagerExecutor
    from rnnrt.exec.trace_exec import TracingExecutor
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan.backward import backward_plan
    from rnnrt.plan.forward import forward_plan
    cp = runner.cp
    key = runner.new_key(T, B, True, sched.switches, sched.family, sched.backward,
                         clusters=sched.clusters)
    key = dataclasses.replace(key, bwd_splits=None if splits == "rule" else int(splits))
    bplan, fplan = backward_plan(key), forward_plan(key)
    ws = Workspace(bplan, cp, np.float32, runner.params)
    ws.poison()
    rng = cp.random.default_rng(0)
    ws.load(**{name: rng.standard_normal(b.shape, dtype=cp.float32)
               for name, b in bplan.inputs.items()})
    EagerExecutor(fplan, ws, runner.session.ctx).run()
    cp.cuda.runtime.deviceSynchronize()
    ex = TracingExecutor(bplan, ws, runner.session.ctx)
    ops = ex.trace()
    kinds = {}
    for o in ops:
        k = kinds.setdefault(o.kind, [0, 0.0])
        k[0] += 1
        k[1] += o.t_end_ms - o.t_start_ms
    for kind, (n, ms) in kinds.items():
        print(f"  bwd {kind:10s} {n:5d} ops, {ms:8.3f} ms busy, {1e3 * ms / n:7.1f} us each",
              file=sys.stderr)
    print(f"  bwd total {ex.info['total_ms']:.3f} ms, host-bound {ex.info['host_bound']}",
          file=sys.stderr)
    return kinds, [list(o) for o in ops], ex.info["total_ms"]


def cudnn_ms(model, T, B, train, repeats, dtype="float32"):
    import torch
    m = torch_module(torch, model, dtype)   # TF32 off but for tf32
    dt = next(m.parameters()).dtype
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, B, model.input_size, device="cuda", generator=g,
                    dtype=dt).requires_grad_(train)
    dy = torch.randn(T, B, model.hidden_size, device="cuda", generator=g, dtype=dt)

    def run():
        y, _ = m(x)
        if train:
            y.backward(dy)

    return time_torch(torch, run, repeats=repeats, warmup=3).ms_median


def time_splits(runner, sched, T, B, splits, repeats):
    """{S: median ms} of forward + backward (graph executor, all T steps) of ``sched``'s
    forward with the per-step backward whose recurrent GEMM is split S ways
    (PlanKey.bwd_splits; 'rule': kernels/gemm_split.py's choice), and the forward alone."""
    from rnnrt.kernels.gemm_split import dh_splits
    out = {}
    for s in splits:
        key = runner.new_key(T, B, True, sched.switches, sched.family, None,
                             clusters=sched.clusters)
        key = dataclasses.replace(key, bwd_splits=None if s == "rule" else int(s))
        try:
            n = dh_splits(key) if key.switches.grouped else 1
        except ValueError as e:
            out[str(s)] = {"error": str(e)}
            continue
        row, _ = time_key(runner, key, repeats)
        ms, fms = row["fwdbwd_ms"], row["fwd_ms"]
        out[str(s)] = {"splits": n, "fwdbwd_ms": ms, "fwd_ms": fms}
        print(f"  splits {s} (S={n}): fwd+bwd {ms:.3f} ms, fwd {fms:.3f}", file=sys.stderr,
              flush=True)
    return out


def time_bwd_clusters(runner, sched, T, B, counts, repeats, backward=None):
    """{n: median ms} of forward + backward of ``sched`` with its persistent backward's
    cluster count n (PlanKey.bwd_clusters; 'rule': kernels/choice_backward.py's), the
    backward plan's fit string with it; ``backward``: that PlanKey.backward instead of the
    schedule's ('cluster' where it has none; 'regs': the register-resident one)."""
    out = {}
    for n in counts:
        key = runner.new_key(T, B, True, sched.switches, sched.family,
                             backward or sched.backward or "cluster", clusters=sched.clusters)
        key = dataclasses.replace(key, bwd_clusters=None if n == "rule" else int(n))
        try:
            row, bplan = time_key(runner, key, repeats)
        except ValueError as e:
            out[str(n)] = {"error": str(e)}
            continue
        out[str(n)] = dict(row, bwd_fit=bplan.fit, fallback=bplan.fallback)
        print(f"  bwd clusters {n}: fwd+bwd {row['fwdbwd_ms']:.3f} ms ({bplan.fit})",
              file=sys.stderr, flush=True)
    return out


def time_wgrad(runner, sched, T, B, values, repeats, field="wgrad_steps", backward=None):
    """{n: {fwdbwd_ms, fwd_ms, chunks, streams}} of forward + backward of ``sched`` (its
    backward as chosen, or ``backward``: that PlanKey.backward, e.g. 'cluster': at one layer
    it then runs in launches of the chunk) with PlanKey ``field`` = n: 'wgrad_steps' the
    weight gradients in chunks of n steps, 'wgrad_streams' their placement (1 the input
    stream, 2 a stream of their own, 3 two: kernels/gemm_split.py); 'rule': the rule's. Each
    row carries the chunk count and the stream count the plan ran."""
    out = {}
    for n in values:
        key = runner.new_key(T, B, True, sched.switches, sched.family,
                             backward or sched.backward, clusters=sched.clusters)
        key = dataclasses.replace(key, **{field: None if n == "rule" else int(n)})
        row, bplan = time_key(runner, key, repeats)
        chunks = len({op.steps for op in bplan.ops if getattr(op, "kind", None) == "dw"
                      and getattr(op, "layer", None) == 0})
        out[str(n)] = dict(row, chunks=chunks, streams=len(bplan.streams), fit=bplan.fit)
        print(f"  {field} {n} ({chunks} chunks, {len(bplan.streams)} streams): fwd+bwd "
              f"{row['fwdbwd_ms']:.3f} ms", file=sys.stderr, flush=True)
    return out


def time_chunks(runner, sched, T, B, chunks, repeats):
    """{k: median ms} of forward + backward of ``sched`` with its switches' input chunk k
    (the per-step backward's dx GEMM covers k steps: layer l-1 starts k steps after layer
    l; a stack-kernel forward does not use k)."""
    out = {}
    for k in chunks:
        kk = k if k == "all" else int(k)
        sc = dataclasses.replace(sched, name=f"{sched.name}/ib{k}", backward=None,
                                 switches=dataclasses.replace(sched.switches, input_batch=kk))
        ms = time_splits(runner, sc, T, B, ["rule"], repeats)["rule"]
        out[str(k)] = ms
    return out


def time_fold(runner, sched, T, B, modes, repeats):
    """{mode: {fwdbwd_ms, fwd_ms, bwd_ms, launches}} of ``sched``'s forward with the per-step
    backward, 'on' as planned (the split GEMM's partial products summed by the next step's
    pointwise kernel), 'off' inside plan.backward.split_sums_unfolded (the ordered sum
    kernel every step)."""
    import contextlib

    from rnnrt.plan.backward import split_sums_unfolded
    out = {}
    for mode in modes:
        with split_sums_unfolded() if mode == "off" else contextlib.nullcontext():
            key = runner.new_key(T, B, True, sched.switches, sched.family, None,
                                 clusters=sched.clusters)
            row, bplan = time_key(runner, key, repeats, backward_alone=True)
        row["launches"] = sum(1 for op in bplan.ops if type(op).__name__ in ("Kernel", "Gemm"))
        out[mode] = row
        print(f"  fold {mode}: fwd+bwd {row['fwdbwd_ms']:.3f} ms, fwd {row['fwd_ms']:.3f}, "
              f"bwd {row['bwd_ms']:.3f} ({row['launches']} launches)", file=sys.stderr,
              flush=True)
    return out


def probe(a, cell, layers, hidden, batch):
    cls = {"lstm": rnnrt.LSTM, "gru": rnnrt.GRU}[cell]
    model = cls(hidden, hidden, num_layers=layers, seed=0)
    runner = GpuRunner(model, schedule_cache=False, dtype=a.dtype)
    sel = runner.schedule(a.steps, batch, train=True)
    sched = sel.schedule
    fwd_sched = runner.schedule(a.steps, batch, train=False).schedule
    splits = [s for s in a.splits.split(",") if s]
    rows = {"chosen": time_splits(runner, sched, a.steps, batch, splits, a.repeats)}
    if a.fold:
        rows["fold"] = time_fold(runner, dataclasses.replace(sched, backward=None), a.steps,
                                 batch, [m for m in a.fold.split(",") if m], a.repeats)
    if fwd_sched.name != sched.name.split("+")[0]:   # +pbwd, +rbwd: the backward
        rows["fwd_choice"] = time_splits(runner, fwd_sched, a.steps, batch, splits,
                                         a.repeats)
    if a.bwd_clusters:
        rows["bwd_clusters"] = time_bwd_clusters(
            runner, sched, a.steps, batch, [c for c in a.bwd_clusters.split(",") if c],
            a.repeats, a.bwd_clusters_backward)
    if a.wgrad_steps:
        rows["wgrad"] = time_wgrad(runner, sched, a.steps, batch,
                                   [c for c in a.wgrad_steps.split(",") if c], a.repeats,
                                   backward=a.wgrad_backward)
    if a.wgrad_streams:
        rows["wgrad_streams"] = time_wgrad(runner, sched, a.steps, batch,
                                           [c for c in a.wgrad_streams.split(",") if c],
                                           a.repeats, "wgrad_streams")
    if a.chunks:
        rows["chunks"] = time_chunks(runner, sched, a.steps, batch,
                                     [c for c in a.chunks.split(",") if c], a.repeats)
    trace = None
    if a.trace:
        trace = {}
        for s in ("1", "rule"):
            sc = dataclasses.replace(sched, backward=None)
            kinds, ops, traced = trace_backward(runner, sc, a.steps, batch, s)
            trace[s] = {"kinds": kinds, "traced_ms": traced}
    backwards = None
    if a.backwards:
        backwards = time_backwards(runner, a.steps, batch,
                                   [n for n in a.backwards.split(",") if n], a.repeats,
                                   a.trace_backwards, a.fwd_family)
    cd_f = cudnn_ms(model, a.steps, batch, False, a.repeats, a.dtype)
    cd_fb = cudnn_ms(model, a.steps, batch, True, a.repeats, a.dtype)
    runner.close()
    return {"cell": cell, "layers": layers, "hidden": hidden, "batch": batch,
            "schedule": sched.as_dict(), "fwd_schedule": fwd_sched.as_dict(),
            "candidates": sel.candidates, "splits": rows, "trace": trace,
            "backwards": backwards, "backwards_forward": a.fwd_family,
            "cudnn_fwd_ms": cd_f, "cudnn_fwdbwd_ms": cd_fb}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="lstm:4:512:64",
                    help="cell:layers:hidden:batch, comma-separated")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--dtype", default="float32",
                    help="the runner's and cuDNN's precision: float32 (TF32 off), float16, "
                         "bfloat16")
    ap.add_argument("--fold", default="",
                    help="also time the chosen schedule's per-step backward with the split "
                         "sum folded into the pointwise kernel and without: on,off")
    ap.add_argument("--splits", default="1,2,4,8,16,rule")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--chunks", default="",
                    help="also time the chosen schedule with these input chunks k (e.g. "
                         "1,2,5,10), the split rule's backward")
    ap.add_argument("--wgrad-steps", default="",
                    help="also time the chosen schedule with its weight gradients in chunks "
                         "of these steps (e.g. 100,50,25,10,rule; PlanKey.wgrad_steps)")
    ap.add_argument("--wgrad-backward", default=None,
                    help="the backward --wgrad-steps times (PlanKey.backward, e.g. cluster: "
                         "at one layer its launches follow the chunks); default the chosen "
                         "schedule's")
    ap.add_argument("--wgrad-streams", default="",
                    help="also time the chosen schedule with its weight gradients placed "
                         "1, 2, 3 (PlanKey.wgrad_streams), e.g. 1,2,3")
    ap.add_argument("--bwd-clusters", default="",
                    help="also time the chosen schedule's forward with the cluster backward "
                         "kernel at these cluster counts (e.g. rule,2,4,8; PlanKey.bwd_clusters)")
    ap.add_argument("--bwd-clusters-backward", default=None,
                    help="the backward --bwd-clusters times (PlanKey.backward: cluster, regs); "
                         "default the chosen schedule's, else cluster")
    ap.add_argument("--trace", action="store_true", help="trace the backward (S 1 and rule)")
    ap.add_argument("--backwards", default="",
                    help="also time the --fwd-family forward with these backwards (step, stack, "
                         "grid, pair, cluster, persistent, regs), e.g. step,stack")
    ap.add_argument("--fwd-family", default="stack",
                    help="the persistent forward family --backwards times them after (stack, "
                         "regs, cluster, grid, ...)")
    ap.add_argument("--trace-backwards", action="store_true",
                    help="trace each of the --backwards plans op by op")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    results = []
    for spec in a.shapes.split(","):
        cell, layers, hidden, batch = spec.split(":")
        print(f"== {spec}", file=sys.stderr, flush=True)
        results.append(probe(a, cell, int(layers), int(hidden), int(batch)))
    import cupy as cp
    from rnnrt.session import device_info
    info = device_info(cp)
    created = records.now_iso()
    rec = {"kind": "backward_probe", "created": created, "device": info,
           "versions": records.versions(cp), "command": " ".join(sys.argv), "config": vars(a),
           "results": results,
           "note": "rnnrt: graph executor, all steps, forward then backward, CUDA events, "
                   f"median; cuDNN at {a.dtype} (fp32: TF32 off), same process"}
    if a.out:
        slug = records.device_slug(info["device"])
        path = Path(a.out) / f"backward-probe-splits-{slug}-{records.stamp(created)}.json"
        records.write_json(rec, path)
        print(f"record: {path}", file=sys.stderr)
    print("| shape | schedule | cuDNN fwd+bwd | " + " | ".join(
        f"S {s}" for s in a.splits.split(",")) + " |")
    for r in results:
        for k, v in (r["backwards"] or {}).items():
            print(f"| {r['cell']} L{r['layers']} H{r['hidden']} B{r['batch']} | "
                  f"{r['backwards_forward']} fwd (fwd {v['fwd_ms']:.3f}, cuDNN "
                  f"{r['cudnn_fwd_ms']:.3f}) + {k} bwd (bwd {v['bwd_ms']:.3f}) | "
                  f"{r['cudnn_fwdbwd_ms']:.3f} | "
                  f"{v['fwdbwd_ms']:.3f} ({r['cudnn_fwdbwd_ms'] / v['fwdbwd_ms']:.2f}x) |")
        def line(label, v):
            print(f"| {r['cell']} L{r['layers']} H{r['hidden']} B{r['batch']} | "
                  f"{r['schedule']['name']} {label} | {r['cudnn_fwdbwd_ms']:.3f} | "
                  f"{v['fwdbwd_ms']:.3f} ({r['cudnn_fwdbwd_ms'] / v['fwdbwd_ms']:.2f}x) |")

        for k, v in r["splits"].get("bwd_clusters", {}).items():
            if "fwdbwd_ms" in v:
                line(f"bwd clusters {k}", v)
        for k, v in r["splits"].get("wgrad_streams", {}).items():
            line(f"wgrad streams {k} ({v['streams']} streams)", v)
        for k, v in r["splits"].get("wgrad", {}).items():
            line(f"wgrad {k} ({v['chunks']} chunks)", v)
        for k, v in r["splits"].get("chunks", {}).items():
            line(f"chunk {k}", v)
        for k, v in r["splits"].get("fold", {}).items():
            line(f"fold {k} (bwd {v['bwd_ms']:.3f}, {v['launches']} launches)", v)
        for which, rows in r["splits"].items():
            if which in ("chunks", "bwd_clusters", "wgrad", "wgrad_streams", "fold"):
                continue
            cells = []
            for s in a.splits.split(","):
                v = rows.get(s, {})
                cells.append(f"{v['fwdbwd_ms']:.3f} ({r['cudnn_fwdbwd_ms'] / v['fwdbwd_ms']:.2f}x"
                             f" S{v['splits']})" if "fwdbwd_ms" in v else "-")
            name = r["schedule"]["name"] if which == "chosen" else r["fwd_schedule"]["name"]
            print(f"| {r['cell']} L{r['layers']} H{r['hidden']} B{r['batch']} | {name} | "
                  f"{r['cudnn_fwdbwd_ms']:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
