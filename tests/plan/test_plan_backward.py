"""Backward plans on the CPU: every switch combination x cell gives the reference gradients
(dx, dh0, dc0, every parameter) in program order and random interleavings, is statically
race-free, accumulates with beta = 1, and a removed wait is caught."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rnnrt.exec.workspace import Workspace
from rnnrt.kernels.limits import H100_SXM
from rnnrt.plan import forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Gemm
from rnnrt.plan.switches import ALL, PAPER_RUNGS, all_combinations, ladder
from testkit import BWD_PLAN_SHAPE
from testkit import bwd_plan_case as make_case
from testkit import check_bwd_plan as check
from testkit import assert_missing_wait_caught, check_bwd_key
from testkit import cpu_plan_key as PlanKey   # CPU plans are built for the lent H100's limits
from testkit import run_bwd_plan as run

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
T, B, I, H = BWD_PLAN_SHAPE


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_every_combination_gives_reference_gradients(cell, layers):
    case = make_case(cell, layers)
    for sw in all_combinations():
        check_bwd_key(PlanKey(cell, T, B, I, H, layers, True, sw, train=True), case,
                      sw.label())


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_no_bias(cell):
    layout, flat, fwd_in, bwd_in, ref = make_case(cell, 2, bias=False, seed=2)
    for rung in ladder(input_batch=ALL):
        key = PlanKey(cell, T, B, I, H, 2, False, rung.switches, train=True)
        check(run(key, flat, fwd_in, bwd_in, "random", 0), layout, ref, rung.name)


def test_accumulate_adds_into_grads():
    layout, flat, fwd_in, bwd_in, ref = make_case("gru", 2, seed=3)
    key = PlanKey("gru", T, B, I, H, 2, True, ladder()[PAPER_RUNGS - 1].switches, train=True)
    ws = Workspace(backward_plan(key, True), np, np.float64, flat)   # grads start at zero
    run(key, flat, fwd_in, bwd_in, accumulate=True, ws=ws)
    run(key, flat, fwd_in, bwd_in, accumulate=True, ws=ws)
    check(ws, layout, ref, "accumulated twice", scale=2.0)
    assert {op.beta for op in backward_plan(key, True).ops
            if isinstance(op, Gemm) and op.kind in ("dw", "db")} == {1.0}
    assert {op.beta for op in backward_plan(key, False).ops
            if isinstance(op, Gemm) and op.kind in ("dw", "db")} == {0.0}


@pytest.mark.parametrize("which", [0, 5, -1])
def test_a_removed_wait_is_caught_in_backward(which):
    layout, flat, fwd_in, bwd_in, ref = make_case("lstm", 3, seed=4)
    key = PlanKey("lstm", T, B, I, H, 3, True, ladder(input_batch=2)[PAPER_RUNGS - 1].switches, train=True)

    def run_and_check(broken, seed):
        check(run(key, flat, fwd_in, bwd_in, "random", seed, bwd=broken), layout, ref, "broken")

    assert_missing_wait_caught(backward_plan(key), which, run_and_check, seeds=40)


def test_backward_switches_observable():
    key = PlanKey("lstm", 12, B, I, H, 4, True, ladder(input_batch=4)[PAPER_RUNGS - 1].switches, train=True)
    plan = backward_plan(key)
    c = plan.counts()
    assert c["gemm:dw"] == 2 * 4 and c["gemm:db"] == 2 * 4     # one GEMM per weight matrix
    assert c["gemm:dx"] == 4 * 3                                # k = 4 steps per dx GEMM
    assert c["kernel:pointwise"] == 12 * 4                       # fused: one per cell
    cells = [(i, op.layer) for i, op in enumerate(plan.ops) if op.kind == "pointwise"]
    first_l2 = min(i for i, layer in cells if layer == 2)
    last_l3 = max(i for i, layer in cells if layer == 3)
    assert first_l2 < last_l3, "reverse wavefront: layer 2 starts before layer 3 ends"
    naive = backward_plan(dataclasses.replace(key, switches=ladder()[0].switches))
    assert naive.counts()["kernel:pointwise"] > 12 * 4 and len(naive.streams) == 1
    with pytest.raises(ValueError, match="train"):
        backward_plan(dataclasses.replace(key, train=False))


def test_persistent_rung_backward_keeps_the_wavefront_schedule():
    """The persistent switch changes only the forward (with the grid kernel, one input GEMM
    per layer there); the backward is the same schedule as the rung below it: chunked dx
    GEMMs, reverse wavefront."""
    rungs = ladder(input_batch=4)
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    for device, wx in ((sm80, 4), (H100_SXM, 12)):   # key: the H100 one, after
        key = PlanKey("lstm", 12, B, I, H, 4, True, rungs[PAPER_RUNGS].switches, train=True,
                      device=device)
        fwd = forward_plan(key)
        assert key.switches.persistent and fwd.counts()["gemm:wx"] == wx
        assert fwd.counts()["kernel:persistent"] == wx
    below = backward_plan(dataclasses.replace(key, switches=rungs[PAPER_RUNGS - 1].switches))
    plan = backward_plan(key)
    assert plan.counts() == below.counts() and plan.num_events == below.num_events
    assert [op.kind for op in plan.ops] == [op.kind for op in below.ops]
