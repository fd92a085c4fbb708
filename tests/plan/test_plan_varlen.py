"""Variable-length plans (PlanKey.batch_sizes, a per-step active batch) on the CPU: every
switch combination x cell, both directions, exact and bucketed patterns (frozen rows),
forward and backward, against rnnrt.varlen (the packed reference) in float64, in program
order and random stream interleavings, statically race-free; the plan's shape (rows a step,
FLOPs of the real rows, final-state copies, one workspace a capacity), the persistent
switch's refusal, and planted faults that must be caught."""
from __future__ import annotations

import numpy as np
import pytest
from testkit import (
    BWD_PLAN_SHAPE,
    CELLS,
    assert_missing_wait_caught,
    bwd_plan_case,
    check_bwd_plan,
    check_varlen,
    run_bwd_plan,
    run_varlen_numpy,
    varlen_case,
)
from testkit import cpu_plan_key as PlanKey

import dataclasses

from rnnrt.cells import forward_flops
from rnnrt.exec.racecheck import find_races
from rnnrt.exec.workspace import Workspace
from rnnrt.plan import backward_plan, forward_plan
from rnnrt.plan.ops import Gemm, Kernel
from rnnrt.plan.packing import bucket
from rnnrt.plan.switches import ALL, all_combinations, ladder

I, H = 4, 6
LENGTHS = [7, 5, 5, 2, 1]            # batch_sizes (5, 4, 3, 3, 3, 1, 1)
B = len(LENGTHS)
WIDE = (5,) * 9                     # every row runs 9 steps: frozen rows everywhere


def key_of(cell, layers, pattern, sw, train=True, capacity=16, bias=True):
    return PlanKey(cell, len(pattern), pattern[0], I, H, layers, bias, sw, train=train,
                   batch_sizes=tuple(pattern), capacity=capacity)


def _patterns(case):
    bs = case["bs"]
    return {"exact": bs, "bucketed": bucket(bs), "wide": WIDE}


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_every_combination_matches_the_packed_reference(cell, layers):
    case = varlen_case(cell, layers, LENGTHS, I, H, seed=layers)
    pattern = _patterns(case)["bucketed"]
    assert pattern != case["bs"], "the bucketed pattern must freeze some rows"
    for sw in all_combinations():
        key = key_of(cell, layers, pattern, sw)
        for plan in (forward_plan(key), backward_plan(key)):
            races = find_races(plan)
            assert not races, f"{sw.label()}: " + races[0].describe(plan)
        for reverse in (False, True):
            out, _ = run_varlen_numpy(key, case, reverse)
            check_varlen(out, case, reverse, f"{sw.label()} reverse={reverse}")
        if len(forward_plan(key).streams) > 1:
            out, _ = run_varlen_numpy(key, case, True, order="random", seed=layers)
            check_varlen(out, case, True, f"{sw.label()} random order")


@pytest.mark.parametrize("which", ["exact", "wide"])
@pytest.mark.parametrize("cell", CELLS)
def test_exact_and_wide_patterns_every_rung(cell, which):
    case = varlen_case(cell, 2, LENGTHS, I, H, bias=False, seed=5)
    pattern = _patterns(case)[which]
    for rung in ladder(input_batch=2) + ladder(input_batch=ALL)[-2:]:
        key = key_of(cell, 2, pattern, rung.switches, bias=False)
        for reverse in (False, True):
            out, _ = run_varlen_numpy(key, case, reverse, order="random", seed=3)
            check_varlen(out, case, reverse, f"{which} {rung.name} reverse={reverse}")


@pytest.mark.parametrize("cell", CELLS)
def test_inference_plans(cell):
    """train=False: the forward alone (c keeps every slot: each row's last is its c_n)."""
    case = varlen_case(cell, 2, LENGTHS, I, H, seed=2)
    for rung in ladder(input_batch=2):
        key = key_of(cell, 2, bucket(case["bs"]), rung.switches, train=False)
        assert not find_races(forward_plan(key))
        for reverse in (False, True):
            out, _ = run_varlen_numpy(key, case, reverse, order="random", seed=1)
            check_varlen(out, case, reverse, f"inference {rung.name}")


def test_one_workspace_serves_every_pattern_of_a_capacity():
    """Plans of one capacity have the same buffers: patterns run in turn on one workspace
    (poisoned once), each right, whatever the one before left in it."""
    sw = ladder(input_batch=2)[-2].switches
    cases = [varlen_case("lstm", 2, lens, I, H, seed=i)
             for i, lens in enumerate(([7, 5, 5, 2, 1], [3, 3, 2, 2, 2], [9, 1, 1, 1, 1]))]
    keys = [key_of("lstm", 2, p, sw) for c in cases for p in _patterns(c).values()]
    plans = [backward_plan(k) for k in keys]
    assert all(p.buffers == plans[0].buffers for p in plans)
    ws = Workspace(plans[0], np, np.float64, cases[0]["flat"])
    ws.poison()
    for i, k in enumerate(keys):
        case = cases[i // 3]
        ws.set_params(case["flat"])
        out, _ = run_varlen_numpy(k, case, reverse=bool(i % 2), ws=ws)
        check_varlen(out, case, bool(i % 2), f"pattern {k.batch_sizes} on a shared workspace")


def test_the_plan_runs_each_step_on_its_active_rows():
    """Step t's R.h GEMM and kernel have the pattern's rows; W.x and the weight gradients
    cover the real rows of the pattern (sum of it) once; the FLOPs are those of the packed
    rows; one copy a group end a layer (h and c) each way; dR is one GEMM a run of one
    active batch (two after a drop)."""
    pattern = (5, 5, 4, 4, 4, 2, 1)
    sw = ladder(input_batch=3)[-2].switches
    key = key_of("lstm", 2, pattern, sw)
    fwd, bwd = forward_plan(key), backward_plan(key)
    for layer in range(2):
        rh = {op.steps[0]: op.out.rows for op in fwd.ops
              if isinstance(op, Gemm) and op.kind == "rh" and op.layer == layer}
        assert rh == dict(enumerate(pattern))
        cells = {op.steps[0]: op.rows for op in fwd.ops
                 if isinstance(op, Kernel) and op.name == "lstm_fwd_mask" and op.layer == layer}
        assert cells == dict(enumerate(pattern))
        wx = [op for op in fwd.ops if isinstance(op, Gemm) and op.kind == "wx"
              and op.layer == layer]
        assert sum(op.out.rows for op in wx) == sum(pattern)
    assert fwd.gemm_flops() == forward_flops("lstm", I, H, 2, 1, sum(pattern))
    assert bwd.gemm_flops() == 2 * fwd.gemm_flops()
    copies = [op for op in fwd.ops if isinstance(op, Kernel) and op.name == "ew_copy"]
    assert len(copies) == 2 * 2 * 4          # h and c, 2 layers, 4 group ends (5->4->2->1->0)
    assert sum(op.rows for op in copies) == 2 * 2 * 5
    assert len([op for op in bwd.ops if isinstance(op, Kernel) and op.name == "ew_copy"]) == 16
    dr = [op for op in bwd.ops if isinstance(op, Gemm) and op.kind == "dw"
          and op.out.rows * op.out.cols == 4 * H * H and op.layer == 0]
    # runs (5,5) (4,4,4) (2) (1): the first one block, the others a first step alone + rest
    assert [op.a.rows for op in dr] == [10, 4, 8, 2, 1]
    assert [op.beta for op in dr] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert "T=7" in fwd.describe() and fwd.key.rows == sum(pattern)


def test_persistent_switch_declines_a_pattern_and_says_why():
    case = varlen_case("gru", 2, LENGTHS, I, H)
    sw = ladder(input_batch=2)[-1].switches
    assert sw.persistent
    key = key_of("gru", 2, bucket(case["bs"]), sw)
    plan = forward_plan(key)
    assert plan.fallback and "per-step active batch" in plan.fallback
    assert plan.counts()["kernel:persistent"] == 0
    out, _ = run_varlen_numpy(key, case, True)
    check_varlen(out, case, True, "persistent declined")


def test_bad_keys_are_refused():
    sw = ladder()[3].switches
    with pytest.raises(ValueError, match="batch_sizes"):
        PlanKey("lstm", 3, 4, I, H, 1, True, sw, batch_sizes=(4, 5, 1))
    with pytest.raises(ValueError, match="batch_sizes"):
        PlanKey("lstm", 3, 4, I, H, 1, True, sw, batch_sizes=(3, 2, 1))   # [0] != batch
    with pytest.raises(ValueError, match="batch_sizes"):
        PlanKey("lstm", 3, 4, I, H, 1, True, sw, batch_sizes=[4, 2, 1])   # not a tuple
    with pytest.raises(ValueError, match="capacity"):
        PlanKey("lstm", 3, 4, I, H, 1, True, sw, capacity=2)


# --- planted faults: the checks above must be able to fail ---------------------------------

def test_a_wrong_mask_is_caught():
    """With every row marked running (as a plan without masks would), rows past their end
    run on, and their final states and gradients come out wrong: the comparison fails."""
    case = varlen_case("lstm", 2, LENGTHS, I, H)
    key = key_of("lstm", 2, bucket(case["bs"]), ladder()[3].switches)
    _, ws = run_varlen_numpy(key, case)
    from rnnrt.exec import numpy_exec
    from rnnrt.plan.packing import row_map
    m = row_map(case["bs"], key.batch_sizes)
    ws.load(mask=np.ones_like(m.mask))
    numpy_exec.run(forward_plan(key), ws)
    with pytest.raises(AssertionError, match="h_n"):
        check_varlen({"y": ws.read_rows("y", m.rows), "h_n": ws.read("h_n")}, case, False,
                     "all-ones mask")


@pytest.mark.parametrize("which", [0, -1])
def test_a_removed_wait_is_caught(which):
    case = varlen_case("gru", 3, LENGTHS, I, H, seed=4)
    key = key_of("gru", 3, bucket(case["bs"]), ladder(input_batch=2)[-2].switches)

    def run_and_check(broken, seed):
        out, _ = run_varlen_numpy(key, case, order="random", seed=seed, bwd=broken)
        check_varlen(out, case, False, "broken")

    assert_missing_wait_caught(backward_plan(key), which, run_and_check)


def _writes_into(plan, names):
    """The ops of ``plan`` that write an element of the bindings ``names``."""
    from rnnrt.plan.model import cover
    bound = cover([v for n in names if n in plan.inputs for v in plan.inputs[n].views])
    hits = []
    for i, op in enumerate(plan.ops):
        for buf, spans in cover(op.writes).items():
            if any(a < d and c < b for a, b in spans for c, d in bound.get(buf, ())):
                hits.append(i)
    return hits


@pytest.mark.parametrize("cell", CELLS)
def test_no_plan_writes_its_state_inputs(cell):
    """h0, c0 (forward) and dh_n, dc_n (backward) are read, never written, by every plan —
    fixed or variable-length, every switch combination, the persistent families: the GPU
    runner relies on it to skip reloading zeros (gpu_state.RunState.zeroed)."""
    from rnnrt.kernels.limits import H100_SXM
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    for sw in all_combinations():
        for varlen in (False, True):
            for device in ((H100_SXM, sm80) if sw.persistent else (H100_SXM,)):
                kw = dict(batch_sizes=(4, 4, 3, 1), capacity=8) if varlen else {}
                key = dataclasses.replace(
                    PlanKey(cell, 4, 4, I, H, 2, True, sw, train=True, **kw), device=device)
                assert not _writes_into(forward_plan(key), ("h0", "c0")), sw.label()
                assert not _writes_into(backward_plan(key), ("dh_n", "dc_n")), sw.label()
    # planted: a GEMM that writes h0's first row is seen
    plan = forward_plan(PlanKey(cell, 4, 4, I, H, 2, True, ladder()[3].switches))
    i, op = next((i, op) for i, op in enumerate(plan.ops) if isinstance(op, Gemm))
    h0 = plan.inputs["h0"].views[1]
    bad = dataclasses.replace(op, out=dataclasses.replace(op.out, buf=h0.buf, offset=h0.offset,
                                                          rows=1))
    broken = dataclasses.replace(plan, ops=plan.ops[:i] + (bad,) + plan.ops[i + 1:])
    assert _writes_into(broken, ("h0",)) == [i]


@pytest.mark.parametrize("varlen", [False, True])
def test_a_backward_without_dx(varlen):
    """need_dx=False: the same buffers, no layer-0 dx GEMM, no 'dx' output, and every other
    gradient as the full backward's."""
    sw = ladder(input_batch=2)[-2].switches
    if varlen:
        case = varlen_case("lstm", 2, LENGTHS, I, H, seed=6)
        key = key_of("lstm", 2, bucket(case["bs"]), sw)
    else:
        layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 2, seed=6)
        key = PlanKey("lstm", *BWD_PLAN_SHAPE, 2, True, sw, train=True)
    full, lean = backward_plan(key), backward_plan(key, False, False)
    assert lean.buffers == full.buffers and "dx" not in lean.outputs
    dx0 = [op for op in full.ops if isinstance(op, Gemm) and op.kind == "dx" and op.layer == 0]
    assert dx0 and not [op for op in lean.ops if isinstance(op, Gemm) and op.kind == "dx"
                        and op.layer == 0]
    assert not find_races(lean)
    if varlen:
        out, _ = run_varlen_numpy(key, case, True, order="random", seed=2, bwd=lean)
        assert "dx" not in out
        check_varlen(out, case, True, "without dx")
    else:
        ws = run_bwd_plan(key, flat, fwd_in, bwd_in, "random", 2, bwd=lean)
        assert "dx" not in ws.plan.outputs
        check_bwd_plan(ws, layout, {**ref, "dx": None}, "without dx")
