"""The register-resident cluster backward kernels' host side (rnnrt/kernels/regs_bwd.py,
emulate_regs.py's backward) and source (cuda_src/persistent_regs_bwd.cu), without a GPU: the
fit's decisions and reasons; the lane map (every cell one lane, which holds its own sum: no
gather); the emulation equals the float64 reference for every cell and its bits do not
depend on the block size, the clusters or the order of the blocks; the registry's twin runs
it; the constants are the .cu's; nvcc compiles it for sm_90 with no spills within the
registers the fit assumes; the choice (backward 'regs' named, fallback with the reason).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from testkit import (CELLS, H100, bwd_layer_case, ceil, check_bwd_against_reference,
                     nvcc_usage)

from rnnrt.kernels import regs_bwd as RB
from rnnrt.kernels import sources as S
from rnnrt.kernels.choice_backward import choose_persistent_backward
from rnnrt.kernels.emulate_regs import emulate_regs_bwd, lane_chain_tree
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.persistent import PK_CLUSTER, cluster_count
from rnnrt.kernels.registry import KERNELS, get_kernel
from rnnrt.kernels.schedules import persistent_schedule
from rnnrt.plan import PlanKey

SRC = S.source("persistent_regs_bwd.cu")
H90 = dict(H100, major=9)


# --- the fit ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, layers", [(128, 8, 1), (128, 32, 1), (128, 256, 1),
                                          (128, 32, 4), (128, 128, 4), (64, 256, 1)])
def test_the_fit_takes_small_hidden_sizes(cell, H, B, layers):
    """H <= 128 at the issue's batches: the cluster backward's count (the layers' share
    where they overlap), U = H / 8, 8 warps (UW = U / 8), at most RB_CPL cells a lane, the
    dg buffers the only shared memory."""
    f = RB.regs_bwd_fit(cell, H, B, H90, layers=layers)
    assert f.ok, f.reason
    assert f.kernel == f"{cell}_persistent_regs_bwd" and f.kernel in KERNELS
    assert f.clusters == cluster_count(B, 132, layers) and f.blocks == PK_CLUSTER * f.clusters
    assert f.units_per_block == ceil(H, 8) and f.threads == 256 and f.cluster == PK_CLUSTER
    assert f.units_per_warp == ceil(f.units_per_block, 8) and f.k_tile == RB.RG_K
    assert f.cells_per_thread <= RB.RB_CPL and f.values <= 32
    assert f.values * f.groups_per_round == 32
    BG = ceil(B, f.clusters)
    assert f.smem_bytes == (4 * 2 * ceil(BG, f.batch_group) * f.batch_group * f.gates
                            * RB.RG_K)
    assert f.scalars(7) == {"T": 7, "units_per_block": f.units_per_block, "k_tile": RB.RG_K}
    assert f.barrier_arrivals(1000) == 0   # the hardware's barrier: no counters
    assert "R^T in registers" in f.reason and "register-resident" in f.describe()


def test_the_fit_says_why_it_declines():
    assert "hidden 129 > 128" in RB.regs_bwd_fit("gru", 129, 8, H90).reason
    assert "compute capability 9.0" in RB.regs_bwd_fit("gru", 128, 8,
                                                       dict(H100, major=8)).reason
    f = RB.regs_bwd_fit("lstm", 128, 64, H90, clusters=1)   # 64 batches, 8 groups, NR 2
    assert not f.ok and "RB_CPL" in f.reason, f.reason
    f = RB.regs_bwd_fit("lstm", 128, 8, H90, clusters=5)    # 5 clusters of 2: the last empty
    assert not f.ok and "last empty" in f.reason
    f = RB.regs_bwd_fit("lstm", 128, 8, H90, threads=100)
    assert not f.ok and "whole warps" in f.reason
    f = RB.regs_bwd_geometry("lstm", 128, 8, threads=64)    # 16 units over 2 warps
    assert not f.ok and "8 a warp > 2" in f.reason
    tiny = dict(H90, sharedMemPerBlockOptin=16384, sharedMemPerMultiprocessor=17408)
    f = RB.regs_bwd_fit("gru", 128, 256, tiny)              # 32 batches a cluster: 96 KiB
    assert not f.ok and "shared memory" in f.reason
    f = RB.regs_bwd_fit("gru", 128, 8, dict(H90, regsPerMultiprocessor=32768,
                                               regsPerBlock=32768))
    assert not f.ok and "registers" in f.reason
    # the rule's count does not fit (60 KiB a block): the fewest more clusters that do
    small = dict(H90, sharedMemPerBlockOptin=65536, sharedMemPerMultiprocessor=66560)
    f = RB.regs_bwd_fit("lstm", 128, 128, small, layers=4)
    assert f.ok and f.clusters > cluster_count(128, 132, 4), f.describe()
    with pytest.raises(ValueError, match="batch must be a positive int"):
        RB.regs_bwd_geometry("lstm", 128, 0)
    with pytest.raises(ValueError, match="clusters must be >= 1"):
        RB.regs_bwd_fit("lstm", 128, 8, H90, clusters=0)


# --- the lane map and the order of the sums ---------------------------------------------------

@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("H, B, threads, clusters", [(128, 256, 256, 8), (37, 19, 96, 3),
                                                     (20, 3, 64, 2), (16, 32, 32, 1)])
def test_every_cell_has_exactly_one_lane_which_holds_its_sum(cell, H, B, threads, clusters):
    """Each (b, j) is one lane's; that lane is the one the reduce-scatter leaves its sum in:
    value u*BB + bb of its group sits at lanes v << SH .. (v + 1) << SH, the cell's lane
    among them, its group gi = lane & (NR - 1) of the round."""
    f = RB.regs_bwd_geometry(cell, H, B, threads, clusters)
    assert f.ok, f.reason
    count = np.zeros((B, H), int)
    shift = 5 - (f.values.bit_length() - 1)
    for x in range(f.blocks):
        tid, b, jj = RB.lane_cells(f, x)
        lane, warp = tid % 32, tid // 32
        v = (jj - warp * f.units_per_warp) * f.batch_group + (b - f.batches(x).start) \
            % f.batch_group
        assert ((lane >> shift) == v).all()
        group = (b - f.batches(x).start) // f.batch_group
        assert ((group % f.groups_per_round) == (lane & (f.groups_per_round - 1))).all()
        np.add.at(count, (b, f.units(x).start + jj), 1)
        assert np.bincount(tid, minlength=f.threads).max() <= f.cells_per_thread
    assert (count == 1).all()


def test_lane_chain_tree_is_the_lanes_chain_then_the_tree():
    """One value by hand: lane l's float32 chain over its E columns (a product, then FMAs),
    then ((l + (l+16)) + ...) pairwise down to one, as the butterfly adds them."""
    rng = np.random.default_rng(3)
    rl = rng.standard_normal((1, 32, 8)).astype(np.float32)
    hl = rng.standard_normal((1, 32, 8)).astype(np.float32)
    p = np.empty(32, np.float32)
    for lane in range(32):
        a = np.float32(rl[0, lane, 0] * hl[0, lane, 0])
        for e in range(1, 8):
            a = np.float32(np.float64(a) + np.float64(rl[0, lane, e]) * hl[0, lane, e])
        p[lane] = a
    for half in (16, 8, 4, 2, 1):
        p = p[:half] + p[half:2 * half]
    assert lane_chain_tree(rl, hl)[0, 0] == p[0]


@pytest.mark.parametrize("cell", CELLS)
def test_the_emulation_gives_the_reference_and_the_same_bits_for_every_cut(cell):
    """Float32 emulation vs the float64 reference (dh0, dc0, dx, every weight and bias
    gradient); the same bits with other clusters, another block size and the blocks in
    reverse order (the order of every sum is the lane's chain and the tree, whoever owns
    the cell)."""
    H, B, T = 37, 11, 3
    data, ref = bwd_layer_case(cell, T, B, H)

    def run(fit, order=None):
        return emulate_regs_bwd(cell, fit, data["dhin"], data["dh_n"], data["R"],
                                data["act"], data["st"], data["dc_n"], block_order=order)

    f1 = RB.regs_bwd_geometry(cell, H, B, 96, 2)
    out = run(f1)
    check_bwd_against_reference(out, data, ref, f"{cell} emulation")
    f2 = RB.regs_bwd_geometry(cell, H, B, 256, 3)
    for other in (run(f2), run(f1, list(reversed(range(f1.blocks))))):
        for name, v in out.items():
            if v is not None:
                np.testing.assert_array_equal(other[name], v, err_msg=name)


def test_the_registry_twin_runs_the_emulation():
    """lstm_persistent_regs_bwd's NumPy twin on the registry's views (the calling convention
    of the cluster backward): the emulation's outputs; a k_tile other than RG_K refused."""
    cell, H, B, T = "lstm", 20, 5, 2
    data, _ = bwd_layer_case(cell, T, B, H)
    k = get_kernel("lstm_persistent_regs_bwd")
    assert k.file == "persistent_regs_bwd.cu" and k.persistent
    dgx = np.full((T * B, 4 * H), np.nan, np.float32)
    dh0 = np.full((B, H), np.nan, np.float32)
    dc0 = np.full((B, H), np.nan, np.float32)
    sync = np.zeros((1, 2), np.uint32)
    ins = (data["dhin"].reshape(T * B, H), data["dh_n"], data["dc_n"],
           data["act"].reshape(T * B, 4 * H), data["st"].reshape((T + 1) * B, H), data["R"])
    k.numpy_fn(B, H, (dgx, dh0, dc0, sync), ins, T, ceil(H, 8), RB.RG_K)
    fit = RB.regs_bwd_geometry(cell, H, B, 256, 2)
    emu = emulate_regs_bwd(cell, fit, data["dhin"], data["dh_n"], data["R"], data["act"],
                           data["st"], data["dc_n"])
    np.testing.assert_array_equal(dgx, emu["dgx"].reshape(T * B, 4 * H))
    np.testing.assert_array_equal(dh0, emu["dh0"])
    np.testing.assert_array_equal(dc0, emu["dc0"])
    with pytest.raises(ValueError, match="k_tile 64 != RG_K"):
        k.numpy_fn(B, H, (dgx, dh0, dc0, sync), ins, T, ceil(H, 8), 64)


# --- the source -------------------------------------------------------------------------------

def test_constants_match_the_kernel():
    define = lambda n: int(re.search(rf"#define {n} (\d+)", SRC)[1])   # noqa: E731
    for name in ("RB_BB_MAX", "RB_CPL", "RB_MAX_THREADS"):
        assert define(name) == getattr(RB, name), name
    assert define("RG_K") == RB.RG_K and define("PK_CLUSTER") == PK_CLUSTER
    assert SRC.count("__launch_bounds__(RB_MAX_THREADS, 1)") == 4
    assert max(RB.BLOCK_SIZES) <= RB.RB_MAX_THREADS
    assert "const int BB = max(2, min(min(RB_BB_MAX, 32 / UW), pk_pow2ceil(BG)));" in SRC
    assert "const int UW = (U + NW - 1) / NW;" in SRC
    assert "const int cv = lane >> SH, gi = lane & (NR - 1), cu = cv / BB, cbb = cv % BB;" \
        in SRC   # lane_cells
    # the pointwise is cell_bwd.cuh's, called as persistent_bwd.cuh calls it
    for call in ("lstm_bwd_point(", "gru_bwd_point(", "rnn_bwd_point<CELL == CELL_RNN_RELU>("):
        assert call in SRC, call


def test_nvcc_compiles_without_spills_within_the_fit_registers(tmp_path):
    usage = nvcc_usage(SRC, tmp_path)
    assert {u[0] for u in usage} == {f"{c}_persistent_regs_bwd" for c in CELLS}, usage
    for name, stack, st, ld, regs in usage:
        assert (stack, st, ld) == ("0", "0", "0"), (name, stack, st, ld)
        assert int(regs) <= RB.NVCC_REGS[name.split("_persistent")[0]], (name, regs)


# --- the choice -------------------------------------------------------------------------------

def _key(cell="lstm", hidden=128, batch=32, layers=1, steps=20, **kw):
    sched = persistent_schedule("regs")
    return PlanKey(cell, steps, batch, hidden, hidden, layers, True, sched.switches,
                   train=True, device=H100_SXM, family="regs", backward="regs", **kw)


def test_backward_regs_runs_the_register_resident_kernel_or_says_why_not():
    ch = choose_persistent_backward(_key())
    assert ch.runs and ch.fit.kernel == "lstm_persistent_regs_bwd" and not ch.chunked
    assert "register-resident" in ch.describe()
    ch = choose_persistent_backward(_key(layers=4, batch=64, steps=40))   # the wavefront
    assert ch.runs and ch.chunked and ch.steps_per_launch == 10
    assert ch.fit.clusters == cluster_count(64, 132, 4), ch.describe()
    ch = choose_persistent_backward(_key(bwd_clusters=3))
    assert ch.runs and ch.fit.clusters == 3
    ch = choose_persistent_backward(_key(hidden=192))
    assert not ch.runs and "register-resident backward declined" in ch.fallback
    assert "hidden 192 > 128" in ch.fallback and "per-step backward" in ch.fallback
    ch = choose_persistent_backward(_key(dtype="bfloat16"))
    assert not ch.runs and "register-resident backward declined" in ch.fallback
