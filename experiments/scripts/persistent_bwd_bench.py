"""The persistent backward kernel against the per-step backward and cuDNN: forward + backward
(a training step's RNN work) of the automatic choice with and without the new candidates, and
cuDNN, in one process, fp32 with TF32 OFF (rnnrt's cuBLAS in plain fp32 math mode; torch's
cudnn.allow_tf32 and matmul.allow_tf32 False).

Usage (GPU, from the repo root):
    python experiments/scripts/persistent_bwd_bench.py [--quick] [--repeats N] [--out DIR]
        [--shapes lstm:1:512:32[:T],...] [--kinds grid,cluster,pair] [--fwd-family grid]
        [--units 4,8]

For each shape (LSTM L4 H512 B64 T100; LSTM and GRU L1 H128 B8/B64/B256; LSTM L4 H128 B8;
LSTM L2 H640 B100): the schedule selector (kernels/choice.py, memory only) times its
candidates for the training shape twice over: all of them ("auto": the persistent backward
'+pbwd' candidates included), and without the persistent backward ("auto w/o pbwd": what auto
ran before it existed); beside them that forward with each persistent backward kernel that
fits ("pbwd_grid", "pbwd_cluster": what calibrates the cost model choosing between them, with
its modelled us a step in the record; --kinds names them: 'pair', the grid kernel in cluster
pairs, persistent_bwd_pair.cu); --fwd-family F: no selector runs, the variants after the
persistent forward of family F (e.g. grid vs pair at L1 H512: --shapes
lstm:1:512:32,lstm:1:512:64 --kinds grid,pair --fwd-family grid); --shapes: cell:layers:
hidden:batch[:steps] instead of the list below; --units: the grid and pair kernels also at
these units a block (PlanKey.bwd_units; labels pbwd_grid_u4, ...) besides the cost model's U;
each shape's model and inputs are the ladder's
(rnnrt.bench.ladder.model_for / inputs_for: random weights, x, h0, c0 and dy); each is then
checked against the float64 NumPy reference (dx, dh0, dc0 and every weight and bias gradient; fp32 tolerance, the weight
gradients' growing with their T*B terms) and timed (CUDA graph executor, CUDA events, median
of --repeats) in turn with cuDNN (torch.nn with autograd: forward + dx and every parameter
gradient). A shape the kernel does not fit says why (the fit's reason). --quick: 3 repeats,
T 50 for the two largest shapes (about a minute in all once the kernels are compiled).
Prints a table last; writes the record (kind 'persistent-bwd-bench') to --out (default
experiments/results/kernels).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from rnnrt.bench.ladder import (  # noqa: E402
    LadderConfig, inputs_for, model_for, reference_outputs)
from rnnrt.bench.records import now_iso, record_path, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_in_turn  # noqa: E402
from rnnrt.cells import backward_flops, forward_flops  # noqa: E402
from rnnrt.check import compare_all  # noqa: E402
from rnnrt.kernels import choice as C  # noqa: E402
from rnnrt.kernels import selector as SEL  # noqa: E402
from rnnrt.kernels.persistent_bwd import persistent_bwd_fit  # noqa: E402
from rnnrt.plan import PlanKey, forward_plan  # noqa: E402
from rnnrt.plan.backward import backward_plan  # noqa: E402
from rnnrt.session import GpuSession, time_events  # noqa: E402

SHAPES = [("lstm", 4, 512, 64, 100), ("lstm", 1, 128, 8, 100), ("lstm", 1, 128, 64, 100),
          ("lstm", 1, 128, 256, 100), ("gru", 1, 128, 8, 100), ("gru", 1, 128, 64, 100),
          ("gru", 1, 128, 256, 100), ("lstm", 4, 128, 8, 100), ("lstm", 2, 640, 100, 100)]


class Case:
    """One shape's model (fp32, random), inputs, the float64 reference gradients, and the
    plans of any schedule built on the GPU (kept until ``close``)."""

    def __init__(self, session, cell, layers, hidden, batch, steps, seed=0):
        self.session, self.cp = session, session.cp
        self.cell, self.L, self.H, self.B, self.T = cell, layers, hidden, batch, steps
        # the ladder's model and inputs (random h0, c0 too) for this shape, timed for
        # forward + backward (cuDNN's bench reads the same config)
        self.cfg = LadderConfig(cell=cell, layers=layers, hidden=hidden, batch=batch,
                                steps=steps, backward=True, seed=seed, repeats=1, warmup=0)
        self.model = model_for(self.cfg, np.float32)
        self.x, self.h0, self.c0, self.dy = inputs_for(self.cfg, np.float32)
        self.params = self.cp.asarray(self.model.flat, dtype=self.cp.float32)
        self.built = {}
        ref = reference_outputs(cell, self.model, (self.x, self.h0, self.c0, self.dy))
        self.ref = {k: ref.get(k) for k in ("dx", "dh0", "dc0", "grads")}   # dc0: LSTM only

    def shape(self):
        return SEL.Shape(self.cell, self.L, self.H, self.H, self.B, self.T, train=True)

    def state(self, sched, units=None):
        """(run, stream, workspace, backward plan) of ``sched`` (``units``: its grid or pair
        backward kernel's units a block, PlanKey.bwd_units), built once a name."""
        if sched.name not in self.built:
            key = PlanKey(self.cell, self.T, self.B, self.H, self.H, self.L, True,
                          sched.switches, train=True, device=self.session.limits,
                          family=sched.family, backward=sched.backward, bwd_units=units)
            fplan, bplan = forward_plan(key), backward_plan(key)
            ws = self.session.workspace(bplan, self.params)
            ws.load_inputs(self.x, self.h0, self.c0)
            arrays = {"dy": self.dy, "dh_n": None}
            if "dc_n" in bplan.inputs:
                arrays["dc_n"] = None
            ws.load(**arrays)
            self.cp.cuda.Device().synchronize()
            fex = self.session.executor("graph", fplan, ws)
            bex = self.session.executor("graph", bplan, ws)

            def run():
                fex.run()
                bex.run()

            self.built[sched.name] = (run, fex.stream, ws, bplan)
        return self.built[sched.name]

    def timer(self, sched, shape, repeats):
        """The selector's timer: ``repeats`` timed runs of fwd+bwd (one warm-up the first
        time a schedule is built)."""
        fresh = sched.name not in self.built
        run, stream, _, _ = self.state(sched)
        return time_events(self.cp, run, stream, repeats, 1 if fresh else 0)

    def check(self, sched, units=None) -> dict:
        """The schedule's gradients against the float64 reference (after a run)."""
        run, stream, ws, _ = self.state(sched, units)
        run()
        stream.synchronize()
        got = {name: ws.read(name) for name, r in self.ref.items() if r is not None}
        worst = compare_all(got, self.ref, "the float64 reference", rows=self.T * self.B)
        return {"ok": True, "worst": str(worst)} if worst.ok else {"ok": False,
                                                                    "detail": str(worst)}

    def close(self):
        self.built.clear()
        self.cp.get_default_memory_pool().free_all_blocks()


def cudnn_runner(case, torch):
    """(run, check) of torch.nn's module with the same weights, autograd fwd+bwd."""
    from rnnrt.bench.cudnn import CudnnBench
    bench = CudnnBench(case.cfg, case.model, case.x, case.h0, case.c0, case.dy)
    out = bench.outputs()
    ok = compare_all(out, {n: case.ref[n] for n in ("dx", "grads")}, "the float64 reference",
                     rows=case.T * case.B).ok
    return bench, ok


def bench_shape(session, spec, repeats, torch, log, kinds=("grid", "cluster"),
                fwd_family=None, units=()):
    cell, L, H, B, T = spec
    case = Case(session, cell, L, H, B, T)
    shape = case.shape()
    fit = C.backward_fit(shape, session.limits)
    row = {"cell": cell, "layers": L, "hidden": H, "batch": B, "steps": T,
           "flops": forward_flops(cell, H, H, L, B, T) + backward_flops(cell, H, H, L, B, T),
           "pbwd_fit": fit.describe() if fit.ok else None,
           "pbwd_declined": None if fit.ok else fit.reason,
           "pbwd_prefers": C.prefers_persistent_backward(shape, session.limits)}
    if fwd_family is None:
        sel = SEL.Selector(case.timer, session.limits, cache=None, autotune=True).select(shape)

        def without(s, d):
            return tuple(c for c in C.candidates(s, d) if c.backward is None)

        sel_wo = SEL.Selector(case.timer, session.limits, cache=None, autotune=True,
                            candidates_fn=without).select(shape)
        row["auto"], row["auto_wo_pbwd"] = sel.as_dict(), sel_wo.as_dict()
        forward = sel_wo.schedule
        variants = [("auto", sel.schedule, None), ("auto_wo_pbwd", sel_wo.schedule, None)]
    else:   # no selector: the variants after that family's forward
        forward = C.persistent_schedule(fwd_family)
        row["forward"] = forward.name
        variants = []
    # each persistent backward kernel that fits, with the forward auto chose without it: what
    # calibrates the cost model that picks between them; the grid kernels also at --units
    for kind in kinds:
        for u in (None,) + (tuple(units) if kind in ("grid", "pair") else ()):
            label = f"pbwd_{kind}" + (f"_u{u}" if u else "")
            vfit = persistent_bwd_fit(cell, H, B, session.limits.props(), kind=kind,
                                      units_per_block=u)
            row[f"{label}_fit"] = vfit.describe() if vfit.ok else vfit.reason
            row[f"{label}_model_us"] = vfit.step_us() if vfit.ok else None
            if vfit.ok:
                variants.append((label, replace(
                    forward, name=f"{forward.name}+{label}", backward=kind), u))
    row["variant_labels"] = [label for label, _, _ in variants]
    fns = {}
    for label, s, u in variants:
        row[f"{label}_check"] = case.check(s, u)
        if not row[f"{label}_check"]["ok"]:
            log(f"  {label} {s.name}: REFUSED, gradients disagree: "
                f"{row[f'{label}_check']['detail']}")
            continue
        run, stream, _, bplan = case.state(s, u)
        row[f"{label}_backward_fit"], row[f"{label}_backward_fallback"] = (bplan.fit,
                                                                           bplan.fallback)
        fns[label] = (run, stream)
    bench = None
    if torch is not None:
        bench, ok = cudnn_runner(case, torch)
        row["cudnn_check_ok"] = ok
        fns["cudnn"] = bench.run
    # every runner warmed once more before the rounds, then timed in turn
    for name, t in time_in_turn(fns, repeats, 1, cp=session.cp, torch=torch).items():
        row[f"{name}_ms"], row[f"{name}_ms_min"] = t.ms_median, t.ms_min
    if bench is not None:
        bench.close()
    case.close()
    return row


def table(rows) -> str:
    """The short table: per shape auto and auto without the persistent backward (each with
    its schedule), cuDNN, the speed-ups over cuDNN, which checks passed."""
    lines = ["", "| shape | auto (schedule) ms | auto w/o pbwd (schedule) ms | cuDNN ms | "
             "auto / cuDNN | w/o / cuDNN | pbwd variants ms | checks |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cud = r.get("cudnn_ms")
        cells = []
        for label in ("auto", "auto_wo_pbwd"):
            ms = r.get(f"{label}_ms")
            cells.append(f"{ms:.3f} ({r[label]['schedule']})" if ms else
                         "not run" if label not in r else "refused")
        ratios = [f"{cud / r[f'{k}_ms']:.2f}x" if r.get(f"{k}_ms") and cud else "-"
                  for k in ("auto", "auto_wo_pbwd")]
        pbwd = [k for k in r.get("variant_labels", ["pbwd_grid", "pbwd_cluster"])
                if k.startswith("pbwd_")]
        checks = ",".join(k for k in ["auto", "auto_wo_pbwd"] + pbwd
                          if r.get(f"{k}_check", {}).get("ok")) or "none"
        variants = " ".join(f"{k[5:]} {r[f'{k}_ms']:.3f}"
                            + (f" ({cud / r[f'{k}_ms']:.2f}x)" if cud else "")
                            for k in pbwd if r.get(f"{k}_ms"))
        lines.append(f"| {r['cell']} L{r['layers']} H{r['hidden']} B{r['batch']} "
                     f"T{r['steps']} | {cells[0]} | {cells[1]} | "
                     f"{f'{cud:.3f}' if cud else '-'} | {ratios[0]} | {ratios[1]} | "
                     f"{variants or '-'} | "
                     f"{checks} ok{'' if r.get('cudnn_check_ok', True) else ', cuDNN off'} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="3 repeats, T 50 for the two largest shapes")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 10)")
    ap.add_argument("--out", default=None, help="folder (default experiments/results/kernels)")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--shapes", default=None,
                    help="cell:layers:hidden:batch[:steps], comma-separated (default: the list "
                         "in the docstring)")
    ap.add_argument("--kinds", default="grid,cluster",
                    help="the persistent backward kernels timed each (grid, cluster, pair)")
    ap.add_argument("--fwd-family", default=None,
                    help="skip the selector: the --kinds after this persistent forward family")
    ap.add_argument("--units", default="",
                    help="the grid and pair kernels also at these units a block, e.g. 4,8")
    a = ap.parse_args(argv)
    units = tuple(int(u) for u in a.units.split(",") if u)
    kinds = tuple(k for k in a.kinds.split(",") if k)
    for k in kinds:
        if k not in ("grid", "cluster", "pair"):
            ap.error(f"--kinds: {k!r} is not grid, cluster or pair")
    specs = SHAPES
    if a.shapes:
        specs = []
        for spec in a.shapes.split(","):
            f = spec.split(":")
            if len(f) not in (4, 5):
                ap.error(f"--shapes: {spec!r} is not cell:layers:hidden:batch[:steps]")
            specs.append((f[0], *map(int, f[1:4]), int(f[4]) if len(f) == 5 else 100))
    repeats = a.repeats or (3 if a.quick else 10)
    session = GpuSession()
    torch = None
    if not a.no_cudnn:
        import torch
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    shapes = [(c, L, H, B, 50 if a.quick and H * B * L >= 100_000 else T)
              for c, L, H, B, T in specs]
    print("fp32, TF32 off (rnnrt: cuBLAS default math; cuDNN: allow_tf32 False); graph "
          f"executor; median of {repeats} rounds, rnnrt and cuDNN in turn", flush=True)
    rows = []
    for spec in shapes:
        print(f"{spec[0]} L{spec[1]} H{spec[2]} B{spec[3]} T{spec[4]} ...", flush=True)
        rows.append(bench_shape(session, spec, repeats, torch,
                                lambda m: print(m, flush=True), kinds, a.fwd_family, units))
    rec = {"kind": "persistent-bwd-bench", "created": now_iso(), "command": " ".join(sys.argv),
           "device": session.info, "versions": versions(session.cp), "tf32": False,
           "repeats": repeats, "quick": a.quick, "rows": rows}
    path = record_path("kernels", "persistent-bwd-bench", session.info["device"], rec["created"])
    if a.out is not None:
        path = Path(a.out) / path.name
    print(f"record: {write_json(rec, path)}")
    print(table(rows))
    session.close()


if __name__ == "__main__":
    main()
