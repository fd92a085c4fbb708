"""GpuRunner's dtype on the CPU (testkit.CpuSession: float32 NumPy workspaces, the NumPy
executor): the dtype reaches every plan key and the selector's shape, the passes round where
the rounding-aware reference does (within the precision's tolerance: the CPU stand-in
accumulates its GEMMs in float32), outputs come back float32, and a bad dtype is refused
before any work."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from testkit import CpuSession, draw32, model_reference

import rnnrt
from rnnrt.check import assert_close
from rnnrt.plan.switches import ladder
from rnnrt.precision import DTYPES, get_precision, round_to_storage

I, H, L, T, B = 3, 4, 2, 5, 3


def _runner(monkeypatch, model, **kw):
    import rnnrt.session
    from rnnrt.gpu import GpuRunner
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    return GpuRunner(model, schedule_cache=False, **kw)


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
def test_runner_passes_round_like_the_reference(monkeypatch, dtype):
    m = rnnrt.LSTM(I, H, num_layers=L, seed=3)
    rung = ladder(2)[5]   # +input_batch: pretransposed weights, several streams
    r = _runner(monkeypatch, m, switches=rung.switches, dtype=dtype)
    assert r.dtype == dtype and r.plan_key(T, B, True).dtype == dtype
    rng = np.random.default_rng(0)
    x, h0, c0 = draw32(rng, T, B, I), draw32(rng, L, B, H), draw32(rng, L, B, H)
    dy = draw32(rng, T, B, H)
    y, (hn, cn), tape = r.forward(x, (h0, c0), train=True)
    g = r.backward(tape, dy)
    ref = model_reference(m, x, h0, c0, dy, dtype=dtype)
    prec = get_precision(dtype)
    for name, got in (("y", y), ("h_n", hn), ("c_n", cn), ("dx", g.dx), ("dh0", g.dh0),
                      ("dc0", g.dc0)):
        assert got.dtype == np.float32, name
        assert_close(got, ref[name], prec.atol, prec.rtol, name=f"{dtype} {name}")
    want = ref["grads"]
    for e in m.layout.entries:
        s = slice(e.offset, e.offset + int(np.prod(e.shape)))
        assert_close(g.flat[s], want[s], prec.atol, prec.rtol, name=f"{dtype} d{e.name}")
    # y and h_n are the stored h: storage values; the fp32 runner's are not
    assert np.array_equal(round_to_storage(y, dtype), y)
    assert np.array_equal(round_to_storage(hn, dtype), hn)
    r32 = _runner(monkeypatch, m, switches=rung.switches)
    y32, _ = r32.forward(x, (h0, c0))
    assert r32.dtype == "float32" and not np.array_equal(round_to_storage(y32, dtype), y32)


def test_auto_schedule_is_chosen_per_dtype(monkeypatch, tmp_path):
    """switches='auto': the selector's shape carries the dtype (the schedule cache keys on
    it: its file's entry names float16); a 16-bit shape runs no fp32-only persistent family
    (the register-resident backward: choice.FP32_ONLY_FAMILIES) whichever candidate the
    timing picks (the grid, cluster and tensor-core kernels run 16 bits since 0.7.0 / 0.8.0,
    the register-resident and solo forwards since 0.20.0)."""
    import json

    import rnnrt.session
    from rnnrt.gpu import GpuRunner
    from rnnrt.kernels.tuning import ScheduleCache
    from rnnrt.plan import forward_plan
    monkeypatch.setenv("RNNRT_AUTOTUNE", "1")
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    path = tmp_path / "schedules.json"
    m = rnnrt.GRU(I, H, num_layers=L, seed=1)
    r = GpuRunner(m, dtype="float16", schedule_cache=ScheduleCache("cpu", path))
    rng = np.random.default_rng(1)
    y, _ = r.forward(draw32(rng, T, B, I))
    assert r.schedule(T, B).source == "tuned"
    shapes = [k for dev in json.loads(path.read_text())["devices"].values() for k in dev]
    assert shapes and all("|float16|" in k for k in shapes), shapes
    key = r.plan_key(T, B)
    assert key.dtype == "float16"
    from rnnrt.kernels.choice import FP32_ONLY_FAMILIES, choose_persistent
    runs = any(op.kind == "persistent" for op in forward_plan(key).ops)
    family = choose_persistent(key).family if key.switches.persistent else None
    assert runs == (family is not None) and family not in FP32_ONLY_FAMILIES, family
    assert np.array_equal(round_to_storage(y, "float16"), y)


def test_a_bad_dtype_is_refused_before_any_work(monkeypatch):
    import rnnrt.session
    from rnnrt.gpu import GpuRunner

    class NoSession:
        def __init__(self):
            raise AssertionError("a session was opened for a bad dtype")

    monkeypatch.setattr(rnnrt.session, "GpuSession", NoSession)
    m = rnnrt.RNN(I, H)
    for bad in ("fp16", "half", None, np.float16):
        with pytest.raises(ValueError, match=r"dtype: expected one of " + str(list(DTYPES))
                           .replace("[", r"\[").replace("]", r"\]")):
            GpuRunner(m, dtype=bad)


@pytest.mark.parametrize("dtype", ("tf32", "bfloat16", "float16"))
@pytest.mark.parametrize("cell", ("lstm", "gru", "rnn_tanh"))
@pytest.mark.parametrize("family", ("regs", "solo"))
def test_small_hidden_forwards_run_every_precision(monkeypatch, family, cell, dtype):
    """The selector given the one candidate 'regs' (the register-resident kernel) or 'solo'
    (the block-persistent one) at a tf32 / 16-bit dtype: the forward runs that kernel (its
    typed instantiation on a GPU; here its NumPy twin with the typed kernels' rounding), no
    fallback; the training step's backward is not the register-resident one (fp32 only:
    choice.FP32_ONLY_FAMILIES 'regs_bwd') and says so where asked for; forward and gradients within the precision's tolerance of the
    rounding-aware reference, the stored h storage values."""
    from rnnrt.kernels.choice_backward import regs_backward
    from testkit import cell_model, runs_named_family
    m = cell_model(cell, I, H, L, 5)
    r = _runner(monkeypatch, m, dtype=dtype)
    kernel, launches = runs_named_family(r, family, T, B)
    assert launches == L and f"_persistent_{family}_" in kernel, (kernel, launches)
    key = r.plan_key(T, B, True)
    assert "fp32 only" in regs_backward(replace(key, backward="regs")).fallback
    rng = np.random.default_rng(4)
    lstm = cell == "lstm"
    x, h0, c0 = draw32(rng, T, B, I), draw32(rng, L, B, H), draw32(rng, L, B, H)
    dy = draw32(rng, T, B, H)
    y, hx, tape = r.forward(x, (h0, c0) if lstm else h0, train=True)
    g = r.backward(tape, dy)
    ref = model_reference(m, x, h0, c0 if lstm else None, dy, dtype=dtype)
    prec = get_precision(dtype)
    hn = hx[0] if lstm else hx
    for name, got in (("y", y), ("h_n", hn), ("dx", g.dx), ("dh0", g.dh0)):
        assert_close(got, ref[name], prec.atol, prec.rtol, name=f"{cell} {dtype} {family} {name}")
    want = ref["grads"]
    for e in m.layout.entries:
        s = slice(e.offset, e.offset + int(np.prod(e.shape)))
        assert_close(g.flat[s], want[s], prec.atol, prec.rtol, name=f"{dtype} d{e.name}")
    if prec.rounds:
        assert np.array_equal(round_to_storage(y, dtype), y)
