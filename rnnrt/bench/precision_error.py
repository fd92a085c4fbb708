"""`rnnrt precision`: the error a user sees at each precision — rnnrt's and cuDNN's outputs and
gradients against the plain float64 reference on the same inputs — and the issue's goal
checked on it (rnnrt's error no worse than 2x cuDNN's; no NaN or overflow on a long sequence).

For each steps count of ``steps`` (default the paper's 100 and a long 1000) one model and one
set of inputs (x, h0, c0 and the backward's seed dy, fp32) are made; the float64 reference
(``rnnrt.reference``, plain: no storage rounding, exact products) runs forward and backward
once; then for each dtype:

  rnnrt   GPU: ``GpuRunner(model, dtype=...)`` with switches='auto' (what a user runs),
          forward(train=True) and backward(dy). CPU (``--cpu``, small sizes): the plan of the
          paper's best rung on the NumPy executor: for 16-bit storage in float64 with the
          precision's storage rounding (what it leaves out is fp32 accumulation rounding),
          for float32 / tf32 in float32 (TF32's operand rounding is not emulated).
  cudnn   GPU: torch.nn at that precision exactly as the ladder's cuDNN (bench/cudnn.py:
          fp32 TF32 off; fp32 TF32 on; the module and inputs in bf16 / fp16). CPU: torch.nn
          on the CPU in that dtype (no TF32 there: tf32 runs fp32).

Each output (y, h_n, c_n) and gradient (dx, dh0, dc0, and the parameters' by kind over all
layers: dweight_ih, dweight_hh, dbias_ih, dbias_hh) gives a row ``kind: "precision-error"``
with max_rel_err and mean_rel_err, where the relative error of an element is

    |a - r| / (|r| + rms(r))        r the float64 reference, rms over the whole array

— plain relative error where |r| is typical or large, absolute error in units of the array's
scale where r is near zero (a gate gradient of 1e-9 computed as 2e-9 is no error a user
sees; the plain ratio would call it 100%). A non-finite element makes the row's errors null
and counts in ``nonfinite``.

The goal (``goal``): for every (dtype, steps, what) both rnnrt's max and mean errors
<= 2 x cuDNN's + GOAL_FLOOR (a floor of a few fp32 roundings, so that two fp32 errors near
1e-7 are not judged on their noise); and for each 16-bit dtype a forward of ``long_steps``
(default 10,000) steps, rnnrt's and cuDNN's, with every output finite (and |h| <= 1 where
the cell bounds it) — rows ``kind: "precision-long"``.
"""
from __future__ import annotations

import platform
import sys
from dataclasses import asdict, dataclass

import numpy as np

from ..cells import get_cell
from ..check import PEER_RATIO
from ..params import positive_int
from ..precision import DTYPES, get_precision
from .records import now_iso, record_path, versions, write_json

GOAL_RATIO = PEER_RATIO      # the goal, as the ladder's second opinion holds it
GOAL_FLOOR = 1e-6
"""rnnrt's error may exceed cuDNN's by this much (relative error units) beyond the ratio."""
CPU_SIZE = dict(layers=2, hidden=16, batch=4, steps=(6, 20), long_steps=200)
GRAD_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


@dataclass
class PrecisionConfig:
    cell: str = "lstm"
    layers: int = 4
    hidden: int = 512
    input_size: int | None = None      # None: = hidden
    batch: int = 64
    steps: tuple = (100, 1000)
    long_steps: int | None = 10000     # the 16-bit forwards checked for finiteness; None: none
    dtypes: tuple = DTYPES
    cpu: bool = False
    cudnn: bool = True
    seed: int = 0

    def __post_init__(self):
        get_cell(self.cell)
        for name in ("layers", "hidden", "batch"):
            positive_int(f"PrecisionConfig.{name}", getattr(self, name))
        if self.input_size is not None:
            positive_int("PrecisionConfig.input_size", self.input_size)
        self.steps = tuple(self.steps)
        if not self.steps:
            raise ValueError("PrecisionConfig.steps: expected at least one steps count")
        for s in self.steps:
            positive_int("PrecisionConfig.steps", s)
        if self.long_steps is not None:
            positive_int("PrecisionConfig.long_steps", self.long_steps)
        self.dtypes = tuple(self.dtypes)
        if not self.dtypes:
            raise ValueError(f"PrecisionConfig.dtypes: expected some of {list(DTYPES)}")
        for d in self.dtypes:
            try:
                get_precision(d)
            except ValueError as e:
                raise ValueError(f"PrecisionConfig.dtypes: {e}") from None

    @property
    def inp(self) -> int:
        return self.hidden if self.input_size is None else self.input_size


def rel_errors(actual, ref) -> dict:
    """{max_rel_err, mean_rel_err, max_abs_err, ref_rms, nonfinite} of ``actual`` against
    ``ref`` (same shape, any float arrays): the module docstring's relative error; errors
    None where ``actual`` has non-finite elements."""
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"actual: shape {a.shape} != reference shape {r.shape}")
    rms = float(np.sqrt(np.mean(r * r))) if r.size else 0.0
    bad = int(np.count_nonzero(~np.isfinite(a)))
    out = {"ref_rms": rms, "nonfinite": bad, "size": int(a.size)}
    if bad or not a.size:
        return {**out, "max_rel_err": None, "mean_rel_err": None, "max_abs_err": None}
    err = np.abs(a - r)
    rel = err / (np.abs(r) + (rms if rms > 0 else np.finfo(np.float64).tiny))
    return {**out, "max_rel_err": float(rel.max()), "mean_rel_err": float(rel.mean()),
            "max_abs_err": float(err.max())}


def _split_grads(flat, layout) -> dict:
    """{'dweight_ih': all layers' weight_ih gradients as one 1-D array, ...} of a flat
    gradient buffer [layout.size] (absent kinds left out)."""
    flat = np.asarray(flat)
    out = {}
    for kind in GRAD_KINDS:
        parts = [flat[e.offset:e.end] for e in layout.entries if e.kind == kind]
        if parts:
            out[f"d{kind}"] = np.concatenate(parts)
    return out


def _ladder_config(cfg, steps, **kw):
    """The ladder's configuration of ``cfg``'s shape at ``steps`` steps (its model, inputs
    and RungRun are this report's)."""
    from .ladder import LadderConfig
    return LadderConfig(cell=cfg.cell, layers=cfg.layers, hidden=cfg.hidden,
                        input_size=cfg.input_size, batch=cfg.batch, steps=steps, seed=cfg.seed,
                        cpu=True, **kw)


def _model_inputs(cfg, steps):
    from .ladder import inputs_for, model_for
    lc = _ladder_config(cfg, steps)
    return model_for(lc, np.float32), inputs_for(lc, np.float32)


def _reference(cfg, model, inputs) -> dict:
    """The plain float64 reference (ladder.reference_outputs at float32: no rounding): every
    compared array by name, the weight gradients by kind."""
    from .ladder import reference_outputs
    out = reference_outputs(cfg.cell, model, inputs)
    out.update(_split_grads(out.pop("grads"), model.layout))
    return out


# -------------------------------------------------------------------------------- rnnrt

def _rnnrt_gpu(cfg, model, inputs, dtype, train=True) -> dict:
    """rnnrt at ``dtype`` through GpuRunner (switches='auto'), as a user runs it."""
    from ..gpu import GpuRunner
    x, h0, c0, dy = inputs
    runner = GpuRunner(model, schedule_cache=False, dtype=dtype)
    try:
        hx = (h0, c0) if c0 is not None else h0
        if not train:
            y, hx_n = runner.forward(x, hx)
            return _named(y, hx_n, None, None, model)
        y, hx_n, tape = runner.forward(x, hx, train=True)
        g = runner.backward(tape, dy)
        return _named(y, hx_n, g, runner.grads, model)
    finally:
        runner.close()


def _named(y, hx_n, g, grads, model) -> dict:
    """GpuRunner's results (CuPy) as host arrays by name."""
    def host(a):
        return None if a is None else np.asarray(a.get() if hasattr(a, "get") else a)
    h_n, c_n = hx_n if isinstance(hx_n, tuple) else (hx_n, None)
    out = {"y": host(y), "h_n": host(h_n), "c_n": host(c_n)}
    if g is not None:
        out.update(dx=host(g.dx), dh0=host(g.dh0), dc0=host(g.dc0))
        out.update(_split_grads(host(grads), model.layout))
    return {k: v for k, v in out.items() if v is not None}


def _rnnrt_cpu(cfg, model, inputs, dtype, train=True) -> dict:
    """rnnrt at ``dtype`` on the NumPy executor in float64 (storage rounding as the plan
    says), the paper's best rung's schedule: the ladder's RungRun of it."""
    from ..kernels.limits import H100_SXM
    from ..plan.switches import PAPER_RUNGS, ladder
    from .ladder import NumpyExecutor, RungRun
    lc = _ladder_config(cfg, inputs[0].shape[0], backward=train, dtype=dtype)
    # fp32 storage: an fp32 workspace (the GPU's arithmetic); 16-bit storage: float64 with the
    # storage rounding the plan applies (the rounding dominates what fp32 would add)
    wdt = np.float64 if get_precision(dtype).rounds else np.float32
    rr = RungRun(lc, ladder()[PAPER_RUNGS - 1], np, NumpyExecutor, model.flat.astype(wdt),
                 inputs, H100_SXM, ws_dtype=wdt)
    rr.run()
    out = rr.ws.outputs()
    if train:
        out.update({n: rr.ws.read(n) for n in ("dx", "dh0", "dc0")
                    if n in rr.plans[-1].outputs})
        out.update(_split_grads(rr.ws.read("grads"), model.layout))
    return out


# -------------------------------------------------------------------------------- cuDNN

def _torch_run(cfg, model, inputs, dtype, device: str, train=True) -> dict:
    """torch.nn at ``dtype`` on ``device`` ('cuda': cuDNN, flags as bench/cudnn.py sets
    them; 'cpu': torch's CPU kernels, fp32 for tf32): outputs and gradients as float64."""
    import torch

    from ..params import to_flat
    from .cudnn import TORCH_DTYPES, torch_module
    name = get_precision(dtype).name
    tdt = TORCH_DTYPES[name](torch)
    m = torch_module(torch, model, name, device)
    x, h0, c0, dy = (None if a is None else torch.from_numpy(a).to(device=device, dtype=tdt)
                     for a in inputs)
    leaves = [t for t in (x, h0, c0) if t is not None]
    with torch.set_grad_enabled(train):
        for t in leaves:
            t.requires_grad_(train)
        y, hx_n = m(x, (h0, c0) if c0 is not None else h0)
        h_n, c_n = hx_n if isinstance(hx_n, tuple) else (hx_n, None)

        def host(t):
            return None if t is None else t.detach().double().cpu().numpy()
        out = {"y": host(y), "h_n": host(h_n), "c_n": host(c_n)}
        if train:
            names = [n for n, _ in m.named_parameters()]
            grads = torch.autograd.grad(y, leaves + list(m.parameters()), dy)
            out.update(dx=host(grads[0]), dh0=host(grads[1]))
            if c0 is not None:
                out["dc0"] = host(grads[2])
            flat = to_flat({n: host(g) for n, g in zip(names, grads[len(leaves):])},
                           model.layout)
            out.update(_split_grads(flat, model.layout))
    return {k: v for k, v in out.items() if v is not None}


# -------------------------------------------------------------------------------- the report

def _progress(msg):
    print(f"[precision] {msg}", file=sys.stderr, flush=True)


def run_precision(cfg: PrecisionConfig, progress=_progress) -> dict:
    """Every row of the report and the goal's check: the record (module docstring)."""
    from .cudnn import cudnn_missing
    if cfg.cpu:
        info = {"device": f"CPU ({platform.processor() or platform.machine()}), NumPy "
                          f"executor; torch.nn on the CPU as the cuDNN role"}
        vers, run_rnnrt, tdev = versions(), _rnnrt_cpu, "cpu"
    else:
        from ..device import require_gpu
        from ..session import device_info
        cp = require_gpu()
        info, vers, run_rnnrt, tdev = device_info(cp), versions(cp), _rnnrt_gpu, "cuda"
    why_not = cudnn_missing(cfg, cuda=not cfg.cpu)
    shape = {"cell": cfg.cell, "layers": cfg.layers, "hidden": cfg.hidden,
             "input_size": cfg.inp, "batch": cfg.batch}
    base = {"device": info.get("device"), "versions": vers}
    rows, longs = [], []
    impls = [("rnnrt", run_rnnrt)]
    if why_not is None:
        impls.append(("cudnn", lambda c, m, i, d, train=True: _torch_run(c, m, i, d, tdev,
                                                                         train)))
    for steps in cfg.steps:
        check_host(cfg, steps)
        model, inputs = _model_inputs(cfg, steps)
        progress(f"T={steps}: the float64 reference (forward and backward)")
        ref = _reference(cfg, model, inputs)
        for dtype in cfg.dtypes:
            for impl, fn in impls:
                got = fn(cfg, model, inputs, dtype)
                for what, r in ref.items():
                    e = rel_errors(got[what], r)
                    rows.append({"kind": "precision-error", "dtype": dtype, "impl": impl,
                                 "what": what, **e, **shape, "steps": steps, **base})
                worst = max(rows[-len(ref):], key=_badness)
                progress(f"T={steps} {dtype:8s} {impl:5s}: worst {worst['what']} max rel "
                         f"{worst['max_rel_err']}")
    if cfg.long_steps:
        model, inputs = _model_inputs(cfg, cfg.long_steps)
        for dtype in (d for d in cfg.dtypes if get_precision(d).rounds):
            for impl, fn in impls:
                got = fn(cfg, model, inputs, dtype, train=False)
                longs.append(_long_row(cfg, got, dtype, impl, shape, base))
                progress(f"T={cfg.long_steps} {dtype} {impl}: finite {longs[-1]['finite']}")
    created = now_iso()
    return {"schema": "rnnrt.precision/1", "kind": "precision", "created": created,
            "command": " ".join(["rnnrt"] + sys.argv[1:]) if sys.argv else "",
            "device": info, "versions": vers, "config": asdict(cfg),
            "relative_error": "|a - r| / (|r| + rms(r)), r the plain float64 reference",
            "cudnn": {"skipped": why_not} if why_not else {"ran": tdev},
            "rows": rows, "long": longs, "goal": goal(rows, longs)}


def _badness(row) -> float:
    return np.inf if row["max_rel_err"] is None else row["max_rel_err"]


def check_host(cfg, steps) -> None:
    """sizes.SizeError unless the float64 reference of ``steps`` steps fits the host."""
    from .. import sizes
    for pass_ in ("train", "backward"):
        sizes.check_reference(cfg.cell, cfg.inp, cfg.hidden, cfg.layers, cfg.batch, steps, 8,
                              pass_)


def _long_row(cfg, got, dtype, impl, shape, base) -> dict:
    """One long forward's finiteness check (|h| <= 1 too where the cell bounds h)."""
    finite = all(bool(np.isfinite(a).all()) for a in got.values())
    bounded = cfg.cell != "rnn_relu"
    h_max = max(float(np.abs(got[k]).max()) for k in ("y", "h_n"))
    ok = finite and (not bounded or h_max <= 1.0)
    return {"kind": "precision-long", "dtype": dtype, "impl": impl, "pass": "fwd",
            "finite": finite, "max_abs_h": h_max if finite else None, "h_bounded": bounded,
            "ok": ok, **shape, "steps": cfg.long_steps, **base}


def goal(rows, longs) -> dict:
    """The issue's goal on the rows (module docstring): each (dtype, steps, what) compared,
    the long runs' finiteness; ``ok`` all of them (and False where cuDNN did not run)."""
    by = {(r["dtype"], r["steps"], r["what"], r["impl"]): r for r in rows}
    checks = []
    for (dtype, steps, what, impl), r in by.items():
        if impl != "rnnrt":
            continue
        c = by.get((dtype, steps, what, "cudnn"))
        item = {"dtype": dtype, "steps": steps, "what": what}
        for stat in ("max_rel_err", "mean_rel_err"):
            ours, theirs = r[stat], None if c is None else c[stat]
            item[f"rnnrt_{stat}"], item[f"cudnn_{stat}"] = ours, theirs
            if ours is None or c is None:     # rnnrt not finite, or nothing to judge by
                ok = False
            elif theirs is None:              # cuDNN not finite, rnnrt finite
                ok = True
            else:
                ok = ours <= GOAL_RATIO * theirs + GOAL_FLOOR
            item[f"ok_{stat}"] = ok
        item["ok"] = item["ok_max_rel_err"] and item["ok_mean_rel_err"]
        checks.append(item)
    ok = bool(checks) and all(c["ok"] for c in checks) and all(r["ok"] for r in longs)
    return {"rule": f"rnnrt's max and mean relative error <= {GOAL_RATIO:g} x cuDNN's + "
                    f"{GOAL_FLOOR:g}; every long 16-bit forward finite",
            "ok": ok, "checks": checks,
            "long_ok": all(r["ok"] for r in longs) if longs else None}


def summary_table(record: dict) -> str:
    """Markdown: per dtype and steps, the worst output's and the worst gradient's max and mean
    relative error for rnnrt and cuDNN, the goal's verdict; the long runs after."""
    lines = ["| dtype | T | impl | outputs max | outputs mean | grads max | grads mean |",
             "|---|---|---|---|---|---|---|"]
    keys = dict.fromkeys((r["dtype"], r["steps"], r["impl"]) for r in record["rows"])
    for dtype, steps, impl in keys:
        sel = [r for r in record["rows"]
               if (r["dtype"], r["steps"], r["impl"]) == (dtype, steps, impl)]
        cells = [dtype, str(steps), impl]
        for grads in (False, True):
            part = [r for r in sel if r["what"].startswith("d") == grads]
            for stat in ("max_rel_err", "mean_rel_err"):
                vals = [r[stat] for r in part]
                cells.append("non-finite" if any(v is None for v in vals)
                             else f"{max(vals):.3g}" if vals else "—")
        lines.append("| " + " | ".join(cells) + " |")
    for i, r in enumerate(record["long"]):
        lines.append(("\n" if i == 0 else "") + f"T={r['steps']} forward {r['dtype']} "
                     f"{r['impl']}: {'finite' if r['finite'] else 'NOT FINITE'}, max |h| "
                     f"{r['max_abs_h']}")
    g = record["goal"]
    bad = [c for c in g["checks"] if not c["ok"]]
    lines.append(f"\ngoal ({g['rule']}): {'MET' if g['ok'] else 'NOT MET'}"
                 + ("; failing: " + ", ".join(f"{c['dtype']} T{c['steps']} {c['what']}"
                                               for c in bad[:8]) if bad else ""))
    return "\n".join(lines)


def default_path(record: dict, root=None):
    """results/precision/precision-<cell>-L-H-B-T<steps>[-T<steps>...]-<device>-<stamp>.json"""
    c = record["config"]
    stem = (f"precision-{c['cell']}-L{c['layers']}-H{c['hidden']}-B{c['batch']}-"
            + "-".join(f"T{s}" for s in c["steps"]))
    return record_path("precision", stem, record["device"].get("device", "cpu"),
                       record["created"], root=root)


def write_record(record: dict, path=None, overwrite: bool = True):
    """Write the record (atomically) to ``path`` or its default path; the path written."""
    from pathlib import Path
    return write_json(record, Path(path) if path else default_path(record), overwrite=overwrite)
