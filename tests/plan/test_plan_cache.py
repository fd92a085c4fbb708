"""The plan builders' caches are bounded by bytes as well as entries (plan/cache.py): the
estimate (ops x sizes.PLAN_OP_BYTES) bounds what a cached plan holds, adding past the budget
evicts the least recently used plans, and a plan larger than the budget is not kept."""
from __future__ import annotations

import gc
import tracemalloc

import pytest
from testkit import cpu_plan_key as PlanKey

from rnnrt.plan import forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.cache import DEFAULT_PLAN_CACHE_BYTES, plan_bytes, plan_cache
from rnnrt.plan.switches import ladder


@pytest.fixture
def fresh_caches():
    for f in (forward_plan, backward_plan):
        f.cache_clear()
    yield
    for f in (forward_plan, backward_plan):
        f.set_budget(DEFAULT_PLAN_CACHE_BYTES)
        f.cache_clear()


def _key(steps, train=False):
    return PlanKey("lstm", steps, 4, 8, 8, 2, True, ladder()[-2].switches, train=train)


def test_the_estimate_bounds_what_a_plan_holds(fresh_caches):
    """The host bytes a cached plan keeps (traced after the build, the builder's temporaries
    freed) are at most plan_bytes, and not far below it (the budget means something)."""
    for train in (False, True):
        forward_plan.cache_clear()
        backward_plan.cache_clear()
        gc.collect()
        tracemalloc.start()
        try:
            plan = backward_plan(_key(400, train=True)) if train else forward_plan(_key(400))
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        est = plan_bytes(plan) + (plan_bytes(forward_plan(_key(400, True))) if train else 0)
        assert held <= est, f"held {held} > estimate {est}"
        assert held > est / 8, f"held {held} << estimate {est}"


def test_adding_past_the_budget_evicts_the_least_recently_used(fresh_caches):
    sizes = {s: plan_bytes(forward_plan(_key(s))) for s in (100, 200, 300)}
    forward_plan.cache_clear()
    forward_plan.set_budget(sizes[200] + sizes[300])
    forward_plan(_key(100))
    forward_plan(_key(200))
    forward_plan(_key(100))            # 200 is now the least recently used
    forward_plan(_key(300))            # past the budget: 200 goes, then still over: 100
    info = forward_plan.cache_info()
    assert info.nbytes <= info.budget and info.evictions >= 1
    misses = info.misses
    forward_plan(_key(300))
    assert forward_plan.cache_info().misses == misses        # kept
    forward_plan(_key(200))
    assert forward_plan.cache_info().misses == misses + 1    # evicted: built again
    assert forward_plan.cache_info().nbytes <= info.budget


def test_a_plan_larger_than_the_budget_is_returned_not_kept(fresh_caches):
    forward_plan.set_budget(plan_bytes(forward_plan(_key(50))) - 1)
    forward_plan.cache_clear()
    a = forward_plan(_key(50))
    b = forward_plan(_key(50))
    assert a is not b and forward_plan.cache_info().currsize == 0
    assert forward_plan.cache_info().nbytes == 0


def test_the_entry_bound_and_the_environment(monkeypatch):
    @plan_cache(maxsize=3, budget=10**9, size=lambda p: 1)
    def build(n, flag=False):
        return [n, flag]

    for n in range(10):
        build(n)
    assert build.cache_info().currsize == 3
    assert build(9) is build(9) and build(1, flag=True) is build(1, flag=True)
    monkeypatch.setenv("RNNRT_PLAN_CACHE_BYTES", "-1")
    with pytest.raises(ValueError, match="RNNRT_PLAN_CACHE_BYTES"):
        plan_cache()(lambda: None)
    monkeypatch.setenv("RNNRT_PLAN_CACHE_BYTES", "1e6")
    assert plan_cache()(lambda: None).cache_info().budget == 10**6
