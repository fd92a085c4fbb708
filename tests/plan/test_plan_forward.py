"""Forward plans on the CPU: every switch combination x cell computes the reference result in
program order and in random stream interleavings, is statically race-free, and every switch
changes the plan the way it claims; the persistent switch's kernels, fits and fallbacks.
(A plan with one wait removed must be caught: tests/exec/test_exec_numpy.py.)"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rnnrt.check import assert_close
from rnnrt.exec import numpy_exec
from rnnrt.exec.racecheck import find_races
from rnnrt.exec.workspace import Workspace
from rnnrt.kernels.limits import H100_SXM
from rnnrt.plan import PlanKey as _PlanKey, forward_plan
from rnnrt.plan.ops import Gemm, Kernel
from rnnrt.plan.switches import ALL, PAPER_RUNGS, Switches, all_combinations, ladder
from testkit import CELLS as CELL_NAMES
from testkit import PLAN_SHAPE, check_outputs, plan_case as make_case, run_numpy
from testkit import cpu_plan_key as PlanKey   # CPU plans are built for the lent H100's limits

T, B, I, H = PLAN_SHAPE


COMBOS = all_combinations()


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_every_combination_matches_reference_in_any_interleaving(cell, layers):
    flat, x, h0, c0, ref = make_case(cell, layers)
    for sw in COMBOS:
        plan = forward_plan(PlanKey(cell, T, B, I, H, layers, True, sw))
        races = find_races(plan)
        assert not races, f"{sw.label()}: " + races[0].describe(plan)
        check_outputs(run_numpy(plan, flat, x, h0, c0), ref, f"{sw.label()} program order")
        if len(plan.streams) > 1:
            for seed in range(2):
                out = run_numpy(plan, flat, x, h0, c0, order="random", seed=seed)
                check_outputs(out, ref, f"{sw.label()} random seed {seed}")


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_no_bias_and_training_plans(cell):
    flat, x, h0, c0, ref = make_case(cell, 2, bias=False, seed=3)
    for rung in ladder(input_batch=2):
        plan = forward_plan(PlanKey(cell, T, B, I, H, 2, False, rung.switches, train=True))
        assert not find_races(plan)
        check_outputs(run_numpy(plan, flat, x, h0, c0, order="random", seed=1), ref, rung.name)


def test_odd_sizes_one_step_batch_one():
    for steps, batch in ((1, 1), (1, 3), (7, 1)):
        flat, x, h0, c0, ref = make_case("lstm", 2, steps=steps, batch=batch, seed=5)
        for rung in ladder(input_batch=ALL) + ladder(input_batch=3):
            plan = forward_plan(PlanKey("lstm", steps, batch, I, H, 2, True, rung.switches))
            assert not find_races(plan)
            check_outputs(run_numpy(plan, flat, x, h0, c0, "random", 0), ref,
                          f"T{steps} B{batch} {rung.name}")


@pytest.mark.parametrize("train", [False, True])
def test_a_plan_runs_again_without_reloading_inputs(train):
    """No pass overwrites its own inputs (h0, c0, x): a replay gives the same outputs."""
    for steps in (5, 6):
        flat, x, h0, c0, ref = make_case("lstm", 2, steps=steps, seed=9)
        plan = forward_plan(PlanKey("lstm", steps, B, I, H, 2, True, ladder()[PAPER_RUNGS - 1].switches,
                                    train=train))
        ws = Workspace(plan, np, np.float64, flat)
        ws.load_inputs(x, h0, c0)
        for _ in range(2):
            numpy_exec.run(plan, ws)
            check_outputs(ws.outputs(), ref, f"T{steps} train={train} replay")


def test_float32_plan_close_to_float64_reference():
    flat, x, h0, c0, ref = make_case("gru", 2, seed=7)
    plan = forward_plan(PlanKey("gru", T, B, I, H, 2, True, ladder()[PAPER_RUNGS - 1].switches))
    out = run_numpy(plan, flat.astype(np.float32), x.astype(np.float32),
                    h0.astype(np.float32), None)
    assert_close(out["y"], ref["y"], atol=1e-5, rtol=1e-4, name="fp32 y")


# ---------------------------------------------------------------------------------------------
# Each switch is observable in the plan


def key(sw, cell="lstm", layers=4, steps=12):
    return PlanKey(cell, steps, B, I, H, layers, True, sw)


def test_streams_switch():
    for sw in COMBOS:
        plan = forward_plan(key(sw))
        used = {op.stream for op in plan.ops}
        if sw.streams:
            assert len(used) > 1, sw.label()
        else:
            assert len(plan.streams) == 1 and used == {0}, sw.label()
            assert plan.num_events == 0


def _pointwise_per_step(plan):
    n = sum(1 for op in plan.ops if isinstance(op, Kernel) and op.kind == "pointwise")
    return n / (plan.key.steps * plan.key.num_layers)


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_fused_switch_fewer_kernels_per_step(cell):
    naive = forward_plan(key(Switches(), cell))
    fused = forward_plan(key(Switches(fused=True), cell))
    assert _pointwise_per_step(fused) == 1
    assert _pointwise_per_step(naive) > 1


def test_grouped_switch_one_gemm_per_input():
    for cell, G in (("lstm", 4), ("gru", 3), ("rnn_tanh", 1)):
        for grouped in (False, True):
            plan = forward_plan(key(Switches(grouped=grouped), cell))
            c = plan.counts()
            per = 1 if grouped else G
            assert c["gemm:rh"] == per * 12 * 4
            assert c["gemm:wx"] == per * 12 * 4
            m = {op.mnk()[0] for op in plan.ops if isinstance(op, Gemm)}
            assert m == {G * H if grouped else H}


def test_wavefront_switch_overlaps_layers():
    base = Switches(grouped=True, streams=True, fused=True)
    for wf in (False, True):
        plan = forward_plan(key(dataclasses.replace(base, wavefront=wf)))
        cells = [(i, op.layer, op.steps[0]) for i, op in enumerate(plan.ops)
                 if isinstance(op, Kernel) and op.kind == "pointwise"]
        first_l1 = min(i for i, layer, t in cells if layer == 1)
        last_l0 = max(i for i, layer, t in cells if layer == 0)
        if wf:
            assert first_l1 < last_l0, "wavefront: layer 1 must start before layer 0 ends"
            assert len(plan.streams) == 2 * 4
        else:
            assert first_l1 > last_l0


@pytest.mark.parametrize("k", [1, 2, 5, ALL])
def test_input_batching_switch_gemms_cover_k_steps(k):
    steps = 12
    plan = forward_plan(key(Switches(grouped=True, input_batch=k), steps=steps))
    kk = steps if k == ALL else k
    wx = [op for op in plan.ops if isinstance(op, Gemm) and op.kind == "wx"]
    assert len(wx) == 4 * math.ceil(steps / kk)
    for op in wx:
        t0, t1 = op.steps
        assert t1 - t0 == min(kk, steps - t0)
        assert op.out.rows == (t1 - t0) * B


def test_pretranspose_switch():
    for pt in (False, True):
        plan = forward_plan(key(Switches(grouped=True, pretranspose=pt)))
        c = plan.counts()
        assert c["kernel:transpose"] == (2 * 4 if pt else 0)
        assert {op.trans_b for op in plan.ops if isinstance(op, Gemm)} == {not pt}


def test_plan_flops_cached_and_printable():
    from rnnrt.cells import forward_flops
    k = key(ladder()[PAPER_RUNGS - 1].switches)
    plan = forward_plan(k)
    assert forward_plan(k) is plan
    assert plan.gemm_flops() == forward_flops("lstm", I, H, 4, B, 12)
    text = plan.describe()
    assert "streams" in text and "gemm:rh" in text


def test_switch_rules():
    with pytest.raises(ValueError, match="wavefront=True needs streams"):
        Switches(wavefront=True)
    with pytest.raises(ValueError, match="input_batch"):
        Switches(input_batch=0)
    with pytest.raises(TypeError, match="grouped"):
        Switches(grouped=1)
    names = [r.name for r in ladder()]
    assert names[0] == "naive" and len(set(names)) == len(names)
    # cumulative: every rung keeps what the previous one turned on
    rungs = ladder()
    for prev, cur in zip(rungs, rungs[1:]):
        for f, v in prev.switches.as_dict().items():
            if v not in (False, 1):
                assert cur.switches.as_dict()[f] == v


# ---------------------------------------------------------------------------------------------
# The persistent switch


def test_persistent_grid_kernel_one_launch_per_layer():
    """The grid kernel (a device without clusters): one 'pcell' launch per layer over all T
    steps, from the device fit; its R.h FLOPs are in the plan's count; c and act keep every
    step even for inference; the barrier counters live in a uint32 'sync' buffer, two a
    layer; layer l+1's input GEMMs wait for layer l's kernel, so no two overlap."""
    base = ladder()[PAPER_RUNGS - 1].switches
    sw = dataclasses.replace(base, persistent=True)
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    plan = forward_plan(_PlanKey("lstm", 12, B, I, H, 4, True, sw, device=sm80))
    pk = [op for op in plan.ops if isinstance(op, Kernel) and op.kind == "persistent"]
    assert [op.layer for op in pk] == [0, 1, 2, 3] and all(op.steps == (0, 12) for op in pk)
    assert all(op.name == "lstm_persistent_fwd" for op in pk)
    assert plan.counts()["gemm:rh"] == 0 and plan.fallback is None and "fits" in plan.fit
    assert "overlap" not in plan.fit
    assert all(dict(op.scalars)["T"] == 12 and op.launch[0][0] >= 1 for op in pk)
    assert plan.buffer("sync").role == "sync" and plan.buffer("sync").dtype == "uint32"
    assert plan.buffer("sync").size == 8
    assert [op.outs[-1].offset for op in pk] == [0, 2, 4, 6]
    assert plan.buffer("c0").size == 13 * B * H and plan.buffer("act0").size == 12 * B * 4 * H
    from rnnrt.cells import forward_flops
    assert plan.gemm_flops() == forward_flops("lstm", I, H, 4, B, 12)
    # in issue order: every W.x of layer l+1 comes after layer l's kernel
    where = {op.layer: i for i, op in enumerate(plan.ops) if op in pk}
    for i, op in enumerate(plan.ops):
        if isinstance(op, Gemm) and op.kind == "wx" and op.layer > 0:
            assert i > where[op.layer - 1]
    flat, x, h0, c0, ref = make_case("lstm", 4, steps=12)
    check_outputs(run_numpy(plan, flat, x, h0, c0), ref, "grid kernel plan")


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_persistent_cluster_kernels_overlap_layers_in_chunks(cell):
    """The cluster kernel with the wavefront: each layer one launch per input_batch chunk
    (slot 0 of its h / c views read, the rest written), layer l+1's chunk after layer l's
    same chunk, and issued along the anti-diagonals (layer 1's first chunk before layer 0's
    last), so launches of different layers can run at once. Race-free and right in random
    interleavings; without the wavefront (or with one layer) one launch a layer."""
    base = ladder()[PAPER_RUNGS - 1].switches
    sw = dataclasses.replace(base, persistent=True)
    k = sw.steps_per_input_gemm(12)
    assert k < 12
    plan = forward_plan(key(sw, cell=cell))
    pk = [op for op in plan.ops if isinstance(op, Kernel) and op.kind == "persistent"]
    assert all(op.name.endswith("_persistent_cluster_fwd") for op in pk)
    chunks = [(t0, min(t0 + k, 12)) for t0 in range(0, 12, k)]
    assert sorted((op.layer, op.steps) for op in pk) == [(l, c) for l in range(4)
                                                         for c in chunks]
    assert f"launches of {k} steps" in plan.fit
    first1 = next(i for i, op in enumerate(plan.ops) if op in pk and op.layer == 1)
    last0 = max(i for i, op in enumerate(plan.ops) if op in pk and op.layer == 0)
    assert first1 < last0
    for op in pk:
        t0, t1 = op.steps
        h = op.outs[0]
        assert (h.offset, h.rows) == (t0 * B * H, (t1 - t0 + 1) * B)
        assert dict(op.scalars)["T"] == t1 - t0
        assert h.offset + B * H in [v.offset for v in op.writes if v.buf == h.buf]
        assert h.offset in [v.offset for v in op.reads if v.buf == h.buf]
    assert not find_races(plan)
    flat, x, h0, c0, ref = make_case(cell, 4, steps=12)
    check_outputs(run_numpy(plan, flat, x, h0, c0), ref, "chunked")
    for seed in range(3):
        check_outputs(run_numpy(plan, flat, x, h0, c0, order="random", seed=seed), ref,
                      f"chunked, seed {seed}")
    for other in (key(dataclasses.replace(sw, wavefront=False), cell=cell),
                  key(sw, cell=cell, layers=1)):
        one = [op for op in forward_plan(other).ops
               if isinstance(op, Kernel) and op.kind == "persistent"]
        assert all(op.steps == (0, 12) for op in one)


def test_chunked_cluster_layers_share_the_sms():
    """Chunked cluster plans give each layer cluster_count(B, SMs // L) clusters where that
    fits within CLUSTER_MAX_FMAS, so all layers' launches can be resident at once: LSTM H 128
    B 64 on the H100's 132 SMs: 8 clusters of 8 batches for one layer, 4 of 16 for four."""
    sw = dataclasses.replace(ladder()[PAPER_RUNGS - 1].switches, persistent=True)
    one = forward_plan(_PlanKey("lstm", 20, 64, 128, 128, 1, True, sw, device=H100_SXM))
    four = forward_plan(_PlanKey("lstm", 20, 64, 128, 128, 4, True, sw, device=H100_SXM))
    assert "8 clusters of 8 blocks (8 batches each)" in one.fit
    assert "4 clusters of 8 blocks (16 batches each)" in four.fit
    grids = {op.launch[0] for op in four.ops if isinstance(op, Kernel) and op.kind == "persistent"}
    assert grids == {(32, 1, 1)}


def test_validate_refuses_a_footprint_that_hides_a_write():
    """A persistent launch's footprint must cover exactly its views: dropping one written
    part (which would blind the race checker) is refused."""
    from rnnrt.plan import validate
    sw = dataclasses.replace(ladder()[PAPER_RUNGS - 1].switches, persistent=True)
    plan = forward_plan(key(sw))
    i, op = next((i, op) for i, op in enumerate(plan.ops)
                 if isinstance(op, Kernel) and op.kind == "persistent")
    reads, writes = op.footprint
    bad = dataclasses.replace(op, footprint=(reads, writes[1:]))
    broken = dataclasses.replace(plan, ops=plan.ops[:i] + (bad,) + plan.ops[i + 1:])
    with pytest.raises(ValueError, match=f"op {i}: .*footprint does not cover"):
        validate(broken)


def test_persistent_switch_falls_back_and_says_why():
    """A device that cannot hold the layer: the plan is the schedule without the switch (the
    same ops), and ``fallback`` names the device and the reason."""
    base = ladder()[PAPER_RUNGS - 1].switches
    sw = dataclasses.replace(base, persistent=True)
    small = dataclasses.replace(H100_SXM, name="small GPU", smem_per_block_optin=16)
    plan = forward_plan(_PlanKey("gru", T, B, I, H, 2, True, sw, device=small))
    ref_plan = forward_plan(_PlanKey("gru", T, B, I, H, 2, True, base, device=small))
    assert plan.ops == ref_plan.ops
    assert "small GPU" in plan.fallback and "shared memory" in plan.fallback
    assert "DOES NOT FIT" in plan.fit
    flat, x, h0, c0, ref = make_case("gru", 2)
    check_outputs(run_numpy(plan, flat, x, h0, c0), ref, "fallback")


def test_persistent_rules():
    with pytest.raises(ValueError, match="persistent=True needs fused=True"):
        Switches(persistent=True)
    sw = Switches(fused=True, persistent=True)
    with pytest.raises(ValueError, match="PlanKey.device"):
        _PlanKey("lstm", T, B, I, H, 1, True, sw)
    with pytest.raises(TypeError, match="PlanKey.device"):
        _PlanKey("lstm", T, B, I, H, 1, True, sw, device={"sms": 132})
    assert any(s.persistent for s in COMBOS)


def test_validate_checks_kernel_views():
    """A kernel launch whose views do not have its kernel's shapes is refused by validate."""
    from rnnrt.plan import validate
    plan = forward_plan(key(Switches(fused=True)))
    i, op = next((i, op) for i, op in enumerate(plan.ops) if isinstance(op, Kernel))
    bad_ins = (dataclasses.replace(op.ins[0], cols=op.ins[0].cols - 1),) + op.ins[1:]
    broken = dataclasses.replace(plan, ops=plan.ops[:i] + (dataclasses.replace(op, ins=bad_ins),)
                                 + plan.ops[i + 1:])
    # an inference plan: its step kernel is the one without act
    with pytest.raises(ValueError, match=f"op {i}: lstm_fwd_noact: gx is"):
        validate(broken)
