"""The persistent backward plan (PlanKey.backward, plan/backward_persistent.py) on the CPU:
the grid kernel with every fused switch combination x cell x {1, 3} layers, the cluster
kernel and the cost model's pick with the fused rungs, the grid kernel in cluster pairs, give the float64 reference
gradients (dx, dh0, dc0, every weight and bias; outputs poisoned first) in program order and
random interleavings and is statically race-free; a float32 workspace is within fp32
tolerance of the reference; the schedule is one launch and one dx GEMM a layer, the launches
totally ordered; the key without it keeps the rung's per-step backward; a shape the kernel
cannot take falls back to the per-step backward and says why; bad keys are refused."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rnnrt.check import FP32_ATOL, FP32_RTOL, reduction_atol
from rnnrt.exec.racecheck import vector_clocks
from rnnrt.kernels.limits import H100_SXM
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Gemm, Kernel
from rnnrt.plan.switches import PAPER_RUNGS, Switches, all_combinations, ladder
from testkit import (BWD_PLAN_SHAPE, CELLS, bwd_plan_case, check_bwd_key, check_bwd_plan,
                     run_bwd_plan)
from testkit import cpu_plan_key as PlanKey

T, B, I, H = BWD_PLAN_SHAPE
# every fused combination of the flags (the input chunk only shapes the forward here: the
# persistent backward runs one dx GEMM a layer whatever it is)
FUSED = [sw for sw in all_combinations(input_batches=(2,)) if sw.fused]


def key_of(cell, layers, sw, bias=True, backward="grid", **kw):
    return PlanKey(cell, T, B, I, H, layers, bias, sw, train=True, backward=backward, **kw)


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_every_fused_combination_gives_reference_gradients(cell, layers):
    case = bwd_plan_case(cell, layers)
    for sw in FUSED:
        plan = check_bwd_key(key_of(cell, layers, sw), case, sw.label())
        assert plan.fallback is None and "backward" in plan.fit, plan.fit


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_the_cluster_kernel_and_the_cost_models_pick(cell, layers):
    """backward='cluster' (the cluster kernels' twins: one cluster per 4 batches) and
    'persistent' (the kernel the cost model prefers) likewise give the reference gradients,
    race-free, in program order and random interleavings, for the fused rungs."""
    case = bwd_plan_case(cell, layers, seed=7)
    for rung in ladder(input_batch=2)[3:]:
        for backward in ("cluster", "persistent"):
            plan = check_bwd_key(key_of(cell, layers, rung.switches, backward=backward), case,
                                 f"{rung.name} {backward}", seed=2, always_random=True)
            assert plan.fallback is None, plan.fallback
            kernels = {op.name for op in plan.ops if isinstance(op, Kernel)}
            if backward == "cluster":
                assert kernels == {f"{cell}_persistent_cluster_bwd"}, kernels


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_the_grid_kernel_in_cluster_pairs(cell, layers):
    """backward='pair' (the pair kernels' twins: each block's half of the gate rows, then
    half 0 + half 1) likewise, statically race-free, in program order and a random
    interleaving, one launch of the pair kernel a layer."""
    case = bwd_plan_case(cell, layers, seed=11)
    sw = ladder(input_batch=2)[PAPER_RUNGS - 1].switches
    plan = check_bwd_key(key_of(cell, layers, sw, backward="pair"), case, "pair", seed=3,
                         always_random=True)
    assert plan.fallback is None and "cluster pairs" in plan.fit, plan.fit
    launches = [op.name for op in plan.ops if isinstance(op, Kernel)]
    assert launches == [f"{cell}_persistent_pair_bwd"] * layers, launches


@pytest.mark.parametrize("cell", CELLS)
def test_no_bias_and_accumulate(cell):
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case(cell, 2, bias=False, seed=2)
    sw = ladder(input_batch=2)[PAPER_RUNGS].switches
    key = key_of(cell, 2, sw, bias=False)
    check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in, "random", 0), layout, ref, "nobias")
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case(cell, 2, seed=3)
    key = key_of(cell, 2, sw)
    ws = run_bwd_plan(key, flat, fwd_in, bwd_in, accumulate=True)
    run_bwd_plan(key, flat, fwd_in, bwd_in, accumulate=True, ws=ws)
    check_bwd_plan(ws, layout, ref, "accumulated twice", scale=2.0)


@pytest.mark.parametrize("cell", CELLS)
def test_float32_workspace_within_fp32_tolerance(cell):
    """In float32 (the GPU's arithmetic in the twins) the plan is within fp32 tolerance of
    the float64 reference, the weight gradients' absolute part growing with their T*B
    terms; the worst element is named on failure."""
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case(cell, 2, seed=5)
    key = key_of(cell, 2, ladder(input_batch=2)[PAPER_RUNGS].switches)
    ws = run_bwd_plan(key, flat.astype(np.float32),
                      *[tuple(None if a is None else a.astype(np.float32) for a in arrays)
                        for arrays in (fwd_in, bwd_in)], dtype=np.float32)
    check_bwd_plan(ws, layout, ref, "float32", atol=reduction_atol(T * B, FP32_ATOL),
                   rtol=FP32_RTOL)


def test_schedule_one_launch_and_one_dx_gemm_a_layer():
    L = 4
    sw = ladder(input_batch=2)[PAPER_RUNGS - 1].switches   # +wavefront: several streams
    plan = backward_plan(key_of("lstm", L, sw))
    c = plan.counts()
    assert c["kernel:persistent"] == L and c["gemm:dx"] == L and c["gemm:dh"] == 0
    assert c["kernel:pointwise"] == 0 and c["gemm:dw"] == 2 * L and c["gemm:db"] == 2 * L
    assert plan.buffer("bsync").role == "sync"
    launches = [i for i, op in enumerate(plan.ops) if isinstance(op, Kernel)]
    assert [plan.ops[i].layer for i in launches] == list(reversed(range(L)))
    # each launch happens after the one of the layer above it (a grid kernel needs its SMs:
    # two may never run at once), and after that layer's dx GEMM (its dhin)
    clocks = vector_clocks(plan)

    def before(a, b):
        s, pos, _ = clocks[a]
        return clocks[b][2][s] >= pos

    dx = {plan.ops[i].layer: i for i, op in enumerate(plan.ops)
          if isinstance(op, Gemm) and op.kind == "dx"}
    for upper, lower in zip(launches, launches[1:]):
        assert before(upper, lower) and before(dx[plan.ops[upper].layer], lower)
    assert plan.ops[launches[0]].launch[0][0] <= H100_SXM.sms
    # the FLOP count is the per-step schedule's (R.h inside the kernel counted)
    assert plan.gemm_flops() == backward_plan(key_of("lstm", L, sw, backward=None)).gemm_flops()


def test_without_it_the_rung_keeps_its_per_step_backward():
    """backward=None (every rung, every explicit switch set) is the per-step schedule as
    before: no persistent launch, the pointwise kernels a step."""
    for rung in ladder(input_batch=2)[3:]:
        plan = backward_plan(key_of("gru", 2, rung.switches, backward=None))
        c = plan.counts()
        assert c["kernel:persistent"] == 0 and c["kernel:pointwise"] == 2 * T
        assert plan.fallback is None


def test_a_shape_it_cannot_take_falls_back_and_says_why():
    tiny = dataclasses.replace(H100_SXM, name="tiny GPU", smem_per_block_optin=2048,
                               smem_per_sm=4096)
    key = key_of("lstm", 2, ladder(input_batch=2)[PAPER_RUNGS - 1].switches, device=tiny)
    plan = backward_plan(key)
    assert plan.counts()["kernel:persistent"] == 0
    assert "persistent backward declined on tiny GPU" in plan.fallback
    assert "shared memory" in plan.fallback and "per-step backward" in plan.fallback
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 2)
    check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in), layout, ref, "fallback")


def test_bad_keys_refused():
    sw = ladder()[PAPER_RUNGS - 1].switches
    with pytest.raises(ValueError, match="expected one of"):
        key_of("lstm", 1, sw, backward="stacked")
    with pytest.raises(ValueError, match="train is False"):
        PlanKey("lstm", T, B, I, H, 1, True, sw, train=False, backward="grid")
    with pytest.raises(ValueError, match="needs switches.fused"):
        key_of("lstm", 1, Switches(grouped=True))
    with pytest.raises(ValueError, match="device"):
        PlanKey("lstm", T, B, I, H, 1, True, sw, train=True, backward="grid", device=None)
