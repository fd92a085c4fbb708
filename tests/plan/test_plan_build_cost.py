"""Plan building costs time linear in the sequence length: the garbage collector is paused
while a plan is built (with it on, every full collection walked all the plan's objects made
so far: T = 10,000 took 3.6 s, T = 1,000,000 never returned), and a launch's shape check is
done once per distinct shape, not once per step."""
from __future__ import annotations

import gc
import time

import pytest

from rnnrt.plan import forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.model import building, validate
from rnnrt.plan.switches import ladder
from testkit import cpu_plan_key as PlanKey


def test_building_pauses_the_collector_and_restores_it():
    assert gc.isenabled()
    with building():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with building():
            raise RuntimeError("a builder failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with building():
            pass
        assert not gc.isenabled()   # a caller's own choice is kept
    finally:
        gc.enable()


def _build_seconds(steps: int, train: bool) -> float:
    sw = ladder()[-2].switches   # the paper's best rung: ops for every (layer, step)
    key = PlanKey("lstm", steps, 4, 8, 8, 2, True, sw, train=train)
    forward_plan.cache_clear()
    backward_plan.cache_clear()
    t0 = time.process_time()
    forward_plan(key)
    if train:
        backward_plan(key)
    return time.process_time() - t0


@pytest.mark.parametrize("train", [False, True])
def test_plan_build_time_grows_linearly_with_steps(train):
    # 10x the steps must cost about 10x the time (~11x here); the quadratic build cost ~40x.
    # The bound leaves room for a shared, noisy CPU, and each side is the better of two
    # builds: one T=3000 build on a loaded 2-core CI machine once took 1.04 s of CPU time
    # against 0.52 alone (22x, past the bound).
    small = min(_build_seconds(300, train) for _ in range(2))
    big = min(_build_seconds(3000, train) for _ in range(2))
    assert big < 20 * small, f"T=3000 took {big:.3f} s, T=300 {small:.3f} s"


def test_no_collection_runs_while_a_plan_is_built():
    seen = []

    def count(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    forward_plan.cache_clear()
    # empty every generation first: which generation the one collection after the build takes
    # depends on the counts the tests before it left (a full one in CI's second worker)
    gc.collect()
    gc.callbacks.append(count)
    try:
        forward_plan(PlanKey("lstm", 2000, 4, 8, 8, 2, True, ladder()[-2].switches))
    finally:
        gc.callbacks.remove(count)
    # the build allocates ~10^5 objects: unpaused, the collector runs dozens of times; paused,
    # one young collection may follow the build (the first allocation after it)
    assert len(seen) <= 1 and 2 not in seen, f"collections during the build: {seen}"


def test_validate_still_checks_every_distinct_launch_shape():
    import dataclasses

    from rnnrt.plan.ops import Kernel, View
    plan = forward_plan(PlanKey("lstm", 6, 3, 5, 4, 1, False, ladder()[-2].switches))
    i = max(n for n, op in enumerate(plan.ops) if isinstance(op, Kernel))
    op = plan.ops[i]
    bad = dataclasses.replace(op, outs=(View(op.outs[0].buf, op.outs[0].offset, 3, 3, 4),)
                              + op.outs[1:])
    broken = dataclasses.replace(plan, ops=plan.ops[:i] + (bad,) + plan.ops[i + 1:])
    with pytest.raises(ValueError, match=f"op {i}"):
        validate(broken)
