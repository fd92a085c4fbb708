"""The split-K recurrent backward GEMM (plan/backward.py ``split_dh``, kernels/gemm_split.py)
on the CPU: every cell x grouped rung x split count gives the reference gradients in program
order and random interleavings (every buffer poisoned first), statically race-free, for full
and variable-length batches; the plan has one batched GEMM a step and one ordered sum a step
(in the fused rungs, folded into the next step's pointwise kernel but at step 0), the same
bits either way; the rule's choices; bad counts refused; the sum kernel's twin; a dropped
partial is caught."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from testkit import BWD_PLAN_SHAPE, check_bwd_key, check_varlen, run_varlen_numpy, varlen_case
from testkit import bwd_plan_case as make_case
from testkit import check_bwd_plan as check
from testkit import cpu_plan_key as PlanKey
from testkit import run_bwd_plan as run

from rnnrt.cells import get_cell
from rnnrt.exec.racecheck import find_races
from rnnrt.kernels import twins
from rnnrt.kernels.gemm_split import MAX_SPLITS, dh_splits
from rnnrt.kernels.limits import H100_SXM
from rnnrt.plan import backward_plan
from rnnrt.plan.ops import Gemm, Kernel
from rnnrt.plan.switches import PAPER_RUNGS, Switches, ladder

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
T, B, I, H = BWD_PLAN_SHAPE      # H 6: K = G*H = 24, 18, 6
GROUPED = [r for r in ladder(input_batch=2) if r.switches.grouped]


def _splits(cell):
    """Split counts of K = G*H at H (2 and 3 divide every cell's)."""
    return (2, 3) if cell != "lstm" else (2, 3, 4)


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_split_backward_gives_reference_gradients(cell, layers):
    case = make_case(cell, layers, seed=7)
    for rung in GROUPED:
        for s in _splits(cell):
            key = PlanKey(cell, T, B, I, H, layers, True, rung.switches, train=True,
                          bwd_splits=s)
            plan = check_bwd_key(key, case, f"{rung.name} S={s}", always_random=True)
            dh = [op for op in plan.ops if isinstance(op, Gemm) and op.kind == "dh"]
            sums = [op for op in plan.ops if isinstance(op, Kernel) and op.kind == "reduce"]
            folded = [op for op in plan.ops
                      if isinstance(op, Kernel) and op.name.endswith("_bwd_split")]
            assert len(dh) == T * layers
            assert {op.batch for op in dh} == {s}
            if rung.switches.fused:   # steps T-2..0 sum the products of the step after
                assert len(sums) == layers and len(folded) == (T - 1) * layers
                n = s if cell == "gru" else s - 1   # the GRU's base: its direct part
                assert {op.scalars for op in folded} == {(("splits", n),)}
            else:
                assert len(sums) == T * layers and not folded


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_split_backward_variable_length(cell):
    """A pattern's steps have fewer rows; the masked kernels' direct part is summed after."""
    lengths = [7, 5, 5, 2, 1]
    case = varlen_case(cell, 2, lengths, 4, 6, seed=11)
    sw = ladder(input_batch=2)[PAPER_RUNGS - 1].switches
    key = PlanKey(cell, 7, 5, 4, 6, 2, True, sw, train=True, batch_sizes=case["bs"], capacity=9,
                  bwd_splits=2)
    plan = backward_plan(key)
    assert not find_races(plan)
    # steps 5..0 sum the products of the step after, over that step's rows (part_rows)
    folded = [op for op in plan.ops if isinstance(op, Kernel)
              and op.name == f"{cell}_bwd_mask_split"]
    assert len(folded) == 6 * 2
    assert len([op for op in plan.ops if isinstance(op, Kernel) and op.kind == "reduce"]) == 2
    assert {dict(op.scalars)["part_rows"] for op in folded} == set(case["bs"][1:])
    for reverse in (False, True):
        out, _ = run_varlen_numpy(key, case, reverse, order="random", seed=2)
        check_varlen(out, case, reverse, f"split varlen reverse={reverse}")


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_folded_sum_variable_length_gives_the_sum_kernels_bits(cell):
    """The masked kernels' fold (*_bwd_mask_split: step t's products summed over its rows,
    step t-1's further rows their dh_n alone) gives the plan with the ordered sum kernel's
    gradients bit for bit, in float32."""
    from rnnrt.plan.backward import split_sums_unfolded
    lengths = [7, 5, 5, 2, 1]
    case = varlen_case(cell, 2, lengths, 4, 6, seed=13)
    case = {k: (v.astype(np.float32) if k == "flat" else v) for k, v in case.items()}
    sw = ladder(input_batch=2)[PAPER_RUNGS - 1].switches
    key = PlanKey(cell, 7, 5, 4, 6, 2, True, sw, train=True, batch_sizes=case["bs"], capacity=9,
                  bwd_splits=3)
    folded = backward_plan(key)
    with split_sums_unfolded():
        summed = backward_plan(key)
    assert not any(op.name.endswith("_split") for op in summed.ops if isinstance(op, Kernel))
    a, _ = run_varlen_numpy(key, case, bwd=folded)
    b, _ = run_varlen_numpy(key, case, bwd=summed)
    assert a["grads"].dtype == np.float32
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=True), name


@pytest.mark.parametrize("where", ["reduce", "folded"])
def test_a_dropped_partial_is_caught(where):
    """The sum told one part fewer, in the ordered sum kernel (step 0's) or in the
    pointwise kernels that fold it (steps T-2..0): the last K slice's contribution is lost,
    and the gradients leave the tolerance (the check can fail)."""
    case = make_case("lstm", 2, seed=3)
    sw = ladder(input_batch=2)[PAPER_RUNGS - 1].switches
    key = PlanKey("lstm", T, B, I, H, 2, True, sw, train=True, bwd_splits=3)
    plan = backward_plan(key)

    def hit(op):
        return isinstance(op, Kernel) and (op.kind == "reduce" if where == "reduce"
                                           else op.name.endswith("_bwd_split"))
    ops = tuple(dataclasses.replace(op, scalars=(("splits", op.scalars[0][1] - 1),))
                if hit(op) else op for op in plan.ops)
    assert ops != plan.ops
    broken = dataclasses.replace(plan, ops=ops)
    with pytest.raises(AssertionError):
        check(run(key, *case[1:4], bwd=broken), case[0], case[4], "dropped partial")


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_folded_sum_gives_the_sum_kernels_bits(cell):
    """In float32, the plan whose pointwise kernels sum the partial products (the
    *_bwd_split kernels) gives bit for bit the gradients of the plan that sums them with
    ew_sum_splits into dhr first (``split_sums_unfolded``): the fold moves a launch, not
    the arithmetic."""
    from rnnrt.plan.backward import split_sums_unfolded
    case = make_case(cell, 2, seed=5)
    sw = ladder(input_batch=2)[PAPER_RUNGS - 1].switches
    key = PlanKey(cell, T, B, I, H, 2, True, sw, train=True, bwd_splits=3)
    folded = backward_plan(key)
    assert any(op.name.endswith("_bwd_split") for op in folded.ops if isinstance(op, Kernel))
    with split_sums_unfolded():
        summed = backward_plan(key)
    assert not any(op.name.endswith("_bwd_split") for op in summed.ops
                   if isinstance(op, Kernel))
    a = run(key, *case[1:4], bwd=folded, dtype=np.float32)
    b = run(key, *case[1:4], bwd=summed, dtype=np.float32)
    for name in ("dx", "dh0", "grads") + (("dc0",) if cell == "lstm" else ()):
        assert np.array_equal(a.read(name), b.read(name), equal_nan=True), name


def test_rule():
    """Small output (the paper's shape: 8 tiles of 64 x 64) -> 16 slices; a K too short for
    16 slices of 64 -> 8; too short for 8 -> whole; many tiles (batch 256, hidden 2048) ->
    whole; never 2 or 4; ungrouped plans never split."""
    paper = ladder()[PAPER_RUNGS - 1].switches
    key = PlanKey("lstm", 100, 64, 512, 512, 4, True, paper, train=True, device=H100_SXM)
    assert dh_splits(key) == MAX_SPLITS == 16
    assert dh_splits(dataclasses.replace(key, cell="rnn_tanh")) == 8        # K 512
    assert dh_splits(dataclasses.replace(key, hidden_size=16, input_size=16)) == 1
    big = dataclasses.replace(key, batch=256, hidden_size=2048, input_size=2048)
    assert dh_splits(big) == 1
    for h in (64, 128, 256, 512, 1024, 2048):
        for cell in CELL_NAMES:
            for b in (8, 64, 256):
                k = dataclasses.replace(key, cell=cell, hidden_size=h, input_size=h, batch=b)
                s = dh_splits(k)
                gh = get_cell(cell).gates * h
                assert s in (1, 8, 16) and gh % s == 0 and (gh // s) % 8 == 0
    for s in (1, 2, 4, 8, 16):
        assert dh_splits(dataclasses.replace(key, bwd_splits=s)) == s
    ungrouped = dataclasses.replace(key, switches=Switches(streams=True, fused=True))
    plan = backward_plan(dataclasses.replace(ungrouped, steps=3, batch=3, hidden_size=H,
                                             input_size=I, bwd_splits=2))
    assert not any(isinstance(op, Gemm) and op.batch > 1 for op in plan.ops)


def test_bad_counts_are_refused():
    sw = ladder()[PAPER_RUNGS - 1].switches
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="bwd_splits"):
            PlanKey("lstm", T, B, I, H, 1, True, sw, train=True, bwd_splits=bad)
    key = PlanKey("lstm", T, B, I, H, 1, True, sw, train=True, bwd_splits=5)   # 24 % 5
    with pytest.raises(ValueError, match="does not divide"):
        backward_plan(key)


def test_sum_twin_order_and_alias():
    """base + parts[0] + ... in order, in float32; base may be out itself."""
    rng = np.random.default_rng(0)
    rows, cols, s = 3, 5, 4
    parts = rng.standard_normal((s * rows, cols)).astype(np.float32)
    out = rng.standard_normal((rows, cols)).astype(np.float32)
    want = out.copy()
    for i in range(s):
        want = want + parts[i * rows:(i + 1) * rows]
    twins.ew_sum_splits(rows, cols, [out], [out, parts], s)
    assert np.array_equal(out, want)
    other = np.full((rows, cols), np.nan, np.float32)
    twins.ew_sum_splits(rows, cols, [other], [parts[:rows], parts[rows:]], s - 1)
    assert np.allclose(other, parts.reshape(s, rows, cols).sum(0), rtol=1e-6)


def test_the_persistent_backward_has_no_partial_buffers():
    """Where the persistent backward kernel runs the recurrent product, no split GEMM runs,
    so its workspace holds no dpart buffer (the per-step plan of the same shape does)."""
    from rnnrt.kernels.schedules import persistent_schedule
    sw = persistent_schedule("grid").switches
    key = PlanKey("lstm", 10, 64, 512, 512, 2, True, sw, train=True, device=H100_SXM)
    assert dh_splits(key) > 1
    per_step = backward_plan(key)
    assert {b.name for b in per_step.buffers} >= {"dpart0", "dpart1"}
    pbwd = backward_plan(dataclasses.replace(key, backward="grid"))
    assert pbwd.fallback is None
    assert not any(b.name.startswith("dpart") for b in pbwd.buffers)
    assert not any(isinstance(op, Gemm) and op.batch > 1 for op in pbwd.ops)
