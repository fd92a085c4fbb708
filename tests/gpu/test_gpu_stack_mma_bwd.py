"""GPU (marker gpu), issue 24: the tensor-core stack backward (cuda_src/persistent_stack_mma_bwd.cu,
lstm_persistent_stack_mma_bwd: every layer's LSTM backward chain in one launch, in cluster
pairs, the product on tensor cores) after the tensor-core stack forward, bfloat16 and float16:
a training step (graph executor, every buffer poisoned with NaN first) gives dx, dh0, dc0 and
every weight and bias gradient of the float64 rounding-aware reference
(rnnrt.reference.backward at the same precision) within precision.get_precision(dtype).atol /
rtol, or, as the typed persistent kernels are judged, within RUNG_FACTOR x the cuBLAS rung's
own error on the same case; the worst element of each printed; the plans say the two stack
kernels ran (no fallback), dgx is held in the storage type; two runs bitwise equal;
'persistent' takes it too; the kernel launched alone equals its NumPy twin (float16); its
fit agrees with the occupancy API and NVRTC's build (registers, no spills).

Shapes (T, B, I, H, L): L2 H64 B24 T7 (the smallest pairs: 2 a layer), L3 H256 B32 (the
32-batch half idle), L2 H128 B5, and the paper's L4 H512 B64 T100 (bf16; ~10 s of float64
reference); the whole file well under a minute on an H100.

Run (repo root): PYTHONPATH=$PWD python -m pytest -m gpu tests/gpu/test_gpu_stack_mma_bwd.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from test_gpu_precision import reference_case, run_graph  # noqa: E402
from test_gpu_stack_mma import rung_outputs  # noqa: E402
from test_gpu_typed_persistent import PERSISTENT, close_as_the_rungs  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)

from rnnrt.check import compare  # noqa: E402
from rnnrt.kernels import stack_mma as SM  # noqa: E402
from rnnrt.kernels import stack_mma_bwd as SMB  # noqa: E402
from rnnrt.kernels.mma import MMA_DTYPES  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

PAPER = (100, 64, 512, 512, 4)
# (T, B, I, H, L); B 128 / 256: two / four whole batch groups side by side
SMALL = [(7, 24, 64, 64, 2), (9, 32, 256, 256, 3), (7, 5, 128, 128, 2), (6, 128, 256, 256, 3),
         (5, 256, 128, 128, 4)]


def _key(shape, dtype, backward="stack"):
    T, B, I, H, L = shape
    return PlanKey("lstm", T, B, I, H, L, True, PERSISTENT, train=True, dtype=dtype,
                   family="stack", backward=backward)


def _ran(plan):
    return {op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"}


def _train(cp, ctx, shape, dtype, backward="stack"):
    """(outputs, the case, what, the workspace) of one training step of the stack family
    with the tensor-core stack backward; the plans must run the two tensor-core stack kernels
    alone (no fallback)."""
    from rnnrt.plan import forward_plan
    from rnnrt.plan.backward import backward_plan
    key = _key(shape, dtype, backward)
    T, B, I, H, L = shape
    what = f"{dtype} T{T} B{B} H{H} L{L} ({backward})"
    fit = SMB.stack_mma_bwd_fit("lstm", H, B, L, I, key.device.props(), dtype, T)
    if not fit.ok:   # an H100 takes every shape; a smaller GPU may not
        pytest.skip(f"{what}: the fit declines on this GPU: {fit.reason}")
    fplan, bplan = forward_plan(key), backward_plan(key)
    assert fplan.fallback is None and bplan.fallback is None, (fplan.fallback, bplan.fallback)
    assert _ran(fplan) == {SM.STACK_MMA_KERNEL}, f"{what}: forward ran {_ran(fplan)}"
    assert _ran(bplan) == {SMB.STACK_MMA_BWD_KERNEL}, f"{what}: backward ran {_ran(bplan)}"
    case = reference_case("lstm", dtype, shape)
    got, ws, _ = run_graph(cp, ctx, key, case)
    return got, case, what, ws


def _check(cp, ctx, got, case, shape, dtype, what):
    layout, ref = case[0], case[4]
    p = get_precision(dtype)
    rung = rung_outputs(cp, ctx, shape, dtype, case, train=True)

    parts = [(n, got[n], ref[n], lambda n=n: rung(n)) for n in ("dx", "dh0", "dc0")]
    parts += [(e.name, got["grads"][e.offset:e.end], ref["grads"][e.offset:e.end],
               lambda s=slice(e.offset, e.end): rung("grads")[s]) for e in layout.entries]
    for name, g, r, rg in parts:
        assert not np.isnan(g).any(), f"{what} {name}: NaN left (poison unwritten)"
        c = compare(g, r, p.atol, p.rtol, name=f"{what} {name}")
        print(f"{what} {name}: worst |err| {c.max_abs_err:.3e} at {c.worst_index} "
              f"(got {c.worst_actual}, ref {c.worst_ref}); {c.n_bad} past tolerance")
        close_as_the_rungs(g, r, p, f"{what} {name}", rg)


@pytest.mark.parametrize("shape", SMALL, ids=lambda s: f"T{s[0]}B{s[1]}H{s[3]}L{s[4]}")
@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_stack_mma_bwd_against_the_rounding_aware_reference(cp, ctx, dtype, shape):
    got, case, what, ws = _train(cp, ctx, shape, dtype)
    _check(cp, ctx, got, case, shape, dtype, what)
    assert ws.bufs["dgx"].itemsize == 2, ws.bufs["dgx"].dtype   # dg stored in the 16-bit type


def test_the_paper_shape_gives_the_reference_bitwise_repeatable(cp, ctx):
    """LSTM L4 H512 B64 T100 at bfloat16 (what the selector times it for): the reference
    gradients, and a second run on freshly poisoned buffers gives the same bits (fixed sum
    orders, the pair's halves added in one order, one sync buffer reset by the kernel)."""
    first, case, what, _ = _train(cp, ctx, PAPER, "bfloat16")
    _check(cp, ctx, first, case, PAPER, "bfloat16", what)
    second, _, _, _ = _train(cp, ctx, PAPER, "bfloat16")
    for name, a in first.items():
        np.testing.assert_array_equal(second[name], a, err_msg=f"{what} {name}: runs differ")


def test_persistent_takes_it_after_the_tensor_core_stack_forward(cp, ctx):
    shape = SMALL[1]
    got, case, what, _ = _train(cp, ctx, shape, "float16", backward="persistent")
    _check(cp, ctx, got, case, shape, "float16", what)


def test_kernel_equals_its_twin(cp):
    """The kernel launched alone (float16: CuPy's dtype for the dgx buffer) on random data,
    outputs poisoned with NaN: every output equals the NumPy twin's within the tensor core's
    other order inside a k16 step (dgx: a storage ulp where a value rounds the other way),
    and the counters are back at zero."""
    from rnnrt.kernels.registry import get_kernel
    from testkit import launch_stack_fit
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    T, B, H, L, dtype = 5, 37, 128, 3, "float16"
    fit = SMB.stack_mma_bwd_fit("lstm", H, B, L, H, props, dtype, steps=T)
    if not fit.ok:
        pytest.skip(fit.reason)
    info = get_kernel(fit.kernel)
    scal = fit.scalars(T)
    outs_s, ins_s = info.arg_shapes(B, H, **scal)
    rng = np.random.default_rng(11)
    ins = [rng.uniform(0.05, 0.95, s).astype(np.float32) for s in ins_s]   # gates in (0, 1)
    ins[4] = (rng.standard_normal(ins_s[4]) / np.sqrt(H)).astype(np.float32)   # W
    ins[5] = (rng.standard_normal(ins_s[5]) / np.sqrt(H)).astype(np.float32)   # R
    outs = [np.full(s, np.nan, np.float32) for s in outs_s]
    outs[5] = np.zeros(outs_s[5], np.uint32)                                # sync
    outs[1].reshape(L, T * B, H)[L - 1] = rng.standard_normal((T * B, H))   # the top's dy
    d_outs = [cp.asarray(outs[0].astype(np.float16))] + [cp.asarray(a) for a in outs[1:]]
    d_ins = [cp.asarray(a) for a in ins]
    launch_stack_fit(cp, fit, d_outs, d_ins, scal, dtype)
    info.numpy_fn(B, H, outs, ins, **scal, dtype=dtype)
    got = [cp.asnumpy(d_outs[0]).astype(np.float32)] + [cp.asnumpy(a) for a in d_outs[1:5]]
    for n, name in enumerate(("dgx", "dhin", "dx", "dh0", "dc0")):
        r = compare(got[n], outs[n], 1e-3, 2 ** -8, name=f"{fit.kernel} {name}")
        print(r)
        assert r.ok, str(r)
    assert int(cp.asnumpy(d_outs[5]).max()) == 0, "counters not reset"


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_stack_mma_bwd_fit_agrees_with_the_occupancy_api(cp, dtype):
    """Every fit that says ok is co-resident by the driver's count; the kernel as NVRTC
    builds it uses no more registers than the fit assumes and does not spill."""
    from rnnrt.kernels.library import KernelLibrary
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    lib, sms, checked = KernelLibrary(), props["multiProcessorCount"], 0
    for H, L in ((256, 4), (512, 4), (640, 2)):
        fit = SMB.stack_mma_bwd_fit("lstm", H, 64, L, H, props, dtype)
        assert fit.ok, fit.reason
        raw = lib.with_shared(fit.kernel, fit.smem_bytes, dtype)
        attrs = raw.attributes
        assert attrs["num_regs"] <= SMB.SMB_REGS and attrs["local_size_bytes"] == 0, attrs
        print(f"{fit.kernel} {dtype}: {attrs['num_regs']} registers (NVRTC)")
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            raw.kernel.ptr, fit.threads, fit.smem_bytes)
        assert per_sm >= 1 and fit.blocks <= sms * per_sm, fit.describe()
        checked += 1
    assert checked == 3
