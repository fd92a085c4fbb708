"""GPU tests of the register-resident cluster kernels (cuda_src/persistent_regs.cu; marker gpu,
skipped without a GPU). Written before any GPU run.

Each kernel runs one layer's T steps in one launch (gx from a cuBLAS matmul), outputs poisoned
with NaN, and is compared with the float64 NumPy reference at the fp32 tolerances (the worst
element named on failure): every cell, H 64 and 128, B 8, 64 and 256 (the cluster kernel's
batch splits: 2, 8 and 8 clusters), with 256 threads and, where a cluster holds 64 batches,
512; the cluster kernel on the same layer beside it. Then whole models through GpuRunner with
the family 'regs' named (the selector given that one candidate): L1 and L4 (the wavefront:
chunked launches overlapping), forward and a training step, against the model's reference;
and at tf32, bfloat16 and float16 (the typed instantiations) against the rounding-aware
reference.

Run on the device: pytest -m gpu tests/gpu/test_gpu_regs.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.kernels import choice as C  # noqa: E402
from rnnrt.kernels import persistent as P  # noqa: E402
from rnnrt.kernels import regs as RG  # noqa: E402
from test_gpu_persistent import Layer, lib, props  # noqa: E402, F401 - fixtures
from testkit import cell_model  # noqa: E402

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("B", [8, 64, 256])
def test_regs_kernel_matches_the_reference(cp, props, lib, cell, H, B):   # noqa: F811
    """The fit's regs kernel (and at B 64 the 512-thread cut in one cluster) twice in a row,
    the cluster kernel between them on the same buffers: each equals the reference."""
    T = 20
    layer = Layer(cp, cell, T, B, H, seed=7)
    outs, ins = layer.pairs()
    fits = [RG.regs_fit(cell, H, B, props), P.persistent_fit(cell, H, B, props, kind="cluster")]
    if B == 64:
        fits.append(RG.regs_fit(cell, H, B, props, clusters=1))
    fits.append(fits[0])
    for fit in fits:
        assert fit.ok, fit.describe()
        layer.poison()
        lib.launch_persistent(fit, outs, ins, T)
        cp.cuda.Device().synchronize()
        layer.check(fit.describe())
    assert fits[0].clusters == P.cluster_count(B, props["multiProcessorCount"])
    if B == 64:
        assert fits[2].clusters == 1 and fits[2].threads == (512 if H == 128 else 256), \
            fits[2].describe()   # 2 cells a lane: H 128 needs 512 threads for 64 batches


def _model(cell, layers, H, seed=0):
    return cell_model(cell, H, H, layers, seed)


@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("layers, H, B", [(1, 128, 8), (4, 64, 64), (4, 128, 256)])
def test_gpu_runner_runs_the_named_regs_family(cp, cell, layers, H, B):
    """GpuRunner with the selector's one candidate the 'regs' family: the plan runs the regs
    kernel (no fallback; with L4 chunked along the wavefront), forward and a training step
    equal the model's reference."""
    T = 12
    m = _model(cell, layers, H)
    r = GpuRunner(m, schedule_cache=False)
    r.selector.candidates_fn = lambda shape, device: (C.persistent_schedule("regs"),)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    y_ref, hx_ref, tape_ref = m.forward(x, train=True)
    for train in (False, True):
        key = r.plan_key(T, B, train)
        assert key.family == "regs", key
        choice = C.choose_persistent(key)
        assert choice.family == "regs" and choice.fallback is None, choice.describe()
        assert choice.fit.kernel == f"{cell}_persistent_regs_fwd"
        assert choice.chunked == (layers > 1), choice.describe()
    y, hx = r.forward(x)
    assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name=f"{cell} L{layers} regs y")
    y, hx, tape = r.forward(x, train=True)
    assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name=f"{cell} L{layers} regs y (train)")
    dy = rng.standard_normal(y_ref.shape).astype(np.float32)
    g_ref = m.backward(tape_ref, dy)
    g = r.backward(tape, cp.asarray(dy))
    assert_close(g.dx, g_ref.dx, FP32_ATOL, FP32_RTOL, name=f"{cell} L{layers} regs dx")
    for name, arr in g_ref.params.items():
        assert_close(g.params[name], arr, FP32_ATOL, FP32_RTOL, name=f"{cell} regs {name}")


@pytest.mark.parametrize("dtype", ("tf32", "bfloat16", "float16"))
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_typed_regs_forward_matches_the_rounding_reference(cp, cell, dtype):
    """GpuRunner(dtype=...) with the one candidate 'regs': every forward launch is the regs
    kernel's typed instantiation (no fallback), and a training step (the backward: not the
    register-resident one, fp32 only) equals the rounding-aware reference within the
    precision's tolerance, y stored as storage values (test_gpu_runner_dtype's check: T 7,
    B 24, H 64, L 2, random data)."""
    from test_gpu_runner_dtype import check_named_family
    check_named_family(cp, cell, dtype, "regs")
