"""`rnnrt trace`: when each op of one pass ran, on which stream — for the naive rung and the
last rung of the ladder by default, or the rungs and selector schedules named — drawn as
timelines (one row per stream, ops coloured by kind) that show the wavefront's diagonal across
layers against naive's one long stream. With ``backward`` a training step: the forward, then
the backward on the same workspace, one timeline (the backward's streams below the
forward's, its times after the forward's end): where a training step's time goes (the
recurrent chain, the dx and weight-gradient GEMMs).

Record (JSON, schema 'rnnrt.trace/1'):
  created, command, pass ('fwd' or 'fwd+bwd'), device {...}, versions {...}, config {cell,
  layers, hidden, input_size, batch, steps, input_batch, cpu, hold, seed, backward},
  rungs: one entry per traced rung or schedule, in the order traced:
    rung (its name), switches, family / backward / clusters (a schedule's; None for a rung),
    streams [names: the forward plan's, then 'bwd <name>' for the backward plan's],
    stream_priority, counts {op kind: n} (both plans), fit / backward_fit (a persistent
    kernel's fit, where one runs),
    check {ok, against, max_abs_err, ...}   (the first entry: float64 reference; the others:
                                             the first entry; y, and dx and the weight
                                             gradients with backward)
    total_ms, host_issue_ms, hold_ms, host_bound, clock   (see exec/trace_exec.py; summed
                                                          over the passes)
    passes [{pass, t0_ms, ms}]   where each pass begins on the timeline and how long it took
    op_fields ["index", "stream", "kind", "layer", "step0", "step1", "t_start_ms", "t_end_ms"]
    ops [[...], ...]   one list per Gemm / Kernel op, forward plan order then backward's;
                       stream: an index into the entry's streams; index: the op's position
                       in its own plan

Figure: ``draw_trace(record, path)`` writes PNG and SVG (same stem).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..cells import get_cell
from ..check import compare_all
from ..kernels.limits import H100_SXM, DeviceLimits
from ..params import positive_int
from ..plan.forward import forward_plan
from ..plan.model import PlanKey
from ..plan.switches import DEFAULT_INPUT_BATCH, PAPER_RUNGS, ladder
from .dtypes import tolerance
from .recordio import valid_input_batch
from .records import device_slug, now_iso, record_path, versions, write_json

OP_FIELDS = ("index", "stream", "kind", "layer", "step0", "step1", "t_start_ms", "t_end_ms")
# What the figure colours, in legend order: (label, colour, the op kinds it covers)
KIND_STYLE = (
    ("W·x GEMM", "#1f77b4", ("wx",)),
    ("R·h GEMM", "#d62728", ("rh",)),
    ("pointwise", "#2ca02c", ("pointwise",)),
    ("persistent kernel", "#9467bd", ("persistent",)),
    ("dh GEMM (Rᵀ·δ)", "#ff7f0e", ("dh",)),
    ("dx GEMM (Wᵀ·δ)", "#17becf", ("dx",)),
    ("weight gradients (dW, db)", "#8c564b", ("dw", "db")),
    ("other (transpose, reduce, ...)", "#7f7f7f", ()),
)
GPU_DEFAULT = dict(layers=4, hidden=512, batch=64, steps=20)
# small enough for the NumPy executor to finish in well under a second per rung
CPU_DEFAULT = dict(layers=4, hidden=32, batch=8, steps=12)


@dataclass
class TraceConfig:
    cell: str = "lstm"
    layers: int = 4
    hidden: int = 512
    input_size: int | None = None        # None: = hidden
    batch: int = 64
    steps: int = 20                      # short, so single ops stay visible in the figure
    input_batch: int | str = DEFAULT_INPUT_BATCH
    cpu: bool = False
    hold: bool = True                    # GPU: let the host queue the pass before it runs
    seed: int = 0
    backward: bool = False               # a training step: the forward, then the backward

    def __post_init__(self):
        get_cell(self.cell)
        for name in ("layers", "hidden", "batch", "steps"):
            positive_int(f"TraceConfig.{name}", getattr(self, name))
        if self.input_size is not None:
            positive_int("TraceConfig.input_size", self.input_size)
        if not isinstance(self.backward, bool):
            raise TypeError(f"TraceConfig.backward: expected a bool, got {self.backward!r}")
        if not valid_input_batch(self.input_batch):
            raise ValueError(f"TraceConfig.input_batch: expected a positive int or 'all', "
                             f"got {self.input_batch!r}")

    @property
    def inp(self) -> int:
        return self.hidden if self.input_size is None else self.input_size


def check_sizes(cfg: TraceConfig, rungs=None, device: DeviceLimits = H100_SXM) -> None:
    """sizes.SizeError unless the trace fits: the model, inputs and float64 reference on the
    host (its backward too with cfg.backward), each traced rung's or schedule's plans, and with
    --cpu its workspace. Before any allocation."""
    from .. import sizes
    c, T, B, I, H, L = cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden, cfg.layers
    io = T * B * I + 2 * L * B * H + (2 * T * B * (I + H) if cfg.backward else 0)
    host = (sizes.model_bytes(c, I, H, L, True, 4) + 12 * io
            + sizes.reference_bytes(c, I, H, L, B, T, 8, "train" if cfg.backward else "forward"))
    if cfg.backward:
        host += sizes.reference_bytes(c, I, H, L, B, T, 8, "backward")
    work = 0
    for item in traced_rungs(cfg.input_batch) if rungs is None else rungs:
        key = plan_key(cfg, item, device)
        sizes.check_plan(key)
        if cfg.backward:
            sizes.check_plan(key, backward=True)
        work = max(work, sizes.workspace_elements(key) * 4)
    sizes.refuse_if(host + (work if cfg.cpu else 0), sizes.host_available(),
                    f"the trace of {sizes.describe_shape(c, I, H, L, B, T)}", "host memory")


def device_name(cpu: bool) -> str:
    """The device a trace runs on, as its record names it."""
    if cpu:
        import platform
        return f"CPU ({platform.processor() or platform.machine()}), NumPy executor"
    from ..device import gpu_status
    return gpu_status()[1]


def _progress(msg):
    print(f"[trace] {msg}", file=sys.stderr, flush=True)


def _model_inputs(cfg: TraceConfig):
    """fp32 model (rnnrt's torch-like init) and x [T,B,I], h0 [L,B,H], c0 [L,B,H] (LSTM; else
    None), dy [T,B,H] (cfg.backward; else None: the forward's draws come first either way)."""
    from .ladder import model_for   # the ladder's model of the same cell, sizes and seed
    model = model_for(cfg, np.float32)
    rng = np.random.default_rng(cfg.seed + 1)
    x = rng.standard_normal((cfg.steps, cfg.batch, cfg.inp)).astype(np.float32)
    h0 = (0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(np.float32)
    c0 = ((0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(np.float32)
          if get_cell(cfg.cell).has_cell_state else None)
    dy = (rng.standard_normal((cfg.steps, cfg.batch, cfg.hidden)).astype(np.float32)
          if cfg.backward else None)
    return model, (x, h0, c0, dy)


def _reference(cfg, model, inputs) -> dict:
    """What every traced entry is checked on, from the float64 reference
    (ladder.reference_outputs): y [T, B, H], and with cfg.backward dx [T, B, I] and the weight
    gradients flat [layout.size]."""
    from .ladder import reference_outputs
    ref = reference_outputs(cfg.cell, model, inputs, backward=cfg.backward)
    return {k: ref[k] for k in ("y", "dx", "grads") if k in ref}


def traced_rungs(input_batch=DEFAULT_INPUT_BATCH, names=None):
    """The rungs a trace draws: by default the first (naive) and the last of the paper's
    (the wavefront: the diagonal the trace is there to show; the persistent rung is one op
    per layer); ``names`` (ladder rung names, e.g. ['+fused', '+pretranspose']) picks
    others, in the ladder's order."""
    rungs = ladder(input_batch)
    if names is None:
        return (rungs[0], rungs[PAPER_RUNGS - 1])
    known = [r.name for r in rungs]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"rungs: {bad or names!r} not rungs of the ladder; expected some of "
                         f"{known}")
    return tuple(r for r in rungs if r.name in names)


def traced_schedules(cfg: TraceConfig, names, device: DeviceLimits = H100_SXM):
    """The schedule selector's candidates named ``names`` (as `rnnrt ladder`'s auto row and
    ``selection.candidates`` name them: 'stack+pbwd', 'cluster/13', 'ib10', ...) for the
    trace's shape (a training shape with cfg.backward) on ``device``, in the order named:
    kernels.schedules.Schedule objects. ValueError naming the candidates where one is not
    among them (a family that does not fit this shape is not a candidate)."""
    from ..kernels.choice import candidates
    from ..kernels.selector import Shape
    shape = Shape(cfg.cell, cfg.layers, cfg.inp, cfg.hidden, cfg.batch, cfg.steps,
                  train=cfg.backward)
    by_name = {s.name: s for s in candidates(shape, device)}
    bad = [n for n in names if n not in by_name]
    if bad or not names:
        raise ValueError(f"schedules: {bad or list(names)!r} not candidates of the selector "
                         f"for {shape.key()} on {device.name}; expected some of "
                         f"{list(by_name)}")
    return tuple(by_name[n] for n in names)


def plan_key(cfg: TraceConfig, item, device: DeviceLimits) -> PlanKey:
    """The PlanKey of a traced ``item``: a ladder Rung (its switches) or a selector Schedule
    (its switches, family, cluster count and, for a training step, backward)."""
    return PlanKey(cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden, cfg.layers, True,
                   item.switches, train=cfg.backward, device=device,
                   family=getattr(item, "family", None),
                   backward=getattr(item, "backward", None) if cfg.backward else None,
                   clusters=getattr(item, "clusters", None))


def _plans(cfg, item, device) -> list:
    """[forward plan] or, with cfg.backward, [forward plan, backward plan] of one key."""
    key = plan_key(cfg, item, device)
    if not cfg.backward:
        return [forward_plan(key)]
    from ..plan.backward import backward_plan
    return [forward_plan(key), backward_plan(key)]


def _load(ws, inputs):
    """The trace's inputs into ``ws``: x, h0, c0 and, for a backward plan's workspace, dy
    (the final states' gradients zero)."""
    x, h0, c0, dy = inputs
    ws.load_inputs(x, h0, c0)
    if dy is not None:
        ws.load_output_grads(dy)


def run_trace(cfg: TraceConfig, progress=_progress, rungs=None, schedules=()) -> dict:
    """Trace one pass (with cfg.backward a training step) of each of ``rungs`` (ladder Rungs,
    ``traced_rungs``) and then of the selector's candidates named ``schedules``
    (``traced_schedules``, on the device the trace runs on); with neither, naive and the
    last rung. The record."""
    get_cell(cfg.cell)
    if rungs is None:
        rungs = () if schedules else traced_rungs(cfg.input_batch)
    session = None
    if not cfg.cpu:
        from ..session import GpuSession
        session = GpuSession()
    try:
        device = H100_SXM if session is None else session.limits
        items = tuple(rungs) + (traced_schedules(cfg, schedules, device) if schedules else ())
        check_sizes(cfg, items, device)
        model, inputs = _model_inputs(cfg)
        ref = _reference(cfg, model, inputs)
        if session is None:
            info = {"device": device_name(True),
                    "note": "CPU trace: the NumPy executor in program order; not GPU timing"}
            vers = versions()
            entries = _trace_cpu(cfg, items, model, inputs, ref, progress)
        else:
            info, vers = session.info, versions(session.cp)
            entries = _trace_gpu(cfg, items, model, inputs, ref, progress, session)
    finally:
        if session is not None:
            session.close()
    cfgd = asdict(cfg)
    cfgd["input_size"] = cfg.inp
    return {"schema": "rnnrt.trace/1", "kind": "trace", "created": now_iso(),
            "command": " ".join(["rnnrt"] + sys.argv[1:]) if sys.argv else "",
            "pass": "fwd+bwd" if cfg.backward else "fwd", "device": info, "versions": vers,
            "config": cfgd, "rungs": entries}


def _entry(item, plans, traced, check) -> dict:
    """One traced item's record entry from its plans and ``traced``: [(ops, info)] a pass.
    The backward's streams follow the forward's (named 'bwd <name>'), its ops' stream indices
    shifted past them and its times past the forward's end."""
    streams, priority, counts, ops, passes = [], [], {}, [], []
    t0 = 0.0
    totals = {"total_ms": 0.0, "host_issue_ms": 0.0, "hold_ms": 0.0, "host_bound": False}
    for plan, (pass_ops, info), name in zip(plans, traced, ("fwd", "bwd")):
        first = len(streams)
        streams += [s if name == "fwd" else f"bwd {s}" for s in plan.streams]
        priority += list(plan.stream_priority)
        for k, v in plan.counts().items():
            counts[k] = counts.get(k, 0) + v
        ops += [[o.index, first + o.stream, o.kind, o.layer, o.steps[0], o.steps[1],
                 t0 + o.t_start_ms, t0 + o.t_end_ms] for o in pass_ops]
        passes.append({"pass": name, "t0_ms": t0, "ms": info["total_ms"]})
        for k in ("total_ms", "host_issue_ms", "hold_ms"):
            totals[k] += float(info.get(k, 0.0))
        totals["host_bound"] = totals["host_bound"] or bool(info.get("host_bound"))
        totals["clock"] = info.get("clock", "")
        t0 += info["total_ms"]
    fits = {"fit": plans[0].fit}
    if len(plans) > 1:
        fits["backward_fit"] = plans[1].fit
    return {"rung": item.name, "switches": item.switches.as_dict(),
            "family": getattr(item, "family", None), "backward": getattr(item, "backward", None),
            "clusters": getattr(item, "clusters", None),
            "streams": streams, "stream_priority": priority, "counts": counts,
            **{k: v for k, v in fits.items() if v}, "check": check.as_dict(), **totals,
            "passes": passes, "op_fields": list(OP_FIELDS), "ops": ops}


def _outputs(ws, backward: bool) -> dict:
    out = {"y": ws.read("y")}
    if backward:
        out.update(dx=ws.read("dx"), grads=ws.read("grads"))
    return out


def _check(cfg, got, ref, first):
    """The first entry against the float64 reference, the others against the first's
    outputs ``first`` = (its name, its outputs): y, and dx and the weight gradients."""
    host = {k: (v.get() if hasattr(v, "get") else np.asarray(v)) for k, v in got.items()}
    against, want = (("float64 reference", ref) if first is None
                     else (f"the first traced ({first[0]})", first[1]))
    return compare_all(host, want, against, rows=cfg.steps * cfg.batch,
                       **tolerance("float32")), host


def _report(progress, name, n_ops, n_streams, ms, check, extra=""):
    progress(f"{name:14s} {n_ops:5d} ops on {n_streams} stream(s), {ms:.3f} ms{extra}; check "
             f"{check.name}: {'ok' if check.ok else 'MISMATCH'}")


def _trace_cpu(cfg, rungs, model, inputs, ref, progress):
    from ..exec.numpy_exec import run as run_numpy
    from ..exec.trace_exec import trace_numpy
    from ..exec.workspace import Workspace
    out, first = [], None
    for item in rungs:
        plans = _plans(cfg, item, H100_SXM)
        ws = Workspace(plans[-1], np, np.float32, model.flat)
        load = functools.partial(_load, ws, inputs)
        load()
        traced = [trace_numpy(plans[0], ws, reload=load)]
        if cfg.backward:
            def again():   # the backward's warm-up consumed the forward's state: run it again
                load()
                run_numpy(plans[0], ws)
            traced.append(trace_numpy(plans[1], ws, reload=again))
        c, got = _check(cfg, _outputs(ws, cfg.backward), ref, first)
        first = first or (item.name, got)
        out.append(e := _entry(item, plans, traced, c))
        _report(progress, item.name, len(e["ops"]), len(e["streams"]), e["total_ms"], c,
                " (CPU)")
    return out


def _trace_gpu(cfg, rungs, model, inputs, ref, progress, session):
    from ..exec.trace_exec import TracingExecutor
    from ..exec.workspace import Workspace
    cp, ctx = session.cp, session.ctx
    sync = cp.cuda.runtime.deviceSynchronize
    out, first = [], None
    params = cp.asarray(model.flat)
    for item in rungs:
        plans = _plans(cfg, item, session.limits)
        ws = Workspace(plans[-1], cp, np.float32, params)
        ws.poison()
        load = functools.partial(_load, ws, inputs)
        load()
        # inputs are copied on the legacy default stream; the plan's streams are
        # non-blocking, so make sure the copies have landed before tracing
        sync()
        hold = "auto" if cfg.hold else 0
        tracers = [TracingExecutor(plan, ws, ctx, hold_ms=hold) for plan in plans]
        traced = [(tracers[0].trace(reload=load), tracers[0].info)]
        if cfg.backward:
            def again(fwd=tracers[0]):   # the backward's warm-up consumed the forward's
                load()                     # state: run it again
                sync()
                fwd.run()
            traced.append((tracers[1].trace(reload=again), tracers[1].info))
        sync()
        c, got = _check(cfg, _outputs(ws, cfg.backward), ref, first)
        first = first or (item.name, got)
        out.append(e := _entry(item, plans, traced, c))
        _report(progress, item.name, len(e["ops"]), len(e["streams"]), e["total_ms"], c,
                f" (host issue {e['host_issue_ms']:.1f} ms, hold {e['hold_ms']:.1f} ms"
                f"{', HOST-BOUND' if e['host_bound'] else ''})")
        del tracers, ws
        cp.get_default_memory_pool().free_all_blocks()
    return out


# --------------------------------------------------------------------------------------------
# Files and the figure

def shape_stem(cell: str, layers: int, hidden: int, batch: int, steps: int,
               backward: bool = False) -> str:
    """'trace-<cell>-L<layers>-H<hidden>-B<batch>-T<steps>' (+ '-fwdbwd' for a training
    step): the start of a trace's file names (its figure's and its record's)."""
    return (f"trace-{cell}-L{layers}-H{hidden}-B{batch}-T{steps}"
            + ("-fwdbwd" if backward else ""))


def figure_stem(cfg: TraceConfig, device: str) -> str:
    """The figure's name (no stamp: a newer trace of a shape and device replaces it, with
    --overwrite); known before the run, so the command can check it first."""
    return (f"{shape_stem(cfg.cell, cfg.layers, cfg.hidden, cfg.batch, cfg.steps, cfg.backward)}"
            f"-{device_slug(device)}")


def default_path(record: dict) -> Path:
    """<out>/results/trace/trace-<shape>-<device>-<stamp>.json (bench/records.py's scheme)."""
    c = record["config"]
    stem = shape_stem(c["cell"], c["layers"], c["hidden"], c["batch"], c["steps"],
                      bool(c.get("backward")))
    return record_path("trace", stem, record["device"].get("device", "device"),
                       record["created"])


def write_record(record: dict, path: Path | None = None, overwrite: bool = True) -> Path:
    """Write the record (atomically) to ``path``, by default ``default_path(record)``; the
    path written. ``overwrite=False``: FileExistsError where the file exists."""
    return write_json(record, default_path(record) if path is None else path,
                      overwrite=overwrite)


def kind_label(kind: str) -> str:
    """The legend label an op kind is drawn under (W·x GEMM, R·h GEMM, pointwise, other)."""
    for label, _, kinds in KIND_STYLE:
        if kind in kinds:
            return label
    return KIND_STYLE[-1][0]


def rows_by_stream(entry: dict) -> dict[int, list[tuple]]:
    """{stream index: [(t_start_ms, t_end_ms, kind label), ...]} for one traced rung; every
    stream of the plan has a row (empty if nothing ran on it)."""
    f = {name: i for i, name in enumerate(entry["op_fields"])}
    rows = {s: [] for s in range(len(entry["streams"]))}
    for op in entry["ops"]:
        rows[op[f["stream"]]].append((op[f["t_start_ms"]], op[f["t_end_ms"]],
                                      kind_label(op[f["kind"]])))
    return rows


def draw_trace(record: dict, path, formats=("png", "svg")) -> list[Path]:
    """Timelines of the record's rungs, stacked (one panel each, one row per stream, ops as
    bars coloured by kind, x in ms since the pass started). Writes ``path`` with each suffix
    in ``formats``; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    entries = record["rungs"]
    heights = [max(1.6, 0.42 * len(e["streams"]) + 0.9) for e in entries]
    fig, axes = plt.subplots(len(entries), 1, figsize=(13, sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False,
                             layout="constrained")
    colour = {label: c for label, c, _ in KIND_STYLE}
    cpu = bool(record["config"].get("cpu"))
    for ax, e in zip(axes[:, 0], entries):
        rows = rows_by_stream(e)
        for s, bars in rows.items():
            by_label = {}
            for t0, t1, label in bars:
                by_label.setdefault(label, []).append((t0, max(t1 - t0, 1e-6)))
            for label, spans in by_label.items():
                ax.broken_barh(spans, (s - 0.4, 0.8), facecolors=colour[label],
                               edgecolor="none")
        ax.set_yticks(range(len(e["streams"])))
        ax.set_yticklabels([f"{i}: {n}" for i, n in enumerate(e["streams"])])
        ax.set_ylim(len(e["streams"]) - 0.5, -0.5)      # stream 0 on top
        ax.set_ylabel("stream")
        ax.set_xlabel("time since the pass started (ms)")
        ax.set_xlim(0, max(e["total_ms"], max((o[-1] for o in e["ops"]), default=0)) * 1.01)
        ax.grid(axis="x", alpha=0.3)
        passes = e.get("passes", [])   # (records before the backward trace have none)
        for ph in passes[1:]:   # where the backward begins
            ax.axvline(ph["t0_ms"], color="black", linestyle="--", linewidth=0.8)
            ax.annotate(f" {ph['pass']} ({ph['ms']:.3g} ms)", (ph["t0_ms"], -0.5),
                        va="top", fontsize=8)
        note = ""
        if not cpu and e.get("host_bound"):
            note = " — host-bound: Python issued ops slower than the GPU ran them"
        split = (" + ".join(f"{ph['pass']} {ph['ms']:.3g}" for ph in passes)
                 if len(passes) > 1 else "")
        ax.set_title(f"{e['rung']}: {len(e['ops'])} GEMMs and kernels on "
                     f"{len(e['streams'])} stream(s), {e['total_ms']:.3g} ms"
                     f"{f' ({split} ms)' if split else ''}{note}",
                     loc="left", fontsize=10)
    c = record["config"]
    dev = record["device"].get("device", "?")
    what = ("CPU figures (NumPy executor, program order; rows show the schedule, not overlap)"
            if cpu else "eager issue, CUDA events around every op")
    what_pass = ("One training step (the forward, then the backward)" if c.get("backward")
                 else "One forward pass")
    fig.suptitle(f"{what_pass}: {c['cell'].upper()}, {c['layers']} layers, hidden "
                 f"{c['hidden']}, minibatch {c['batch']}, {c['steps']} steps, input batching "
                 f"k = {c['input_batch']}, fp32 — {dev}\n{what}", fontsize=11)
    fig.legend(handles=[Patch(color=col, label=label) for label, col, _ in KIND_STYLE],
               loc="outside lower center", ncol=min(len(KIND_STYLE), 5), frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    with matplotlib.rc_context({"svg.fonttype": "none"}):    # SVG text stays text
        for fmt in formats:
            p = path.with_suffix("." + fmt)
            fig.savefig(p, dpi=130)
            written.append(p)
    plt.close(fig)
    return written
