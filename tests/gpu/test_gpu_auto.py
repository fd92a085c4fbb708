"""The schedule selector on the GPU (marker gpu; skipped without a GPU): GpuRunner's default
switches='auto' computes the reference, forward and backward, for every cell; the choice and
each candidate's time are on the runner; a second runner reads the choice back from the disk
cache without timing; explicit switches run exactly that schedule; the workspace cache stays
within its byte budget over many lengths.

Run on the device: pytest -m gpu tests/gpu/test_gpu_auto.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

import rnnrt  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.kernels.tuning import ScheduleCache  # noqa: E402

T, B, H = 7, 24, 64


def _model(cell, layers=2, inp=H, seed=0):
    if cell == "lstm":
        return rnnrt.LSTM(inp, H, num_layers=layers, seed=seed)
    if cell == "gru":
        return rnnrt.GRU(inp, H, num_layers=layers, seed=seed)
    return rnnrt.RNN(inp, H, num_layers=layers, nonlinearity=cell.split("_")[1], seed=seed)


def _cache(tmp_path):
    return ScheduleCache("test device", tmp_path / "schedules.json")


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_auto_forward_and_backward_equal_the_reference(cp, tmp_path, cell):
    m = _model(cell)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    y_ref, hx_ref, tape_ref = m.forward(x, train=True)
    dy = rng.standard_normal(y_ref.shape).astype(np.float32)
    g_ref = m.backward(tape_ref, dy)
    r = GpuRunner(m, schedule_cache=_cache(tmp_path))
    assert r.switches == "auto"
    y, hx = r.forward(x)
    assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name=f"{cell} auto y")
    y, hx, tape = r.forward(x, train=True)
    g = r.backward(tape, cp.asarray(dy))
    assert_close(g.dx, g_ref.dx, FP32_ATOL, FP32_RTOL, name=f"{cell} auto dx")
    for name, arr in g_ref.params.items():
        assert_close(g.params[name], arr, FP32_ATOL, FP32_RTOL, name=f"{cell} auto {name}")
    for train in (False, True):
        sel = r.schedule(T, B, train)
        assert sel.source == "tuned"
        check_the_fastest_won(sel)
    r.close()


def check_the_fastest_won(sel):
    """The selection took the fastest timed candidate, but for the winner's '+lt' form, which
    replaces it only when faster by selector.LT_MIN_GAIN (so it may have timed up to that much
    faster and lost: the same plan, within noise)."""
    from rnnrt.kernels.selector import LT_MIN_GAIN
    timed = {c["name"]: c["ms"] for c in sel.candidates if c["ms"] is not None}
    won = sel.schedule.name
    lt = won + "+lt"
    assert timed and won in timed, (won, timed)
    assert timed[won] == min(ms for name, ms in timed.items() if name != lt), (won, timed)
    if lt in timed:
        assert timed[won] <= timed[lt] * (1.0 + LT_MIN_GAIN), (won, timed)


class NoTiming:
    """A timer that fails any candidate it is asked to time (the selector then takes the
    heuristic, source 'heuristic', not 'cache')."""

    def __call__(self, sched, shape, repeats):
        raise AssertionError(f"timed {sched.name} of {shape.key()}")

    def release(self):
        pass


def test_the_choice_is_read_back_from_disk_without_timing(cp, tmp_path):
    m = _model("lstm")
    x = np.random.default_rng(2).standard_normal((T, B, H)).astype(np.float32)
    r = GpuRunner(m, schedule_cache=_cache(tmp_path))
    y1, _ = r.forward(x)
    first = r.schedule(T, B)
    r.close()

    r2 = GpuRunner(m, schedule_cache=_cache(tmp_path))
    r2.timer = NoTiming()        # a second runner must not time anything
    y2, _ = r2.forward(x)
    sel = r2.schedule(T, B)
    assert sel.source == "cache" and sel.schedule == first.schedule
    assert_close(y2, y1, 1e-6, 1e-6, name="cached choice, same result")
    r2.close()


def test_explicit_switches_run_exactly_that_schedule(cp, tmp_path):
    m = _model("gru", layers=3)
    x = np.random.default_rng(3).standard_normal((T, B, H)).astype(np.float32)
    for rung in rnnrt.ladder(input_batch=2):
        r = GpuRunner(m, rung.switches, schedule_cache=False)
        y, _ = r.forward(x)
        assert_close(y, m.forward(x)[0], name=f"{rung.name} y")
        sel = r.schedule(T, B)
        assert sel.source == "explicit" and sel.schedule.switches == rung.switches
        key = r.plan_key(T, B)
        assert key.switches == rung.switches and key.family is None
        r.close()


def test_the_workspace_cache_stays_within_its_budget(cp, tmp_path):
    m = _model("lstm", layers=2)
    rng = np.random.default_rng(4)
    r = GpuRunner(m, rnnrt.ladder()[6].switches, cache_bytes=3 << 20, schedule_cache=False)
    for steps in range(5, 60, 3):   # 19 lengths, each its own plan and workspace
        x = rng.standard_normal((steps, B, H)).astype(np.float32)
        y, _ = r.forward(x)
        assert_close(y, m.forward(x)[0], name=f"T {steps} y")
        # within the budget, or one state alone (the newest is never evicted)
        assert r._states.nbytes <= (3 << 20) or len(r._states) == 1, \
            (steps, r._states.nbytes, len(r._states))
    assert r._states.evictions > 0 and len(r._states) < 19
    r.close()
