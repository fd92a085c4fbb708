"""GPU tests of the backward grid kernel in cluster pairs (cuda_src/persistent_bwd_pair.cu;
marker gpu; skipped without a GPU or without thread-block clusters): the plan with
PlanKey.backward 'pair' after the grid forward (the pair kernel for each layer's recurrent
chain, then one GEMM each for dx and every weight and bias gradient) on the GPU executors
gives the float64 reference's dx, dh0, dc0 and every weight and bias gradient in fp32
tolerance (worst element named on failure) for every cell at the goal's shapes (L1 H512 B32
and B64, T 100) and a small odd one (H 37, B 5: unequal halves of the gate rows, a block
without units; two layers); random data, every backward buffer poisoned with NaN before each
run; the graph's capture runs nothing; two runs give bitwise-equal gradients (no atomics in
any sum: each cell adds half 0 + half 1); the gradients equal the grid kernel's to fp32
rounding. The fit's pairs are all resident by the driver's count
(cuOccupancyMaxActiveClusters with clusters of 2), the build's registers within the fit's
and no spills, at H 256 / 512 / 1024, B 32 / 64.

Run on the device: pytest -m gpu tests/gpu/test_gpu_pair_bwd.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close, reduction_atol  # noqa: E402
from rnnrt.kernels import persistent_bwd as PB  # noqa: E402
from rnnrt.kernels.choice import choose_persistent_backward, persistent_schedule  # noqa: E402
from rnnrt.kernels.stack_bwd import PAIR_SM_SLACK  # noqa: E402
from rnnrt.plan.backward import backward_plan  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import RELU_AMBIGUOUS, check_bwd_outputs, relu_margin  # noqa: E402
from testkit import run_gpu_backward_case  # noqa: E402
from testkit import gpu_backward_case as case  # noqa: E402

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
# (layers, T, B, H, I): the goal's shapes, and a small odd one of two layers
SHAPES = [(1, 100, 32, 512, 512), (1, 100, 64, 512, 512), (2, 7, 5, 37, 11)]


@pytest.fixture(autouse=True)
def _clusters(cp):
    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("thread-block clusters need compute capability 9.0+")


def key_of(cell, layers, T, B, H, I, backward="pair"):
    sched = persistent_schedule("grid")   # the selector's candidate: grid forward + ...
    return PlanKey(cell, T, B, I, H, layers, True, sched.switches, train=True, family="grid",
                   backward=backward)


def run_twice(cp, ctx, key, data):
    """The plan runs the pair kernel once a layer (no fallback); two backward runs on
    re-poisoned buffers, the graph executor (testkit's run_gpu_backward_case: a graph proven
    to capture nothing). -> the two runs' outputs."""
    plan = backward_plan(key)
    assert plan.fallback is None, plan.fallback
    names = [op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"]
    want = f"{key.cell}_persistent_{'pair_' if key.backward == 'pair' else ''}bwd"
    assert names == [want] * key.num_layers, (names, plan.fit)
    return run_gpu_backward_case(cp, ctx, key, "graph", data)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"L{s[0]}T{s[1]}B{s[2]}H{s[3]}" for s in SHAPES])
@pytest.mark.parametrize("cell", CELLS)
def test_pair_backward_gives_reference_gradients_bitwise_repeatable(cp, ctx, cell, shape):
    layers, T, B, H, I = shape
    data = case(cell, layers, T, B, H, I, seed=5)
    key = key_of(cell, layers, T, B, H, I)
    first, second = run_twice(cp, ctx, key, data)
    what = f"pair {cell} L{layers} H{H} B{B}"
    margin = relu_margin(data) if cell == "rnn_relu" else np.inf
    if margin >= RELU_AMBIGUOUS:
        check_bwd_outputs(first, data[0], data[4], what, FP32_ATOL, FP32_RTOL,
                          reduction_atol(T * B))
    for name, a in first.items():   # deterministic: the same bits
        np.testing.assert_array_equal(second[name], a, err_msg=f"{name} differs between runs")
    if shape == SHAPES[0] or margin < RELU_AMBIGUOUS:   # the grid kernel's, to fp32 rounding
        grid, _ = run_twice(cp, ctx, key_of(cell, layers, T, B, H, I, "grid"), data)
        names = ("dx",) if margin >= RELU_AMBIGUOUS else tuple(first)
        for name in names:
            assert_close(first[name], grid[name], FP32_ATOL, FP32_RTOL,
                         name=f"{what} {name} vs grid")
        if margin < RELU_AMBIGUOUS:
            print(f"{what}: a pre-activation {margin:.1e} from 0 in the float64 forward (its "
                  f"ReLU mask is the fp32 summation order's): checked against the grid kernel "
                  f"(itself checked against the reference in test_gpu_persistent_bwd.py)")



def test_the_pairs_are_resident_by_the_drivers_count(cp):
    """Every pair fit that says ok has all its pairs resident at once by
    cuOccupancyMaxActiveClusters (clusters of 2, the kernel as NVRTC builds it, its shared
    memory), the fit's budget (SMs - PAIR_SM_SLACK) / 2 within it; the build uses no more
    registers than the fit assumes and does not spill."""
    from rnnrt.kernels.library import KernelLibrary
    from rnnrt.kernels.occupancy import driver_max_active_clusters
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    lib, sms, checked = KernelLibrary(), props["multiProcessorCount"], 0
    for cell in ("lstm", "gru"):
        for H in (256, 512, 1024):
            for B in (32, 64):
                fit = PB.persistent_bwd_fit(cell, H, B, props, kind="pair")
                assert fit.ok, fit.reason
                raw = lib.with_shared(fit.kernel, fit.smem_bytes)
                attrs = raw.attributes
                assert attrs["num_regs"] <= PB.NVCC_REGS[cell], attrs
                assert attrs["local_size_bytes"] == 0, attrs
                pairs = driver_max_active_clusters(raw, fit.threads, fit.smem_bytes, cluster=2)
                assert fit.pairs <= pairs, (fit.describe(), pairs)
                assert (sms - PAIR_SM_SLACK) // 2 <= pairs, pairs
                checked += 1
    assert checked == 12
    key = key_of("lstm", 1, 100, 64, 512, 512)
    assert choose_persistent_backward(key).fit.kernel == "lstm_persistent_pair_bwd"
