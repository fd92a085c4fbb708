"""The block-persistent ("solo") kernels' host side (rnnrt/kernels/solo.py) and source
(cuda_src/persistent_solo.cu), without a GPU: the fit's decisions and reasons (LSTM H 128
declined: R alone past a block's shared memory; typed keys; hidden past 128); the lane map
(every cell written by one lane); the 8-lane reduce-scatter, simulated lane by lane as the
kernel's shuffles run, leaves each cell lane its batch's gate sums, summed in the tree
``lane_tree`` says; the emulation equals the float64 reference for every cell (outputs
poisoned); the plan with family 'solo' through the NumPy executor, forward and forward +
backward, L1 and L3; the constants are the .cu's; nvcc compiles it for sm_90a with no spills;
the selector's wiring (named, declined with the reason, timed, paired with the persistent
backward).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from testkit import (nvcc_usage, CELLS, H100, bwd_plan_case, ceil, check_bwd_key, check_outputs,
                     cpu_plan_key, layer_case, plan_case, run_numpy)

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels import solo as SO
from rnnrt.kernels import sources as S
from rnnrt.kernels.budget import DeviceBudget
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.registry import KERNELS
from rnnrt.plan import forward_plan
from rnnrt.plan.backward import backward_plan

SRC = S.source("persistent_solo.cu")
H90 = dict(H100, major=9, maxThreadsPerBlock=1024, maxThreadsPerMultiProcessor=2048,
           regsPerMultiprocessor=65536, regsPerBlock=65536)


# --- the fit ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cell, H, upt", [("gru", 128, 1), ("rnn_tanh", 128, 1),
                                          ("rnn_relu", 64, 1), ("lstm", 112, 1), ("lstm", 64, 1),
                                          ("gru", 37, 1), ("gru", 128, 2), ("rnn_tanh", 128, 2),
                                          ("rnn_relu", 64, 2), ("gru", 38, 2)])
@pytest.mark.parametrize("B", [1, 8, 128, 256])
def test_the_fit_takes_one_wave_of_independent_blocks(cell, H, B, upt):
    f = SO.solo_fit(cell, H, B, H90, upt=upt)
    assert f.ok, f.reason
    assert f.upt == upt and f.kernel in KERNELS
    assert f.kernel == f"{cell}_persistent_solo{'_rr' if upt == 2 else ''}_fwd"
    assert f.threads == 32 * ceil(8 * H // upt, 32) and f.units_per_block == H
    assert f.cluster == 0 and f.batch_per_block == ceil(B, f.blocks) <= SO.batch_max(cell, upt)
    assert (f.blocks - 1) * f.batch_per_block < B            # no empty block
    regs = SO.NVCC_REGS_RR[cell] if upt == 2 else SO.NVCC_REGS[cell]
    per_sm = SO.blocks_per_sm(f, DeviceBudget(H90, regs, 1024, (f.threads,)), H90)
    if B <= 132 * per_sm * SO.batch_max(cell, upt):
        assert f.blocks <= 132 * per_sm, f.describe()       # one wave
    kt = 4 * ceil(H, 4)
    G = f.gates
    BB = 1 << (f.batch_per_block - 1).bit_length()
    # R, the two h buffers, the gate sums [BB][G*H]
    assert f.smem_bytes == 4 * (G * H * kt + 2 * BB * kt + BB * G * H)
    assert f.scalars(7) == {"T": 7, "units_per_block": H, "k_tile": kt}
    assert f.barrier_arrivals(100) == 0 and "independent blocks" in f.reason
    assert "block-persistent" in f.describe()


@pytest.mark.parametrize("cell, H", [("gru", 128), ("rnn_tanh", 64), ("lstm", 64), ("gru", 37)])
def test_the_default_is_two_units_a_thread_where_the_cell_has_that_kernel(cell, H):
    f = SO.solo_fit(cell, H, 64, H90)
    two = cell != "lstm" and H % 2 == 0
    assert f.ok and f.upt == (2 if two else 1), f.describe()
    assert ("2 units a thread" in f.describe()) == two


@pytest.mark.parametrize("B, upt", [(256, 2), (264, 2), (265, 1), (512, 1)])
def test_the_default_keeps_the_one_unit_kernel_where_two_units_need_more_waves(B, upt):
    """At most 2 batches a block for the _rr kernel, 4 for the one-unit one: past 2 x 132
    batches the _rr kernel would run a second wave of blocks, which no run has timed."""
    f = SO.solo_fit("gru", 128, B, H90)
    assert f.ok and f.upt == upt, f.describe()
    assert SO.wave_count(f, H90) == 1, f.describe()
    assert SO.wave_count(SO.solo_fit("gru", 128, B, H90, upt=2), H90) == (1 if upt == 2 else 2)


def test_the_fit_says_why_it_declines():
    f = SO.solo_fit("lstm", 64, 8, H90, upt=2)
    assert not f.ok and "no two-unit (_rr) kernel for lstm" in f.reason, f.reason
    f = SO.solo_fit("gru", 37, 8, H90, upt=2)
    assert not f.ok and "hidden 37 is odd" in f.reason, f.reason
    f = SO.solo_geometry("gru", 64, 12, 4, upt=2)           # 3 batches a block > 2
    assert not f.ok and "3 batches a block > 2" in f.reason
    f = SO.solo_fit("lstm", 128, 8, H90)
    assert not f.ok and "R alone is 4 x 128 x 128 floats = 262144 bytes" in f.reason, f.reason
    assert "hidden 129 > 128" in SO.solo_fit("gru", 129, 8, H90).reason
    f = SO.solo_geometry("lstm", 64, 8, 4)                  # 2 batches a block > 1
    assert not f.ok and "2 batches a block > 1" in f.reason
    f = SO.solo_geometry("gru", 64, 9, 8)                   # 8 blocks of 2: the last empty
    assert not f.ok and "last empty" in f.reason
    small = dict(H90, maxThreadsPerBlock=512)
    assert "1024 threads" in SO.solo_fit("gru", 128, 8, small, upt=1).reason
    assert SO.solo_fit("gru", 128, 8, small).upt == 2        # 512 threads: the _rr kernel
    assert "registers" in SO.solo_fit("gru", 128, 8, dict(H90, regsPerMultiprocessor=32768,
                                                           regsPerBlock=32768)).reason
    with pytest.raises(ValueError, match="batch must be a positive int"):
        SO.solo_geometry("gru", 64, 0)


def test_past_one_wave_more_blocks_not_more_batches():
    f = SO.solo_fit("lstm", 112, 512, H90)                  # 1 a block at most: 512 blocks
    assert f.ok and f.blocks == 512 and f.batch_per_block == 1 and "4 waves" in f.reason
    f = SO.solo_fit("gru", 128, 256, H90)
    assert f.ok and f.blocks == 128 and f.batch_per_block == 2 and "1 wave" in f.reason


# --- the lane map and the reduce-scatter ------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, blocks", [(128, 8, 4), (37, 19, 10), (20, 3, 2), (64, 7, 4),
                                          (16, 5, 5)])
def test_every_cell_has_exactly_one_lane(cell, H, B, blocks):
    if cell == "lstm":
        blocks = B   # one batch a block (SO_BB_MAX_LSTM)
    f = SO.solo_geometry(cell, H, B, blocks)
    assert f.ok, f.reason
    count = np.zeros((B, H), int)
    for x in range(f.blocks):
        tid, b, j = SO.lane_cells(f, x)
        assert (tid < f.threads).all() and len(set(tid.tolist())) == len(tid)
        # thread bb*H + j updates cell (bb, j): the cell updates fill whole warps
        bb = b - f.batches(x).start
        assert (tid == bb * H + j).all() and tid.max() < len(f.batches(x)) * H
        np.add.at(count, (b, j), 1)
    assert (count == 1).all()


@pytest.mark.parametrize("H, B", [(128, 1), (128, 2), (64, 2), (38, 1), (20, 2)])
def test_rr_sums_every_units_gates_of_every_batch_once(H, B):
    """The _rr kernels' sum lanes (the kernel's index arithmetic, as written in solo_fwd: lane
    s of thread 8j + s ends with 'batch' cv = s >> (3 - log2(UPT*BB)) of the reduce, unit
    cu = cv / BB's (j + cu*H/2), batch cv % BB): each (batch, unit) written exactly once,
    by a live unit."""
    BB = 1 << (B - 1).bit_length()
    nv = 2 * BB
    lb = nv.bit_length() - 1
    count = np.zeros((B, H), int)
    for tid in range(SO.threads_for(H, 2)):
        s, j = tid % 8, tid // 8
        cv = s >> (3 - lb)
        cu, cbb = divmod(cv, BB)
        if j < H // 2 and s % (8 >> lb) == 0 and cbb < B:
            count[cbb, j + cu * (H // 2)] += 1
    assert (count == 1).all(), count


def _reduce(vals, G):
    """The kernel's so_reduce, lane by lane over one warp: vals [32 lanes, NB*G] -> [32, G]."""
    v = np.array(vals, np.float32)
    nb, mask = v.shape[1] // G, 4
    lanes = np.arange(32)
    while mask >= 1:
        if nb == 1:
            v = v[:, :G] + v[lanes ^ mask, :G]
        else:
            half = nb // 2 * G
            up = (lanes & mask) != 0
            send = np.where(up[:, None], v[:, :half], v[:, half:2 * half])
            keep = np.where(up[:, None], v[:, half:2 * half], v[:, :half])
            v = keep + send[lanes ^ mask]
            nb //= 2
        mask //= 2
    return v[:, :G]


@pytest.mark.parametrize("G", [1, 3, 4])
@pytest.mark.parametrize("NB", [1, 2, 4])
def test_the_reduce_leaves_each_cell_lane_its_batch_summed_in_the_emulated_tree(G, NB):
    """Lane s of each unit ends with batch s >> (3 - log2 NB)'s G sums over the unit's 8
    lanes, bit-equal to lane_tree's tree (on data where the order of the sum shows)."""
    rng = np.random.default_rng(G * 10 + NB)
    vals = (rng.standard_normal((32, NB * G))
            * 10.0 ** rng.integers(-4, 5, (32, NB * G))).astype(np.float32)
    got = _reduce(vals, G)
    shift = 3 - (NB.bit_length() - 1)
    for lane in range(32):
        u, s = divmod(lane, 8)
        p = vals[8 * u:8 * u + 8].reshape(8, NB, G)[:, s >> shift, :].T   # [G, 8 lanes]
        for half in (4, 2, 1):
            p = p[:, :half] + p[:, half:2 * half]
        np.testing.assert_array_equal(got[lane], p[:, 0])


def test_lane_tree_is_each_lanes_fma_chain_summed_by_the_reduce():
    rng = np.random.default_rng(3)
    rs = rng.standard_normal((3, 5, 37)).astype(np.float32)
    ht = rng.standard_normal((4, 37)).astype(np.float32)
    gh = SO.lane_tree(rs, ht)
    r = np.zeros((3, 5, 128), np.float32)
    r[:, :, :37] = rs
    h = np.zeros((4, 128), np.float32)
    h[:, :37] = ht
    for q, j, b in ((0, 0, 0), (2, 4, 3), (1, 2, 1)):
        lanes = np.zeros(8, np.float32)
        for s in range(8):
            acc = np.float32(0)
            for i in range(4):
                for e in range(4):
                    k = 4 * (s + 8 * i) + e
                    acc = np.float32(np.float64(acc) + np.float64(r[q, j, k]) * h[b, k])
            lanes[s] = acc
        vals = np.zeros((32, 1), np.float32)
        vals[:8, 0] = lanes
        assert gh[q, j, b] == _reduce(vals, 1)[0, 0]
    assert_close(gh, np.einsum("qjk,bk->qjb", rs.astype(np.float64), ht), 1e-5, 1e-5,
                 name="lane_tree vs the product")


# --- the emulation ----------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, blocks", [(64, 8, 4), (37, 7, 4), (128, 3, 3), (20, 1, 1)])
def test_emulation_equals_the_reference(cell, H, B, blocks, bias):
    if cell == "lstm":
        blocks = B   # one batch a block (SO_BB_MAX_LSTM)
    f = SO.solo_geometry(cell, H, B, blocks)
    assert f.ok, f.reason
    data, ref = layer_case(cell, 4, B, H, bias=bias, dtype=np.float32)
    h, c, act = SO.emulate_solo(cell, f, **data)   # emulate starts from NaN-poisoned outputs
    worst = 0.0
    for name, got in (("h", h), ("c", c), ("act", act)):
        if ref[name] is None or got is None:
            assert (got is None) == (ref[name] is None or name == "act" and cell.startswith("rnn"))
            continue
        assert np.isfinite(got).all(), f"{cell} {name}: an element never written"
        assert_close(got, ref[name], FP32_ATOL, FP32_RTOL, name=f"{cell} {name}")
        worst = max(worst, float(np.abs(got - ref[name]).max()))
    assert worst > 0, worst   # fp32, not float64: the twin's rounding shows


def test_emulation_catches_a_cell_written_twice():
    f = SO.solo_geometry("gru", 20, 3, 1)
    data, _ = layer_case("gru", 2, 3, 20, dtype=np.float32)
    real = SO.lane_cells

    def twice(fit, block):
        tid, b, j = real(fit, block)
        return np.r_[tid, tid[:1]], np.r_[b, b[:1]], np.r_[j, j[:1]]

    with pytest.raises(AssertionError, match="written 2 times"):
        SO.emulate("gru", f, **data, products=SO.lane_tree, owners=twice)


def test_a_wrong_tree_is_caught():
    """A twin summing the 8 lanes in another order (straight left to right) differs from
    lane_tree: the bit-equality checks above can fail."""
    rng = np.random.default_rng(5)
    rs = (rng.standard_normal((1, 4, 128)) * 10.0 ** rng.integers(-3, 4, (1, 4, 128))) \
        .astype(np.float32)
    ht = rng.standard_normal((3, 128)).astype(np.float32)
    straight = (rs.astype(np.float32)[:, :, None, :] * ht[None, None]).sum(-1, dtype=np.float32)
    assert not np.array_equal(SO.lane_tree(rs, ht), straight)


# --- the plan ---------------------------------------------------------------------------------

def _key(cell, layers, train=False, steps=5, batch=3, backward=None):
    sched = C.persistent_schedule("solo")
    return cpu_plan_key(cell, steps, batch, 4, 6, layers, True, sched.switches, train=train,
                        family="solo", backward=backward)


def persistent_kernels(plan):
    return [op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"]


def solo_kernel(cell):
    """The kernel the default fit runs at _key's hidden 6: the _rr form where the cell has one."""
    return f"{cell}_persistent_solo{'_rr' if cell in SO.RR_CELLS else ''}_fwd"


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("layers", [1, 3])
def test_the_plan_runs_the_solo_kernel_and_equals_the_reference(cell, layers):
    key = _key(cell, layers)
    plan = forward_plan(key)
    assert plan.fallback is None, plan.fallback
    ops = persistent_kernels(plan)
    assert ops == [solo_kernel(cell)] * layers                # one launch a layer, all T
    assert "block-persistent" in plan.fit and "layers overlap" not in plan.fit
    flat, x, h0, c0, ref = plan_case(cell, layers)
    check_outputs(run_numpy(plan, flat, x, h0, c0), ref, f"{cell} L{layers} solo")


@pytest.mark.parametrize("cell", CELLS)
def test_training_plans_pair_solo_with_the_persistent_backward(cell):
    key = _key(cell, 2, train=True, backward="persistent")
    assert persistent_kernels(forward_plan(key)) == [solo_kernel(cell)] * 2
    bwd = backward_plan(key)
    assert bwd.fallback is None and persistent_kernels(bwd), bwd.fallback
    check_bwd_key(key, bwd_plan_case(cell, 2), f"{cell} solo + pbwd")


def test_typed_keys_run_and_large_hidden_falls_back_with_the_reason():
    import dataclasses
    for dtype in ("tf32", "bfloat16", "float16"):   # the typed instantiations (0.20.0)
        key = dataclasses.replace(_key("gru", 1), dtype=dtype)
        ch = C.choose_persistent(key)
        assert ch.runs and ch.family == "solo" and ch.fallback is None, ch.describe()
    big = cpu_plan_key("lstm", 5, 8, 128, 128, 1, True, C.persistent_schedule("solo").switches,
                       family="solo")
    plan = forward_plan(big)
    assert plan.fallback and "R alone is 4 x 128 x 128" in plan.fallback
    assert not persistent_kernels(plan)


def test_never_chunked_even_with_the_wavefront():
    key = cpu_plan_key("gru", 40, 128, 128, 128, 4, True, C.persistent_schedule("solo").switches,
                       family="solo")
    assert key.switches.wavefront and key.switches.steps_per_input_gemm(40) < 40
    ch = C.choose_persistent(key)
    assert ch.family == "solo" and not ch.chunked and ch.steps_per_launch == 40


# --- the selector -----------------------------------------------------------------------------

def test_the_selector_times_solo_first_and_takes_it_when_fastest():
    shape = SEL.Shape("gru", 4, 128, 128, 128, 100)
    assert "solo" in C.fitting_families(shape, H100_SXM)
    names = [s.name for s in C.candidates(shape, H100_SXM)]
    assert names[0] == "solo", names
    ms = {"solo": 0.2, "cluster": 0.3}
    sel = SEL.Selector(lambda s, sh, n: [ms.get(s.name, 1.0)] * n, H100_SXM, autotune=True,
                     clock=lambda: 0.0)
    got = sel.select(shape)
    assert got.schedule.name == "solo" and got.schedule.family == "solo"
    train = SEL.Shape("gru", 1, 128, 128, 8, 100, train=True)
    tnames = [s.name for s in C.candidates(train, H100_SXM)]
    assert "solo+pbwd" in tnames and "solo" in tnames
    assert "solo" not in C.fitting_families(SEL.Shape("lstm", 1, 128, 128, 8, 100), H100_SXM)
    assert "solo" in C.fitting_families(SEL.Shape("gru", 1, 128, 128, 8, 100,
                                                dtype="bfloat16"), H100_SXM)   # typed


# --- the source -------------------------------------------------------------------------------

def test_constants_match_the_kernel():
    define = lambda n: int(re.search(rf"#define {n} (\d+)", SRC)[1])   # noqa: E731
    for name in ("SO_KS", "SO_NCH", "SO_MAX_H", "SO_BB_MAX", "SO_BB_MAX_LSTM",
                 "SO_MAX_THREADS", "SO_BB_MAX_RR", "SO_RR_THREADS", "SO_RR_CHUNKS",
                 "SO_RR_CHUNKS_BB2"):
        assert define(name) == getattr(SO, name), name
    assert SO.SO_KS * SO.SO_NCH * 4 == SO.SO_MAX_H
    assert SO.SO_RR_CHUNKS <= SO.SO_NCH and SO.SO_RR_CHUNKS_BB2 <= SO.SO_NCH
    # every entry point twice: the fp32 kernel and its typed instantiation
    assert SRC.count("__launch_bounds__(SO_MAX_THREADS, 1)") == 2 * 4
    assert SRC.count("__launch_bounds__(SO_RR_THREADS, 1)") == 2 * len(SO.RR_CELLS)
    own = (S.cuda_src_dir() / "persistent_solo.cu").read_text()   # without its includes
    assert "__cluster_dims__" not in own and "grid_barrier(" not in own
    assert "const int cv = s >> (3 - LB);" in SRC                        # lane_cells
    assert "const int cu = cv / BB, cbb = cv - cu * BB;" in SRC          # ..._rr_sums
    assert "const int BG = (Bfull + (int)gridDim.x - 1) / (int)gridDim.x;" in SRC


def test_nvcc_compiles_without_spills_within_the_fit_registers(tmp_path):
    usage, functions = nvcc_usage(SRC, tmp_path, functions=True)
    assert {u[0] for u in usage} == ({f"{c}_persistent_solo_fwd" for c in CELLS}
                                     | {f"{c}_persistent_solo_rr_fwd" for c in SO.RR_CELLS}), usage
    for name, stack, st, ld, regs in usage:
        cell = name.split("_persistent")[0]
        assert (stack, st, ld) == ("0", "0", "0"), (name, stack, st, ld)
        assert int(regs) <= (SO.NVCC_REGS_RR if "_rr_" in name else SO.NVCC_REGS)[cell], \
            (name, regs)
    # the _rr bodies are functions of their own (2 batch counts x the RR cells): none spills
    called = [f for f in functions if "solo_fwd_rr" in f[0]]
    assert len(called) == 2 * len(SO.RR_CELLS), functions
    for name, stack, st, ld in functions:
        assert (st, ld) == ("0", "0"), (name, stack, st, ld)
