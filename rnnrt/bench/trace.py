"""`rnnrt trace`: when each op of one forward pass ran, on which stream — for the naive rung
and the last rung of the ladder — drawn as two timelines (one row per stream, ops coloured
by kind) that show the wavefront's diagonal across layers against naive's one long stream.

Record (JSON, schema 'rnnrt.trace/1'):
  created, command, device {...}, versions {...}, config {cell, layers, hidden, input_size,
  batch, steps, input_batch, cpu, hold, seed},
  rungs: one entry per traced rung, in ladder order:
    rung, switches, streams [names], stream_priority, counts {op kind: n},
    check {ok, against, max_abs_err, ...}   (naive: float64 reference; others: naive rung)
    total_ms, host_issue_ms, hold_ms, host_bound, clock   (see exec/trace_exec.py)
    op_fields ["index", "stream", "kind", "layer", "step0", "step1", "t_start_ms", "t_end_ms"]
    ops [[...], ...]   one list per Gemm / Kernel op, in plan order

Figure: ``draw_trace(record, path)`` writes PNG and SVG (same stem).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..cells import get_cell
from ..check import FP32_ATOL, FP32_RTOL, compare
from ..kernels.limits import H100_SXM, DeviceLimits
from ..params import positive_int
from ..plan.forward import forward_plan
from ..plan.model import PlanKey
from ..plan.switches import DEFAULT_INPUT_BATCH, PAPER_RUNGS, ladder
from .recordio import valid_input_batch
from .records import device_slug, now_iso, record_path, versions, write_json

OP_FIELDS = ("index", "stream", "kind", "layer", "step0", "step1", "t_start_ms", "t_end_ms")
# What the figure colours, in legend order: (label, colour, the op kinds it covers)
KIND_STYLE = (
    ("W·x GEMM", "#1f77b4", ("wx",)),
    ("R·h GEMM", "#d62728", ("rh",)),
    ("pointwise", "#2ca02c", ("pointwise",)),
    ("other (transpose, ...)", "#7f7f7f", ()),
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

    def __post_init__(self):
        get_cell(self.cell)
        for name in ("layers", "hidden", "batch", "steps"):
            positive_int(f"TraceConfig.{name}", getattr(self, name))
        if self.input_size is not None:
            positive_int("TraceConfig.input_size", self.input_size)
        if not valid_input_batch(self.input_batch):
            raise ValueError(f"TraceConfig.input_batch: expected a positive int or 'all', "
                             f"got {self.input_batch!r}")

    @property
    def inp(self) -> int:
        return self.hidden if self.input_size is None else self.input_size


def check_sizes(cfg: TraceConfig, rungs=None, device: DeviceLimits = H100_SXM) -> None:
    """sizes.SizeError unless the trace fits: the model, inputs and float64 reference on the
    host, each traced rung's plan, and with --cpu its workspace. Before any allocation."""
    from .. import sizes
    c, T, B, I, H, L = cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden, cfg.layers
    io = T * B * I + 2 * L * B * H
    host = (sizes.model_bytes(c, I, H, L, True, 4) + 12 * io
            + sizes.reference_bytes(c, I, H, L, B, T, 8))
    work = 0
    for rung in traced_rungs(cfg.input_batch) if rungs is None else rungs:
        key = PlanKey(c, T, B, I, H, L, True, rung.switches, device=device)
        sizes.check_plan(key)
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
    """fp32 model (rnnrt's torch-like init) and x [T,B,I], h0 [L,B,H], c0 [L,B,H] (LSTM)."""
    from .ladder import model_for   # the ladder's model of the same cell, sizes and seed
    model = model_for(cfg, np.float32)
    rng = np.random.default_rng(cfg.seed + 1)
    x = rng.standard_normal((cfg.steps, cfg.batch, cfg.inp)).astype(np.float32)
    h0 = (0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(np.float32)
    c0 = ((0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(np.float32)
          if get_cell(cfg.cell).has_cell_state else None)
    return model, x, h0, c0


def _reference_y(cfg, model, x, h0, c0):
    """y [T, B, H] of the float64 reference (ladder.reference_outputs, forward only)."""
    from .ladder import reference_outputs
    return reference_outputs(cfg.cell, model, (x, h0, c0, None), backward=False)["y"]


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


def run_trace(cfg: TraceConfig, progress=_progress, rungs=None) -> dict:
    """Trace one forward pass of each rung (default: naive and the last rung); the record."""
    get_cell(cfg.cell)
    rungs = traced_rungs(cfg.input_batch) if rungs is None else tuple(rungs)
    check_sizes(cfg, rungs)
    model, x, h0, c0 = _model_inputs(cfg)
    y_ref = _reference_y(cfg, model, x, h0, c0)
    if cfg.cpu:
        info = {"device": device_name(True),
                "note": "CPU trace: the NumPy executor in program order; not GPU timing"}
        vers = versions()
        entries = _trace_cpu(cfg, rungs, model, x, h0, c0, y_ref, progress)
    else:
        from ..session import GpuSession
        session = GpuSession()
        try:
            info, vers = session.info, versions(session.cp)
            entries = _trace_gpu(cfg, rungs, model, x, h0, c0, y_ref, progress, session)
        finally:
            session.close()
    cfgd = asdict(cfg)
    cfgd["input_size"] = cfg.inp
    return {"schema": "rnnrt.trace/1", "kind": "trace", "created": now_iso(),
            "command": " ".join(["rnnrt"] + sys.argv[1:]) if sys.argv else "",
            "pass": "fwd", "device": info, "versions": vers, "config": cfgd, "rungs": entries}


def _plan(cfg, rung, device):
    return forward_plan(PlanKey(cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden,
                                cfg.layers, True, rung.switches, device=device))


def _entry(rung, plan, ops, info, check):
    return {"rung": rung.name, "switches": rung.switches.as_dict(),
            "streams": list(plan.streams), "stream_priority": list(plan.stream_priority),
            "counts": dict(plan.counts()), "check": check.as_dict(), **info,
            "op_fields": list(OP_FIELDS),
            "ops": [[o.index, o.stream, o.kind, o.layer, o.steps[0], o.steps[1],
                     o.t_start_ms, o.t_end_ms] for o in ops]}


def _check(y, y_ref, naive_y):
    if naive_y is None:
        return compare(y, y_ref, FP32_ATOL, FP32_RTOL, name="float64 reference")
    return compare(y, naive_y, FP32_ATOL, FP32_RTOL, name="naive rung")


def _trace_cpu(cfg, rungs, model, x, h0, c0, y_ref, progress):
    from ..exec.trace_exec import trace_numpy
    from ..exec.workspace import Workspace
    out, naive_y = [], None
    for rung in rungs:
        plan = _plan(cfg, rung, H100_SXM)
        ws = Workspace(plan, np, np.float32, model.flat)
        ws.load_inputs(x, h0, c0)
        ops, info = trace_numpy(plan, ws, reload=functools.partial(ws.load_inputs, x, h0, c0))
        y = ws.outputs()["y"]
        c = _check(y, y_ref, naive_y)
        naive_y = y if naive_y is None else naive_y
        out.append(_entry(rung, plan, ops, info, c))
        progress(f"{rung.name:14s} {len(ops):5d} ops on {len(plan.streams)} stream(s), "
                 f"{info['total_ms']:.2f} ms (CPU); check {c.name}: {'ok' if c.ok else 'MISMATCH'}")
    return out


def _trace_gpu(cfg, rungs, model, x, h0, c0, y_ref, progress, session):
    from ..exec.trace_exec import TracingExecutor
    from ..exec.workspace import Workspace
    cp, ctx = session.cp, session.ctx
    out, naive_y = [], None
    params = cp.asarray(model.flat)
    for rung in rungs:
        plan = _plan(cfg, rung, session.limits)
        ws = Workspace(plan, cp, np.float32, params)
        ws.poison()
        ws.load_inputs(x, h0, c0)
        # inputs are copied on the legacy default stream; the plan's streams are
        # non-blocking, so make sure the copies have landed before tracing
        cp.cuda.runtime.deviceSynchronize()
        ex = TracingExecutor(plan, ws, ctx, hold_ms="auto" if cfg.hold else 0)
        ops = ex.trace(reload=functools.partial(ws.load_inputs, x, h0, c0))
        cp.cuda.runtime.deviceSynchronize()
        y = ws.outputs()["y"]
        c = _check(y, y_ref, naive_y)
        if naive_y is None:
            naive_y = cp.asnumpy(y) if hasattr(y, "get") else y
        out.append(_entry(rung, plan, ops, ex.info, c))
        progress(f"{rung.name:14s} {len(ops):5d} ops on {len(plan.streams)} stream(s), "
                 f"{ex.info['total_ms']:.3f} ms (host issue {ex.info['host_issue_ms']:.1f} "
                 f"ms, hold {ex.info['hold_ms']:.1f} ms"
                 f"{', HOST-BOUND' if ex.info['host_bound'] else ''}); check {c.name}: "
                 f"{'ok' if c.ok else 'MISMATCH'}")
        del ex, ws
        cp.get_default_memory_pool().free_all_blocks()
    return out


# --------------------------------------------------------------------------------------------
# Files and the figure

def shape_stem(cell: str, layers: int, hidden: int, batch: int, steps: int) -> str:
    """'trace-<cell>-L<layers>-H<hidden>-B<batch>-T<steps>': the start of a trace's file
    names (its figure's and its record's)."""
    return f"trace-{cell}-L{layers}-H{hidden}-B{batch}-T{steps}"


def figure_stem(cfg: TraceConfig, device: str) -> str:
    """The figure's name (no stamp: a newer trace of a shape and device replaces it, with
    --overwrite); known before the run, so the command can check it first."""
    return (f"{shape_stem(cfg.cell, cfg.layers, cfg.hidden, cfg.batch, cfg.steps)}-"
            f"{device_slug(device)}")


def default_path(record: dict) -> Path:
    """<out>/results/trace/trace-<shape>-<device>-<stamp>.json (bench/records.py's scheme)."""
    c = record["config"]
    stem = shape_stem(c["cell"], c["layers"], c["hidden"], c["batch"], c["steps"])
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
        note = ""
        if not cpu and e.get("host_bound"):
            note = " — host-bound: Python issued ops slower than the GPU ran them"
        ax.set_title(f"{e['rung']}: {len(e['ops'])} GEMMs and kernels on "
                     f"{len(e['streams'])} stream(s), {e['total_ms']:.3g} ms{note}",
                     loc="left", fontsize=10)
    c = record["config"]
    dev = record["device"].get("device", "?")
    what = ("CPU figures (NumPy executor, program order; rows show the schedule, not overlap)"
            if cpu else "eager issue, CUDA events around every op")
    fig.suptitle(f"One forward pass: {c['cell'].upper()}, {c['layers']} layers, hidden "
                 f"{c['hidden']}, minibatch {c['batch']}, {c['steps']} steps, input batching "
                 f"k = {c['input_batch']}, fp32 — {dev}\n{what}", fontsize=11)
    fig.legend(handles=[Patch(color=col, label=label) for label, col, _ in KIND_STYLE],
               loc="outside lower center", ncol=len(KIND_STYLE), frameon=False)
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
