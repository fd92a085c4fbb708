"""Command line: `rnnrt ladder` (the paper's Table 1 on this GPU), `rnnrt sweep` (the ladder
over a grid of sizes, resumable JSON lines), `rnnrt plot` (figures from those results),
`rnnrt trace` (per-op timelines of one pass) and `rnnrt demo`."""
from __future__ import annotations

import argparse
import sys

import numpy as np


def _input_batch(s: str):
    if s == "all":
        return "all"
    try:
        k = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'all', got {s!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'all', got {s!r}")
    return k


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {s!r}")
    return v


def _ladder_parser(sub):
    from .bench.ladder import CPU_SIZE
    from .plan.switches import DEFAULT_INPUT_BATCH
    p = sub.add_parser("ladder", help="verify and time every rung of the paper's ladder "
                       "beside cuDNN and the fp32 GEMM ceiling (the paper's Table 1)")
    p.add_argument("--cell", default="lstm", choices=["lstm", "gru", "rnn_tanh", "rnn_relu"])
    p.add_argument("--layers", type=_positive, default=None, help="default 4")
    p.add_argument("--hidden", type=_positive, default=None, help="default 512")
    p.add_argument("--input-size", type=_positive, default=None, help="default = hidden")
    p.add_argument("--batch", type=_positive, default=None, help="minibatch, default 64")
    p.add_argument("--steps", type=_positive, default=None, help="timesteps, default 100")
    p.add_argument("--repeats", type=_positive, default=20, help="timed runs (median taken)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--input-batch", type=_input_batch, default=DEFAULT_INPUT_BATCH,
                   help=f"steps per W.x GEMM on the input-batching rung: k or 'all' "
                        f"(default {DEFAULT_INPUT_BATCH})")
    p.add_argument("--executor", choices=["eager", "graph", "both"], default="both")
    p.add_argument("--rungs", type=_list_of(str, "rung names"), default=None,
                   help="rows to run: rungs of the ladder and/or 'auto' (the schedule "
                        "selector's choice, what GpuRunner runs by default); default all")
    p.add_argument("--out", default=None, help="JSON record path (default: "
                   "experiments/results/ladder/ladder-...json)")
    p.add_argument("--no-cudnn", action="store_true", help="skip the cuDNN row")
    p.add_argument("--backward", action="store_true",
                   help="time forward+backward (a training step's RNN work; FLOPs = 3x the "
                        "forward's); cuDNN through torch autograd")
    p.add_argument("--cpu", action="store_true",
                   help=f"no GPU: run the ladder on the NumPy executor at a small size "
                        f"({CPU_SIZE}); figures are labelled CPU figures")
    return p


def _cmd_ladder(a) -> int:
    from .bench.ladder import CPU_SIZE, LadderConfig, markdown_table, run_ladder, write_record
    from .device import gpu_status
    if not a.cpu:
        ok, why = gpu_status()
        if not ok:
            from .device import INSTALL_HINT
            print(f"rnnrt ladder: no usable GPU ({why}).\n  Either {INSTALL_HINT},\n  or run "
                  f"`rnnrt ladder --cpu` for the same ladder on the NumPy executor at a small "
                  f"size (CPU figures).", file=sys.stderr)
            return 2
    size = dict(CPU_SIZE) if a.cpu else dict(layers=4, hidden=512, batch=64, steps=100)
    for name in ("layers", "hidden", "batch", "steps"):
        if getattr(a, name) is not None:
            size[name] = getattr(a, name)
    if a.input_size is not None:
        size["input_size"] = a.input_size
    executors = ("eager", "graph") if a.executor == "both" else (a.executor,)
    try:
        cfg = LadderConfig(cell=a.cell, repeats=a.repeats, warmup=a.warmup,
                           input_batch=a.input_batch, executors=executors, cpu=a.cpu,
                           cudnn=not a.no_cudnn, backward=a.backward, rungs=a.rungs, **size)
    except ValueError as e:
        print(f"rnnrt ladder: error: {e}", file=sys.stderr)
        return 2
    record = run_ladder(cfg)
    path = write_record(record, a.out)
    print(markdown_table(record))
    print(f"\nrecord: {path}")
    refused = [r for r in record["rows"] if "refused" in r]
    return 1 if refused else 0


def _list_of(conv, what):
    """argparse type: a comma-separated list, each item through ``conv``."""
    def parse(s: str):
        items = [x.strip() for x in s.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, "
                                             f"got {s!r}")
        return tuple(conv(x) for x in items)
    return parse


def _cell_name(s: str) -> str:
    from .cells import CELLS
    if s not in CELLS:
        raise argparse.ArgumentTypeError(f"expected a cell out of {sorted(CELLS)}, got {s!r}")
    return s


def _seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {s!r}")
    return v


def _no_gpu(cmd: str) -> int:
    """The no-GPU message (and exit status 2) of the commands that have a --cpu mode."""
    from .device import INSTALL_HINT, gpu_status
    _, why = gpu_status()
    print(f"rnnrt {cmd}: no usable GPU ({why}).\n  Either {INSTALL_HINT},\n  or run "
          f"`rnnrt {cmd} --cpu` for the same pipeline on the NumPy executor at small sizes "
          f"(CPU figures).", file=sys.stderr)
    return 2


def _sweep_parser(sub):
    from .bench import sweep as sw
    from .plan.switches import DEFAULT_INPUT_BATCH
    p = sub.add_parser(
        "sweep", help="the ladder (verified, then timed, beside cuDNN) at every point of a "
        "grid of sizes; JSON lines appended as each point finishes; resumable")
    p.add_argument("--hidden", type=_list_of(_positive, "positive ints"), default=None,
                   help="hidden sizes, e.g. 128,256 (default "
                        f"{','.join(map(str, sw.DEFAULT_HIDDEN))})")
    p.add_argument("--batch", type=_list_of(_positive, "positive ints"), default=None,
                   help=f"minibatches (default {','.join(map(str, sw.DEFAULT_BATCH))})")
    p.add_argument("--layers", type=_list_of(_positive, "positive ints"), default=None,
                   help=f"layer counts (default {','.join(map(str, sw.DEFAULT_LAYERS))})")
    p.add_argument("--cell", type=_list_of(_cell_name, "cells"), default=None,
                   help="cells, e.g. lstm,gru (default lstm)")
    p.add_argument("--steps", type=_positive, default=None,
                   help=f"timesteps at every point (default {sw.DEFAULT_STEPS}, "
                        f"{sw.SHORT_STEPS} for hidden >= {sw.LONG_STEPS_HIDDEN})")
    p.add_argument("--input-size", type=_positive, default=None, help="default = hidden")
    p.add_argument("--input-batch", type=_list_of(_input_batch, "ints or 'all'"),
                   default=None, help="k of the input-batching rung, a list sweeps it "
                   f"(default {DEFAULT_INPUT_BATCH})")
    p.add_argument("--executor", choices=["graph", "eager", "both"], default="graph",
                   help="default graph (eager is host-bound: slow, and not what the rungs "
                        "can do)")
    p.add_argument("--repeats", type=_positive, default=None, help="timed runs per rung "
                   "(median taken; default 10, --quick 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 2)")
    p.add_argument("--quick", action="store_true",
                   help="a small preset: hidden 256,512,1024 x minibatch 32,64 x layers 1,4, "
                        "LSTM, 5 repeats (a few minutes on an H100); flags given win")
    p.add_argument("--preset", choices=sorted(sw.PRESETS), default=None,
                   help="a named grid: 'wide' = lstm,gru x layers 1,4 x hidden 128-2048 x "
                        "minibatch 8-256 x fwd and fwd+bwd, 100 steps, the auto row and cuDNN "
                        "timed in turn (where rnnrt is judged against cuDNN); flags given win")
    p.add_argument("--rungs", type=_list_of(str, "rung names"), default=None,
                   help="rows to run at each point: rungs of the ladder and/or 'auto' (the "
                        "schedule selector's choice); default all of them")
    p.add_argument("--pass", dest="passes", type=_list_of(str, "passes"), default=None,
                   help="fwd, fwd+bwd or both (fwd,fwd+bwd); default fwd (--backward: "
                        "fwd+bwd)")
    p.add_argument("--no-cudnn", action="store_true", help="skip the cuDNN rows")
    p.add_argument("--backward", action="store_true",
                   help="time forward+backward at every point (as `rnnrt ladder --backward`;"
                        " pass 'fwd+bwd', FLOPs 3x the forward's)")
    p.add_argument("--out", default=None,
                   help="JSON-lines results file (default: a new experiments/results/sweep/"
                        "sweep[-quick][-bwd]-<cells>-<device>-<stamp>.jsonl; with --resume the "
                        "newest such file)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the file: skip the points it already has")
    g.add_argument("--overwrite", action="store_true", help="start the file again")
    p.add_argument("--retry-errors", action="store_true",
                   help="with --resume: run again the points that raised")
    p.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                   help="stop cleanly before a point that would not finish within SECONDS "
                        "of the start (estimated from finished points); resume later")
    p.add_argument("--dry-run", action="store_true",
                   help="list the points (and which are done) and exit")
    p.add_argument("--verbose", action="store_true", help="print every rung's line")
    p.add_argument("--cpu", action="store_true",
                   help="no GPU: the NumPy executor at tiny sizes (default grid "
                        f"{sw.CPU_GRID}); figures are labelled CPU figures")
    return p


def _sweep_config(a):
    from .bench import sweep as sw
    kw = {}
    if a.preset:
        kw.update(sw.PRESETS[a.preset])
    if a.cpu:
        kw.update(sw.CPU_QUICK if a.quick else sw.CPU_GRID)
    elif a.quick:
        kw.update(sw.QUICK)
    for name, attr in (("hidden", "hidden"), ("batch", "batch"), ("layers", "layers"),
                       ("cells", "cell"), ("steps", "steps"), ("input_size", "input_size"),
                       ("input_batch", "input_batch"), ("repeats", "repeats"),
                       ("warmup", "warmup"), ("time_budget", "time_budget"),
                       ("rungs", "rungs"), ("passes", "passes")):
        if getattr(a, attr) is not None:
            kw[name] = getattr(a, attr)
    kw["executors"] = ("eager", "graph") if a.executor == "both" else (a.executor,)
    return sw.SweepConfig(cudnn=not a.no_cudnn, cpu=a.cpu, retry_errors=a.retry_errors,
                          verbose=a.verbose, backward=a.backward, **kw)


def _cmd_sweep(a) -> int:
    from pathlib import Path

    from .bench import sweep as sw
    if a.warmup is not None and a.warmup < 0:
        print("rnnrt sweep: --warmup must be >= 0", file=sys.stderr)
        return 2
    if a.retry_errors and not a.resume:
        print("rnnrt sweep: --retry-errors goes with --resume", file=sys.stderr)
        return 2
    try:
        cfg = _sweep_config(a)
    except ValueError as e:
        print(f"rnnrt sweep: {e}", file=sys.stderr)
        return 2
    if a.out:
        path = Path(a.out)
    else:
        from .device import gpu_status
        device = sw.cpu_device_name() if a.cpu else gpu_status()[1]
        latest = sw.latest_path(cfg, device, a.quick, preset=a.preset)
        path = (latest if (a.resume or a.dry_run) and latest else
                sw.default_path(cfg, device, a.quick, preset=a.preset))
    if a.dry_run:
        done = sw.done_keys(sw.read_lines(path), cfg.retry_errors) if path.exists() else set()
        pts = sw.grid(cfg)
        for p in pts:
            print(f"{'done' if p.key() in done else 'todo'}  {p.label():40s} "
                  f"{p.flops:.3g} FLOPs")
        print(f"{len(pts)} points, {sum(p.key() in done for p in pts)} done in {path}")
        return 0
    if path.exists() and path.stat().st_size > 0 and not (a.resume or a.overwrite):
        print(f"rnnrt sweep: {path} already has results; pass --resume to continue it "
              f"(skipping the points it has) or --overwrite to start again", file=sys.stderr)
        return 2
    if not a.cpu:
        from .device import gpu_status
        if not gpu_status()[0]:
            return _no_gpu("sweep")
    try:
        res = sw.run_sweep(cfg, path, resume=a.resume, overwrite=a.overwrite)
    except FileExistsError as e:
        print(f"rnnrt sweep: {e}", file=sys.stderr)
        return 2
    print(f"{res.path}: {res.done} points done, {res.errors} raised, {res.skipped} were "
          f"already there, {res.remaining} left, of {res.total} ({res.seconds:.0f} s)")
    if res.stopped:
        print(f"stopped early: {res.stopped}\n  continue with the same command and --resume")
    print(f"figures: rnnrt plot {res.path}")
    if res.stopped == "interrupted":
        return 130
    return 1 if res.errors else 0


def _plot_parser(sub):
    p = sub.add_parser("plot", help="figures (PNG + SVG) from sweep results and ladder "
                       "records: TFLOPS vs hidden, 4- over 1-layer throughput, best rung vs "
                       "cuDNN")
    p.add_argument("results", nargs="+", metavar="RESULTS",
                   help="sweep .jsonl files, ladder .json records, or directories of them")
    p.add_argument("--out-dir", default="experiments/figures",
                   help="where the figures go (default experiments/figures)")
    p.add_argument("--cell", type=_cell_name, default="lstm", help="default lstm")
    p.add_argument("--layers", type=_positive, default=4,
                   help="layer count of figure 1 and the upper one of figure 2 (default 4)")
    p.add_argument("--executor", choices=["graph", "eager", "numpy"], default=None,
                   help="whose timings (default graph; numpy for CPU results)")
    p.add_argument("--steps", type=_positive, default=None,
                   help="only points with this many steps (default: the sweep's defaults)")
    p.add_argument("--input-batch", type=_input_batch, default=None,
                   help="only points with this input-batching k")
    p.add_argument("--pass", dest="pass_", choices=["fwd", "fwd+bwd"], default="fwd",
                   help="which pass's timings: forward (default) or forward+backward")
    p.add_argument("--formats", type=_list_of(str, "formats"), default=("png", "svg"),
                   help="default png,svg")
    return p


def _cmd_plot(a) -> int:
    from .bench.plots import plot_all
    try:
        paths = plot_all(a.results, a.out_dir, cell=a.cell, layers=a.layers,
                         executor=a.executor, formats=a.formats, steps=a.steps,
                         input_batch=a.input_batch, pass_=a.pass_)
    except (FileNotFoundError, ValueError) as e:
        print(f"rnnrt plot: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    if not paths:
        print("rnnrt plot: nothing to draw (see the notes above)", file=sys.stderr)
        return 1
    return 0


def _trace_parser(sub):
    from .bench.trace import CPU_DEFAULT, GPU_DEFAULT
    from .plan.switches import DEFAULT_INPUT_BATCH
    p = sub.add_parser("trace", help="per-op timeline of one forward pass, one row per "
                       "stream, for the naive and the last rung (PNG + SVG + JSON)")
    p.add_argument("--cell", type=_cell_name, default="lstm")
    p.add_argument("--layers", type=_positive, default=None,
                   help=f"default {GPU_DEFAULT['layers']}")
    p.add_argument("--hidden", type=_positive, default=None,
                   help=f"default {GPU_DEFAULT['hidden']}")
    p.add_argument("--input-size", type=_positive, default=None, help="default = hidden")
    p.add_argument("--batch", type=_positive, default=None,
                   help=f"minibatch, default {GPU_DEFAULT['batch']}")
    p.add_argument("--steps", type=_positive, default=None,
                   help=f"timesteps, default {GPU_DEFAULT['steps']} (short: readable ops)")
    p.add_argument("--input-batch", type=_input_batch, default=DEFAULT_INPUT_BATCH,
                   help=f"k of the input-batching rung (default {DEFAULT_INPUT_BATCH})")
    p.add_argument("--rungs", default=None,
                   help="comma-separated ladder rungs to trace (default: naive and the "
                        "last rung), e.g. +fused,+pretranspose")
    p.add_argument("--no-hold", action="store_true",
                   help="GPU: do not hold the GPU while the host queues the traced pass "
                        "(the timeline then shows Python's issue rate)")
    p.add_argument("--out", default=None, help="trace JSON path (default "
                   "experiments/results/trace/trace-...json)")
    p.add_argument("--fig-dir", default="experiments/figures",
                   help="where the PNG and SVG go (default experiments/figures)")
    p.add_argument("--cpu", action="store_true",
                   help=f"no GPU: the NumPy executor in program order at a small size "
                        f"({CPU_DEFAULT}); CPU timings")
    return p


def _cmd_trace(a) -> int:
    from pathlib import Path

    from .bench import trace as tr
    try:
        rungs = (None if a.rungs is None else
                 tr.traced_rungs(a.input_batch, [n.strip() for n in a.rungs.split(",")]))
    except ValueError as e:
        print(f"rnnrt trace: --{e}", file=sys.stderr)
        return 2
    if not a.cpu:
        from .device import gpu_status
        if not gpu_status()[0]:
            return _no_gpu("trace")
    size = dict(tr.CPU_DEFAULT if a.cpu else tr.GPU_DEFAULT)
    for name in ("layers", "hidden", "batch", "steps"):
        if getattr(a, name) is not None:
            size[name] = getattr(a, name)
    cfg = tr.TraceConfig(cell=a.cell, input_size=a.input_size, input_batch=a.input_batch,
                         cpu=a.cpu, hold=not a.no_hold, **size)
    record = tr.run_trace(cfg, rungs=rungs)
    path = tr.write_record(record, a.out)
    figs = tr.draw_trace(record, Path(a.fig_dir) / (tr.default_stem(record) + ".png"))
    for e in record["rungs"]:
        print(f"{e['rung']:14s} {len(e['ops']):5d} ops on {len(e['streams'])} stream(s) "
              f"{e['total_ms']:9.3f} ms  check: {'ok' if e['check']['ok'] else 'MISMATCH'}"
              f"{'  (host-bound)' if e.get('host_bound') and not a.cpu else ''}")
    print(f"trace: {path}")
    for f in figs:
        print(f"figure: {f}")
    return 0 if all(e["check"]["ok"] for e in record["rungs"]) else 1


def _cmd_demo(a) -> int:
    """A small forward + backward through the NumPy reference: output and gradient norms."""
    import rnnrt
    m = rnnrt.LSTM(a.input_size, a.hidden, num_layers=a.layers, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.steps, a.batch, a.input_size)).astype(np.float32)
    y, (h_n, c_n), tape = m.forward(x, train=True)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    g = m.backward(tape, dy)
    print(f"{m!r}\n  x {x.shape} -> y {y.shape}, h_n {h_n.shape}, c_n {c_n.shape}")
    print(f"  |y| = {np.linalg.norm(y):.4f}  |h_n| = {np.linalg.norm(h_n):.4f}  "
          f"|c_n| = {np.linalg.norm(c_n):.4f}")
    print(f"  |dx| = {np.linalg.norm(g.dx):.4f}  |dh0| = {np.linalg.norm(g.dh0):.4f}  "
          f"|dc0| = {np.linalg.norm(g.dc0):.4f}")
    for name, grad in g.params.items():
        print(f"  |d {name}| = {np.linalg.norm(grad):.4f}")
    print(f"  forward GEMM FLOPs (paper's convention): {m.flops(a.batch, a.steps):,}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rnnrt", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    _ladder_parser(sub)
    d = sub.add_parser("demo", help="a small CPU forward/backward; prints output and "
                       "gradient norms")
    d.add_argument("--layers", type=_positive, default=2)
    d.add_argument("--hidden", type=_positive, default=16)
    d.add_argument("--input-size", type=_positive, default=8)
    d.add_argument("--batch", type=_positive, default=4)
    d.add_argument("--steps", type=_positive, default=10)
    _sweep_parser(sub)
    _plot_parser(sub)
    _trace_parser(sub)
    a = parser.parse_args(argv)
    return {"ladder": _cmd_ladder, "demo": _cmd_demo, "sweep": _cmd_sweep, "plot": _cmd_plot,
            "trace": _cmd_trace}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
