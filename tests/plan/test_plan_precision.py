"""Plans at a precision (PlanKey.dtype, rnnrt/precision.py): the storage labels, the NumPy
executor's rounding against the rounding-aware reference (exactly the same rounding points,
so float64 agreement to ~1e-9, not a storage tolerance), and the fp32 plans unchanged.

Every cell x every ladder rung x bfloat16 / float16, inference and forward + backward, on
tiny odd shapes (T 4, B 3, I 5, H 6, two layers), random data, poisoned buffers. Planted
faults (a reference that does not round the gate gradients, an executor that does not round
one buffer) are caught; the rounding-aware reference really rounds (it differs from the
fp32 one by about the storage precision).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from testkit import bwd_plan_case, check_varlen, cpu_plan_key, run_varlen_numpy, varlen_case

from rnnrt.check import assert_close, compare
from rnnrt.exec import numpy_exec
from rnnrt.exec.racecheck import find_races
from rnnrt.exec.workspace import Workspace
from rnnrt.plan import backward_plan, forward_plan
from rnnrt.plan.model import Buffer, PlanKey, gemm_operands, product_operands, validate
from rnnrt.plan.ops import Gemm, Kernel, View
from rnnrt.plan.switches import Switches, all_combinations, ladder
from rnnrt.precision import DTYPES, PRECISIONS, round_to_storage

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
LOW = ("bfloat16", "float16")
T, B, I, H, L = 4, 3, 5, 6, 2
EXACT = {"atol": 1e-12, "rtol": 1e-9}   # the same rounding points: float64 agreement


def case(cell, dtype, seed=0, batch=B):
    """testkit.bwd_plan_case at (T, ``batch``, I, H), two layers, with the rounding-aware
    reference of ``dtype``: -> (layout, flat, (x, h0, c0), (dy, dh_n, dc_n), ref {y, h_n,
    c_n, dx, dh0, dc0, grads})."""
    return bwd_plan_case(cell, L, seed=seed, shape=(T, batch, I, H), dtype=dtype)


def run_plans(key, c, order="program", seed=None):
    """``key``'s forward (and backward, training keys) on the NumPy executor (float64),
    every io and scratch buffer poisoned first -> {name: array}."""
    _, flat, (x, h0, c0), (dy, dhn, dcn), _ = c
    fwd = forward_plan(key)
    bwd = backward_plan(key) if key.train else None
    ws = Workspace(bwd or fwd, np, np.float64, flat)
    ws.poison(roles=("io", "scratch"))
    ws.load_inputs(x, h0, c0)
    numpy_exec.run(fwd, ws, order=order, seed=seed)
    out = ws.outputs()
    if bwd is not None:
        ws.load(dy=dy, dh_n=dhn, **({"dc_n": dcn} if "dc_n" in bwd.inputs else {}))
        numpy_exec.run(bwd, ws, order=order, seed=seed)
        out.update({n: ws.read(n) for n in ("dx", "dh0", "dc0") if n in bwd.outputs},
                   grads=ws.read("grads"))
    return out


def check(out, c, what, atol=EXACT["atol"], rtol=EXACT["rtol"]):
    """Every output of ``out`` against ``c``'s reference (grads: each parameter's entry,
    not the layout's padding), the worst element named on failure."""
    layout, ref = c[0], c[4]
    for name, r in ref.items():
        if name not in out or r is None:
            continue
        if name == "grads":
            for e in layout.entries:
                n = int(np.prod(e.shape))
                s = slice(e.offset, e.offset + n)
                assert_close(out[name][s], r[s], atol, rtol, name=f"{what}: d{e.name}")
        else:
            assert_close(out[name], r, atol, rtol, name=f"{what}: {name}")


def key_of(cell, sw, dtype, train, batch=B, **kw):
    return cpu_plan_key(cell, T, batch, I, H, L, True, sw, train=train, dtype=dtype, **kw)


# --------------------------------------------------------------------------- the key


def test_plan_key_dtype_is_validated_and_keyed():
    sw = Switches()
    k32 = PlanKey("lstm", 4, 3, 5, 6, 1, True, sw)
    assert k32.dtype == "float32" and k32.precision is PRECISIONS["float32"]
    for dtype in DTYPES:
        k = PlanKey("lstm", 4, 3, 5, 6, 1, True, sw, dtype=dtype)
        assert (k == k32) == (dtype == "float32")
        assert (hash(k) == hash(k32)) == (dtype == "float32")
    assert PlanKey("lstm", 4, 3, 5, 6, 1, True, sw, dtype=PRECISIONS["float16"]).dtype == \
        "float16"
    for bad in ("fp16", "half", None, 16, "Float32"):
        with pytest.raises(ValueError, match=r"PlanKey\.dtype: expected one of "
                                             r"\['float32', 'tf32', 'bfloat16', 'float16'\]"):
            PlanKey("lstm", 4, 3, 5, 6, 1, True, sw, dtype=bad)


def test_buffer_dtype_is_one_of_three():
    with pytest.raises(ValueError, match="dtype expected one of"):
        Buffer("x", 4, "io", "half")
    assert Buffer("x", 4, "io", "store").itemsize("bfloat16") == 2
    assert Buffer("x", 4, "io", "store").itemsize("tf32") == 4
    assert Buffer("x", 4, "io").itemsize("float16") == 4


# --------------------------------------------------------------------------- the storage rule

def sample_keys(dtypes=DTYPES):
    """A spread of keys: every cell, a third of the switch combinations (all of them over
    the cells), inference and training, the persistent backward, bias or not."""
    combos = all_combinations()
    for i, sw in enumerate(combos):
        cell = CELLS[i % 4]
        dtype = dtypes[i % len(dtypes)]
        yield key_of(cell, sw, dtype, bool(i % 2))
        if i % 3 == 0:
            yield key_of(cell, sw, dtype, not i % 2)
        if i % 5 == 0 and sw.fused:
            yield key_of(cell, sw, dtype, True, backward="persistent")
    yield cpu_plan_key("gru", T, B, I, H, L, False, Switches(fused=True), train=True,
                       dtype="bfloat16")


def test_store_buffers_are_exactly_the_gemm_operands():
    """The labels (plan/storage.py's rule, per key) against the plans' GEMMs: a buffer is
    'store' iff some GEMM (or persistent kernel's on-chip product) of the key's passes
    reads it; no GEMM writes one."""
    n = 0
    for key in sample_keys():
        fwd = forward_plan(key)
        bwd = backward_plan(key) if key.train else None
        read = set().union(*(f(p) for p in (fwd, bwd) if p is not None
                             for f in (gemm_operands, product_operands)))
        plan = bwd or fwd
        store = {b.name for b in plan.buffers if b.dtype == "store"}
        assert store == read, f"{key}: store {sorted(store)} != GEMM operands {sorted(read)}"
        assert {b.name: b.dtype for b in fwd.buffers} == \
            {b.name: b.dtype for b in plan.buffers if b.name in {f.name for f in fwd.buffers}}
        n += 1
    assert n > 60


def test_validate_refuses_a_broken_storage_rule():
    key = key_of("lstm", Switches(grouped=True, fused=True), "bfloat16", False)
    plan = forward_plan(key)
    i = next(i for i, op in enumerate(plan.ops) if isinstance(op, Gemm))
    gemm = plan.ops[i]
    # a GEMM writing a store buffer
    bad = dataclasses.replace(plan, ops=plan.ops[:i] + (dataclasses.replace(
        gemm, out=View("h0", 0, gemm.out.rows, gemm.out.cols, gemm.out.cols)),) +
        plan.ops[i + 1:])
    with pytest.raises(ValueError, match="writes the 'store' buffer 'h0'"):
        validate(bad)
    # a GEMM reading a float buffer (the fp32 master params instead of their copy)
    bad = dataclasses.replace(plan, ops=plan.ops[:i] + (dataclasses.replace(
        gemm, b=dataclasses.replace(gemm.b, buf="params")),) + plan.ops[i + 1:])
    with pytest.raises(ValueError, match="operand b 'params' is not a 'store' buffer"):
        validate(bad)
    # a store buffer no GEMM reads (the cell state: an inference plan has no act0)
    bufs = tuple(dataclasses.replace(b, dtype="store") if b.name == "c0" else b
                 for b in plan.buffers)
    with pytest.raises(ValueError, match=r"\['c0'\] are 'store' but no GEMM or persistent product reads them"):
        validate(dataclasses.replace(plan, buffers=bufs))


def _as_fp32(plan):
    """A 16-bit plan's ops as the fp32 plan would have them: without the weights' copies
    (made by its key's forward), the GEMMs reading the params where they read a copy."""
    bld_offsets = {}
    for op in forward_plan(plan.key).ops:
        if isinstance(op, Kernel) and op.kind == "copy":
            bld_offsets[op.outs[0].buf] = op.ins[0].offset
    out = []
    for op in plan.ops:
        if isinstance(op, Kernel) and op.kind == "copy":
            continue
        if isinstance(op, Gemm):
            def back(v):
                if v.buf in bld_offsets:
                    return dataclasses.replace(v, buf="params",
                                               offset=v.offset + bld_offsets[v.buf])
                return v
            op = dataclasses.replace(op, a=back(op.a), b=back(op.b))
        out.append(op)
    return out


@pytest.mark.parametrize("cell", CELLS)
def test_fp32_and_tf32_plans_are_the_same_and_16_bit_only_adds_the_copies(cell):
    """tf32's plans are fp32's op for op; a 16-bit plan is the fp32 one plus a copy of each
    weight matrix (the GEMMs reading it, the copy's events) -- except the naive GRU
    backward, which keeps dn' in fp32 (backward.py says why); the persistent rung runs its kernels' typed
    instantiations at both (same ops, no fallback)."""
    for rung in ladder(2):
        for train in (False, True):
            k32 = key_of(cell, rung.switches, "float32", train)
            plans = [forward_plan] + ([backward_plan] if train else [])
            for make in plans:
                p32 = make(k32)
                ptf = make(dataclasses.replace(k32, dtype="tf32"))
                p16 = make(dataclasses.replace(k32, dtype="bfloat16"))
                if rung.switches.persistent:   # the typed kernels run: no fallback
                    assert ptf.fallback is None and p16.fallback is None, rung.name
                assert ptf.ops == p32.ops and ptf.buffers == p32.buffers
                if cell == "gru" and make is backward_plan and not rung.switches.fused:
                    continue
                strip = [op for op in _as_fp32(p16) if isinstance(op, (Gemm, Kernel))]
                want = [op for op in p32.ops if isinstance(op, (Gemm, Kernel))]
                assert strip == want, f"{cell} {rung.name} {make.__name__}"


def test_persistent_backward_runs_16_bit_storage():
    """The persistent backward runs its typed instantiation at float16 (issue 24: the same
    math as the per-step backward's GEMMs), as at float32: no fallback."""
    key = key_of("lstm", Switches(fused=True), "float16", True, backward="persistent")
    assert backward_plan(dataclasses.replace(key, dtype="float32")).fallback is None
    plan = backward_plan(key)
    assert plan.fallback is None
    assert any(getattr(op, "kind", "") == "persistent" for op in plan.ops)


# --------------------------------------------------------------------------- the executor

@pytest.mark.parametrize("dtype", LOW + ("tf32",))
@pytest.mark.parametrize("cell", CELLS)
def test_every_rung_rounds_where_the_reference_does(cell, dtype):
    """Inference and forward + backward of every rung: the NumPy executor's 16-bit (or
    tf32: GEMM operands TF32-rounded) plan equals the rounding-aware reference to ~1e-9
    (program order, and a random interleaving of its streams), and is statically
    race-free."""
    c = case(cell, dtype, seed=3)
    for rung in ladder(2):
        for train in (False, True):
            key = key_of(cell, rung.switches, dtype, train)
            what = f"{cell} {dtype} {rung.name}{' train' if train else ''}"
            check(run_plans(key, c), c, what)
            for plan in (forward_plan(key),) + ((backward_plan(key),) if train else ()):
                races = find_races(plan)   # (a copy runs first on the stream of its GEMMs)
                assert not races, f"{what}: " + races[0].describe(plan)
            if rung.switches.streams and train:
                check(run_plans(key, c, "random", seed=7), c, what + " random")


def test_outputs_hold_stored_values():
    """y and h_n are read from the h sequence: bfloat16 values exactly; c_n (fp32) not."""
    c = case("lstm", "bfloat16")
    out = run_plans(key_of("lstm", ladder(2)[3].switches, "bfloat16", True), c)
    for name in ("y", "h_n"):
        assert np.array_equal(round_to_storage(out[name], "bfloat16"), out[name])
    assert not np.array_equal(round_to_storage(out["c_n"], "bfloat16"), out["c_n"])


def test_a_reference_without_the_gate_gradients_rounding_is_caught(monkeypatch):
    """Planted: the reference forgets to round the gate gradients dgi / dgh (its only
    [B, 4H] arrays, LSTM). The plan's gradients differ from it far beyond the tolerance,
    while its forward (and the true reference) still agree."""
    import rnnrt.reference as ref_mod
    true_round = ref_mod.round_to_storage
    key = key_of("lstm", ladder(2)[3].switches, "bfloat16", True)
    good = case("lstm", "bfloat16", seed=1)
    monkeypatch.setattr(ref_mod, "round_to_storage", lambda a, dtype: (
        a if np.shape(a) == (B, 4 * H) else true_round(a, dtype)))
    planted = case("lstm", "bfloat16", seed=1)[4]
    monkeypatch.setattr(ref_mod, "round_to_storage", true_round)
    out = run_plans(key, good)
    check(out, good, "true reference")
    for name in ("y", "h_n"):
        assert_close(out[name], planted[name], **EXACT)
    worst = max(compare(out[n], planted[n], **EXACT).max_excess for n in ("grads", "dx"))
    assert worst > 1e-4, "a reference that skips the gate gradients' rounding passed"


def test_an_executor_that_skips_one_rounding_is_caught(monkeypatch):
    """Planted: the executor does not round the layer-1 h sequence (or the layer-0 gate
    gradients): the outputs differ from the reference far beyond the tolerance."""
    true_store = numpy_exec.store_buffers
    for dropped, names in (("h1", ("y", "h_n")), ("dgx0", ("dx",))):
        def minus(plan, dropped=dropped):
            return true_store(plan) - {dropped}
        monkeypatch.setattr(numpy_exec, "store_buffers", minus)
        c = case("gru", "float16", seed=2)
        out = run_plans(key_of("gru", ladder(2)[5].switches, "float16", True), c)
        monkeypatch.setattr(numpy_exec, "store_buffers", true_store)
        worst = max(compare(out[n], c[4][n], **EXACT).max_excess for n in names)
        assert worst > 1e-6, f"an executor that does not round {dropped} passed"


@pytest.mark.parametrize("dtype", LOW)
def test_the_rounding_aware_reference_really_rounds(dtype):
    """The 16-bit reference differs from the fp32 one by about the storage precision
    (relative to the outputs' scale): more than a tenth of an ulp, less than 50 ulps."""
    ulp = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}[dtype]
    for cell in CELLS:
        r16, r32 = case(cell, dtype, seed=4)[4], case(cell, "float32", seed=4)[4]
        for name in ("y", "dx", "grads"):
            rel = np.max(np.abs(r16[name] - r32[name])) / np.max(np.abs(r32[name]))
            assert 0.1 * ulp < rel < 50 * ulp, f"{cell} {dtype} {name}: {rel:.2e} ({ulp:.1e})"
        assert np.array_equal(round_to_storage(r16["y"], dtype), r16["y"])


# --------------------------------------------------------------------------- varlen plans

@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("cell", CELLS)
def test_variable_length_plans_round_where_the_packed_reference_does(cell, dtype):
    """Variable-length plans (a bucketed pattern: frozen rows) of every rung that runs one
    (persistent falls back), both directions: the NumPy executor against rnnrt.varlen's
    rounding-aware reference, ~1e-9."""
    from rnnrt.plan.packing import bucket
    lengths = [6, 4, 4, 1]
    c = varlen_case(cell, 2, lengths, I, H, seed=5, precision=dtype)
    pattern = bucket(c["bs"])
    assert pattern != c["bs"]
    for rung in ladder(2):
        key = cpu_plan_key(cell, len(pattern), pattern[0], I, H, 2, True, rung.switches,
                           train=True, batch_sizes=tuple(pattern), capacity=16, dtype=dtype)
        for reverse in (False, True):
            out, _ = run_varlen_numpy(key, c, reverse)
            check_varlen(out, c, reverse, f"{cell} {dtype} {rung.name} reverse={reverse}",
                         **EXACT)


def test_workspace_bytes_count_16_bit_storage_at_two_bytes():
    from rnnrt import sizes
    from rnnrt.plan.backward import workspace_buffers
    for train in (False, True):
        k32 = key_of("lstm", ladder(2)[3].switches, "float32", train)
        k16 = dataclasses.replace(k32, dtype="bfloat16")
        bufs = workspace_buffers(k16)
        store = sum(b.size for b in bufs if b.dtype == "store")
        assert store > 0
        assert sizes.workspace_bytes(k16) == 4 * sum(b.size for b in bufs) - 2 * store
        assert sizes.workspace_bytes(k32) == 4 * sizes.workspace_elements(k32)
        assert sizes.check_workspace(k16, None) == sizes.workspace_bytes(k16)
    # the weights' copies are extra elements, but x, h and dg halve: a long sequence's
    # workspace shrinks
    long32 = cpu_plan_key("lstm", 100, 32, 5, 6, 2, True, ladder(2)[3].switches, train=True)
    long16 = dataclasses.replace(long32, dtype="float16")
    assert sizes.workspace_bytes(long16) < 0.9 * sizes.workspace_bytes(long32)
