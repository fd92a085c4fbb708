"""GPU (marker gpu), issue 24: the tensor-core grid kernels (cuda_src/persistent_mma.cu, family
'mma') -- every cell x {bfloat16, float16} x shapes the fit takes (H 128 / 256 / 512 / 1024,
B 8 / 64 / 256 where it fits), forward, on the graph executor with every buffer poisoned
(NaN) first, against the float64 rounding-aware reference of the same precision within
precision.get_precision(dtype).atol / rtol (or, as the typed grid kernel is judged, within
RUNG_FACTOR x the cuBLAS rung's own error on the same case), the worst element reported;
the plans say the mma kernel ran (no fallback) and the stored outputs are representable. Then
GpuRunner with the selector's one candidate 'mma' at bfloat16 (the family through the
runner's own path), against the model's rounding-aware reference.

A few minutes on an H100 (8 instantiations compiled once, ~20 s). Run:
  pytest -m gpu tests/gpu/test_gpu_mma.py
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

from rnnrt.kernels import choice as C  # noqa: E402
from rnnrt.kernels import mma as MM  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
SHAPES = [(10, b, h, h, 1) for h in (128, 256, 512, 1024) for b in (8, 64, 256)] + \
    [(6, 4, 24, 40, 2)]   # T, B, I, H, L; the last: H 40 (masked k16 steps), two layers


def _fits(cell, shape, dtype):
    import cupy

    from rnnrt.kernels.limits import DeviceLimits
    return MM.mma_fit(cell, shape[3], shape[1], DeviceLimits.from_device(cupy).props(), dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"H{s[3]}B{s[1]}L{s[4]}")
@pytest.mark.parametrize("dtype", MM.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_mma_against_the_rounding_aware_reference(cp, ctx, cell, dtype, shape):
    T, B, I, H, L = shape
    fit = _fits(cell, shape, dtype)
    if not fit.ok:
        pytest.skip(f"the fit declines: {fit.reason}")
    p = get_precision(dtype)
    case = reference_case(cell, dtype, shape)
    ref = case[4]
    key = PlanKey(cell, T, B, I, H, L, True, PERSISTENT, dtype=dtype, family="mma")
    what = f"{cell} {dtype} H{H} B{B} L{L} mma"
    from rnnrt.plan import forward_plan
    fplan = forward_plan(key)
    assert fplan.fallback is None, f"{what}: fell back: {fplan.fallback}"
    ran = {op.name for op in fplan.ops if getattr(op, "kind", "") == "persistent"}
    assert ran == {MM.kernel_name(cell)}, f"{what}: ran {ran}"
    got, _, _ = run_graph(cp, ctx, key, case)
    rung_got = {}

    def rung(name):
        if not rung_got:
            rkey = PlanKey(cell, T, B, I, H, L, True, RUNG, dtype=dtype)
            rung_got.update(run_graph(cp, ctx, rkey, case)[0])
        return rung_got[name]
    for name in ("y", "h_n", "c_n"):
        if name in got and ref[name] is not None:
            assert not np.isnan(np.asarray(got[name])).any(), f"{what} {name}: NaN left"
            close_as_the_rungs(got[name], ref[name], p, f"{what} {name}",
                               lambda n=name: rung(n))
    check_rounded(f"{what} y", got["y"], dtype)


@pytest.mark.parametrize("cell", CELLS)
def test_gpu_runner_runs_the_named_mma_family(cp, cell):
    """GpuRunner at bfloat16 with the selector's one candidate 'mma': the key names the
    family, the kernel runs (no fallback), and y equals the runner's cuBLAS rung at the same
    precision (both the rungs' math under the storage rule) within the precision's
    tolerance."""
    import rnnrt
    from rnnrt.check import assert_close
    from rnnrt.gpu import GpuRunner
    T, B, H, dtype = 12, 64, 256, "bfloat16"
    make = {"lstm": lambda: rnnrt.LSTM(H, H, seed=0), "gru": lambda: rnnrt.GRU(H, H, seed=0)}
    m = make.get(cell, lambda: rnnrt.RNN(H, H, nonlinearity=cell.split("_")[1], seed=0))()
    r = GpuRunner(m, schedule_cache=False, dtype=dtype)
    r.selector.candidates_fn = lambda shape, device: (C.persistent_schedule("mma"),)
    key = r.plan_key(T, B, False)
    assert key.family == "mma", key
    choice = C.choose_persistent(key)
    assert choice.family == "mma" and choice.fallback is None, choice.describe()
    x = np.random.default_rng(2).standard_normal((T, B, H)).astype(np.float32)
    y, _ = r.forward(x)
    base = GpuRunner(m, switches=RUNG, schedule_cache=False, dtype=dtype)
    y_ref, _ = base.forward(x)
    y, y_ref = (np.asarray(a.get() if hasattr(a, "get") else a) for a in (y, y_ref))
    assert not np.isnan(y).any()
    p = get_precision(dtype)
    assert_close(y, y_ref, p.atol, p.rtol, name=f"{cell} {dtype} GpuRunner mma y vs the rung")
