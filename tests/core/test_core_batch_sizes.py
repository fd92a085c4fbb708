"""One check of a packed schedule's batch_sizes (rnnrt.varlen.check_batch_sizes): the NumPy
reference allows empty steps (min_rows=0), a plan (plan.packing.check_pattern, PlanKey)
needs a row every step (min_rows=1); both refuse the same bad input with the same words,
floats included (check_pattern truncated 2.5 to 2 before)."""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt import varlen
from rnnrt.plan.packing import check_pattern
from rnnrt.plan.switches import Switches
from testkit import cpu_plan_key as PlanKey


@pytest.mark.parametrize("bad, match", [
    ((3, 2.5), "integers"), ((3.0, 2.0), "integers"), ((3, True), "integers"),
    ([[3, 2]], "1-D"), ((), "at least one step"), ((2, 3), "non-increasing"),
    ("32", "1-D"), ((3, -1), "negative|active row"),
])
def test_both_refuse_the_same_bad_input(bad, match):
    with pytest.raises(ValueError, match=f"batch_sizes: .*({match})"):
        check_pattern(bad)
    with pytest.raises(ValueError, match=f"batch_sizes: .*({match})"):
        varlen.check_batch_sizes(bad)


def test_only_the_reference_allows_empty_steps():
    assert varlen.check_batch_sizes((3, 0), rows=3).tolist() == [3, 0]
    with pytest.raises(ValueError, match="at least one active row"):
        check_pattern((3, 0))


def test_a_checked_pattern_is_a_tuple_of_python_ints():
    p = check_pattern(np.array([3, 2, 2], dtype=np.int32))
    assert p == (3, 2, 2) and all(type(v) is int for v in p)


def test_a_plan_key_refuses_a_float_pattern():
    with pytest.raises(ValueError, match="PlanKey.batch_sizes: expected integers"):
        PlanKey("gru", 2, 3, 2, 2, 1, True, Switches(), batch_sizes=(3.0, 2.0))


def test_a_plan_key_refuses_a_persistent_backward_with_a_pattern():
    """The persistent backward runs the whole batch every step: a variable-length key
    refuses it by name (the runner passes backward=None for a pattern)."""
    from rnnrt.plan.switches import ladder
    sw = ladder()[6].switches
    PlanKey("lstm", 2, 3, 2, 2, 1, True, sw, train=True, backward="grid")
    with pytest.raises(ValueError, match="PlanKey.backward: .*variable-length"):
        PlanKey("lstm", 2, 3, 2, 2, 1, True, sw, train=True, backward="grid",
                batch_sizes=(3, 2))
