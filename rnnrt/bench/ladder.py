"""`rnnrt ladder`: the paper's Table 1 on this machine — every rung of the ladder, verified and
then timed, beside cuDNN and the GPU's fp32 GEMM ceiling measured in the same run.

Protocol per (rung, executor): build the plan, poison the workspace, run once and compare the
output with the naive rung's (the naive rung itself with the float64 NumPy reference); a rung
that disagrees is not timed (its row says why). Then warm-up and the median of ``repeats``
runs timed with CUDA events on the plan's first stream. FLOPs by the paper's convention
(rnnrt.cells.forward_flops). Ratios: speedup_vs_naive = naive ms / rung ms (same executor);
ratio_vs_cudnn = cuDNN ms / rung ms (> 1: faster than cuDNN; cuDNN's ms is the median of
its medians timed before and after the rungs, both kept in the record); share_of_ceiling =
TFLOPS over the GEMM ceiling's TFLOPS at the run's precision (bench/ceilings.py).

Precision (``dtype``, one of precision.DTYPES; default float32, the paper's arithmetic): every
rung and the auto row run at it, cuDNN at the same precision in the same process
(bench/cudnn.py), the check is against the rounding-aware float64 reference of that precision
(tf32: the plain one; TF32's operand rounding is not emulated) with its tolerance
(precision.get_precision), and every row and the record carry ``dtype``. Above
REFERENCE_FLOP_LIMIT, held to cuDNN's same-precision output, a tf32 / 16-bit rung that check
refuses may still pass a second opinion against cuDNN at float32 (bench/second_opinion.py).
A rung that declines the precision (the persistent kernels take fp32 storage only) runs its
fallback schedule and its row says why (``fallback``), as for any decline.

Rungs past the paper's Table 1 (``switches.PAPER_RUNGS``; today '+persistent') are marked so
in the table. A rung whose plan declined its fast path (the persistent kernel on a shape the
device cannot hold) still runs, on its fallback schedule, and its row says so: ``fallback``
(why) and ``fit`` (what the device fit chose or refused). With --backward the persistent rung
runs the persistent kernel forward and the rung below's schedule backward (``backward_note``).
A GPU run's record carries ``compile_s``: the seconds it spent compiling kernels (first uses
in its process; rnnrt.kernels.library.compile_seconds), which a sweep's time budget leaves
out of what a point costs; and ``phase_s``, where its wall time went: {'cudnn_setup' (cuDNN's
module and first run), 'reference' (the float64 NumPy reference on the host, or above
REFERENCE_FLOP_LIMIT cuDNN's output and the second opinion), 'precompile' (the kernel files
the auto row may run), 'rows' (every rung and the auto row: selection, check, timing),
'cudnn_time' (cuDNN's timing after the rungs)} in seconds (a CPU run: 'reference', 'rows').
"""
from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import reference
from ..cells import forward_flops, get_cell, tflops
from ..check import compare_all
from ..kernels.library import compile_seconds
from ..kernels.limits import H100_SXM, DeviceLimits
from ..params import positive_int, to_flat
from ..plan.forward import forward_plan
from ..plan.model import PlanKey
from ..plan.switches import DEFAULT_INPUT_BATCH, Rung, ladder, rung_names
from ..precision import get_precision
from ..session import GpuSession, time_events
from .cudnn import cudnn_bench, cudnn_missing
from .dtypes import reference_name, tolerance
from .recordio import valid_input_batch
from .second_opinion import second_opinion, verdict
from .records import now_iso, versions
from .timing import gemm_ceiling, time_cpu, time_gpu, time_in_turn

# Above this many forward FLOPs the float64 NumPy reference (~0.1 TFLOPS on a CPU) is
# replaced by cuDNN's output as the naive rung's check, when cuDNN is there.
REFERENCE_FLOP_LIMIT = 2e12
AUTO = "auto"
"""The row of the schedule selector's choice (kernels/selector.py), run as switches='auto'."""
CPU_SIZE = dict(layers=4, hidden=32, input_size=32, batch=8, steps=12)


@dataclass
class LadderConfig:
    cell: str = "lstm"
    layers: int = 4
    hidden: int = 512
    input_size: int | None = None        # None: = hidden (the paper's setting)
    batch: int = 64
    steps: int = 100
    repeats: int = 20
    warmup: int = 3
    input_batch: int | str = DEFAULT_INPUT_BATCH
    executors: tuple = ("eager", "graph")
    cpu: bool = False
    cudnn: bool = True
    backward: bool = False          # time forward+backward (training), "pass": "fwd+bwd"
    seed: int = 0
    rungs: tuple | None = None      # names to run: rungs of the ladder and/or 'auto'; None: all
    interleave: bool = False        # time the rows and cuDNN one run each, in turn
    dtype: str = "float32"          # the precision (precision.DTYPES) of every row
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        get_cell(self.cell)
        try:
            get_precision(self.dtype)
        except ValueError as e:
            raise ValueError(f"LadderConfig.{e}") from None
        for name in ("layers", "hidden", "batch", "steps", "repeats"):
            positive_int(f"LadderConfig.{name}", getattr(self, name))
        if self.input_size is not None:
            positive_int("LadderConfig.input_size", self.input_size)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"LadderConfig.warmup: expected an int >= 0, got {self.warmup!r}")
        if not valid_input_batch(self.input_batch):
            raise ValueError(f"LadderConfig.input_batch: expected a positive int or 'all', "
                             f"got {self.input_batch!r}")
        self.executors = tuple(self.executors)
        if not self.executors or any(e not in ("eager", "graph") for e in self.executors):
            raise ValueError(f"LadderConfig.executors: expected some of ('eager', 'graph'), "
                             f"got {self.executors!r}")
        if self.rungs is not None:
            known = set(rung_names()) | {AUTO}
            bad = [r for r in self.rungs if r not in known]
            if bad or not self.rungs:
                raise ValueError(f"LadderConfig.rungs: expected names out of "
                                 f"{[AUTO, *rung_names()]}, got {self.rungs!r}")
            self.rungs = tuple(self.rungs)

    @property
    def inp(self) -> int:
        return self.hidden if self.input_size is None else self.input_size


def check_sizes(cfg: LadderConfig, gpu_free: int | None = None,
                device: DeviceLimits = H100_SXM) -> None:
    """sizes.SizeError unless the ladder of ``cfg`` fits: on the host its model, inputs (and
    their float64 copies), the float64 reference where it runs and, with --cpu, the largest
    rung's workspace; on the GPU (``gpu_free`` bytes, when given) the largest workspace; and
    every rung's plan. Called before anything is allocated."""
    from .. import sizes
    c, T, B, I, H, L = cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden, cfg.layers
    io = T * B * I + 2 * L * B * H + T * B * H             # x, h0, c0, dy
    host = sizes.model_bytes(c, I, H, L, True, 4) + 4 * io
    if reference_runs(cfg):
        host += 8 * io + sizes.reference_bytes(c, I, H, L, B, T, 8,
                                               "train" if cfg.backward else "forward")
        if cfg.backward:
            host += sizes.reference_bytes(c, I, H, L, B, T, 8, "backward")
    work = 0
    for rung in ladder(cfg.input_batch):
        if cfg.rungs is not None and rung.name not in cfg.rungs:
            continue
        key = PlanKey(c, T, B, I, H, L, True, rung.switches, train=cfg.backward,
                      device=device, dtype=cfg.dtype)
        sizes.check_plan(key)
        if cfg.backward:
            sizes.check_plan(key, backward=True)
        work = max(work, sizes.workspace_elements(key) * 4)
    what = f"the ladder of {sizes.describe_shape(c, I, H, L, B, T)}"
    sizes.refuse_if(host + (work if cfg.cpu else 0), sizes.host_available(), what,
                    "host memory")
    if gpu_free is not None and not cfg.cpu:
        sizes.refuse_if(work + 4 * io + sizes.model_bytes(c, I, H, L, True, 4), gpu_free,
                        f"{what} (its largest workspace)", "GPU memory")


def model_for(cfg: LadderConfig, dtype):
    """The rnnrt model of ``cfg`` (cell, sizes, seed: a LadderConfig, or any configuration
    with cell, layers, inp, hidden and seed, as trace's) in ``dtype``."""
    import rnnrt
    kw = dict(num_layers=cfg.layers, dtype=dtype, seed=cfg.seed)
    if cfg.cell == "lstm":
        return rnnrt.LSTM(cfg.inp, cfg.hidden, **kw)
    if cfg.cell == "gru":
        return rnnrt.GRU(cfg.inp, cfg.hidden, **kw)
    return rnnrt.RNN(cfg.inp, cfg.hidden, nonlinearity=cfg.cell.split("_")[1], **kw)


def inputs_for(cfg: LadderConfig, dtype):
    """Random x [T,B,I], h0 [L,B,H], c0 (LSTM) and dy [T,B,H] (the backward's seed)."""
    rng = np.random.default_rng(cfg.seed + 1)
    x = rng.standard_normal((cfg.steps, cfg.batch, cfg.inp)).astype(dtype)
    h0 = (0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(dtype)
    c0 = ((0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(dtype)
          if get_cell(cfg.cell).has_cell_state else None)
    dy = rng.standard_normal((cfg.steps, cfg.batch, cfg.hidden)).astype(dtype)
    return x, h0, c0, dy


def reference_runs(cfg, bench=None) -> bool:
    """Whether the float64 NumPy reference checks the ladder of ``cfg`` (its host memory
    counted by ``check_sizes``, its outputs the rungs' check): on the CPU, up to
    REFERENCE_FLOP_LIMIT FLOPs, or where cuDNN does not run — above the limit cuDNN's
    output is the reference. bench: the run's ``cudnn_bench`` (a CudnnBench, or why there is
    none); None: ``cudnn_missing(cfg)`` says, before anything is built."""
    if cfg.cpu or _flops(cfg) <= REFERENCE_FLOP_LIMIT:
        return True
    why = cudnn_missing(cfg) if bench is None else (bench if isinstance(bench, str) else None)
    return why is not None


def _flops(cfg) -> int:
    f = forward_flops(cfg.cell, cfg.inp, cfg.hidden, cfg.layers, cfg.batch, cfg.steps)
    return 3 * f if cfg.backward else f   # backward = 2x forward (paper's convention)


def _progress(msg):
    print(f"[ladder] {msg}", file=sys.stderr, flush=True)


class BenchSession(GpuSession):
    """A GpuSession plus what one process measures once and every ladder in it shares: the
    fp32 GEMM ceiling. A sweep opens one and runs a ladder per point through it;
    ``close()`` at the end."""

    def __init__(self, progress=_progress):
        super().__init__()
        progress(f"device {self.info['device']}; measuring the fp32 GEMM ceiling")
        self.ceiling = gemm_ceiling(self.cp, self.ctx)
        self.progress = progress
        self._ceilings = {"float32": self.ceiling}
        progress(f"ceiling {self.ceiling['tflops']:.1f} TFLOPS")

    def ceiling_for(self, dtype: str) -> dict:
        """The GEMM ceiling at precision ``dtype`` (bench/ceilings.py), measured on first
        use and kept; float32's is ``ceiling``. Without torch: the datasheet peak, said so."""
        from .ceilings import datasheet_tflops, torch_gemm_ceiling, with_datasheet
        name = get_precision(dtype).name
        if name not in self._ceilings:
            self.progress(f"measuring the {name} GEMM ceiling")
            try:
                import torch
                measured = torch_gemm_ceiling(torch, name)
            except ImportError as e:
                peak = datasheet_tflops(self.info["device"], name)
                measured = {"what": f"not measured ({e}); the datasheet peak",
                            "tflops": peak}
            self._ceilings[name] = with_datasheet(measured, self.info["device"], name)
            self.progress(f"{name} ceiling {self._ceilings[name]['tflops'] or 0:.1f} TFLOPS")
        return self._ceilings[name]


def run_ladder(cfg: LadderConfig, progress=_progress, session: BenchSession | None = None) -> dict:
    """Verify and time every rung; return the record (see module docstring).

    session: a BenchSession to reuse (a sweep passes one); None opens and closes one here.
    """
    get_cell(cfg.cell)
    if cfg.cpu:
        check_sizes(cfg)
        return _run_cpu(cfg, progress)
    own = session is None
    session = BenchSession(progress) if own else session
    try:
        from ..sizes import gpu_available
        check_sizes(cfg, gpu_available(session.cp), session.limits)
        c0 = compile_seconds()
        record = _run_gpu(cfg, progress, session)
        record["compile_s"] = compile_seconds() - c0
        return record
    finally:
        if own:
            session.close()


def reference_outputs(cell: str, model, inputs, dtype: str = "float32",
                      backward: bool = True) -> dict:
    """The float64 NumPy reference of ``model`` (an rnnrt model: its flat fp32 weights) on
    ``inputs`` = (x [T, B, I], h0 [L, B, H], c0 [L, B, H] or None, dy [T, B, H]) at precision
    ``dtype``'s rounding points (float32: none, the plain reference): {'y', 'h_n', 'c_n'}
    (+ {'dx', 'dh0', 'dc0', 'grads' [layout.size] flat} with ``backward``); None values
    (c_n, dc0 of a cell without c) left out."""
    from ..params import per_layer
    x, h0, c0, dy = (None if a is None else np.asarray(a, np.float64) for a in inputs)
    p64 = per_layer(model.flat.astype(np.float64), model.layout)
    y, h_n, c_n, cache = reference.forward(cell, p64, x, h0, c0, dtype=dtype)
    out = {"y": y, "h_n": h_n, "c_n": c_n}
    if backward:
        g = reference.backward(cell, p64, cache, dy, dtype=dtype)
        out.update(dx=g["dx"], dh0=g["dh0"], dc0=g.get("dc0"),
                   grads=to_flat(g["params"], model.layout))
    return {k: v for k, v in out.items() if v is not None}


def _reference(cfg, model, x, h0, c0, dy):
    """The arrays every rung is checked on (RungRun.outputs), from ``reference_outputs`` at
    cfg.dtype: {'y'} (+ {'dx', 'grads'} flat, when cfg.backward)."""
    ref = reference_outputs(cfg.cell, model, (x, h0, c0, dy), cfg.dtype, cfg.backward)
    return {k: ref[k] for k in ("y", "dx", "grads") if k in ref}


def _row(rung, executor, timing, flops, naive_ms, ceiling_tflops, check, plan, dtype):
    """One (rung, executor) row; ``plan`` is the RungRun's plan_summary(). ratio_vs_cudnn
    is filled in after the rungs, once cuDNN's pooled time is known."""
    tf = tflops(flops, timing.ms_median)
    extra = {k: plan[k] for k in ("fallback", "fit", "backward_note", "backward_fit",
                                  "backward_fallback") if plan.get(k)}
    return {
        **extra,
        "rung": rung.name, "executor": executor, "dtype": dtype,
        "switches": rung.switches.as_dict(),
        **timing.as_dict(), "tflops": tf,
        "speedup_vs_naive": (naive_ms / timing.ms_median) if naive_ms else None,
        "ratio_vs_cudnn": None,
        "share_of_ceiling": (tf / ceiling_tflops) if ceiling_tflops else None,
        "check": check,
        "plan": plan,
    }


class RungRun:
    """One rung's plan(s) on one workspace: ``run()`` is the timed pass (the forward, or the
    forward then the backward), ``outputs()`` the arrays every rung is checked on."""

    def __init__(self, cfg, rung, xp, make_executor, params, inputs, device: DeviceLimits,
                 family: str | None = None, backward: str | None = None,
                 ws_dtype=np.float32, clusters: int | None = None, gemm: str = "cublas"):
        from ..exec.workspace import Workspace
        from ..plan.backward import backward_plan
        key = PlanKey(cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden, cfg.layers, True,
                      rung.switches, train=cfg.backward, device=device, family=family,
                      backward=backward if cfg.backward else None, dtype=cfg.dtype,
                      clusters=clusters, gemm=gemm)
        self.plans = [forward_plan(key)] + ([backward_plan(key)] if cfg.backward else [])
        self.ws = Workspace(self.plans[-1], xp, ws_dtype, params)
        self.ws.poison()
        x, h0, c0, dy = inputs
        self.ws.load_inputs(x, h0, c0)
        if cfg.backward:
            self.ws.load_output_grads(dy)
        if hasattr(xp, "cuda"):
            # the workspace was filled on the legacy default stream; the plans run on
            # non-blocking streams, which do not wait for it
            xp.cuda.Device().synchronize()
        self.executors = [make_executor(plan, self.ws) for plan in self.plans]
        self.stream = getattr(self.executors[0], "stream", None)

    def run(self):
        for ex in self.executors:
            ex.run()

    def outputs(self) -> dict:
        out = {"y": self.ws.read("y")}
        if len(self.plans) > 1:
            out["dx"] = self.ws.read("dx")
            out["grads"] = self.ws.read("grads")
        return out

    def plan_summary(self) -> dict:
        counts = {}
        for plan in self.plans:
            for k, v in plan.counts().items():
                counts[k] = counts.get(k, 0) + v
        fwd = self.plans[0]
        out = {"ops": sum(len(p.ops) for p in self.plans), "streams": len(fwd.streams),
               "events": sum(p.num_events for p in self.plans), "counts": counts,
               "fallback": fwd.fallback, "fit": fwd.fit}
        if len(self.plans) > 1 and self.plans[1].key.backward is not None:
            # the persistent backward kernel (the selector's candidate), or why it fell back
            out["backward_fit"] = self.plans[1].fit
            out["backward_fallback"] = self.plans[1].fallback
        elif fwd.key.switches.persistent and len(self.plans) > 1:
            out["backward_note"] = ("backward: the schedule of the other switches (the rung "
                                    "below's, reverse wavefront included; the persistent "
                                    "backward kernel is a schedule of its own)")
        if fwd.key.gemm == "lt":
            # which kernel ran each GEMM (kernels/gemm_algos.py), and which it declined
            tally = {}
            for ex in self.executors:
                for kind, _, label in getattr(getattr(ex, "prepared", None), "gemm_choices", ()):
                    k = f"{kind}: {label}"
                    tally[k] = tally.get(k, 0) + 1
            out["gemm_algos"] = tally
        return out


def _ladder_rows(cfg, executors, make_executor, xp, params, inputs, ref, ref_name, flops,
                 ceiling_tflops, time_fn, sync, progress, device, label="", samples_fn=None,
                 second=None):
    """Verify then time every rung (and the auto row) for every executor; the rows (see the
    module docstring). samples_fn(rr, repeats) -> ms of each run: the auto row's selector
    times its candidates through it. second: a second_opinion.SecondOpinion for the rows
    held to ``ref`` (cuDNN's same-precision output of a large tf32 / 16-bit ladder), or None."""
    rows = []
    rungs = [r for r in ladder(cfg.input_batch) if cfg.rungs is None or r.name in cfg.rungs]
    auto = cfg.rungs is None or AUTO in cfg.rungs
    total = (len(rungs) + auto) * len(executors)
    n = 0
    for executor in executors:
        naive_out, naive_ms = None, None
        entries = [(rung, None, None) for rung in rungs]
        if auto:
            entries.append((None, None, None))   # selected after the rungs (it times its own)
        for rung, family, selection in entries:
            n += 1
            backward = clusters = None
            gemm = "cublas"
            if rung is None:
                selection = _select(cfg, executor, make_executor, xp, params, inputs, device,
                                    samples_fn, progress)
                sched = selection.schedule
                rung, family = Rung(AUTO, sched.switches), sched.family
                backward, clusters, gemm = sched.backward, sched.clusters, sched.gemm
            rr = RungRun(cfg, rung, xp, lambda plan, ws: make_executor(executor, plan, ws),
                         params, inputs, device, family=family, backward=backward,
                         clusters=clusters, gemm=gemm)
            if rr.plans[0].fallback:
                progress(f"{n}/{total} {rung.name} {executor}: {rr.plans[0].fallback}")
            rr.run()
            sync(rr)
            got = rr.outputs()
            tol = tolerance(cfg.dtype)
            if naive_out is None:
                c = compare_all(got, ref, ref_name, rows=cfg.steps * cfg.batch, **tol)
            else:
                c = compare_all(got, naive_out, "naive rung", rows=cfg.steps * cfg.batch,
                                **tol)
            v = verdict(c, got, second if naive_out is None else None)
            extra = ({"schedule": selection.schedule.name, "tune_s": selection.tune_s,
                      "selection": selection.as_dict()} if selection is not None else {})
            if not v.ok:
                progress(f"{n}/{total} {rung.name} {executor}: REFUSED, output disagrees: "
                         f"{v.reason}")
                rows.append({"rung": rung.name, "executor": executor, "dtype": cfg.dtype,
                             "switches": rung.switches.as_dict(), "refused": v.reason,
                             "check": v.check, **extra})
                del rr
                continue
            if naive_out is None and rung.name == "naive":
                naive_out = got
            t = time_fn(rr)
            if naive_ms is None and rung.name == "naive":
                naive_ms = t.ms_median
            row = _row(rung, executor, t, flops, naive_ms, ceiling_tflops,
                       v.check, rr.plan_summary(), cfg.dtype)
            row.update(extra)
            rows.append(row)
            what = f" ({selection.schedule.name})" if selection is not None else ""
            progress(f"{n}/{total} {rung.name + what:14s} {executor:5s} {t.ms_median:9.3f} ms "
                     f"{row['tflops']:7.3g} TFLOPS  x{row['speedup_vs_naive'] or 0:.2f} naive"
                     f"{label}" + (f"; accepted by the {v.accepted_by}: {v.reason}"
                                   if v.accepted_by else ""))
            del rr
    return rows


def _select(cfg, executor, make_executor, xp, params, inputs, device, samples_fn, progress):
    """The schedule selector's choice for the ladder's shape (timed here, on this run's
    inputs; memory only: a record measures a fresh choice)."""
    from dataclasses import replace

    from ..kernels.selector import Selector, Shape, tuning_steps
    last = {}
    shape = Shape(cfg.cell, cfg.layers, cfg.inp, cfg.hidden, cfg.batch, cfg.steps,
                  cfg.backward, True, cfg.dtype, executor)
    steps = tuning_steps(shape)   # a prefix of the sequence where one run would be long
    cfg_t = replace(cfg, steps=steps)
    x, h0, c0, dy = inputs
    inputs_t = (x[:steps], h0, c0, dy[:steps])

    def timer(sched, shape, repeats):
        if last.get("name") != sched.name:
            last.clear()
            last["name"] = sched.name
            last["rr"] = RungRun(cfg_t, Rung(sched.name, sched.switches), xp,
                                 lambda plan, ws: make_executor(executor, plan, ws), params,
                                 inputs_t, device, family=sched.family,
                                 backward=sched.backward, clusters=sched.clusters,
                                 gemm=sched.gemm)
            return samples_fn(last["rr"], repeats, warmup=1)
        return samples_fn(last["rr"], repeats, warmup=0)

    # '+lt' (cuBLASLt kernels chosen by timing) means nothing to the NumPy executor: GPU only
    sel = Selector(timer, device, cache=None, autotune=True, try_lt=not cfg.cpu).select(shape)
    last.clear()
    if steps != cfg.steps:
        sel.note = "; ".join(x for x in (f"tuned on the first {steps} of {cfg.steps} steps",
                                         sel.note) if x)
    progress(f"auto {executor}: {sel.schedule.name} of "
             + ", ".join(f"{r['name']} {r['ms']:.3f}" if r["ms"] is not None else
                         f"{r['name']} ({r['status']})" for r in sel.candidates)
             + f" ms ({sel.tune_s:.2f} s)")
    return sel


def _run_gpu(cfg, progress, session: BenchSession):
    from ..session import executor_names
    cp, info, ceiling = session.cp, session.info, session.ceiling_for(cfg.dtype)
    for e in cfg.executors:
        if e not in executor_names():
            raise ValueError(f"executors: expected a subset of {list(executor_names())}, "
                             f"got {e!r}")
    model = model_for(cfg, np.float32)
    inputs = inputs_for(cfg, np.float32)
    x, h0, c0, dy = inputs
    flops = _flops(cfg)
    params = cp.asarray(model.flat)
    phases = _Phases()
    bench = cudnn_bench(cfg, model, x, h0, c0, dy)
    phases.end("cudnn_setup")
    second = None
    if not reference_runs(cfg, bench):
        # the float64 NumPy reference would take minutes here: hold the naive rung against
        # cuDNN's output instead (and say so in every row's check)
        ref = bench.outputs()
        ref_name = f"cuDNN output (NumPy reference skipped: {flops:.2e} FLOPs)"
        cudnn_check = compare_all(ref, ref, "itself: it is the reference here")
        # tf32 / 16 bits: both sides carry the precision's error; cuDNN at fp32 arbitrates
        second = second_opinion(cfg, ref, model, inputs, progress)
    else:
        progress("computing the float64 reference")
        ref = _reference(cfg, model, x, h0, c0, dy)
        ref_name = reference_name(cfg.dtype)
        cudnn_check = None if isinstance(bench, str) else compare_all(
            bench.outputs(), ref, ref_name, rows=cfg.steps * cfg.batch,
            **tolerance(cfg.dtype))
    phases.end("reference")
    if not isinstance(bench, str):
        t = bench.time()
        progress(f"cudnn (before the rungs) {t.ms_median:9.3f} ms; check {cudnn_check}")
    phases.end("cudnn_setup")

    def make_executor(executor, plan, ws):
        return session.executor(executor, plan, ws)

    def sync(rr):
        rr.stream.synchronize()

    def time_fn(rr):
        if cfg.interleave and not isinstance(bench, str):
            return _interleaved(cp, rr, bench, cfg)
        return time_gpu(cp, rr.run, rr.stream, cfg.repeats, cfg.warmup)

    def samples_fn(rr, repeats, warmup):
        return time_events(cp, rr.run, rr.stream, repeats, warmup)

    if cfg.rungs is None or AUTO in cfg.rungs:
        # the auto row's selector times kernels, not their first compile (library.precompile)
        from ..kernels.library import precompile
        precompile(session.ctx.kernels, cfg.dtype, cluster=session.limits.cc_major >= 9)
    phases.end("precompile")

    rows = _ladder_rows(cfg, cfg.executors, make_executor, cp, params, inputs, ref, ref_name,
                        flops, ceiling["tflops"], time_fn, sync, progress, session.limits,
                        samples_fn=samples_fn, second=second)
    cp.get_default_memory_pool().free_all_blocks()
    phases.end("rows")
    if isinstance(bench, str):
        cudnn = {"skipped": bench}
    else:
        t = bench.time()
        progress(f"cudnn (after the rungs)  {t.ms_median:9.3f} ms")
        cudnn = bench.row(flops, ceiling["tflops"], cudnn_check)
        if second is not None:
            cudnn["check"]["second_opinion"] = second.peer_record()
        bench.close()
        for row in rows:
            if "ms_median" in row:
                row["ratio_vs_cudnn"] = cudnn["ms_median"] / row["ms_median"]
    phases.end("cudnn_time")
    return dict(_record(cfg, info, versions(cp), flops, ceiling, cudnn, rows),
                phase_s=phases.seconds)


class _Phases:
    """Where a ladder's wall time went: ``end(name)`` adds the time since the last end (or
    the start) to ``seconds[name]``."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def end(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + (now - self._t)
        self._t = now


def _interleaved(cp, rr, bench, cfg):
    """The rung's Timing from runs taken in turn with cuDNN's (timing.time_in_turn: one of
    each, ``cfg.repeats`` times, after the warm-ups), so a drift of the machine's speed hits
    both alike; cuDNN's samples go to its row."""
    t = time_in_turn({"rung": (rr.run, rr.stream), "cudnn": bench.run}, cfg.repeats,
                     cfg.warmup, cp=cp, torch=bench.torch)
    bench.add_samples(t["cudnn"].samples)
    return t["rung"]


class NumpyExecutor:
    """The NumPy executor in program order, behind the executors' run() interface."""

    def __init__(self, plan, ws):
        self.plan, self.ws = plan, ws

    def run(self):
        from ..exec import numpy_exec
        numpy_exec.run(self.plan, self.ws)


def _run_cpu(cfg, progress):
    """The same ladder on the NumPy executor at a small size: CPU figures, labelled so."""
    model = model_for(cfg, np.float32)
    inputs = inputs_for(cfg, np.float32)
    flops = _flops(cfg)
    phases = _Phases()
    ref = _reference(cfg, model, *inputs)
    phases.end("reference")
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    tc = time_cpu(lambda: a @ a, repeats=5)
    ceiling = {"what": "NumPy fp32 matmul 512^3 on the CPU",
               "tflops": 2 * 512**3 / (tc.ms_median * 1e-3) / 1e12, "ms_median": tc.ms_median}
    rows = _ladder_rows(cfg, ("numpy",), lambda e, plan, ws: NumpyExecutor(plan, ws), np,
                        model.flat, inputs, ref, reference_name(cfg.dtype), flops,
                        ceiling["tflops"],
                        lambda rr: time_cpu(rr.run, cfg.repeats, cfg.warmup), lambda rr: None,
                        progress, H100_SXM, label=" (CPU figure)",
                        samples_fn=lambda rr, repeats, warmup: time_cpu(
                            rr.run, repeats, warmup).samples)
    phases.end("rows")
    info = {"device": f"CPU ({platform.processor() or platform.machine()}), NumPy executor",
            "note": "CPU figures: the NumPy executor runs the same plans; not GPU performance. "
                    f"Persistent-kernel fits computed for {H100_SXM.name}"}
    return dict(_record(cfg, info, versions(), flops, ceiling,
                        {"skipped": "CPU run (--cpu): no cuDNN"}, rows), phase_s=phases.seconds)


def _record(cfg, info, vers, flops, ceiling, cudnn, rows) -> dict:
    cfgd = asdict(cfg)
    cfgd["input_size"] = cfg.inp
    cfgd["executors"] = list(cfg.executors)
    return {
        "schema": "rnnrt.ladder/1",
        "kind": "ladder",
        "created": now_iso(),
        "command": " ".join(["rnnrt"] + sys.argv[1:]) if sys.argv else "",
        "pass": "fwd+bwd" if cfg.backward else "fwd",
        "dtype": cfg.dtype,
        "device": info,
        "versions": vers,
        "config": cfgd,
        "flops_per_pass": flops,
        "ceiling": ceiling,
        "cudnn": cudnn,
        "rows": rows + ([cudnn] if "ms_median" in cudnn else []),
    }
