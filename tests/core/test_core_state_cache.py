"""GpuRunner's workspace cache (rnnrt/gpu.py StateCache) without a GPU: a byte budget with
least-recently-used eviction, the newest state never evicted, memory handed back on eviction."""
from __future__ import annotations

from rnnrt.gpu import StateCache


class FakeState:
    """What StateCache reads of a RunState: its bytes, host plan bytes and busy flag."""
    busy = False
    plan_bytes = 0

    def __init__(self, nbytes):
        self.nbytes = nbytes


def test_eviction_keeps_the_budget_least_recently_used_first():
    freed = []
    c = StateCache(100, free=lambda: freed.append(1))
    for k in "abc":
        c.add(k, FakeState(40))          # a, b fit; c pushes a out
    assert list(c._states) == ["b", "c"] and c.evictions == 1 and freed == [1]
    assert c.get("b") is not None        # b used: now c is the oldest
    c.add("d", FakeState(40))
    assert list(c._states) == ["b", "d"] and c.nbytes == 80
    assert "c" not in c and c.get("c") is None


def test_the_newest_state_stays_even_over_budget():
    c = StateCache(10)
    c.add("big", FakeState(50))
    assert "big" in c and len(c) == 1 and c.evictions == 0
    c.add("bigger", FakeState(60))
    assert list(c._states) == ["bigger"] and c.evictions == 1


def test_a_zero_budget_keeps_only_the_last():
    c = StateCache(0)
    for i in range(5):
        c.add(i, FakeState(1))
    assert list(c._states) == [4] and c.evictions == 4
    c.clear()
    assert len(c) == 0


def test_a_busy_state_is_never_evicted():
    c = StateCache(50)
    busy = FakeState(40)
    busy.busy = True                     # a live tape still needs its activations
    c.add("held", busy)
    c.add("a", FakeState(40))            # over budget: but "held" is busy, "a" the newest
    assert set(c._states) == {"held", "a"} and c.evictions == 0
    c.add("b", FakeState(40))            # "a" goes; "held" stays
    assert set(c._states) == {"held", "b"} and c.evictions == 1
    busy.busy = False
    c.add("c", FakeState(40))
    assert set(c._states) == {"c"}


def test_drop_idle_makes_room_but_keeps_busy_states():
    """What GpuRunner does before refusing a workspace that does not fit: the idle
    workspaces of other shapes go (memory handed back), the ones a live tape needs stay."""
    freed = []
    c = StateCache(1000, free=lambda: freed.append(1))
    busy = FakeState(40)
    busy.busy = True
    c.add("held", busy)
    c.add("a", FakeState(40))
    c.add("b", FakeState(40))
    assert c.drop_idle() == 2 and list(c._states) == ["held"] and freed == [1]
    assert c.holds(busy) and not c.holds(FakeState(40))
    assert c.drop_idle() == 0 and freed == [1]      # nothing idle: nothing freed
def test_a_state_keeps_at_most_its_executors_least_recently_used_first():
    """RunState: one executor per (plan, pass), made on first use with the plan's own view of
    the workspace; past max_executors the least recently used goes."""
    from types import SimpleNamespace

    from rnnrt.gpu_state import RunState

    class Ws:
        bufs = {}

        def sharing(self, plan):
            return ("bound", plan.key)

    made = []
    st = RunState(Ws(), lambda plan, ws: made.append(ws) or ws, max_executors=3)
    plans = [SimpleNamespace(key=k) for k in "abcd"]
    for p in plans[:3]:
        assert st.executor(p, "fwd") == ("bound", p.key)
    st.executor(plans[0], "fwd")                 # a used again: b is now the oldest
    st.executor(plans[3], "fwd")                 # d pushes b out
    assert len(st) == 3 and len(made) == 4
    st.executor(plans[1], "fwd")                 # b is made again
    assert len(made) == 5 and st.executor(plans[1], ("bwd", False)) and len(made) == 6
    assert not st.busy and st.nbytes == 0


def test_the_plans_host_bytes_are_bounded_too():
    """A state's executors hold plans (O(steps) Python objects each): past ``plan_budget``
    host bytes of them, the least recently used idle states go, as for device bytes."""
    c = StateCache(10**12, plan_budget=100)
    for k in "abc":
        st = FakeState(1)
        st.plan_bytes = 45
        c.add(k, st)                     # a, b fit; c pushes a out
    assert list(c._states) == ["b", "c"] and c.plan_bytes == 90 and c.evictions == 1


def test_a_run_state_counts_its_executors_plans():
    import types

    from rnnrt.gpu_state import RunState
    from rnnrt.plan.cache import plan_bytes
    plans = [types.SimpleNamespace(ops=(None,) * n, key=("k", n)) for n in (3, 5)]
    ws = types.SimpleNamespace(sharing=lambda plan: None, bufs={})
    st = RunState(ws, lambda plan, w: types.SimpleNamespace(prepared=types.SimpleNamespace(
        plan=plan)))
    for p in plans:
        st.executor(p, "fwd")
    assert st.plan_bytes == sum(plan_bytes(p) for p in plans) > 0
