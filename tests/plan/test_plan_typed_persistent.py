"""The persistent kernels at tf32, bfloat16 and float16 (issue 24, step 1), without a GPU: the
NumPy executor runs the kernels' twins (kernels/emulate.py, emulate_bwd.py: the kernels'
decomposition, rounding where the typed instantiations round: h and dg stored in the storage
type, the product's operands R, h, dg as the rungs' GEMMs read them) and must equal the
rounding-aware float64 reference (rnnrt.reference with dtype=) to float64 agreement, for
every cell x family (grid, cluster; the backward grid and cluster kernels) x dtype, forward
and forward + backward. The plan says which family ran (no silent fallback); the stack
family declines a shape or precision it cannot run with the reason. A planted misplaced rounding is caught."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_plan_precision import CELLS, EXACT, case, check, key_of, run_plans

from rnnrt.check import compare
from rnnrt.kernels import choice as C
from rnnrt.kernels import emulate as E
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.forward import forward_plan
from rnnrt.plan.switches import ladder
from rnnrt.precision import gemm_operand

TYPED = ("tf32", "bfloat16", "float16")
PERSISTENT = ladder(2)[-1].switches
assert PERSISTENT.persistent


def persistent_kernels(plan) -> list[str]:
    return [op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"]


@pytest.mark.parametrize("dtype", TYPED)
@pytest.mark.parametrize("cell", CELLS)
def test_typed_persistent_forward_and_backward_equal_the_rounding_aware_reference(cell, dtype):
    c = case(cell, dtype, seed=11)
    n = 0
    for family in ("grid", "cluster"):
        for train, backward in ((False, None), (True, "grid"), (True, "cluster")):
            key = key_of(cell, PERSISTENT, dtype, train, family=family, backward=backward)
            what = f"{cell} {dtype} {family}{' bwd ' + backward if train else ''}"
            fwd = forward_plan(key)
            assert fwd.fallback is None, f"{what}: {fwd.fallback}"
            kinds = persistent_kernels(fwd)
            want = f"{cell}_persistent{'_cluster' if family == 'cluster' else ''}_fwd"
            assert kinds and set(kinds) == {want}, f"{what}: ran {kinds}"
            if train:
                bwd = backward_plan(key)
                assert bwd.fallback is None, f"{what}: {bwd.fallback}"
                want = f"{cell}_persistent{'_cluster' if backward == 'cluster' else ''}_bwd"
                assert set(persistent_kernels(bwd)) == {want}, what
            check(run_plans(key, c), c, what)
            n += 1
    assert n == 6


@pytest.mark.parametrize("dtype", TYPED)
def test_the_stack_kernel_falls_back_saying_why(dtype):
    """tf32: no stack kernel (STACK_TF32_REASON); bfloat16 / float16: the tensor-core stack
    kernel's fit refuses this shape (input size != hidden: tests/plan/test_plan_stack_mma.py
    runs it where it fits)."""
    key = key_of("lstm", PERSISTENT, dtype, False, family="stack")
    plan = forward_plan(key)
    why = C.STACK_TF32_REASON if dtype == "tf32" else "tensor-core stack"
    assert plan.fallback and why in plan.fallback, plan.fallback
    assert not persistent_kernels(plan)
    c = case("lstm", dtype, seed=12)
    check(run_plans(key, c), c, f"stack fallback {dtype}")


@pytest.mark.parametrize("dtype,what", [("bfloat16", "h"), ("float16", "h"),
                                        ("tf32", "operand")])
def test_a_misplaced_rounding_is_caught(monkeypatch, dtype, what):
    """Planted: the twins' product reads h and dg unrounded (as a cluster kernel pushing the
    fp32 value instead of the stored one would), or reads the operands as stored without
    the TF32 rounding: the persistent plans then differ from the reference far beyond the
    tolerance."""
    true_operand_of = E.operand_of

    def planted(dt):
        stored, operand = true_operand_of(dt)
        if what == "h":
            return (lambda a: a), (lambda a: gemm_operand(a, dt))
        return stored, (lambda a: stored(a))
    c = case("lstm", dtype, seed=13)
    key = key_of("lstm", PERSISTENT, dtype, True, family="grid", backward="grid")
    check(run_plans(key, c), c, "true twins")   # the contrast: the real twins agree
    monkeypatch.setattr(E, "operand_of", planted)
    import rnnrt.kernels.emulate_bwd as EB
    monkeypatch.setattr(EB, "operand_of", planted)
    out = run_plans(key, c)
    worst = max(compare(out[n], c[4][n], **EXACT).max_excess for n in ("y", "dx", "grads"))
    assert worst > 1e-6, f"a twin with a misplaced rounding ({what}) passed"


def test_fp32_keys_are_unchanged():
    """float32's persistent plans: the same kernels and the same values as before typed
    instantiations existed (the twins' float32 rounding is the identity)."""
    c = case("gru", "float32", seed=14)
    key = key_of("gru", PERSISTENT, "float32", True, family="cluster", backward="grid")
    out = run_plans(key, c)
    check(out, c, "fp32 persistent")
    assert np.isfinite(out["y"]).all()
    k16 = dataclasses.replace(key, dtype="bfloat16")
    assert [b.name for b in forward_plan(k16).buffers] == \
        [b.name for b in forward_plan(key).buffers]
