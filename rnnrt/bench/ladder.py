"""`rnnrt ladder`: the paper's Table 1 on this machine — every rung of the ladder, verified and
then timed, beside cuDNN and the GPU's fp32 GEMM ceiling measured in the same run.

Protocol per (rung, executor): build the plan, poison the workspace, run once and compare the
output with the naive rung's (the naive rung itself with the float64 NumPy reference); a rung
that disagrees is not timed (its row says why). Then warm-up and the median of ``repeats``
runs timed with CUDA events on the plan's first stream. FLOPs by the paper's convention
(rnnrt.cells.forward_flops). Ratios: speedup_vs_naive = naive ms / rung ms (same executor);
ratio_vs_cudnn = cuDNN ms / rung ms (> 1: faster than cuDNN; cuDNN's ms is the median of
its medians timed before and after the rungs, both kept in the record); share_of_ceiling = TFLOPS over
the fp32 GEMM ceiling's TFLOPS.

Rungs past the paper's Table 1 (``switches.PAPER_RUNGS``; today '+persistent') are marked so
in the table. A rung whose plan declined its fast path (the persistent kernel on a shape the
device cannot hold) still runs, on its fallback schedule, and its row says so: ``fallback``
(why) and ``fit`` (what the device fit chose or refused). With --backward the persistent rung
runs the persistent kernel forward and the rung below's schedule backward (``backward_note``).
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__, reference
from ..cells import forward_flops, get_cell, tflops
from ..check import FP32_ATOL, FP32_RTOL, compare
from ..params import to_flat
from ..limits import H100_SXM, DeviceLimits
from ..plan import PlanKey, forward_plan
from ..switches import DEFAULT_INPUT_BATCH, PAPER_RUNGS, ladder, rung_names
from .timing import gemm_ceiling, time_cpu, time_gpu, time_torch

# Above this many forward FLOPs the float64 NumPy reference (~0.1 TFLOPS on a CPU) is
# replaced by cuDNN's output as the naive rung's check, when cuDNN is there.
REFERENCE_FLOP_LIMIT = 2e12
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
    extra: dict = field(default_factory=dict)

    @property
    def inp(self) -> int:
        return self.hidden if self.input_size is None else self.input_size


def _model(cfg: LadderConfig, dtype):
    import rnnrt
    kw = dict(num_layers=cfg.layers, dtype=dtype, seed=cfg.seed)
    if cfg.cell == "lstm":
        return rnnrt.LSTM(cfg.inp, cfg.hidden, **kw)
    if cfg.cell == "gru":
        return rnnrt.GRU(cfg.inp, cfg.hidden, **kw)
    return rnnrt.RNN(cfg.inp, cfg.hidden, nonlinearity=cfg.cell.split("_")[1], **kw)


def _inputs(cfg: LadderConfig, dtype):
    """Random x [T,B,I], h0 [L,B,H], c0 (LSTM) and dy [T,B,H] (the backward's seed)."""
    rng = np.random.default_rng(cfg.seed + 1)
    x = rng.standard_normal((cfg.steps, cfg.batch, cfg.inp)).astype(dtype)
    h0 = (0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(dtype)
    c0 = ((0.5 * rng.standard_normal((cfg.layers, cfg.batch, cfg.hidden))).astype(dtype)
          if get_cell(cfg.cell).has_cell_state else None)
    dy = rng.standard_normal((cfg.steps, cfg.batch, cfg.hidden)).astype(dtype)
    return x, h0, c0, dy


def _flops(cfg) -> int:
    f = forward_flops(cfg.cell, cfg.inp, cfg.hidden, cfg.layers, cfg.batch, cfg.steps)
    return 3 * f if cfg.backward else f   # backward = 2x forward (paper's convention)


def _compare_all(got: dict, ref: dict, against: str):
    """compare() every array of ``ref`` with ``got``; the worst one (by excess) returned."""
    worst = None
    for name, r in ref.items():
        c = compare(got[name], r, FP32_ATOL, FP32_RTOL, name=f"{name} vs {against}")
        if worst is None or (not c.ok and worst.ok) or c.max_excess > worst.max_excess:
            worst = c
    return worst


def _progress(msg):
    print(f"[ladder] {msg}", file=sys.stderr, flush=True)


def versions(cp=None) -> dict:
    v = {"rnnrt": __version__, "numpy": np.__version__, "python": platform.python_version()}
    if cp is not None:
        v["cupy"] = cp.__version__
        v["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
        v["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
    try:
        import torch
        v["torch"] = torch.__version__
        if torch.cuda.is_available():
            v["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - torch is optional
        pass
    return v


class GpuSession:
    """What one process measures once and every ladder in it shares: the CuPy module, the
    device facts, a GpuContext (streams, cuBLAS handles, compiled kernels) and the fp32 GEMM
    ceiling. A sweep opens one and runs a ladder per point through it; ``close()`` at the end."""

    def __init__(self, progress=_progress):
        from ..device import device_info, require_gpu
        from ..exec.cuda_exec import GpuContext
        from ..kernels import KernelLibrary
        self.cp = require_gpu()
        self.info = device_info()
        self.ctx = GpuContext(self.cp, KernelLibrary())
        self.limits = DeviceLimits.from_device(self.cp)
        progress(f"device {self.info['device']}; measuring the fp32 GEMM ceiling")
        self.ceiling = gemm_ceiling(self.cp, self.ctx)
        progress(f"ceiling {self.ceiling['tflops']:.1f} TFLOPS")

    def close(self):
        self.ctx.close()


def run_ladder(cfg: LadderConfig, progress=_progress, session: GpuSession | None = None) -> dict:
    """Verify and time every rung; return the record (see module docstring).

    session: a GpuSession to reuse (a sweep passes one); None opens and closes one here.
    """
    get_cell(cfg.cell)
    if cfg.cpu:
        return _run_cpu(cfg, progress)
    own = session is None
    session = GpuSession(progress) if own else session
    try:
        return _run_gpu(cfg, progress, session)
    finally:
        if own:
            session.close()


def _reference(cfg, model, x, h0, c0, dy):
    """float64 NumPy reference: {'y'} (+ {'dx', 'grads'} flat, when cfg.backward)."""
    from ..params import per_layer
    p64 = per_layer(model.flat.astype(np.float64), model.layout)
    y, _, _, cache = reference.forward(cfg.cell, p64, x.astype(np.float64),
                                       h0.astype(np.float64),
                                       None if c0 is None else c0.astype(np.float64))
    out = {"y": y}
    if cfg.backward:
        g = reference.backward(cfg.cell, p64, cache, dy.astype(np.float64))
        out["dx"] = g["dx"]
        out["grads"] = to_flat(g["params"], model.layout)
    return out


def _row(rung, executor, timing, flops, naive_ms, ceiling_tflops, check, plan):
    """One (rung, executor) row; ``plan`` is the _RungRun's plan_summary(). ratio_vs_cudnn
    is filled in after the rungs, once cuDNN's pooled time is known."""
    tf = tflops(flops, timing.ms_median)
    extra = {k: plan[k] for k in ("fallback", "fit", "backward_note") if plan.get(k)}
    return {
        **extra,
        "rung": rung.name, "executor": executor, "switches": rung.switches.as_dict(),
        **timing.as_dict(), "tflops": tf,
        "speedup_vs_naive": (naive_ms / timing.ms_median) if naive_ms else None,
        "ratio_vs_cudnn": None,
        "share_of_ceiling": (tf / ceiling_tflops) if ceiling_tflops else None,
        "check": check,
        "plan": plan,
    }


def _check_dict(c):
    return {"ok": c.ok, "against": c.name, "max_abs_err": c.max_abs_err,
            "worst_index": list(c.worst_index), "n_bad": c.n_bad}


class _RungRun:
    """One rung's plan(s) on one workspace: ``run()`` is the timed pass (the forward, or the
    forward then the backward), ``outputs()`` the arrays every rung is checked on."""

    def __init__(self, cfg, rung, xp, make_executor, params, inputs, device: DeviceLimits):
        from ..exec.workspace import Workspace
        from ..plan_backward import backward_plan
        key = PlanKey(cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden, cfg.layers, True,
                      rung.switches, train=cfg.backward, device=device)
        self.plans = [forward_plan(key)] + ([backward_plan(key)] if cfg.backward else [])
        self.ws = Workspace(self.plans[-1], xp, np.float32, params)
        self.ws.poison()
        x, h0, c0, dy = inputs
        self.ws.load_inputs(x, h0, c0)
        if cfg.backward:
            arrays = {"dy": dy, "dh_n": None}
            if "dc_n" in self.plans[-1].inputs:
                arrays["dc_n"] = None
            self.ws.load(**arrays)
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
        if fwd.key.switches.persistent and len(self.plans) > 1:
            out["backward_note"] = ("backward: the schedule of the other switches (the rung "
                                    "below's, reverse wavefront included; no persistent "
                                    "backward kernel yet)")
        return out


def _ladder_rows(cfg, executors, make_executor, xp, params, inputs, ref, ref_name, flops,
                 ceiling_tflops, time_fn, sync, progress, device, label=""):
    """Verify then time every rung for every executor; the rows (see the module docstring)."""
    rows = []
    rungs = ladder(cfg.input_batch)
    total = len(rungs) * len(executors)
    n = 0
    for executor in executors:
        naive_out, naive_ms = None, None
        for rung in rungs:
            n += 1
            rr = _RungRun(cfg, rung, xp, lambda plan, ws: make_executor(executor, plan, ws),
                          params, inputs, device)
            if rr.plans[0].fallback:
                progress(f"{n}/{total} {rung.name} {executor}: {rr.plans[0].fallback}")
            rr.run()
            sync(rr)
            got = rr.outputs()
            if naive_out is None:
                c = _compare_all(got, ref, ref_name)
            else:
                c = _compare_all(got, naive_out, "naive rung")
            if not c.ok:
                progress(f"{n}/{total} {rung.name} {executor}: REFUSED, output disagrees: {c}")
                rows.append({"rung": rung.name, "executor": executor,
                             "switches": rung.switches.as_dict(), "refused": str(c),
                             "check": _check_dict(c)})
                del rr
                continue
            if naive_out is None:
                naive_out = got
            t = time_fn(rr)
            if naive_ms is None and rung.name == rungs[0].name:
                naive_ms = t.ms_median
            row = _row(rung, executor, t, flops, naive_ms, ceiling_tflops,
                       _check_dict(c), rr.plan_summary())
            rows.append(row)
            progress(f"{n}/{total} {rung.name:14s} {executor:5s} {t.ms_median:9.3f} ms "
                     f"{row['tflops']:7.3g} TFLOPS  x{row['speedup_vs_naive'] or 0:.2f} naive"
                     f"{label}")
            del rr
    return rows


def _run_gpu(cfg, progress, session: GpuSession):
    from ..exec.cuda_exec import EXECUTORS
    cp, ctx, info, ceiling = session.cp, session.ctx, session.info, session.ceiling
    for e in cfg.executors:
        if e not in EXECUTORS:
            raise ValueError(f"executors: expected a subset of {sorted(EXECUTORS)}, got {e!r}")
    model = _model(cfg, np.float32)
    inputs = _inputs(cfg, np.float32)
    x, h0, c0, dy = inputs
    flops = _flops(cfg)
    params = cp.asarray(model.flat)
    bench = _cudnn_bench(cfg, model, x, h0, c0, dy)
    if flops > REFERENCE_FLOP_LIMIT and not isinstance(bench, str):
        # the float64 NumPy reference would take minutes here: hold the naive rung against
        # cuDNN's output instead (and say so in every row's check)
        ref = bench.outputs()
        ref_name = f"cuDNN output (NumPy reference skipped: {flops:.2e} FLOPs)"
        cudnn_check = _compare_all(ref, ref, "itself: it is the reference here")
    else:
        progress("computing the float64 reference")
        ref = _reference(cfg, model, x, h0, c0, dy)
        ref_name = "float64 reference"
        cudnn_check = None if isinstance(bench, str) else _compare_all(bench.outputs(), ref,
                                                                        ref_name)
    if not isinstance(bench, str):
        t = bench.time()
        progress(f"cudnn (before the rungs) {t.ms_median:9.3f} ms; check {cudnn_check}")

    def make_executor(executor, plan, ws):
        return EXECUTORS[executor](plan, ws, ctx)

    def sync(rr):
        rr.stream.synchronize()

    def time_fn(rr):
        t = time_gpu(cp, rr.run, rr.stream, cfg.repeats, cfg.warmup)
        return t

    rows = _ladder_rows(cfg, cfg.executors, make_executor, cp, params, inputs, ref, ref_name,
                        flops, ceiling["tflops"], time_fn, sync, progress, session.limits)
    cp.get_default_memory_pool().free_all_blocks()
    if isinstance(bench, str):
        cudnn = {"skipped": bench}
    else:
        t = bench.time()
        progress(f"cudnn (after the rungs)  {t.ms_median:9.3f} ms")
        cudnn = bench.row(flops, ceiling["tflops"], cudnn_check)
        bench.close()
        for row in rows:
            if "ms_median" in row:
                row["ratio_vs_cudnn"] = cudnn["ms_median"] / row["ms_median"]
    return _record(cfg, info, versions(cp), flops, ceiling, cudnn, rows)


class CudnnBench:
    """cuDNN through torch.nn holding the same weights (rnnrt's torch-compatible state_dict),
    TF32 off. ``time()`` can be called several times in a run (before and after the rungs):
    cuDNN's time moves between calls far more than ours (../shared/reference/ANCHORS.md saw
    6.7 to 11.8 ms for one configuration), so the row pools every sample."""

    def __init__(self, cfg, model, x, h0, c0, dy):
        import torch
        self.torch, self.cfg, self.layout = torch, cfg, model.layout
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(cfg.cell)
        kw = dict(num_layers=cfg.layers, bias=model.bias)
        if cls is None:
            cls = torch.nn.RNN
            kw["nonlinearity"] = cfg.cell.split("_")[1]
        self.module = cls(cfg.inp, cfg.hidden, **kw).cuda().float()
        self.module.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                     for k, v in model.state_dict().items()})
        self.x = torch.from_numpy(x).cuda()
        hx = torch.from_numpy(h0).cuda()
        self.hx = hx if c0 is None else (hx, torch.from_numpy(c0).cuda())
        self.dy = torch.from_numpy(dy).cuda()
        self.names = [n for n, _ in self.module.named_parameters()]
        self.x.requires_grad_(cfg.backward)
        self.medians, self.samples = [], []

    def run(self):
        """Forward (no autograd), or forward + backward through autograd (dx and every
        parameter's gradient for the seed dy), as a training step would."""
        torch = self.torch
        if not self.cfg.backward:
            with torch.no_grad():
                return self.module(self.x, self.hx)
        y, _ = self.module(self.x, self.hx)
        grads = torch.autograd.grad(y, [self.x] + list(self.module.parameters()), self.dy)
        return y, grads

    def outputs(self) -> dict:
        """The arrays the ladder checks: {'y'} (+ {'dx', 'grads'} flat in rnnrt's layout)."""
        y, extra = self.run()
        self.torch.cuda.synchronize()
        out = {"y": y.detach().cpu().numpy()}
        if self.cfg.backward:
            out["dx"] = extra[0].cpu().numpy()
            out["grads"] = to_flat({n: g.cpu().numpy() for n, g in
                                    zip(self.names, extra[1:])}, self.layout)
        return out

    def time(self):
        t = time_torch(self.torch, self.run, self.cfg.repeats, self.cfg.warmup)
        self.medians.append(t.ms_median)
        self.samples += [t.ms_min, t.ms_median, t.ms_max]
        return t

    def row(self, flops, ceiling_tflops, check):
        ms = statistics.median(self.medians)
        tf = tflops(flops, ms)
        torch = self.torch
        return {"rung": "cudnn", "executor": "torch.nn", "ms_median": ms,
                "ms_min": min(self.samples), "ms_max": max(self.samples),
                "runs": self.cfg.repeats * len(self.medians),
                "ms_median_per_timing": self.medians, "tflops": tf,
                "speedup_vs_naive": None, "ratio_vs_cudnn": 1.0,
                "share_of_ceiling": tf / ceiling_tflops, "check": _check_dict(check),
                "torch": torch.__version__, "cudnn_version": torch.backends.cudnn.version(),
                "tf32": False}

    def close(self):
        del self.module, self.x, self.hx, self.dy
        self.torch.cuda.empty_cache()


def _cudnn_bench(cfg, model, x, h0, c0, dy):
    """CudnnBench, or the reason there is none (a string)."""
    if not cfg.cudnn:
        return "disabled (--no-cudnn)"
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch not importable ({e})"
    if not torch.cuda.is_available():
        return "torch has no CUDA"
    return CudnnBench(cfg, model, x, h0, c0, dy)


class _NumpyExecutor:
    """The NumPy executor in program order, behind the executors' run() interface."""

    def __init__(self, plan, ws):
        self.plan, self.ws = plan, ws

    def run(self):
        from ..exec import numpy_exec
        numpy_exec.run(self.plan, self.ws)


def _run_cpu(cfg, progress):
    """The same ladder on the NumPy executor at a small size: CPU figures, labelled so."""
    model = _model(cfg, np.float32)
    inputs = _inputs(cfg, np.float32)
    flops = _flops(cfg)
    ref = _reference(cfg, model, *inputs)
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    tc = time_cpu(lambda: a @ a, repeats=5)
    ceiling = {"what": "NumPy fp32 matmul 512^3 on the CPU",
               "tflops": 2 * 512**3 / (tc.ms_median * 1e-3) / 1e12, "ms_median": tc.ms_median}
    rows = _ladder_rows(cfg, ("numpy",), lambda e, plan, ws: _NumpyExecutor(plan, ws), np,
                        model.flat, inputs, ref, "float64 reference", flops, ceiling["tflops"],
                        lambda rr: time_cpu(rr.run, cfg.repeats, cfg.warmup), lambda rr: None,
                        progress, H100_SXM, label=" (CPU figure)")
    info = {"device": f"CPU ({platform.processor() or platform.machine()}), NumPy executor",
            "note": "CPU figures: the NumPy executor runs the same plans; not GPU performance. "
                    f"Persistent-kernel fits computed for {H100_SXM.name}"}
    return _record(cfg, info, versions(), flops, ceiling,
                   {"skipped": "CPU run (--cpu): no cuDNN"}, rows)


def _record(cfg, info, vers, flops, ceiling, cudnn, rows) -> dict:
    cfgd = asdict(cfg)
    cfgd["input_size"] = cfg.inp
    cfgd["executors"] = list(cfg.executors)
    return {
        "schema": "rnnrt.ladder/1",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["rnnrt"] + sys.argv[1:]) if sys.argv else "",
        "pass": "fwd+bwd" if cfg.backward else "fwd",
        "device": info,
        "versions": vers,
        "config": cfgd,
        "flops_per_pass": flops,
        "ceiling": ceiling,
        "cudnn": cudnn,
        "rows": rows + ([cudnn] if "ms_median" in cudnn else []),
    }


def _fmt(v, spec):
    return "—" if v is None else format(v, spec)


def markdown_table(record: dict) -> str:
    """The paper's Table 1 shape: one row per rung, per executor ms / TFLOPS / x naive /
    vs cuDNN / % of the fp32 ceiling; the cuDNN row last."""
    rows = [r for r in record["rows"] if r["rung"] != "cudnn"]
    executors = list(dict.fromkeys(r["executor"] for r in rows))
    head = ["rung"]
    for e in executors:
        head += [f"{e} ms", f"{e} TFLOPS", f"{e} x naive", f"{e} vs cuDNN", f"{e} % ceiling"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    beyond = set(rung_names()[PAPER_RUNGS:])
    notes = []
    for name in dict.fromkeys(r["rung"] for r in rows):
        cells = [name + (" (beyond the paper)" if name in beyond else "")]
        fb = next((r["fallback"] for r in rows if r["rung"] == name and r.get("fallback")),
                  None)
        if fb:
            cells[0] += " (fell back)"
            notes.append(f"{name}: {fb}.")
        for e in executors:
            r = next((r for r in rows if r["rung"] == name and r["executor"] == e), None)
            if r is None or "refused" in r:
                cells += ["refused" if r else "—"] + ["—"] * 4
                continue
            share = r.get("share_of_ceiling")
            cells += [_fmt(r["ms_median"], ".3f"), _fmt(r["tflops"], ".3g"),
                      _fmt(r["speedup_vs_naive"], ".2f"), _fmt(r["ratio_vs_cudnn"], ".2f"),
                      _fmt(None if share is None else 100 * share, ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    cd = record["cudnn"]
    if "ms_median" in cd:
        cells = ["cuDNN (torch.nn, TF32 off)"]
        for _ in executors:
            cells += [_fmt(cd["ms_median"], ".3f"), _fmt(cd["tflops"], ".3g"), "—", "1.00",
                      _fmt(100 * cd["share_of_ceiling"], ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    c = record["config"]
    lines.append("")
    lines.append(f"{c['cell'].upper()}, {c['layers']} layers, hidden {c['hidden']}, input "
                 f"{c['input_size']}, minibatch {c['batch']}, {c['steps']} steps, fp32; "
                 f"input batching k = {c['input_batch']}; median of {c['repeats']} runs. "
                 f"Device: {record['device'].get('device')}. Ceiling: "
                 f"{record['ceiling']['what']} = {record['ceiling']['tflops']:.1f} TFLOPS. "
                 f"cuDNN: {_cudnn_note(record['cudnn'])}.")
    lines += [""] + notes if notes else []
    return "\n".join(lines)


def _cudnn_note(cd: dict) -> str:
    if "skipped" in cd:
        return cd["skipped"]
    per = cd.get("ms_median_per_timing", [])
    return ("same process, TF32 off, median of its medians timed before and after the rungs ("
            + " / ".join(f"{m:.3f}" for m in per) + " ms)")


def default_path(record: dict, root: Path | None = None) -> Path:
    c = record["config"]
    dev = str(record["device"].get("device", "cpu")).split(",")[0]
    slug = "".join(ch if ch.isalnum() else "-" for ch in dev).strip("-").lower()
    stamp = record["created"][:19].replace(":", "").replace("-", "")
    root = root or Path("experiments") / "results"
    return root / (f"ladder-{c['cell']}-L{c['layers']}-H{c['hidden']}-B{c['batch']}-"
                   f"T{c['steps']}-{record['pass']}-{slug}-{stamp}.json")


def write_record(record: dict, path: Path | None = None) -> Path:
    path = Path(path) if path else default_path(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return path
