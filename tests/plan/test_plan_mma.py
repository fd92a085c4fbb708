"""The tensor-core grid kernel's family ('mma', rnnrt/kernels/mma.py) in plans, without a GPU:
a bfloat16 / float16 key that names it runs its kernel (no fallback), and the NumPy
executor's plan (the kernel's twin: the grid kernel's emulation over its cut) equals the
rounding-aware reference to float64 agreement (the twin runs in the workspace's float64, so
the tensor core's summation order, which the GPU tests allow for, does not show here);
float32 and tf32 keys fall back to the schedule without the switch, saying why; the
selector's candidates and the fitting families name it for 16-bit shapes only.
"""
from __future__ import annotations

import pytest
from test_plan_precision import EXACT, case, check, key_of, run_plans

from rnnrt.kernels import choice
from rnnrt.kernels import mma as MM
from rnnrt.kernels.limits import H100_SXM
from rnnrt.plan import forward_plan
from rnnrt.plan.switches import Switches

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
PERSISTENT = Switches(grouped=True, streams=True, fused=True, wavefront=True, input_batch=2,
                      persistent=True)


@pytest.mark.parametrize("dtype", MM.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_mma_family_runs_its_kernel_and_equals_the_reference(cell, dtype):
    c = case(cell, dtype, seed=5)
    for train in (False, True):
        key = key_of(cell, PERSISTENT, dtype, train, family="mma")
        plan = forward_plan(key)
        assert plan.fallback is None, plan.fallback
        names = {op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"}
        assert names == {MM.kernel_name(cell)}, names
        assert "tensor-core grid kernel" in plan.fit
        check(run_plans(key, c), c, f"{cell} {dtype} mma{' train' if train else ''}",
              EXACT["atol"], EXACT["rtol"])


@pytest.mark.parametrize("dtype", ("float32", "tf32"))
def test_fp32_and_tf32_keys_decline_with_the_reason(dtype):
    key = key_of("lstm", PERSISTENT, dtype, False, family="mma")
    plan = forward_plan(key)
    assert plan.fallback is not None and MM.MMA_DTYPES_REASON in plan.fallback, plan.fallback
    assert not any(getattr(op, "kind", "") == "persistent" for op in plan.ops)


def test_a_planted_twin_fault_is_caught(monkeypatch):
    """The check can fail: a twin that drops the last warp's columns differs."""
    from rnnrt.kernels import emulate as E
    real = E.k_columns

    def short(fit, group):
        cols = real(fit, group)
        return cols[:-1] if group == 0 and len(cols) else cols
    monkeypatch.setattr(E, "k_columns", short)
    c = case("lstm", "bfloat16", seed=5)
    key = key_of("lstm", PERSISTENT, "bfloat16", False, family="mma")
    with pytest.raises(AssertionError):
        check(run_plans(key, c), c, "planted")


def _shape(dtype, hidden=256, batch=64, train=False):
    return choice.Shape("lstm", 1, hidden, hidden, batch, 100, train, dtype=dtype)


def test_candidates_name_mma_for_16_bit_shapes_only():
    for dtype in MM.MMA_DTYPES:
        fams = choice.fitting_families(_shape(dtype), H100_SXM)
        assert "mma" in fams and "fits" in fams["mma"]
        names = [s.name for s in choice.candidates(_shape(dtype), H100_SXM)]
        assert "mma" in names and names.index("mma") < names.index("grid"), names
    for dtype in ("float32", "tf32"):
        assert "mma" not in choice.fitting_families(_shape(dtype), H100_SXM)
        assert "mma" not in [s.name for s in choice.candidates(_shape(dtype), H100_SXM)]
    # a shape the kernel cannot hold: no candidate
    assert "mma" not in choice.fitting_families(_shape("bfloat16", 1024, 256), H100_SXM)
