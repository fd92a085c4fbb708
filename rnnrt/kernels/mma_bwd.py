"""The tensor-core per-layer backward grid kernels (cuda_src/persistent_mma_bwd.cu,
``*_persistent_mma_bwd``): how one layer's backward is cut (``mma_bwd_geometry``), which
shapes they take (``mma_bwd_fit``), and their NumPy twins (emulate_bwd.py's emulation over
this cut).

persistent_bwd.py's grid kernel with the product on tensor cores: block x owns hidden units
[x*U, x*U + U) and keeps their U rows of R^T (all K = G*H gate rows) in shared memory, one
block per SM, dg_{t+1} staged from L2 each step in tiles of k_tile columns, the flag grid
barrier between steps. Each of the block's NW warps is one k-group (lanes (1, 1, 1), as the
forward tensor-core kernel, mma.py): it stages and multiplies its own CPW float4 chunks of
every tile, in two halves, with mma.sync m16n8k16 (A = the R^T slice, m16 tiles of units;
B = dg_{t+1}^T, n8 tiles of batches; bf16 / fp16 operands, fp32 accumulation), and the
pointwise phase sums the warps' partial sums in warp order. The layout and the block choice
are mma.py's (``mma_layout``, ``mma_grid_fit``) over the backward's product (one row a unit,
depth G*H: ``BwdFit.product``).

bfloat16 and float16 keys only (mma.MMA_DTYPES_REASON): the typed FMA backward already
stores dg rounded to the storage type and reads R rounded to it, so both operands are exact
in the tensor core's input type and their products exact in fp32: the same math as the typed
FMA kernel up to the order of the sum over k.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..cells import get_cell
from .budget import DeviceBudget, ceil_div
from .mma import MmaFit, mma_grid_fit, mma_layout
from .persistent import BLOCK_SIZES, PK_MAX_THREADS
from .persistent_bwd import L2_BYTES_PER_US, STEP_FIXED_US, BwdFit, by_cost_model

NVCC_REGS = {"lstm": 255, "gru": 255, "rnn_tanh": 255, "rnn_relu": 255}
"""Registers a thread the fit assumes: the most __launch_bounds__(256, 1) allows (nvcc 13.0,
sm_90a, --resource-usage: LSTM 242, GRU and the RNNs 237, bf16 and fp16 alike, no spills; a
test holds nvcc to at most these)."""

MMAS_PER_US_PER_SM = 0.5 * 1980
"""mma.sync m16n8k16 a microsecond an SM in the cost model: one every two clocks at 1.98 GHz
(a guess, not a measurement: each mma's fragments are loaded from fp32 shared memory and
packed first, about 2.5 loads an mma at one group of register tiles; the bench's timings are
what calibrates it)."""
STAGED_BYTES = 2
"""Bytes an element of dg_t staged from L2 (the bf16 / fp16 storage the kernel reads)."""


def kernel_name(cell: str) -> str:
    """'lstm' -> 'lstm_persistent_mma_bwd'."""
    return f"{get_cell(cell).name}_persistent_mma_bwd"


@dataclass(frozen=True)
class MmaBwdFit(BwdFit, MmaFit):
    """How one layer's backward runs as one tensor-core grid launch: a BwdFit (the plan
    builder reads its kernel, grid, block, shared memory and scalars; the emulation its
    units, k-groups and chunks: rows M = U, depth K = G*H) with MmaFit's register tiles
    (``m_tiles`` m16 tiles of units x ``n_tiles`` n8 tiles of batches a warp)."""

    @property
    def kernel(self) -> str:
        return kernel_name(self.cell)

    def step_us(self) -> float:
        """The cost model's microseconds a step: fixed + dg_t staged by every block (16-bit
        elements) + the mma.sync of one block (m16 x n8 tiles over k16 steps: padded rows
        and batches cost as much as real ones)."""
        staged = STAGED_BYTES * self.blocks * self.batch * self.depth
        mmas = self.m_tiles * self.n_tiles * ceil_div(self.depth, 16)
        return STEP_FIXED_US + staged / L2_BYTES_PER_US + mmas / MMAS_PER_US_PER_SM

    def describe(self) -> str:
        head = (f"{self.cell} backward H {self.hidden} B {self.batch}: tensor-core grid kernel "
                f"(mma.sync m16n8k16), U {self.units_per_block}, {self.blocks} blocks x "
                f"{self.threads} threads ({self.k_groups} warps = k-groups, "
                f"{self.m_tiles} x {self.n_tiles} m16 x n8 tiles a warp in "
                f"{self.tile_groups} group{'' if self.tile_groups == 1 else 's'}), k_tile "
                f"{self.k_tile} of {self.depth} ({self.tiles} tile"
                f"{'' if self.tiles == 1 else 's'} a step), shared {self.smem_bytes} B (R^T "
                f"{self.smem_r} + dg tile {self.smem_tile} + partials {self.smem_partials}), "
                f"~{self.step_us():.1f} us a step modelled")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def mma_bwd_geometry(cell: str, hidden: int, batch: int, units_per_block: int,
                     threads: int = BLOCK_SIZES[0], k_tile: int | None = None) -> MmaBwdFit:
    """The kernel's cut for U = ``units_per_block``, blocks of ``threads``, ``k_tile``
    columns of dg_t a tile (default: all K = G*H, rounded up to 4), no device checks (ok
    False where the kernel would trap). The layout is the kernel's pk_geom<true> with M = U,
    K = G*H: R^T slice [U][mma_stride(K)], dg tile [B][mma_stride(k_tile)], partial sums
    [NW][U][mma_stride(B)] floats (mma.mma_layout)."""
    return mma_layout(MmaBwdFit, cell, hidden, batch, units_per_block, threads, k_tile)


def mma_bwd_fit(cell: str, hidden: int, batch: int, props: dict, dtype="bfloat16", *,
                units_per_block: int | None = None, threads: int | None = None,
                k_tile: int | None = None, regs_per_thread: int | None = None) -> MmaBwdFit:
    """Fit one layer's backward onto the device ``props`` (CuPy's getDeviceProperties keys)
    at precision ``dtype``. Rules in order (the first that fails is the reason):
      0. dtype bfloat16 or float16 (mma.MMA_DTYPES_REASON), compute capability >= 8.0.
      1. U: given, else of U0 = ceil(H / SMs) and its doublings (fewer blocks: less of dg_t
         staged from L2 a step; up to 16 units the m16 tiles cost no more) the one whose
         step the cost model (``MmaBwdFit.step_us``) makes shortest among those that fit;
         blocks = ceil(H / U) <= SMs (one block per SM, all co-resident).
      2. The block (given, else each of BLOCK_SIZES): U * B cells <= PK_CPT a thread.
      3. Shared memory (R^T slice + dg tile + partial sums, ``mma_bwd_geometry``'s layout):
         k_tile given, else whole k16 steps where a tile fits, else the fewest even tiles;
         of the block sizes, the fewest tiles a step, then the largest.
      4. Registers (NVCC_REGS unless given) within the SM's.
    Any hidden size: columns past G*H, units past the block's and batches past B are zeros
    in the kernel's fragments, never stored."""
    name = get_cell(cell).name
    H, B = int(hidden), int(batch)
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       PK_MAX_THREADS, BLOCK_SIZES, threads)
    where = f"{name} backward hidden {H}, batch {B}, tensor-core grid kernel on {dev.sms} SMs"

    def at(u):
        return mma_grid_fit(dev, MmaBwdFit, name, H, B, u, k_tile, where, dtype)

    if units_per_block is not None:
        return at(int(units_per_block))
    return by_cost_model(dev, H, B, at)


# --- the registry's NumPy twins ---------------------------------------------------------------

def _fit_of(cell, B, H, units_per_block, k_tile, cluster):
    """(kernel name, fit) of the twin: the kernel's cut at the fit's default block size
    (BLOCK_SIZES[0]); the block size only changes which warp sums which columns, i.e. the
    order of the partial sums."""
    return kernel_name(cell), mma_bwd_geometry(cell, H, B, units_per_block, k_tile=k_tile)


def mma_bwd_twin(cell: str):
    """The registry's NumPy twin of ``cell``'s tensor-core backward grid kernel: the backward
    kernels' emulation (``emulate_bwd.emulate_bwd``: the key's rounding, the warps' columns
    ``emulate.k_columns`` over K = G*H, each warp's partial sum a matmul) over this cut. The
    kernel's order inside a k16 step is the tensor core's, so the twin is the same math, not
    the same bits."""
    from .emulate_bwd import twin_of
    return twin_of(cell, _fit_of, kernel_name(cell))
