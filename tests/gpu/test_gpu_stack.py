"""GPU tests of the stack kernels (marker gpu; skipped without a GPU): the +persistent rung's
plan at shapes where it takes the LSTM stack kernel (every layer in one launch, W.x inside),
and the GRU stack kernel where a key names family 'stack', eager and captured into a CUDA
graph, against the float64 reference in fp32 tolerance on outputs poisoned with NaN, twice
in a row on one sync buffer; a GRU training pass (the stack forward, the per-step backward
after it) against the reference gradients; both cells in batch groups (B over 64: several
stacks side by side in the launch), forward and a training pass; the fits (and the stack backward's,
tests/gpu/test_gpu_stack_bwd.py) agree with the occupancy API.
Run on the device: pytest -m gpu tests/gpu/test_gpu_stack.py
"""
from __future__ import annotations

import functools

import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.kernels import stack, stack_bwd  # noqa: E402
from rnnrt.plan import forward_plan  # noqa: E402
from rnnrt.plan.ops import Kernel  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, reduction_atol  # noqa: E402
from testkit import check_bwd_outputs, run_gpu_backward_case  # noqa: E402
from testkit import gpu_backward_case  # noqa: E402
from testkit import gpu_forward_case as case  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import run_gpu_forward_case as run_case  # noqa: E402

SHAPES = [(9, 48, 256, 3), (5, 64, 384, 2), (4, 17, 512, 4)]   # (T, B, H, L), I = H


@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}B{b}H{h}L{n}" for t, b, h, n in SHAPES])
def test_stack_plan_matches_reference(cp, ctx, shape, executor):
    T, B, H, L = shape
    key = PlanKey("lstm", T, B, H, H, L, True, ladder()[-1].switches)
    plan = forward_plan(key)
    names = {op.name for op in plan.ops if isinstance(op, Kernel)}
    assert names == {stack.STACK_KERNEL}, plan.fit
    run_case(cp, ctx, key, executor, case("lstm", L, T, B, H, H))


@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}B{b}H{h}L{n}" for t, b, h, n in SHAPES])
def test_gru_stack_plan_matches_reference(cp, ctx, shape, executor):
    """The GRU stack kernel, its family named (the rules choose it past B 16 as LSTM's)."""
    T, B, H, L = shape
    key = PlanKey("gru", T, B, H, H, L, True, ladder()[-1].switches, family="stack")
    plan = forward_plan(key)
    names = {op.name for op in plan.ops if isinstance(op, Kernel)}
    assert names == {stack.STACK_KERNELS["gru"]}, plan.fit
    run_case(cp, ctx, key, executor, case("gru", L, T, B, H, H))


def test_gru_stack_training_gives_reference_gradients(cp, ctx):
    """The GRU stack forward, then the per-step backward reading what it saved (act: r, z,
    n, hn; h), twice on re-poisoned buffers."""
    T, B, H, L = 7, 40, 256, 3
    data = gpu_backward_case("gru", L, T, B, H, H, seed=3)
    key = PlanKey("gru", T, B, H, H, L, True, ladder()[-1].switches, train=True,
                  family="stack")
    assert stack.STACK_KERNELS["gru"] in {op.name for op in forward_plan(key).ops
                                          if isinstance(op, Kernel)}
    for i, out in enumerate(run_gpu_backward_case(cp, ctx, key, "graph", data)):
        check_bwd_outputs(out, data[0], data[4], f"gru stack training run {i}", FP32_ATOL,
                          FP32_RTOL, reduction_atol(T * B))


# batch groups: B over 64 as ceil(B / 64) stacks side by side in the launch (the last group
# of 100 and of 200 on the 32-batch path; 256: four full groups at H 128)
GROUPED = [(6, 100, 256, 2), (5, 200, 128, 3), (4, 256, 128, 4)]   # (T, B, H, L)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("shape", GROUPED, ids=[f"T{t}B{b}H{h}L{n}" for t, b, h, n in GROUPED])
def test_stack_plan_in_batch_groups_matches_reference(cp, ctx, shape, executor, cell):
    T, B, H, L = shape
    key = PlanKey(cell, T, B, H, H, L, True, ladder()[-1].switches, family="stack")
    plan = forward_plan(key)
    (op,) = [o for o in plan.ops if isinstance(o, Kernel)]
    assert op.name == stack.STACK_KERNELS[cell], plan.fit
    assert dict(op.scalars)["groups"] == -(-B // 64), plan.fit
    run_case(cp, ctx, key, executor, case(cell, L, T, B, H, H))


def test_stack_training_in_batch_groups_gives_reference_gradients(cp, ctx):
    """The LSTM stack forward in two batch groups, the per-step backward after it, twice on
    re-poisoned buffers."""
    T, B, H, L = 6, 128, 256, 3
    data = gpu_backward_case("lstm", L, T, B, H, H, seed=5)
    key = PlanKey("lstm", T, B, H, H, L, True, ladder()[-1].switches, train=True,
                  family="stack")
    assert "2 batch groups" in forward_plan(key).fit
    for i, out in enumerate(run_gpu_backward_case(cp, ctx, key, "graph", data)):
        check_bwd_outputs(out, data[0], data[4], f"lstm stack groups training run {i}",
                          FP32_ATOL, FP32_RTOL, reduction_atol(T * B))


# the stack kernel's fit and registers, and its backward twin's (stack_bwd.py)
FITS = [(stack.stack_fit, stack.PS_REGS), (stack_bwd.stack_bwd_fit, stack_bwd.SB_REGS),
        (functools.partial(stack_bwd.stack_bwd_fit, pairs=False), stack_bwd.SB_REGS)]


@pytest.mark.parametrize("fit_of, regs", FITS, ids=["forward", "backward", "backward-single"])
def test_stack_fit_agrees_with_the_occupancy_api(cp, fit_of, regs):
    """Every fit that says ok is co-resident by the driver's count; the kernel as NVRTC
    builds it uses no more registers than the fit assumes and does not spill."""
    from rnnrt.kernels.library import KernelLibrary
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    lib, sms, checked = KernelLibrary(), props["multiProcessorCount"], 0
    cells = ("lstm", "gru")   # (GRU's backward: the one-block kernel, no pairs)
    for (H, L), cell in ((hl, c) for hl in ((256, 4), (512, 4), (512, 2), (384, 3))
                         for c in cells):
        fit = fit_of(cell, H, 64, L, H, props)
        assert fit.ok, fit.reason
        raw = lib.with_shared(fit.kernel, fit.smem_bytes)
        attrs = raw.attributes
        assert attrs["num_regs"] <= regs and attrs["local_size_bytes"] == 0, attrs
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            raw.kernel.ptr, fit.threads, fit.smem_bytes)
        assert per_sm >= 1 and fit.blocks <= sms * per_sm, fit.describe()
        if getattr(fit, "pair", False):   # the stack backward's pairs: all resident at once
            from rnnrt.kernels.occupancy import driver_max_active_clusters
            pairs = driver_max_active_clusters(raw, fit.threads, fit.smem_bytes, cluster=2)
            assert fit.blocks // 2 <= pairs, (fit.describe(), pairs)
            # the fit's budget, (SMs - PAIR_SM_SLACK) / 2, within the driver's count
            assert (sms - stack_bwd.PAIR_SM_SLACK) // 2 <= pairs, pairs
        checked += 1
    assert checked == 4 * len(cells)
