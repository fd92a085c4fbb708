"""Recompute instead of store (PlanKey.recompute, plan/recompute.py): the backward remakes
the saved gates before its chain. Checked on the NumPy executor with the gates POISONED
between the passes (as a chunk state that shares them finds them): every rung, every
persistent backward and the stack backward give the reference gradients; the same poison
without recompute reaches the gradients (the check is not vacuous); a backward task that
does not wait for the recompute is a race."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from testkit import BWD_PLAN_SHAPE, CELLS, bwd_plan_case, check_bwd_plan, run_bwd_plan
from testkit import cpu_plan_key as PlanKey

from rnnrt.exec import numpy_exec
from rnnrt.exec.racecheck import find_races
from rnnrt.exec.workspace import Workspace
from rnnrt.plan import forward_plan
from rnnrt.plan import recompute as rc
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Gemm, Kernel
from rnnrt.plan.switches import ladder

T, B, I, H = BWD_PLAN_SHAPE
PAPER = ladder(input_batch=2)[-1].switches


def run_poisoned(key, case, order="program", seed=None, poison=None):
    """Forward, then NaN into ``poison`` (default: the buffers the backward recomputes),
    then backward, on the NumPy executor (io and scratch poisoned first). -> workspace."""
    layout, flat, fwd_in, bwd_in, ref = case
    fwd, bwd = forward_plan(key), backward_plan(key)
    ws = Workspace(bwd, np, np.float64, flat)
    ws.poison(roles=("io", "scratch"))
    ws.load_inputs(*fwd_in)
    numpy_exec.run(fwd, ws, order=order, seed=seed)
    for name in (rc.recomputed(bwd) if poison is None else poison):
        ws.bufs[name][...] = np.nan
    dy, dhn, dcn = bwd_in
    ws.load(**{"dy": dy, "dh_n": dhn, **({"dc_n": dcn} if "dc_n" in bwd.inputs else {})})
    numpy_exec.run(bwd, ws, order=order, seed=seed)
    return ws


def check_recompute(key, case, what, seed=1):
    plan = backward_plan(key)
    races = find_races(plan)
    assert not races, f"{what}: " + races[0].describe(plan)
    layout, ref = case[0], case[4]
    check_bwd_plan(run_poisoned(key, case), layout, ref, what)
    check_bwd_plan(run_poisoned(key, case, "random", seed), layout, ref, f"{what} random")
    return plan


@pytest.mark.parametrize("cell", CELLS)
def test_every_rung_recomputes_the_gates(cell):
    case = bwd_plan_case(cell, 2, seed=3)
    for rung in ladder(input_batch=2):
        key = PlanKey(cell, T, B, I, H, 2, True, rung.switches, train=True, recompute=True)
        plan = check_recompute(key, case, f"{cell} {rung.name}")
        ops = [op for op in plan.ops if getattr(op, "kind", None) == rc.RECOMPUTE_KIND]
        if cell in ("lstm", "gru"):   # per layer two GEMMs over all T*B rows, one launch
            assert rc.recomputed(plan) == {"act0", "act1"}
            assert [type(op) for op in ops] == [Gemm, Gemm, Kernel] * 2
            assert all(op.steps == (0, T) for op in ops)
            assert [op.layer for op in ops[::3]] == [1, 0]   # the top layer's chain first
            assert all(op.rows == T * B for op in ops if isinstance(op, Kernel))
        else:   # an RNN saves no gates: nothing to remake, the plan as without
            assert not ops and not rc.recomputed(plan)
            plain = backward_plan(dataclasses.replace(key, recompute=False))
            assert plan.ops == plain.ops


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_recompute_in_pieces_of_steps(monkeypatch, cell):
    """RECOMPUTE_STEPS 2 (T 5: pieces of 2, 2, 1 a layer): the same gradients, a scratch
    of 2 steps' rows, the pieces in a row on one stream, top layer first."""
    monkeypatch.setattr(rc, "RECOMPUTE_STEPS", 2)
    backward_plan.cache_clear()
    try:
        key = PlanKey(cell, T, B, I, H, 2, True, PAPER, train=True, recompute=True)
        plan = check_recompute(key, bwd_plan_case(cell, 2, seed=7), f"{cell} pieces")
        ops = [op for op in plan.ops if getattr(op, "kind", None) == rc.RECOMPUTE_KIND]
        steps = [(op.layer, op.steps) for op in ops if isinstance(op, Kernel)]
        assert steps == [(lyr, s) for lyr in (1, 0) for s in ((0, 2), (2, 4), (4, 5))]
        assert len({op.stream for op in ops}) == 1
        size = {b.name: b.size for b in plan.buffers}
        gates = 4 if cell == "lstm" else 3
        assert size["rgx"] == size["rgh"] == 2 * B * gates * H and size["rh"] == 2 * B * H
    finally:
        backward_plan.cache_clear()


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("bwd", ["grid", "pair", "cluster", "regs", "persistent"])
def test_persistent_backwards_recompute(cell, bwd):
    case = bwd_plan_case(cell, 2, seed=4)
    key = PlanKey(cell, T, B, I, H, 2, True, PAPER, train=True, backward=bwd, recompute=True)
    plan = check_recompute(key, case, f"{cell} {bwd}")
    assert plan.fallback is None, plan.fallback


def test_the_stack_backward_recomputes_every_layers_gates():
    from rnnrt.kernels.limits import H100_SXM
    hs = 64   # the stack kernels: input size = hidden
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    case = bwd_plan_case("lstm", 2, seed=2, shape=(T, 6, hs, hs))
    for dev in (sm80, H100_SXM):
        key = PlanKey("lstm", T, 6, hs, hs, 2, True, PAPER, train=True, device=dev,
                      backward="stack", family="stack", recompute=True)
        plan = check_recompute(key, case, f"stack {dev.name}")
        assert plan.fallback is None, plan.fallback
        assert rc.recomputed(plan) == {"act"}   # one buffer, every layer's part remade


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_poison_reaches_a_backward_that_does_not_recompute(cell):
    case = bwd_plan_case(cell, 2, seed=5)
    key = PlanKey(cell, T, B, I, H, 2, True, PAPER, train=True)
    ws = run_poisoned(key, case, poison=("act0", "act1"))
    assert np.isnan(ws.read("grads")).any()


def test_a_task_that_does_not_wait_for_the_recompute_is_a_race(monkeypatch):
    """The recompute on a stream of its own (layer 0's input stream) without
    after_recompute's waits: the chain reads the gates while the recompute writes them, and
    the race checker reports it. (On the top layer's recurrence stream, where it runs, the
    chain's own order covers it too; the waits make it hold on any stream.)"""
    import rnnrt.plan.backward as bp
    real = bp.recompute_tasks

    def elsewhere(b):
        s = b.inp(0)
        return [dataclasses.replace(t, stream=s, ops=[dataclasses.replace(op, stream=s)
                                                      for op in t.ops]) for t in real(b)]
    monkeypatch.setattr(bp, "recompute_tasks", elsewhere)
    backward_plan.cache_clear()
    try:
        key = PlanKey("lstm", T, B, I, H, 2, True, PAPER, train=True, recompute=True)
        assert not find_races(bp.BackwardBuilder(key, False).build())   # with the waits
        monkeypatch.setattr(bp, "after_recompute", lambda tasks, pro: pro + tasks)
        races = find_races(bp.BackwardBuilder(key, False).build())
        assert races and any(r.buf.startswith("act") for r in races), races[:1]
    finally:
        backward_plan.cache_clear()


def test_recompute_costs_the_forwards_gemm_flops():
    from rnnrt.cells import backward_flops, forward_flops
    for cell in ("lstm", "gru"):
        key = PlanKey(cell, T, B, I, H, 2, True, PAPER, train=True, recompute=True)
        assert backward_plan(key).gemm_flops() == (backward_flops(cell, I, H, 2, B, T)
                                                   + forward_flops(cell, I, H, 2, B, T))


@pytest.mark.parametrize("kw, words", [
    (dict(recompute=1), "PlanKey.recompute: expected a bool"),
    (dict(train=False, recompute=True), "train is False"),
    (dict(recompute=True, dtype="bfloat16"), "fp32 storage only"),
    (dict(recompute=True, batch_sizes=(B,) * (T - 1) + (1,)), "fixed-length keys only"),
])
def test_bad_recompute_refused(kw, words):
    args = {"train": True, **kw}
    with pytest.raises(ValueError, match=words):
        PlanKey("lstm", T, B, I, H, 2, True, PAPER if "batch_sizes" not in kw
                else ladder()[4].switches, **args)


def test_run_bwd_plan_still_poisons_scratch_the_recompute_uses():
    """The recompute's scratch (rgx, rgh, rh, rc) is poisoned like any scratch: a read of
    an element it did not write would show as NaN (run_bwd_plan's usual path)."""
    key = PlanKey("lstm", T, B, I, H, 1, True, PAPER, train=True, recompute=True)
    case = bwd_plan_case("lstm", 1, seed=6)
    plan = backward_plan(key)
    assert {"rgx", "rgh", "rh", "rc"} <= {b.name for b in plan.buffers if b.role == "scratch"}
    check_bwd_plan(run_bwd_plan(key, case[1], case[2], case[3]), case[0], case[4], "lstm L1")
