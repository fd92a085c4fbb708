"""The persistent kernels (cuda_src/persistent.cu v3, rnnrt/persistent.py), checked without a GPU.

- the NumPy emulation of the kernels' decomposition (block by block, step by step) equals
  ``reference.forward`` for one layer: every cell, with and without bias, odd H not divisible
  by the block count, B = 1 and 3, T = 1 and 7, h_t in one tile or in several (k_tile 8, 12,
  64, the last tile partial), 4 to 32 k-groups (idle ones included), one cell a thread or
  two;
- the registry's twins, on padded views of one NaN-poisoned buffer with ld-0 biases, write
  exactly their outputs (slots 1..T), leave h0, c0 and the zero sync counters alone;
- every hidden unit, every (b, j) (at most PK_CPT a thread) and every column k (once per
  block, in its warp's own chunks) is owned exactly once; a warp's lanes (LR x LB x LK, the
  kernel's formulas) cover every (row, batch) of the R slice x h_t product once per k-group;
  the geometry (lanes, k-groups, strides, shared memory) equals hand-computed values;
- the fit on an H100's properties at the paper's sizes (256 threads, all of h_t in one tile
  where it fits, else the fewest even tiles), its choice of block among BLOCK_SIZES (fewest
  tiles, then at most KG_MAX k-groups, then the largest), on a small made-up GPU and with
  fewer registers (registers cap the block, shared memory shrinks the block or the tile,
  U*B > PK_CPT*threads is refused), and the k_tile knob (refused unless a multiple of 4, or
  when its tile does not fit);
- the registry's shapes, arguments and launch of persistent kernels (a stand-in for CuPy);
- the .cu compiles for sm_90 with nvcc and NVRTC, ptxas reports no spills and no more
  registers than the fit assumes (__launch_bounds__(256, 1)); its constants and its
  decomposition formulas are rnnrt.persistent's; the PTX stages h_t with 16-byte cp.async
  (and a 4-byte fallback), multiplies the first half of its chunks while the second is in
  flight, prefetches gx before the grid barrier, whose fences are acq_rel and whose spin is
  a relaxed load; the SASS keeps LDGSTS and no MEMBAR.SC;
- the .cu itself on CPU threads (tests/persistent_host_sim.cpp): equals the reference and the
  emulation with 16-byte staging (cp.async) and with the 4-byte fallback (H or ldh not
  multiples of 4, h misaligned), in one tile and in several, with several output tiles a lane
  and two cells a thread; on data where the grouping decides the result it sums the
  k-groups ``k_columns`` says; ThreadSanitizer finds no race; a geometry that disagrees with
  the arguments (k_tile included) traps.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rnnrt import kernels as K
from rnnrt import persistent as P
from rnnrt import reference
from rnnrt.cells import get_cell
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.exec import kernels_np as knp
from rnnrt.limits import H100_SXM
from rnnrt.ops import View
from rnnrt.stack import PS_REGS, STACK_KERNEL
from test_kernels_cpu import _FakeCupy, _find_nvrtc, _nvrtc_compile

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
# the per-layer persistent kernels (the stack kernel, all layers in one launch, has its own
# arguments and tests: tests/test_stack_cpu.py)
PERSISTENT = [k.name for k in K.REGISTRY if k.persistent and k.name != STACK_KERNEL]
GRID_KERNELS = [n for n in PERSISTENT if "_cluster" not in n]      # the grid barrier kernels
CLUSTER_KERNELS = [n for n in PERSISTENT if "_cluster" in n]

# cupy.cuda.runtime.getDeviceProperties of an H100 80GB HBM3 (the keys the fit reads)
H100 = dict(multiProcessorCount=132, sharedMemPerBlockOptin=232448,
            sharedMemPerMultiprocessor=233472, reservedSharedMemPerBlock=1024,
            maxThreadsPerBlock=1024, maxThreadsPerMultiProcessor=2048,
            regsPerMultiprocessor=65536, regsPerBlock=65536)
# a small made-up GPU: 6 SMs, 48 KB of shared memory a block, half the registers
SMALL = dict(multiProcessorCount=6, sharedMemPerBlockOptin=49152,
             sharedMemPerMultiprocessor=65536, reservedSharedMemPerBlock=1024,
             maxThreadsPerBlock=512, maxThreadsPerMultiProcessor=1024,
             regsPerMultiprocessor=32768, regsPerBlock=32768)


# --- one layer: data and the float64 reference ------------------------------------------

def layer_case(cell, T, B, H, I=5, bias=True, seed=0, dtype=np.float64):
    """One layer's inputs as the kernel takes them (gx = W x without bias) and the
    reference's h [T+1, B, H], c, act."""
    rng = np.random.default_rng(seed)
    spec = get_cell(cell)
    G = spec.gates
    u = lambda *shape: rng.uniform(-0.6, 0.6, shape)   # noqa: E731 - out of the linear range
    p = {"weight_ih": u(G * H, I), "weight_hh": u(G * H, H),
         "bias_ih": u(G * H) if bias else None, "bias_hh": u(G * H) if bias else None}
    x = rng.standard_normal((T, B, I))
    h0 = 0.5 * rng.standard_normal((B, H))
    c0 = 0.5 * rng.standard_normal((B, H)) if spec.has_cell_state else None
    _, _, _, cache = reference.forward(cell, [p], x, h0[None],
                                       None if c0 is None else c0[None])
    lc = cache.layers[0]
    ref = {"h": lc.h, "c": lc.c, "act": lc.gates}
    gx = x @ p["weight_ih"].T
    cast = lambda a: None if a is None else np.asarray(a, dtype)   # noqa: E731
    return dict(gx=cast(gx), R=cast(p["weight_hh"]), bw=cast(p["bias_ih"]),
                br=cast(p["bias_hh"]), h0=cast(h0), c0=cast(c0)), ref


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
        h, c, act = P.emulate(cell, fit, **data, train=True)
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
    assert P.emulate(cell, fit, **data, train=False)[2] is None


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
                seen["idle"].add(any(len(P.k_columns(f, g)) == 0 for g in range(f.k_groups)))
    assert seen == {"warps": {False, True}, "cpt": {1, P.PK_CPT}, "tiles": {False, True},
                    "idle": {False, True}}, seen


@pytest.mark.parametrize("cell, H, B, props", [("lstm", 150, 3, H100), ("gru", 64, 16, SMALL)],
                         ids=["h100-lstm", "small-gru-2-tiles"])
def test_emulation_float32_within_fp32_tolerance(cell, H, B, props):
    fit = P.persistent_fit(cell, H, B, props)
    assert fit.ok, fit.describe()
    data, ref = layer_case(cell, 7, B, H, dtype=np.float32)
    h, c, act = P.emulate(cell, fit, **data)
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
        P.emulate("rnn_tanh", fit, **data)


def test_emulation_rejects_a_fit_for_another_shape():
    data, _ = layer_case("gru", 2, 3, 37)
    with pytest.raises(ValueError, match="fit is for"):
        P.emulate("gru", P.geometry("gru", 36, 3, 5), **data)
    with pytest.raises(ValueError, match="fit is for"):
        P.emulate("gru", P.geometry("lstm", 37, 3, 5), **data)


# --- the partition ------------------------------------------------------------------------

PARTITIONS = [("lstm", 37, 1, 5, None, None), ("lstm", 37, 3, 7, None, 12),
              ("gru", 150, 3, 19, 64, 64), ("gru", 150, 3, 19, 64, 8),
              ("rnn_tanh", 150, 9, 19, None, None), ("lstm", 65, 13, 4, 96, 20),
              ("lstm", 512, 64, 4, None, None), ("gru", 1024, 64, 8, None, 344),
              ("rnn_relu", 1000, 5, 8, 256, 4), ("lstm", 33, 15, 33, None, None),
              ("lstm", 20, 33, 7, 128, None), ("rnn_tanh", 300, 300, 1, None, None)]


def _ceil(a, b):
    return -(-a // b)


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
    assert (P.ownership(fit) == 1).all()
    assert fit.cells_per_thread == _ceil(U * B, fit.threads) <= P.PK_CPT
    for x in range(fit.blocks):
        tid, b, jj = P.owned(fit, x)
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
        cols = P.k_columns(fit, g)
        assert len(set(cols.tolist())) == len(cols), f"k-group {g} sums a column twice"
        assert (owner[cols] == -1).all(), f"k-group {g} sums a column another one sums"
        owner[cols] = g
    assert (owner >= 0).all(), "every column k summed exactly once"
    chunk = (np.arange(H) % fit.k_tile) // 4          # float4 chunk of column k in its tile
    assert (owner // lk_n == chunk // fit.chunks_per_warp).all(), "a warp reads another's chunk"
    roles = P.thread_roles(fit)
    assert ((roles["lk"] * lb_n + roles["lb"]) * lr_n + roles["lr"] == roles["lane"]).all()
    assert (roles["kg"] == roles["warp"] * lk_n + roles["lk"]).all()
    assert np.bincount(roles["kg"]).tolist() == [lr_n * lb_n] * fit.k_groups
    M = fit.rows
    rt, bt = _ceil(M, P.PK_TM * lr_n), _ceil(B, P.PK_TB * lb_n)   # RT, BT
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


def _cols(*chunks):
    """The columns of float4 chunks (absolute: chunk c is columns 4c .. 4c+3)."""
    return [k for c in chunks for k in range(4 * c, 4 * c + 4)]


def test_k_columns_follow_the_tiles():
    """k-group kg = w*LK + lk sums, tile by tile, the chunks of its warp's CPW = ceil(k_tile/4
    / warps) (clipped to the tile's CH chunks), in the two cp.async halves (the first
    ceil(n/2) chunks, then the rest), in each half every LK-th chunk from its start + lk, as
    pk_fma_span does; the last tile may be partial and its last chunk cut at H; a warp past
    the tile's chunks and a lane group past a half's have none. Values by hand."""
    f = P.geometry("lstm", 512, 64, 4)                 # LK 1: a k-group is a warp
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((4, 8, 1), 8, 16, 1)
    assert P.k_columns(f, 0).tolist() == list(range(0, 64))
    assert P.k_columns(f, 7).tolist() == list(range(448, 512))
    # M 20: lanes 8 x 4 x 1; 4 warps, CPW ceil(3 / 4) = 1; tiles of 12, 12, 12, 1 columns
    f = P.geometry("lstm", 37, 32, 5, threads=128, k_tile=12)
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((8, 4, 1), 4, 1, 4)
    assert P.k_columns(f, 0).tolist() == _cols(0, 3, 6) + [36]
    assert P.k_columns(f, 1).tolist() == _cols(1, 4, 7)
    assert P.k_columns(f, 2).tolist() == _cols(2, 5, 8)
    assert P.k_columns(f, 3).tolist() == [], "warp 3 has no chunk of a 3-chunk tile"
    # M 16, B 16: lanes 4 x 2 x 4; 2 warps, CPW 8 (halves of 4); tiles of 64, 36 columns
    f = P.geometry("lstm", 100, 16, 4, threads=64, k_tile=64)
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((4, 2, 4), 8, 8, 2)
    assert P.k_columns(f, 0).tolist() == _cols(0, 4, 16, 20)    # tile 1 is chunks 16..24
    assert P.k_columns(f, 3).tolist() == _cols(3, 7, 19, 23)
    assert P.k_columns(f, 4).tolist() == _cols(8, 12, 24)       # warp 1: tile 1's last chunk
    assert P.k_columns(f, 5).tolist() == _cols(9, 13)
    # M 5, B 1: lanes 2 x 1 x 16; 2 warps, CPW 5 in halves of 3 and 2: each half starts
    # its lane groups afresh (chunk 3 is lane group 0's, not 3's)
    f, _ = _cancelling_case()
    assert (f.lanes, f.k_groups, f.chunks_per_warp, f.tiles) == ((2, 1, 16), 32, 5, 1)
    want = {0: _cols(0, 3), 1: _cols(1, 4), 2: _cols(2), 3: [], 15: [],
            16: _cols(5, 8), 17: _cols(6) + [36], 18: _cols(7), 19: [], 31: []}
    assert {g: P.k_columns(f, g).tolist() for g in want} == want
    f = P.geometry("rnn_tanh", 37, 1, 5, threads=64, k_tile=64)    # wider than H: one tile
    assert f.tiles == 1
    assert sorted(np.concatenate([P.k_columns(f, g) for g in range(f.k_groups)]).tolist()) == \
        list(range(37))


def _cancelling_case():
    """rnn_tanh H 37, B 2, U 5, 64 threads, one tile of 40: lanes 2 x 1 x 16, 32 k-groups;
    warp 0 owns chunks 0..4, halves 0..2 and 3..4, so k-group 0 sums chunks 0 and 3 and
    k-group 1 chunks 1 and 4. Every row of R has 1e8, -1e8, 1 in columns 0, 4, 12 (chunks 0,
    1, 3) and 1e8, 1, -1e8 in columns 1, 5, 13 (the same chunks); h0 is 1 in the first three
    for batch 0 and in the second three for batch 1, 0 elsewhere. Batch 0: k-group 0 rounds
    1e8 + 1 to 1e8 in float32, k-group 1 cancels it: h_1 = tanh(0) = 0. Batch 1: k-group 0
    cancels exactly, k-group 1 adds 1: h_1 = tanh(1). Had chunk 3 been k-group 3's (lane
    groups running on through both halves), the two batches would swap; had R been
    ignored, both would be 0."""
    fit = P.geometry("rnn_tanh", 37, 2, 5, threads=64)
    R = np.zeros((37, 37), np.float32)
    R[:, [0, 4, 12]] = [1e8, -1e8, 1]
    R[:, [1, 5, 13]] = [1e8, 1, -1e8]
    h0 = np.zeros((2, 37), np.float32)
    h0[0, [0, 4, 12]] = 1
    h0[1, [1, 5, 13]] = 1
    data = dict(gx=np.zeros((1, 2, 37), np.float32), R=R, bw=None, br=None, h0=h0, c0=None)
    return fit, data


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


# --- the fit ------------------------------------------------------------------------------

def test_fit_h100_lstm_paper_sizes():
    """256 threads (8 warps, lanes 4 x 8 x 1: 8 k-groups) and all of h_t in one tile at
    H 512: 64 x 516 floats = 132 KB of tile beside 33 KB of R and 36 KB of partial sums; at
    H 1024 R takes 128 KB and the partial sums 68 KB (M 32: lanes 8 x 4 x 1, BP 68), and h_t
    comes in 9 tiles of 116 columns (64 x 116 floats = 29 KB; 8 tiles of 128 would need
    64 x 132); 512 cells need all 256 threads, 2 a thread. At H 2048 R alone is 512 KiB."""
    f = P.persistent_fit("lstm", 512, 64, H100)
    assert f.ok, f.describe()
    assert (f.units_per_block, f.blocks, f.threads, f.k_groups) == (4, 128, 256, 8)
    assert (f.lanes, f.cells_per_thread, f.k_tile, f.tiles) == ((4, 8, 1), 1, 512, 1)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (33024, 132096, 36864)
    assert f.smem_bytes == 201984 and f.kernel == "lstm_persistent_fwd"
    assert f.grid == (128, 1, 1) and f.block == (256, 1, 1)
    assert "k_tile 512 (1 tile a step)" in f.describe() and "1 tile of h_t" in f.reason
    assert "201,984" in SRC, "the .cu header's example is this fit"
    f = P.persistent_fit("lstm", 1024, 64, H100)
    assert f.ok, f.describe()
    assert (f.units_per_block, f.blocks, f.threads, f.k_groups) == (8, 128, 256, 8)
    assert (f.lanes, f.cells_per_thread) == ((8, 4, 1), 2)
    assert (f.k_tile, f.tiles) == (116, 9)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (131584, 29696, 69632)
    assert f.smem_bytes == 230912
    assert P.geometry("lstm", 1024, 64, 8, k_tile=128).smem_bytes > _limit(H100)
    f = P.persistent_fit("lstm", 2048, 64, H100)
    assert not f.ok
    assert "R slice alone is 4 gates x 16 units x 2048" in f.reason and "512 KiB" in f.reason
    assert "232448" in f.reason and "narrowest h tile (4 columns)" in f.reason, f.reason


@pytest.mark.parametrize("cell, H, lanes, tiles, k_tile, smem", [
    ("gru", 512, (4, 8, 1), 1, 512, 24768 + 132096 + 27648),      # M 12
    ("rnn_tanh", 512, (1, 8, 4), 1, 512, 8256 + 132096 + 36864),   # M 4: 32 k-groups
    ("rnn_relu", 512, (1, 8, 4), 1, 512, 8256 + 132096 + 36864),
    ("gru", 1024, (8, 4, 1), 4, 256, 98688 + 66560 + 52224),       # 3 x 344 would not fit
    ("rnn_tanh", 1024, (2, 8, 2), 2, 512, 32896 + 132096 + 36864)])
def test_fit_h100_other_cells_b64(cell, H, lanes, tiles, k_tile, smem):
    """Batch 64 on an H100: U = ceil(H / 132), 256 threads, the fewest even tiles; lanes,
    tiles and shared memory (R + tile + partial sums) by hand from the .cu header."""
    f = P.persistent_fit(cell, H, 64, H100)
    assert f.ok, f.describe()
    assert (f.threads, f.lanes, f.tiles, f.k_tile, f.smem_bytes) == \
        (256, lanes, tiles, k_tile, smem), f.describe()


@pytest.mark.parametrize("cell, H, B, why", [
    ("gru", 512, 64, None), ("gru", 1024, 64, None), ("gru", 2048, 64, "R slice"),
    ("rnn_tanh", 2048, 32, None), ("rnn_tanh", 2048, 64, "1024 cells > 2 a thread"),
    ("rnn_relu", 4096, 64, "R slice"), ("lstm", 100, 64, None), ("lstm", 512, 128, None),
    ("lstm", 512, 129, "516 cells > 2 a thread"), ("lstm", 1024, 256, "2048 cells"),
    ("lstm", 1024, 512, "4096 cells"), ("lstm", 512, 1, None), ("lstm", 37, 3, None),
    ("rnn_relu", 1000, 5, None)])
def test_fit_h100_other_shapes(cell, H, B, why):
    """What fits an H100 and why the rest does not: R past shared memory, or more (b, j)
    cells a block (U * B) than PK_CPT = 2 for each of at most 256 threads."""
    f = P.persistent_fit(cell, H, B, H100)
    assert f.ok == (why is None), f.describe()
    assert f.blocks <= 132 and f.threads in P.BLOCK_SIZES
    if f.ok:
        assert f.smem_bytes + 1024 <= 233472 and f.smem_bytes <= 232448
        assert f.units_per_block * B <= P.PK_CPT * f.threads
        assert (P.ownership(f) == 1).all()
    else:
        assert why in f.reason and "DOES NOT FIT" in f.describe(), f.reason


def _limit(props):
    return min(props["sharedMemPerBlockOptin"],
               props["sharedMemPerMultiprocessor"] - props["reservedSharedMemPerBlock"])


def _blocks_allowed(props, regs=255):
    """BLOCK_SIZES the device takes at ``regs`` registers a thread (per warp rounded up to
    256) and at most 256 threads."""
    per_warp = _ceil(regs * 32, 256) * 256
    cap = min(P.PK_MAX_THREADS, props["maxThreadsPerBlock"],
              props["maxThreadsPerMultiProcessor"])
    return [t for t in P.BLOCK_SIZES if t <= cap and regs * t <= props["regsPerBlock"]
            and (t // 32) * per_warp <= props["regsPerMultiprocessor"]]


@pytest.mark.parametrize("props", [H100, SMALL, dict(H100, multiProcessorCount=396)],
                         ids=["h100", "small", "3xSMs"])
def test_fit_takes_the_fewest_even_tiles_that_fit(props):
    """Every automatic k_tile fits, one tile fewer would not, on any block the device takes
    (none with fewer tiles holds the U * B cells and fits), and the tiles are even:
    k_tile = ceil(H / tiles) rounded up to 4 (no wider than needed for that many)."""
    limit, seen = _limit(props), set()
    blocks = _blocks_allowed(props)
    for cell in ("lstm", "gru", "rnn_tanh"):
        for H in (64, 96, 128, 150, 208, 512, 1000, 1024, 2048, 4096):   # 96, 208: several
            for B in (1, 3, 16, 64, 256):                                # tiles on SMALL
                f = P.persistent_fit(cell, H, B, props)
                if not f.ok:
                    continue
                assert f.smem_bytes <= limit and f.threads in blocks
                assert f.k_tile == P.full_tile(-(-H // f.tiles)), f.describe()
                if f.tiles > 1:
                    for t in blocks:
                        wider = P.geometry(cell, H, B, f.units_per_block, t,
                                           k_tile=P.full_tile(-(-H // (f.tiles - 1))))
                        assert not wider.ok or wider.smem_bytes > limit, \
                            (f.describe(), wider.describe())
                seen.add(f.tiles > 1)
    assert seen == {True, False}, "want shapes with one tile and with several"


def test_fit_chooses_the_block():
    """Of BLOCK_SIZES: the fewest tiles first, then at most KG_MAX k-groups, then the
    largest block. By hand: LSTM 512 B 64: one tile on every block, 8 k-groups at 256: 256.
    LSTM 512 B 1 (lanes 4 x 1 x 8): 64 k-groups at 256 threads, 32 at 128: 128. RNN H 37
    B 3 (lanes 1 x 1 x 32): 32 k-groups a warp: one warp. LSTM 2048 B 64 on 528 SMs (U 4):
    256 threads need 9 tiles of 228 (R 131,328 + partials 8 x 16 x 72 x 4 = 36,864 bytes
    leave 64,256: 64 x 228 floats, not 64 x 260), 128 threads 7 of 296 (partials 18,432
    leave 82,688: 64 x 300 floats, not 64 x 348): 128. LSTM 1024 B 64:
    64 threads would take 4 tiles, but 512 cells need 256 threads."""
    assert P.BLOCK_SIZES == tuple(sorted(P.BLOCK_SIZES, reverse=True))
    assert P.BLOCK_SIZES[0] == P.PK_MAX_THREADS and all(t % 32 == 0 for t in P.BLOCK_SIZES)
    assert P.KG_MAX == 32
    f = P.persistent_fit("lstm", 512, 64, H100)
    assert (f.threads, f.k_groups, f.tiles) == (256, 8, 1)
    f = P.persistent_fit("lstm", 512, 1, H100)
    assert f.ok and (f.threads, f.lanes, f.k_groups, f.tiles) == (128, (4, 1, 8), 32, 1)
    f = P.persistent_fit("rnn_tanh", 37, 3, H100)
    assert f.ok and (f.threads, f.lanes, f.k_groups) == (32, (1, 1, 32), 32)
    f = P.persistent_fit("lstm", 2048, 64, dict(H100, multiProcessorCount=528))
    assert f.ok, f.describe()
    assert (f.units_per_block, f.blocks, f.threads, f.k_groups) == (4, 512, 128, 4)
    assert (f.k_tile, f.tiles, f.smem_bytes) == (296, 7, 131328 + 64 * 300 * 4 + 18432)
    g = P.persistent_fit("lstm", 2048, 64, dict(H100, multiProcessorCount=528), threads=256)
    assert g.ok and (g.k_tile, g.tiles) == (228, 9), g.describe()
    f = P.persistent_fit("lstm", 1024, 64, H100)
    assert (f.threads, f.tiles) == (256, 9)
    g = P.persistent_fit("lstm", 1024, 64, H100, threads=64)
    assert not g.ok and g.tiles == 4 and "512 cells > 2 a thread x 64 threads" in g.reason


def test_fit_k_tile_knob():
    """A given k_tile is used as is (the block is still chosen): narrow tiles do not shrink
    the k-groups (v3's warps own chunks; with k_tile 8, 2 chunks a tile, 6 of 8 warps stage
    and multiply nothing); refused unless a multiple of 4 or when its tile does not fit."""
    f = P.persistent_fit("lstm", 512, 64, H100, k_tile=64)
    assert f.ok and (f.k_tile, f.tiles, f.k_groups, f.threads) == (64, 8, 8, 256)
    assert f.smem_tile == 4 * 64 * 68 and f.chunks_per_warp == 2
    f = P.persistent_fit("lstm", 512, 64, H100, k_tile=8)
    assert f.ok and (f.k_tile, f.tiles, f.k_groups, f.chunks_per_warp) == (8, 64, 8, 1), \
        f.describe()
    f = P.persistent_fit("lstm", 512, 64, H100, k_tile=6)
    assert not f.ok and "k_tile 6 is not a multiple of 4" in f.reason, f.reason
    f = P.persistent_fit("lstm", 1024, 64, H100, k_tile=1024)  # 263 KB of tile: too much
    assert not f.ok and "the h tile of 1024 columns" in f.reason and "232448" in f.reason
    f = P.persistent_fit("lstm", 150, 3, H100, k_tile=1024)    # wider than H: one tile
    assert f.ok and f.tiles == 1 and f.smem_tile == 4 * 3 * P.tile_stride(1024)


def test_fit_threads_256_where_the_registers_allow():
    """__launch_bounds__(256, 1): at NVCC_REGS (255) registers a thread, 256 threads fill an
    H100 SM's 64 K registers (8 warps x 8192). With fewer registers an SM, or more a
    thread than the device has room for at 256, the default block is the largest of
    BLOCK_SIZES they allow (not a size between them), instead of a refusal; a block asked
    for that they do not allow, or a shape whose cells need more threads, is refused."""
    assert P.PK_MAX_THREADS == 256 and max(P.BLOCK_SIZES) == 256
    assert set(P.NVCC_REGS) == set(CELLS) and max(P.NVCC_REGS.values()) <= 255
    f = P.persistent_fit("lstm", 512, 64, H100)
    assert f.ok and (f.threads, f.regs_per_thread) == (256, 255)
    half = dict(H100, regsPerMultiprocessor=32768, regsPerBlock=32768)
    f = P.persistent_fit("lstm", 512, 64, half)                      # 4 warps of 8192
    assert f.ok and (f.threads, f.k_groups, f.smem_bytes) == (128, 4, 183552), f.describe()
    f = P.persistent_fit("lstm", 512, 64, half, regs_per_thread=168)  # 6 warps of 5376
    assert f.ok and f.threads == 128, f.describe()                   # 192: not a block size
    f = P.persistent_fit("lstm", 512, 64, half, regs_per_thread=128)  # 8 warps of 4096
    assert f.ok and f.threads == 256, f.describe()
    f = P.persistent_fit("lstm", 512, 64, H100, regs_per_thread=168)  # 12 warps: 256 fits
    assert f.ok and f.threads == 256, f.describe()
    f = P.persistent_fit("lstm", 512, 64, dict(H100, regsPerBlock=32768))   # 255 x 256 > 32 K
    assert f.ok and f.threads == 128, f.describe()
    f = P.persistent_fit("lstm", 512, 64, half, threads=256)         # asked for: refused
    assert not f.ok and "65536 registers > 32768 per SM" in f.reason, f.reason
    f = P.persistent_fit("lstm", 1024, 64, half)      # 512 cells need 256 threads
    assert not f.ok and "512 cells > 2 a thread" in f.reason, f.reason


def test_fit_small_gpu():
    """6 SMs, 48 KB of shared memory a block, 32 K registers (128 threads at 255): shared
    memory shrinks the block (LSTM 64 B 2: 128 threads' partial sums, 8 k-groups x 44 rows
    x 33, would not fit beside R) or the tile (GRU 96 B 16: 256 cells need 128 threads,
    whose partial sums leave room for 2 tiles of 48 columns, not 1 of 96); too many cells
    for 128 threads, R past 48 KB, a block too large for the registers and more blocks than
    SMs are refused."""
    f = P.persistent_fit("lstm", 64, 2, SMALL)
    assert f.ok, f.describe()
    # M 44: lanes 16 x 1 x 2 (LR capped at PK_LR_MAX 16), 2 warps: 4 k-groups
    assert (f.units_per_block, f.blocks, f.threads, f.lanes, f.tiles) == (11, 6, 64, (16, 1, 2), 1)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (4 * 44 * 68, 4 * 2 * 68, 4 * 4 * 44 * 33)
    assert P.geometry("lstm", 64, 2, 11, 128).smem_bytes > _limit(SMALL)
    f = P.persistent_fit("gru", 96, 16, SMALL)
    assert f.ok, f.describe()
    # M 48: lanes 16 x 2 x 1, 4 warps: 4 k-groups; BP 34; SR 4 * (24 | 1) = 100
    assert (f.units_per_block, f.threads, f.lanes, f.k_groups) == (16, 128, (16, 2, 1), 4)
    assert (f.k_tile, f.tiles, f.cells_per_thread) == (48, 2, 2)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (4 * 48 * 100, 4 * 16 * 52,
                                                         4 * 4 * 48 * 34)
    assert f.smem_bytes <= 49152 < P.geometry("gru", 96, 16, 16, 128, k_tile=96).smem_bytes
    f = P.persistent_fit("lstm", 64, 32, SMALL)
    assert not f.ok and "352 cells > 2 a thread x 128 threads" in f.reason, f.reason
    f = P.persistent_fit("lstm", 128, 32, SMALL)
    assert not f.ok and "R slice alone is 4 gates x 22 units x 128" in f.reason, f.reason
    f = P.persistent_fit("lstm", 512, 64, SMALL)
    assert not f.ok and "R slice alone" in f.reason
    f = P.persistent_fit("rnn_tanh", 64, 32, SMALL, threads=256)   # 256 x 255 registers
    assert not f.ok and "registers" in f.reason, f.describe()
    f = P.persistent_fit("rnn_tanh", 64, 32, SMALL, threads=256, regs_per_thread=128)
    assert f.ok, f.describe()
    f = P.persistent_fit("gru", 64, 3, SMALL, units_per_block=4)   # 16 blocks on 6 SMs
    assert not f.ok and "16 blocks of 4 units > 6 SMs" in f.reason
    f = P.persistent_fit("gru", 64, 3, SMALL, units_per_block=16)  # 4 blocks: allowed
    assert f.ok and f.blocks == 4


def test_fit_nothing_hard_coded():
    """The SM count comes from the properties: LSTM 2048 B 64 (refused on an H100) on three
    times the SMs needs 6 units a block, 192 KiB of R: 384 cells need 256 threads, whose
    partial sums (51 KiB) do not fit beside it, so it is still refused; on four times, 4
    units a block fit (in 7 tiles, test_fit_chooses_the_block)."""
    assert not P.persistent_fit("lstm", 2048, 64, H100).ok
    f = P.persistent_fit("lstm", 2048, 64, dict(H100, multiProcessorCount=396))
    assert not f.ok and f.units_per_block == 6 and f.blocks == 342, f.describe()
    assert "384 cells" in f.reason, f.reason
    assert P.geometry("lstm", 2048, 64, 6, 256, k_tile=4).smem_bytes > _limit(H100)
    f = P.persistent_fit("lstm", 2048, 64, dict(H100, multiProcessorCount=528))
    assert f.ok and f.units_per_block == 4 and f.blocks == 512 and f.tiles > 1, f.describe()


def test_check_steps():
    f = P.persistent_fit("lstm", 512, 64, H100)
    f.check_steps(1)
    f.check_steps(10**6)
    with pytest.raises(ValueError, match="overflow"):
        f.check_steps(2**32 // 128 + 2)
    with pytest.raises(ValueError, match="T = 0"):
        f.check_steps(0)


# --- the twins through the registry's views -----------------------------------------------

def _lay_out(kinfo, T, B, H, data, dtype, ld_pad=3, gap=5):
    """Every argument of one launch in one NaN-filled flat buffer: padded rows (ld > cols),
    gaps between views, biases with ld 0 (or the zeros buffer without bias), h[0] = h0 and
    c[0] = c0, sync zeros. -> (buf, {arg: (offset, rows, cols, ld)})"""
    scal = {"T": T, "units_per_block": 1, "k_tile": 4}
    out_shapes, in_shapes = kinfo.arg_shapes(B, H, **scal)
    place, off = {}, gap
    for (arg, _), (r, c) in zip(kinfo.outs + kinfo.ins, out_shapes + in_shapes):
        ld = 0 if arg in ("bw", "br") else c + ld_pad
        place[arg] = (off, r, c, ld)
        off += (r - 1) * ld + c + gap
    buf = np.full(off, np.nan, dtype)
    G = get_cell(kinfo.name.split("_persistent")[0]).gates
    fill = {"gx": data["gx"].reshape(T * B, G * H), "w_hh": data["R"]}
    for arg in ("bw", "br"):
        b = data["bw" if arg == "bw" else "br"]
        fill[arg] = (np.zeros(G * H) if b is None else b)[None]
    for arg, a in fill.items():
        o, r, c, ld = place[arg]
        knp.view(buf, o, a.shape[0], c, ld or c)[...] = a
    o, _, c, ld = place["h"]
    knp.view(buf, o, B, c, ld)[...] = data["h0"]
    if "c" in place:
        o, _, c, ld = place["c"]
        knp.view(buf, o, B, c, ld)[...] = data["c0"]
    o, _, c, ld = place["sync"]
    knp.view(buf, o, 1, c, ld)[...] = 0
    return buf, place


@pytest.mark.parametrize("k_tile", [40, 12], ids=["one-tile", "kt12"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", PERSISTENT)
def test_twin_on_poisoned_padded_views(name, bias, dtype, k_tile):
    kinfo = K.KERNELS[name]
    cell, cluster = name.split("_persistent")[0], "_cluster" in name
    # the cluster twin: 3 clusters of 7, 7 and 5 batches
    T, B, H, U = 7, (19 if cluster else 3), 37, 5
    data, ref = layer_case(cell, T, B, H, bias=bias)
    buf, place = _lay_out(kinfo, T, B, H, data, dtype)
    if cluster and k_tile < H:   # the cluster kernel keeps all of h_t: it traps on this
        before = buf.copy()
        outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
        ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
        with pytest.raises(ValueError, match=f"k_tile {k_tile} < hidden {H}"):
            kinfo.numpy_fn(B, H, outs, ins, T, U, k_tile)
        np.testing.assert_array_equal(buf, before, err_msg="wrote before refusing")
        return
    written = np.zeros(buf.size, bool)
    for arg, _ in kinfo.outs:
        o, r, c, ld = place[arg]
        first = B if arg in ("h", "c") else 0          # slot 0 is read, not written
        for i in range(first, r):
            written[o + i * ld:o + i * ld + c] = True
    before = buf.copy()
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    K.check_views(kinfo, B, H, [View("w", *place[a]) for a, _ in kinfo.outs],
                  [View("w", *place[a]) for a, _ in kinfo.ins],
                  {"T": T, "units_per_block": U, "k_tile": k_tile})
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        kinfo.numpy_fn(B, H, outs, ins, T, U, k_tile)
    tol = (1e-12, 1e-12) if dtype is np.float64 else (FP32_ATOL, FP32_RTOL)
    got = dict(zip((a for a, _ in kinfo.outs), outs))
    assert_close(got["h"], ref["h"].reshape((T + 1) * B, H), *tol, name=f"{name} h")
    if "c" in got:
        assert_close(got["c"], ref["c"].reshape((T + 1) * B, H), *tol, name=f"{name} c")
    if "act" in got:
        assert_close(got["act"], ref["act"].reshape(T * B, 4 * H), *tol, name=f"{name} act")
    assert (got["sync"] == 0).all(), "the sync counters must be left zero"
    np.testing.assert_array_equal(buf[~written], before[~written],
                                  err_msg=f"{name} wrote outside its outputs (or slot 0)")


def test_twin_refuses_dirty_sync_counters():
    kinfo = K.KERNELS["gru_persistent_fwd"]
    data, _ = layer_case("gru", 2, 3, 37)
    buf, place = _lay_out(kinfo, 2, 3, 37, data, np.float64)
    o = place["sync"][0]
    buf[o + 1] = 4
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    with pytest.raises(ValueError, match="sync counters must be zero"):
        kinfo.numpy_fn(3, 37, outs, ins, 2, 5, 40)


def test_twin_refuses_a_k_tile_the_kernel_traps_on():
    kinfo = K.KERNELS["rnn_tanh_persistent_fwd"]
    data, _ = layer_case("rnn_tanh", 2, 3, 37)
    buf, place = _lay_out(kinfo, 2, 3, 37, data, np.float64)
    before = buf.copy()
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    with pytest.raises(ValueError, match="k_tile 6 is not a multiple of 4"):
        kinfo.numpy_fn(3, 37, outs, ins, 2, 5, 6)
    np.testing.assert_array_equal(buf, before, err_msg="wrote before refusing")


# --- registry: shapes, arguments, launch --------------------------------------------------

def test_registry_shapes_use_the_scalars():
    kinfo = K.KERNELS["lstm_persistent_fwd"]
    assert kinfo.scalars == ("T", "units_per_block", "k_tile") and kinfo.uint_args == ("sync",)
    outs, ins = kinfo.arg_shapes(64, 512, T=100, units_per_block=4, k_tile=512)
    assert outs == [(101 * 64, 512), (101 * 64, 512), (100 * 64, 2048), (1, 2)]
    assert ins == [(100 * 64, 2048), (2048, 512), (64, 2048), (64, 2048)]
    outs, ins = K.KERNELS["rnn_relu_persistent_fwd"].arg_shapes(3, 5, T=2)
    assert outs == [(9, 5), (1, 2)] and ins == [(6, 5), (5, 5), (3, 5), (3, 5)]
    with pytest.raises(ValueError, match="need the scalar T"):
        kinfo.arg_shapes(3, 5)
    with pytest.raises(ValueError, match="names 'S'"):
        K.KernelInfo("x", "persistent.cu", outs=(("h", "S*R,C"),), ins=(), numpy_fn=None)
    with pytest.raises(ValueError, match="shape term"):
        K.KernelInfo("x", "persistent.cu", outs=(("h", "T+1*R,C"),), ins=(), numpy_fn=None)
    # several factors: the stack kernel's views of every layer at once
    stack = K.KERNELS[STACK_KERNEL]
    outs, ins = stack.arg_shapes(64, 512, T=100, L=4, units_per_block=16)
    assert outs == [(4 * 101 * 64, 512), (4 * 101 * 64, 512), (4 * 100 * 64, 2048), (1, 8),
                    (4 * 512, 2048), (5 * 101 * 512, 64)]   # + the scratch wt, ht
    assert ins == [(100 * 64, 512), (4, 4 * 512 * 512), (4, 4 * 512 * 512), (4, 2048),
                   (4, 2048)]


def test_kernel_args_persistent():
    kinfo = K.KERNELS["lstm_persistent_fwd"]
    B, H, T = 4, 8, 3
    outs = [(1000, H), (2000, H + 2), (3000, 4 * H), (4000, 2)]
    ins = [(5000, 4 * H), (6000, H), (7000, 0), (8000, 0)]
    scal = {"T": T, "units_per_block": 2, "k_tile": 8}
    args = K.kernel_args(kinfo, B, H, outs, ins, scal)
    assert len(args) == 2 + 2 * 8 + 3
    assert [type(a) for a in args[:2]] == [np.int32, np.int32]
    pairs = args[2:-3]
    assert all(type(p) is np.uint64 for p in pairs[::2])
    assert all(type(ld) is np.int32 for ld in pairs[1::2])
    assert [int(p) for p in pairs[::2]] == [p for p, _ in outs + ins]
    assert args[-3:] == (T, 2, 8) and all(type(a) is np.int32 for a in args[-3:])
    with pytest.raises(ValueError, match="takes scalars"):
        K.kernel_args(kinfo, B, H, outs, ins)
    with pytest.raises(ValueError, match="takes scalars"):
        K.kernel_args(kinfo, B, H, outs, ins, {"T": T, "units_per_block": 2})   # no k_tile
    with pytest.raises(ValueError, match="T = 0"):
        K.kernel_args(kinfo, B, H, outs, ins, dict(scal, T=0))
    with pytest.raises(ValueError, match="output h with ld 0"):
        K.kernel_args(kinfo, B, H, [(1000, 0)] + outs[1:], ins, scal)


def test_check_views_persistent():
    kinfo = K.KERNELS["rnn_tanh_persistent_fwd"]
    B, H, T = 3, 5, 4
    outs = [View("h", 0, (T + 1) * B, H, H), View("sync", 0, 1, 2, 2)]
    ins = [View("gx", 0, T * B, H, H), View("params", 0, H, H, H),
           View("params", 64, B, H, 0), View("zeros", 0, 1, H, 0)]
    scal = {"T": T, "units_per_block": 2, "k_tile": 8}
    K.check_views(kinfo, B, H, outs, ins, scal)
    with pytest.raises(ValueError, match=r"h is \[12, 5\], expected \[15, 5\].*T=4"):
        K.check_views(kinfo, B, H, [View("h", 0, T * B, H, H)] + outs[1:], ins, scal)


def test_launch_persistent(monkeypatch):
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    K._compile.cache_clear()
    try:
        lib = K.KernelLibrary()
        T = 100
        fit = P.persistent_fit("lstm", 1024, 64, H100)
        kinfo = K.KERNELS[fit.kernel]
        scal = {"T": T, "units_per_block": fit.units_per_block, "k_tile": fit.k_tile}
        out_shapes, in_shapes = kinfo.arg_shapes(64, 1024, **scal)
        pairs = [(4096 * (i + 1), c) for i, (_, c) in enumerate(out_shapes + in_shapes)]
        outs, ins = pairs[:kinfo.n_outs], pairs[kinfo.n_outs:]
        lib.launch_persistent(fit, outs, ins, T)
        name, grid, block, args = fake.launches[-1]
        assert (name, grid, block) == ("lstm_persistent_fwd", (128, 1, 1), (256, 1, 1))
        assert args[-3:] == (T, 8, 116) and args[:2] == (64, 1024), "T, U, k_tile last"
        assert fake.shared_mem[-1] == (name, 230912, 230912), "opt in past 48 KB, then launch"
        small = P.persistent_fit("rnn_tanh", 64, 8, H100)   # U 1: one warp (32 k-groups)
        assert small.ok and small.block == (32, 1, 1)
        assert small.smem_bytes <= P.DEFAULT_SHARED_BYTES
        sk = K.KERNELS[small.kernel]
        o, i = sk.arg_shapes(8, 64, T=T)
        pairs = [(4096 * (n + 1), c) for n, (_, c) in enumerate(o + i)]
        lib.launch_persistent(small, pairs[:2], pairs[2:], T)
        assert fake.launches[-1][3][-3:] == (T, 1, 64)
        assert fake.launches[-1][2] == (32, 1, 1)
        assert fake.shared_mem[-1] == ("rnn_tanh_persistent_fwd", small.smem_bytes, 0)

        n = len(fake.launches)
        with pytest.raises(ValueError, match="refused, does not fit: .*512 KiB"):
            lib.launch_persistent(P.persistent_fit("lstm", 2048, 64, H100), outs, ins, T)
        with pytest.raises(ValueError, match="overflow"):
            lib.launch_persistent(fit, outs, ins, 2**31 - 1)
        assert len(fake.launches) == n, "nothing launched after a refusal"
        with pytest.raises(ValueError, match="the fit is for gru_persistent_fwd"):
            kinfo.launch_persistent(P.persistent_fit("gru", 1024, 64, H100))
        with pytest.raises(ValueError, match="not a persistent kernel"):
            K.KERNELS["lstm_fwd"].launch_persistent(fit)
    finally:
        K._compile.cache_clear()


# --- the CUDA source: constants, compiling, resources -------------------------------------

SRC = K.source("persistent.cu")


def test_constants_match_the_kernel():
    """PK_TM, PK_TB, PK_CPT, PK_MAX_THREADS are rnnrt.persistent's; the kernel's geometry
    (pk_geometry), thread roles, cells, traps and shared-memory check are the formulas that
    geometry, lane_grid, partial_stride, thread_roles and owned mirror (tested against
    hand-computed values above); the v2 constants are gone."""
    define = lambda n: int(re.search(rf"#define {n} (\d+)", SRC)[1])   # noqa: E731
    assert define("PK_TM") == P.PK_TM and define("PK_TB") == P.PK_TB
    assert define("PK_CPT") == P.PK_CPT and define("PK_MAX_THREADS") == P.PK_MAX_THREADS
    assert define("PK_CLUSTER") == P.PK_CLUSTER and define("PK_LR_MAX") == P.PK_LR_MAX
    for gone in ("PK_KT", "PK_BT", "PK_LD", "KS_MAX", "sts128"):
        assert not re.search(rf"\b{gone}\b", SRC), f"v2's {gone} is still in the .cu"
    assert SRC.count("__launch_bounds__(PK_MAX_THREADS, 1)") == len(PERSISTENT) + 1   # + the stack kernel
    assert "return 4 * (((H + 3) / 4) | 1);" in SRC          # stride_r
    assert "g.SR = pk_stride_r(H);" in SRC and "g.SH = pk_stride_r(KT);" in SRC   # tile_stride
    # lane_grid, k-groups, CPW (Fit.chunks_per_warp), partial_stride
    for line in ("g.M = G * U;",
                 "g.LR = min(PK_LR_MAX, pk_pow2ceil((g.M + PK_TM - 1) / PK_TM));",
                 "g.LB = min(32 / g.LR, pk_pow2ceil((B + PK_TB - 1) / PK_TB));",
                 "g.LK = 32 / (g.LR * g.LB);",
                 "g.NW = nt / 32;",
                 "g.NKG = g.NW * g.LK;",
                 "g.CPW = (KT / 4 + g.NW - 1) / g.NW;",
                 "g.BP = 32 * ((B - g.LB + 31) / 32) + g.LB;",
                 # thread_roles
                 "const int lr = lane % g.LR, lb = (lane / g.LR) % g.LB, "
                 "lk = lane / (g.LR * g.LB);",
                 "const int kg = warp * g.LK + lk;",
                 # owned: e = tid + i*threads, jj = e % U, b = e / U
                 "const int e = tid + i * nt;",
                 "const int jj = e % U;",
                 "cell_b[i] = e / U;",
                 # geometry's refusals: k_tile, whole warps, cells; the fit's: units, smem
                 "if (U < 1 || Bfull < 1 || H < 1 || KT < 4 || KT % 4 != 0 || nt % 32 != 0) __trap();",
                 "(long long)U * BG > (long long)PK_CPT * nt",
                 "if ((long long)ranks * U < H ||",
                 "(long long)dynamic_smem_bytes() < need)"):
        assert line in SRC, line
    # the shared memory the kernel checks for is the fit's sum, term by term: R slice, h
    # tile, partial sums
    # tile (two buffers in the cluster kernel, each of BG batches), partial sums
    assert "const long long need = 4LL * ((long long)g.M * g.SR + (CL ? 2LL : 1LL) * BG * g.SH\n" \
           "                                  + (long long)g.NKG * g.M * g.BP);" in SRC
    # the cluster kernel's batch slice (Fit.batch_per_block, Fit.batches) and units (rank)
    for line in ("BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();",
                 "b_off = (int)pk_cluster_id() * BG;", "B = min(BG, Bfull - b_off);",
                 "rank = (int)pk_cluster_rank();", "const int j0 = rank * U;"):
        assert line in SRC, line


def _nvcc():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    return nvcc


def test_nvcc_compiles_sm90(tmp_path):
    cmd = [_nvcc(), "-arch=sm_90", "--cubin", "-std=c++17", "-Werror", "all-warnings",
           "-o", str(tmp_path / "k.cubin"), str(K.cuda_src_dir() / "persistent.cu")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"


def test_nvrtc_compiles_sm90():
    lib = _find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    ok, log = _nvrtc_compile(lib, SRC, "persistent.cu", ["-std=c++17", "--gpu-architecture=sm_90"])
    assert ok, f"NVRTC failed:\n{log}"
    assert "warning" not in log.lower(), log


_USAGE = re.compile(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes "
                    r"spill stores, (\d+) bytes spill loads.*?Used (\d+) registers", re.S)


def _resource_usage(text):
    """{kernel: (registers, stack, spill stores, spill loads)} from ptxas -v output."""
    return {m[0]: (int(m[4]), int(m[1]), int(m[2]), int(m[3])) for m in _USAGE.findall(text)}


def test_nvcc_resource_usage_no_spills_within_the_launch_bounds(tmp_path):
    """ptxas: no stack, no spills, and no more registers than the fit assumes
    (NVCC_REGS), which is at most what the header's __launch_bounds__(PK_MAX_THREADS = 256,
    1) allows a thread: 255 (256 threads x 255 registers fit one SM's 64 K)."""
    nvcc = _nvcc()
    cmd = [nvcc, "-arch=sm_90", "--cubin", "-std=c++17", "--resource-usage",
           "-o", str(tmp_path / "k.cubin"), str(K.cuda_src_dir() / "persistent.cu")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    usage = _resource_usage(r.stdout + r.stderr)
    assert set(usage) == set(PERSISTENT) | {STACK_KERNEL}, usage
    assert "__launch_bounds__(PK_MAX_THREADS = 256, 1)" in SRC, "the header's Resources"
    assert P.PK_MAX_THREADS * 255 <= 65536 and set(P.NVCC_REGS) == set(CELLS)
    for name, (regs, stack, st, ld) in usage.items():
        cell = name.split("_persistent")[0]
        limit = PS_REGS if name == STACK_KERNEL else P.NVCC_REGS[cell]
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert regs <= limit <= 255, f"{name}: {regs} registers > the fit's {limit}"


def test_nvrtc_ptx_resource_usage_no_spills(tmp_path):
    """CuPy compiles with NVRTC: its PTX, through ptxas, must not spill either."""
    lib, ptxas = _find_nvrtc(), shutil.which("ptxas")
    if lib is None or ptxas is None:
        pytest.skip("needs libnvrtc and ptxas")
    import ctypes
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), SRC.encode(), b"persistent.cu", 0,
                                  None, None) == 0
    try:
        opts = (ctypes.c_char_p * 2)(b"-std=c++17", b"--gpu-architecture=compute_90")
        assert lib.nvrtcCompileProgram(prog, 2, opts) == 0
        size = ctypes.c_size_t()
        assert lib.nvrtcGetPTXSize(prog, ctypes.byref(size)) == 0
        ptx = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetPTX(prog, ptx) == 0
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    (tmp_path / "p.ptx").write_bytes(ptx.value)
    r = subprocess.run([ptxas, "-arch=sm_90", "-v", str(tmp_path / "p.ptx"), "-o",
                        str(tmp_path / "p.cubin")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    usage = _resource_usage(r.stdout + r.stderr)
    assert set(usage) == set(PERSISTENT) | {STACK_KERNEL}, usage
    for name, (regs, stack, st, ld) in usage.items():
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        limit = PS_REGS if name == STACK_KERNEL else P.NVCC_REGS[name.split("_persistent")[0]]
        assert regs <= limit, (name, regs)


def _nvcc_ptx(tmp_path):
    out = tmp_path / "k.ptx"
    r = subprocess.run([_nvcc(), "-arch=sm_90", "-ptx", "-std=c++17", "-o", str(out),
                        str(K.cuda_src_dir() / "persistent.cu")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    bodies = re.split(r"\.entry\s+", text)[1:]
    return {b[:b.index("(")].strip(): b for b in bodies}


@pytest.fixture(scope="module")
def nvcc_ptx(tmp_path_factory):
    """{kernel: its PTX body} of persistent.cu's per-layer kernels, compiled once for the
    PTX tests."""
    return {k: v for k, v in _nvcc_ptx(tmp_path_factory.mktemp("ptx")).items()
            if k in PERSISTENT}


def _lines_at(lines, pattern):
    """Indices of the lines matching ``pattern``."""
    return [i for i, line in enumerate(lines) if re.search(pattern, line)]


def test_ptx_stages_h_with_cp_async(nvcc_ptx):
    """Each kernel stages h_t with 16-byte cp.async copies (cp.async.cg.shared.global ...,
    16: through L2, no registers), every staging call closing its own group (as many
    commit_groups as cp.async sites), the 4-byte fallback beside each (4 ld.global.cg.f32 a
    chunk). It only ever waits for all but the newest group (wait_group 1: "this half has
    landed"), and the halves are a ping-pong: after the first wait the lane multiplies (at
    least one chunk's PK_TM * PK_TB * 4 FMAs, reading shared memory 16 bytes at a time,
    ld.shared.v4.f32), then stages the next tile's half (a cp.async site) before it waits
    for its second half. v2 staged through registers (ld.global.cg.v4, then st.shared.v4)
    before any FMA."""
    for name in GRID_KERNELS:
        lines = nvcc_ptx[name].splitlines()
        cp = _lines_at(lines, r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16;")
        assert len(cp) >= 2, (name, cp)
        assert len(_lines_at(lines, r"cp\.async\.commit_group;")) == len(cp), name
        assert len(_lines_at(lines, r"ld\.global\.cg\.f32")) == 4 * len(cp), name
        assert not _lines_at(lines, r"ld\.global\.cg\.v4|st\.shared\.v4"), name
        waits = _lines_at(lines, r"cp\.async\.wait_group")
        assert waits and all(re.search(r"wait_group 1;", lines[i]) for i in waits), \
            [lines[i].strip() for i in waits]
        assert cp[1] < waits[0], f"{name}: waits before both halves are in flight"
        fma = _lines_at(lines, r"fma\.rn\.f32")
        assert waits[0] < fma[0], f"{name}: multiplies before the first half has landed"
        end = waits[1] if len(waits) > 1 else len(lines)
        first_half = [i for i in fma if waits[0] < i < end]
        assert len(first_half) >= P.PK_TM * P.PK_TB * 4, f"{name}: nothing multiplied in flight"
        assert any(first_half[0] < i < end for i in cp), \
            f"{name}: the next half is not staged between this half's FMAs and the next wait"
        assert _lines_at(lines, r"ld\.shared\.v4\.f32"), name


def test_ptx_grid_barrier_is_acq_rel(nvcc_ptx):
    """The grid barrier as the header has it: thread 0's fence.acq_rel.gpu before its
    arrival (atom.global.add) and after its spin, the spin a relaxed load (ld.relaxed.gpu),
    the exit's add after both; no fence.sc / membar (__threadfence) and no ld.acquire (an
    L1 invalidation every time round the spin)."""
    for name in GRID_KERNELS:
        lines = nvcc_ptx[name].splitlines()
        fence = _lines_at(lines, r"fence\.acq_rel\.gpu;")
        add = _lines_at(lines, r"atom\.global\.add\.u32")
        spin = _lines_at(lines, r"ld\.relaxed\.gpu\.global\.u32")
        assert len(fence) == 2 and len(add) == 2 and spin, (name, fence, add, spin)
        assert fence[0] < add[0] < spin[0] <= spin[-1] < fence[1] < add[1], name
        assert not _lines_at(lines, r"fence\.sc|membar|ld\.acquire"), name


def test_ptx_prefetches_the_pointwise_inputs(nvcc_ptx):
    """gx is loaded with the streaming hint (ld.global.cs) at two places, G * PK_CPT loads
    each (every gate of every cell of the thread): before the copy of R ends (the first
    bar.sync) and so before the first step's FMAs, and after the step's h stores
    (st.global.cg) and before the grid barrier (its bar.sync and fence), so that step t+1's
    loads are in flight across it; the cluster kernels: between the cluster barrier's
    arrive and its wait. The biases are read-only loads (ld.global.nc), once, before the copy
    of R ends. v1 loaded gx after the dot products, plain."""
    for name, body in nvcc_ptx.items():
        G = get_cell(name.split("_persistent")[0]).gates
        n = G * P.PK_CPT
        lines = body.splitlines()
        cs = _lines_at(lines, r"ld\.global\.cs\.f32")
        assert len(cs) == 2 * n, (name, len(cs))
        bar = _lines_at(lines, r"bar\.sync")
        nc = _lines_at(lines, r"ld\.global\.nc\.f32")   # the two biases, once
        assert len(nc) == 2 * n and nc[-1] < bar[0], (name, len(nc))
        fma = _lines_at(lines, r"fma\.rn\.f32")
        stores = _lines_at(lines, r"st\.global\.cg\.f32")
        first, second = cs[:n], cs[n:]
        if name in CLUSTER_KERNELS:
            # the step's end is the cluster barrier (its last arrive and wait); step t+1's
            # gx is loaded between them (the arrive's release would wait for the loads)
            bar = _lines_at(lines, r"bar\.sync|barrier\.cluster\.arrive")
            arrive = _lines_at(lines, r"barrier\.cluster\.arrive")[-1]
            wait = _lines_at(lines, r"barrier\.cluster\.wait")[-1]
            assert first[-1] < bar[0] and first[-1] < fma[0], f"{name}: gx not loaded up front"
            assert arrive < second[0] and second[-1] < wait, \
                f"{name}: step t+1's gx is not loaded between the arrive and the wait"
            continue
        fence = _lines_at(lines, r"fence\.acq_rel\.gpu;")
        barrier = max(i for i in bar if i < fence[0])     # the grid barrier's __syncthreads
        assert first[-1] < bar[0] and first[-1] < fma[0], f"{name}: gx not loaded up front"
        assert stores[-1] < second[0] and second[-1] < barrier, \
            f"{name}: step t+1's gx is not loaded between the h stores and the barrier"


def test_ptx_cluster_kernels_push_h_and_meet_at_the_cluster_barrier(nvcc_ptx):
    """The cluster kernels as the header has them: no h staging from global memory (no
    cp.async) and no grid barrier (no fence, no atomics, no spin); each h_{t+1} goes to
    every block of the cluster (mapa + st.shared::cluster, PK_CLUSTER of each, unrolled),
    and the blocks meet at the cluster barrier with release / acquire semantics, once before
    the first step (after the copy of R and h_0) and once a step after the pushes, the
    step's global stores (st.global.cg) between its arrive and its wait."""
    for name in CLUSTER_KERNELS:
        lines = nvcc_ptx[name].splitlines()
        assert not _lines_at(lines, r"cp\.async|fence\.|atom\.|ld\.relaxed|membar"), name
        arrive = _lines_at(lines, r"barrier\.cluster\.arrive\.release\.aligned;")
        wait = _lines_at(lines, r"barrier\.cluster\.wait\.acquire\.aligned;")
        assert len(arrive) == len(wait) == 2, (name, arrive, wait)
        assert all(a < w for a, w in zip(arrive, wait)), name
        mapa = _lines_at(lines, r"mapa\.shared::cluster\.u32")
        push = _lines_at(lines, r"st\.shared::cluster\.f32")
        stores = _lines_at(lines, r"st\.global\.cg\.f32")
        fma = _lines_at(lines, r"fma\.rn\.f32")
        assert len(push) == len(mapa) == P.PK_CPT * P.PK_CLUSTER, (name, len(push), len(mapa))
        # the step's global stores go between the arrive and the wait (the release then
        # waits for the pushes only)
        assert len(stores) == P.PK_CPT, (name, len(stores))
        assert wait[0] < fma[0] and push[-1] < arrive[1] < stores[0], name
        assert stores[-1] < wait[1], name


def _cuobjdump():
    exe = shutil.which("cuobjdump")
    if exe is None:   # pip install nvidia-cuda-cuobjdump puts it beside the other nvidia libs
        try:
            import nvidia
            hits = [Path(p) / "cu13" / "bin" / "cuobjdump" for p in nvidia.__path__]
            exe = next((str(h) for h in hits if h.is_file()), None)
        except ImportError:
            pass
    if exe is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump to run this check)")
    return exe


def test_sass_stages_with_ldgsts(tmp_path):
    """What ptxas makes of it: each kernel's SASS stages h_t with LDGSTS.E.BYPASS.128
    (16-byte global-to-shared copies past L1), closes its groups (LDGDEPBAR) and waits on
    them (DEPBAR); the barrier's fence is MEMBAR.ALL.GPU, not __threadfence's MEMBAR.SC,
    and the spin between the arrival (ATOMG.E.ADD) and the acquire fence polls with plain
    loads, no L1 invalidation (CCTL) every time round."""
    cubin = tmp_path / "k.cubin"
    r = subprocess.run([_nvcc(), "-arch=sm_90", "--cubin", "-std=c++17", "-o", str(cubin),
                        str(K.cuda_src_dir() / "persistent.cu")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in GRID_KERNELS:
        r = subprocess.run([_cuobjdump(), "-sass", "-fun", name, str(cubin)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert _lines_at(lines, r"\bLDGSTS\.E\.BYPASS\.128\b"), name
        assert _lines_at(lines, r"\bLDGDEPBAR\b") and _lines_at(lines, r"\bDEPBAR\.LE\b"), name
        assert _lines_at(lines, r"\bMEMBAR\.ALL\.GPU\b"), name
        assert not _lines_at(lines, r"\bMEMBAR\.SC\b"), name
        arrive = _lines_at(lines, r"\bATOMG\.E\.ADD\b")[0]
        fence = next(i for i in _lines_at(lines, r"\bMEMBAR\b") if i > arrive)
        spin = lines[arrive:fence]
        assert _lines_at(spin, r"\bLDG\.E\.STRONG\.GPU\b"), f"{name}: no spin load found"
        assert not _lines_at(spin, r"\bCCTL\b"), f"{name}: the spin invalidates L1"


# --- the kernel's own source on CPU threads ------------------------------------------------

def _build_sim(exe, src, tsan=False):
    """Compile tests/persistent_host_sim.cpp with the kernel source ``src`` (g++ -std=c++20),
    with ThreadSanitizer when ``tsan``; skips where the toolchain cannot."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on PATH")
    cmd = [gxx, "-std=c++20", "-O1", "-pthread", "-fno-strict-aliasing", "-Wall", "-Werror",
           "-Wno-unknown-pragmas", "-DPK_HOST_SIM", f'-DPK_SOURCE="{src}"', "-o", str(exe),
           str(Path(__file__).with_name("persistent_host_sim.cpp"))]
    if tsan:   # TSan does not model fences: the seq_cst atomicAdd carries the release
        cmd[1:1] = ["-fsanitize=thread", "-g", "-Wno-tsan"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and ("No such file" in r.stderr or "cannot find" in r.stderr):
        pytest.skip(f"toolchain lacks what the simulator needs: {r.stderr[-300:]}")
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return exe


@pytest.fixture(scope="module")
def host_sim(tmp_path_factory):
    """tests/persistent_host_sim.cpp compiled with cuda_src/persistent.cu."""
    exe = tmp_path_factory.mktemp("sim") / "persistent_host_sim"
    return _build_sim(exe, K.cuda_src_dir() / "persistent.cu")


def run_host_sim(exe, tmp_path, cell, fit, data, T, launches=2, pad=3, h_offset=0):
    """Lay one layer out in padded float32 arrays (NaN outputs, biases ld 0; h's ld is
    H + pad, h placed h_offset floats past a 16-byte boundary), run the kernel on CPU
    threads ``launches`` times, return (h, c, act) as [T+1, B, H], ..., the raw arrays (to
    check the padding), what was sent, and the h staging loads {"ldcg128": n, "ldcg32": m}."""
    G, B, H = get_cell(cell).gates, fit.batch, fit.hidden
    ld = {"h": H + pad, "c": H + pad, "act": 4 * H + pad, "gx": G * H + pad, "w": H + pad}
    arrays = {}
    for name, rows in (("h", (T + 1) * B), ("c", (T + 1) * B), ("act", T * B)):
        used = name == "h" or (name == "c" and cell == "lstm") or (name == "act" and G > 1)
        arrays[name] = np.full((rows, ld[name]) if used else (0, 0), np.nan, np.float32)
    arrays["h"][:B, :H] = data["h0"]
    if cell == "lstm":
        arrays["c"][:B, :H] = data["c0"]
    arrays["gx"] = np.full((T * B, ld["gx"]), np.nan, np.float32)
    arrays["gx"][:, :G * H] = data["gx"].reshape(T * B, G * H)
    arrays["w"] = np.full((G * H, ld["w"]), np.nan, np.float32)
    arrays["w"][:, :H] = data["R"]
    for b in ("bw", "br"):   # ld 0: one row
        arrays[b] = np.zeros(G * H, np.float32) if data[b] is None else data[b].astype(np.float32)
    for name, a in arrays.items():
        np.ascontiguousarray(a, np.float32).tofile(tmp_path / f"{name}.f32")
    args = [str(exe), cell, B, H, T, fit.units_per_block, fit.blocks, fit.threads,
            fit.smem_bytes, launches,
            tmp_path, ld["h"], ld["c"], ld["act"], ld["gx"], ld["w"], 0, 0, fit.k_tile, h_offset,
            fit.cluster]
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"host simulation failed ({r.returncode}):\n{r.stderr}"
    loads = dict(zip(r.stdout.split()[::2], map(int, r.stdout.split()[1::2])))
    raw = {name: np.fromfile(tmp_path / f"{name}.out", np.float32).reshape(arrays[name].shape)
           for name in ("h", "c", "act")}
    h = raw["h"][:, :H].reshape(T + 1, B, H)
    c = raw["c"][:, :H].reshape(T + 1, B, H) if cell == "lstm" else None
    act = raw["act"][:, :4 * H].reshape(T, B, 4 * H) if G > 1 else None
    return (h, c, act), raw, arrays, loads


# (H, B, T, U, threads, k_tile, pad): last block partial, several k-groups a warp, one tile
# and several (the last partial), T = 1; M 76 (LSTM, GRU: U 19): 3 output tiles of rows a
# lane; H 20, B 33, U 7, 128 threads: 2 output tiles of batches (LSTM, GRU), 2 cells a
# thread, LK 1 (LSTM, GRU) and an idle warp (5 chunks, CPW 2); H 37 or pad 3 (ldh not a
# multiple of 4): 4-byte staging loads; H 40 or 20 with pad 4: 16-byte ones (cp.async)
SIM_CASES = [(37, 3, 5, 5, 32, None, 3), (150, 5, 3, 19, 96, 64, 3), (37, 1, 1, 7, 32, 8, 3),
             (40, 3, 4, 6, 64, None, 4), (40, 5, 3, 6, 64, 12, 4), (20, 33, 3, 7, 128, None, 4)]


def test_sim_cases_cover_the_kernels_variants():
    """SIM_CASES run every path of the kernel: one output tile a lane (sums kept in
    registers) and several, one cell a thread and PK_CPT, one k-group a warp (LK 1) and
    several, a warp with no chunk to stage, one h tile and several, both staging paths."""
    seen = {"out_tiles": set(), "cpt": set(), "lk1": set(), "idle_warp": set(),
            "tiles": set(), "vec": set()}
    for H, B, T, U, threads, k_tile, pad in SIM_CASES:
        for cell in CELLS:
            f = P.geometry(cell, H, B, U, threads, k_tile=k_tile)
            lr, lb, lk = f.lanes
            seen["out_tiles"].add(_ceil(f.rows, P.PK_TM * lr) * _ceil(B, P.PK_TB * lb) > 1)
            seen["cpt"].add(f.cells_per_thread)
            seen["lk1"].add(lk == 1)
            seen["idle_warp"].add(any(all(len(P.k_columns(f, w * lk + i)) == 0
                                          for i in range(lk)) for w in range(f.warps)))
            seen["tiles"].add(f.tiles > 1)
            seen["vec"].add(H % 4 == 0 and pad % 4 == 0)
    assert seen == {"out_tiles": {False, True}, "cpt": {1, P.PK_CPT}, "lk1": {False, True},
                    "idle_warp": {False, True}, "tiles": {False, True},
                    "vec": {False, True}}, seen


def _check_sim(cell, H, B, T, fit, data, ref, out):
    (h, c, act), raw, sent, _ = out
    emu = P.emulate(cell, fit, **data)
    for name, got, r64, e32 in (("h", h, ref["h"], emu[0]), ("c", c, ref["c"], emu[1]),
                                ("act", act, ref["act"], emu[2])):
        if r64 is None:
            assert got is None
            continue
        assert_close(got, r64, FP32_ATOL, FP32_RTOL, name=f"{cell} {name} vs reference")
        assert_close(got, e32, 1e-5, 1e-5, name=f"{cell} {name} vs emulation")
    np.testing.assert_array_equal(raw["h"][:B], sent["h"][:B], err_msg="h0 changed")
    for name in ("h", "c", "act"):
        if raw[name].size:
            width = 4 * H if name == "act" else H
            assert np.isnan(raw[name][:, width:]).all(), f"{name}: padding written"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, U, threads, k_tile, pad", SIM_CASES)
def test_kernel_source_on_cpu_threads(host_sim, tmp_path, cell, H, B, T, U, threads, k_tile,
                                      pad, bias):
    """The .cu itself, every block at once on CPU threads, launched twice with one sync
    buffer: equals the float64 reference (fp32 tolerance) and the float32 emulation, writes
    no padding, leaves h0/c0, and the counters are zero after each launch (checked inside);
    its h staging used 16-byte loads exactly where H and ldh are multiples of 4."""
    fit = P.geometry(cell, H, B, U, threads, k_tile=k_tile)
    assert fit.ok
    assert (fit.tiles > 1) == (k_tile is not None)
    data, ref = layer_case(cell, T, B, H, bias=bias, dtype=np.float32)
    out = run_host_sim(host_sim, tmp_path, cell, fit, data, T, pad=pad)
    _check_sim(cell, H, B, T, fit, data, ref, out)
    loads = out[3]
    if H % 4 == 0 and pad % 4 == 0:
        assert loads["ldcg128"] > 0 and loads["ldcg32"] == 0, loads
    else:
        assert loads["ldcg128"] == 0 and loads["ldcg32"] > 0, loads


@pytest.mark.parametrize("pad, h_offset, vec", [(4, 0, True), (3, 0, False), (4, 1, False),
                                                (8, 2, False)],
                         ids=["aligned", "ldh-odd", "h-misaligned", "h-8-byte"])
def test_staging_falls_back_to_4_byte_loads(host_sim, tmp_path, pad, h_offset, vec):
    """H % 4 == 0, but ldh not a multiple of 4 or h not 16-byte aligned: the 16-byte loads
    would fault (the simulator aborts on a misaligned one), so the kernel stages with 4-byte
    loads, with the same results; aligned, it uses 16-byte loads only."""
    T, B, H = 3, 5, 40
    fit = P.geometry("lstm", H, B, 6, 64, k_tile=16)   # 16, 16, 8: several tiles
    data, ref = layer_case("lstm", T, B, H, dtype=np.float32)
    out = run_host_sim(host_sim, tmp_path, "lstm", fit, data, T, pad=pad, h_offset=h_offset)
    _check_sim("lstm", H, B, T, fit, data, ref, out)
    loads = out[3]
    assert (loads["ldcg128"] > 0, loads["ldcg32"] > 0) == (vec, not vec), loads


def test_barrier_protocol_has_no_data_race(tmp_path):
    """ThreadSanitizer over the kernel on CPU threads: the writes of h_{t+1} and the next
    step's reads are ordered by the barrier (no report), with either staging path, with one
    tile or several, and with several warps a block (each stages and reads only its own
    columns of the h tile, ordered by __syncwarp; the partial sums by __syncthreads); and
    the checker is not vacuous: without the __syncthreads before thread 0 arrives, or
    without the __syncwarp after a half is multiplied (the next tile's half would land on
    columns other lanes still read), it reports a data race."""
    src = K.cuda_src_dir() / "persistent.cu"
    exe = _build_sim(tmp_path / "sim_tsan", src, tsan=True)
    T, B, U = 4, 3, 5
    for cell, H, pad, k_tile, nt in (("lstm", 37, 3, None, 32), ("gru", 37, 3, 12, 32),
                                     ("rnn_tanh", 40, 4, None, 32), ("rnn_relu", 40, 4, 12, 32),
                                     ("lstm", 40, 4, 16, 64), ("rnn_tanh", 37, 3, None, 64)):
        fit = P.geometry(cell, H, B, U, nt, k_tile=k_tile)
        assert fit.ok and (fit.warps > 1) == (nt > 32)
        data, ref = layer_case(cell, T, B, H, dtype=np.float32)
        work = tmp_path / f"{cell}-{nt}"
        work.mkdir()
        (h, _, _), _, _, loads = run_host_sim(exe, work, cell, fit, data, T, launches=1,
                                              pad=pad)
        assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name=f"{cell} h under TSan")
        assert (loads["ldcg128"] > 0) == (pad == 4)

    text = src.read_text()
    first_sync = "    __syncthreads();   // the whole block's writes of this step are issued\n"
    half_sync = ("            if (!CL) __syncwarp();   "
                 "// the half is read: the next tile's may land there\n")
    for name, line, H, pad, nt, k_tile in (("no_sync", first_sync, 37, 3, 32, None),
                                           ("no_syncwarp", half_sync, 40, 4, 64, 16)):
        assert line in text, line
        broken = tmp_path / f"persistent_{name}.cu"
        broken.write_text(text.replace(line, "", 1))
        exe = _build_sim(tmp_path / f"sim_tsan_{name}", broken, tsan=True)
        fit = P.geometry("lstm", H, B, U, nt, k_tile=k_tile)
        data, _ = layer_case("lstm", T, B, H, dtype=np.float32)
        work = tmp_path / name
        work.mkdir()
        with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
            run_host_sim(exe, work, "lstm", fit, data, T, launches=1, pad=pad)


# the cluster kernels: (H, B, T, threads, clusters, pad): 3 clusters of 7, 7 and 5 batches;
# one cluster of 8; 2 clusters of 2 and 1 with rank 7 owning no unit (U 3, H 20); LSTM H 160
# (U 20, M 80: two output tiles of rows a lane, LR 16) in 2 clusters of 5
CLUSTER_SIM_CASES = [(37, 19, 3, 64, 3, 3), (40, 8, 4, 128, 1, 4), (20, 3, 2, 32, 2, 3),
                     (160, 10, 2, 64, 2, 4)]


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, threads, clusters, pad", CLUSTER_SIM_CASES)
def test_cluster_kernel_source_on_cpu_threads(host_sim, tmp_path, cell, H, B, T, threads,
                                              clusters, pad):
    """The cluster kernels, every block at once on CPU threads (the cluster barrier a
    std::barrier over each cluster's threads, the pushes into the other blocks' shared
    memory real stores there), launched twice: equal the float64 reference and the float32
    emulation, write no padding, leave h0/c0 and the (unused) sync counters zero, and load
    nothing through the staging path."""
    U = _ceil(H, P.PK_CLUSTER)
    fit = P.geometry(cell, H, B, U, threads, k_tile=P.full_tile(H), clusters=clusters)
    assert fit.ok and fit.cluster == P.PK_CLUSTER and fit.blocks == P.PK_CLUSTER * clusters
    data, ref = layer_case(cell, T, B, H, dtype=np.float32)
    out = run_host_sim(host_sim, tmp_path, cell, fit, data, T, pad=pad)
    _check_sim(cell, H, B, T, fit, data, ref, out)
    assert out[3] == {"ldcg128": 0, "ldcg32": 0}, out[3]


def test_cluster_sim_cases_cover_the_variants():
    """CLUSTER_SIM_CASES run one and several clusters, a last cluster with fewer batches, a
    block that owns no unit, one output tile a lane and several, 1 and PK_CPT cells a thread."""
    seen = {"clusters": set(), "short_last": set(), "idle_rank": set(), "out_tiles": set(),
            "cpt": set()}
    for H, B, T, threads, clusters, pad in CLUSTER_SIM_CASES:
        for cell in CELLS:
            f = P.geometry(cell, H, B, _ceil(H, P.PK_CLUSTER), threads, k_tile=P.full_tile(H),
                           clusters=clusters)
            lr, lb, _ = f.lanes
            seen["clusters"].add(clusters > 1)
            seen["short_last"].add(len(f.batches(f.blocks - 1)) < f.batch_per_block)
            seen["idle_rank"].add(any(len(f.units(x)) == 0 for x in range(f.blocks)))
            seen["out_tiles"].add(_ceil(f.rows, P.PK_TM * lr)
                                  * _ceil(f.batch_per_block, P.PK_TB * lb) > 1)
            seen["cpt"].add(f.cells_per_thread)
    assert seen == {"clusters": {False, True}, "short_last": {False, True},
                    "idle_rank": {False, True}, "out_tiles": {False, True},
                    "cpt": {1, P.PK_CPT}}, seen


def test_cluster_protocol_has_no_data_race(tmp_path):
    """ThreadSanitizer over the cluster kernels on CPU threads: the pushes of h_{t+1} into
    the other blocks' buffers and their reads next step are ordered by the cluster barrier
    (no report); without the barrier at the end of each step (its arrive and its wait), it
    reports a data race."""
    src = K.cuda_src_dir() / "persistent.cu"
    exe = _build_sim(tmp_path / "sim_tsan", src, tsan=True)
    T, B, H = 3, 5, 20
    fit = P.geometry("lstm", H, B, _ceil(H, P.PK_CLUSTER), 32, k_tile=P.full_tile(H),
                     clusters=2)
    data, ref = layer_case("lstm", T, B, H, dtype=np.float32)
    work = tmp_path / "ok"
    work.mkdir()
    (h, _, _), _, _, _ = run_host_sim(exe, work, "lstm", fit, data, T, launches=1)
    assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name="lstm h under TSan (clusters)")
    text = src.read_text()
    for line in ("                pk_cluster_arrive();\n", "                pk_cluster_wait();\n"):
        assert text.count(line) == 1, line
        text = text.replace(line, "", 1)
    broken = tmp_path / "persistent_no_cluster_sync.cu"
    broken.write_text(text)
    exe = _build_sim(tmp_path / "sim_tsan_broken", broken, tsan=True)
    work = tmp_path / "broken"
    work.mkdir()
    with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
        run_host_sim(exe, work, "lstm", fit, data, T, launches=1)


def test_kernel_sums_the_k_groups_k_columns_says(host_sim, tmp_path):
    """On data where the grouping of the columns into k-groups decides the result
    (``_cancelling_case``: by hand, h_1 is 0 for batch 0 and tanh(1) for batch 1), the
    kernel on CPU threads gives what emulate gives, which sums k_columns' groups in k-group
    order: the kernel's k-groups are k_columns'."""
    fit, data = _cancelling_case()
    assert fit.ok and P.k_columns(fit, 0).tolist() == _cols(0, 3)
    want = np.tanh(np.float32([[0], [1]])) * np.ones((2, 37), np.float32)
    h_emu = P.emulate("rnn_tanh", fit, **data)[0]
    np.testing.assert_allclose(h_emu[1], want, atol=1e-6, err_msg="emulate")
    (h, _, _), _, _, _ = run_host_sim(host_sim, tmp_path, "rnn_tanh", fit, data, 1,
                                      launches=1)
    np.testing.assert_allclose(h[1], want, atol=1e-6, err_msg="the kernel on CPU threads")


@pytest.mark.parametrize("broken", ["none", "smem", "threads", "units", "cells", "k_tile",
                                    "k_tile_smem"])
def test_kernel_traps_on_a_geometry_that_disagrees(host_sim, tmp_path, broken):
    """Less dynamic shared memory than the layout needs, a block that is not whole warps, a
    grid that leaves units out, more (b, j) cells than PK_CPT a thread, a k_tile that is not
    a multiple of 4, or a k_tile wider than the shared memory was sized for: the kernel traps
    at once instead of computing garbage. Each broken launch differs from a good one (which
    runs: "none") in that one respect; the simulator passes fit.smem_bytes as the dynamic
    shared memory."""
    from dataclasses import replace
    fit = P.geometry("lstm", 37, 3, 5, 32)
    assert fit.ok and fit.k_tile == 40
    # 48 threads: the kernel's layout for them (1 warp) is the one for 32: the same smem
    assert P.geometry("lstm", 37, 3, 5, 48).smem_bytes == fit.smem_bytes
    # 5 units x B 13 = 65 cells: 64 threads hold them, 32 do not (2 a thread); the shared
    # memory sized for 64 threads is more than 32 threads' layout needs
    wide = P.geometry("lstm", 37, 13, 5, 64)
    narrow = P.geometry("lstm", 37, 13, 5, 32)
    assert wide.ok and not narrow.ok and "65 cells" in narrow.reason
    assert narrow.smem_bytes <= wide.smem_bytes
    # k_tile 48 needs a wider h tile than the 40 the shared memory was sized for
    assert P.geometry("lstm", 37, 3, 5, 32, k_tile=48).smem_bytes > fit.smem_bytes
    bad = {"none": fit,
           "smem": replace(fit, smem_partials=fit.smem_partials - 4),
           "threads": replace(fit, threads=48),
           "units": replace(fit, blocks=7),                 # 7 blocks x 5 units < 37
           "cells": replace(wide, threads=32),
           "k_tile": replace(fit, k_tile=38),               # shared memory sized for 40
           "k_tile_smem": replace(fit, k_tile=48)}[broken]
    data, ref = layer_case("lstm", 2, bad.batch, 37, dtype=np.float32)
    if broken == "none":
        (h, _, _), _, _, _ = run_host_sim(host_sim, tmp_path, "lstm", bad, data, 2, launches=1)
        assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name="the good launch")
        return
    with pytest.raises(AssertionError, match=r"__trap\(\)"):
        run_host_sim(host_sim, tmp_path, "lstm", bad, data, 2, launches=1)


# --- the cluster kernels' fit -------------------------------------------------------------

def test_fit_takes_the_cluster_kernel_where_it_fits_and_pays():
    """On the H100's properties (compute capability 9): small layers run in clusters of
    PK_CLUSTER, one cluster per CLUSTER_BATCH batches; where the cluster's R does not fit one block
    a cluster, or a thread would do more than CLUSTER_MAX_FMAS FMAs a step, the grid
    kernel, its reason saying why not the cluster kernel."""
    props = H100_SXM.props()
    f = P.persistent_fit("lstm", 128, 64, props)
    assert f.ok and f.kernel == "lstm_persistent_cluster_fwd", f.describe()
    assert (f.cluster, f.clusters, f.batch_per_block, f.units_per_block) == (8, 8, 8, 16)
    assert f.blocks == 64 and f.grid == (64, 1, 1) and f.k_tile == 128 and f.tiles == 1
    assert f.smem_tile == 4 * 2 * 8 * P.tile_stride(128), "two buffers of BG rows"
    assert f.fmas_per_thread == 4 * 16 * 128 * 8 // f.threads <= P.CLUSTER_MAX_FMAS
    assert [f.batches(x) for x in (0, 7, 8, 63)] == [range(0, 8)] * 2 + [range(8, 16),
                                                                          range(56, 64)]
    assert [f.units(x) for x in (0, 7, 8)] == [range(0, 16), range(112, 128), range(0, 16)]
    paper = P.persistent_fit("lstm", 512, 64, props)
    assert paper.ok and paper.kernel == "lstm_persistent_fwd"
    assert "the cluster kernel does not fit" in paper.reason and "R slice" in paper.reason
    # LSTM H 192 B 64: M 96 rows, 256 threads would need 32 k-groups (> KG_MAX): 128
    # threads, 4 x 24 x 192 x 8 / 128 = 1152 FMAs a thread
    big = P.persistent_fit("lstm", 192, 64, props)
    assert big.ok and big.kernel == "lstm_persistent_fwd" and "CLUSTER_MAX_FMAS" in big.reason
    forced = P.persistent_fit("lstm", 192, 64, props, kind="cluster")
    assert forced.ok and forced.cluster and forced.fmas_per_thread == 1152 > P.CLUSTER_MAX_FMAS
    # clusters: one per CLUSTER_BATCH batches, on at most half the SMs; with 4 layers
    # overlapping, a quarter of them each
    small = P.persistent_fit("lstm", 128, 32, props)
    assert (small.clusters, small.batch_per_block) == (8, 4)
    assert [P.cluster_count(b, 132) for b in (1, 4, 5, 32, 64, 256)] == [1, 1, 2, 8, 8, 8]
    assert [P.cluster_count(b, 132, layers=4) for b in (8, 32, 64)] == [2, 4, 4]


def test_fit_cluster_kernel_needs_sm90_and_its_knobs_are_checked():
    """Compute capability below 9 (or unknown: no 'major'): no clusters, the grid kernel;
    asking for the cluster kernel there says why. The clusters knob is validated and
    implies the cluster kernel; the grid knobs imply the grid kernel."""
    props = dict(H100_SXM.props(), major=8)
    f = P.persistent_fit("lstm", 128, 64, props)
    assert f.ok and f.kernel == "lstm_persistent_fwd"
    no = P.persistent_fit("lstm", 128, 64, props, kind="cluster")
    assert not no.ok and "compute capability 9.0" in no.reason
    bare = {k: v for k, v in H100_SXM.props().items() if k != "major"}
    assert P.persistent_fit("lstm", 128, 64, bare).kernel == "lstm_persistent_fwd"
    props = H100_SXM.props()
    f = P.persistent_fit("lstm", 128, 32, props, clusters=2)
    assert f.ok and (f.clusters, f.batch_per_block) == (2, 16)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="clusters must be an int >= 1"):
            P.persistent_fit("lstm", 128, 32, props, clusters=bad)
    with pytest.raises(ValueError, match="cluster kernel's knob"):
        P.persistent_fit("lstm", 128, 32, props, clusters=2, kind="grid")
    with pytest.raises(ValueError, match="kind must be"):
        P.persistent_fit("lstm", 128, 32, props, kind="cooperative")
    assert P.persistent_fit("lstm", 128, 32, props, units_per_block=2).cluster == 0
    assert P.persistent_fit("lstm", 128, 32, props, k_tile=64).cluster == 0
    empty = P.persistent_fit("lstm", 128, 9, props, clusters=5)   # 5 clusters of 2: 2,2,2,2,1
    assert empty.ok and empty.batch_per_block == 2
    empty = P.persistent_fit("lstm", 128, 9, props, clusters=8)   # of 2: the last two empty
    assert not empty.ok and "leave the last empty" in empty.reason


def test_cluster_geometry_emulation_matches_the_reference():
    """The cluster decomposition in NumPy (each cluster its batch slice, each rank its
    units, all of R per cluster): equal to the float64 reference; every element of h_{t+1}
    written by exactly one thread of the grid."""
    for cell in CELLS:
        T, B, H = 3, 19, 37
        data, ref = layer_case(cell, T, B, H)
        f = P.geometry(cell, H, B, _ceil(H, P.PK_CLUSTER), 64, k_tile=P.full_tile(H),
                       clusters=3)
        assert f.ok and f.blocks == 24, f.describe()
        assert (P.ownership(f) == 1).all()
        h, c, act = P.emulate(cell, f, **data)
        assert_close(h, ref["h"], 1e-12, 1e-12, name=f"{cell} h")
