"""GPU tests of the stack backward (marker gpu; skipped without a GPU): the selector's
'stack' schedule with PlanKey.backward 'stack' (and 'persistent', which takes it after a
stack forward): the stack forward, then every layer's backward chain in one launch of
the stack backward (lstm_persistent_stack_bwd_pair, in cluster pairs, where the device has
clusters), then the weight GEMMs, on the GPU executors (eager and a CUDA
graph) gives the float64 reference's dx, dh0, dc0 and every weight and bias gradient in fp32
tolerance at the paper's layer (H 512 B 64, four layers), at H 256 / 384, an odd batch and a
batch below 8, and B 128 / 256 (batch groups); every backward buffer poisoned with NaN before each run, the graph's capture
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

# (T, B, H, L), I = H: the paper's layer (four of them), H 256 / 384, an odd batch, B < 8;
# B 128 / 256: the one-block kernel in two / four batch groups
SHAPES = [(10, 64, 512, 4), (9, 48, 256, 3), (6, 17, 384, 2), (7, 5, 256, 2),
          (8, 128, 256, 3), (5, 256, 128, 4)]


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
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    fit = stack_bwd.stack_bwd_fit("lstm", key.hidden_size, key.batch, key.num_layers,
                                  key.input_size, props, steps=key.steps)
    assert launches == [fit.kernel], (launches, bplan.fit)   # the pairs on an sm_90 device
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


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("pairs, B", [(True, 37), (True, 17), (False, 37), (False, 128),
                                      (True, 128)],
                         ids=["pair", "pair-B32-path", "single", "single-batch-groups",
                              "pair-batch-groups"])
def test_stack_bwd_kernels_equal_their_twins(cp, pairs, B, cell):
    """Each stack backward kernel (the cluster-pair one, and the one-block one that runs where
    pairs decline; LSTM's and GRU's) launched directly on random data, outputs and scratch
    poisoned with NaN: every output equals its NumPy twin's (the kernel's sum order; FMA
    contraction within a k-group aside) and the counters are back to zero."""
    from rnnrt.check import compare
    from rnnrt.kernels.registry import get_kernel
    from testkit import launch_stack_fit
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    T, H, L = 6, 128, 3
    fit = stack_bwd.stack_bwd_fit(cell, H, B, L, H, props, steps=T, pairs=pairs)
    assert fit.ok and fit.pair == pairs and fit.groups == max(1, B // 64), fit.reason
    info = get_kernel(fit.kernel)
    scal = fit.scalars(T)
    outs_s, ins_s = info.arg_shapes(B, H, **scal)
    rng = np.random.default_rng(11)
    ins = [rng.uniform(0.05, 0.95, s).astype(np.float32) for s in ins_s]   # gates in (0, 1)
    outs = [np.full(s, np.nan, np.float32) for s in outs_s]
    outs[5] = np.zeros(outs_s[5], np.uint32)                                # sync
    names = [o[0] for o in info.outs][:5]   # lstm: dgx dhin dx dh0 dc0; gru: dgx dgh dhin dx dh0
    top = outs[names.index("dhin")]
    top.reshape(L, T * B, H)[L - 1] = rng.standard_normal((T * B, H))   # the top's dy
    d_outs, d_ins = [cp.asarray(a) for a in outs], [cp.asarray(a) for a in ins]
    launch_stack_fit(cp, fit, d_outs, d_ins, scal)
    info.numpy_fn(B, H, outs, ins, **scal)
    for n, name in enumerate(names):
        r = compare(cp.asnumpy(d_outs[n]), outs[n], 1e-5, 1e-4, name=f"{fit.kernel} {name}")
        assert r.ok, str(r)
    assert int(cp.asnumpy(d_outs[5]).max()) == 0, "counters not reset"


# --- GRU (gru_persistent_stack_bwd_pair on an sm_90 device, the one-block kernel elsewhere)

@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}B{b}H{h}L{n}" for t, b, h, n in SHAPES])
def test_gru_stack_backward_gives_reference_gradients_bitwise_repeatable(cp, ctx, shape,
                                                                        executor):
    T, B, H, L = shape
    data = case("gru", L, T, B, H, H, seed=L + 1)
    key = PlanKey("gru", T, B, H, H, L, True, persistent_schedule("stack").switches,
                  train=True, family="stack", backward="stack")
    fplan, bplan = forward_plan(key), backward_plan(key)
    assert bplan.fallback is None, bplan.fallback
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    fit = stack_bwd.stack_bwd_fit("gru", H, B, L, H, props, steps=T)
    assert [op.name for op in bplan.ops if isinstance(op, Kernel)
            and op.kind == "persistent"] == [fit.kernel], bplan.fit
    assert "gru_persistent_stack_fwd" in {op.name for op in fplan.ops
                                          if isinstance(op, Kernel)}, fplan.fit
    first, second = run_gpu_backward_case(cp, ctx, key, executor, data)
    check_bwd_outputs(first, data[0], data[4], f"gru stack bwd {shape} {executor}", FP32_ATOL,
                      FP32_RTOL, reduction_atol(T * B))
    for name, a in first.items():   # deterministic: the same bits
        np.testing.assert_array_equal(second[name], a, err_msg=f"{name} differs between runs")
