"""Command line: `rnnrt ladder` (the paper's Table 1 on this GPU), `rnnrt sweep` (the ladder
over a grid of sizes, resumable JSON lines), `rnnrt plot` (figures from those results),
`rnnrt summary` (their verdict against cuDNN), `rnnrt trace` (per-op timelines of one pass),
`rnnrt precision` (errors at each precision against the float64 reference), `rnnrt demo` and
`rnnrt --version`.

Outputs go to ./rnnrt-out (results/<kind>/ and figures/) unless RNNRT_OUT names another
folder or --out / --out-dir say where; every output is checked before any work, and an
existing file is replaced only with --overwrite.

Errors are one line, `rnnrt <command>: error: ...`: exit status 2 for a wrong invocation (a
bad flag, conflicting flags, an output that cannot be written, sizes that cannot fit, no GPU
without --cpu), 1 for a failure while running. RNNRT_DEBUG=1 shows the traceback instead.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from .cli_args import (SIZE_FLAGS, Parser, UsageError, add_dtype, add_results, cell_flag,
                       check_results, dtype_flag, input_batch_flag, list_of, nonneg, path_flag,
                       positive, record_out, require_gpu, sizes_of, write_out)
from .cli_sweep import cmd_sweep, sweep_parser


# -------------------------------------------------------------------------------- ladder

def _ladder_parser(sub):
    from .bench.ladder import CPU_SIZE
    from .plan.switches import DEFAULT_INPUT_BATCH
    p = sub.add_parser("ladder", help="verify and time every rung of the paper's ladder "
                       "beside cuDNN and the GEMM ceiling (the paper's Table 1)")
    p.add_argument("--cell", default="lstm", choices=["lstm", "gru", "rnn_tanh", "rnn_relu"])
    p.add_argument("--layers", type=positive, default=None, help="default 4")
    p.add_argument("--hidden", type=positive, default=None, help="default 512")
    p.add_argument("--input-size", type=positive, default=None, help="default = hidden")
    p.add_argument("--batch", type=positive, default=None, help="minibatch, default 64")
    p.add_argument("--steps", type=positive, default=None, help="timesteps, default 100")
    p.add_argument("--repeats", type=positive, default=20, help="timed runs (median taken)")
    p.add_argument("--warmup", type=nonneg, default=3, help="untimed runs first (default 3)")
    p.add_argument("--input-batch", type=input_batch_flag, default=DEFAULT_INPUT_BATCH,
                   help=f"steps per W.x GEMM on the input-batching rung: k or 'all' "
                        f"(default {DEFAULT_INPUT_BATCH})")
    p.add_argument("--executor", choices=["eager", "graph", "both"], default=None,
                   help="GPU executors to time (default both; not with --cpu)")
    p.add_argument("--rungs", type=list_of(str, "rung names"), default=None,
                   help="rows to run: rungs of the ladder and/or 'auto' (the schedule "
                        "selector's choice, what GpuRunner runs by default); default all")
    p.add_argument("--out", type=path_flag, default=None, help="JSON record path (default: "
                   "<out>/results/ladder/ladder-...json; <out> = ./rnnrt-out or $RNNRT_OUT)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--no-cudnn", action="store_true", help="skip the cuDNN row")
    p.add_argument("--backward", action="store_true",
                   help="time forward+backward (a training step's RNN work; FLOPs = 3x the "
                        "forward's); cuDNN through torch autograd")
    p.add_argument("--cpu", action="store_true",
                   help=f"no GPU: run the ladder on the NumPy executor at a small size "
                        f"({CPU_SIZE}); figures are labelled CPU figures")
    p.add_argument("--processes", type=positive, default=1,
                   help="run the whole ladder in this many fresh processes, one after "
                        "another, and pool them: medians over the processes, each ratio "
                        "taken within its process (default 1; cuDNN's time moves between "
                        "processes by itself)")
    p.add_argument("--interleave", action="store_true",
                   help="time each row and cuDNN one run each, in turn (as the wide sweep)")
    p.add_argument("--seed", type=nonneg, default=0, help="of the weights and inputs")
    add_dtype(p, "every rung and auto")
    return p


def ladder_config(a):
    """The LadderConfig of parsed `rnnrt ladder` arguments ``a`` (UsageError where they do
    not make one)."""
    from .bench.ladder import CPU_SIZE, LadderConfig
    if a.cpu and a.executor is not None:
        raise UsageError(f"--executor {a.executor}: with --cpu the NumPy executor runs; drop "
                         f"--executor or --cpu")
    size = sizes_of(a, CPU_SIZE if a.cpu else dict(layers=4, hidden=512, batch=64, steps=100),
                 SIZE_FLAGS + ("input_size",))
    executor = a.executor or "both"
    executors = ("eager", "graph") if executor == "both" else (executor,)
    try:
        return LadderConfig(cell=a.cell, repeats=a.repeats, warmup=a.warmup,
                            input_batch=a.input_batch, executors=executors, cpu=a.cpu,
                            cudnn=not a.no_cudnn, backward=a.backward, rungs=a.rungs,
                            dtype=a.dtype, interleave=a.interleave, seed=a.seed, **size)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


def _cmd_ladder(a) -> int:
    from .bench.ladder import check_sizes, run_ladder
    from .bench.ladder_report import default_path, markdown_table, write_record
    cfg = ladder_config(a)
    require_gpu("ladder", a.cpu)
    check_sizes(cfg)
    out = record_out(a, "ladder")
    if a.processes > 1:   # this process touches no GPU: each child is a whole ladder run
        from .bench.processes import pool, run_processes, spread_lines
        record = pool(run_processes(a.argv, a.processes),
                      " ".join(["rnnrt"] + a.argv))
    else:
        record = run_ladder(cfg)
    path = write_out(write_record, default_path, record, out, a.overwrite)
    print(markdown_table(record))
    if a.processes > 1:
        print("\n" + "\n".join(spread_lines(record)))
    print(f"\nrecord: {path}")
    refused = [r for r in record["rows"] if "refused" in r]
    return 1 if refused else 0


# -------------------------------------------------------------------------------- precision

def _precision_parser(sub):
    from .bench import precision_error as pe
    from .precision import DTYPES
    p = sub.add_parser("precision", help="rnnrt's and cuDNN's relative errors against the "
                       "float64 reference at every precision, outputs and gradients, and the "
                       "goal (rnnrt <= 2x cuDNN; long 16-bit runs finite)")
    p.add_argument("--cell", type=cell_flag, default="lstm")
    p.add_argument("--layers", type=positive, default=None, help="default 4")
    p.add_argument("--hidden", type=positive, default=None, help="default 512")
    p.add_argument("--input-size", type=positive, default=None, help="default = hidden")
    p.add_argument("--batch", type=positive, default=None, help="minibatch, default 64")
    p.add_argument("--steps", type=list_of(positive, "positive ints"), default=None,
                   help="sequence lengths compared (default 100,1000)")
    p.add_argument("--long-steps", type=nonneg, default=None,
                   help="steps of the forward run per 16-bit dtype that must stay finite "
                        "(default 10000; 0: none)")
    p.add_argument("--dtypes", type=list_of(dtype_flag, "dtypes"), default=DTYPES,
                   help=f"default {','.join(DTYPES)}")
    p.add_argument("--no-cudnn", action="store_true", help="rnnrt's rows only (no goal)")
    p.add_argument("--out", type=path_flag, default=None, help="JSON record path (default "
                   "<out>/results/precision/precision-...json; <out> = ./rnnrt-out or "
                   "$RNNRT_OUT)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--cpu", action="store_true",
                   help=f"no GPU: the NumPy executor in float64 with the storage rounding, and "
                        f"torch.nn on the CPU as the cuDNN role, at a small size ({pe.CPU_SIZE})")
    return p


def _cmd_precision(a) -> int:
    from .bench import precision_error as pe
    size = sizes_of(a, pe.CPU_SIZE if a.cpu else {}, SIZE_FLAGS + ("input_size", "long_steps"))
    if size.get("long_steps") == 0:
        size["long_steps"] = None
    try:
        cfg = pe.PrecisionConfig(cell=a.cell, dtypes=a.dtypes, cpu=a.cpu,
                                 cudnn=not a.no_cudnn, **size)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    require_gpu("precision", a.cpu)
    for steps in cfg.steps:
        pe.check_host(cfg, steps)
    out = record_out(a, "precision")
    record = pe.run_precision(cfg)
    path = write_out(pe.write_record, pe.default_path, record, out, a.overwrite)
    print(pe.summary_table(record))
    print(f"\nrecord: {path}")
    return 0 if record["goal"]["ok"] or a.no_cudnn else 1


# -------------------------------------------------------------------------------- plot

def _plot_parser(sub):
    p = sub.add_parser("plot", help="figures (PNG + SVG) from sweep results and ladder "
                       "records: TFLOPS vs hidden, 4- over 1-layer throughput, best rung vs "
                       "cuDNN")
    add_results(p)
    p.add_argument("--out-dir", type=path_flag, default=None,
                   help="where the figures go, and nowhere else (default <out>/figures; "
                        "<out> = ./rnnrt-out or $RNNRT_OUT)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace figures of the same name in --out-dir")
    p.add_argument("--cell", type=cell_flag, default="lstm", help="default lstm")
    p.add_argument("--layers", type=positive, default=4,
                   help="layer count of figure 1 and the upper one of figure 2 (default 4)")
    p.add_argument("--steps", type=positive, default=None,
                   help="only points with this many steps (default: the sweep's defaults)")
    p.add_argument("--input-batch", type=input_batch_flag, default=None,
                   help="only points with this input-batching k")
    p.add_argument("--pass", dest="pass_", choices=["fwd", "fwd+bwd"], default="fwd",
                   help="which pass's timings: forward (default) or forward+backward")
    p.add_argument("--formats", type=list_of(str, "formats"), default=("png", "svg"),
                   help="default png,svg")
    return p


def _cmd_plot(a) -> int:
    from .bench.outputs import StagedDir, check_dir
    from .bench.plots import plot_all
    from .bench.records import figures_root
    bad = [f for f in a.formats if f not in ("png", "svg", "pdf")]
    if bad:
        raise UsageError(f"--formats: {bad} not out of png, svg, pdf")
    check_results(a.results)
    out_dir = check_dir(a.out_dir if a.out_dir is not None else figures_root(), "--out-dir")
    staged = StagedDir(out_dir, a.overwrite)
    with staged as tmp:   # drawn aside, then moved in together: all or nothing
        written = plot_all(a.results, tmp, cell=a.cell, layers=a.layers, executor=a.executor,
                           formats=a.formats, steps=a.steps, input_batch=a.input_batch,
                           pass_=a.pass_,
                           note=lambda m: print(f"[plot] {m}", file=sys.stderr))
        paths = staged.commit(written)
    for p in paths:
        print(p)
    if not paths:
        print("rnnrt plot: nothing to draw (see the notes above)", file=sys.stderr)
        return 1
    return 0


# -------------------------------------------------------------------------------- summary

def _summary_parser(sub):
    p = sub.add_parser("summary", help="the verdict of sweep results against cuDNN, per device "
                       "and precision: geometric means, points below 1.0, training step vs "
                       "forward ratio")
    add_results(p)
    p.add_argument("--dtype", type=dtype_flag, default=None,
                   help="only this precision (default every one in the inputs, each apart)")
    p.add_argument("--device", default=None,
                   help="only devices whose name contains this (case-insensitive)")
    p.add_argument("--limit", type=nonneg, default=None,
                   help="list at most this many points a list (default all)")
    p.add_argument("--json", type=path_flag, default=None, metavar="PATH",
                   help="also write the summary there (checked before any reading)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    return p


def _cmd_summary(a) -> int:
    import json

    from .bench.outputs import check_file
    from .bench.plots import load_rows
    from .bench.recordio import write_text_atomic
    from .bench.summary import summarize
    check_results(a.results)
    out = check_file(a.json, "--json", overwrite=a.overwrite) if a.json else None
    rows = load_rows(a.results, note=lambda m: print(f"[summary] {m}", file=sys.stderr))
    groups = [g for g in summarize(rows, a.executor)
              if (a.dtype is None or g.dtype == a.dtype)
              and (a.device is None or a.device.lower() in g.device.lower())]
    if not groups:
        print("rnnrt summary: no 'auto' rows in the inputs match (the wide sweep's rung; see "
              "`rnnrt sweep --preset wide`)", file=sys.stderr)
        return 1
    for i, g in enumerate(groups):
        print(("\n" if i else "") + "\n".join(g.text(a.limit)))
    if out is not None:
        text = json.dumps({"schema": "rnnrt.summary/1", "inputs": [str(p) for p in a.results],
                           "groups": [g.as_dict() for g in groups]}, indent=1)
        write_text_atomic(out, text + "\n", overwrite=a.overwrite)
        print(f"summary: {out}")
    return 0


# -------------------------------------------------------------------------------- trace

def _trace_parser(sub):
    from .bench.trace import CPU_DEFAULT, GPU_DEFAULT
    from .plan.switches import DEFAULT_INPUT_BATCH
    p = sub.add_parser("trace", help="per-op timeline of one forward pass (or with --backward "
                       "a training step), one row per stream, for the naive and the last rung "
                       "or the rungs and selector schedules named (PNG + SVG + JSON)")
    p.add_argument("--cell", type=cell_flag, default="lstm")
    p.add_argument("--layers", type=positive, default=None,
                   help=f"default {GPU_DEFAULT['layers']}")
    p.add_argument("--hidden", type=positive, default=None,
                   help=f"default {GPU_DEFAULT['hidden']}")
    p.add_argument("--input-size", type=positive, default=None, help="default = hidden")
    p.add_argument("--batch", type=positive, default=None,
                   help=f"minibatch, default {GPU_DEFAULT['batch']}")
    p.add_argument("--steps", type=positive, default=None,
                   help=f"timesteps, default {GPU_DEFAULT['steps']} (short: readable ops)")
    p.add_argument("--input-batch", type=input_batch_flag, default=DEFAULT_INPUT_BATCH,
                   help=f"k of the input-batching rung (default {DEFAULT_INPUT_BATCH})")
    p.add_argument("--rungs", type=list_of(str, "rung names"), default=None,
                   help="comma-separated ladder rungs to trace (default: naive and the "
                        "last rung), e.g. +fused,+pretranspose")
    p.add_argument("--schedules", type=list_of(str, "schedule names"), default=None,
                   help="comma-separated schedules of the selector to trace (after --rungs), "
                        "as the ladder's auto row names its candidates, e.g. stack+pbwd,ib10: "
                        "those that fit the shape on this device")
    p.add_argument("--backward", action="store_true",
                   help="trace a training step: the forward, then the backward on one "
                        "timeline (the backward's streams below the forward's)")
    p.add_argument("--no-hold", action="store_true",
                   help="GPU: do not hold the GPU while the host queues the traced pass "
                        "(the timeline then shows Python's issue rate); not with --cpu")
    p.add_argument("--out", type=path_flag, default=None, help="trace JSON path (default "
                   "<out>/results/trace/trace-...json; <out> = ./rnnrt-out or $RNNRT_OUT)")
    p.add_argument("--out-dir", "--fig-dir", dest="out_dir", type=path_flag, default=None,
                   help="where the PNG and SVG go, and nowhere else (default <out>/figures)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out and a figure of the same shape and device")
    p.add_argument("--cpu", action="store_true",
                   help=f"no GPU: the NumPy executor in program order at a small size "
                        f"({CPU_DEFAULT}); CPU timings")
    return p


def _cmd_trace(a) -> int:
    from .bench import trace as tr
    from .bench.outputs import check_dir, clashes
    from .bench.records import figures_root
    if a.cpu and a.no_hold:
        raise UsageError("--no-hold: holds the GPU; with --cpu nothing is held (drop it)")
    try:
        rungs = None if a.rungs is None else tr.traced_rungs(a.input_batch, list(a.rungs))
        size = sizes_of(a, tr.CPU_DEFAULT if a.cpu else tr.GPU_DEFAULT)
        cfg = tr.TraceConfig(cell=a.cell, input_size=a.input_size, input_batch=a.input_batch,
                             cpu=a.cpu, hold=not a.no_hold, backward=a.backward, **size)
        if a.cpu and a.schedules:   # on the GPU, run_trace checks them on its device
            tr.traced_schedules(cfg, list(a.schedules))
    except (ValueError, TypeError) as e:
        raise UsageError(f"--{e}" if str(e).startswith(("rungs", "schedules")) else str(e)) \
            from None
    require_gpu("trace", a.cpu)
    if rungs is None and not a.schedules:
        rungs = tr.traced_rungs(a.input_batch)
    tr.check_sizes(cfg, rungs or ())
    out = record_out(a, "trace")
    fig_dir = check_dir(a.out_dir if a.out_dir is not None else figures_root(), "--out-dir")
    fig = fig_dir / (tr.figure_stem(cfg, tr.device_name(a.cpu)) + ".png")
    figs = [fig, fig.with_suffix(".svg")]
    clashes(figs, a.overwrite, "--out-dir")
    record = tr.run_trace(cfg, rungs=rungs, schedules=tuple(a.schedules or ()))
    path = write_out(tr.write_record, tr.default_path, record, out, a.overwrite)
    figs = tr.draw_trace(record, fig)
    for e in record["rungs"]:
        print(f"{e['rung']:14s} {len(e['ops']):5d} ops on {len(e['streams'])} stream(s) "
              f"{e['total_ms']:9.3f} ms  check: {'ok' if e['check']['ok'] else 'MISMATCH'}"
              f"{'  (host-bound)' if e.get('host_bound') and not a.cpu else ''}")
    print(f"trace: {path}")
    for f in figs:
        print(f"figure: {f}")
    return 0 if all(e["check"]["ok"] for e in record["rungs"]) else 1


# -------------------------------------------------------------------------------- demo

def _cmd_demo(a) -> int:
    """A small forward + backward through the NumPy reference: output and gradient norms."""
    import rnnrt
    m = rnnrt.LSTM(a.input_size, a.hidden, num_layers=a.layers, seed=0)
    from .sizes import check_reference
    for pass_ in ("train", "backward"):   # before x is made: a batch too large fails now
        check_reference("lstm", a.input_size, a.hidden, a.layers, a.batch, a.steps, 4, pass_)
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


# -------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    parser = Parser(prog="rnnrt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"rnnrt {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="a small CPU forward/backward; prints output and "
                       "gradient norms")
    d.add_argument("--layers", type=positive, default=2)
    d.add_argument("--hidden", type=positive, default=16)
    d.add_argument("--input-size", type=positive, default=8)
    d.add_argument("--batch", type=positive, default=4)
    d.add_argument("--steps", type=positive, default=10)
    # each command's parser, so that a flag it does not know is reported by it
    parser.commands = {"ladder": _ladder_parser(sub), "demo": d, "sweep": sweep_parser(sub),
                       "plot": _plot_parser(sub), "trace": _trace_parser(sub),
                       "precision": _precision_parser(sub), "summary": _summary_parser(sub)}
    return parser


def parse(argv=None) -> argparse.Namespace:
    """The parsed arguments; usage errors exit 2 with one line naming the command."""
    parser = build_parser()
    a, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[a.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    return a


COMMANDS = {"ladder": _cmd_ladder, "demo": _cmd_demo, "sweep": cmd_sweep, "plot": _cmd_plot,
            "trace": _cmd_trace, "precision": _cmd_precision, "summary": _cmd_summary}


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if isinstance(e, (UsageError, OSError, ValueError, TypeError)) \
        else f"{type(e).__name__}: {text}"


def main(argv=None) -> int:
    """Run one command; -> the exit status (see the module docstring)."""
    from .bench.outputs import OutputError
    from .device import GpuUnavailable
    from .sizes import SizeError
    a = parse(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)   # (ladder --processes: its children)
    try:
        return COMMANDS[a.cmd](a)
    except KeyboardInterrupt:
        print(f"rnnrt {a.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:   # noqa: BLE001 - every failure becomes one line (or a traceback)
        if os.environ.get("RNNRT_DEBUG", "") not in ("", "0"):
            raise
        usage = isinstance(e, (UsageError, OutputError, SizeError, GpuUnavailable))
        hint = "" if usage else " (RNNRT_DEBUG=1 shows the traceback)"
        print(f"rnnrt {a.cmd}: error: {_one_line(e)}{hint}", file=sys.stderr)
        return 2 if usage else 1


if __name__ == "__main__":
    raise SystemExit(main())
