"""The per-layer persistent kernels' fit (rnnrt/kernels/persistent.py), checked without a GPU:
on an H100's properties at the paper's sizes (256 threads, all of h_t in one tile where it
fits, else the fewest even tiles), its choice of block among BLOCK_SIZES (fewest tiles, then
at most KG_MAX k-groups, then the largest), on a small made-up GPU and with fewer registers
(registers cap the block, shared memory shrinks the block or the tile, U*B > PK_CPT*threads
is refused), the k_tile knob (refused unless a multiple of 4, or when its tile does not fit);
the cluster kernels' fit (where it fits and pays, sm_90 only, its knobs checked).
"""
from __future__ import annotations

import pytest

from rnnrt.kernels import emulate as E
from rnnrt.kernels import persistent as P
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.sources import source
from testkit import CELLS, H100, SMALL, ceil

SRC = source("persistent.cu")


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
        assert (E.ownership(f) == 1).all()
    else:
        assert why in f.reason and "DOES NOT FIT" in f.describe(), f.reason


def _limit(props):
    return min(props["sharedMemPerBlockOptin"],
               props["sharedMemPerMultiprocessor"] - props["reservedSharedMemPerBlock"])


def _blocks_allowed(props, regs=255):
    """BLOCK_SIZES the device takes at ``regs`` registers a thread (per warp rounded up to
    256) and at most 256 threads."""
    per_warp = ceil(regs * 32, 256) * 256
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
    """The grid kernel's counter takes (T-1) x blocks arrivals: T = 2^32 / 128 + 1 with 128
    blocks wraps it, one step fewer does not; a cluster kernel never touches it."""
    f = P.persistent_fit("lstm", 512, 64, H100)
    assert f.blocks == 128 and f.barrier_arrivals(5) == 4 * 128
    f.check_steps(1)
    f.check_steps(10**6)
    f.check_steps(2**32 // 128)
    with pytest.raises(ValueError, match="overflow"):
        f.check_steps(2**32 // 128 + 1)
    with pytest.raises(ValueError, match="overflow"):
        f.check_steps(2**32 // 128 + 2)
    with pytest.raises(ValueError, match="T = 0"):
        f.check_steps(0)
    cl = P.persistent_fit("lstm", 128, 8, dict(H100, major=9), kind="cluster")
    assert cl.ok and cl.cluster and cl.barrier_arrivals(2**31 - 1) == 0
    cl.check_steps(2**31 - 1)


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
