"""The stack family at bfloat16 / float16: the tensor-core stack kernel
(lstm_persistent_stack_mma_fwd, kernels/stack_mma.py) in plans, without a GPU. The NumPy
executor runs its twin (the kernel's k-group sums, W and R rounded as it loads them, h
stored rounded) and must equal the rounding-aware float64 reference to float64 agreement,
forward and forward + the per-step backward or the tensor-core stack backward
(lstm_persistent_stack_mma_bwd, kernels/stack_mma_bwd.py: its twin) on what it saved, or,
where that declines, the per-layer one with the reason; the plan is one launch, race-free,
says which kernel ran, and labels x and h storage; tf32 declines the stack with the reason;
the selector's candidates follow."""
from __future__ import annotations

import dataclasses

import pytest
from test_plan_precision import check, run_plans
from testkit import bwd_plan_case, cpu_plan_key

from rnnrt.exec.racecheck import find_races
from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels import stack_mma as SM
from rnnrt.kernels import stack_mma_bwd as SMB
from rnnrt.kernels.choice_backward import stack_backward
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.mma import MMA_DTYPES
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.forward import forward_plan
from rnnrt.plan.ops import Gemm
from rnnrt.plan.switches import ladder

T, B, H, L = 4, 5, 64, 3
PERSISTENT = ladder(2)[-1].switches
assert PERSISTENT.persistent


def key_of(dtype, train=False, **kw):
    return cpu_plan_key("lstm", T, B, H, H, L, True, PERSISTENT, train=train, dtype=dtype,
                        family="stack", **kw)


def case(dtype, seed=0):
    return bwd_plan_case("lstm", L, seed=seed, shape=(T, B, H, H), dtype=dtype)


def persistent_kernels(plan) -> list[str]:
    return [op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"]


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_forward_is_one_tensor_core_stack_launch_equal_to_the_reference(dtype):
    key = key_of(dtype)
    plan = forward_plan(key)
    assert plan.fallback is None, plan.fallback
    assert persistent_kernels(plan) == [SM.STACK_MMA_KERNEL]
    assert not any(isinstance(op, Gemm) for op in plan.ops)   # W.x inside the kernel
    assert plan.fit.startswith("tensor-core stack") and "fits" in plan.fit, plan.fit
    store = {b.name for b in plan.buffers if b.dtype == "store"}
    assert {"x", "h"} <= store and not store & {"c", "act", "params"}, store
    assert not any(b.name.startswith(("wS", "rS", "wT", "rT", "wt", "ht"))
                   for b in plan.buffers), [b.name for b in plan.buffers]
    assert not find_races(plan)
    c = case(dtype, seed=3)
    check(run_plans(key, c), c, f"stack mma {dtype}")
    check(run_plans(key, c, order="random", seed=5), c, f"stack mma {dtype} random order")


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_a_batch_of_whole_groups_runs_them_side_by_side(dtype):
    """B 128: two batch groups of the tensor-core stack kernel in one launch (a row of the
    counters each); race-free; equal to the rounding-aware reference on the NumPy executor
    (program order and a random interleaving), with the tensor-core stack backward in the
    same groups ('stack'), or for 'persistent' the per-layer backward (its groups on 24 of
    132 SMs do not pay: choice_backward.grouped_stack_backward_pays, the plan says so)."""
    b = 128
    for backward in ("stack", "persistent"):
        key = cpu_plan_key("lstm", T, b, H, H, L, True, PERSISTENT, train=True, dtype=dtype,
                           family="stack", backward=backward)
        fwd, bwd = forward_plan(key), backward_plan(key)
        (op,) = [o for o in fwd.ops if getattr(o, "kind", "") == "persistent"]
        assert op.name == SM.STACK_MMA_KERNEL and dict(op.scalars)["groups"] == 2, fwd.fit
        assert next(v for v in op.outs if v.buf == "sync").rows == 2
        assert not find_races(fwd) and not find_races(bwd)
        if backward == "stack":
            (bop,) = [o for o in bwd.ops if getattr(o, "kind", "") == "persistent"]
            assert bop.name == SMB.STACK_MMA_BWD_KERNEL and dict(bop.scalars)["groups"] == 2
        else:
            assert SMB.STACK_MMA_BWD_KERNEL not in persistent_kernels(bwd)
            assert "grouped_stack_backward_pays" in (bwd.fit or ""), bwd.fit
        c = bwd_plan_case("lstm", L, seed=9, shape=(T, b, H, H), dtype=dtype)
        check(run_plans(key, c), c, f"stack mma groups {dtype} {backward}")
        check(run_plans(key, c, order="random", seed=6), c,
              f"stack mma groups {dtype} {backward} random")


@pytest.mark.parametrize("backward", [None, "persistent", "stack"])
def test_training_runs_a_backward_on_what_the_forward_saved(backward):
    """'persistent' and 'stack' take the tensor-core stack backward (one launch, every
    layer's chain; its twin on the NumPy executor), None the per-step backward: each equal
    to the reference."""
    dtype = "bfloat16"
    key = key_of(dtype, train=True, backward=backward)
    fwd, bwd = forward_plan(key), backward_plan(key)
    assert persistent_kernels(fwd) == [SM.STACK_MMA_KERNEL]
    if backward is not None:
        assert bwd.fallback is None, bwd.fallback
        assert persistent_kernels(bwd) == [SMB.STACK_MMA_BWD_KERNEL], persistent_kernels(bwd)
        assert bwd.fit.startswith("tensor-core stack backward") and "fits" in bwd.fit, bwd.fit
        store = {b.name for b in bwd.buffers if b.dtype == "store"}
        assert {"x", "h", "dgx"} <= store and "dgt" not in {b.name for b in bwd.buffers}
        # the forward transposes and copies nothing for it (it reads the params)
        assert not any(b.name.startswith(("wS", "rS", "wT", "rT")) for b in fwd.buffers)
    else:
        assert not persistent_kernels(bwd)
    assert not find_races(bwd)
    c = case(dtype, seed=4)
    check(run_plans(key, c), c, f"stack mma train backward {backward}")
    check(run_plans(key, c, order="random", seed=2), c, f"stack mma train {backward} random")


@pytest.mark.parametrize("backward", ["persistent", "stack"])
def test_where_the_pairs_decline_the_plan_says_why(backward):
    """No thread-block clusters (compute capability 8): the tensor-core stack backward
    declines; 'persistent' keeps the per-layer persistent backward with the reason in its fit
    string, 'stack' the per-step backward with the reason in its fallback; both still equal
    the reference (fp16)."""
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    key = key_of("float16", train=True, backward=backward, device=sm80)
    why = stack_backward(key)[1]
    assert "thread-block clusters" in why and "tensor-core stack backward" in why, why
    fwd, bwd = forward_plan(key), backward_plan(key)
    assert persistent_kernels(fwd) == [SM.STACK_MMA_KERNEL]
    assert SMB.STACK_MMA_BWD_KERNEL not in persistent_kernels(bwd)
    if backward == "stack":
        assert bwd.fallback and why in bwd.fallback, bwd.fallback
    else:
        assert "stack backward not used: " + why in (bwd.fit or bwd.fallback), bwd.fit
    c = case("float16", seed=6)
    check(run_plans(key, c), c, f"stack mma train, pairs declined, {backward}")


def test_tf32_declines_the_stack_with_the_reason():
    plan = forward_plan(key_of("tf32"))
    assert plan.fallback and C.STACK_TF32_REASON in plan.fallback
    assert SM.STACK_MMA_KERNEL not in persistent_kernels(plan)
    assert C.choose_persistent(key_of("float32")).stack.kernel == "lstm_persistent_stack_fwd"


def test_candidates_time_the_tensor_core_stack_at_16_bits():
    base = dict(cell="lstm", layers=4, input_size=512, hidden=512, batch=64, steps=100)
    for dtype in ("bfloat16", "float16"):
        shape = SEL.Shape(**base, dtype=dtype)
        assert "stack" in C.fitting_families(shape, H100_SXM)
        assert "stack" in [s.name for s in C.candidates(shape, H100_SXM)]
    tf32 = SEL.Shape(**base, dtype="tf32")
    assert "stack" not in C.fitting_families(tf32, H100_SXM)
    # the auto rules take it where the per-layer fit is the grid kernel (no clusters)
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    k = cpu_plan_key("lstm", 100, 64, 512, 512, 4, True, PERSISTENT, dtype="bfloat16",
                     device=sm80)
    ch = C.choose_persistent(k)
    assert ch.family == "stack" and ch.stack.kernel == SM.STACK_MMA_KERNEL, ch.describe()
    assert ch.stack.smem_bytes == SM.stack_mma_smem_bytes(512)
