"""GPU tests of the persistent backward (marker gpu; skipped without a GPU): the plan with
PlanKey.backward 'grid' or 'cluster' (that kernel for each layer's recurrent chain, then one
GEMM each for dx and every weight and bias gradient) on the GPU executors gives the float64
reference's dx, dh0, dc0 and every weight and bias gradient in fp32 tolerance for every cell
at H 128 B 8, H 512 B 64 (grid only: R / 8 does not fit a block) and an H that is no
multiple of the tiles (333, B 17; grid only), H 128 B 64 (cluster), one and three layers;
the cluster kernel's chunked plan (several layers with the wavefront: launches of the input
chunk's steps overlapping along the reverse wavefront) at chunks that divide T and that do not,
three and four layers; every backward buffer is poisoned with NaN before each run; the graph's
capture runs nothing; two runs give bitwise-equal gradients (no atomics in any sum);
GpuRunner's automatic choice for a training shape trains right whichever schedule it takes.

Run on the device: pytest -m gpu tests/gpu/test_gpu_persistent_bwd.py
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
# (T, B, H, I, variants): the wide grid's worst point, the paper's layer, an odd H and B, H 128
# B 64 (eight clusters of 8 batches)
SHAPES = [(24, 8, 128, 128, ("grid", "cluster")), (10, 64, 512, 512, ("grid",)),
          (9, 17, 333, 40, ("grid",)), (12, 64, 128, 40, ("cluster",))]
CASES = [(shape[:4], v) for shape in SHAPES for v in shape[4]]


def key_of(cell, layers, T, B, H, I, backward, input_batch=None):
    sched = persistent_schedule("grid")   # the selector's candidate: grid forward + ...
    sw = sched.switches if input_batch is None else dataclasses.replace(
        sched.switches, input_batch=input_batch)
    return PlanKey(cell, T, B, I, H, layers, True, sw, train=True, family="grid",
                   backward=backward)


def run_twice(cp, ctx, key, executor, data):
    """The plan is the persistent backward's (persistent kernels of the key's variant, one a
    layer or, chunked, one a chunk of each layer; no fallback); two backward runs on
    re-poisoned buffers (testkit's run_gpu_backward_case: a graph proven to capture
    nothing). -> the two runs' outputs."""
    bplan = backward_plan(key)
    assert bplan.fallback is None, bplan.fallback
    choice = choose_persistent_backward(key)
    chunks = -(-key.steps // choice.steps_per_launch)
    assert bplan.counts()["kernel:persistent"] == key.num_layers * chunks
    names = {op.name for op in bplan.ops if getattr(op, "kind", "") == "persistent"}
    assert all(("_cluster_" in n) == (key.backward == "cluster") for n in names), names
    return run_gpu_backward_case(cp, ctx, key, executor, data)


def check(got, layout, ref, rows, what):
    # weight gradients sum over T*B rows: see check.reduction_atol
    check_bwd_outputs(got, layout, ref, what, FP32_ATOL, FP32_RTOL, reduction_atol(rows))


@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("shape, variant", CASES,
                         ids=[f"T{s[0]}B{s[1]}H{s[2]}-{v}" for s, v in CASES])
@pytest.mark.parametrize("cell", CELLS)
def test_persistent_backward_gives_reference_gradients_bitwise_repeatable(cp, ctx, cell, shape,
                                                                          variant, executor):
    T, B, H, I = shape
    data = case(cell, 1, T, B, H, I)
    first, second = run_twice(cp, ctx, key_of(cell, 1, T, B, H, I, variant), executor, data)
    check(first, data[0], data[4], T * B, f"{cell} H{H} B{B} {variant} {executor}")
    for name, a in first.items():   # deterministic: the same bits
        np.testing.assert_array_equal(second[name], a, err_msg=f"{name} differs between runs")


@pytest.mark.parametrize("variant", ["grid", "cluster"])
@pytest.mark.parametrize("cell", CELLS)
def test_three_layers(cp, ctx, cell, variant):
    T, B, H, I = 16, 8, 128, 64
    data = case(cell, 3, T, B, H, I, seed=1)
    first, second = run_twice(cp, ctx, key_of(cell, 3, T, B, H, I, variant), "graph", data)
    check(first, data[0], data[4], T * B, f"{cell} L3 {variant}")
    for name, a in first.items():
        np.testing.assert_array_equal(second[name], a, err_msg=name)


# (layers, T, B, input chunk k, PlanKey.bwd_clusters): 23 = 4 x 5 + 3 (a short last chunk),
# 20 = 4 x 5; B 32: the rule's four clusters a layer (the layers' share of the SMs), and
# eight a layer, so that four layers' launches cannot all be resident at once (they queue)
CHUNKED = [(3, 23, 8, 5, None), (4, 20, 32, 5, None), (4, 20, 32, 5, 8), (4, 17, 8, 1, None)]


@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("layers, T, B, k, ncl", CHUNKED,
                         ids=[f"L{c[0]}T{c[1]}B{c[2]}k{c[3]}cl{c[4]}" for c in CHUNKED])
@pytest.mark.parametrize("cell", CELLS)
def test_chunked_cluster_backward(cp, ctx, cell, layers, T, B, k, ncl, executor):
    """The cluster kernel's chunked plan (launches of k steps on views of their chunk,
    layers overlapping along the reverse wavefront, no grid barrier anywhere) gives the
    reference gradients, bitwise the same in two runs."""
    H, I = 128, 64
    key = dataclasses.replace(key_of(cell, layers, T, B, H, I, "cluster", input_batch=k),
                              bwd_clusters=ncl)
    choice = choose_persistent_backward(key)
    assert choice.chunked and choice.steps_per_launch == k, choice.describe()
    data = case(cell, layers, T, B, H, I, seed=2)
    first, second = run_twice(cp, ctx, key, executor, data)
    check(first, data[0], data[4], T * B, f"{cell} L{layers} T{T} B{B} k{k} {executor}")
    for name, a in first.items():
        np.testing.assert_array_equal(second[name], a, err_msg=f"{name} differs between runs")


def test_the_runner_trains_right_with_the_automatic_choice(cp):
    """GpuRunner's switches='auto' for a training shape where the persistent backward is a
    candidate: whatever it chooses, the gradients are the reference's."""
    import rnnrt
    from rnnrt.gpu import GpuRunner
    m = rnnrt.LSTM(128, 128, num_layers=1, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 8, 128)).astype(np.float32)
    y_ref, _, tape_ref = m.forward(x, train=True)
    dy = rng.standard_normal(y_ref.shape).astype(np.float32)
    g_ref = m.backward(tape_ref, dy)
    r = GpuRunner(m, schedule_cache=False)
    sel = r.schedule(40, 8, train=True)
    assert any(c["name"].endswith("+pbwd") for c in sel.candidates), sel.candidates
    y, _, tape = r.forward(x, train=True)
    g = r.backward(tape, cp.asarray(dy))
    assert_close(g.dx, g_ref.dx, name=f"auto ({sel.schedule.name}) dx")
    for name, arr in g_ref.params.items():
        assert_close(g.params[name], arr, reduction_atol(40 * 8), FP32_RTOL, name=name)
    r.close()
