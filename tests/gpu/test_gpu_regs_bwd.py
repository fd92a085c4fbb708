"""GPU tests of the register-resident cluster backward (cuda_src/persistent_regs_bwd.cu;
marker gpu; skipped without a GPU): the plan with PlanKey.backward 'regs' after the regs
forward (that kernel for each layer's recurrent chain, chunked along the reverse wavefront
with several layers, then one GEMM each for dx and every weight and bias gradient) on the
GPU executors gives the float64 reference's dx, dh0, dc0 and every weight and bias gradient
in fp32 tolerance (worst element named on failure) for every cell, at the issue's shapes
(LSTM L1 H128 B32 and B256, L4 H128 B32 / B64 / B128, GRU L4 H128 B64) and small odd ones
(H 37, B 19: five clusters, the last of 3 batches; H 64); every backward buffer is poisoned with NaN before each
run; the graph's capture runs nothing; two runs give bitwise-equal gradients (no atomics in
any sum); the gradients equal the cluster backward's to fp32 rounding.

Run on the device: pytest -m gpu tests/gpu/test_gpu_regs_bwd.py
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close, reduction_atol  # noqa: E402
from rnnrt.kernels.choice import choose_persistent_backward, persistent_schedule  # noqa: E402
from rnnrt.plan.backward import backward_plan  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import check_bwd_outputs, run_gpu_backward_case  # noqa: E402
from testkit import gpu_backward_case as case  # noqa: E402

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def key_of(cell, layers, T, B, H, I, backward="regs", input_batch=None, bwd_clusters=None):
    sched = persistent_schedule("regs")   # the selector's candidate: regs forward + ...
    sw = sched.switches if input_batch is None else dataclasses.replace(
        sched.switches, input_batch=input_batch)
    return PlanKey(cell, T, B, I, H, layers, True, sw, train=True, family="regs",
                   backward=backward, bwd_clusters=bwd_clusters)


def run_twice(cp, ctx, key, executor, data):
    """The plan runs the register-resident backward (one launch a layer, or chunked one a
    chunk of each layer; no fallback); two backward runs on re-poisoned buffers (testkit's
    run_gpu_backward_case: a graph proven to capture nothing). -> the two runs' outputs."""
    bplan = backward_plan(key)
    assert bplan.fallback is None, bplan.fallback
    assert "register-resident" in bplan.fit, bplan.fit
    choice = choose_persistent_backward(key)
    chunks = -(-key.steps // choice.steps_per_launch)
    assert bplan.counts()["kernel:persistent"] == key.num_layers * chunks
    names = {op.name for op in bplan.ops if getattr(op, "kind", "") == "persistent"}
    assert names == {f"{key.cell}_persistent_regs_bwd"}, names
    return run_gpu_backward_case(cp, ctx, key, executor, data)


def check(got, layout, ref, rows, what):
    # weight gradients sum over T*B rows: see check.reduction_atol
    check_bwd_outputs(got, layout, ref, what, FP32_ATOL, FP32_RTOL, reduction_atol(rows))


def check_repeatable(first, second):
    for name, a in first.items():   # deterministic: the same bits
        np.testing.assert_array_equal(second[name], a, err_msg=f"{name} differs between runs")


# (cell, layers, T, B, H, I, input chunk): the issue's points at T 30 (chunks of 10 with
# several layers: the candidates' chunk), and H 37 B 19 (lanes past H zeros, 3 clusters of 7,
# 7, 5 in one layer), H 64 (one unit a warp)
ISSUE = [("lstm", 1, 30, 256, 128, 128, None), ("lstm", 1, 30, 32, 128, 128, None),
         ("lstm", 4, 30, 32, 128, 128, None), ("lstm", 4, 30, 64, 128, 128, None),
         ("lstm", 4, 30, 128, 128, 128, None), ("gru", 4, 30, 64, 128, 128, None)]
SMALL = [(cell, layers, 12, B, H, 40, None) for cell in CELLS
         for layers, B, H in ((1, 19, 37), (3, 8, 64), (1, 64, 128))]


@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("cell, layers, T, B, H, I, k", ISSUE + SMALL,
                         ids=[f"{c[0]}-L{c[1]}T{c[2]}B{c[3]}H{c[4]}" for c in ISSUE + SMALL])
def test_regs_backward_gives_reference_gradients_bitwise_repeatable(cp, ctx, cell, layers, T,
                                                                    B, H, I, k, executor):
    data = case(cell, layers, T, B, H, I, seed=layers + B)
    key = key_of(cell, layers, T, B, H, I, input_batch=k)
    first, second = run_twice(cp, ctx, key, executor, data)
    check(first, data[0], data[4], T * B, f"{cell} L{layers} H{H} B{B} regs {executor}")
    check_repeatable(first, second)


# (layers, T, B, input chunk k, bwd_clusters): a short last chunk (23 = 4 x 5 + 3), chunks of
# one step, and eight clusters a layer (four layers' launches cannot all be resident at once)
CHUNKED = [(4, 23, 32, 5, None), (4, 17, 8, 1, None), (4, 20, 32, 5, 8)]


@pytest.mark.parametrize("layers, T, B, k, ncl", CHUNKED,
                         ids=[f"L{c[0]}T{c[1]}B{c[2]}k{c[3]}cl{c[4]}" for c in CHUNKED])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_chunked_regs_backward(cp, ctx, cell, layers, T, B, k, ncl):
    """Launches of k steps on views of their chunk, layers overlapping along the reverse
    wavefront: the reference gradients, bitwise the same in two runs."""
    H, I = 128, 64
    key = key_of(cell, layers, T, B, H, I, input_batch=k, bwd_clusters=ncl)
    choice = choose_persistent_backward(key)
    assert choice.chunked and choice.steps_per_launch == k, choice.describe()
    data = case(cell, layers, T, B, H, I, seed=2)
    first, second = run_twice(cp, ctx, key, "graph", data)
    check(first, data[0], data[4], T * B, f"{cell} L{layers} T{T} B{B} k{k}")
    check_repeatable(first, second)


@pytest.mark.parametrize("cell", CELLS)
def test_equals_the_cluster_backward_to_rounding(cp, ctx, cell):
    """The same plan with the cluster backward kernel (R^T in shared memory, k-group partial
    sums): the same gradients up to the order of the sums over k (fp32 tolerance)."""
    T, B, H, I = 16, 32, 128, 64
    data = case(cell, 2, T, B, H, I, seed=9)
    regs, _ = run_twice(cp, ctx, key_of(cell, 2, T, B, H, I), "graph", data)
    cl, _ = run_gpu_backward_case(cp, ctx, key_of(cell, 2, T, B, H, I, backward="cluster"),
                                  "graph", data)
    for name, a in cl.items():   # the weight gradients sum T*B rows: reduction_atol
        atol = reduction_atol(T * B) if name == "grads" else FP32_ATOL
        assert_close(regs[name], a, atol, FP32_RTOL, name=f"{cell} {name}: regs vs cluster")
