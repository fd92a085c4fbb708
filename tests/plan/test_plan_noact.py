"""Inference plans keep no saved gates (issue 24): a fused inference plan of a cell with saved
gates (LSTM, GRU) runs the step kernels without act (``*_fwd_noact``, ``*_fwd_mask_noact``) and
has no act{l} buffer, so its workspace is smaller by exactly what act held; its outputs are
the plan with act's, bit for bit; it is race-free. Training plans, the naive rung and the
persistent kernels' plans keep act as before (the persistent inference plan: test_plan_forward.py
test_persistent_grid_kernel_one_launch_per_layer)."""
from __future__ import annotations

import numpy as np
import pytest
from testkit import PLAN_SHAPE, plan_case, run_numpy
from testkit import cpu_plan_key as PlanKey

from rnnrt import sizes
from rnnrt.exec.racecheck import find_races
from rnnrt.plan import backward_plan, forward_plan, validate
from rnnrt.plan.forward import ForwardBuilder
from rnnrt.plan.ops import Kernel
from rnnrt.plan.packing import batch_sizes, bucket
from rnnrt.plan.switches import ladder

T, B, I, H = PLAN_SHAPE
L = 2
FUSED = [r for r in ladder(input_batch=2) if r.switches.fused and not r.switches.persistent]
NAIVE = ladder(input_batch=2)[0]


class WithAct(ForwardBuilder):
    """The forward builder as it was before the _noact kernels: a plan that keeps act."""

    def __init__(self, key):
        super().__init__(key)
        self.keeps_act = bool(self.cell.saved_gates)


def _kernels(plan):
    return {op.name for op in plan.ops if isinstance(op, Kernel)}


def _acts(plan):
    return {b.name: b.size for b in plan.buffers if b.name.startswith("act")}


def _key(cell, sw, train=False, varlen=False, dtype="float32"):
    if not varlen:
        return PlanKey(cell, T, B, I, H, L, True, sw, train=train, dtype=dtype)
    pattern = bucket(batch_sizes([5, 4, 4, 2, 1]))
    return PlanKey(cell, len(pattern), pattern[0], I, H, L, True, sw, train=train,
                   batch_sizes=pattern, capacity=2 * len(pattern))


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_fused_inference_plan_keeps_no_gates(cell, varlen):
    step = f"{cell}_fwd" + ("_mask" if varlen else "")
    for rung in FUSED:
        for dtype in ("float32", "bfloat16"):
            key = _key(cell, rung.switches, varlen=varlen, dtype=dtype)
            plan = forward_plan(key)
            what = f"{rung.name} {dtype}"
            assert f"{step}_noact" in _kernels(plan) and step not in _kernels(plan), what
            assert _acts(plan) == {}, what
            assert not find_races(plan), what
            # the plan with act: the same ops but the step kernels, and act{l} more
            old = WithAct(key).build()
            validate(old)
            assert step in _kernels(old) and f"{step}_noact" not in _kernels(old), what
            slots = key.capacity if varlen else 1
            assert _acts(old) == {f"act{lyr}": slots * key.batch * 4 * H for lyr in range(L)}
            total = sum(b.size for b in plan.buffers)
            assert sum(b.size for b in old.buffers) - total == L * slots * key.batch * 4 * H
            assert sizes.workspace_elements(key) == total, what   # what the runner allocates
            assert len(old.ops) == len(plan.ops), what


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_outputs_are_the_plans_with_act_bit_for_bit(cell):
    """float32 data on the NumPy executor: the _noact kernels' twins compute h and c as the
    kernels with act do (nothing else reads act in an inference plan)."""
    flat, x, h0, c0, _ = plan_case(cell, L, seed=7, dtype=np.float32)
    for rung in FUSED:
        key = _key(cell, rung.switches)
        new = run_numpy(forward_plan(key), flat, x, h0, c0)
        old = run_numpy(WithAct(key).build(), flat, x, h0, c0)
        for name, v in old.items():
            if v is not None:
                np.testing.assert_array_equal(new[name], v, err_msg=f"{rung.name} {name}")


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_training_and_naive_plans_keep_the_gates(cell):
    """A training key's forward writes act{l} every step (T slots) with the kernels with act,
    and its backward reads them; the naive rung's inference computes through act{l} (one
    slot): unchanged. RNN cells have no gates either way."""
    for rung in FUSED:
        key = _key(cell, rung.switches, train=True)
        fwd, bwd = forward_plan(key), backward_plan(key)
        assert f"{cell}_fwd" in _kernels(fwd) and not any("noact" in k for k in _kernels(fwd))
        assert _acts(fwd) == {f"act{lyr}": T * B * 4 * H for lyr in range(L)}
        assert fwd.buffers == WithAct(key).build().buffers
        assert {v.buf for op in bwd.ops for v in op.reads} >= {f"act{lyr}" for lyr in range(L)}
    naive = forward_plan(_key(cell, NAIVE.switches))
    assert _acts(naive) == {f"act{lyr}": B * 4 * H for lyr in range(L)}
    rnn = forward_plan(_key("rnn_tanh", FUSED[0].switches))
    assert _acts(rnn) == {} and "rnn_tanh_fwd" in _kernels(rnn)
