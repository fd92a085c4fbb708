"""validate() refuses a plan with an op that writes a state input (h0, c0, dh_n, dc_n):
GpuRunner skips reloading a None (zero) state while the caller keeps passing None, which
is right only while no op overwrites it. Every builder's plans pass (fixed and
variable-length, persistent forward and backward); a planted write into any of the four
is refused by name, and one beside them is not."""
from __future__ import annotations

import dataclasses

import pytest
from testkit import cpu_plan_key as PlanKey

from rnnrt.plan import backward_plan, forward_plan
from rnnrt.plan.model import STATE_INPUTS, validate
from rnnrt.plan.ops import Kernel, View
from rnnrt.plan.packing import batch_sizes, bucket
from rnnrt.plan.switches import ladder

I, H, L = 3, 4, 2


def _keys():
    sw = [r.switches for r in ladder(input_batch=2)]
    pattern = bucket(batch_sizes([9, 7, 7, 3, 1]))
    yield PlanKey("lstm", 5, 3, I, H, L, True, sw[0], train=True)
    yield PlanKey("gru", 5, 3, I, H, L, True, sw[6], train=True)
    yield PlanKey("lstm", 5, 3, I, H, L, True, sw[7])                   # persistent forward
    yield PlanKey("lstm", 5, 3, I, H, L, True, sw[6], train=True, backward="grid")
    yield PlanKey("lstm", len(pattern), pattern[0], I, H, L, True, sw[6], train=True,
                  batch_sizes=pattern, capacity=16)


def _plans():
    for key in _keys():
        yield forward_plan(key)
        if key.train:
            yield backward_plan(key)


def _with(plan, view):
    """``plan`` with one more op: a copy into ``view`` (an [rows, cols] window)."""
    op = Kernel(0, "ew_copy", view.rows, view.cols, (view,), (View("zeros", 0, view.rows,
                                                                    view.cols, 0),))
    return dataclasses.replace(plan, ops=plan.ops + (op,))


def test_every_builders_plans_leave_the_state_inputs_alone():
    for plan in _plans():
        validate(plan)   # (the builders validated them too)


@pytest.mark.parametrize("name", STATE_INPUTS)
def test_a_planted_write_into_a_state_input_is_refused(name):
    """A one-element write into the last layer's view of ``name`` is refused, naming the
    input; the same write one row past the binding (inside its buffer) passes."""
    seen = 0
    for plan in _plans():
        if name not in plan.inputs:
            continue
        seen += 1
        v = plan.inputs[name].views[-1]
        last = View(v.buf, v.offset + (v.rows - 1) * v.ld + v.cols - 1, 1, 1, 1)
        with pytest.raises(ValueError, match=f"writes input '{name}'"):
            validate(_with(plan, last))
        after = View(v.buf, v.offset + v.rows * v.ld, 1, 1, 1)
        if after.end <= plan.buffer(v.buf).size and all(
                after.offset not in range(a, b) for w in plan.inputs[name].views
                for a, b in w.row_intervals()):
            validate(_with(plan, after))
    assert seen
