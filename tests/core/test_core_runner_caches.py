"""GpuRunner's caches on the CPU (testkit.CpuSession: NumPy workspaces and the NumPy executor
in CuPy's place): a loop over a fixed set of packed batches stops building anything once
warm — executors (CUDA graphs on a GPU), plans and row maps — however many batches the set
holds; the bounds of gpu.py and gpu_state.py fit one another."""
from __future__ import annotations

import numpy as np
import pytest
from testkit import CpuSession, draw32

import rnnrt
from rnnrt.check import assert_close
from rnnrt.plan.packing import batch_sizes

I, H = 3, 4


@pytest.fixture
def cpu_runner(monkeypatch):
    """-> make(model, **GpuRunner kwargs): a GpuRunner on CpuSession, heuristic schedules."""
    import rnnrt.session
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    from rnnrt.gpu import GpuRunner
    return lambda model, **kw: GpuRunner(model, schedule_cache=False, **kw)


def _fixed_set(n, batch=4, longest=12, seed=0):
    """``n`` distinct batch_sizes of ``batch`` sequences, the longest ``longest`` steps
    (one steps bucket: every batch on one workspace)."""
    rng = np.random.default_rng(seed)
    out = set()
    while len(out) < n:
        lengths = [longest] + list(rng.integers(1, longest + 1, batch - 1))
        out.add(batch_sizes(lengths))
    return sorted(out)


def test_the_bounds_fit_together():
    from rnnrt.gpu import MAX_ROW_MAPS, MAX_SEEN
    from rnnrt.gpu_state import MAX_EXECUTORS
    # an exact pattern's forward and up to three backward executors (accumulate, need_dx)
    assert 4 * MAX_SEEN <= MAX_EXECUTORS
    # a looped batch's row map for its bucket and for its exact pattern, and room to spare
    assert MAX_ROW_MAPS >= 2 * MAX_SEEN + 32


@pytest.mark.parametrize("n", [10, 40])
def test_a_loop_over_fixed_batches_builds_nothing_once_warm(cpu_runner, n):
    """Training steps over ``n`` fixed batches of one capacity, three passes: after the
    first two, the third makes no executor, builds no plan and uploads no row map. A set
    of at most MAX_SEEN batches runs each on its exact pattern (nothing frozen); a larger
    set runs its bucketed patterns (before the fix, with MAX_SEEN = 256, a set of 40 ran
    40 exact patterns whose 80 executors did not fit a workspace's 64: every call captured
    again). The outputs of the third pass equal the second's."""
    from rnnrt.gpu import MAX_SEEN
    from rnnrt.plan import backward_plan, forward_plan
    from rnnrt.plan.packing import bucket
    r = cpu_runner(rnnrt.GRU(I, H, num_layers=1, seed=2))
    rng = np.random.default_rng(1)
    batches = [(bs, draw32(rng, sum(bs), I), draw32(rng, sum(bs), H))
               for bs in _fixed_set(n)]

    def one_pass():
        ys, keys = [], []
        for bs, x, dy in batches:
            y, _, tape = r.forward_packed(x, bs, train=True)
            r.backward(tape, dy)
            ys.append(y)
            keys.append(tape.key)
            del tape   # (a live tape keeps its workspace busy: the next call would take another)
        return ys, keys

    one_pass()
    ys2, _ = one_pass()
    made = r.session.executors_made
    fmiss, bmiss = forward_plan.cache_info().misses, backward_plan.cache_info().misses
    maps = dict(r._row_maps)
    ys3, keys = one_pass()
    assert r.session.executors_made == made, "executors made again in a warm loop"
    assert forward_plan.cache_info().misses == fmiss
    assert backward_plan.cache_info().misses == bmiss
    assert len(r._row_maps) == len(maps) and all(r._row_maps[k] is v for k, v in maps.items())
    assert len(r._states) == 1
    exact = n <= MAX_SEEN
    for (bs, _, _), key in zip(batches, keys):
        assert key.batch_sizes == (bs if exact else bucket(bs))
    for a, b in zip(ys2, ys3):
        assert_close(b, a, 0, 0, name="a warm pass, the same plans, the same y")


def test_a_packed_call_checks_its_batch_sizes_once(cpu_runner, monkeypatch):
    """forward_packed checks batch_sizes once (check_packed_inputs) and hands the checked
    tuple on: bucketing and the row map do not check it again (they did, four more times)."""
    import rnnrt.plan.packing as pk
    calls = []
    real = pk.check_pattern
    monkeypatch.setattr(pk, "check_pattern", lambda *a, **kw: (calls.append(a), real(*a, **kw))[1])
    r = cpu_runner(rnnrt.LSTM(I, H, num_layers=1, seed=3))
    bs = batch_sizes([7, 5, 2])
    x = draw32(np.random.default_rng(2), sum(bs), I)
    for _ in range(3):   # bucketed (a new row map), exact (another), exact again (cached)
        calls.clear()
        r.forward_packed(x, list(bs))
        assert len(calls) == 1, calls


def test_a_warm_call_builds_no_key_and_looks_up_no_plan(cpu_runner, monkeypatch):
    """A training step the runner has run before (packed and fixed): no PlanKey is made
    (the workspace key of a pattern was a dataclasses.replace every call), no plan is looked
    up (the executors are found by key, the plan built only with a new executor), and the
    key's hash is not computed again (it is cached: batch_sizes made it O(steps))."""
    import rnnrt.gpu
    import rnnrt.plan.backward
    from rnnrt.plan.model import PlanKey
    r = cpu_runner(rnnrt.GRU(I, H, num_layers=2, seed=4))
    rng = np.random.default_rng(3)
    bs = batch_sizes([9, 6, 6, 2])
    xp, dyp = draw32(rng, sum(bs), I), draw32(rng, sum(bs), H)
    xf, dyf = draw32(rng, 5, 2, I), draw32(rng, 5, 2, H)

    def step():
        _, _, tape = r.forward_packed(xp, bs, train=True)
        r.backward(tape, dyp)
        del tape
        _, _, tape = r.forward(xf, train=True)
        r.backward(tape, dyf)

    for _ in range(3):   # (bucketed, then exact: warm from the third)
        step()
    counts = {"key": 0, "hash": 0, "plan": 0}
    real_post, real_fields = PlanKey.__post_init__, PlanKey._fields

    def counted(what, fn):
        def wrapped(*a, **kw):
            counts[what] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(PlanKey, "__post_init__", counted("key", real_post))
    monkeypatch.setattr(PlanKey, "_fields", counted("hash", real_fields))
    monkeypatch.setattr(rnnrt.gpu, "forward_plan", counted("plan", rnnrt.gpu.forward_plan))
    monkeypatch.setattr(rnnrt.plan.backward, "backward_plan",
                        counted("plan", rnnrt.plan.backward.backward_plan))
    step()
    assert counts == {"key": 0, "hash": 0, "plan": 0}, counts
