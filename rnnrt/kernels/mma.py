"""The tensor-core per-layer grid kernels (cuda_src/persistent_mma.cu, ``*_persistent_mma_fwd``):
how one layer is cut (``mma_geometry``) and which shapes they take (``mma_fit``). The NumPy
twin is the grid kernel's emulation (``emulate.emulate``) over this cut.

The grid kernel of persistent.py, with the product on tensor cores: block x owns hidden units
[x*U, x*U + U) (all G gate rows: M = G*U rows of R in shared memory), one block per SM, h_t
staged from L2 each step in tiles of k_tile columns, the flag grid barrier between steps.
Each of the block's NW warps is one k-group (NKG = NW; lanes (1, 1, 1) in Fit's terms): it
stages and multiplies its own CPW float4 chunks of every tile, in two halves (the FMA path's
cp.async ping-pong), with mma.sync m16n8k16 (bf16 / fp16 operands, fp32 accumulation) over
m16 x n8 tiles of its partial sums, and writes them into red[warp][r][b]; the pointwise
phase sums the warps' partial sums in warp order, as the FMA kernel sums its k-groups.

bfloat16 and float16 keys only: the operands are then exact in the tensor core's input type
(the typed grid kernel reads R and h rounded to the storage type; their products are exact
in fp32), so the kernel computes the FMA kernel's math up to summation order. float32 and
tf32 keys decline (MMA_DTYPES_REASON). The backward's tensor-core grid kernel
(persistent_mma_bwd.cu) is mma_bwd.py's: the same layout (``mma_layout``) and block choice
(``mma_grid_fit``) over its product (one row of R^T a unit, depth G*H).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cells import get_cell
from ..precision import get_precision
from .budget import DeviceBudget, ceil_div
from .persistent import (BLOCK_SIZES, PK_MAX_THREADS, Fit, block_problem, fewest_tiles,
                         finish_fit, full_tile)

# The kernel's compile-time constants (cuda_src/persistent_mma.cuh; a test holds them equal).
PK_MMA_MT = 2   # m16 tiles of rows a warp accumulates at once
PK_MMA_NT = 8   # n8 tiles of batches a warp accumulates at once
MMA_K = 16      # columns of one mma.sync k step

MMA_DTYPES = ("bfloat16", "float16")
"""The precisions the tensor-core kernels run (their operand types)."""
MMA_DTYPES_REASON = ("the tensor-core grid kernel multiplies bf16 / fp16 operands (mma.sync "
                     "m16n8k16, fp32 accumulation): it runs bfloat16 and float16 keys only; "
                     "float32 and tf32 keys run the FMA kernels")

NVCC_REGS = {"lstm": 255, "gru": 255, "rnn_tanh": 255, "rnn_relu": 255}
"""Registers a thread the fit assumes: the most __launch_bounds__(256, 1) allows (nvcc 13.0,
sm_90a, --resource-usage: LSTM 248, GRU 246, the RNNs 237, bf16 and fp16 alike, no spills;
NVRTC's may differ, so the fit keeps the bound, as persistent.NVCC_REGS does)."""


def kernel_name(cell: str) -> str:
    """'lstm' -> 'lstm_persistent_mma_fwd'."""
    return f"{get_cell(cell).name}_persistent_mma_fwd"


def mma_stride(n: int) -> int:
    """Row stride (floats) of an array of n-float rows read by fragment loads (the kernel's
    pk_mma_stride): n rounded up to 32, plus 8 (8-byte loads of 4 consecutive rows cover
    the 32 banks once)."""
    return 32 * ceil_div(n, 32) + 8


def k_step_quantum(threads: int) -> int:
    """The k_tile multiple that makes each warp's half of its chunks of a tile whole k16
    steps: NW warps x CPW chunks, CPW a multiple of 8 (two halves of 4 chunks = 16 columns):
    32 columns a warp."""
    return 2 * MMA_K * max(1, threads // 32)


@dataclass(frozen=True)
class MmaFit(Fit):
    """How one layer runs as one tensor-core grid launch (a ``persistent.Fit``: the plan
    builders read its kernel, grid, block, shared memory and scalars as the grid kernel's;
    the emulation reads its units, k-groups and chunks). lanes (1, 1, 1): a warp is one
    k-group, k_groups = warps. ``m_tiles`` x ``n_tiles``: the m16 x n8 tiles of a warp's
    partial sums; more than PK_MMA_MT x PK_MMA_NT and the warp loops over groups of them,
    adding each half's sums into shared memory."""

    @property
    def kernel(self) -> str:
        return kernel_name(self.cell)

    @property
    def m_tiles(self) -> int:
        return ceil_div(self.rows, 16)

    @property
    def n_tiles(self) -> int:
        return ceil_div(self.batch, 8)

    @property
    def tile_groups(self) -> int:
        """Groups of register tiles a warp runs a half (1: kept over all h tiles)."""
        return ceil_div(self.m_tiles, PK_MMA_MT) * ceil_div(self.n_tiles, PK_MMA_NT)

    @property
    def whole_steps(self) -> bool:
        """Whether every warp's half of its chunks of a full tile is whole k16 steps."""
        return self.chunks_per_warp % 8 == 0

    def describe(self) -> str:
        head = (f"{self.cell} H {self.hidden} B {self.batch}: tensor-core grid kernel "
                f"(mma.sync m16n8k16), U {self.units_per_block}, {self.blocks} blocks x "
                f"{self.threads} threads ({self.k_groups} warps = k-groups, "
                f"{self.m_tiles} x {self.n_tiles} m16 x n8 tiles a warp in "
                f"{self.tile_groups} group{'' if self.tile_groups == 1 else 's'}), k_tile "
                f"{self.k_tile} ({self.tiles} tile{'' if self.tiles == 1 else 's'} a step), "
                f"shared {self.smem_bytes} B (R {self.smem_r} + h tile {self.smem_tile} + "
                f"partials {self.smem_partials})")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def mma_geometry(cell: str, hidden: int, batch: int, units_per_block: int,
                 threads: int = BLOCK_SIZES[0], k_tile: int | None = None) -> MmaFit:
    """The kernel's cut for U = ``units_per_block``, blocks of ``threads``, ``k_tile``
    columns a tile (default: all of H, rounded up to 4), no device checks (ok False where
    the kernel would trap: threads not whole warps or past PK_MAX_THREADS, more than PK_CPT
    cells a thread, k_tile not a positive multiple of 4). The layout is the kernel's
    pk_geom<true>: R slice [M][mma_stride(H)], h tile [B][mma_stride(k_tile)], partial sums
    [NW][M][mma_stride(B)] floats."""
    return mma_layout(MmaFit, cell, hidden, batch, units_per_block, threads, k_tile)


def mma_layout(fit_class: type[MmaFit], cell: str, hidden: int, batch: int,
               units_per_block: int, threads: int = BLOCK_SIZES[0],
               k_tile: int | None = None) -> MmaFit:
    """The tensor-core grid kernels' cut (pk_geom<true>) over the product ``fit_class``
    names (``Fit.product``: M = rows a unit x U rows of depth K; the forward's MmaFit G*U x
    H, the backward's mma_bwd.MmaBwdFit U x G*H): slice [M][mma_stride(K)], tile
    [B][mma_stride(k_tile)] (k_tile default: all K, rounded up to 4), partial sums
    [NW][M][mma_stride(B)] floats; ok False where the kernel would trap."""
    for what, v in (("hidden", hidden), ("batch", batch), ("units_per_block", units_per_block),
                    ("threads", threads), ("k_tile", 4 if k_tile is None else k_tile)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"mma: {what} must be a positive int, got {v!r}")
    spec = get_cell(cell)
    H, B, U, nt = int(hidden), int(batch), int(units_per_block), int(threads)
    per_unit, K = fit_class.product(spec.gates, H)
    kt = full_tile(K) if k_tile is None else int(k_tile)
    nw = max(1, nt // 32)
    M = per_unit * U
    fit = fit_class(cell=spec.name, hidden=H, batch=B, ok=True, reason="fits",
                    units_per_block=U, blocks=ceil_div(H, U), threads=nt, lanes=(1, 1, 1),
                    k_groups=nw, cells_per_thread=ceil_div(U * B, nt), k_tile=kt,
                    smem_r=4 * M * mma_stride(K), smem_tile=4 * B * mma_stride(kt),
                    smem_partials=4 * nw * M * mma_stride(B))
    problem = block_problem(kt, nt, PK_MAX_THREADS, U, B)
    return replace(fit, ok=False, reason=problem) if problem else fit


def whole_step_tile(hidden: int, threads: int, smem_of, limit: int) -> int | None:
    """The k_tile the fit takes for blocks of ``threads``: the fewest tiles over ``hidden``
    columns whose shared memory ``smem_of(k_tile)`` <= ``limit``, each tile a multiple of
    ``k_step_quantum(threads)`` (every warp's half of its chunks whole k16 steps: no step
    half masked to zeros); None when even one quantum does not fit. Why not the FMA fit's
    narrowest even tiles: a warp's half of CPW chunks is 2 * CPW columns, and a k16 step
    reading past the half multiplies zeros (correct, but tensor-core time for nothing)."""
    q = k_step_quantum(threads)
    n = 1
    while True:
        kt = q * ceil_div(ceil_div(hidden, n), q)
        if smem_of(kt) <= limit:
            return kt
        if kt <= q:
            return None
        n = max(n + 1, ceil_div(hidden, kt - q))


def mma_declines(dtype) -> str | None:
    """MMA_DTYPES_REASON unless precision ``dtype`` is one the kernels run; else None."""
    return None if get_precision(dtype).name in MMA_DTYPES else MMA_DTYPES_REASON


def mma_fit(cell: str, hidden: int, batch: int, props: dict, dtype="bfloat16", *,
            units_per_block: int | None = None, threads: int | None = None,
            k_tile: int | None = None, regs_per_thread: int | None = None) -> MmaFit:
    """Fit one layer onto the device ``props`` (CuPy's getDeviceProperties keys, as
    persistent.persistent_fit), at precision ``dtype``. Rules in order (the first that fails
    is the reason):
      0. dtype bfloat16 or float16 (MMA_DTYPES_REASON), compute capability >= 8.0.
      1. U = ceil(H / SMs) unless given, blocks = ceil(H / U) <= SMs (one block per SM, all
         co-resident, as the grid kernel).
      2. The block (given, else each of BLOCK_SIZES): U * B cells <= PK_CPT a thread.
      3. Shared memory (R slice + h tile + partial sums, mma_geometry's layout) within a
         block's: k_tile given, else ``whole_step_tile``, else (no whole-step tile fits)
         persistent.fewest_tiles; of the block sizes, the fewest tiles a step, then the
         largest.
      4. Registers (NVCC_REGS unless given) within the SM's.
    Any hidden size: columns past H, rows past G*U and batches past B are zeros in the
    kernel's fragments, never stored."""
    name = get_cell(cell).name
    H, B = int(hidden), int(batch)
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       PK_MAX_THREADS, BLOCK_SIZES, threads)
    U = int(units_per_block) if units_per_block is not None else ceil_div(H, dev.sms)
    where = f"{name} hidden {H}, batch {B}, tensor-core grid kernel on {dev.sms} SMs"
    return mma_grid_fit(dev, MmaFit, name, H, B, U, k_tile, where, dtype)


def mma_grid_fit(dev: DeviceBudget, fit_class: type[MmaFit], name: str, H: int, B: int,
                 U: int, k_tile: int | None, where: str, dtype) -> MmaFit:
    """A tensor-core grid kernel's fit of class ``fit_class`` (MmaFit, or the backward's
    mma_bwd.MmaBwdFit) at U units a block on ``dev``: of the block sizes, the fewest tiles a
    step, then the largest (k_tile given, else ``whole_step_tile`` over the depth K, else
    ``fewest_tiles``); then mma_fit's rules 0, 1 and ``finish_fit`` (shared memory,
    registers); ``where`` opens every refusal."""
    K = fit_class.product(get_cell(name).gates, H)[1]
    scored = []
    for t in dev.candidates:
        def smem_of(k, t=t):
            return mma_layout(fit_class, name, H, B, U, t, k).smem_bytes

        # whole k16 steps where they fit, else the FMA fit's narrower even tiles (the last
        # step of a warp's half partly masked: correct, fewer tensor-core steps of use)
        kt = k_tile if k_tile is not None else (whole_step_tile(K, t, smem_of, dev.limit)
                                                or fewest_tiles(K, smem_of, dev.limit)
                                                or k_step_quantum(t))
        f = mma_layout(fit_class, name, H, B, U, t, kt)
        fits = f.ok and f.smem_bytes <= dev.limit
        scored.append(((not fits, f.tiles, -t), f))
    fit = replace(min(scored, key=lambda x: x[0])[1], sms=dev.sms, regs_per_thread=dev.regs)

    def no(why):
        return replace(fit, ok=False, reason=f"{where}: {why}")

    storage = mma_declines(dtype)
    if storage is not None:
        return no(f"{get_precision(dtype).name}: {storage}")
    if dev.cc_major < 8:
        return no(f"mma.sync with bf16 operands needs compute capability 8.0 or later "
                  f"(device: {dev.cc_major}.x)")
    if fit.blocks > dev.sms:
        return no(f"{fit.blocks} blocks of {U} units > {dev.sms} SMs; the kernel needs one "
                  f"block per SM, all resident at once (U >= {ceil_div(H, dev.sms)})")
    fit = finish_fit(dev, fit, where, given_k_tile=k_tile is not None)
    if not fit.ok:
        return fit
    return replace(fit, reason=f"fits: {fit.blocks} of {dev.sms} SMs, {fit.tiles} tile"
                               f"{'' if fit.tiles == 1 else 's'} of {fit.STAGED}_t a step, "
                               f"{'whole' if fit.whole_steps else 'partly masked'} k16 steps")


# --- the registry's NumPy twins ---------------------------------------------------------------

def _fit_of(cell, B, H, units_per_block, k_tile, cluster):
    """(kernel name, fit, emulate's keywords) of the twin: the kernel's cut at the fit's
    default block size (BLOCK_SIZES[0]); the block size only changes which warp sums which
    columns, i.e. the order of the partial sums."""
    return kernel_name(cell), mma_geometry(cell, H, B, units_per_block, k_tile=k_tile), {}


def mma_twin(cell: str):
    """The registry's NumPy twin of ``cell``'s tensor-core grid kernel: the grid kernel's
    emulation (``emulate.emulate``: the key's rounding, the warps' columns ``k_columns``, each
    warp's partial sum a float32 matmul) over this cut. The kernel's order inside a k16 step
    is the tensor core's, so the twin is the same math, not the same bits."""
    from .emulate import twin_of
    return twin_of(get_cell(cell).name, _fit_of, kernel_name(cell))
