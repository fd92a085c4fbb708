"""The register-resident cluster backward in the persistent backward plan (PlanKey.backward
'regs', plan/backward_persistent.py over kernels/choice_backward.py's regs_backward) on the
CPU: every cell with one and three layers, one launch a layer and chunked along the reverse
wavefront (a short last chunk), after the regs forward and after the cuBLAS rung's, gives
the float64 reference gradients (dx, dh0, dc0, every weight and bias; every io and scratch
buffer poisoned) in program order and random interleavings and is statically race-free (the
registry's twin of the kernel: its emulation); the launches are the register-resident
kernel's on the cluster backward's views; the plan's fit string names it; a shape or
precision it cannot take falls back to the per-step backward and says why; the key takes a
cluster count."""
from __future__ import annotations

import pytest

from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Kernel
from rnnrt.plan.switches import Switches
from testkit import (BWD_PLAN_SHAPE, CELLS, bwd_plan_case, check_bwd_key, check_bwd_plan,
                     run_bwd_plan)
from testkit import cpu_plan_key as PlanKey

_, B, I, H = BWD_PLAN_SHAPE


def key_of(cell, layers, T, k, persistent=True, **kw):
    sw = Switches(grouped=True, streams=True, fused=True, wavefront=True,
                  persistent=persistent, input_batch=k)
    return PlanKey(cell, T, B, I, H, layers, True, sw, train=True, backward="regs",
                   family="regs" if persistent else None, **kw)


def launches(plan):
    return [op for op in plan.ops if isinstance(op, Kernel) and op.kind == "persistent"]


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_regs_backward_gives_reference_gradients(cell, layers):
    """T 5 in chunks of 2 (with three layers: chunked, the last chunk short) after the regs
    forward; one layer: one launch over all T."""
    T, k = 5, 2
    case = bwd_plan_case(cell, layers, seed=13, shape=(T, B, I, H))
    key = key_of(cell, layers, T, k)
    plan = check_bwd_key(key, case, f"{cell} L{layers} regs backward", seed=4,
                         always_random=True)
    assert plan.fallback is None, plan.fallback
    assert "register-resident" in plan.fit, plan.fit
    ops = launches(plan)
    assert {op.name for op in ops} == {f"{cell}_persistent_regs_bwd"}
    per_layer = 3 if layers > 1 else 1   # chunks [4, 5), [2, 4), [0, 2)
    assert len(ops) == layers * per_layer
    assert sorted(op.steps for op in ops if op.layer == 0) == (
        [(0, 2), (2, 4), (4, 5)] if layers > 1 else [(0, 5)])


def test_after_the_cublas_forward_and_with_a_cluster_count():
    """The key's forward need not run a persistent kernel (the backward reads the act and
    states every forward saves); bwd_clusters runs exactly that many clusters."""
    case = bwd_plan_case("gru", 2, seed=5, shape=(4, B, I, H))
    plan = check_bwd_key(key_of("gru", 2, 4, 2, persistent=False), case, "gru after cuBLAS")
    assert {op.name for op in launches(plan)} == {"gru_persistent_regs_bwd"}
    plan = backward_plan(key_of("gru", 2, 4, 2, bwd_clusters=1))
    assert all(op.launch[0][0] == 8 for op in launches(plan)), plan.fit


def test_a_shape_or_precision_it_cannot_take_falls_back_and_says_why():
    plan = backward_plan(key_of("lstm", 2, 5, 2, dtype="bfloat16"))
    assert not launches(plan)
    assert "register-resident backward declined" in plan.fallback, plan.fallback
    assert "register-resident backward runs fp32 only" in plan.fallback, plan.fallback
    T = 3
    key = PlanKey("lstm", T, B, I, 130, 1, True, Switches(grouped=True, fused=True),
                  train=True, backward="regs")   # H 130 > 128
    plan = backward_plan(key)
    assert not launches(plan) and "hidden 130 > 128" in plan.fallback, plan.fallback
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 1, shape=(T, B, I, 130))
    check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in), layout, ref, "fallback")
