"""GpuRunner's own logic on the CPU (testkit.CpuSession: NumPy workspaces and the NumPy
executor in CuPy's place) for packed sequences of different lengths: forward_packed and
backward against rnnrt.varlen in fp32 tolerance, both directions; every pattern of a
capacity on one workspace; a repeated batch reloads nothing it need not; a zero state is
skipped only while it is zero; and the design's memory bound: over 1000 random batches of
lengths 1-500 the states, executors and row maps stay bounded, the workspace bytes of the
last 100 steps no higher than those of the first 100 (GPU: nn_bench.py memory-varlen)."""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.plan.packing import batch_sizes
from testkit import CpuSession, check_runner_packed_step, draw32

I, H = 5, 6


@pytest.fixture
def runner(monkeypatch):
    """-> make(cell, layers, **GpuRunner kwargs): a GpuRunner on CpuSession (heuristic
    schedule, nothing timed, nothing on disk)."""
    import rnnrt.session
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    from rnnrt.gpu import GpuRunner

    def make(cell, layers=2, **kw):
        cls = {"lstm": rnnrt.LSTM, "gru": rnnrt.GRU}.get(cell)
        m = cls(I, H, num_layers=layers, seed=1) if cls else rnnrt.RNN(
            I, H, num_layers=layers, nonlinearity=cell.split("_")[1], seed=1)
        return GpuRunner(m, schedule_cache=False, **kw)

    return make


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_packed_forward_and_backward_equal_the_reference(runner, cell):
    r = runner(cell)
    rng = np.random.default_rng(0)
    for lengths in ([9, 7, 7, 3, 1], [4, 4, 4], [12, 1]):
        for reverse in (False, True):
            for with_states in (True, False):
                check_runner_packed_step(r, lengths, rng, reverse, with_states)


def test_patterns_of_a_capacity_share_one_workspace(runner):
    """Batches whose patterns differ but fall in one steps bucket run on one workspace, a
    plan pair each; a batch seen again runs its exact pattern (a plan pair more, no frozen
    rows), and from then on reuses it (no new executor, the same row map)."""
    from rnnrt.plan.packing import bucket
    r = runner("lstm")
    rng = np.random.default_rng(1)
    batches = ([9, 7, 7, 3, 1], [10, 2, 2, 2, 2], [11, 11, 5, 5, 1])
    # (keys only: a live tape would keep its workspace busy, and the next call take another)
    keys = [check_runner_packed_step(r, lengths, rng).key for lengths in batches]
    assert [k.batch_sizes for k in keys] == [bucket(batch_sizes(b)) for b in batches]
    again = [check_runner_packed_step(r, batches[0], rng).key for _ in range(3)]
    assert all(k.batch_sizes == batch_sizes(batches[0]) for k in again)
    assert len(r._states) == 1
    st = next(iter(r._states._states.values()))
    assert len(st) == 2 * 4 and r.session.executors_made == 8   # four patterns, fwd + bwd
    assert len(r._row_maps) == 4


def test_a_repeated_batch_loads_only_its_data(runner, monkeypatch):
    """A batch run again on the plan it ran last: x's rows scattered, no fill of x's padding,
    no mask load (both still in the workspace); another batch in between, or the switch to
    the exact pattern (the second call), loads both."""
    from rnnrt.exec.workspace import Workspace
    r = runner("gru")
    calls = []
    real_rows, real_load = Workspace.load_rows, Workspace.load
    monkeypatch.setattr(Workspace, "load_rows", lambda self, name, rows, a, fill=None: (
        calls.append((name, fill)), real_rows(self, name, rows, a, fill))[1])
    monkeypatch.setattr(Workspace, "load", lambda self, **kw: (
        calls.append(tuple(sorted(kw))), real_load(self, **kw))[1])
    rng = np.random.default_rng(2)
    bs = batch_sizes([7, 5, 5, 2])
    x = draw32(rng, sum(bs), I)
    outs, loaded = [], []
    for other in (False, False, False, True, False):
        calls.clear()
        if other:
            other_bs = batch_sizes([6, 3, 2, 2])   # same batch and steps bucket
            r.forward_packed(draw32(rng, sum(other_bs), I), other_bs)
            continue
        outs.append(r.forward_packed(x, bs)[0])
        loaded.append(("x", 0.0) in calls and ("mask",) in calls)
    assert loaded == [True, True, False, True], loaded
    assert_close(outs[1], outs[0], name="bucketed and exact pattern, the same y")
    for y in outs[2:]:
        assert_close(y, outs[1], 0, 0, name="the same plan, the same y")
    assert len(r._states) == 1


def test_zero_states_are_skipped_only_while_zero(runner):
    """h0 None after None loads nothing; after a real h0 it loads zeros again (a stale h0
    would give the previous call's outputs)."""
    r = runner("lstm")
    rng = np.random.default_rng(3)
    for with_states in (False, False, True, False, True, True, False):
        check_runner_packed_step(r, [6, 4, 4, 1], rng, with_states=with_states, what=f"h0 {with_states}")
    x = draw32(rng, 6, 3, I)   # and the fixed-length path, which skips the same way
    for h0 in (None, draw32(rng, 2, 3, H), None):
        y, _ = r.forward(x, (h0, None))
        want = r.model.forward(x, (h0, None))[0]
        assert_close(y, want, FP32_ATOL, FP32_RTOL, name="fixed path after h0 changes")


def test_a_live_tape_keeps_its_workspace(runner):
    """Two training forwards before their backwards (a module applied twice): the second
    gets a workspace of its own, and each backward is right."""
    r = runner("rnn_tanh")
    rng = np.random.default_rng(4)
    t1 = check_runner_packed_step(r, [5, 3, 3], rng)
    t2 = check_runner_packed_step(r, [6, 3, 1], rng)
    assert len(r._states) == 2 and t1.state is not t2.state


def test_bad_packed_input_is_refused_by_name(runner):
    r = runner("gru")
    x = np.zeros((6, I), np.float32)
    with pytest.raises(ValueError, match="non-increasing"):
        r.forward_packed(x, (2, 3, 1))
    with pytest.raises(ValueError, match=r"x: expected packed \[N, I\]"):
        r.forward_packed(x, (3, 2))
    with pytest.raises(ValueError, match="h0"):
        r.forward_packed(x, (3, 2, 1), np.zeros((2, 2, H), np.float32))
    _, _, tape = r.forward_packed(x, (3, 2, 1), train=True)
    with pytest.raises(ValueError, match="dy"):
        r.backward(tape, np.zeros((5, H), np.float32))


def test_memory_is_bounded_over_1000_random_batches(runner):
    """The design's bound, without running the plans (a GPU run measures it: nn_bench.py
    memory-varlen): 1000 training batches of lengths uniform in 1-500 (batch 32) become a
    bounded set of patterns, on at most two workspaces (steps buckets 256 and 512), with at
    most gpu_state.MAX_EXECUTORS executors a workspace and MAX_ROW_MAPS row maps; the
    workspace bytes held over the last 100 batches are no more than over the first 100."""
    from rnnrt.gpu import MAX_ROW_MAPS
    from rnnrt.gpu_state import MAX_EXECUTORS
    from rnnrt.plan import backward_plan, forward_plan
    from rnnrt.plan.packing import bucket
    r = runner("lstm", layers=2)
    rng = np.random.default_rng(5)
    held, patterns = [], set()
    for _ in range(1000):
        bs = batch_sizes(rng.integers(1, 501, 32))
        pattern = bucket(bs)
        patterns.add(pattern)
        key = r.plan_key(len(pattern), bs[0], True, pattern)
        st = r.state(key)                       # the workspace: allocated for real (NumPy)
        st.executor(forward_plan(key), "fwd")   # the plans: built, not run
        st.executor(backward_plan(key), ("bwd", False))
        r._row_map(bs, pattern, False)
        held.append(r._states.nbytes)
        assert len(st) <= MAX_EXECUTORS and len(r._row_maps) <= MAX_ROW_MAPS
    assert len(patterns) <= 40 and len(r._states) <= 2
    assert max(held[-100:]) <= max(held[:100])


def test_the_fixed_batch_path_still_equals_the_model(runner, monkeypatch):
    """forward / backward of a full batch (batch_first, accumulate) through the same
    runner code, against the model's NumPy reference (float32: the same arithmetic)."""
    import rnnrt.session
    from rnnrt.gpu import GpuRunner
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    m = rnnrt.GRU(I, H, num_layers=2, batch_first=True, seed=3)
    r = GpuRunner(m, schedule_cache=False)
    rng = np.random.default_rng(6)
    x, dy = draw32(rng, 3, 7, I), draw32(rng, 3, 7, H)
    y, h_n, tape = r.forward(x, train=True)
    g = r.backward(tape, dy)
    g2 = r.backward(r.forward(x, train=True)[2], dy, accumulate=True)
    ry, rh, rtape = m.forward(x, train=True)
    rg = m.backward(rtape, dy)
    assert_close(y, ry, name="y")
    assert_close(h_n, rh, name="h_n")
    assert_close(g.dx, rg.dx, name="dx")
    assert_close(g.dh0, rg.dh0, name="dh0")
    assert g2.flat is r.grads
    for e in m.layout.entries:   # accumulated twice
        assert_close(r.grads[e.offset:e.end], 2 * rg.flat[e.offset:e.end], name=e.name)


def test_a_varlen_key_is_tuned_on_a_representative_pattern(monkeypatch):
    """With timing on (the NumPy executor's times stand in for the GPU's): a packed call
    tunes a key of its own among the cuBLAS schedules (varlen_schedules), each candidate run
    as a variable-length plan of the key's staircase pattern, and the choice runs right."""
    import rnnrt.session
    from rnnrt.gpu import GpuRunner
    from rnnrt.kernels.choice import varlen_schedules
    from rnnrt.kernels.schedules import with_lt
    from rnnrt.plan import forward_plan
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "1")
    timed = []
    real = forward_plan

    def spy(key):
        timed.append(key)
        return real(key)

    monkeypatch.setattr(rnnrt.gpu_tuning, "forward_plan", spy)   # the selector's timer's
    r = GpuRunner(rnnrt.GRU(I, H, num_layers=2, seed=0), schedule_cache=False)
    lengths = list(range(13, 0, -1)) + [1] * 7   # 20 sequences: three row groups
    check_runner_packed_step(r, lengths, np.random.default_rng(8))
    sel = r.schedule(13, 20, True, varlen=True)
    assert sel.source == "tuned"
    # every candidate, then the fastest again with its GEMMs' kernels timed (PlanKey.gemm)
    names = [c["name"] for c in sel.candidates]
    assert names[:-1] == [s.name for s in varlen_schedules()]
    assert names[-1].endswith("+lt") and names[-1][:-3] in names[:-1]
    assert sel.schedule in varlen_schedules() + tuple(with_lt(s) for s in varlen_schedules())
    proxies = [k for k in timed if k.varlen and k.capacity is None]
    assert proxies and all(len(set(k.batch_sizes)) > 1 for k in proxies)
