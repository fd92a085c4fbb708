"""GPU (marker gpu), issue 24: the tensor-core stack kernel (cuda_src/persistent_stack_mma.cu: the
stack family at bfloat16 / float16, every layer of an LSTM stack in one launch, the product on
tensor cores) -- bfloat16 and float16 at several shapes including the paper's (LSTM L4 H512
B64 T100), forward on the graph executor with every buffer poisoned (NaN) first, against the
float64 rounding-aware reference of the same precision within precision.get_precision(dtype)
.atol / rtol (or, as the typed persistent kernels are judged, within RUNG_FACTOR x the cuBLAS
rung's own error on the same case), the worst element reported; the plan says the kernel ran
(no fallback) and the stored outputs are representable; two runs bitwise equal; a training
pass (the per-step and the per-layer persistent backward on what it saved); the fit agrees
with the occupancy API and NVRTC's build (registers, no spills).

Run (repo root): PYTHONPATH=$PWD python -m pytest -m gpu tests/gpu/test_gpu_stack_mma.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from test_gpu_precision import check_rounded, reference_case, run_graph  # noqa: E402
from test_gpu_typed_persistent import PERSISTENT, RUNG, close_as_the_rungs  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)

from rnnrt.check import compare  # noqa: E402
from rnnrt.kernels import stack_mma as SM  # noqa: E402
from rnnrt.kernels.mma import MMA_DTYPES  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

# (T, B, I, H, L), I = H: the paper shape; 3 layers, B 48 (the second batch half partly
# live); B 5 (one n8 tile, dead batches in it); H 640, the largest the fit takes on an H100;
# B 128 / 256: two / four whole batch groups side by side
SHAPES = [(100, 64, 512, 512, 4), (9, 48, 256, 256, 3), (7, 5, 384, 384, 2),
          (6, 64, 640, 640, 2), (6, 128, 256, 256, 3), (5, 256, 128, 128, 4)]


def _key(shape, dtype, train=False, backward=None):
    T, B, I, H, L = shape
    return PlanKey("lstm", T, B, I, H, L, True, PERSISTENT, train=train, dtype=dtype,
                   family="stack", backward=backward)


def _ran(plan):
    return {op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"}


def rung_outputs(cp, ctx, shape, dtype, case, train=False):
    """rung(name): output ``name`` of the cuBLAS rung's pass at ``shape`` and ``dtype`` on
    ``case`` (graph executor), run once on the first call (close_as_the_rungs' yardstick)."""
    got = {}

    def rung(name):
        if not got:
            T, B, I, H, L = shape
            rkey = PlanKey("lstm", T, B, I, H, L, True, RUNG, train=train, dtype=dtype)
            got.update(run_graph(cp, ctx, rkey, case)[0])
        return got[name]
    return rung


def _forward(cp, ctx, shape, dtype):
    """(outputs, reference, the case) of the stack family's forward at ``shape``; the plan
    must run the tensor-core stack kernel alone."""
    from rnnrt.plan import forward_plan
    key = _key(shape, dtype)
    what = f"{dtype} T{shape[0]} B{shape[1]} H{shape[3]} L{shape[4]}"
    fit = SM.stack_mma_fit("lstm", shape[3], shape[1], shape[4], shape[2], key.device.props(),
                           dtype, shape[0])
    if not fit.ok:   # an H100 takes every shape; a smaller GPU may not
        pytest.skip(f"{what}: the fit declines on this GPU: {fit.reason}")
    fplan = forward_plan(key)
    assert fplan.fallback is None, f"{what}: fell back: {fplan.fallback}"
    assert _ran(fplan) == {SM.STACK_MMA_KERNEL}, f"{what}: ran {_ran(fplan)}"
    case = reference_case("lstm", dtype, shape)
    got, _, _ = run_graph(cp, ctx, key, case)
    return got, case, what


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}B{s[1]}H{s[3]}L{s[4]}")
@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_stack_mma_against_the_rounding_aware_reference(cp, ctx, dtype, shape):
    got, case, what = _forward(cp, ctx, shape, dtype)
    ref, p = case[4], get_precision(dtype)
    rung = rung_outputs(cp, ctx, shape, dtype, case)
    for name in ("y", "h_n", "c_n"):
        assert not np.isnan(got[name]).any(), f"{what} {name}: NaN left (poison unwritten)"
        c = compare(got[name], ref[name], p.atol, p.rtol, name=f"{what} {name}")
        print(f"{what} {name}: worst |err| {c.max_abs_err:.3e} at {c.worst_index} "
              f"(got {c.worst_actual}, ref {c.worst_ref}); {c.n_bad} past tolerance")
        close_as_the_rungs(got[name], ref[name], p, f"{what} {name}", lambda n=name: rung(n))
    check_rounded(f"{what} y", got["y"], dtype)
    check_rounded(f"{what} h_n", got["h_n"], dtype)


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_stack_mma_is_bitwise_repeatable(cp, ctx, dtype):
    """Two runs on freshly poisoned buffers give the same bits (fixed summation order)."""
    shape = SHAPES[0]
    first, _, what = _forward(cp, ctx, shape, dtype)
    second, _, _ = _forward(cp, ctx, shape, dtype)
    for name in ("y", "h_n", "c_n"):
        assert np.array_equal(first[name], second[name]), f"{what} {name}: runs differ"


@pytest.mark.parametrize("backward", [None, "persistent"])
def test_training_after_the_stack_mma_forward(cp, ctx, backward):
    """Forward + backward at bfloat16: the per-step backward (backward None) or, with
    'persistent', the tensor-core stack backward (tests/gpu/test_gpu_stack_mma_bwd.py) on the h,
    c and act the tensor-core stack saved, against the reference gradients."""
    from rnnrt.plan import forward_plan
    from rnnrt.plan.backward import backward_plan
    dtype, shape = "bfloat16", SHAPES[1]
    key = _key(shape, dtype, train=True, backward=backward)
    assert _ran(forward_plan(key)) == {SM.STACK_MMA_KERNEL}
    assert "lstm_persistent_stack_bwd" not in _ran(backward_plan(key))
    case = reference_case("lstm", dtype, shape)
    layout, ref = case[0], case[4]
    p = get_precision(dtype)
    got, _, _ = run_graph(cp, ctx, key, case)
    rung = rung_outputs(cp, ctx, shape, dtype, case, train=True)
    what = f"stack mma fwd + {backward or 'per-step'} bwd"
    for name in ("y", "h_n", "c_n", "dx", "dh0", "dc0"):
        close_as_the_rungs(got[name], ref[name], p, f"{what} {name}", lambda n=name: rung(n))
    for e in layout.entries:
        s = slice(e.offset, e.end)
        close_as_the_rungs(got["grads"][s], ref["grads"][s], p, f"{what} {e.name}",
                           lambda s=s: rung("grads")[s])


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_stack_mma_fit_agrees_with_the_occupancy_api(cp, dtype):
    """Every fit that says ok is co-resident by the driver's count; the kernel as NVRTC
    builds it uses no more registers than the fit assumes and does not spill."""
    from rnnrt.kernels.library import KernelLibrary
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    lib, sms, checked = KernelLibrary(), props["multiProcessorCount"], 0
    for H, L in ((256, 4), (512, 4), (512, 2), (640, 2)):
        fit = SM.stack_mma_fit("lstm", H, 64, L, H, props, dtype)
        assert fit.ok, fit.reason
        raw = lib.with_shared(fit.kernel, fit.smem_bytes, dtype)
        attrs = raw.attributes
        assert attrs["num_regs"] <= SM.PSM_REGS and attrs["local_size_bytes"] == 0, attrs
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            raw.kernel.ptr, fit.threads, fit.smem_bytes)
        assert per_sm >= 1 and fit.blocks <= sms * per_sm, fit.describe()
        checked += 1
    assert checked == 4
