"""The weight gradients in chunks and on streams of their own (PlanKey.wgrad_steps /
wgrad_streams, plan/backward.py ``wgrad_tasks``, kernels/gemm_split.py ``wgrad_chunk_steps``,
``wgrad_stream_count``) on the CPU: placements 2 and 3 (with and without chunks) likewise give
the reference gradients, their streams and the side each carries; every cell x the ladder's rungs x
chunk sizes gives the reference gradients (every buffer poisoned first) in program order and
random interleavings, statically race-free, for full and variable-length batches, with
accumulate, after the per-step, the cluster (chunked launches) and the stack backward; the
plan has one dW / dR GEMM and one bias sum a chunk, the chunks ordered one after another on a
stream of their own, each after the step (or launch) that wrote its rows; a chunk that does
not wait for the chain is caught; the chunk's rounding and bad keys."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from testkit import (BWD_PLAN_SHAPE, CELLS, assert_missing_wait_caught, bwd_plan_case,
                     check_bwd_key, check_bwd_plan, check_varlen, run_bwd_plan,
                     run_varlen_numpy, varlen_case)
from testkit import cpu_plan_key as PlanKey

from rnnrt.exec.racecheck import find_races
from rnnrt.exec.workspace import Workspace
from rnnrt.kernels.gemm_split import wgrad_chunk_steps
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Gemm, Record, Wait
from rnnrt.plan.switches import PAPER_RUNGS, ladder

T, B, I, H = BWD_PLAN_SHAPE   # T 5
PAPER = ladder(input_batch=2)[PAPER_RUNGS - 1].switches


def wgrad_gemms(plan, layer, kind="dw"):
    return [op for op in plan.ops if isinstance(op, Gemm) and op.kind == kind
            and op.layer == layer]


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_chunked_weight_gradients_give_reference_gradients(cell, layers):
    case = bwd_plan_case(cell, layers, seed=5)
    for rung in ladder(input_batch=2):
        for k in (1, 2, 3):
            key = PlanKey(cell, T, B, I, H, layers, True, rung.switches, train=True,
                          wgrad_steps=k)
            plan = check_bwd_key(key, case, f"{rung.name} wgrad {k}", seed=k,
                                 always_random=True)
            chunks = -(-T // k)
            for layer in range(layers):
                # dW + dR (one block: a full batch every step) a chunk
                assert len(wgrad_gemms(plan, layer)) == 2 * chunks
                assert len(wgrad_gemms(plan, layer, "db")) == 2 * chunks
                steps = sorted(op.steps for op in wgrad_gemms(plan, layer)[::2])
                assert steps[0][0] == 0 and steps[-1][1] == T
                assert all(a[1] == b[0] for a, b in zip(steps, steps[1:])), steps


def test_one_chunk_is_todays_plan():
    """wgrad_steps >= T (and the rule, which keeps one chunk): the same ops and streams as
    the plan without chunks (the input streams carry the weight gradients)."""
    base = backward_plan(PlanKey("lstm", T, B, I, H, 2, True, PAPER, train=True))
    for k in (T, T + 3):
        plan = backward_plan(PlanKey("lstm", T, B, I, H, 2, True, PAPER, train=True,
                                     wgrad_steps=k))
        assert plan.ops == base.ops and plan.streams == base.streams


def test_chunks_run_in_one_order_on_their_own_stream():
    """Each chunk after the step that wrote its first row's dg (the chain writes T-1 .. 0)
    and after the chunk of later steps; first chunk beta 0 (accumulate: 1), then 1; the
    chunks' streams are wg{l}, lowest priority, and no dx GEMM shares them."""
    key = PlanKey("gru", T, B, I, H, 2, True, PAPER, train=True, wgrad_steps=2)
    plan = backward_plan(key)
    assert plan.streams[-2:] == ("wg0", "wg1") and plan.stream_priority[-2:] == (0, 0)
    wg = {plan.streams.index(f"wg{layer}") for layer in range(2)}
    kinds = {op.kind for op in plan.ops if isinstance(op, Gemm) and op.stream in wg}
    assert kinds == {"dw", "db"}, kinds
    for layer in range(2):
        gemms = wgrad_gemms(plan, layer) + wgrad_gemms(plan, layer, "db")
        firsts = [op for op in gemms if op.steps == (4, 5)]
        assert {op.beta for op in firsts} == {0.0}
        assert {op.beta for op in gemms if op.steps != (4, 5)} == {1.0}
        order = [op.steps for op in wgrad_gemms(plan, layer)[::2]]
        assert order == [(4, 5), (2, 4), (0, 2)], order   # program order on one stream
    acc = backward_plan(key, accumulate=True)
    assert {op.beta for op in acc.ops if isinstance(op, Gemm) and op.kind in ("dw", "db")} \
        == {1.0}


def test_a_chunk_starts_before_the_chain_ends():
    """The point of chunks: layer 0's first chunk, steps [4, 5), waits for an event recorded
    right after step 4's pointwise and dh GEMM (the chain's first step), not after step 0's."""
    key = PlanKey("lstm", T, B, I, H, 1, True, PAPER, train=True, wgrad_steps=2)
    plan = backward_plan(key)
    wg = plan.streams.index("wg0")
    first = next(i for i, op in enumerate(plan.ops) if isinstance(op, Gemm)
                 and op.stream == wg)
    waits = [op for op in plan.ops[:first] if isinstance(op, Wait) and op.stream == wg]
    assert len(waits) == 1
    rec = next(i for i, op in enumerate(plan.ops) if isinstance(op, Record)
               and op.event == waits[0].event)
    before = [op for op in plan.ops[:rec] if isinstance(op, Gemm) and op.kind == "dh"]
    assert before[-1].steps == (4, 5), before[-1].steps
    later_dh = [op for op in plan.ops[rec:] if isinstance(op, Gemm) and op.kind == "dh"]
    assert later_dh, "the chain's earlier steps run after the first chunk is released"


@pytest.mark.parametrize("which", [0, 1])
def test_a_chunk_that_does_not_wait_for_the_chain_is_caught(which):
    """Remove a chunk's wait for the chain (or for its layer's dg): the race checker
    reports it and a random interleaving gives wrong gradients."""
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("lstm", 1, seed=4)
    key = PlanKey("lstm", T, B, I, H, 1, True, PAPER, train=True, wgrad_steps=2)
    plan = backward_plan(key)
    wg = plan.streams.index("wg0")
    waits = [i for i, op in enumerate(plan.ops) if isinstance(op, Wait) and op.stream == wg]
    all_waits = [i for i, op in enumerate(plan.ops) if isinstance(op, Wait)]

    def run_and_check(broken, seed):
        check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in, "random", seed, bwd=broken),
                       layout, ref, "broken")

    assert_missing_wait_caught(plan, all_waits.index(waits[which]), run_and_check, seeds=40)


@pytest.mark.parametrize("cell", CELLS)
def test_accumulate_with_chunks(cell):
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case(cell, 2, seed=3)
    key = PlanKey(cell, T, B, I, H, 2, True, PAPER, train=True, wgrad_steps=2)
    ws = Workspace(backward_plan(key, True), np, np.float64, flat)   # grads start at zero
    run_bwd_plan(key, flat, fwd_in, bwd_in, "random", 1, accumulate=True, ws=ws)
    run_bwd_plan(key, flat, fwd_in, bwd_in, "random", 2, accumulate=True, ws=ws)
    check_bwd_plan(ws, layout, ref, "accumulated twice", scale=2.0)


@pytest.mark.parametrize("cell", CELLS)
def test_variable_length_with_chunks(cell):
    """A pattern's runs of one batch cut by the chunks (and a chunk starting on a step whose
    slot before holds more rows): dR per block within each chunk."""
    lengths = [7, 5, 5, 2, 1]
    case = varlen_case(cell, 2, lengths, 4, 6, seed=13)
    for k in (2, 3):
        key = PlanKey(cell, 7, 5, 4, 6, 2, True, PAPER, train=True, batch_sizes=case["bs"],
                      capacity=9, wgrad_steps=k)
        assert not find_races(backward_plan(key))
        for reverse in (False, True):
            out, _ = run_varlen_numpy(key, case, reverse, order="random", seed=k)
            check_varlen(out, case, reverse, f"wgrad {k} varlen reverse={reverse}")


@pytest.mark.parametrize("cell", CELLS)
def test_after_the_cluster_backward_in_launches(cell):
    """The cluster backward runs a layer in launches of k = 2 steps (3 layers, the
    wavefront): chunks of 1 step round up to 2, 3 to 4, each after the launch starting at
    its first step."""
    case = bwd_plan_case(cell, 3, seed=9)
    for want, k in ((1, 2), (3, 4)):
        key = PlanKey(cell, T, B, I, H, 3, True, PAPER, train=True, backward="cluster",
                      wgrad_steps=want)
        plan = check_bwd_key(key, case, f"cluster wgrad {want}", seed=want, always_random=True)
        assert plan.fallback is None, plan.fallback
        steps = [op.steps for op in wgrad_gemms(plan, 0)[::2]]
        assert all(s[0] % 2 == 0 for s in steps), steps
        assert len(steps) == -(-T // k), steps


@pytest.mark.parametrize("cell", CELLS)
def test_one_layer_cluster_backward_in_launches_of_the_chunk(cell):
    """One layer: the cluster backward runs in launches of the weight gradients' chunk where
    wgrad_steps asks for chunks (each chunk's dx and weight GEMMs then beside the rest of the
    chain), one launch without: the reference gradients, race-free, the launches and the
    weight chunks on the same steps."""
    case = bwd_plan_case(cell, 1, seed=4)
    for k in (2, None):
        key = PlanKey(cell, T, B, I, H, 1, True, PAPER, train=True, backward="cluster",
                      wgrad_steps=k)
        plan = check_bwd_key(key, case, f"L1 cluster wgrad {k}", seed=3, always_random=True)
        assert plan.fallback is None, plan.fallback
        launches = sorted(op.steps for op in plan.ops if getattr(op, "kind", "") ==
                          "persistent")
        chunks = sorted(op.steps for op in wgrad_gemms(plan, 0)[::2])
        want = [(0, T)] if k is None else [(t, min(t + k, T)) for t in range(0, T, k)]
        assert launches == want and chunks == want, (launches, chunks)


def test_after_the_stack_backward_one_chunk():
    """The stack backward writes every dg in one launch: the weight gradients stay one
    chunk whatever wgrad_steps says (nothing to overlap), and the plan still gives the
    reference gradients."""
    from rnnrt.kernels.limits import H100_SXM
    from rnnrt.plan import PlanKey as DevicePlanKey
    hs = 64   # the stack kernels: input size = hidden; a device without clusters (grid fit)
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    key = DevicePlanKey("lstm", T, 6, hs, hs, 2, True, ladder(input_batch=2)[-1].switches,
                        train=True, device=sm80, backward="stack", family="stack",
                        wgrad_steps=1)
    case = bwd_plan_case("lstm", 2, seed=2, shape=(T, 6, hs, hs))
    plan = check_bwd_key(key, case, "stack wgrad 1")
    assert plan.fallback is None, plan.fallback
    assert len(wgrad_gemms(plan, 0)) == 2
    assert not any(name.startswith("wg") for name in plan.streams)


def test_chunk_steps_rounding():
    key = PlanKey("lstm", 10, B, I, H, 1, True, PAPER, train=True, wgrad_steps=3)
    assert wgrad_chunk_steps(key) == 3
    assert wgrad_chunk_steps(key, 2) == 4          # rounded up to the launches' k
    assert wgrad_chunk_steps(key, 10) == 10        # one launch: one chunk
    assert wgrad_chunk_steps(dataclasses.replace(key, wgrad_steps=50)) == 10   # capped at T
    assert wgrad_chunk_steps(dataclasses.replace(key, wgrad_steps=None)) == 10  # the rule


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_bad_wgrad_steps_refused(bad):
    with pytest.raises(ValueError, match="PlanKey.wgrad_steps"):
        PlanKey("lstm", T, B, I, H, 1, True, PAPER, train=True, wgrad_steps=bad)


def test_wgrad_steps_needs_a_training_key():
    with pytest.raises(ValueError, match="PlanKey.wgrad_steps.*train"):
        PlanKey("lstm", T, B, I, H, 1, True, PAPER, wgrad_steps=2)


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_weight_gradients_on_their_own_streams(cell, layers):
    """wgrad_streams 2 (one stream a layer) and 3 (W side and R side apart), alone and with
    chunks, after the per-step backward of every rung and the cluster backward."""
    case = bwd_plan_case(cell, layers, seed=6)
    keys = [(f"{r.name} streams {n} wgrad {k}",
             PlanKey(cell, T, B, I, H, layers, True, r.switches, train=True, wgrad_streams=n,
                     wgrad_steps=k))
            for r in ladder(input_batch=2) for n in (2, 3) for k in (None, 2)]
    keys.append(("cluster streams 3", PlanKey(cell, T, B, I, H, layers, True, PAPER,
                                              train=True, backward="cluster",
                                              wgrad_streams=3)))
    for i, (what, key) in enumerate(keys):
        plan = check_bwd_key(key, case, what, seed=i, always_random=True)
        if not key.switches.streams:
            assert plan.streams == ("main",), plan.streams
            continue
        n = key.wgrad_streams
        own = [name for name in plan.streams if name[:2] in ("wg", "wh")]
        assert len(own) == (layers if key.switches.wavefront else 1) * (n - 1), (what, own)
        for layer in range(layers):
            streams = {plan.streams[op.stream][:2]
                       for op in wgrad_gemms(plan, layer) + wgrad_gemms(plan, layer, "db")}
            assert streams == ({"wg"} if n == 2 else {"wg", "wh"}), (what, streams)
            if n == 3:   # dW with bias_ih, dR with bias_hh
                for op in wgrad_gemms(plan, layer):
                    side = "wg" if op.b.buf in ("x", f"h{layer - 1}") else "wh"
                    assert plan.streams[op.stream][:2] == side, (what, op)


def test_the_r_side_that_does_not_wait_for_the_chain_is_caught():
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case("gru", 1, seed=8)
    key = PlanKey("gru", T, B, I, H, 1, True, PAPER, train=True, wgrad_streams=3)
    plan = backward_plan(key)
    wh = plan.streams.index("wh0")
    all_waits = [i for i, op in enumerate(plan.ops) if isinstance(op, Wait)]
    mine = [i for i in all_waits if plan.ops[i].stream == wh]
    assert len(mine) == 1

    def run_and_check(broken, seed):
        check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in, "random", seed, bwd=broken),
                       layout, ref, "broken")

    assert_missing_wait_caught(plan, all_waits.index(mine[0]), run_and_check, seeds=40)


@pytest.mark.parametrize("bad", [0, 4, 1.0, True, "2"])
def test_bad_wgrad_streams_refused(bad):
    with pytest.raises(ValueError, match="PlanKey.wgrad_streams"):
        PlanKey("lstm", T, B, I, H, 1, True, PAPER, train=True, wgrad_streams=bad)


def test_the_placement_rule():
    """One layer: the W and R sides on two streams of their own; several: the input
    stream; an explicit placement wins; without the streams switch, one stream."""
    from rnnrt.kernels.gemm_split import wgrad_stream_count
    one = PlanKey("lstm", T, B, I, H, 1, True, PAPER, train=True)
    four = dataclasses.replace(one, num_layers=4)
    assert wgrad_stream_count(one) == 3 and wgrad_stream_count(four) == 1
    assert wgrad_stream_count(dataclasses.replace(one, wgrad_streams=1)) == 1
    assert backward_plan(one).streams == ("rec0", "inp0", "wg0", "wh0")
    assert len(backward_plan(four).streams) == 8
    flat = dataclasses.replace(one, switches=ladder(input_batch=2)[0].switches)   # naive
    assert backward_plan(flat).streams == ("main",)
