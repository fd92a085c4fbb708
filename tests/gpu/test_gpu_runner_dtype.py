"""GpuRunner(dtype=...) on the GPU (marker gpu; skipped without a GPU): every cell x every
ladder rung x tf32 / bfloat16 / float16, forward and backward (a training step), against
the rounding-aware float64 reference (rnnrt.reference with the same dtype: the same rounding
points; tf32's: every GEMM's operands TF32-rounded),
at the precision's documented tolerance (rnnrt.precision.Precision.atol / rtol), the worst
element named. y and h_n come back float32 holding storage values; a persistent rung of a
runner at any precision runs the persistent kernels' typed instantiations (issue 24); the
'auto' schedule runs at each precision.

Run on the device: pytest -m gpu tests/gpu/test_gpu_runner_dtype.py
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
from rnnrt.params import per_layer, to_flat  # noqa: E402
from rnnrt.plan import backward_plan, forward_plan  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402
from rnnrt.precision import get_precision, round_to_storage  # noqa: E402

T, B, I, H, L = 7, 24, 64, 64, 2
DTYPES = ("tf32", "bfloat16", "float16")


def _model(cell, seed=0):
    kw = {"num_layers": L, "seed": seed}
    if cell == "lstm":
        return rnnrt.LSTM(I, H, **kw)
    if cell == "gru":
        return rnnrt.GRU(I, H, **kw)
    return rnnrt.RNN(I, H, nonlinearity=cell.split("_")[1], **kw)


def _check_step(cp, runner, model, dtype, what, seed=1):
    """A training step of ``runner`` on random data against the reference of ``dtype``."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    lstm = model.cell_name == "lstm"
    x = rng.standard_normal((T, B, I)).astype(f32)
    h0 = (0.5 * rng.standard_normal((L, B, H))).astype(f32)
    c0 = (0.5 * rng.standard_normal((L, B, H))).astype(f32) if lstm else None
    dy = rng.standard_normal((T, B, H)).astype(f32)
    out = runner.forward(cp.asarray(x), (cp.asarray(h0), cp.asarray(c0)) if lstm
                         else cp.asarray(h0), train=True)
    y, hx, tape = out
    g = runner.backward(tape, cp.asarray(dy))
    prec = get_precision(dtype)
    ref_dtype = dtype
    p = per_layer(model.flat.astype(np.float64), model.layout)
    ry, rhn, rcn, cache = reference.forward(model.cell_name, p, x.astype(np.float64), h0, c0,
                                            dtype=ref_dtype)
    rg = reference.backward(model.cell_name, p, cache, dy)
    hn, cn = hx if lstm else (hx, None)
    got = {"y": y, "h_n": hn, "c_n": cn, "dx": g.dx, "dh0": g.dh0, "dc0": g.dc0}
    want = {"y": ry, "h_n": rhn, "c_n": rcn, "dx": rg["dx"], "dh0": rg["dh0"],
            "dc0": rg["dc0"]}
    for name, r in want.items():
        if r is None:
            continue
        assert got[name].dtype == np.float32, f"{what}: {name} {got[name].dtype}"
        assert_close(got[name], r, prec.atol, prec.rtol, name=f"{what}: {name}")
    flat = cp.asnumpy(g.flat)
    ref_flat = to_flat(rg["params"], model.layout)
    for e in model.layout.entries:
        s = slice(e.offset, e.offset + int(np.prod(e.shape)))
        # weight gradients sum over T*B rows: the tolerance scales with the sum's size
        scale = max(1.0, float(np.max(np.abs(ref_flat[s]))))
        assert_close(flat[s], ref_flat[s], prec.atol * scale, prec.rtol,
                     name=f"{what}: d{e.name}")
    if prec.rounds:   # the stored h: storage values exactly
        ya = cp.asnumpy(y)
        assert np.array_equal(round_to_storage(ya, dtype), ya), f"{what}: y not {dtype}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_every_rung_at_every_precision(cp, cell, dtype):
    model = _model(cell)
    for rung in ladder():
        r = GpuRunner(model, switches=rung.switches, dtype=dtype, schedule_cache=False)
        try:
            assert r.dtype == dtype
            _check_step(cp, r, model, dtype, f"{cell} {dtype} {rung.name}")
            key = r.plan_key(T, B, True)
            assert key.dtype == dtype
            if rung.switches.persistent:   # the typed kernels run (issue 24)
                fb = forward_plan(key).fallback
                assert fb is None, fb
        finally:
            r.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_at_every_precision(cp, tmp_path, dtype):
    from rnnrt.kernels.tuning import ScheduleCache
    model = _model("lstm", seed=2)
    r = GpuRunner(model, dtype=dtype,
                  schedule_cache=ScheduleCache("test device", tmp_path / "s.json"))
    try:
        _check_step(cp, r, model, dtype, f"lstm {dtype} auto")
        key = r.plan_key(T, B, True)
        assert key.dtype == dtype
        if get_precision(dtype).rounds:   # a persistent kernel the selector took is typed
            from rnnrt.kernels.typed import persistent_expression
            ops = forward_plan(key).ops + backward_plan(key).ops
            for op in ops:
                if op.kind == "persistent":   # (raises for a kernel with no such instantiation)
                    assert persistent_expression(op.name, dtype) is not None, op.name
    finally:
        r.close()


def check_named_family(cp, cell, dtype, family):
    """GpuRunner(dtype=...) with the selector's one candidate persistent family ``family``
    (test_gpu_regs, test_gpu_solo: their typed instantiations): every forward launch is that
    family's kernel at ``dtype``'s typed instantiation (no fallback), and a training step
    passes ``_check_step`` (the rounding-aware reference, y stored as storage values)."""
    from rnnrt.kernels.typed import persistent_expression
    from testkit import runs_named_family
    m = _model(cell)
    r = GpuRunner(m, dtype=dtype, schedule_cache=False)
    kernel, _ = runs_named_family(r, family, T, B)
    assert persistent_expression(kernel, dtype).startswith(kernel + "_t<")
    _check_step(cp, r, m, dtype, f"{cell} {dtype} {family}")
