"""GpuRunner's gradient buffer on the CPU (testkit.CpuSession, the NumPy executor's times
standing in for the GPU's): the schedule selector's timing of a new shape, which runs
backward passes of its own, leaves the caller's gradients alone — a sum over micro-batches
of different shapes (each new steps bucket tunes) is the sum of their gradients."""
from __future__ import annotations

import numpy as np
from testkit import CpuSession, check_runner_packed_step, draw32

from rnnrt.check import FP32_RTOL, assert_close, reduction_atol
from rnnrt.plan.packing import batch_sizes

I, H = 3, 4


def _runner(monkeypatch, model):
    import rnnrt.session
    from rnnrt.gpu import GpuRunner
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "1")   # time each new shape's candidates
    return GpuRunner(model, schedule_cache=False)


def test_tuning_a_new_shape_keeps_the_accumulated_gradients(monkeypatch):
    import rnnrt
    m = rnnrt.GRU(I, H, num_layers=2, seed=5)
    r = _runner(monkeypatch, m)
    rng = np.random.default_rng(0)
    want = np.zeros_like(m.flat)
    for i, steps in enumerate((5, 20)):   # steps buckets 16 and 32: each tunes
        x, dy = draw32(rng, steps, 3, I), draw32(rng, steps, 3, H)
        _, _, tape = r.forward(x, train=True)
        # the pass's own state was built after the tuning: the timer let go of its last
        assert r.timer.held is None, (i, r.timer.held)
        sel = r.schedule(steps, 3, True)
        assert sel.source == "tuned"
        assert not [c for c in sel.candidates if c["status"].startswith("failed")], \
            sel.candidates
        r.backward(tape, dy, accumulate=i > 0)
        want += m.backward(m.forward(x, train=True)[2], dy).flat
    for e in m.layout.entries:
        assert_close(r.grads[e.offset:e.end], want[e.offset:e.end], name=e.name)


def test_tuning_a_packed_shape_keeps_the_accumulated_gradients(monkeypatch):
    """The same for packed sequences: the second batch's steps bucket tunes a
    variable-length key; its gradients add to the first batch's."""
    import rnnrt
    r = _runner(monkeypatch, rnnrt.LSTM(I, H, num_layers=1, seed=6))
    rng = np.random.default_rng(1)
    check_runner_packed_step(r, [6, 4, 4, 1], rng)      # steps bucket 16, tuned
    first = r.grads.copy()
    lengths = [20, 9, 3]                                 # steps bucket 32: tuned here
    bs = batch_sizes(lengths)
    x, dy = draw32(rng, sum(bs), I), draw32(rng, sum(bs), H)
    _, _, tape = r.forward_packed(x, bs, train=True)
    assert r.schedule(20, 3, True, varlen=True).source == "tuned"
    r.backward(tape, dy, accumulate=True)
    from rnnrt import varlen
    from rnnrt.params import per_layer, to_flat
    layout = r.model.layout
    p64 = per_layer(np.asarray(r.params, np.float64), layout)
    cache = varlen.forward("lstm", p64, x.astype(np.float64), bs, None, None)[3]
    second = to_flat(varlen.backward(cache, dy.astype(np.float64))["params"], layout)
    for e in layout.entries:
        assert_close(r.grads[e.offset:e.end], first[e.offset:e.end] + second[e.offset:e.end],
                     reduction_atol(sum(bs)), FP32_RTOL, name=e.name)


def test_a_tape_runs_backward_only_on_its_runner_while_open(monkeypatch):
    """Another runner's tape is refused by name, its gradients untouched; a copy of a tape
    whose original was dropped and whose workspace a later forward reused is stale; the
    tape of a closed runner is refused. The tape of its own open runner runs."""
    import copy

    import pytest

    import rnnrt
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    m = rnnrt.RNN(I, H, num_layers=2, seed=7)
    a, b = _runner(monkeypatch, m), _runner(monkeypatch, m)
    rng = np.random.default_rng(2)
    x, dy = draw32(rng, 4, 2, I), draw32(rng, 4, 2, H)
    _, _, tape = a.forward(x, train=True)
    before = b.grads.copy()
    with pytest.raises(ValueError, match="tape: it is not one of this runner's"):
        b.backward(tape, dy)
    assert np.array_equal(b.grads, before)
    a.backward(tape, dy)
    kept = copy.copy(tape)
    del tape                                   # its workspace is free for the next forward
    _, _, tape = a.forward(x, train=True)
    assert tape.state is kept.state
    with pytest.raises(ValueError, match="tape: stale"):
        a.backward(kept, dy)
    a.close()
    with pytest.raises(ValueError, match="tape: it is not one of this runner's"):
        a.backward(tape, dy)


def test_flags_are_checked_and_only_owned_buffers_counted(monkeypatch):
    """forward_packed's train and reverse and backward's need_dx take True or False only
    (a string is truthy); the runner's memory check counts only the buffers it allocates
    (room for one: adopted parameters and its own gradients fit, two of its own do not)."""
    import pytest

    import rnnrt
    from rnnrt import sizes
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    m = rnnrt.GRU(I, H, num_layers=1, seed=8)
    r = _runner(monkeypatch, m)
    bs = batch_sizes([4, 2])
    x = draw32(np.random.default_rng(4), sum(bs), I)
    with pytest.raises(TypeError, match="train"):
        r.forward_packed(x, bs, train="yes")
    with pytest.raises(TypeError, match="reverse"):
        r.forward_packed(x, bs, reverse=1)
    _, _, tape = r.forward_packed(x, bs, train=True)
    with pytest.raises(TypeError, match="need_dx"):
        r.backward(tape, np.zeros((sum(bs), H), np.float32), need_dx="no")
    one = m.layout.size * 4
    monkeypatch.setattr(sizes, "gpu_available", lambda cp: one)    # room for one buffer
    from rnnrt.gpu import GpuRunner
    params = np.asarray(m.flat, np.float32).copy()
    GpuRunner(m, schedule_cache=False, params=params)             # gradients only: fit
    with pytest.raises(sizes.SizeError, match="the parameters and gradients of"):
        GpuRunner(m, schedule_cache=False)
