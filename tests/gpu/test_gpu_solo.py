"""GPU tests of the block-persistent ("solo") kernels (cuda_src/persistent_solo.cu; marker gpu,
skipped without a GPU). Written before any GPU run.

Each kernel runs one layer's T steps in one launch (gx from a cuBLAS matmul), outputs poisoned
with NaN, and is compared with the float64 NumPy reference at the fp32 tolerances (the worst
element named on failure): every cell x H 16, 64 and 128 (LSTM at 128: declined, the fit's
reason checked; H 16: rows shorter than the chunks a lane could hold) x B 1, 8, 64, 128, 256
x T 1, 37, 100, with the fit's block count and, beside it, a forced smaller one (more batches
a block, a different body) and a larger one (past one wave: blocks never wait for each other,
so waves are correct), for the one-unit kernels and the two-unit (_rr) ones; the _rr kernels
bit-equal to the one-unit ones (H 4-128, odd and even unit counts a half). Then whole models
through GpuRunner with the family 'solo' named (the selector given that one candidate, and
its '+pbwd' twin for training): L1 and L4, forward and a training step, against the model's
reference; and at tf32, bfloat16 and float16 (the typed instantiations) against the
rounding-aware reference.

Run on the device: pytest -m gpu tests/gpu/test_gpu_solo.py
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
from rnnrt.kernels import solo as SO  # noqa: E402
from test_gpu_persistent import Layer, lib, props  # noqa: E402, F401 - fixtures
from testkit import cell_model  # noqa: E402

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("H", [16, 64, 128])
@pytest.mark.parametrize("B", [1, 8, 64, 128, 256])
@pytest.mark.parametrize("T", [1, 37, 100])
@pytest.mark.parametrize("upt", [1, 2])
def test_solo_kernel_matches_the_reference(cp, props, lib, cell, H, B, T, upt):   # noqa: F811
    fit = SO.solo_fit(cell, H, B, props, upt=upt)
    if cell == "lstm" and upt == 2:
        assert not fit.ok and "no two-unit (_rr) kernel for lstm" in fit.reason, fit.reason
        return
    if cell == "lstm" and H == 128:
        assert not fit.ok and "R alone is 4 x 128 x 128 floats" in fit.reason, fit.reason
        return
    assert fit.ok, fit.describe()
    layer = Layer(cp, cell, T, B, H, seed=7)
    outs, ins = layer.pairs()
    fits = [fit]
    fewer = SO.solo_fit(cell, H, B, props, blocks=-(-B // SO.batch_max(cell, upt)), upt=upt)
    if fewer.ok and fewer.blocks != fit.blocks:
        fits.append(fewer)
    if T == 37:   # past one wave: one batch a block and 8 times the SMs' worth where it can
        more = SO.solo_fit(cell, H, B, props, blocks=B, upt=upt)
        if more.ok and more.blocks != fit.blocks:
            fits.append(more)
    for f in fits:
        assert f.ok, f.describe()
        layer.poison()
        lib.launch_persistent(f, outs, ins, T)
        cp.cuda.Device().synchronize()
        layer.check(f.describe())
    assert int(layer.sync.get().sum()) == 0   # not touched


@pytest.mark.parametrize("cell", SO.RR_CELLS)
@pytest.mark.parametrize("H, B", [(128, 1), (128, 128), (128, 256), (64, 37), (38, 5),
                                  (16, 5), (4, 3), (12, 7)])
def test_rr_kernel_equals_the_one_unit_kernel_bit_for_bit(cp, props, lib, cell, H, B):  # noqa: F811
    """The _rr kernel sums every gate in the same FMA chains and the same 8-lane tree as the
    one-unit kernel: h, c and the gates bit-equal, after both were checked against the
    reference."""
    T = 23
    layer = Layer(cp, cell, T, B, H, seed=11)
    outs, ins = layer.pairs()
    got = []
    for upt in (1, 2):
        f = SO.solo_fit(cell, H, B, props, upt=upt)
        assert f.ok and f.upt == upt, f.describe()
        layer.poison()
        lib.launch_persistent(f, outs, ins, T)
        cp.cuda.Device().synchronize()
        layer.check(f.describe())
        got.append([a.get() for a in (layer.h, layer.c, layer.act) if a is not None])
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("layers, H, B", [(1, 128, 128), (4, 128, 128), (4, 64, 256),
                                          (1, 64, 8)])
def test_gpu_runner_runs_the_named_solo_family(cp, cell, layers, H, B):
    """GpuRunner with the selector's one candidate the 'solo' family (training: with the
    persistent backward, '+pbwd'): the plan runs the solo kernel, one launch a layer (no
    fallback, never chunked), forward and a training step equal the model's reference."""
    if cell == "lstm" and H == 128:
        H = 112   # LSTM's R at 128 is past a block's shared memory
    T = 12
    m = cell_model(cell, H, H, layers)
    r = GpuRunner(m, schedule_cache=False)
    solo = C.persistent_schedule("solo")
    r.selector.candidates_fn = lambda shape, device: (
        (C.with_persistent_backward(solo),) if shape.train else (solo,))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    y_ref, hx_ref, tape_ref = m.forward(x, train=True)
    for train in (False, True):
        key = r.plan_key(T, B, train)
        assert key.family == "solo", key
        choice = C.choose_persistent(key)
        assert choice.family == "solo" and choice.fallback is None, choice.describe()
        assert choice.fit.kernel == SO.kernel_name(cell, 2 if cell in SO.RR_CELLS else 1)
        assert not choice.chunked
        assert key.backward == ("persistent" if train else None), key
    y, hx = r.forward(x)
    assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name=f"{cell} L{layers} solo y")
    y, hx, tape = r.forward(x, train=True)
    assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name=f"{cell} L{layers} solo y (train)")
    dy = rng.standard_normal(y_ref.shape).astype(np.float32)
    g_ref = m.backward(tape_ref, dy)
    g = r.backward(tape, cp.asarray(dy))
    assert_close(g.dx, g_ref.dx, FP32_ATOL, FP32_RTOL, name=f"{cell} L{layers} solo dx")
    for name, arr in g_ref.params.items():
        assert_close(g.params[name], arr, FP32_ATOL, FP32_RTOL, name=f"{cell} solo {name}")


@pytest.mark.parametrize("dtype", ("tf32", "bfloat16", "float16"))
@pytest.mark.parametrize("cell", ("lstm", "gru", "rnn_tanh", "rnn_relu"))
def test_typed_solo_forward_matches_the_rounding_reference(cp, cell, dtype):
    """GpuRunner(dtype=...) with the one candidate 'solo': every forward launch is the solo
    kernel's typed instantiation (no fallback), and a training step equals the rounding-aware
    reference within the precision's tolerance, y stored as storage values
    (test_gpu_runner_dtype's check: T 7, B 24, H 64, L 2, random data)."""
    from test_gpu_runner_dtype import check_named_family
    check_named_family(cp, cell, dtype, "solo")
