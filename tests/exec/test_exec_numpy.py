"""The NumPy executor and the race checker on forward plans (CPU): a plan with one event
wait removed is caught by the static race checker and gives a wrong result in some random
stream interleaving (the intact plan passes the same seeds); a stream that waits on an event
it records itself later is reported as a deadlock."""
from __future__ import annotations

import dataclasses

import pytest

from rnnrt.exec.racecheck import find_races
from rnnrt.plan import forward_plan
from rnnrt.plan.ops import Record, Wait
from rnnrt.plan.switches import ladder
from testkit import PLAN_SHAPE, check_outputs, plan_case as make_case, run_numpy
from testkit import cpu_plan_key as PlanKey   # CPU plans are built for the lent H100's limits

T, B, I, H = PLAN_SHAPE


def _drop_wait(plan, which):
    waits = [i for i, op in enumerate(plan.ops) if isinstance(op, Wait)]
    i = waits[which]
    return dataclasses.replace(plan, ops=plan.ops[:i] + plan.ops[i + 1:]), plan.ops[i]


@pytest.mark.parametrize("rung_index,which", [(2, 0), (2, 3), (6, 0), (6, -1)])
def test_a_removed_wait_is_caught(rung_index, which):
    """Remove one event wait: the static checker must report a race and some random
    interleaving must give a wrong (or poisoned) result."""
    flat, x, h0, c0, ref = make_case("lstm", 3, seed=11)
    plan = forward_plan(PlanKey("lstm", T, B, I, H, 3, True, ladder(input_batch=2)[rung_index].switches))
    broken, removed = _drop_wait(plan, which)
    races = find_races(broken)
    assert races, f"removing {removed} was not seen by the static checker"
    failures = 0
    for seed in range(40):
        out = run_numpy(broken, flat, x, h0, c0, order="random", seed=seed)
        try:
            check_outputs(out, ref, "broken")
        except AssertionError:
            failures += 1
    assert failures > 0, "no random interleaving exposed the missing wait"
    # and the intact plan passes the very same seeds
    for seed in range(5):
        check_outputs(run_numpy(plan, flat, x, h0, c0, order="random", seed=seed), ref, "intact")


def test_executor_detects_deadlock():
    plan = forward_plan(PlanKey("rnn_tanh", T, B, I, H, 1, True, ladder()[2].switches))
    # a stream that waits, first thing, on an event it records itself later never proceeds
    ops = list(plan.ops)
    rec = next(op for op in ops if isinstance(op, Record))
    ops.insert(0, Wait(rec.stream, rec.event))
    broken = dataclasses.replace(plan, ops=tuple(ops))
    flat, x, h0, c0, _ = make_case("rnn_tanh", 1)
    with pytest.raises(RuntimeError, match="deadlock"):
        run_numpy(broken, flat, x, h0, c0, order="random", seed=0)
