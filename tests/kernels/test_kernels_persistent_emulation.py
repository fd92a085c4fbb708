"""The per-layer persistent kernels' decomposition (rnnrt/kernels/persistent.py's geometry,
rnnrt/kernels/emulate.py), checked without a GPU.

- the NumPy emulation of the kernels' decomposition (block by block, step by step) equals
  ``reference.forward`` for one layer: every cell, with and without bias, odd H not divisible
  by the block count, B = 1 and 3, T = 1 and 7, h_t in one tile or in several (k_tile 8, 12,
  64, the last tile partial), 4 to 32 k-groups (idle ones included), one cell a thread or
  two; the cluster decomposition likewise;
- every hidden unit, every (b, j) (at most PK_CPT a thread) and every column k (once per
  block, in its warp's own chunks) is owned exactly once; a warp's lanes (LR x LB x LK, the
  kernel's formulas) cover every (row, batch) of the R slice x h_t product once per k-group;
  the geometry (lanes, k-groups, strides, shared memory) equals hand-computed values.
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.kernels import emulate as E
from rnnrt.kernels import persistent as P
from testkit import CELLS, H100, SMALL, cancelling_case, ceil, chunk_cols, layer_case


# --- one layer: the emulation against the float64 reference ----------------------------

# Decompositions for H = 37 (last block partial) and H = 150; h_t in one tile (the default,
# k_tile = H rounded up to 4) or in several, the last one partial; lanes LR x LB x LK and
# k-groups NKG = warps * LK depend on the cell (M = G*U rows) and B
FITS = {
    "small-gpu": lambda cell, H, B: P.persistent_fit(cell, H, B, SMALL),  # U 7: 6 blocks
    "U5-64thr": lambda cell, H, B: P.geometry(cell, H, B, 5, threads=64),   # 8 blocks, 2 warps
    "U5-64thr-kt12": lambda cell, H, B: P.geometry(cell, H, B, 5, threads=64,
                                                   k_tile=12),             # 12, 12, 12, 1
    "U19": lambda cell, H, B: P.geometry(cell, H, B, 19),                   # 8 blocks, 1 tile
    "U19-32thr": lambda cell, H, B: P.geometry(cell, H, B, 19, threads=32),  # B 3: 2 cells a thread
    "U19-kt64": lambda cell, H, B: P.geometry(cell, H, B, 19, k_tile=64),   # 64, 64, 22 (v1)
    "U19-kt8": lambda cell, H, B: P.geometry(cell, H, B, 19, k_tile=8),     # 18 x 8, then 6
}
SHAPES = [("small-gpu", 37), ("U5-64thr", 37), ("U5-64thr-kt12", 37), ("U19", 150),
          ("U19-32thr", 150), ("U19-kt64", 150), ("U19-kt8", 150)]


@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("fit_name, H", SHAPES, ids=[f"{f}-H{h}" for f, h in SHAPES])
def test_emulation_equals_reference(fit_name, H, cell, bias, B, T):
    fit = FITS[fit_name](cell, H, B)
    assert fit.ok, fit.describe()
    assert H % fit.blocks != 0 and H % fit.units_per_block != 0, "want a partial last block"
    assert (fit.tiles > 1) == ("kt" in fit_name), fit.describe()   # one tile, or several
    data, ref = layer_case(cell, T, B, H, bias=bias)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        h, c, act = E.emulate(cell, fit, **data, train=True)
    # emulate's outputs start as NaN: an element no block writes fails here
    assert_close(h, ref["h"], 1e-12, 1e-12, name=f"{cell} h")
    if cell == "lstm":
        assert_close(c, ref["c"], 1e-12, 1e-12, name=f"{cell} c")
    else:
        assert c is None
    if ref["act"] is not None:
        assert_close(act, ref["act"], 1e-12, 1e-12, name=f"{cell} act")
    else:
        assert act is None
    if cell == "rnn_relu":
        assert 0 < (h[1:] > 0).mean() < 1, "the relu case must have both sides"
    assert E.emulate(cell, fit, **data, train=False)[2] is None


def test_fits_cover_the_kernels_variants():
    """The decompositions above exercise what v3 varies: one warp and several, one cell a
    thread and PK_CPT, one tile and several, idle k-groups (lane groups with no float4
    chunk of h_t to multiply). (LK = 1, a warp one k-group, needs B > 16: the partition
    tests and the kernel on CPU threads have it.)"""
    seen = {"warps": set(), "cpt": set(), "tiles": set(), "idle": set()}
    for fit_name, H in SHAPES:
        for cell in CELLS:
            for B in (1, 3):
                f = FITS[fit_name](cell, H, B)
                seen["warps"].add(f.warps > 1)
                seen["cpt"].add(f.cells_per_thread)
                seen["tiles"].add(f.tiles > 1)
                seen["idle"].add(any(len(E.k_columns(f, g)) == 0 for g in range(f.k_groups)))
    assert seen == {"warps": {False, True}, "cpt": {1, P.PK_CPT}, "tiles": {False, True},
                    "idle": {False, True}}, seen


@pytest.mark.parametrize("cell, H, B, props", [("lstm", 150, 3, H100), ("gru", 64, 16, SMALL)],
                         ids=["h100-lstm", "small-gru-2-tiles"])
def test_emulation_float32_within_fp32_tolerance(cell, H, B, props):
    fit = P.persistent_fit(cell, H, B, props)
    assert fit.ok, fit.describe()
    data, ref = layer_case(cell, 7, B, H, dtype=np.float32)
    h, c, act = E.emulate(cell, fit, **data)
    assert h.dtype == np.float32
    for name, got in (("h", h), ("c", c), ("act", act)):
        if ref[name] is None:
            assert got is None
        else:
            assert_close(got, ref[name], FP32_ATOL, FP32_RTOL, name=name)


def test_emulation_barrier_catches_a_broken_partition(monkeypatch):
    """If two blocks claimed the same unit (a wrong units()), the end-of-step check fails."""
    fit = P.geometry("rnn_tanh", 37, 3, 5)
    data, _ = layer_case("rnn_tanh", 2, 3, 37)
    monkeypatch.setattr(P.Fit, "units", lambda self, x: range(0, 5))
    with pytest.raises(AssertionError, match=r"written \d+ times"):
        E.emulate("rnn_tanh", fit, **data)


def test_emulation_rejects_a_fit_for_another_shape():
    data, _ = layer_case("gru", 2, 3, 37)
    with pytest.raises(ValueError, match="fit is for"):
        E.emulate("gru", P.geometry("gru", 36, 3, 5), **data)
    with pytest.raises(ValueError, match="fit is for"):
        E.emulate("gru", P.geometry("lstm", 37, 3, 5), **data)


# --- the partition ------------------------------------------------------------------------

PARTITIONS = [("lstm", 37, 1, 5, None, None), ("lstm", 37, 3, 7, None, 12),
              ("gru", 150, 3, 19, 64, 64), ("gru", 150, 3, 19, 64, 8),
              ("rnn_tanh", 150, 9, 19, None, None), ("lstm", 65, 13, 4, 96, 20),
              ("lstm", 512, 64, 4, None, None), ("gru", 1024, 64, 8, None, 344),
              ("rnn_relu", 1000, 5, 8, 256, 4), ("lstm", 33, 15, 33, None, None),
              ("lstm", 20, 33, 7, 128, None), ("rnn_tanh", 300, 300, 1, None, None)]


@pytest.mark.parametrize("cell, H, B, U, threads, k_tile", PARTITIONS)
def test_every_unit_and_element_owned_exactly_once(cell, H, B, U, threads, k_tile):
    """Units: consecutive, each block some, each unit one block. Cells: every (b, j) one
    thread, cell e = tid + i*threads (i < PK_CPT) of the block being (b, j) = (e / U, e % U).
    Columns: every k one k-group of the block, and in its own warp's chunks [w*CPW,
    (w+1)*CPW) of its tile (no warp reads columns another warp stages). Lanes: as the
    kernel numbers them, lane = (lk*LB + lb)*LR + lr and kg = warp*LK + lk; the LR x LB
    lanes of each k-group, each over RT x BT output tiles of PK_TM rows x PK_TB batches
    (rows rt*PK_TM*LR + lr + LR*i, batches bt*PK_TB*LB + lb + LB*i), cover every (row,
    batch) of the block's R slice x h_t product exactly once."""
    fit = P.geometry(cell, H, B, U, threads, k_tile=k_tile)
    assert fit.ok, fit.describe()
    units = [j for x in range(fit.blocks) for j in fit.units(x)]
    assert units == list(range(H)), "blocks must own consecutive units, each once"
    assert all(len(fit.units(x)) > 0 for x in range(fit.blocks)), "a block with no unit"
    assert (E.ownership(fit) == 1).all()
    assert fit.cells_per_thread == ceil(U * B, fit.threads) <= P.PK_CPT
    for x in range(fit.blocks):
        tid, b, jj = E.owned(fit, x)
        assert len(set(zip(b.tolist(), jj.tolist()))) == len(b), f"block {x}: an element twice"
        assert ((b * U + jj) % fit.threads == tid).all(), "cell e = tid + i*threads, b*U + jj"
        per_thread = np.bincount(tid, minlength=fit.threads)
        assert per_thread.max() <= fit.cells_per_thread, f"block {x}: > CPT cells a thread"
        if x == 0:
            assert per_thread.max() == fit.cells_per_thread
    lr_n, lb_n, lk_n = fit.lanes
    assert lr_n * lb_n * lk_n == 32 and fit.k_groups == fit.warps * lk_n
    owner = np.full(H, -1)
    for g in range(fit.k_groups):
        cols = E.k_columns(fit, g)
        assert len(set(cols.tolist())) == len(cols), f"k-group {g} sums a column twice"
        assert (owner[cols] == -1).all(), f"k-group {g} sums a column another one sums"
        owner[cols] = g
    assert (owner >= 0).all(), "every column k summed exactly once"
    chunk = (np.arange(H) % fit.k_tile) // 4          # float4 chunk of column k in its tile
    assert (owner // lk_n == chunk // fit.chunks_per_warp).all(), "a warp reads another's chunk"
    roles = E.thread_roles(fit)
    assert ((roles["lk"] * lb_n + roles["lb"]) * lr_n + roles["lr"] == roles["lane"]).all()
    assert (roles["kg"] == roles["warp"] * lk_n + roles["lk"]).all()
    assert np.bincount(roles["kg"]).tolist() == [lr_n * lb_n] * fit.k_groups
    M = fit.rows
    rt, bt = ceil(M, P.PK_TM * lr_n), ceil(B, P.PK_TB * lb_n)   # RT, BT
    for g in range(fit.k_groups):
        cover = np.zeros((M, B), np.int64)
        sel = roles["kg"] == g
        for lr, lb in zip(roles["lr"][sel], roles["lb"][sel]):
            r = (np.arange(rt)[:, None] * P.PK_TM * lr_n + lr
                 + lr_n * np.arange(P.PK_TM)[None, :]).ravel()
            bb = (np.arange(bt)[:, None] * P.PK_TB * lb_n + lb
                  + lb_n * np.arange(P.PK_TB)[None, :]).ravel()
            np.add.at(cover, (r[r < M][:, None], bb[bb < B][None, :]), 1)
        assert (cover == 1).all(), f"k-group {g}: lanes cover (row, batch) {cover.min()}.." \
                                   f"{cover.max()} times"


def test_k_columns_follow_the_tiles():
    """k-group kg = w*LK + lk sums, tile by tile, the chunks of its warp's CPW = ceil(k_tile/4
    / warps) (clipped to the tile's CH chunks), in the two cp.async halves (the first
    ceil(n/2) chunks, then the rest), in each half every LK-th chunk from its start + lk, as
    pk_fma_span does; the last tile may be partial and its last chunk cut at H; a warp past
    the tile's chunks and a lane group past a half's have none. Values by hand."""
    f = P.geometry("lstm", 512, 64, 4)                 # LK 1: a k-group is a warp
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((4, 8, 1), 8, 16, 1)
    assert E.k_columns(f, 0).tolist() == list(range(0, 64))
    assert E.k_columns(f, 7).tolist() == list(range(448, 512))
    # M 20: lanes 8 x 4 x 1; 4 warps, CPW ceil(3 / 4) = 1; tiles of 12, 12, 12, 1 columns
    f = P.geometry("lstm", 37, 32, 5, threads=128, k_tile=12)
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((8, 4, 1), 4, 1, 4)
    assert E.k_columns(f, 0).tolist() == chunk_cols(0, 3, 6) + [36]
    assert E.k_columns(f, 1).tolist() == chunk_cols(1, 4, 7)
    assert E.k_columns(f, 2).tolist() == chunk_cols(2, 5, 8)
    assert E.k_columns(f, 3).tolist() == [], "warp 3 has no chunk of a 3-chunk tile"
    # M 16, B 16: lanes 4 x 2 x 4; 2 warps, CPW 8 (halves of 4); tiles of 64, 36 columns
    f = P.geometry("lstm", 100, 16, 4, threads=64, k_tile=64)
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((4, 2, 4), 8, 8, 2)
    assert E.k_columns(f, 0).tolist() == chunk_cols(0, 4, 16, 20)    # tile 1 is chunks 16..24
    assert E.k_columns(f, 3).tolist() == chunk_cols(3, 7, 19, 23)
    assert E.k_columns(f, 4).tolist() == chunk_cols(8, 12, 24)       # warp 1: tile 1's last chunk
    assert E.k_columns(f, 5).tolist() == chunk_cols(9, 13)
    # M 5, B 1: lanes 2 x 1 x 16; 2 warps, CPW 5 in halves of 3 and 2: each half starts
    # its lane groups afresh (chunk 3 is lane group 0's, not 3's)
    f, _ = cancelling_case()
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((2, 1, 16), 32, 5, 1)
    want = {0: chunk_cols(0, 3), 1: chunk_cols(1, 4), 2: chunk_cols(2), 3: [], 15: [],
            16: chunk_cols(5, 8), 17: chunk_cols(6) + [36], 18: chunk_cols(7), 19: [], 31: []}
    assert {g: E.k_columns(f, g).tolist() for g in want} == want
    f = P.geometry("rnn_tanh", 37, 1, 5, threads=64, k_tile=64)    # wider than H: one tile
    assert f.tiles == 1
    assert sorted(np.concatenate([E.k_columns(f, g) for g in range(f.k_groups)]).tolist()) == \
        list(range(37))


def test_geometry_follows_the_kernel_formulas():
    """Lanes LR = min(PK_LR_MAX, pow2ceil(ceil(M / PK_TM))), LB = min(32 / LR, pow2ceil(ceil(B /
    PK_TB))), LK = 32 / (LR*LB); NKG = warps * LK; CPW = ceil(k_tile/4 / warps); strides SR
    = pk_stride_r(H), SH = pk_stride_r(k_tile), BP = 32*ceil((B - LB) / 32) + LB; shared
    memory 4 * (M*SR + B*SH + NKG*M*BP) bytes: values by hand from the .cu header."""
    assert P.stride_r(512) == 516 and P.stride_r(37) == 4 * 11 and P.stride_r(33) == 36
    # the h tile's row stride: k_tile as an odd number of float4s
    assert [P.tile_stride(k) for k in (4, 8, 12, 64, 512, 344)] == [4, 12, 12, 68, 516, 348]
    assert P.full_tile(37) == 40 and P.full_tile(512) == 512
    assert P.lane_grid(4, 4, 64) == (4, 8, 1) and P.lane_grid(1, 1, 300) == (1, 32, 1)
    assert P.lane_grid(3, 3, 5) == (4, 1, 8) and P.lane_grid(4, 19, 3) == (16, 1, 2)
    assert [P.partial_stride(64, 8), P.partial_stride(5, 1), P.partial_stride(1, 1),
            P.partial_stride(64, 4), P.partial_stride(300, 32)] == [72, 33, 1, 68, 320]
    # the paper's LSTM block: M 16, lanes 4 x 8 x 1, 8 warps = 8 k-groups, BP 72
    f = P.geometry("lstm", 512, 64, 4)
    assert (f.threads, f.rows, f.lanes, f.k_groups, f.k_split) == (256, 16, (4, 8, 1), 8, 8)
    assert (f.k_tile, f.tiles, f.chunks_per_warp, f.cells_per_thread) == (512, 1, 16, 1)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (4 * 16 * 516, 4 * 64 * 516,
                                                         4 * 8 * 16 * 72)
    assert f.smem_bytes == 201984 and f.block == (256, 1, 1) and f.grid == (128, 1, 1)
    f = P.geometry("lstm", 512, 64, 4, k_tile=64)      # v1's tiles: stride 68
    assert (f.tiles, f.k_groups, f.chunks_per_warp, f.smem_tile) == (8, 8, 2, 4 * 64 * 68)
    f = P.geometry("lstm", 512, 64, 4, k_tile=8)       # 2 chunks a tile: 6 warps idle
    assert (f.k_groups, f.chunks_per_warp, f.smem_tile) == (8, 1, 4 * 64 * 12)
    # GRU M 9: LR 4 (ceil(9/4) = 3 -> 4), B 5: LB 1, LK 8; BP 33
    f = P.geometry("gru", 40, 5, 3)
    assert (f.threads, f.rows, f.lanes, f.k_groups, f.chunks_per_warp) == (256, 9, (4, 1, 8),
                                                                           64, 2)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (4 * 9 * 44, 4 * 5 * 44,
                                                         4 * 64 * 9 * 33)
    f = P.geometry("gru", 40, 5, 3, threads=64)
    assert (f.k_groups, f.chunks_per_warp, f.smem_partials) == (16, 5, 4 * 16 * 9 * 33)
    f = P.geometry("rnn_tanh", 37, 3, 5, threads=32, k_tile=12)   # M 5: lanes 2 x 1 x 16
    assert (f.lanes, f.k_groups, f.tiles, f.chunks_per_warp) == ((2, 1, 16), 16, 4, 3)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (4 * 5 * 44, 4 * 3 * 12,
                                                         4 * 16 * 5 * 33)
    f = P.geometry("lstm", 1024, 64, 8)                # M 32: lanes 8 x 4 x 1; 2 cells
    assert (f.lanes, f.k_groups, f.cells_per_thread) == ((8, 4, 1), 8, 2)
    assert (f.smem_r, f.smem_partials) == (4 * 32 * 1028, 4 * 8 * 32 * 68)
    f = P.geometry("rnn_tanh", 300, 300, 1)            # M 1, LB capped at 32: 2 batch tiles
    assert (f.lanes, f.k_groups, f.cells_per_thread) == ((1, 32, 1), 8, 2)
    assert f.smem_partials == 4 * 8 * 1 * 320
    assert P.geometry("lstm", 512, 64, 4, max_threads=128).threads == 128
    # what the kernel traps on, refused here
    f = P.geometry("lstm", 512, 64, 4, threads=48)
    assert not f.ok and "not whole warps" in f.reason
    f = P.geometry("lstm", 512, 64, 4, threads=512)
    assert not f.ok and "the 256 a block may have" in f.reason
    f = P.geometry("lstm", 512, 64, 4, threads=64)     # 256 cells > 2 x 64
    assert not f.ok and "256 cells > 2 a thread x 64 threads" in f.reason
    assert P.geometry("lstm", 512, 32, 4, threads=64).ok   # 128 cells: 2 a thread
    f = P.geometry("lstm", 512, 64, 4, k_tile=6)
    assert not f.ok and "k_tile 6 is not a multiple of 4" in f.reason
    with pytest.raises(ValueError, match="units_per_block"):
        P.geometry("lstm", 512, 64, 0)
    with pytest.raises(ValueError, match="k_tile"):
        P.geometry("lstm", 512, 64, 4, k_tile=0)
    with pytest.raises(ValueError, match="batch must be a positive int, got True"):
        P.geometry("lstm", 512, True, 4)


# --- the cluster kernels' decomposition ------------------------------------------------

def test_cluster_geometry_emulation_matches_the_reference():
    """The cluster decomposition in NumPy (each cluster its batch slice, each rank its
    units, all of R per cluster): equal to the float64 reference; every element of h_{t+1}
    written by exactly one thread of the grid."""
    for cell in CELLS:
        T, B, H = 3, 19, 37
        data, ref = layer_case(cell, T, B, H)
        f = P.geometry(cell, H, B, ceil(H, P.PK_CLUSTER), 64, k_tile=P.full_tile(H),
                       clusters=3)
        assert f.ok and f.blocks == 24, f.describe()
        assert (E.ownership(f) == 1).all()
        h, c, act = E.emulate(cell, f, **data)
        assert_close(h, ref["h"], 1e-12, 1e-12, name=f"{cell} h")
