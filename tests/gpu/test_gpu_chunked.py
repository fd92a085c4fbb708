"""Long sequences in chunks on the GPU (rnnrt/chunked.py; marker gpu, skipped without a GPU):
with chunks of 16 steps forced (RNNRT_CHUNK_STEPS), GpuRunner's forward and forward +
backward of 100 steps (6 x 16 + 4: two chunk plans, each captured once per state and
replayed) equal the float64 reference for every cell on the heuristic schedule (the
persistent kernels where they fit) and on the paper's per-step rung, graphs replayed a second
time; the chunked training pass keeps one state per chunk and nothing else grows on a
repeat.

Run on the device: pytest -m gpu tests/gpu/test_gpu_chunked.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

import rnnrt  # noqa: E402
from rnnrt import reference  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close, reduction_atol  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.params import per_layer, to_flat  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402

T, B, H, I, L = 100, 24, 64, 32, 2


def _model(cell, seed=0):
    if cell == "lstm":
        return rnnrt.LSTM(I, H, num_layers=L, seed=seed)
    if cell == "gru":
        return rnnrt.GRU(I, H, num_layers=L, seed=seed)
    return rnnrt.RNN(I, H, num_layers=L, nonlinearity=cell.split("_")[1], seed=seed)


@pytest.mark.parametrize("schedule", ["heuristic", "+wavefront"])
@pytest.mark.parametrize("cell, recompute", [("lstm", False), ("gru", False),
                                             ("rnn_tanh", False), ("rnn_relu", False),
                                             ("lstm", True), ("gru", True)])
def test_chunked_passes_equal_the_reference(cp, monkeypatch, cell, recompute, schedule):
    """(recompute: the chunk states share the gates, each chunk's backward remakes its own:
    plan/recompute.py)"""
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "16")
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    m = _model(cell)
    sw = "auto" if schedule == "heuristic" else {g.name: g.switches for g in ladder()}[schedule]
    r = GpuRunner(m, switches=sw, schedule_cache=False, recompute=recompute)
    rng = np.random.default_rng(1)
    f32 = np.float32
    x = rng.standard_normal((T, B, I)).astype(f32)
    h0 = rng.standard_normal((L, B, H)).astype(f32)
    c0 = rng.standard_normal((L, B, H)).astype(f32) if cell == "lstm" else None
    dy = rng.standard_normal((T, B, H)).astype(f32)
    hx = (h0, c0) if cell == "lstm" else h0
    p64 = per_layer(cp.asnumpy(r.params).astype(np.float64), m.layout)
    y_ref, h_ref, c_ref, cache = reference.forward(cell, p64, x.astype(np.float64), h0, c0)
    g_ref = reference.backward(cell, p64, cache, dy.astype(np.float64))
    flat_ref = to_flat(g_ref["params"], m.layout)
    assert r.long.pieces(T, B, True) == [(t, 16) for t in range(0, 96, 16)] + [(96, 4)]
    for rep in range(2):   # the second replays the captured graphs
        y, hx_n = r.forward(x, hx)
        assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name=f"{cell} y ({rep})")
        assert_close(hx_n[0] if cell == "lstm" else hx_n, h_ref, name=f"{cell} h_n")
        y, hx_n, tape = r.forward(x, hx, train=True)
        assert len(tape.states) == 7
        shared = [n for n in tape.states[0].ws.bufs if n.startswith("act")
                  and tape.states[1].ws.bufs[n] is tape.states[0].ws.bufs[n]]
        assert bool(shared) == recompute, shared
        assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name=f"{cell} y train ({rep})")
        g = r.backward(tape, dy)
        assert_close(g.dx, g_ref["dx"], name=f"{cell} dx ({rep})")
        assert_close(g.dh0, g_ref["dh0"], name=f"{cell} dh0 ({rep})")
        if cell == "lstm":
            assert_close(hx_n[1], c_ref, name="c_n")
            assert_close(g.dc0, g_ref["dc0"], name=f"dc0 ({rep})")
        got = cp.asnumpy(g.flat)
        for e in m.layout.entries:
            assert_close(got[e.offset:e.end], flat_ref[e.offset:e.end], reduction_atol(T * B),
                         FP32_RTOL, name=f"{cell} {e.name} ({rep})")
        del tape
    states = sum(len(v) for v in r.long._states.values())
    assert states == 7   # one per chunk, reused by the second step
    r.close()
