"""The chunked persistent backward (plan/backward_persistent.py where kernels/choice_backward.py
gives a launch fewer steps than T: the cluster kernel, several layers, the wavefront) on the
CPU: every cell with one and three layers, chunk lengths that divide T and that do not (a
short last chunk), gives the float64 reference gradients (dx, dh0, dc0, every weight and bias;
every io and scratch buffer poisoned) in program order and random interleavings and is
statically race-free, and in float32 within fp32 tolerance; a removed wait between a layer's
dx GEMM and the next layer's chunk launch is caught (statically and by some interleaving); the
launches of different layers are issued interleaved along the reverse wavefront and are not
ordered against each other, those of one layer are, on views of their chunk; the grid kernel
(and one layer, or no wavefront) keeps one launch a layer."""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.check import FP32_ATOL, FP32_RTOL, reduction_atol
from rnnrt.exec.racecheck import vector_clocks
from rnnrt.kernels.choice import choose_persistent_backward
from rnnrt.kernels.persistent import SYNC_WORDS
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Gemm, Kernel, Record, Wait
from rnnrt.plan.switches import Switches, ladder
from testkit import (BWD_PLAN_SHAPE, CELLS, assert_missing_wait_caught, bwd_plan_case,
                     check_bwd_key, check_bwd_plan, run_bwd_plan)
from testkit import cpu_plan_key as PlanKey

_, B, I, H = BWD_PLAN_SHAPE
# (T, k): k = 1 and 3 at T 6 divide it; k = 2 and 3 at T 5 leave a short last chunk
CHUNKS = [(5, 2), (5, 3), (6, 1), (6, 3)]


def switches(k, wavefront=True, persistent=False):
    return Switches(grouped=True, streams=True, fused=True, wavefront=wavefront,
                    persistent=persistent, input_batch=k)


def key_of(cell, layers, T, sw, backward="cluster", bias=True):
    return PlanKey(cell, T, B, I, H, layers, bias, sw, train=True, backward=backward)


def launches(plan):
    """[(op index, op)] of the plan's persistent launches, in issue order."""
    return [(i, op) for i, op in enumerate(plan.ops)
            if isinstance(op, Kernel) and op.kind == "persistent"]


def before(clocks, a, b):
    """Whether op a happens before op b in every execution (the plan's events)."""
    s, pos, _ = clocks[a]
    return clocks[b][2][s] >= pos


@pytest.mark.parametrize("T, k", CHUNKS, ids=[f"T{t}k{k}" for t, k in CHUNKS])
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_chunked_plan_gives_reference_gradients(cell, layers, T, k):
    case = bwd_plan_case(cell, layers, seed=11, shape=(T, B, I, H))
    key = key_of(cell, layers, T, switches(k))
    plan = check_bwd_key(key, case, f"{cell} L{layers} T{T} k{k}", seed=3, always_random=True)
    assert plan.fallback is None, plan.fallback
    chunked = layers > 1 and k < T
    assert choose_persistent_backward(key).chunked == chunked
    assert len(launches(plan)) == layers * (-(-T // k) if chunked else 1)
    assert (f"launches of {k} steps" in plan.fit) == chunked, plan.fit
    assert {op.name for _, op in launches(plan)} == {f"{cell}_persistent_cluster_bwd"}


@pytest.mark.parametrize("cell", CELLS)
def test_chunked_under_the_persistent_forward_and_without_dx(cell):
    """Under the +persistent rung (the forward's own chunked cluster launches, k = 2) and
    with need_dx False (no dx GEMM for layer 0) the chunked backward gives the reference."""
    layout, flat, fwd_in, bwd_in, ref = case = bwd_plan_case(cell, 3, seed=4)
    key = key_of(cell, 3, BWD_PLAN_SHAPE[0], ladder(input_batch=2)[-1].switches)
    assert check_bwd_key(key, case, "+persistent", always_random=True).fit.endswith(
        "launches of 2 steps")
    plan = backward_plan(key, need_dx=False)
    assert not any(isinstance(op, Gemm) and op.kind == "dx" and op.layer == 0
                   for op in plan.ops)
    ws = run_bwd_plan(key, flat, fwd_in, bwd_in, "random", 5, bwd=plan)
    check_bwd_plan(ws, layout, dict(ref, dx=None), "need_dx False")


@pytest.mark.parametrize("cell", CELLS)
def test_chunked_float32_within_fp32_tolerance(cell):
    """In float32 (the twins run the kernels' arithmetic) the chunked plan is within fp32
    tolerance of the float64 reference (the chunks hand dh and dc on in fp32, as the
    kernel carries them in registers)."""
    T = 6
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case(cell, 3, seed=6, shape=(T, B, I, H))
    key = key_of(cell, 3, T, switches(2))
    ws = run_bwd_plan(key, flat.astype(np.float32),
                      *[tuple(None if a is None else a.astype(np.float32) for a in arrays)
                        for arrays in (fwd_in, bwd_in)], "random", 2, dtype=np.float32)
    check_bwd_plan(ws, layout, ref, "float32", atol=reduction_atol(T * B, FP32_ATOL),
                   rtol=FP32_RTOL)


def dx_to_launch_waits(plan):
    """[index among the plan's waits] of every wait that orders a layer's dx GEMM before a
    persistent launch of the layer below (the Wait's event recorded right after the GEMM,
    the launch the next op on the waiting stream)."""
    recorded = {}   # event -> the op recorded right after
    for i, op in enumerate(plan.ops):
        if isinstance(op, Record):
            prev = [p for p in plan.ops[:i] if p.stream == op.stream and
                    not isinstance(p, (Record, Wait))]
            recorded[op.event] = prev[-1]
    out = []
    waits = [i for i, op in enumerate(plan.ops) if isinstance(op, Wait)]
    for n, i in enumerate(waits):
        w = plan.ops[i]
        after = next(op for op in plan.ops[i + 1:] if op.stream == w.stream and
                     not isinstance(op, (Record, Wait)))
        src = recorded[w.event]
        if (isinstance(src, Gemm) and src.kind == "dx" and isinstance(after, Kernel)
                and after.kind == "persistent" and after.layer == src.layer - 1
                and after.steps == src.steps):
            out.append(n)
    return out


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_removed_wait_between_dx_and_the_next_layers_chunk_is_caught(cell):
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case(cell, 3, seed=8)
    key = key_of(cell, 3, BWD_PLAN_SHAPE[0], switches(2))
    plan = backward_plan(key)
    which = dx_to_launch_waits(plan)
    assert len(which) == 2 * 3   # layers 1 and 0, three chunks each

    def run_and_check(broken, seed):
        ws = run_bwd_plan(key, flat, fwd_in, bwd_in, "random", seed, bwd=broken)
        check_bwd_plan(ws, layout, ref, f"seed {seed}")

    assert_missing_wait_caught(plan, which[0], run_and_check)


def test_the_layers_launches_interleave_along_the_reverse_wavefront():
    """Layer l-1's first launch (its last chunk) is issued before layer l's last (its first
    chunk), and nothing orders the two (they may run at once); each launch follows the
    same layer's launch of the chunk after it (one stream) and the layer above's dx GEMM
    of its own rows; its views are its chunk's (T = t1 - t0 steps, dh_n slot t1, dh0 slot
    t0, the layer's own barrier words)."""
    L, T, k = 4, 12, 3
    plan = backward_plan(key_of("lstm", L, T, switches(k)))
    ks = launches(plan)
    assert len(ks) == L * T // k
    at = {(op.layer, op.steps[0]): i for i, op in ks}
    dx = {(op.layer, op.steps[0]): i for i, op in enumerate(plan.ops)
          if isinstance(op, Gemm) and op.kind == "dx"}
    clocks = vector_clocks(plan)
    for layer in range(1, L):
        first_below, last_here = at[(layer - 1, T - k)], at[(layer, 0)]
        assert first_below < last_here, (layer, [(op.layer, op.steps) for _, op in ks])
        assert not before(clocks, first_below, last_here)
        assert not before(clocks, last_here, first_below)
    for i, op in ks:
        t0, t1 = op.steps
        assert t1 - t0 == k and dict(op.scalars)["T"] == k
        if t1 < T:
            assert before(clocks, at[(op.layer, t1)], i)
            assert plan.ops[at[(op.layer, t1)]].stream == op.stream
        if op.layer < L - 1:
            assert before(clocks, dx[(op.layer + 1, t0)], i)
        dhr = f"dhr{op.layer}"
        dh_n = next(v for v in op.ins if v.buf == dhr)
        dh0 = next(v for v in op.outs if v.buf == dhr)
        assert (dh_n.offset, dh0.offset) == (t1 * B * H, t0 * B * H)
        assert op.outs[-1].buf == "bsync" and op.outs[-1].offset == SYNC_WORDS * op.layer
    # the weight gradients of a layer after its last launch (every step's dg written)
    dw = [i for i, op in enumerate(plan.ops) if isinstance(op, Gemm) and op.kind == "dw"]
    for i in dw:
        assert before(clocks, at[(plan.ops[i].layer, 0)], i)


def test_the_grid_kernel_one_layer_and_no_wavefront_are_never_chunked():
    """The grid kernel needs every SM (two launches may never run at once): one launch a
    layer whatever the input chunk, totally ordered; likewise one layer (nothing to
    overlap) and a cluster plan without the wavefront (one recurrence stream)."""
    T, k = 12, 3
    for key in (key_of("lstm", 3, T, switches(k), backward="grid"),
                key_of("gru", 1, T, switches(k)),
                key_of("lstm", 3, T, switches(k, wavefront=False))):
        choice = choose_persistent_backward(key)
        assert choice.runs and not choice.chunked and choice.steps_per_launch == T
        plan = backward_plan(key)
        ks = launches(plan)
        assert [op.layer for _, op in ks] == list(reversed(range(key.num_layers)))
        assert all(op.steps == (0, T) for _, op in ks) and "launches of" not in plan.fit
        clocks = vector_clocks(plan)
        for (a, _), (b, _) in zip(ks, ks[1:]):
            assert before(clocks, a, b)
