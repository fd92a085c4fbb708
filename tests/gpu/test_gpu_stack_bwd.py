"""GPU tests of the stack backward (marker gpu; skipped without a GPU): the selector's
'stack' schedule with PlanKey.backward 'stack' (and 'persistent', which takes it after a
stack forward): the stack forward, then every layer's backward chain in one launch of
lstm_persistent_stack_bwd, then the weight GEMMs, on the GPU executors (eager and a CUDA
graph) gives the float64 reference's dx, dh0, dc0 and every weight and bias gradient in fp32
tolerance at the paper's layer (H 512 B 64, four layers), at H 256 / 384, an odd batch and a
batch below 8; every backward buffer poisoned with NaN before each run, the graph's capture
runs nothing; two runs give bitwise-equal gradients (no atomics in any sum, one sync buffer
reset by the kernel). Its fit against the occupancy API: tests/gpu/test_gpu_stack.py.

Run on the device: pytest -m gpu tests/gpu/test_gpu_stack_bwd.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import FP32_ATOL, FP32_RTOL, reduction_atol  # noqa: E402
from rnnrt.kernels import stack_bwd  # noqa: E402
from rnnrt.kernels.choice import persistent_schedule  # noqa: E402
from rnnrt.plan import forward_plan  # noqa: E402
from rnnrt.plan.backward import backward_plan  # noqa: E402
from rnnrt.plan.ops import Kernel  # noqa: E402
from testkit import check_bwd_outputs, run_gpu_backward_case  # noqa: E402
from testkit import gpu_backward_case as case  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)

# (T, B, H, L), I = H: the paper's layer (four of them), H 256 / 384, an odd batch, B < 8
SHAPES = [(10, 64, 512, 4), (9, 48, 256, 3), (6, 17, 384, 2), (7, 5, 256, 2)]


def key_of(T, B, H, L, backward="stack"):
    sched = persistent_schedule("stack")   # the selector's candidate: stack forward + ...
    return PlanKey("lstm", T, B, H, H, L, True, sched.switches, train=True, family="stack",
                   backward=backward)


def run_twice(cp, ctx, key, executor, data):
    """The plans are the stack kernels' (one forward launch, one backward launch, no
    fallback); two backward runs on re-poisoned buffers. -> the two runs' outputs."""
    fplan, bplan = forward_plan(key), backward_plan(key)
    assert bplan.fallback is None, bplan.fallback
    launches = [op.name for op in bplan.ops if isinstance(op, Kernel)]
    assert launches == [stack_bwd.STACK_BWD_KERNEL], (launches, bplan.fit)
    assert [op.name for op in fplan.ops if isinstance(op, Kernel)] == \
        ["lstm_persistent_stack_fwd"], fplan.fit
    return run_gpu_backward_case(cp, ctx, key, executor, data)


@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}B{b}H{h}L{n}" for t, b, h, n in SHAPES])
def test_stack_backward_gives_reference_gradients_bitwise_repeatable(cp, ctx, shape, executor):
    T, B, H, L = shape
    data = case("lstm", L, T, B, H, H, seed=L)
    first, second = run_twice(cp, ctx, key_of(T, B, H, L), executor, data)
    # weight gradients sum over T*B rows: see check.reduction_atol
    check_bwd_outputs(first, data[0], data[4], f"stack bwd {shape} {executor}", FP32_ATOL,
                      FP32_RTOL, reduction_atol(T * B))
    for name, a in first.items():   # deterministic: the same bits
        np.testing.assert_array_equal(second[name], a, err_msg=f"{name} differs between runs")


def test_persistent_takes_it_after_a_stack_forward(cp, ctx):
    T, B, H, L = 12, 64, 256, 4
    data = case("lstm", L, T, B, H, H, seed=7)
    first, _ = run_twice(cp, ctx, key_of(T, B, H, L, backward="persistent"), "graph", data)
    check_bwd_outputs(first, data[0], data[4], "stack+pbwd", FP32_ATOL, FP32_RTOL,
                      reduction_atol(T * B))



def test_stack_backward_at_the_paper_shape_all_steps(cp, ctx):
    """The paper's whole shape (T 100, B 64, H 512, four layers: what the selector runs it
    for), graph executor: the reference gradients, bitwise repeatable (~16 s on the H100,
    most of it the float64 reference)."""
    T, B, H, L = 100, 64, 512, 4
    data = case("lstm", L, T, B, H, H, seed=4)
    first, second = run_twice(cp, ctx, key_of(T, B, H, L), "graph", data)
    check_bwd_outputs(first, data[0], data[4], "stack bwd paper shape", FP32_ATOL, FP32_RTOL,
                      reduction_atol(T * B))
    for name, a in first.items():
        np.testing.assert_array_equal(second[name], a, err_msg=f"{name} differs between runs")
