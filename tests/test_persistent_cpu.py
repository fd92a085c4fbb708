"""The persistent kernels (cuda_src/persistent.cu, rnnrt/persistent.py), checked without a GPU.

- the NumPy emulation of the kernels' decomposition (block by block, step by step) equals
  ``reference.forward`` for one layer: every cell, with and without bias, odd H not divisible
  by the block count, B = 1 and 3, T = 1 and 7, h_t in one tile or in several (k_tile 8, 12,
  64, the last tile partial), several k-splits;
- the registry's twins, on padded views of one NaN-poisoned buffer with ld-0 biases, write
  exactly their outputs (slots 1..T), leave h0, c0 and the zero sync counters alone;
- every hidden unit, every (b, j) and every column k is owned exactly once;
- the fit on an H100's properties at the paper's sizes (512 threads, all of h_t in one tile
  where it fits, else the fewest even tiles), on a small made-up GPU (registers cap the
  block, shared memory shrinks the tile), and the k_tile knob (refused unless a multiple
  of 4, or when its tile does not fit);
- the registry's shapes, arguments and launch of persistent kernels (a stand-in for CuPy);
- the .cu compiles for sm_90 with nvcc and NVRTC, ptxas reports no spills, and the header
  records nvcc's registers; its constants are rnnrt.persistent's; the PTX stages h_t with
  PK_LD loads in flight and prefetches gx;
- the .cu itself on CPU threads (tests/persistent_host_sim.cpp): equals the reference and the
  emulation with 16-byte staging loads and with the 4-byte fallback (H or ldh not multiples
  of 4, h misaligned), in one tile and in several; ThreadSanitizer finds no race; a geometry
  that disagrees with the arguments (k_tile included) traps.
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
from rnnrt.ops import View
from test_kernels_cpu import _FakeCupy, _find_nvrtc, _nvrtc_compile

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
PERSISTENT = [k.name for k in K.REGISTRY if k.persistent]

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
# k_tile = H rounded up to 4) or in several, the last one partial
FITS = {
    "small-gpu": lambda cell, H, B: P.persistent_fit(cell, H, B, SMALL),  # U 7: 6 blocks
    "U5-64thr": lambda cell, H, B: P.geometry(cell, H, B, 5, threads=64),   # 8 blocks, KS 10
    "U5-64thr-kt12": lambda cell, H, B: P.geometry(cell, H, B, 5, threads=64,
                                                   k_tile=12),             # 12, 12, 12, 1
    "U19": lambda cell, H, B: P.geometry(cell, H, B, 19),                   # 8 blocks, 1 tile
    "U19-kt64": lambda cell, H, B: P.geometry(cell, H, B, 19, k_tile=64),   # 64, 64, 22 (v1)
    "U19-kt8": lambda cell, H, B: P.geometry(cell, H, B, 19, k_tile=8),     # 18 x 8, then 6
}
SHAPES = [("small-gpu", 37), ("U5-64thr", 37), ("U5-64thr-kt12", 37), ("U19", 150),
          ("U19-kt64", 150), ("U19-kt8", 150)]


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


def test_emulation_float32_within_fp32_tolerance():
    fit = P.persistent_fit("lstm", 150, 3, SMALL)
    data, ref = layer_case("lstm", 7, 3, 150, dtype=np.float32)
    h, c, act = P.emulate("lstm", fit, **data)
    assert h.dtype == np.float32
    for name, got in (("h", h), ("c", c), ("act", act)):
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
              ("rnn_relu", 1000, 5, 8, 512, 4), ("lstm", 33, 17, 33, None, None)]


@pytest.mark.parametrize("cell, H, B, U, threads, k_tile", PARTITIONS)
def test_every_unit_and_element_owned_exactly_once(cell, H, B, U, threads, k_tile):
    fit = P.geometry(cell, H, B, U, threads, k_tile=k_tile)
    assert fit.ok, fit.describe()
    units = [j for x in range(fit.blocks) for j in fit.units(x)]
    assert units == list(range(H)), "blocks must own consecutive units, each once"
    assert all(len(fit.units(x)) > 0 for x in range(fit.blocks)), "a block with no unit"
    assert (P.ownership(fit) == 1).all()
    for x in range(fit.blocks):
        tid, b, jj = P.owned(fit, x)
        assert len(set(zip(b.tolist(), jj.tolist()))) == len(b), f"block {x}: an element twice"
        assert (tid < fit.positions).all(), "only k-group 0 writes"
    cols = np.concatenate([P.k_columns(fit, g) for g in range(fit.k_split)])
    assert sorted(cols.tolist()) == list(range(H)), "every column k summed exactly once"
    roles = P.thread_roles(fit)
    active = roles["computes"]
    assert sorted(zip(roles["p"][active], roles["g"][active])) == \
        [(p, g) for p in range(fit.positions) for g in range(fit.k_split)]


def test_k_columns_follow_the_tiles():
    """k-group g sums, tile by tile, the float4 chunks g, g + KS, ... of each tile; the last
    tile may be partial and its last chunk cut at H."""
    f = P.geometry("rnn_tanh", 37, 1, 5, threads=64, k_tile=12)   # P 5, KS min(3, 12) = 3
    assert (f.k_split, f.tiles) == (3, 4)
    assert P.k_columns(f, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 24, 25, 26, 27, 36]
    assert P.k_columns(f, 1).tolist() == [4, 5, 6, 7, 16, 17, 18, 19, 28, 29, 30, 31]
    assert P.k_columns(f, 2).tolist() == [8, 9, 10, 11, 20, 21, 22, 23, 32, 33, 34, 35]
    f = P.geometry("rnn_tanh", 37, 1, 5, threads=64)               # one tile of 40: KS 10
    assert (f.k_tile, f.k_split, f.tiles) == (40, 10, 1)
    assert P.k_columns(f, 0).tolist() == [0, 1, 2, 3]
    assert P.k_columns(f, 9).tolist() == [36]
    f = P.geometry("rnn_tanh", 37, 1, 5, threads=64, k_tile=64)    # wider than H: one tile
    assert (f.tiles, f.k_split) == (1, 12)                          # KS min(16, 64 // 5)
    assert np.concatenate([P.k_columns(f, g) for g in range(12)]).tolist() == \
        [k for g in range(12) for k in range(4 * g, min(4 * g + 4, 37)) if g < 10]


def test_geometry_follows_the_kernel_formulas():
    f = P.geometry("lstm", 512, 64, 4)
    assert (f.batch_groups, f.positions, f.threads, f.k_split) == (16, 64, 512, 8)
    assert (f.k_tile, f.tiles) == (512, 1), "the default tile is all of h_t"
    assert P.stride_r(512) == 516 and P.stride_r(37) == 4 * 11 and P.stride_r(33) == 36
    # the h tile's row stride: k_tile as an odd number of float4s
    assert [P.tile_stride(k) for k in (4, 8, 12, 64, 512, 344)] == [4, 12, 12, 68, 516, 348]
    assert P.full_tile(37) == 40 and P.full_tile(512) == 512
    assert f.smem_r == 4 * 4 * 4 * 516 and f.smem_tile == 4 * 16 * 4 * 516
    assert f.smem_partials == 4 * 7 * 4 * 4 * 64
    f = P.geometry("lstm", 512, 64, 4, k_tile=64)      # v1's tiles: stride 68
    assert (f.tiles, f.k_split, f.smem_tile) == (8, 8, 4 * 64 * 68)
    f = P.geometry("lstm", 512, 64, 4, threads=512, k_tile=8)   # KS capped by k_tile / 4
    assert (f.k_split, f.smem_tile, f.smem_partials) == (2, 4 * 64 * 12, 4 * 1 * 4 * 4 * 64)
    # a block rounded up to whole warps may hold more k-groups than asked; KS follows it
    f = P.geometry("gru", 40, 5, 3)          # P = 6: min(KS_MAX, 40 / 4) = 10 -> 64 threads
    assert (f.positions, f.threads, f.k_split) == (6, 64, 10)
    f = P.geometry("gru", 40, 5, 3, threads=40)
    assert f.k_split == 6 and f.threads == 40
    f = P.geometry("lstm", 512, 1, 4)        # P = 4: KS_MAX k-groups, not 128
    assert (f.threads, f.k_split) == (64, P.KS_MAX)
    assert not P.geometry("lstm", 512, 64, 4, threads=32).ok
    assert not P.geometry("lstm", 512, 64, 4, threads=1024).ok
    f = P.geometry("lstm", 512, 64, 4, k_tile=6)
    assert not f.ok and "k_tile 6 is not a multiple of 4" in f.reason
    with pytest.raises(ValueError, match="units_per_block"):
        P.geometry("lstm", 512, 64, 0)
    with pytest.raises(ValueError, match="k_tile"):
        P.geometry("lstm", 512, 64, 4, k_tile=0)


# --- the fit ------------------------------------------------------------------------------

def test_fit_h100_lstm_paper_sizes():
    """512 threads (KS 8) and all of h_t in one tile at H 512: 64 x 516 floats = 132 KB of
    tile beside 33 KB of R; at H 1024 R takes 128 KB and h_t comes in 4 tiles of 256."""
    f = P.persistent_fit("lstm", 512, 64, H100)
    assert f.ok, f.describe()
    assert (f.units_per_block, f.blocks, f.threads, f.k_split) == (4, 128, 512, 8)
    assert (f.k_tile, f.tiles) == (512, 1)
    assert (f.smem_r, f.smem_tile, f.smem_partials) == (33024, 132096, 28672)
    assert f.smem_bytes == 193792 and f.kernel == "lstm_persistent_fwd"
    assert f.grid == (128, 1, 1) and f.block == (512, 1, 1)
    assert "k_tile 512 (1 tile a step)" in f.describe() and "1 tile of h_t" in f.reason
    f = P.persistent_fit("lstm", 1024, 64, H100)
    assert f.ok, f.describe()
    assert (f.units_per_block, f.blocks, f.threads, f.k_split) == (8, 128, 512, 4)
    assert (f.k_tile, f.tiles, f.smem_bytes) == (256, 4, 222720)
    f = P.persistent_fit("lstm", 2048, 64, H100)
    assert not f.ok
    assert "R slice alone is 4 gates x 16 units x 2048" in f.reason and "512 KiB" in f.reason
    assert "232448" in f.reason and "narrowest h tile (4 columns)" in f.reason, f.reason


@pytest.mark.parametrize("cell, H, tiles, k_tile", [
    ("gru", 512, 1, 512), ("rnn_tanh", 512, 1, 512), ("rnn_relu", 512, 1, 512),
    ("gru", 1024, 3, 344), ("rnn_tanh", 1024, 2, 512)])   # 1024 columns: 263 KB
def test_fit_h100_other_cells_b64(cell, H, tiles, k_tile):
    f = P.persistent_fit(cell, H, 64, H100)
    assert f.ok, f.describe()
    assert (f.threads, f.tiles, f.k_tile) == (512, tiles, k_tile), f.describe()


@pytest.mark.parametrize("cell, H, B, ok", [
    ("gru", 512, 64, True), ("gru", 1024, 64, True), ("gru", 2048, 64, False),
    ("rnn_tanh", 2048, 64, True), ("rnn_relu", 4096, 64, False), ("lstm", 100, 64, True),
    ("lstm", 1024, 256, True), ("lstm", 1024, 512, False), ("lstm", 512, 1, True),
    ("lstm", 37, 3, True), ("rnn_relu", 1000, 5, True)])
def test_fit_h100_other_shapes(cell, H, B, ok):
    f = P.persistent_fit(cell, H, B, H100)
    assert f.ok == ok, f.describe()
    assert f.blocks <= 132 and f.threads <= 512
    if ok:
        assert f.smem_bytes + 1024 <= 233472 and f.smem_bytes <= 232448
        assert (P.ownership(f) == 1).all()
    else:
        assert f.reason and "DOES NOT FIT" in f.describe()


def _limit(props):
    return min(props["sharedMemPerBlockOptin"],
               props["sharedMemPerMultiprocessor"] - props["reservedSharedMemPerBlock"])


@pytest.mark.parametrize("props", [H100, SMALL, dict(H100, multiProcessorCount=396)],
                         ids=["h100", "small", "3xSMs"])
def test_fit_takes_the_fewest_even_tiles_that_fit(props):
    """Every automatic k_tile fits, one tile fewer would not, and the tiles are even:
    k_tile = ceil(H / tiles) rounded up to 4 (no wider than needed for that many)."""
    limit, seen = _limit(props), set()
    for cell in ("lstm", "gru", "rnn_tanh"):
        for H in (64, 128, 150, 512, 1000, 1024, 2048, 4096):
            for B in (1, 3, 64, 256):
                f = P.persistent_fit(cell, H, B, props)
                if not f.ok:
                    continue
                assert f.smem_bytes <= limit
                assert f.k_tile == P.full_tile(-(-H // f.tiles)), f.describe()
                if f.tiles > 1:
                    wider = P.geometry(cell, H, B, f.units_per_block, f.threads,
                                       k_tile=P.full_tile(-(-H // (f.tiles - 1))))
                    assert wider.smem_bytes > limit, (f.describe(), wider.describe())
                seen.add(f.tiles > 1)
    assert seen == {True, False}, "want shapes with one tile and with several"


def test_fit_k_tile_knob():
    f = P.persistent_fit("lstm", 512, 64, H100, k_tile=64)
    assert f.ok and (f.k_tile, f.tiles, f.k_split, f.threads) == (64, 8, 8, 512)
    f = P.persistent_fit("lstm", 512, 64, H100, k_tile=8)      # KS <= k_tile / 4
    assert f.ok and (f.k_tile, f.tiles, f.k_split) == (8, 64, 2), f.describe()
    f = P.persistent_fit("lstm", 512, 64, H100, k_tile=6)
    assert not f.ok and "k_tile 6 is not a multiple of 4" in f.reason, f.reason
    f = P.persistent_fit("lstm", 1024, 64, H100, k_tile=1024)  # 260 KB of tile: too much
    assert not f.ok and "the h tile of 1024 columns" in f.reason and "232448" in f.reason
    f = P.persistent_fit("lstm", 150, 3, H100, k_tile=1024)    # wider than H: one tile
    assert f.ok and f.tiles == 1 and f.smem_tile == 4 * 4 * P.tile_stride(1024)


def test_fit_threads_512_where_the_registers_allow():
    """TARGET_THREADS (512) at 128 registers a thread fills an H100 SM's 64 K registers;
    with more registers a thread, or fewer registers an SM, the default block shrinks to
    what they allow instead of being refused."""
    assert P.TARGET_THREADS == 512
    assert P.persistent_fit("lstm", 512, 64, H100).threads == 512
    f = P.persistent_fit("lstm", 512, 64, H100, regs_per_thread=168)   # 12 warps of 5376
    assert f.ok and (f.threads, f.k_split) == (384, 6), f.describe()
    f = P.persistent_fit("lstm", 64, 32, SMALL)        # 32 K registers: 8 warps of 4096
    assert f.ok and f.threads <= 256 and f.threads == 192, f.describe()
    f = P.persistent_fit("lstm", 64, 32, SMALL, regs_per_thread=64)   # 16 warps: 512
    assert f.ok and f.threads == 448, f.describe()      # P 88 x 5 k-groups, whole warps
    f = P.persistent_fit("lstm", 64, 32, SMALL, threads=512)          # asked for: refused
    assert not f.ok and "registers" in f.reason


def test_fit_small_gpu():
    f = P.persistent_fit("lstm", 64, 32, SMALL)
    assert f.ok, f.describe()
    assert (f.units_per_block, f.blocks, f.tiles) == (11, 6, 1)
    # 22 units x 4 gates x 128: 46 KB of R leaves 2.6 KB of 48 KB: 7 tiles of 20 columns
    f = P.persistent_fit("lstm", 128, 32, SMALL)
    assert f.ok and (f.k_tile, f.tiles) == (20, 7), f.describe()
    assert f.smem_bytes <= 49152 < P.geometry("lstm", 128, 32, 22, f.threads,
                                              k_tile=24).smem_bytes
    f = P.persistent_fit("lstm", 512, 64, SMALL)
    assert not f.ok and "R slice alone" in f.reason
    f = P.persistent_fit("rnn_tanh", 64, 32, SMALL, threads=512)   # 512 x 106 registers
    assert not f.ok and "registers" in f.reason, f.describe()
    f = P.persistent_fit("rnn_tanh", 64, 32, SMALL, threads=512, regs_per_thread=32)
    assert f.ok, f.describe()
    f = P.persistent_fit("gru", 64, 3, SMALL, units_per_block=4)   # 16 blocks on 6 SMs
    assert not f.ok and "16 blocks of 4 units > 6 SMs" in f.reason
    f = P.persistent_fit("gru", 64, 3, SMALL, units_per_block=32)  # 2 blocks: allowed
    assert f.ok and f.blocks == 2


def test_fit_nothing_hard_coded():
    """Three times the SMs: LSTM 2048 needs 6 units a block, 192 KiB of R, and fits (in
    narrow tiles)."""
    big = dict(H100, multiProcessorCount=396)
    f = P.persistent_fit("lstm", 2048, 64, big)
    assert f.ok and f.units_per_block == 6 and f.blocks == 342, f.describe()
    assert f.tiles > 1
    assert not P.persistent_fit("lstm", 2048, 64, H100).ok


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
    G = get_cell(kinfo.name.replace("_persistent_fwd", "")).gates
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
    cell = name.replace("_persistent_fwd", "")
    T, B, H, U = 7, 3, 37, 5
    data, ref = layer_case(cell, T, B, H, bias=bias)
    buf, place = _lay_out(kinfo, T, B, H, data, dtype)
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
        K.KernelInfo("x", "persistent.cu", outs=(("h", "R*T,C"),), ins=(), numpy_fn=None)


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
        assert (name, grid, block) == ("lstm_persistent_fwd", (128, 1, 1), (512, 1, 1))
        assert args[-3:] == (T, 8, 256) and args[:2] == (64, 1024), "T, U, k_tile last"
        assert fake.shared_mem[-1] == (name, 222720, 222720), "opt in past 48 KB, then launch"
        small = P.persistent_fit("rnn_tanh", 64, 8, H100)
        assert small.smem_bytes <= P.DEFAULT_SHARED_BYTES
        sk = K.KERNELS[small.kernel]
        o, i = sk.arg_shapes(8, 64, T=T)
        pairs = [(4096 * (n + 1), c) for n, (_, c) in enumerate(o + i)]
        lib.launch_persistent(small, pairs[:2], pairs[2:], T)
        assert fake.launches[-1][3][-3:] == (T, 1, 64)
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
    define = lambda n: int(re.search(rf"#define {n} (\d+)", SRC)[1])   # noqa: E731
    assert define("PK_BT") == P.PK_BT and define("PK_LD") == P.PK_LD
    assert define("PK_MAX_THREADS") == P.PK_MAX_THREADS
    assert "PK_KT" not in SRC, "the tile width is the k_tile argument now"
    assert "return 4 * (((H + 3) / 4) | 1);" in SRC          # stride_r
    assert "const int SH = pk_stride_r(KT);" in SRC            # tile_stride
    assert "const int KS = max(1, min(KT / 4, nt / P));" in SRC
    assert "if (U < 1 || B < 1 || H < 1 || KT < 4 || KT % 4 != 0) __trap();" in SRC
    assert "__launch_bounds__(PK_MAX_THREADS, 1)" in SRC
    # the shared memory the kernel checks for is the fit's sum, term by term
    assert "4LL * ((long long)G * U * SR + (long long)NB * PK_BT * SH\n" \
           "                                  + (long long)(KS - 1) * G * PK_BT * P)" in SRC


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


def test_nvcc_resource_usage_no_spills_and_recorded(tmp_path):
    nvcc = _nvcc()
    cmd = [nvcc, "-arch=sm_90", "--cubin", "-std=c++17", "--resource-usage",
           "-o", str(tmp_path / "k.cubin"), str(K.cuda_src_dir() / "persistent.cu")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    usage = _resource_usage(r.stdout + r.stderr)
    assert set(usage) == set(PERSISTENT), usage
    header = {m[0]: int(m[1]) for m in re.findall(r"\*\s+(\w+_persistent_fwd)\s+(\d+) registers",
                                                   SRC)}
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    for name, (regs, stack, st, ld) in usage.items():
        cell = name.replace("_persistent_fwd", "")
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert regs <= P.NVCC_REGS[cell], f"{name}: {regs} registers > the fit's {P.NVCC_REGS}"
        if "release 13.0" in version:   # the header records this toolkit's numbers
            assert header[name] == regs, f"{name}: header records {header[name]}, nvcc {regs}"


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
    assert set(usage) == set(PERSISTENT), usage
    for name, (regs, stack, st, ld) in usage.items():
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert regs <= P.NVCC_REGS[name.replace("_persistent_fwd", "")], (name, regs)


def _nvcc_ptx(tmp_path):
    out = tmp_path / "k.ptx"
    r = subprocess.run([_nvcc(), "-arch=sm_90", "-ptx", "-std=c++17", "-o", str(out),
                        str(K.cuda_src_dir() / "persistent.cu")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    bodies = re.split(r"\.entry\s+", text)[1:]
    return {b[:b.index("(")].strip(): b for b in bodies}


def _longest_run(lines, want, breaks):
    """The longest run of lines matching ``want`` with no line matching ``breaks`` between."""
    best = run = 0
    for line in lines:
        if re.search(want, line):
            run += 1
            best = max(best, run)
        elif re.search(breaks, line):
            run = 0
    return best


def test_ptx_stages_h_with_pk_ld_loads_in_flight(tmp_path):
    """Each kernel's h staging issues a batch of PK_LD loads before the first store to
    shared memory, 16-byte (ld.global.cg.v4) and, for the fallback, 4-byte; the batch's
    stores are 16-byte stores (st.shared.v4: no 4-way bank conflicts). v1 loaded one float,
    stored it, loaded the next."""
    for name, body in _nvcc_ptx(tmp_path).items():
        lines = body.splitlines()
        assert _longest_run(lines, r"ld\.global\.cg\.v4\.f32", r"st\.shared") >= P.PK_LD, name
        assert _longest_run(lines, r"ld\.global\.cg\.f32", r"st\.shared") >= P.PK_LD, name
        assert _longest_run(lines, r"st\.shared\.v4\.f32", r"ld\.global") >= P.PK_LD, name


def test_ptx_prefetches_the_pointwise_inputs(tmp_path):
    """gx is loaded with the streaming hint (ld.global.cs) at two places, G * PK_BT loads
    each: before the first step's dot products and before each grid barrier (the next
    step's); v1 loaded it after the dot products, plain."""
    for name, body in _nvcc_ptx(tmp_path).items():
        G = get_cell(name.replace("_persistent_fwd", "")).gates
        lines = body.splitlines()
        cs = [i for i, line in enumerate(lines) if "ld.global.cs.f32" in line]
        fma = [i for i, line in enumerate(lines) if "fma.rn.f32" in line]
        assert len(cs) == 2 * G * P.PK_BT, (name, len(cs))
        assert cs[0] < fma[0], f"{name}: gx is not loaded before the dot products"


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


def test_sass_keeps_the_staging_loads_in_flight(tmp_path):
    """What ptxas makes of it: in each kernel's SASS a run of PK_LD 16-byte L2 loads
    (LDG.E.128.STRONG.GPU) with no shared-memory store between them (ptxas interleaved
    stores into the batch when the addresses took long to compute)."""
    cubin = tmp_path / "k.cubin"
    r = subprocess.run([_nvcc(), "-arch=sm_90", "--cubin", "-std=c++17", "-o", str(cubin),
                        str(K.cuda_src_dir() / "persistent.cu")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in PERSISTENT:
        r = subprocess.run([_cuobjdump(), "-sass", "-fun", name, str(cubin)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert _longest_run(lines, r"LDG\.E\.128\.STRONG\.GPU", r"\bSTS") >= P.PK_LD, name


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
            tmp_path, ld["h"], ld["c"], ld["act"], ld["gx"], ld["w"], 0, 0, fit.k_tile, h_offset]
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"host simulation failed ({r.returncode}):\n{r.stderr}"
    loads = dict(zip(r.stdout.split()[::2], map(int, r.stdout.split()[1::2])))
    raw = {name: np.fromfile(tmp_path / f"{name}.out", np.float32).reshape(arrays[name].shape)
           for name in ("h", "c", "act")}
    h = raw["h"][:, :H].reshape(T + 1, B, H)
    c = raw["c"][:, :H].reshape(T + 1, B, H) if cell == "lstm" else None
    act = raw["act"][:, :4 * H].reshape(T, B, 4 * H) if G > 1 else None
    return (h, c, act), raw, arrays, loads


# (H, B, T, U, threads, k_tile, pad): last block partial, KS > 1, one tile and several (the
# last partial), T = 1; H 37 or pad 3 (ldh not a multiple of 4): 4-byte staging loads;
# H 40 with pad 4: 16-byte ones
SIM_CASES = [(37, 3, 5, 5, 32, None, 3), (150, 5, 3, 19, 96, 64, 3), (37, 1, 1, 7, 32, 8, 3),
             (40, 3, 4, 6, 64, None, 4), (40, 5, 3, 6, 64, 12, 4)]


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
    step's reads are ordered by the barrier (no report), with either staging path and with
    one tile or several, and the checker is not vacuous: without the __syncthreads before
    thread 0 arrives, it reports a data race."""
    src = K.cuda_src_dir() / "persistent.cu"
    exe = _build_sim(tmp_path / "sim_tsan", src, tsan=True)
    T, B, U, threads = 4, 3, 5, 32
    for cell, H, pad, k_tile in (("lstm", 37, 3, None), ("gru", 37, 3, 12),
                                 ("rnn_tanh", 40, 4, None), ("rnn_relu", 40, 4, 12)):
        fit = P.geometry(cell, H, B, U, threads, k_tile=k_tile)
        data, ref = layer_case(cell, T, B, H, dtype=np.float32)
        work = tmp_path / cell
        work.mkdir()
        (h, _, _), _, _, loads = run_host_sim(exe, work, cell, fit, data, T, launches=1,
                                              pad=pad)
        assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name=f"{cell} h under TSan")
        assert (loads["ldcg128"] > 0) == (pad == 4)

    first_sync = "    __syncthreads();   // the whole block's writes of this step are issued\n"
    text = src.read_text()
    assert first_sync in text
    broken = tmp_path / "persistent_no_sync.cu"
    broken.write_text(text.replace(first_sync, "", 1))
    exe = _build_sim(tmp_path / "sim_tsan_broken", broken, tsan=True)
    H = 37
    fit = P.geometry("lstm", H, B, U, threads)
    data, _ = layer_case("lstm", T, B, H, dtype=np.float32)
    work = tmp_path / "broken"
    work.mkdir()
    with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
        run_host_sim(exe, work, "lstm", fit, data, T, launches=1)


@pytest.mark.parametrize("broken", ["smem", "threads", "units", "k_tile", "k_tile_smem"])
def test_kernel_traps_on_a_geometry_that_disagrees(host_sim, tmp_path, broken):
    """Less dynamic shared memory than the layout needs, fewer threads than positions, a
    grid that leaves units out, a k_tile that is not a multiple of 4, or a k_tile wider than
    the shared memory was sized for: the kernel traps at once instead of computing garbage."""
    from dataclasses import replace
    fit = P.geometry("lstm", 37, 3, 5, 32)
    assert fit.k_tile == 40
    bad = {"smem": replace(fit, smem_partials=fit.smem_partials - 4),
           "threads": replace(fit, threads=fit.positions - 1),
           "units": replace(fit, blocks=7),                 # 7 blocks x 5 units < 37
           "k_tile": replace(fit, k_tile=38),               # shared memory sized for 40
           "k_tile_smem": replace(fit, k_tile=48)}[broken]  # 48 needs a wider tile
    data, _ = layer_case("lstm", 2, 3, 37, dtype=np.float32)
    with pytest.raises(AssertionError, match=r"__trap\(\)"):
        run_host_sim(host_sim, tmp_path, "lstm", bad, data, 2, launches=1)
