"""Time named schedules of one shape beside cuDNN, in one process: what the selector would see
if its candidates included them (chunk lengths of the chunked cluster families, cluster
counts, the paper schedules), to decide which knobs are worth a candidate.

Each schedule is timed through the GPU runner's own selector timer (the selector's protocol:
random inputs, one warm-up, CUDA events, median of --repeats; forward, or forward + backward
with --train), which builds and runs the same plans ``switches='auto'`` runs. The schedules'
correctness is the GPU tests' (every family and chunking against the float64 reference);
this script only times. cuDNN (torch.nn at fp32, TF32 off) is timed with the same events
protocol on its own inputs.

Usage (GPU): python experiments/scripts/schedule_probe.py --cell gru --layers 4 --hidden 128
    --batch 128 [--train] [--families regs,cluster] [--chunks 2,5,10,20,25,50]
    [--clusters 4,8,12] [--repeats 15] [--out DIR]
Prints a table last; writes a JSON record (kind 'schedule_probe') into --out.
"""
from __future__ import annotations

import argparse
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
from rnnrt.kernels.selector import tuning_steps  # noqa: E402
from rnnrt.kernels.schedules import Schedule, paper_schedules  # noqa: E402
from rnnrt.plan.switches import Switches  # noqa: E402

_PAPER = dict(grouped=True, streams=True, fused=True, wavefront=True)


def schedules(families, chunks, clusters) -> list[Schedule]:
    """The paper schedules, then each family at each chunk length (input_batch k) and each
    cluster count (None: the rule's)."""
    out = list(paper_schedules())
    for fam in families:
        for k in chunks:
            sw = Switches(**_PAPER, input_batch=k, persistent=True)
            for n in clusters:
                name = f"{fam}/{n if n else 'rule'}/k{k}"
                out.append(Schedule(name, sw, fam, clusters=n))
    return out


def trace(runner, sched, T, B) -> list:
    """The forward plan of ``sched`` traced op by op on random inputs: [index, stream, kind,
    layer, first step, last step + 1, start ms, end ms] a compute op (trace_exec.TraceOp);
    printed as it goes, with the idle time before each op on its stream."""
    from rnnrt.exec.trace_exec import TracingExecutor
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan.forward import forward_plan
    cp = runner.cp
    plan = forward_plan(runner.new_key(T, B, False, sched.switches, sched.family,
                                       clusters=sched.clusters))
    ws = Workspace(plan, cp, np.float32, runner.params)
    ws.poison()
    rng = np.random.default_rng(0)
    m = runner.model
    x = rng.standard_normal((T, B, m.input_size)).astype(np.float32)
    h0 = rng.standard_normal((m.num_layers, B, m.hidden_size)).astype(np.float32)
    c0 = h0.copy() if m.cell_name == "lstm" else None
    ws.load_inputs(x, h0, c0)
    cp.cuda.runtime.deviceSynchronize()
    ex = TracingExecutor(plan, ws, runner.session.ctx)
    ex.trace()   # a first pass warms up (modules, cuBLAS handles)
    ws.load_inputs(x, h0, c0)
    cp.cuda.runtime.deviceSynchronize()
    ops = ex.trace()
    print(f"trace {sched.name}: {plan.fit if hasattr(plan, 'fit') else ''}", file=sys.stderr)
    last, kinds = {}, {}
    for o in ops:
        idle = o.t_start_ms - last.get(o.stream, 0.0)
        last[o.stream] = o.t_end_ms
        k = kinds.setdefault(o.kind, [0, 0.0])
        k[0] += 1
        k[1] += o.t_end_ms - o.t_start_ms
        if len(ops) > 200:   # a long plan: the sums by kind below, not every op
            continue
        print(f"  op {o.index:4d} s{o.stream} {o.kind:10s} L{o.layer} t{o.steps[0]}-{o.steps[1]}"
              f" {o.t_start_ms:8.3f} {o.t_end_ms:8.3f} ms  ran {1e3 * (o.t_end_ms - o.t_start_ms):7.1f}"
              f" us  idle before {1e3 * idle:7.1f} us", file=sys.stderr)
    for kind, (n, ms) in kinds.items():
        print(f"  {kind:10s} {n:5d} ops, {ms:8.3f} ms busy in all, {1e3 * ms / n:7.1f} us each",
              file=sys.stderr)
    print(f"  total {ex.info['total_ms']:.3f} ms, host-bound {ex.info['host_bound']}",
          file=sys.stderr)
    return [list(o) for o in ops]


def cudnn_ms(model, T, B, train, repeats, dtype="float32"):
    """(median ms, kernels) of torch.nn (cuDNN) at ``dtype`` (fp32: TF32 off), forward (+
    backward):
    kernels = [{kernel, calls, us_total}] of one pass, from torch's profiler, longest first
    (which algorithm cuDNN ran: a persistent kernel or per-step GEMMs)."""
    import torch
    m = torch_module(torch, model, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    tdt = next(m.parameters()).dtype
    x = torch.randn(T, B, model.input_size, device="cuda", generator=g).to(tdt)
    x.requires_grad_(train)
    dy = torch.randn(T, B, model.hidden_size, device="cuda", generator=g).to(tdt)

    def run():
        y, _ = m(x)
        if train:
            y.backward(dy)

    ms = time_torch(torch, run, repeats=repeats, warmup=3).ms_median
    # which kernels cuDNN ran, how many and for how long (torch's profiler, one pass)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:   # older torch
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us > 0:
            kernels.append({"kernel": e.key, "calls": e.count, "us_total": us})
    kernels.sort(key=lambda k: -k["us_total"])
    for k in kernels[:8]:
        print(f"  cuDNN kernel {k['us_total']:10.1f} us in {k['calls']:4d} calls: "
              f"{k['kernel'][:90]}", file=sys.stderr)
    return ms, kernels


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="gru")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--train", action="store_true", help="forward + backward")
    ap.add_argument("--families", default="regs,cluster")
    ap.add_argument("--chunks", default="2,5,10,20,25,50")
    ap.add_argument("--clusters", default="0", help="cluster counts; 0 = the rule's")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtype", default="float32",
                    help="precision of rnnrt and of cuDNN (rnnrt/precision.py's names)")
    ap.add_argument("--trace", default="",
                    help="names of probed schedules to trace op by op (forward, eager under "
                         "the tracer's hold: rnnrt/exec/trace_exec.py)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cls = {"lstm": rnnrt.LSTM, "gru": rnnrt.GRU}[a.cell]
    model = cls(a.hidden, a.hidden, num_layers=a.layers, seed=0)
    runner = GpuRunner(model, schedule_cache=False, dtype=a.dtype)
    shape = runner.selector_shape(a.steps, a.batch, a.train)
    timer = runner.selector.timer
    chunks = [c if c == "all" else int(c) for c in a.chunks.split(",") if c]
    counts = [int(c) or None for c in a.clusters.split(",") if c]
    rows = []
    for sched in schedules([f for f in a.families.split(",") if f], chunks, counts):
        try:
            ms = statistics.median(timer(sched, shape, a.repeats))
            rows.append({"schedule": sched.as_dict(), "name": sched.name, "ms": ms})
        except Exception as e:  # noqa: BLE001 - a schedule that cannot run is reported
            rows.append({"schedule": sched.as_dict(), "name": sched.name, "ms": None,
                         "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"{sched.name}: {rows[-1].get('ms')}", file=sys.stderr, flush=True)
    traces = {}
    for sched in schedules([f for f in a.families.split(",") if f], chunks, counts):
        if sched.name in a.trace.split(","):
            traces[sched.name] = trace(runner, sched, a.steps, a.batch)
    cd, cudnn_kernels = cudnn_ms(model, a.steps, a.batch, a.train, a.repeats, a.dtype)
    created = records.now_iso()
    rec = {"kind": "schedule_probe", "created": created, "device": runner.session.info,
           "versions": records.versions(runner.cp), "command": " ".join(sys.argv),
           "config": vars(a), "cudnn_ms": cd, "cudnn_kernels": cudnn_kernels, "rows": rows, "traces": traces}
    if a.out:
        slug = records.device_slug(runner.session.info["device"])
        what = f"{a.cell}-L{a.layers}-H{a.hidden}-B{a.batch}-{'fwdbwd' if a.train else 'fwd'}"
        if a.dtype != "float32":
            what += f"-{a.dtype}"
        path = Path(a.out) / f"schedule-probe-{what}-{slug}-{records.stamp(created)}.json"
        records.write_json(rec, path)
        print(f"record: {path}", file=sys.stderr)
    print(f"| {a.cell} L{a.layers} H{a.hidden} B{a.batch} {'fwd+bwd' if a.train else 'fwd'} "
          f"| ms | vs cuDNN {cd:.3f} ms |")
    print("|---|---|---|")
    print(f"(rnnrt timed over {tuning_steps(shape)} of {a.steps} steps: the selector's "
          f"prefix; cuDNN over all)")
    for r in sorted(rows, key=lambda r: r["ms"] if r["ms"] is not None else np.inf)[:12]:
        ms = r["ms"]
        print(f"| {r['name']} | {'-' if ms is None else f'{ms:.3f}'} | "
              f"{'-' if ms is None else f'{cd / ms:.2f}x'} |")
    runner.close()


if __name__ == "__main__":
    main()
