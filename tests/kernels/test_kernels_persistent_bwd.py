"""The persistent backward kernels' host side without a GPU (rnnrt/kernels/persistent_bwd.py,
emulate_bwd.py): the fit (what it chooses on the H100, why it refuses, the cost model's
choice of U, its knobs), the .cu's geometry and refusals are the fit's formulas, the
emulation equals the float64 reference for every cell in one tile and several, its result
is the same bits whatever order the blocks run in (determinism: one writer an element, a
fixed order every sum), and the registry's twins on poisoned padded views write exactly
their outputs and refuse dirty counters and a geometry the kernel traps on.
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.cells import get_cell
from rnnrt.kernels import persistent_bwd as PB
from rnnrt.kernels import registry as K
from rnnrt.kernels import sources as S
from rnnrt.kernels import twins as knp
from rnnrt.kernels.persistent import full_tile, stride_r, tile_stride
from testkit import (BWD_KERNELS, CELLS, H100, bwd_layer_case, check_bwd_against_reference,
                     emulated)

SRC = S.source("persistent_bwd.cu")
H9 = dict(H100, major=9)


# --- the fit ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cell, H, B", [("lstm", 128, 8), ("gru", 128, 64), ("lstm", 512, 64),
                                        ("rnn_relu", 1024, 32), ("lstm", 640, 100)])
def test_fit_on_the_h100(cell, H, B):
    fit = PB.persistent_bwd_fit(cell, H, B, H100, kind="grid")
    assert fit.ok, fit.reason
    assert fit.kernel == f"{cell}_persistent_bwd" and fit.blocks <= 132
    assert fit.units_per_block * fit.blocks >= H and fit.smem_bytes <= 232448
    assert fit.depth == get_cell(cell).gates * H and fit.rows == fit.units_per_block
    assert fit.units_per_block * B <= PB.PK_CPT * fit.threads
    # U: the doubling of ceil(H / SMs) whose modelled step is shortest among those fitting
    u0 = -(-H // 132)
    others = [PB.persistent_bwd_fit(cell, H, B, H100, units_per_block=u)
              for u in (u0, 2 * u0, 4 * u0, 8 * u0)]
    best = min(f.step_us() for f in others if f.ok)
    assert fit.step_us() == pytest.approx(best, abs=1e-3)
    assert "by the cost model" in fit.reason and "backward" in fit.describe()


def test_the_fit_takes_the_variant_the_cost_model_prefers():
    """kind None: of the grid and the cluster kernel that fit, the shorter modelled step;
    the reason names the other; kind and the knobs force one (H9: the H100's properties
    with compute capability 9, which clusters need)."""
    small = PB.persistent_bwd_fit("lstm", 128, 8, H9)
    grid = PB.persistent_bwd_fit("lstm", 128, 8, H9, kind="grid")
    cl = PB.persistent_bwd_fit("lstm", 128, 8, H9, kind="cluster")
    assert grid.ok and cl.ok and cl.cluster == 8 and cl.clusters == 2
    assert small.kernel == ("lstm_persistent_cluster_bwd" if cl.step_us() < grid.step_us()
                            else "lstm_persistent_bwd")
    assert "the grid kernel" in small.reason or "the cluster kernel" in small.reason
    big = PB.persistent_bwd_fit("lstm", 512, 64, H9)   # R / 8 does not fit a block
    assert big.ok and not big.cluster and "the cluster kernel does not fit" in big.reason
    assert PB.persistent_bwd_fit("lstm", 128, 8, H9, units_per_block=2).cluster == 0
    assert PB.persistent_bwd_fit("lstm", 128, 8, H9, clusters=1).clusters == 1
    sm80 = dict(H100, major=8)
    assert not PB.persistent_bwd_fit("gru", 128, 8, sm80, kind="cluster").ok
    assert "compute capability" in PB.persistent_bwd_fit("gru", 128, 8, sm80,
                                                         kind="cluster").reason
    assert PB.persistent_bwd_fit("gru", 128, 8, sm80).cluster == 0
    with pytest.raises(ValueError, match="kind must be"):
        PB.persistent_bwd_fit("gru", 128, 8, H9, kind="stack")
    assert cl.step_us() == pytest.approx(PB.cluster_step_us(16, 4, 512, 4))


def test_cost_model_terms():
    """Fixed + staged bytes / L2 rate + a block's FMAs / an SM's rate: more blocks stage
    more, more units a block multiply more."""
    base = PB.step_us(32, 4, 512, 8)
    assert base == pytest.approx(PB.STEP_FIXED_US + 4 * 32 * 8 * 512 / PB.L2_BYTES_PER_US
                                 + 4 * 512 * 8 / PB.FMAS_PER_US_PER_SM)
    assert PB.step_us(64, 4, 512, 8) > base and PB.step_us(32, 8, 512, 8) > base


def test_fit_refuses_and_says_why():
    big = PB.persistent_bwd_fit("lstm", 2048, 8, H100)
    assert not big.ok and "shared memory" in big.reason and "R^T slice" in big.reason
    few = PB.persistent_bwd_fit("lstm", 128, 8, H100, units_per_block=1,
                                threads=32)
    assert few.ok and few.blocks == 128
    over = PB.persistent_bwd_fit("lstm", 300, 8, H100, units_per_block=2)
    assert not over.ok and "150 blocks of 2 units > 132 SMs" in over.reason
    cells = PB.persistent_bwd_fit("gru", 128, 300, H100, units_per_block=2, threads=256)
    assert not cells.ok and "600 cells > 2 a thread x 256 threads" in cells.reason
    tile = PB.persistent_bwd_fit("gru", 40, 4, H100, units_per_block=8, k_tile=10)
    assert not tile.ok and "not a multiple of 4" in tile.reason
    regs = PB.persistent_bwd_fit("lstm", 64, 8, H100, regs_per_thread=255, threads=256,
                                 units_per_block=2)
    assert regs.ok   # 256 x 255 fits one SM's 64 K
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        PB.bwd_geometry("lstm", 0, 3, 1)
    with pytest.raises(ValueError, match="the 32-bit barrier counter"):
        PB.persistent_bwd_fit("lstm", 128, 8, H100, units_per_block=1).check_steps(2**26)
    # T x blocks arrivals (a barrier after every step, the last before dh0): 2^25 steps of
    # 128 blocks wrap the counter, one fewer does not; the cluster kernel never touches it
    grid = PB.persistent_bwd_fit("lstm", 128, 8, H100, units_per_block=1)
    assert grid.blocks == 128 and grid.barrier_arrivals(5) == 5 * 128
    grid.check_steps(2**25 - 1)
    with pytest.raises(ValueError, match="overflow"):
        grid.check_steps(2**25)
    cl = PB.persistent_bwd_fit("lstm", 128, 8, H9, kind="cluster")
    assert cl.ok and cl.barrier_arrivals(2**31 - 1) == 0
    cl.check_steps(2**31 - 1)
    # the block the caller asked for is the reason, not the shared memory it would need
    big = PB.persistent_bwd_fit("lstm", 16, 3, H100, units_per_block=16, threads=512)
    assert not big.ok and "a block of 512 threads > the 256" in big.reason, big.reason


def test_the_kernel_computes_the_fits_formulas():
    """The .cu's layout, refusals and shared memory are bwd_geometry's: the forward's
    pk_geometry with one gate and depth K = G*H for BG batches, the R^T slice [U][SR(K)],
    the dg tile [BG][SH] (two of them in the cluster kernel), the partial sums
    [NKG][U][BP]; ranks x U >= H; cells <= PK_CPT a thread; the cluster's batch slice."""
    for line in ("const int K = G * H;",
                 # pk_geom<false> is pk_geometry (the tensor-core kernels' MMA: mma_bwd.py)
                 # (PAIR: the pair kernel's, test_kernels_pair_bwd.py; here KD = K)
                 "int pc = 0, kb = 0, KC = K, KD = K;",
                 "const PkGeom g = pk_geom<MMA>(1, PAIR ? 2 * U : U, BG, KD, KT, nt);",
                 "return pk_geometry(G, U, B, H, KT, nt);",
                 "const long long need = 4LL * ((long long)g.M * g.SR + (CL ? 2LL : 1LL) * BG * g.SH\n"
                 "                                  + (long long)g.NKG * g.M * g.BP + (PAIR ? (long long)U * BG : 0));",
                 "if ((long long)ranks * U < H || (long long)U * BG > (long long)PK_CPT * nt ||",
                 "BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();",
                 "b_off = (int)pk_cluster_id() * BG;", "B = min(BG, Bfull - b_off);",
                 "if (B < 1 || KT < K) __trap();",
                 "const int Mb = PAIR ? max(0, min(g.M, H - r0)) : Ub;",
                 "Rs[ju * g.SR + r] = (ju < Mb && r < KC)\n"
                 "                                ? pk_operand<TS, TF32>(w[(long long)(kb + r) * ldw + r0 + ju])",
                 "const int e = tid + i * nt;", "const int jj = e % U;", "cell_b[i] = e / U;",
                 "grid_barrier(sync, (unsigned int)s * gridDim.x);", "if (!CL) grid_exit(sync);"):
        assert line in SRC, line
    f = PB.bwd_geometry("gru", 37, 5, 4, 64, k_tile=20)
    lr, lb, lk = f.lanes
    bp = 32 * -(-(5 - lb) // 32) + lb
    assert f.smem_r == 4 * 4 * stride_r(111) and f.smem_tile == 4 * 5 * tile_stride(20)
    assert f.smem_partials == 4 * f.k_groups * 4 * bp and f.k_groups == 2 * lk
    # each kernel and its typed instantiation K_t<TS, TF32>
    assert SRC.count("__launch_bounds__(PK_MAX_THREADS, 1)") == 2 * len(BWD_KERNELS) == 16
    c = PB.bwd_geometry("lstm", 37, 19, 5, 64, clusters=3)   # 7, 7 and 5 batches
    assert c.ok and c.batch_per_block == 7 and c.blocks == 24 and c.kernel.endswith("cluster_bwd")
    assert c.smem_tile == 4 * 2 * 7 * tile_stride(c.k_tile) and c.k_tile >= 148
    for bad, why in ((dict(units_per_block=4), "do not cover hidden 37"),
                     (dict(k_tile=16), "one tile"), (dict(clusters=12), "leave the last empty")):
        kw = dict(units_per_block=5, threads=64, clusters=3) | bad
        assert why in PB.bwd_geometry("lstm", 37, 19, **kw).reason, bad


# --- the emulation -------------------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, U, threads, k_tile, clusters",
                         [(37, 3, 5, 5, 32, None, 0), (40, 5, 4, 6, 64, 12, 0),
                          (20, 33, 1, 7, 128, None, 0), (37, 19, 3, 5, 64, None, 3),
                          (20, 3, 2, 3, 32, None, 2)])
def test_emulation_equals_the_reference(cell, H, B, T, U, threads, k_tile, clusters):
    fit = PB.bwd_geometry(cell, H, B, U, threads, k_tile=k_tile, clusters=clusters)
    assert fit.ok
    data, ref = bwd_layer_case(cell, T, B, H, dtype=np.float64)
    out = emulated(cell, fit, data)
    check_bwd_against_reference(out, data, ref, f"{cell} emulation float64", 1e-12, 1e-10)
    # the float64 tolerance tells float64 from float32: the same result rounded fails it
    rounded = {k: None if v is None else v.astype(np.float32).astype(np.float64)
               for k, v in out.items()}
    with pytest.raises(AssertionError, match="MISMATCH"):
        check_bwd_against_reference(rounded, data, ref, f"{cell} rounded", 1e-12, 1e-10)
    data32, _ = bwd_layer_case(cell, T, B, H, dtype=np.float32)
    out32 = emulated(cell, fit, data32)
    assert out32["dgx"].dtype == np.float32
    check_bwd_against_reference(out32, data32, ref, f"{cell} emulation float32")


@pytest.mark.parametrize("clusters", [0, 2], ids=["grid", "cluster"])
@pytest.mark.parametrize("cell", CELLS)
def test_the_same_bits_whatever_order_the_blocks_run(cell, clusters):
    """Determinism: every element of dh_rec has one writer and every sum (a k-group's
    columns, the k-groups in order) a fixed order, so any order of the blocks gives the
    same bits; so does a second run."""
    fit = PB.bwd_geometry(cell, 37, 6, 5, 64, k_tile=None if clusters else 16,
                          clusters=clusters)
    data, _ = bwd_layer_case(cell, 6, 6, 37)
    first = emulated(cell, fit, data)
    rng = np.random.default_rng(0)
    for _ in range(3):
        again = emulated(cell, fit, data, block_order=list(rng.permutation(fit.blocks)))
        for name, a in first.items():
            if a is not None:
                np.testing.assert_array_equal(again[name], a, err_msg=name)
    with pytest.raises(ValueError, match="block_order"):
        emulated(cell, fit, data, block_order=[0, 0] + list(range(2, fit.blocks)))


def test_the_k_group_order_is_what_makes_it_deterministic():
    """The bits do depend on the order of the k-group sums (so fixing it matters): the
    same data summed in the reversed k-group order differs in the last bits somewhere."""
    fit = PB.bwd_geometry("lstm", 40, 4, 8, 256, k_tile=40)
    data, _ = bwd_layer_case("lstm", 4, 4, 40)
    out = emulated("lstm", fit, data)
    dg = out["dgx"][1]
    R = data["R"]
    from rnnrt.kernels.emulate import k_columns
    groups = [k_columns(fit, g) for g in range(fit.k_split)]
    groups = [g for g in groups if len(g)]
    assert len(groups) > 2

    def total(order):
        acc = None
        for cols in order:
            part = dg[:, cols] @ R[cols, :]
            acc = part if acc is None else acc + part
        return acc

    assert not np.array_equal(total(groups), total(groups[::-1]))


# --- the registry's twins --------------------------------------------------------------------

def _lay_out(kinfo, T, B, H, data, ld_pad=3, gap=5):
    """Every argument in one NaN-filled float32 buffer, padded rows and gaps between views;
    inputs filled, sync zero. -> (buf, {arg: (offset, rows, cols, ld)})"""
    out_shapes, in_shapes = kinfo.arg_shapes(B, H, T=T, units_per_block=1, k_tile=4)
    place, off = {}, gap
    for (arg, _), (r, c) in zip(kinfo.outs + kinfo.ins, out_shapes + in_shapes):
        place[arg] = (off, r, c, c + ld_pad)
        off += (r - 1) * (c + ld_pad) + c + gap
    buf = np.full(off, np.nan, np.float32)
    fill = {"dhin": data["dhin"].reshape(T * B, H), "dh_n": data["dh_n"], "w_hh": data["R"],
            "c": data["st"].reshape(-1, H), "h": data["st"].reshape(-1, H)}
    if data["act"] is not None:
        fill["act"] = data["act"].reshape(T * B, -1)
    if data["dc_n"] is not None:
        fill["dc_n"] = data["dc_n"]
    for arg, (o, r, c, ld) in place.items():
        if arg in fill:
            knp.view(buf, o, r, c, ld)[...] = fill[arg]
    o, _, c, ld = place["sync"]
    knp.view(buf, o, 1, c, ld)[...] = 0
    return buf, place


@pytest.mark.parametrize("name", BWD_KERNELS)
def test_twin_on_poisoned_padded_views(name):
    kinfo = K.KERNELS[name]
    cell, cluster = name.split("_persistent")[0], "_cluster" in name
    T, B, H, U = 5, (10 if cluster else 3), 37, 5   # the cluster twin: 3 clusters of 4, 4, 2
    data, ref = bwd_layer_case(cell, T, B, H)
    buf, place = _lay_out(kinfo, T, B, H, data)
    before = buf.copy()
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    if cluster:   # the cluster kernel keeps all of dg_t: it traps on a narrower tile
        with pytest.raises(ValueError, match="one tile"):
            kinfo.numpy_fn(B, H, outs, ins, T, U, 12)
        np.testing.assert_array_equal(buf, before, err_msg="wrote before refusing")
    kinfo.numpy_fn(B, H, outs, ins, T, U, full_tile(get_cell(cell).gates * H)
                   if cluster else 12)
    written = np.zeros(buf.size, bool)
    for arg, _ in kinfo.outs:
        if arg == "sync":
            continue
        o, r, c, ld = place[arg]
        idx = o + np.arange(r)[:, None] * ld + np.arange(c)[None]
        written[idx.ravel()] = True
        assert np.isfinite(buf[idx]).all(), f"{name}: {arg} not all written"
    np.testing.assert_array_equal(np.isnan(buf[~written]), np.isnan(before[~written]))
    np.testing.assert_array_equal(buf[~written & ~np.isnan(before)],
                                  before[~written & ~np.isnan(before)])
    G = get_cell(cell).gates
    out = {"dgx": knp.view(buf, *place["dgx"]).reshape(T, B, G * H).copy(),
           "dgh": (knp.view(buf, *place["dgh"]).reshape(T, B, G * H).copy()
                   if "dgh" in place else None),
           "dh0": knp.view(buf, *place["dh0"]).copy(),
           "dc0": knp.view(buf, *place["dc0"]).copy() if "dc0" in place else None}
    check_bwd_against_reference(out, data, ref, f"{name} twin")


def test_twin_refuses_dirty_counters_and_a_bad_geometry():
    kinfo = K.KERNELS["rnn_tanh_persistent_bwd"]
    T, B, H = 3, 2, 10
    data, _ = bwd_layer_case("rnn_tanh", T, B, H)
    buf, place = _lay_out(kinfo, T, B, H, data)
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    with pytest.raises(ValueError, match="not a multiple of 4"):
        kinfo.numpy_fn(B, H, outs, ins, T, 5, 6)
    outs[-1][...] = 1
    with pytest.raises(ValueError, match="sync counters must be zero"):
        kinfo.numpy_fn(B, H, outs, ins, T, 5, 8)


def test_launch_refuses_a_fit_that_does_not_fit():
    kinfo = K.KERNELS["lstm_persistent_bwd"]
    good = PB.persistent_bwd_fit("lstm", 128, 8, H100)
    assert kinfo.launch_persistent(good)[0] == (good.blocks, 1, 1)
    bad = PB.persistent_bwd_fit("lstm", 2048, 8, H100)
    with pytest.raises(ValueError, match="does not fit"):
        kinfo.launch_persistent(bad)
    with pytest.raises(ValueError, match="the fit is for"):
        K.KERNELS["gru_persistent_bwd"].launch_persistent(good)


def test_cluster_rule_takes_the_layers_share_where_it_fits():
    """With several layers (chunked launches overlapping along the reverse wavefront) the
    cluster kernel's rule count is the layers' share of the SMs (measured faster on the
    H100 at L4 H128 B32-128), else the fewest more clusters that fit, up to the one-layer
    count; one layer keeps the one-layer count; the grid kernel is weighed a layer-step."""
    from rnnrt.kernels.persistent import cluster_count
    sms = H9["multiProcessorCount"]
    for cell, B in (("lstm", 32), ("gru", 128)):
        one = PB.persistent_bwd_fit(cell, 128, B, H9, kind="cluster")
        four = PB.persistent_bwd_fit(cell, 128, B, H9, kind="cluster", layers=4)
        assert one.ok and one.clusters == cluster_count(B, sms)
        assert four.ok and four.clusters == cluster_count(B, sms, 4) < one.clusters
        assert PB.persistent_bwd_fit(cell, 128, B, H9, layers=4).cluster   # kind None
    # LSTM H128 B256: the share (4 clusters, 64 batches each) has too many cells a thread
    assert not PB.persistent_bwd_fit("lstm", 128, 256, H9, clusters=4).ok
    got = PB.persistent_bwd_fit("lstm", 128, 256, H9, kind="cluster", layers=4)
    assert got.ok and got.clusters == min(n for n in range(4, 9) if PB.persistent_bwd_fit(
        "lstm", 128, 256, H9, clusters=n).ok)
