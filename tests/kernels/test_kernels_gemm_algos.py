"""The GEMM algorithm chooser (kernels/gemm_algos.py) with a fake timer, the cuBLASLt
binding's arithmetic (exec/cublaslt.py: the column-major problem of a row-major GEMM, operand
alignments), PlanKey.gemm / Schedule.gemm, and the selector's '+lt' refinement."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rnnrt.exec.cublaslt import alignment, lt_layouts
from rnnrt.kernels import selector as SEL
from rnnrt.kernels.gemm_algos import MIN_GAIN, GemmAlgoChooser, GemmProblem
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.schedules import Schedule, paper_schedule, with_lt
from rnnrt.plan.model import PlanKey
from rnnrt.plan.switches import Switches


def problem(m=64, copies=1):
    return GemmProblem(m, 32, 16, False, True, 16, 16, m, copies=copies)


class Timer:
    def __init__(self, ms, fail=()):
        self.ms, self.fail, self.calls = ms, set(fail), []

    def __call__(self, i):
        self.calls.append(i)
        if i in self.fail:
            raise RuntimeError(f"option {i} cannot run")
        return self.ms[i]


def test_the_fastest_option_wins_and_is_remembered():
    c = GemmAlgoChooser()
    t = Timer([1.0, 0.9, 0.7, 0.8])
    got = c.choose(problem(), ["default", "a", "b", "c"], t, payloads=[None, "A", "B", "C"])
    assert (got.index, got.label, got.payload) == (2, "b", "B")
    assert got.gain() == pytest.approx(1.0 / 0.7)
    # remembered: asked again, nothing is timed
    again = c.choose(problem(), ["default", "a", "b", "c"], Timer([9, 9, 9, 9]))
    assert again is got and t.calls == [0, 1, 2, 3]


def test_the_default_stays_unless_clearly_faster():
    """Within MIN_GAIN of the default, cublasSgemm's own choice is kept (noise must not
    flip it), and an option that raises is out."""
    c = GemmAlgoChooser()
    near = 1.0 / (1.0 + MIN_GAIN / 2)
    got = c.choose(problem(), ["default", "a", "b"], Timer([1.0, near, 0.1], fail={2}))
    assert got.index == 0 and got.label == "default" and got.gain() == 1.0
    assert got.ms[2] is None and "cannot run" in got.failed[2]
    with pytest.raises(RuntimeError, match="option 0"):
        GemmAlgoChooser().choose(problem(), ["default", "a"], Timer([1.0, 0.5], fail={0}))


def test_pick_overrides_the_rule_and_must_name_an_option_that_ran():
    c = GemmAlgoChooser(pick=lambda ms: len(ms) - 1)
    assert c.choose(problem(), ["default", "a", "b"], Timer([0.1, 1.0, 2.0])).index == 2
    bad = GemmAlgoChooser(pick=lambda ms: 1)
    with pytest.raises(ValueError, match="pick"):
        bad.choose(problem(), ["default", "a"], Timer([1.0, 1.0], fail={1}))


def test_memory_is_bounded_least_recently_used_first():
    c = GemmAlgoChooser(max_entries=3)
    for m in (1, 2, 3):
        c.choose(problem(m), ["default"], Timer([1.0]))
    assert c.known(problem(1)) is not None      # 1 used again: 2 is now the oldest
    c.choose(problem(4), ["default"], Timer([1.0]))
    assert len(c) == 3 and c.known(problem(2)) is None
    assert all(c.known(problem(m)) is not None for m in (1, 3, 4))
    assert [r["M"] for r in c.summary()] == [1, 3, 4]
    # the copies a problem was timed beside are part of its key
    assert problem(1, copies=4) != problem(1)
    with pytest.raises(ValueError, match="max_entries"):
        GemmAlgoChooser(max_entries=0)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_lt_layouts_state_the_same_product_column_major(ta, tb):
    """Row-major out[N, M] = op(a) @ op(b) read as cuBLASLt's column-major C = op(A) op(B),
    A our b and B our a, with padded leading dimensions: the same numbers."""
    rng = np.random.default_rng(0)
    M, N, K, pad = 5, 3, 4, 2
    a_ld, b_ld, out_ld = (N if ta else K) + pad, (K if tb else M) + pad, M + pad
    a = rng.standard_normal(((K if ta else N), a_ld))
    b = rng.standard_normal(((M if tb else K), b_ld))
    want = ((a[:, :N].T if ta else a[:, :K]) @ (b[:, :K].T if tb else b[:, :M]))
    opA, opB, A, B, C = lt_layouts(M, N, K, ta, tb, a_ld, b_ld, out_ld)

    def colmajor(flat, rows, cols, ld):   # element (r, c) at c * ld + r
        return np.array([[flat[c * ld + r] for c in range(cols)] for r in range(rows)])

    Am = colmajor(b.ravel(), *A)
    Bm = colmajor(a.ravel(), *B)
    Am, Bm = (Am.T if opA else Am), (Bm.T if opB else Bm)
    assert Am.shape == (M, K) and Bm.shape == (K, N) and C == (M, N, out_ld)
    np.testing.assert_allclose((Am @ Bm).T, want, rtol=1e-12)


def test_alignment_is_the_largest_power_of_two_dividing_the_address():
    assert alignment(0x1000) == 256 and alignment(0x1004) == 4 and alignment(0x1010) == 16
    assert alignment(0x1008, cap=64) == 8 and alignment(3) == 1


def test_plan_key_and_schedule_carry_the_choice():
    sw = Switches()
    assert PlanKey("lstm", 4, 2, 8, 8, 1, True, sw).gemm == "cublas"
    assert PlanKey("lstm", 4, 2, 8, 8, 1, True, sw, gemm="lt").gemm == "lt"
    with pytest.raises(ValueError, match="gemm"):
        PlanKey("lstm", 4, 2, 8, 8, 1, True, sw, gemm="cutlass")
    with pytest.raises(ValueError, match="float32 only"):
        PlanKey("lstm", 4, 2, 8, 8, 1, True, sw, gemm="lt", dtype="bfloat16")
    s = with_lt(paper_schedule("ib10"))
    assert s.name == "ib10+lt" and s.gemm == "lt"
    assert Schedule.from_dict(json.loads(json.dumps(s.as_dict()))) == s
    old = paper_schedule("ib10").as_dict()
    del old["gemm"]   # an entry written before the field: cuBLAS's own choice
    assert Schedule.from_dict(old).gemm == "cublas"
    with pytest.raises(ValueError, match="gemm"):
        Schedule.from_dict({**old, "gemm": "x"})


SHAPE = SEL.Shape("lstm", 4, 512, 512, 256, 100)


class FakeTimer:
    def __init__(self, ms):
        self.ms, self.calls = ms, []

    def __call__(self, sched, shape, repeats):
        self.calls.append(sched.name)
        return [self.ms(sched)] * repeats


def only(*names):
    return lambda shape, device: [paper_schedule(n) for n in names]


# 4.0 / 1.01 is the most '+lt' may take and win (LT_MIN_GAIN): 3.99 is noise, not a gain
@pytest.mark.parametrize("lt_ms, wins", [(3.5, True), (3.99, False), (4.5, False)])
def test_the_selector_times_the_winner_with_chosen_gemms(lt_ms, wins):
    ms = {"paper": 5.0, "ib10": 4.0, "ib10+lt": lt_ms}
    timer = FakeTimer(lambda s: ms[s.name])
    sel = SEL.Selector(timer, H100_SXM, autotune=True,
                       candidates_fn=only("paper", "ib10")).select(SHAPE)
    assert [r["name"] for r in sel.candidates] == ["paper", "ib10", "ib10+lt"]
    assert sel.schedule.name == ("ib10+lt" if wins else "ib10")
    assert (sel.schedule.gemm == "lt") == wins


def test_the_selector_does_not_try_chosen_gemms_below_fp32_or_when_told_not_to():
    ms = {"paper": 5.0, "ib10": 4.0}
    for shape, kw in ((SEL.Shape("lstm", 4, 512, 512, 256, 100, dtype="bfloat16"), {}),
                      (SHAPE, {"try_lt": False})):
        timer = FakeTimer(lambda s: ms[s.name])
        sel = SEL.Selector(timer, H100_SXM, autotune=True, candidates_fn=only("paper", "ib10"),
                           **kw).select(shape)
        assert [r["name"] for r in sel.candidates] == ["paper", "ib10"], shape
