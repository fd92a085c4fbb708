"""The tensor-core grid kernel's family ('mma', rnnrt/kernels/mma.py) in plans, without a GPU:
a bfloat16 / float16 key that names it runs its kernel (no fallback), and the NumPy
executor's plan (the kernel's twin: the grid kernel's emulation over its cut) equals the
rounding-aware reference to float64 agreement (the twin runs in the workspace's float64, so
the tensor core's summation order, which the GPU tests allow for, does not show here);
float32 and tf32 keys fall back to the schedule without the switch, saying why; the
selector's candidates and the fitting families name it for 16-bit shapes only. The backward:
a training key of the family with the persistent backward runs the tensor-core backward grid
kernel (mma_bwd.py; its twin: emulate_bwd over its cut) and equals the reference likewise;
float32 / tf32 keys run the FMA backward and say why; 'grid' / 'cluster' still name the FMA
kernels; the selector's 'mma+pbwd' candidate runs both tensor-core kernels.
"""
from __future__ import annotations

import pytest
from test_plan_precision import EXACT, case, check, key_of, run_plans

from rnnrt.kernels import choice, selector
from rnnrt.kernels import mma as MM
from rnnrt.kernels import mma_bwd as MB
from rnnrt.kernels.limits import H100_SXM
from rnnrt.plan import forward_plan
from rnnrt.plan.switches import Switches

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
PERSISTENT = Switches(grouped=True, streams=True, fused=True, wavefront=True, input_batch=2,
                      persistent=True)


def check_family_plan(cell, dtype, family, kernel, words, seed, batch=None, **key_kw):
    """A ``dtype`` key naming ``family`` (and ``key_kw``: a cluster count) runs ``kernel``
    (no fallback; ``words`` in the plan's fit string), forward and training, and the NumPy
    executor's plans equal the reference, at ``batch`` (default the case's) (also the
    tensor-core cluster family's test, test_plan_mmac.py)."""
    size = {} if batch is None else {"batch": batch}
    c = case(cell, dtype, seed=seed, **size)
    for train in (False, True):
        key = key_of(cell, PERSISTENT, dtype, train, family=family, **size, **key_kw)
        plan = forward_plan(key)
        assert plan.fallback is None, plan.fallback
        names = {op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"}
        assert names == {kernel}, names
        assert words in plan.fit
        check(run_plans(key, c), c, f"{cell} {dtype} {family}{' train' if train else ''}",
              EXACT["atol"], EXACT["rtol"])


def check_declines_with_the_reason(family, dtype):
    """A ``dtype`` key naming the 16-bit-only ``family`` falls back, saying why."""
    plan = forward_plan(key_of("lstm", PERSISTENT, dtype, False, family=family))
    assert plan.fallback is not None and MM.MMA_DTYPES_REASON in plan.fallback, plan.fallback
    assert not any(getattr(op, "kind", "") == "persistent" for op in plan.ops)


@pytest.mark.parametrize("dtype", MM.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_mma_family_runs_its_kernel_and_equals_the_reference(cell, dtype):
    check_family_plan(cell, dtype, "mma", MM.kernel_name(cell), "tensor-core grid kernel", 5)


@pytest.mark.parametrize("dtype", ("float32", "tf32"))
def test_fp32_and_tf32_keys_decline_with_the_reason(dtype):
    check_declines_with_the_reason("mma", dtype)


def test_a_planted_twin_fault_is_caught(monkeypatch):
    """The check can fail: a twin that drops the last warp's columns differs."""
    from rnnrt.kernels import emulate as E
    real = E.k_columns

    def short(fit, group, depth=None):
        cols = real(fit, group, depth)
        return cols[:-1] if group == 0 and len(cols) else cols
    monkeypatch.setattr(E, "k_columns", short)
    c = case("lstm", "bfloat16", seed=5)
    key = key_of("lstm", PERSISTENT, "bfloat16", False, family="mma")
    with pytest.raises(AssertionError):
        check(run_plans(key, c), c, "planted")


def _shape(dtype, hidden=256, batch=64, train=False):
    return selector.Shape("lstm", 1, hidden, hidden, batch, 100, train, dtype=dtype)


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


# --- the backward: the tensor-core backward grid kernel (mma_bwd.py) -------------------------

def _bwd_kernels(plan):
    return {op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"}


@pytest.mark.parametrize("dtype", MM.MMA_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_mma_family_training_runs_the_tensor_core_backward(cell, dtype):
    """A training key of family 'mma' with the persistent backward runs the tensor-core
    backward grid kernel (one launch a layer, no fallback), and the NumPy executor's plans
    (its twin: emulate_bwd over mma_bwd's cut) equal the rounding-aware reference to float64
    agreement, in program order and in a random legal order; the plan has no races."""
    from rnnrt.exec.racecheck import find_races
    from rnnrt.plan.backward import backward_plan
    c = case(cell, dtype, seed=6)
    key = key_of(cell, PERSISTENT, dtype, True, family="mma", backward="persistent")
    bwd = backward_plan(key)
    assert bwd.fallback is None, bwd.fallback
    assert _bwd_kernels(bwd) == {MB.kernel_name(cell)}, _bwd_kernels(bwd)
    assert "tensor-core grid kernel" in bwd.fit and "backward" in bwd.fit, bwd.fit
    launches = [op for op in bwd.ops if getattr(op, "kind", "") == "persistent"]
    assert len(launches) == key.num_layers and all(op.steps == (0, key.steps) for op in launches)
    what = f"{cell} {dtype} mma+mma-bwd"
    check(run_plans(key, c), c, what, EXACT["atol"], EXACT["rtol"])
    check(run_plans(key, c, "random", seed=3), c, what + " random", EXACT["atol"],
          EXACT["rtol"])
    races = find_races(bwd)
    assert not races, races[0].describe(bwd)


def test_named_fma_backward_and_other_families_keep_their_kernels():
    """'grid' / 'cluster' name the FMA backward kernels whatever the family; a family other
    than 'mma' with 'persistent' runs the FMA kernel the cost model prefers."""
    from rnnrt.plan.backward import backward_plan
    for family, backward, want in (("mma", "grid", "lstm_persistent_bwd"),
                                   ("mma", "cluster", "lstm_persistent_cluster_bwd"),
                                   ("grid", "persistent", None)):
        key = key_of("lstm", PERSISTENT, "bfloat16", True, family=family, backward=backward)
        ran = _bwd_kernels(backward_plan(key))
        assert ran and not any("_mma_" in n for n in ran), (family, backward, ran)
        assert want is None or ran == {want}, (family, backward, ran)


@pytest.mark.parametrize("dtype", ("float32", "tf32"))
def test_fp32_and_tf32_keys_run_the_fma_backward_saying_why(dtype):
    from rnnrt.plan.backward import backward_plan
    key = key_of("gru", PERSISTENT, dtype, True, family="mma", backward="persistent")
    bwd = backward_plan(key)
    assert bwd.fallback is None and not any("_mma_" in n for n in _bwd_kernels(bwd))
    assert "tensor-core backward not used" in bwd.fit and MM.MMA_DTYPES_REASON in bwd.fit, \
        bwd.fit
    c = case("gru", dtype, seed=6)
    check(run_plans(key, c), c, f"gru {dtype} mma fallback backward")


def test_a_planted_backward_twin_fault_is_caught(monkeypatch):
    """The check can fail: a twin of the tensor-core backward that drops warp 0's last
    column (the forward's twin untouched) differs from the reference."""
    from rnnrt.kernels import emulate as E
    real = E.k_columns

    def short(fit, group, depth=None):
        cols = real(fit, group, depth)
        return cols[:-1] if isinstance(fit, MB.MmaBwdFit) and group == 0 and len(cols) else cols
    monkeypatch.setattr(E, "k_columns", short)
    c = case("lstm", "bfloat16", seed=6)
    key = key_of("lstm", PERSISTENT, "bfloat16", True, family="mma", backward="persistent")
    with pytest.raises(AssertionError, match="MISMATCH"):
        check(run_plans(key, c), c, "planted")


def test_the_selector_offers_and_runs_mma_with_its_backward():
    """A 16-bit training shape's candidates include 'mma+pbwd' (the forward and backward
    tensor-core kernels); the key the selector builds from it runs both."""
    from rnnrt.plan import backward_plan
    shape = _shape("bfloat16", train=True)
    scheds = {s.name: s for s in choice.candidates(shape, H100_SXM)}
    assert "mma+pbwd" in scheds, list(scheds)
    s = scheds["mma+pbwd"]
    assert (s.family, s.backward) == ("mma", "persistent")
    key = choice.with_family(key_of("lstm", PERSISTENT, "bfloat16", True), s)
    assert _bwd_kernels(backward_plan(key)) == {MB.kernel_name("lstm")}
    assert "mma+pbwd" not in [s.name for s in choice.candidates(_shape("float32", train=True),
                                                                H100_SXM)]
