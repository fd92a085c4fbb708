"""Long sequences in chunks (rnnrt/chunked.py) on the CPU (testkit.CpuSession: NumPy
workspaces, the NumPy executor in CuPy's place), with a small chunk forced through
RNNRT_CHUNK_STEPS: the chunked forward and forward + backward equal the float64 reference
for every cell (the results start as NaN: a step no chunk writes shows up), the weight
gradients of all chunks accumulate, and a dropped state carry — forward or backward — or a
dropped accumulation is caught."""
from __future__ import annotations

import numpy as np
import pytest
from testkit import CpuSession, draw32, model_reference

import rnnrt
from rnnrt.check import FP32_RTOL, assert_close, reduction_atol
from rnnrt.chunked import ChunkedTape, pieces

I, H, B, L = 3, 5, 2, 2
CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
MODELS = {"lstm": rnnrt.LSTM, "gru": rnnrt.GRU, "rnn_tanh": rnnrt.RNN, "rnn_relu": rnnrt.RNN}


def _model(cell, seed=0, **kw):
    if cell.startswith("rnn_"):
        kw["nonlinearity"] = cell[4:]
    return MODELS[cell](I, H, num_layers=L, seed=seed, **kw)


@pytest.fixture
def runner(monkeypatch):
    """-> make(model): a GpuRunner on CpuSession (heuristic schedules), chunks of 4 steps."""
    import rnnrt.session
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "4")
    from rnnrt.gpu import GpuRunner
    return lambda model: GpuRunner(model, schedule_cache=False)


def test_pieces_cover_the_sequence_in_powers_of_two():
    for steps in range(1, 300):
        for chunk in (1, 4, 16, 128):
            got = pieces(steps, chunk)
            assert [t0 for t0, _ in got] == list(np.cumsum([0] + [n for _, n in got])[:-1])
            assert sum(n for _, n in got) == steps
            assert all(n <= chunk and n & (n - 1) == 0 for _, n in got)
    assert pieces(10_000, 128)[-1] == (9984, 16) and len(pieces(10_000, 128)) == 79


def _reference(r, x, hx, dy=None, dhx=None):
    """testkit.model_reference on the runner's weights, hx / dhx split by the cell."""
    cell = r.model.cell_name
    h0, c0 = (hx if cell == "lstm" else (hx, None))
    dh_n, dc_n = (dhx if cell == "lstm" and dhx is not None else (dhx, None))
    ref = model_reference(r.model, x, h0, c0, dy, dh_n, dc_n, flat=r.params)
    if dy is None:
        return ref["y"], ref["h_n"], ref["c_n"]
    g = {"dx": ref["dx"], "dh0": ref["dh0"], "dc0": ref["dc0"]}
    return ref["y"], ref["h_n"], ref["c_n"], g, ref["grads"]


def _states(cell, rng, T):
    x = draw32(rng, T, B, I)
    hx = draw32(rng, L, B, H)
    if cell == "lstm":
        hx = (hx, draw32(rng, L, B, H))
    return x, hx


def _check_forward(r, x, hx, out):
    cell = r.model.cell_name
    y, h_n, c_n = _reference(r, x, hx)
    assert_close(out[0], y, name=f"{cell} y")
    got_h = out[1][0] if cell == "lstm" else out[1]
    assert_close(got_h, h_n, name=f"{cell} h_n")
    if cell == "lstm":
        assert_close(out[1][1], c_n, name=f"{cell} c_n")


@pytest.mark.parametrize("cell", CELLS)
def test_chunked_forward_equals_the_reference(runner, cell):
    r = runner(_model(cell))
    rng = np.random.default_rng(1)
    x, hx = _states(cell, rng, 11)                      # pieces 4, 4, 2, 1
    assert r.long.pieces(11, B, False) == [(0, 4), (4, 4), (8, 2), (10, 1)]
    _check_forward(r, x, hx, r.forward(x, hx))
    _check_forward(r, x, hx, r.forward(x, hx))          # replayed: the same
    assert r.long.pieces(4, B, False) is None           # one chunk: unchunked, as before


def _check_grads(r, x, hx, dy, dhx, g, accumulated=None, scale=1.0):
    cell = r.model.cell_name
    ref = _reference(r, x, hx, dy, dhx)
    gref, flat = ref[3], ref[4]
    assert_close(g.dx, gref["dx"], name=f"{cell} dx")
    assert_close(g.dh0, gref["dh0"], name=f"{cell} dh0")
    if cell == "lstm":
        assert_close(g.dc0, gref["dc0"], name=f"{cell} dc0")
    want = flat * scale if accumulated is None else accumulated + flat
    atol = reduction_atol(x.shape[0] * x.shape[1])
    for e in r.model.layout.entries:
        assert_close(g.flat[e.offset:e.end], want[e.offset:e.end], atol, FP32_RTOL,
                     name=f"{cell} {e.name}")


@pytest.mark.parametrize("cell", CELLS)
def test_chunked_training_equals_the_reference(runner, cell):
    r = runner(_model(cell, seed=3))
    rng = np.random.default_rng(2)
    T = 11
    x, hx = _states(cell, rng, T)
    dy = draw32(rng, T, B, H)
    dhx = _states(cell, rng, 1)[1]
    y, hx_n, tape = r.forward(x, hx, train=True)
    assert isinstance(tape, ChunkedTape) and len(tape.states) == 4
    _check_forward(r, x, hx, (y, hx_n))
    g = r.backward(tape, dy, dhx)
    _check_grads(r, x, hx, dy, dhx, g)
    first = g.flat.copy()
    # a second step on the same states (graphs replayed), accumulating into the first's
    _, _, tape = r.forward(x, hx, train=True)
    g = r.backward(tape, dy, dhx, accumulate=True)
    _check_grads(r, x, hx, dy, dhx, g, accumulated=first)


def test_two_live_chunked_tapes_keep_their_own_activations(runner):
    """A module applied twice: the second forward's chunks take states of their own."""
    r = runner(_model("lstm", seed=4))
    rng = np.random.default_rng(3)
    (xa, hxa), (xb, hxb) = _states("lstm", rng, 9), _states("lstm", rng, 9)
    dya, dyb = draw32(rng, 9, B, H), draw32(rng, 9, B, H)
    _, _, ta = r.forward(xa, hxa, train=True)
    _, _, tb = r.forward(xb, hxb, train=True)
    assert not {id(s) for s in ta.states} & {id(s) for s in tb.states}
    ga = r.backward(ta, dya, None)
    _check_grads(r, xa, hxa, dya, None, ga)
    gb = r.backward(tb, dyb, None)
    _check_grads(r, xb, hxb, dyb, None, gb)


def test_batch_first_and_no_dx(runner):
    r = runner(_model("gru", seed=5, batch_first=True))
    rng = np.random.default_rng(4)
    x, hx = _states("gru", rng, 10)
    dy = draw32(rng, 10, B, H)
    y, _, tape = r.forward(np.ascontiguousarray(x.transpose(1, 0, 2)), hx, train=True)
    ref = _reference(r, x, hx, dy, None)
    assert_close(y, ref[0].transpose(1, 0, 2), name="y (batch_first)")
    g = r.backward(tape, np.ascontiguousarray(dy.transpose(1, 0, 2)), need_dx=False)
    assert g.dx is None
    assert_close(g.dh0, ref[3]["dh0"], name="dh0")


@pytest.mark.parametrize("fault", ["forward carry", "backward carry", "accumulation"])
def test_a_planted_fault_is_caught(runner, monkeypatch, fault):
    """Drop the h carry between forward chunks, the dh carry between backward chunks, or the
    accumulation of the earlier chunks' weight gradients: the comparison fails."""
    from rnnrt.exec.workspace import Workspace
    r = runner(_model("lstm", seed=6))
    rng = np.random.default_rng(5)
    x, hx = _states("lstm", rng, 11)
    dy = draw32(rng, 11, B, H)
    if fault == "accumulation":
        import rnnrt.plan.backward as bp
        real = bp.backward_plan
        monkeypatch.setattr(bp, "backward_plan", lambda key, acc=False, dx=True:
                            real(key, False, dx))
    else:
        name = "h_n" if fault == "forward carry" else "dh0"
        real_read = Workspace.read

        def read(self, what, copy=True):
            a = real_read(self, what, copy)
            return a * 0 if what == name else a
        monkeypatch.setattr(Workspace, "read", read)
    y, hx_n, tape = r.forward(x, hx, train=True)
    g = r.backward(tape, dy, None)
    with pytest.raises(AssertionError):
        if fault == "forward carry":
            _check_forward(r, x, hx, (y, (hx[0] * 0 + hx_n[0], hx_n[1])))
        else:
            _check_grads(r, x, hx, dy, None, g)


def test_training_chunks_keep_only_the_activations(runner):
    """Each chunk state beyond a key's first owns only the buffers the backward reads from
    the forward that grow with the steps; W.x and every gradient buffer are shared."""
    r = runner(_model("lstm", seed=7))
    rng = np.random.default_rng(6)
    x, hx = _states("lstm", rng, 12)
    _, _, tape = r.forward(x, hx, train=True)
    first, second = tape.states[0], tape.states[1]
    own = {n for n, a in second.ws.bufs.items() if a is not first.ws.bufs[n]}
    assert own == set(r.long._kept[tape.keys[1]])
    assert own and not any(n.startswith(("gx", "dgx", "dhin", "dhr", "dc", "dx")) for n in own)
    assert {"x"} <= own and any(n.startswith("h") for n in own)


@pytest.mark.parametrize("rung", ["naive", "+pretranspose", "+wavefront", "+persistent"])
def test_chunked_training_on_explicit_schedules(monkeypatch, rung):
    """Explicit switches run chunked too (the naive per-op schedule, pre-transposed weights
    shared by the chunks, the wavefront, the persistent forward): the same gradients."""
    import rnnrt.session
    from rnnrt.gpu import GpuRunner
    from rnnrt.plan.switches import ladder
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "4")
    sw = {g.name: g.switches for g in ladder()}[rung]
    r = GpuRunner(_model("lstm", seed=8), switches=sw, schedule_cache=False)
    rng = np.random.default_rng(7)
    x, hx = _states("lstm", rng, 10)
    dy = draw32(rng, 10, B, H)
    y, hx_n, tape = r.forward(x, hx, train=True)
    _check_forward(r, x, hx, (y, hx_n))
    _check_grads(r, x, hx, dy, None, r.backward(tape, dy, None))
    _check_forward(r, x, hx, r.forward(x, hx))


def test_the_chunk_length_rule(runner, monkeypatch):
    """Unforced, the chunk is the largest power of two (16 .. 1024) whose step-dependent
    workspace of the largest candidate schedule fits RNNRT_CHUNK_BYTES; 0 never chunks."""
    from rnnrt.chunked import MAX_CHUNK_STEPS, step_bytes
    r = runner(_model("lstm"))
    monkeypatch.delenv("RNNRT_CHUNK_STEPS")
    assert r.long.length(B, False) == MAX_CHUNK_STEPS       # a tiny model: the longest
    per = max(step_bytes(k) for k in r.long._candidate_keys(B, True))
    monkeypatch.setenv("RNNRT_CHUNK_BYTES", str(per * 100))
    r = runner(_model("lstm"))
    assert r.long.length(B, True) == 64
    assert r.long.pieces(64, B, True) is None and len(r.long.pieces(65, B, True)) == 2
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "0")
    assert r.long.pieces(10_000, B, True) is None
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "-3")
    with pytest.raises(ValueError, match="RNNRT_CHUNK_STEPS"):
        r.long.pieces(10, B, False)


def test_idle_chunk_states_are_bounded_by_the_last_pass(runner):
    """Between passes the idle training states of the last pass stay (a training loop's
    next step reuses them); a shorter pass drops those it does not take; drop_idle frees
    every idle one and none a live tape holds."""
    r = runner(_model("gru", seed=9))
    rng = np.random.default_rng(8)

    def count():
        return sum(len(v) for v in r.long._states.values())

    x, hx = _states("gru", rng, 12)                      # 3 chunks of 4
    _, _, tape = r.forward(x, hx, train=True)
    del tape
    assert count() == 3
    x, hx = _states("gru", rng, 5)                       # 4 + 1: one state of key 4 kept
    _, _, tape = r.forward(x, hx, train=True)
    assert count() == 2
    assert r.long.drop_idle() == 0                       # both held by the live tape
    del tape
    assert r.long.drop_idle() == 2 and count() == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_chunks_carry_the_precision(runner, dtype):
    """A 16-bit runner's chunk plans run at its dtype: the chunked forward + backward equals
    the rounding-aware float64 reference (the state carried between chunks is the stored h),
    and is not the fp32 result."""
    from rnnrt.gpu import GpuRunner
    from rnnrt.precision import get_precision
    p = get_precision(dtype)
    rng = np.random.default_rng(3)
    m = _model("lstm", seed=4)
    r = GpuRunner(m, schedule_cache=False, dtype=dtype)
    T = 11                                   # chunks 4 + 4 + 2 + 1
    x, hx = _states("lstm", rng, T)
    dy = draw32(rng, T, B, H)
    y, (h_n, c_n), tape = r.forward(x, hx, train=True)
    assert isinstance(tape, ChunkedTape)
    g = r.backward(tape, dy)
    ref = model_reference(m, x, *hx, dy, dtype=dtype, flat=r.params)
    assert_close(y, ref["y"], p.atol, p.rtol, name=f"{dtype} y")
    assert_close(h_n, ref["h_n"], p.atol, p.rtol, name=f"{dtype} h_n")
    assert_close(c_n, ref["c_n"], p.atol, p.rtol, name=f"{dtype} c_n")
    assert_close(g.dx, ref["dx"], p.atol, p.rtol, name=f"{dtype} dx")
    assert_close(r.grads, ref["grads"],
                 reduction_atol(T * B, p.atol), p.rtol, name=f"{dtype} grads")
    fp32 = model_reference(m, x, *hx, flat=r.params)["y"]
    assert np.abs(np.asarray(y) - fp32).max() > 1e-4, "the chunks ran in fp32"


@pytest.fixture
def recompute_runner(monkeypatch):
    """``runner``'s, with recompute=True."""
    import rnnrt.session
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "4")
    from rnnrt.gpu import GpuRunner
    return lambda model: GpuRunner(model, schedule_cache=False, recompute=True)


@pytest.mark.parametrize("cell", CELLS)
def test_recomputing_chunks_keep_no_gates_and_equal_the_reference(recompute_runner, cell):
    """recompute=True: a chunk state keeps x, h (and c), not the gates, which its states
    share; every chunk's gates are overwritten by the chunks after it before the backward
    runs, so gradients equal to the reference's show that each chunk's backward remade its
    own (two live tapes: the second forward's chunks overwrite the first's gates too)."""
    r = recompute_runner(_model(cell, seed=8))
    rng = np.random.default_rng(7)
    (xa, hxa), (xb, hxb) = _states(cell, rng, 11), _states(cell, rng, 11)
    dya, dyb = draw32(rng, 11, B, H), draw32(rng, 11, B, H)
    dhx = _states(cell, rng, 1)[1]
    _, _, ta = r.forward(xa, hxa, train=True)
    _, _, tb = r.forward(xb, hxb, train=True)
    first, second = ta.states[0], ta.states[1]
    own = {n for n, a in second.ws.bufs.items() if a is not first.ws.bufs[n]}
    gates = {n for n in first.ws.bufs if n.startswith("act")}
    assert own == set(r.long._kept[ta.keys[1]]) and own
    assert not own & gates and {"x"} <= own
    if cell in ("lstm", "gru"):   # shared: one array for every state of the key
        assert gates and all(second.ws.bufs[n] is first.ws.bufs[n] for n in gates)
        assert all(k.recompute for k in ta.keys)
    _check_grads(r, xb, hxb, dyb, dhx, r.backward(tb, dyb, dhx))
    _check_grads(r, xa, hxa, dya, dhx, r.backward(ta, dya, dhx))
    # a pass of one chunk runs unchunked, as without recompute (nothing to save there)
    assert not r.plan_key(4, B, True).recompute
    x4, hx4 = _states(cell, rng, 4)
    dy4 = draw32(rng, 4, B, H)
    _, _, t4 = r.forward(x4, hx4, train=True)
    assert not isinstance(t4, ChunkedTape)
    _check_grads(r, x4, hx4, dy4, None, r.backward(t4, dy4))


def test_recompute_needs_fp32_storage(monkeypatch):
    import rnnrt.session
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    from rnnrt.gpu import GpuRunner
    with pytest.raises(ValueError, match="recompute: fp32 storage only"):
        GpuRunner(_model("lstm"), schedule_cache=False, dtype="bfloat16", recompute=True)
    with pytest.raises(TypeError, match="recompute: expected a bool"):
        GpuRunner(_model("lstm"), schedule_cache=False, recompute=1)
