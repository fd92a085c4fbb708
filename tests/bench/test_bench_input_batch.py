"""The input batching k, checked by one rule (bench/recordio.py valid_input_batch) wherever
the bench takes one: the ladder's, the trace's and the sweep's configurations, and a
record's points. Each refuses the same values by its own name."""
from __future__ import annotations

import pytest

from rnnrt.bench.ladder import LadderConfig
from rnnrt.bench.recordio import check_point
from rnnrt.bench.sweep import SweepConfig
from rnnrt.bench.trace import TraceConfig

GOOD = (1, 7, "all")
BAD = (0, -2, True, 2.0, "ALL", None, [4])
POINT = {"cell": "lstm", "layers": 1, "hidden": 8, "input_size": 8, "batch": 2, "steps": 4}


@pytest.mark.parametrize("k", GOOD + BAD)
def test_every_taker_agrees(k):
    ok = k in GOOD and not isinstance(k, bool)
    for make, name in ((lambda: LadderConfig(input_batch=k), "LadderConfig.input_batch"),
                       (lambda: TraceConfig(input_batch=k), "TraceConfig.input_batch"),
                       (lambda: SweepConfig(input_batch=(k,)), "SweepConfig.input_batch")):
        if ok:
            make()
        else:
            with pytest.raises(ValueError, match=name):
                make()
    why = check_point({**POINT, "input_batch": k})
    assert (why is None) == ok, why
