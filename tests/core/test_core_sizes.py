"""rnnrt/sizes.py, the one place that sizes things: its constants and formulas are upper
bounds of what is really allocated (tracemalloc on the real code), not wild ones; the host's
memory and its cap; the 32-bit index range. (Closed forms against the builders, on random
shapes: tests/plan/test_plan_properties.py.)"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import rnnrt
from rnnrt import params, reference, sizes
from rnnrt.plan import forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.switches import Switches, ladder
from testkit import Spy, assert_refused
from testkit import cpu_plan_key as PlanKey


def _peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_align_is_the_layouts():
    assert sizes.ALIGN == params.ALIGN


@pytest.mark.parametrize("cell", ["lstm", "rnn_tanh"])
@pytest.mark.parametrize("rung", [0, 3, 6, 7])
def test_plan_op_bytes_bound_what_a_build_takes(cell, rung):
    sw = ladder()[rung].switches
    key = PlanKey(cell, 300, 4, 8, 8, 2, True, sw, train=True)
    forward_plan.cache_clear()
    backward_plan.cache_clear()
    peak, plan = _peak(lambda: forward_plan(key))
    assert peak <= sizes.plan_ops_bound(key) * sizes.PLAN_OP_BYTES
    peak, plan = _peak(lambda: backward_plan(key))
    bound = sizes.plan_ops_bound(key, backward=True)
    assert len(plan.ops) <= bound <= 4 * len(plan.ops) + 200
    assert peak <= bound * sizes.PLAN_OP_BYTES


def test_layout_bytes_bound_a_deep_model():
    layers = 3000
    peak, m = _peak(lambda: rnnrt.LSTM(1, 1, num_layers=layers))
    assert peak - m.flat.nbytes <= layers * sizes.LAYOUT_BYTES_PER_LAYER
    assert sizes.model_bytes("lstm", 1, 1, layers, True, 4) >= peak


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_relu"])
def test_reference_bytes_bound_the_reference(cell):
    m = {"lstm": rnnrt.LSTM, "gru": rnnrt.GRU}.get(cell, lambda *a, **k: rnnrt.RNN(
        *a, nonlinearity="relu", **k))(16, 32, num_layers=3, dtype=np.float64, seed=0)
    T, B = 40, 6
    x = np.random.default_rng(0).standard_normal((T, B, 16))
    peak, (y, hx, tape) = _peak(lambda: m(x, train=True))
    est = sizes.reference_bytes(cell, 16, 32, 3, B, T, 8, "train")
    assert est >= peak >= est / 4, (peak, est)
    peak, _ = _peak(lambda: m.backward(tape, np.ones_like(y)))
    est = sizes.reference_bytes(cell, 16, 32, 3, B, T, 8, "backward")
    assert est >= peak >= est / 8, (peak, est)


def test_host_available_and_its_cap(monkeypatch):
    monkeypatch.delenv("RNNRT_HOST_BYTES", raising=False)
    n = sizes.host_available()
    assert n is None or n > 0
    monkeypatch.setenv("RNNRT_HOST_BYTES", "2e9")
    assert sizes.host_available() == 2_000_000_000
    with pytest.raises(sizes.SizeError, match="the model .* needs .* GiB of host memory; 1.86 "
                                              "GiB available"):
        rnnrt.LSTM(1000, 1000, num_layers=200)


def test_index_range():
    ok = PlanKey("lstm", 2**16, 2**14, 1, 1, 1, True, Switches(input_batch=10))
    sizes.check_index_range(ok)                      # chunks of 10 steps: 163,840 rows
    for sw, train in ((Switches(input_batch="all"), False), (Switches(), True)):
        key = PlanKey("lstm", 2**16, 2**15 + 1, 1, 1, 1, True, sw, train=train)
        with pytest.raises(sizes.SizeError, match="steps x batch = 65536 x 32769"):
            sizes.check_index_range(key)


def test_check_workspace_names_the_shape():
    key = PlanKey("gru", 100, 64, 512, 512, 4, True, ladder()[6].switches, train=True)
    need = sizes.workspace_elements(key) * 4
    assert sizes.check_workspace(key, need) == need
    with pytest.raises(sizes.SizeError, match=r"workspace of GRU input_size=512 hidden_size=512 "
                                              r"num_layers=4, batch=64 steps=100 \(training\)"):
        sizes.check_workspace(key, need - 1)


def test_reference_pass_names():
    with pytest.raises(ValueError, match="pass_"):
        sizes.reference_bytes("lstm", 1, 1, 1, 1, 1, 4, "inference")


def test_the_issue_examples_fail_fast(monkeypatch):
    """LSTM(8, 16, num_layers=10**9) never returned; now it is refused at once, on a large
    host too (64 GiB: tests/core/test_core_bad_input.py judges it against 1 GiB), before
    the layout's loop over layers or any reference pass starts."""
    monkeypatch.setenv("RNNRT_HOST_BYTES", str(64 << 30))
    work = [Spy("reference.forward"), Spy("the model's layout (a loop over layers)")]
    monkeypatch.setattr(reference, "forward", work[0])
    monkeypatch.setattr(rnnrt.models, "make_layout", work[1])
    assert_refused(lambda: rnnrt.LSTM(8, 16, num_layers=10**9), sizes.SizeError,
                   ["num_layers=1000000000"], spies=work, within_s=1.0)
