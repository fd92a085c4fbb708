"""GPU (marker gpu), issue 24: the tensor-core backward grid kernels
(cuda_src/persistent_mma_bwd.cu; a training key of family 'mma' with the persistent backward)
-- every cell x {bfloat16, float16} x a few shapes the fit takes (H 40 two layers, H 128 B 8,
H 256 B 64, H 512 B 64, H 1024 B 8 / 64), forward and backward on the graph executor with
every buffer poisoned (NaN) first, against the float64 rounding-aware reference of the same
precision within precision.get_precision(dtype).atol / rtol (or, as the typed persistent
kernels are judged, within RUNG_FACTOR x the cuBLAS rung's own error on the same case), the
worst element reported; the plans say the mma backward kernel ran (no fallback); a second
run gives the same bits (no atomics in any sum: the warps' partial sums are added in warp
order). Then GpuRunner training at bfloat16 with the selector's one candidate 'mma+pbwd'
(the schedule through the runner's own path) against its cuBLAS rung.

A few minutes on an H100 (the forward and backward mma modules compiled once, ~45 s). Run:
  pytest -m gpu tests/gpu/test_gpu_mma_bwd.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from test_gpu_precision import reference_case, run_graph  # noqa: E402
from test_gpu_typed_persistent import PERSISTENT, RUNG, close_as_the_rungs  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)

from rnnrt.kernels import choice as C  # noqa: E402
from rnnrt.kernels import mma as MM  # noqa: E402
from rnnrt.kernels import mma_bwd as MB  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
SHAPES = [(6, 4, 24, 40, 2), (10, 8, 128, 128, 1), (8, 64, 256, 256, 1),
          (6, 64, 512, 512, 1), (5, 8, 1024, 1024, 1), (4, 64, 1024, 1024, 1)]
"""T, B, I, H, L: H 40 (masked k16 steps, two layers), then the issue's sizes (LSTM K = 4H:
one dg tile at H 128 B 8, several at B 64; H 1024 B 64: 16 tiles of 256 columns)."""


def _fit(cell, shape, dtype):
    import cupy

    from rnnrt.kernels.limits import DeviceLimits
    return MB.mma_bwd_fit(cell, shape[3], shape[1], DeviceLimits.from_device(cupy).props(),
                          dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"H{s[3]}B{s[1]}L{s[4]}")
@pytest.mark.parametrize("dtype", MM.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_mma_backward_against_the_rounding_aware_reference(cp, ctx, cell, dtype, shape):
    from rnnrt.plan.backward import backward_plan
    T, B, I, H, L = shape
    fit = _fit(cell, shape, dtype)
    if not fit.ok:
        pytest.skip(f"the fit declines: {fit.reason}")
    p = get_precision(dtype)
    case = reference_case(cell, dtype, shape)
    layout, ref = case[0], case[4]
    key = PlanKey(cell, T, B, I, H, L, True, PERSISTENT, train=True, dtype=dtype,
                  family="mma", backward="persistent")
    what = f"{cell} {dtype} H{H} B{B} L{L} mma+pbwd"
    bplan = backward_plan(key)
    assert bplan.fallback is None, f"{what}: fell back: {bplan.fallback}"
    ran = {op.name for op in bplan.ops if getattr(op, "kind", "") == "persistent"}
    assert ran == {MB.kernel_name(cell)}, f"{what}: ran {ran} ({bplan.fit})"
    got, _, _ = run_graph(cp, ctx, key, case)
    rung_got = {}

    def rung(name, sl=slice(None)):
        if not rung_got:
            rkey = PlanKey(cell, T, B, I, H, L, True, RUNG, train=True, dtype=dtype)
            rung_got.update(run_graph(cp, ctx, rkey, case)[0])
        return rung_got[name][sl]
    for name in ("y", "h_n", "c_n", "dx", "dh0", "dc0"):
        if name in got and ref[name] is not None:
            assert not np.isnan(np.asarray(got[name])).any(), f"{what} {name}: NaN left"
            close_as_the_rungs(got[name], ref[name], p, f"{what} {name}",
                               lambda n=name: rung(n))
    for e in layout.entries:
        sl = slice(e.offset, e.end)
        close_as_the_rungs(got["grads"][sl], ref["grads"][sl], p, f"{what} {e.name}",
                           lambda sl=sl: rung("grads", sl))
    again, _, _ = run_graph(cp, ctx, key, case)   # re-poisoned: the same bits
    for name, a in got.items():
        np.testing.assert_array_equal(again[name], a, err_msg=f"{what}: {name} differs "
                                                              f"between runs")


@pytest.mark.parametrize("cell", ("lstm", "gru"))
def test_gpu_runner_trains_with_the_mma_candidate(cp, cell):
    """GpuRunner at bfloat16 with the selector's one candidate 'mma+pbwd': the key names the
    family and the persistent backward, the tensor-core backward runs (no fallback), and
    dx and the weight gradients equal the runner's cuBLAS rung at the same precision within
    the precision's tolerance."""
    import rnnrt
    from rnnrt.check import assert_close, reduction_atol
    from rnnrt.gpu import GpuRunner
    T, B, H, dtype = 12, 64, 256, "bfloat16"
    m = (rnnrt.LSTM if cell == "lstm" else rnnrt.GRU)(H, H, seed=0)
    r = GpuRunner(m, schedule_cache=False, dtype=dtype)
    r.selector.candidates_fn = lambda shape, device: (
        C.with_persistent_backward(C.persistent_schedule("mma")),)
    key = r.plan_key(T, B, True)
    assert (key.family, key.backward) == ("mma", "persistent"), key
    choice = C.choose_persistent_backward(key)
    assert choice.runs and choice.fit.kernel == MB.kernel_name(cell), choice.describe()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    dy = rng.standard_normal((T, B, H)).astype(np.float32)
    y, _, tape = r.forward(x, train=True)
    g = r.backward(tape, cp.asarray(dy))
    base = GpuRunner(m, switches=RUNG, schedule_cache=False, dtype=dtype)
    y_ref, _, tape_ref = base.forward(x, train=True)
    g_ref = base.backward(tape_ref, cp.asarray(dy))
    p = get_precision(dtype)

    def host(a):
        return np.asarray(a.get() if hasattr(a, "get") else a)
    assert not np.isnan(host(g.dx)).any()
    assert_close(host(g.dx), host(g_ref.dx), p.atol, p.rtol, name=f"{cell} mma+pbwd dx")
    for name, arr in g_ref.params.items():
        assert_close(host(g.params[name]), host(arr), reduction_atol(T * B, p.atol), p.rtol,
                     name=f"{cell} mma+pbwd {name}")
    r.close()
    base.close()
