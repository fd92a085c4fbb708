"""The stack backward plan (plan/backward_stack.py: PlanKey.backward 'stack', or 'persistent'
after a stack forward) on the CPU: with and without bias, with accumulate, the NumPy
executor's forward then backward (the stack kernels' twins) give the float64 reference
gradients (dx, dh0, dc0, every weight and bias; outputs poisoned first) in program order and
random interleavings, race-free; a float32 workspace is within fp32 tolerance; the schedule
is one launch, then each layer's weight GEMMs after it on its own stream; a planted missing
dependency is a race the checker finds; where the forward does not run the stack kernel
'stack' falls back to the per-step backward and says why, 'persistent' keeps the per-layer
kernels; the selector's candidates include it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rnnrt.check import FP32_ATOL, FP32_RTOL, reduction_atol
from rnnrt.exec.racecheck import find_races, vector_clocks
from rnnrt.kernels.choice import candidates, choose_persistent_backward
from rnnrt.kernels.selector import Shape
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.stack import STACK_KERNEL
from rnnrt.kernels.stack_bwd import STACK_BWD_KERNEL
from rnnrt.plan import PlanKey, forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Gemm, Kernel
from rnnrt.plan.schedule import Task, schedule
from rnnrt.plan.switches import ladder
from testkit import bwd_plan_case, check_bwd_key, check_bwd_plan, run_bwd_plan

T, B, H = 5, 6, 64
SHAPE = (T, B, H, H)   # (T, B, I, H): the stack kernels need input size = hidden
# a device without clusters: the per-layer fit is the grid kernel, so the stack is considered
SM80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
SW = ladder(input_batch=2)[-1].switches   # every switch of the paper, with 'persistent'


def key_of(layers, bias=True, backward="stack", batch=B, family="stack", sw=SW, **kw):
    return PlanKey("lstm", T, batch, H, H, layers, bias, sw, train=True, device=SM80,
                   backward=backward, family=family, **kw)


def kernels_of(plan):
    return [op.name for op in plan.ops if isinstance(op, Kernel)]


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("backward", ["stack", "persistent"])
def test_stack_backward_gives_reference_gradients(layers, backward):
    case = bwd_plan_case("lstm", layers, seed=layers, shape=SHAPE)
    key = key_of(layers, backward=backward)
    plan = check_bwd_key(key, case, f"L{layers} {backward}", always_random=True)
    assert kernels_of(plan) == [STACK_BWD_KERNEL] and plan.fallback is None
    assert plan.fit.startswith("stack backward lstm"), plan.fit
    assert kernels_of(forward_plan(key)) == [STACK_KERNEL]


def test_no_bias_accumulate_and_no_dx():
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 2, bias=False, seed=2,
                                                      shape=SHAPE)
    key = key_of(2, bias=False)
    check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in, "random", 0), layout, ref, "nobias")
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 2, seed=3, shape=SHAPE)
    key = key_of(2)
    ws = run_bwd_plan(key, flat, fwd_in, bwd_in, accumulate=True)
    run_bwd_plan(key, flat, fwd_in, bwd_in, accumulate=True, ws=ws)
    check_bwd_plan(ws, layout, ref, "accumulated twice", scale=2.0)
    plan = backward_plan(key, need_dx=False)
    assert "dx" not in plan.outputs and not find_races(plan)
    assert plan.gemm_flops() < backward_plan(key).gemm_flops()


def test_float32_workspace_within_fp32_tolerance():
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 2, seed=5, shape=SHAPE)
    ws = run_bwd_plan(key_of(2), flat, fwd_in, bwd_in, dtype=np.float32)
    check_bwd_plan(ws, layout, ref, "float32", atol=reduction_atol(T * B), rtol=FP32_RTOL)


def test_schedule_one_launch_then_the_weight_gemms():
    L = 3
    plan = backward_plan(key_of(L))
    c = plan.counts()
    assert c["kernel:persistent"] == 1 and c["gemm:dx"] == 0 and c["gemm:dh"] == 0
    assert c["gemm:dw"] == 2 * L and c["gemm:db"] == 2 * L and c["kernel:pointwise"] == 0
    assert plan.buffer("bsync").role == "sync" and plan.buffer("dgx").dtype == "store"
    # no transposed weights: the stack backward reads the params (the per-step one wT / rT)
    names = {b.name for b in plan.buffers}
    assert not any(n.startswith(("wT", "rT", "dhr", "dc1", "dpart")) for n in names), names
    assert any(n.startswith("wT") for n in (b.name for b in
                                           backward_plan(key_of(L, backward=None)).buffers))
    launch = next(i for i, op in enumerate(plan.ops) if isinstance(op, Kernel))
    clocks = vector_clocks(plan)
    s, pos, _ = clocks[launch]
    gemms = [i for i, op in enumerate(plan.ops) if isinstance(op, Gemm)]
    assert all(clocks[i][2][s] >= pos for i in gemms)               # after the launch
    assert len({plan.ops[i].stream for i in gemms}) == L            # a stream a layer
    # the FLOP count is the per-step schedule's (dh and dx inside the kernel counted)
    assert plan.gemm_flops() == backward_plan(key_of(L, backward=None)).gemm_flops()
    op = plan.ops[launch]
    assert op.launch[0] == (L * H // 16, 1, 1) and op.launch[1] == (256, 1, 1)


def test_a_missing_dependency_is_a_race():
    """The weight GEMMs planted without their wait on the launch: the race checker must
    name the dg they read while the launch writes it."""
    from rnnrt.plan.backward_stack import StackBackwardBuilder
    key = key_of(2)
    builder = StackBackwardBuilder(key, False, choose_persistent_backward(key))
    tasks = builder.tasks()
    for t in tasks:
        if t.name[0] == "wgrad":
            t.deps = []
    ops, nev = schedule(tasks)
    plan = dataclasses.replace(backward_plan(key), ops=tuple(ops), num_events=nev)
    races = find_races(plan)
    assert races and any(r.buf == "dgx" for r in races), [r.describe(plan) for r in races]
    assert isinstance(tasks[0], Task)


def test_falls_back_where_the_forward_is_not_the_stack_kernel():
    # batch 16: choose_persistent's rule takes the grid kernel (the stack wants batch > 16)
    key = key_of(2, batch=16, family=None)
    assert STACK_KERNEL not in kernels_of(forward_plan(key))
    plan = backward_plan(key)
    assert STACK_BWD_KERNEL not in kernels_of(plan) and plan.counts()["kernel:persistent"] == 0
    assert "stack backward declined" in plan.fallback
    assert "does not run the stack kernel" in plan.fallback
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 2, seed=6,
                                                      shape=(T, 16, H, H))
    check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in), layout, ref, "fallback")
    # 'persistent' there: the per-layer kernel, as before
    p = backward_plan(key_of(2, batch=16, family=None, backward="persistent"))
    assert {n for n in kernels_of(p)} == {"lstm_persistent_bwd"}, kernels_of(p)


def test_the_selector_times_it_against_the_per_step_backward():
    """At the paper's shape the candidates hold 'stack' (the per-step backward after the
    stack forward) and 'stack+pbwd', whose backward is now the stack backward."""
    shape = Shape("lstm", 4, 512, 512, 64, 100, train=True)
    names = [c.name for c in candidates(shape, H100_SXM)]
    assert "stack" in names and "stack+pbwd" in names, names
    pbwd = next(c for c in candidates(shape, H100_SXM) if c.name == "stack+pbwd")
    key = PlanKey("lstm", 100, 64, 512, 512, 4, True, pbwd.switches, train=True,
                  device=H100_SXM, family=pbwd.family, backward=pbwd.backward)
    choice = choose_persistent_backward(key)
    assert choice.stack is not None and choice.stack.blocks == 128, choice.describe()
