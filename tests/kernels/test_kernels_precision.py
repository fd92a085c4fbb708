"""Precision on the kernel side, without a GPU: the library instantiates typed twins (one
compile per file for a plan's missing ones, fp32 requests none, the function cache bounded,
least recently used out); choice.py runs the per-layer persistent kernels, forward and backward,
at every precision (their typed instantiations), the stack family at float32 (FMAs) and
bfloat16 / float16 (tensor cores), declining tf32 with the reason; the selector's candidates
follow."""
from __future__ import annotations

import dataclasses

import pytest
from testkit import cpu_plan_key, fake_cupy_installed

from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels import library as L
from rnnrt.kernels.limits import H100_SXM
from rnnrt.plan.switches import ladder

PERSISTENT = dataclasses.replace(ladder(input_batch=10)[-1].switches, persistent=True)


def _key(dtype, **kw):
    """A PlanKey of precision ``dtype``."""
    args = dict(cell="lstm", steps=20, batch=32, input_size=64, hidden_size=128,
                num_layers=2, bias=True, switches=PERSISTENT)
    args.update(kw)
    return cpu_plan_key(**args, dtype=dtype)


@pytest.mark.parametrize("dtype", ["tf32", "bfloat16", "float16"])
def test_the_per_layer_persistent_kernels_run_every_dtype(dtype):
    """Issue 24: the grid, cluster and backward kernels' typed instantiations compute the
    rungs' math, so a tf32 / 16-bit key runs them (no fallback) and names the family."""
    for family in ("grid", "cluster"):
        ch = C.choose_persistent(_key(dtype, family=family))
        assert ch.runs and ch.family == family and ch.fallback is None, (family, ch.fallback)
    bw = C.choose_persistent_backward(_key(dtype, train=True, backward="persistent"))
    assert bw.runs, bw.fallback


def test_the_stack_kernel_declines_tf32_with_the_reason():
    key = _key("tf32", num_layers=4, hidden_size=512, input_size=512, batch=64, family="stack")
    assert C.choose_persistent(dataclasses.replace(key, dtype="float32")).runs   # planted
    ch = C.choose_persistent(key)
    assert not ch.runs
    assert C.STACK_TF32_REASON in ch.fallback and "tf32" in ch.fallback
    auto = C.choose_persistent(dataclasses.replace(key, family=None))
    assert auto.runs and auto.family != "stack" and "stack kernel not used" in auto.describe()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_stack_family_runs_the_tensor_core_stack_at_16_bits(dtype):
    key = _key(dtype, num_layers=4, hidden_size=512, input_size=512, batch=64, family="stack")
    ch = C.choose_persistent(key)
    assert ch.runs and ch.family == "stack" and ch.stack.kernel == "lstm_persistent_stack_mma_fwd"
    assert ch.describe().startswith("tensor-core stack")
    fp32 = C.choose_persistent(dataclasses.replace(key, dtype="float32"))
    assert fp32.stack.kernel == "lstm_persistent_stack_fwd"


def test_typed_candidates_are_the_per_layer_families_and_the_cublas_schedules():
    base = dict(cell="lstm", layers=4, input_size=512, hidden=512, batch=64, steps=100)
    fp32 = C.candidates(SEL.Shape(**base), H100_SXM)
    assert any(s.name == "stack" for s in fp32)     # the planted contrast: fp32 has it
    for dtype in ("tf32", "bfloat16", "float16"):
        for train in (False, True):
            shape = SEL.Shape(**base, train=train, dtype=dtype)
            cands = C.candidates(shape, H100_SXM)
            names = [s.name for s in cands]
            stack = any(n.startswith("stack") for n in names)
            assert "grid" in names and stack == (dtype != "tf32"), names   # 16 bits: mma
            assert set(C.paper_schedules()) <= set(cands)


@pytest.fixture
def fake(monkeypatch):
    with fake_cupy_installed(monkeypatch) as f:
        yield f


def test_twins_compile_once_per_file_per_plan(fake):
    lib = L.KernelLibrary()
    bf, f32 = "bfloat16", "float32"
    reqs = [("ew_copy", (bf, f32)), ("ew_copy", (bf, f32)), ("transpose", (bf, f32)),
            ("lstm_fwd", (bf, f32, f32, f32, f32, f32, f32, f32)),
            ("lstm_bwd", (bf, f32, f32, f32, f32, f32, f32, f32)),
            ("ew_add", (f32, f32, f32))]                         # fp32: no twin
    lib.instantiate(reqs)
    twins = [c for c in fake.compiled if len(c) == 3]
    assert sorted(len(c[2]) for c in twins) == [1, 1, 2]          # one module a file
    assert {e for c in twins for e in c[2]} == {
        "ew_copy_t<bf16, float>", "transpose_t<bf16, float>",
        "lstm_fwd_t<bf16, float, float, float, float, float, float, float>",
        "lstm_bwd_t<bf16, float, float, float, float, float, float, float>"}
    # the text names its expressions: CuPy's disk cache (keyed on the text) keeps the sets apart
    assert all(f"typed twins instantiated (rnnrt): {'; '.join(c[2])}" in c[0] for c in twins)
    n = len(fake.compiled)
    lib.instantiate(reqs)                                         # all loaded: nothing more
    assert lib.get_typed("ew_copy", (bf, f32)).name == "ew_copy_t<bf16, float>"
    assert lib.get_typed("ew_add", (f32, f32, f32)).name == "ew_add"   # the extern "C" one
    assert len(fake.compiled) == n + 1                            # ew_add's fp32 module only
    with pytest.raises(ValueError, match="expected 2 element types"):
        lib.get_typed("ew_copy", (bf,))


def test_twin_function_cache_is_bounded(fake, monkeypatch):
    monkeypatch.setattr(L, "TWIN_FUNCTIONS_MAX", 3)
    lib = L.KernelLibrary()
    combos = [(a, b) for a in ("bfloat16", "float16") for b in ("float32", "bfloat16")]
    for c in combos:
        lib.get_typed("ew_copy", c)
    assert lib.loaded_twins == tuple(("ew_copy", c) for c in combos[1:])   # LRU out
    assert L.compile_twins.cache_info().maxsize == L.TWIN_MODULES_MAX
