"""The register-resident cluster kernels' host side (rnnrt/kernels/regs.py, emulate_regs.py)
and source (cuda_src/persistent_regs.cu), without a GPU: the fit's decisions and reasons; the
lane map (every cell written by one lane); the butterfly reduce-scatter, simulated lane by
lane as the kernel's shuffles run, leaves lane l value l >> (5 - log2 N), summed in the tree
``lane_tree`` says, and the gather's sources are the lanes holding each gate; the emulation
equals the float64 reference for every cell; the constants are the .cu's; nvcc compiles it
for sm_90 with no spills within the registers the fit assumes; the selector's wiring (the
family 'regs' named, fallback with the reason, chosen by a fake timer).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from testkit import nvcc_usage, CELLS, H100, ceil, layer_case

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels import regs as RG
from rnnrt.kernels import sources as S
from rnnrt.kernels.emulate_regs import emulate_regs, lane_tree
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.persistent import PK_CLUSTER, cluster_count
from rnnrt.kernels.registry import KERNELS
from rnnrt.plan import PlanKey, forward_plan

SRC = S.source("persistent_regs.cu")
H90 = dict(H100, major=9)


# --- the fit ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B", [(128, 8), (128, 64), (128, 256), (64, 8), (64, 256)])
def test_the_fit_takes_small_hidden_sizes_with_256_threads(cell, H, B):
    """H <= 128 at the wide grid's batches: cluster_count's clusters, U = H / 8, 8 warps
    (UW = U / 8 units a warp), R within MAX_R_FLOATS a thread, at most RG_CPL cells a lane,
    the h buffers the only shared memory."""
    f = RG.regs_fit(cell, H, B, H90)
    assert f.ok, f.reason
    assert f.kernel == f"{cell}_persistent_regs_fwd" and f.kernel in KERNELS
    assert f.clusters == cluster_count(B, 132) and f.blocks == PK_CLUSTER * f.clusters
    assert f.units_per_block == ceil(H, 8) and f.threads == 256
    assert f.units_per_warp == ceil(f.units_per_block, 8) and f.k_tile == RG.RG_K
    assert f.r_floats <= RG.MAX_R_FLOATS and f.cells_per_thread <= RG.RG_CPL
    assert f.values <= 32 and f.values == f.value_rows * f.batch_group
    BG = ceil(B, f.clusters)
    assert f.smem_bytes == 4 * 2 * ceil(BG, f.batch_group) * f.batch_group * RG.RG_K
    assert f.scalars(7) == {"T": 7, "units_per_block": f.units_per_block, "k_tile": RG.RG_K}
    assert "R in registers" in f.reason and "register-resident" in f.describe()


def test_the_fit_says_why_it_declines():
    """Hidden past RG_K, no clusters (compute capability 8), too many batches a cluster for
    RG_CPL cells a lane (more warps first: 512 threads), an empty last cluster, a block
    size that is not whole warps: each with its reason."""
    assert "hidden 129 > 128" in RG.regs_fit("gru", 129, 8, H90).reason
    assert "compute capability 9.0" in RG.regs_fit("gru", 128, 8, dict(H100, major=8)).reason
    f = RG.regs_fit("lstm", 128, 64, H90, clusters=1)     # 64 batches a cluster: 16 warps
    assert f.ok and f.threads == 512 and f.units_per_warp == 1, f.describe()
    f = RG.regs_fit("lstm", 128, 256, H90, clusters=1)    # 256: too many even for 16 warps
    assert not f.ok and "RG_CPL" in f.reason, f.reason
    f = RG.regs_fit("lstm", 128, 8, H90, clusters=5)      # 5 clusters of 2: the last empty
    assert not f.ok and "last empty" in f.reason
    f = RG.regs_fit("lstm", 128, 8, H90, threads=100)
    assert not f.ok and "whole warps" in f.reason
    f = RG.regs_geometry("lstm", 128, 8, threads=64)      # 16 units over 2 warps
    assert not f.ok and "8 a warp > 2" in f.reason
    with pytest.raises(ValueError, match="batch must be a positive int"):
        RG.regs_geometry("lstm", 128, 0)


def test_the_fit_checks_shared_memory_and_registers():
    tiny = dict(H90, sharedMemPerBlockOptin=8192, sharedMemPerMultiprocessor=9216)
    f = RG.regs_fit("gru", 128, 256, tiny)               # 32 batches a cluster: 32 KiB
    assert not f.ok and "shared memory" in f.reason
    f = RG.regs_fit("gru", 128, 8, H90, regs_per_thread=255)   # 256 x 255 registers fit
    assert f.ok
    f = RG.regs_fit("gru", 128, 8, dict(H90, regsPerMultiprocessor=16384, regsPerBlock=16384))
    assert not f.ok and "registers" in f.reason


# --- the lane map and the butterfly -----------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, threads, clusters", [(128, 256, 256, 8), (37, 19, 128, 3),
                                                     (20, 3, 64, 2), (128, 64, 512, 1)])
def test_every_cell_has_exactly_one_lane(cell, H, B, threads, clusters):
    f = RG.regs_geometry(cell, H, B, threads, clusters)
    assert f.ok, f.reason
    count = np.zeros((B, H), int)
    for x in range(f.blocks):
        tid, b, jj = RG.lane_cells(f, x)
        assert (tid < f.threads).all()
        np.add.at(count, (b, f.units(x).start + jj), 1)
        # a lane's cells are distinct; cells of one step per lane at most RG_CPL
        assert np.bincount(tid, minlength=f.threads).max() <= f.cells_per_thread
    assert (count == 1).all()


def _butterfly(vals):
    """The kernel's rg_reduce_scatter, lane by lane: vals [32 lanes, N] -> [32] (each lane's
    result), with its selects and xor-shuffles written out."""
    v = np.array(vals, np.float32)
    n, mask = v.shape[1], 16
    while n > 1:
        half = n // 2
        up = (np.arange(32) & mask) != 0
        send = np.where(up[:, None], v[:, :half], v[:, half:n])
        keep = np.where(up[:, None], v[:, half:n], v[:, :half])
        v = keep + send[np.arange(32) ^ mask]
        n, mask = half, mask // 2
    s = v[:, 0]
    while mask >= 1:
        s = s + s[np.arange(32) ^ mask]
        mask //= 2
    return s


@pytest.mark.parametrize("N", [2, 4, 8, 16, 32])
def test_the_butterfly_leaves_each_lane_its_value_summed_in_the_emulated_tree(N):
    """Lane l ends with value l >> (5 - log2 N), summed over the 32 lanes in exactly the
    tree lane_tree uses (bit-equal, on data where the order of the sum shows)."""
    rng = np.random.default_rng(N)
    vals = (rng.standard_normal((32, N)) * 10.0 ** rng.integers(-4, 5, (32, N))).astype(np.float32)
    got = _butterfly(vals)
    want = vals.T.copy()                                   # [N, 32]: value, lane
    for half in (16, 8, 4, 2, 1):
        want = want[:, :half] + want[:, half:2 * half]
    shift = 5 - (N.bit_length() - 1)
    np.testing.assert_array_equal(got, want[np.arange(32) >> shift, 0])
    assert not np.array_equal(want[:, 0], vals.sum(0, dtype=np.float32))   # order matters


def test_lane_tree_is_the_lane_partials_summed_by_the_butterfly():
    rng = np.random.default_rng(1)
    rs = rng.standard_normal((3, 2, 37)).astype(np.float32)
    ht = rng.standard_normal((5, 37)).astype(np.float32)
    gh = lane_tree(rs, ht)
    r = np.zeros((3, 2, 128), np.float32)
    r[:, :, :37] = rs
    h = np.zeros((5, 128), np.float32)
    h[:, :37] = ht
    for q, u, b in ((0, 0, 0), (2, 1, 4), (1, 0, 3)):
        p = r[q, u].reshape(32, 4).astype(np.float64) * h[b].reshape(32, 4)
        lane = np.float32(p[:, 0])
        for e in (1, 2, 3):
            lane = np.float32(lane.astype(np.float64) + p[:, e])
        assert gh[q, u, b] == _butterfly(np.repeat(lane[:, None], 2, 1))[0]
    assert_close(gh, np.einsum("quk,bk->qub", rs.astype(np.float64), ht), 1e-5, 1e-5,
                 name="lane_tree vs the product")


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B", [(128, 8), (64, 64), (20, 3)])
def test_the_gather_reads_each_gate_from_the_lane_that_holds_it(cell, H, B):
    """gather_source(lane, q) holds value (q*UW + u)*BB + bb of the lane's cell (u, bb)."""
    f = RG.regs_geometry(cell, H, B, 256 if H >= 64 else 64, max(1, B // 4))
    assert f.ok, f.reason
    shift = 5 - (f.values.bit_length() - 1)
    for lane in range(f.groups_per_round * f.cells_per_group):
        cc = lane % f.cells_per_group
        u, bb = divmod(cc, f.batch_group)
        for q in range(f.gates):
            src = RG.gather_source(f, lane, q)
            assert src >> shift == (q * f.units_per_warp + u) * f.batch_group + bb


# --- the emulation ----------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, threads, clusters", [(128, 8, 256, 2), (64, 64, 256, 8),
                                                     (128, 64, 512, 1), (37, 19, 128, 3)])
def test_emulation_equals_the_reference(cell, H, B, threads, clusters, bias):
    f = RG.regs_geometry(cell, H, B, threads, clusters)
    assert f.ok, f.reason
    data, ref = layer_case(cell, 4, B, H, bias=bias, dtype=np.float32)
    h, c, act = emulate_regs(cell, f, **data)
    for name, got in (("h", h), ("c", c), ("act", act)):
        if ref[name] is None or got is None:
            assert (got is None) == (ref[name] is None or name == "act" and cell.startswith("rnn"))
            continue
        assert_close(got, ref[name], FP32_ATOL, FP32_RTOL, name=f"{cell} {name}")


def test_emulation_catches_a_cell_written_twice(monkeypatch):
    from rnnrt.kernels import emulate_regs as ER
    f = RG.regs_geometry("gru", 20, 3, 64, 2)
    data, _ = layer_case("gru", 2, 3, 20, dtype=np.float32)

    def twice(fit, block):
        tid, b, jj = RG.lane_cells(fit, block)
        return np.r_[tid, tid[:1]], np.r_[b, b[:1]], np.r_[jj, jj[:1]]

    monkeypatch.setattr(ER, "lane_cells", twice)
    with pytest.raises(AssertionError, match="written 2 times"):
        ER.emulate_regs("gru", f, **data)


# --- the source -------------------------------------------------------------------------------

def test_constants_match_the_kernel():
    define = lambda n: int(re.search(rf"#define {n} (\d+)", SRC)[1])   # noqa: E731
    for name in ("RG_K", "RG_BB_MAX", "RG_NR_MAX", "RG_CPL", "RG_MAX_THREADS"):
        assert define(name) == getattr(RG, name), name
    assert define("PK_CLUSTER") == PK_CLUSTER
    assert SRC.count("__launch_bounds__(RG_MAX_THREADS, 1)") == 8   # 4 cells, fp32 and typed
    assert RG.RG_MAX_THREADS * 128 <= 65536 and max(RG.NVCC_REGS.values()) <= 128
    assert "const int BB = max(2, min(min(RG_BB_MAX, 32 / RP), pk_pow2ceil(BG)));" in SRC
    assert "src[q] = ((q * UW + cu) * BB + cbb) << SH;" in SRC          # gather_source
    assert "NR = (32 / C < RG_NR_MAX) ? 32 / C : RG_NR_MAX;" in SRC   # groups_per_round


def test_nvcc_compiles_without_spills_within_the_fit_registers(tmp_path):
    usage = nvcc_usage(SRC, tmp_path)
    assert {u[0] for u in usage} == {f"{c}_persistent_regs_fwd" for c in CELLS}, usage
    for name, stack, st, ld, regs in usage:
        assert (stack, st, ld) == ("0", "0", "0"), (name, stack, st, ld)
        assert int(regs) <= RG.NVCC_REGS[name.split("_persistent")[0]], (name, regs)


# --- the selector's wiring --------------------------------------------------------------------

def _key(family, cell="gru", hidden=64, batch=8, layers=1, steps=5):
    sched = C.persistent_schedule(family)
    return PlanKey(cell, steps, batch, hidden, hidden, layers, True, sched.switches,
                   device=H100_SXM, family=sched.family)


def test_the_named_family_runs_exactly_the_regs_kernel():
    plan = forward_plan(_key("regs", layers=2))
    ops = [op for op in plan.ops if getattr(op, "kind", "") == "persistent"]
    assert ops and {op.name for op in ops} == {"gru_persistent_regs_fwd"}
    assert plan.fallback is None
    chunked = C.choose_persistent(_key("regs", layers=4, steps=40, batch=64))
    assert chunked.family == "regs" and chunked.chunked and chunked.steps_per_launch == 10
    assert chunked.fit.clusters == cluster_count(64, 132, 4), chunked.describe()
    plan = forward_plan(_key("regs", hidden=192))
    assert plan.fallback and "hidden 192 > 128" in plan.fallback
    assert not [op for op in plan.ops if getattr(op, "kind", "") == "persistent"]


def test_the_selector_times_regs_and_takes_it_when_fastest():
    shape = SEL.Shape("lstm", 1, 128, 128, 64, 100)
    assert "regs" in C.fitting_families(shape, H100_SXM)
    ms = {"regs": 0.2, "cluster": 0.3}
    sel = SEL.Selector(lambda s, sh, n: [ms.get(s.name, 1.0)] * n, H100_SXM, autotune=True,
                     clock=lambda: 0.0)
    got = sel.select(shape)
    assert got.schedule.name == "regs" and got.schedule.family == "regs"
    assert {r["name"] for r in got.candidates} >= {"regs", "cluster", "grid"}
    big = SEL.Shape("lstm", 1, 256, 256, 64, 100)
    assert "regs" not in C.fitting_families(big, H100_SXM)
