"""GPU tests of the tensor-core cluster kernels (cuda_src/persistent_mmac.cu, family 'mmac',
and their grid form, persistent_mmag.cu; marker gpu, skipped without a GPU).

Whole models through GpuRunner with the family 'mmac' named (the selector given that one
candidate): every forward launch is the kernel's bf16 / fp16 instantiation (no fallback) and
a training step (T 7, B 24: 3 clusters, H 64, L 2, random data) equals the rounding-aware
float64 reference within the precision's tolerance (test_gpu_runner_dtype's check); then
the shapes it is for, one layer, T 100: LSTM H 256 B 8 and B 13 (two clusters, the last
short), LSTM H 512 B 13 and GRU H 512 B 8 (clusters of 16 blocks: the launch opts in to the
non-portable size), RNN tanh H 256 B 20 (three clusters), LSTM H 1024 B 8 and B 32 and GRU
H 1024 B 13 (the grid form: no cluster holds R), the forward's y against the rounding-aware
reference (outputs poisoned: the runner's workspace is NaN-filled before the run), the worst
element named on failure; LSTM H 128 B 256, GRU H 128 B 128 and RNN tanh H 256 B 100 (the
wide form: 8, 8 and 7 clusters of 32, 16 and 15 batches). The training step again with the
fit held to the grid form (H 64: 64 blocks of one unit, B 24: three n8 tiles) and to one
cluster of all 24 batches (the wide form's three tiles), every cell.

Run on the device: pytest -m gpu tests/gpu/test_gpu_mmac.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

import rnnrt  # noqa: E402
from rnnrt import reference  # noqa: E402
from rnnrt.check import assert_close  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.kernels import mmac as MC  # noqa: E402
from rnnrt.params import per_layer  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402
from testkit import mmac_fit_held, mmac_grid_form_held, runs_named_family  # noqa: E402

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@pytest.mark.parametrize("dtype", MC.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_typed_mmac_training_step_matches_the_rounding_reference(cp, cell, dtype):
    from test_gpu_runner_dtype import check_named_family
    check_named_family(cp, cell, dtype, "mmac")


@pytest.mark.parametrize("dtype", MC.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_grid_form_training_step_matches_the_rounding_reference(cp, monkeypatch, cell, dtype):
    from test_gpu_runner_dtype import check_named_family
    with mmac_grid_form_held(monkeypatch):
        check_named_family(cp, cell, dtype, "mmac")


@pytest.mark.parametrize("dtype", MC.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_wide_form_training_step_matches_the_rounding_reference(cp, monkeypatch, cell, dtype):
    from test_gpu_runner_dtype import check_named_family
    with mmac_fit_held(monkeypatch, clusters=1):   # B 24: one cluster of three n8 tiles
        check_named_family(cp, cell, dtype, "mmac")


WIDE = "wide"   # the wide form's row below: clusters of 8, several n8 tiles a cluster


@pytest.mark.parametrize("dtype", MC.MMA_DTYPES)
@pytest.mark.parametrize("cell, H, B, cluster", [
    ("lstm", 128, 256, WIDE), ("gru", 128, 128, WIDE), ("rnn_tanh", 256, 100, WIDE),
    ("lstm", 256, 8, 8), ("lstm", 256, 13, 8), ("lstm", 512, 13, 16), ("gru", 512, 8, 16),
    ("rnn_tanh", 256, 20, 8), ("lstm", 1024, 8, MC.GRID_FORM), ("lstm", 1024, 32, MC.GRID_FORM),
    ("gru", 1024, 13, MC.GRID_FORM)])
def test_mmac_forward_at_its_shapes(cp, cell, H, B, cluster, dtype):
    T = 100
    kw = {"seed": 4}
    model = (rnnrt.LSTM(H, H, **kw) if cell == "lstm" else rnnrt.GRU(H, H, **kw)
             if cell == "gru" else rnnrt.RNN(H, H, nonlinearity="tanh", **kw))
    r = GpuRunner(model, dtype=dtype, schedule_cache=False)
    try:
        kernel, _ = runs_named_family(r, "mmac", T, B)
        assert kernel == (MC.kernel_name(cell, wide=True) if cluster == WIDE
                          else MC.kernel_name(cell, cluster))
        rng = np.random.default_rng(5)
        x = rng.standard_normal((T, B, H)).astype(np.float32)
        h0 = (0.5 * rng.standard_normal((1, B, H))).astype(np.float32)
        c0 = (0.5 * rng.standard_normal((1, B, H))).astype(np.float32) if cell == "lstm" else None
        y, _ = r.forward(cp.asarray(x), (cp.asarray(h0), cp.asarray(c0)) if c0 is not None
                         else cp.asarray(h0))
        p = per_layer(model.flat.astype(np.float64), model.layout)
        ry, _, _, _ = reference.forward(model.cell_name, p, x.astype(np.float64), h0, c0,
                                        dtype=dtype)
        prec = get_precision(dtype)
        assert_close(cp.asnumpy(y), ry, prec.atol, prec.rtol,
                     name=f"{cell} H{H} B{B} {dtype} mmac y")
    finally:
        r.close()
