"""The per-layer persistent backward kernels (cuda_src/persistent_bwd.cu): how one layer's
recurrent chain is cut over the GPU (the fit), and the cost model of a step that the
selector's heuristic reads. ``emulate_bwd.py`` runs exactly that cut in NumPy.

One launch runs all T steps of one layer's backward, last first. Block x owns the hidden
units [x*U, min(H, x*U + U)): it keeps the U columns of R they index (all G*H gate rows: the
U rows of R^T, K = G*H long) in shared memory for the whole sequence, and each step reads
all of dg_{t+1} [B, K] (the gate gradients every block wrote the step before), multiplies
it by its slice into dh_rec of its units, runs the cell's pointwise backward on its (b, j)
cells and writes dg_t there; the grid barrier of the forward grid kernels separates the
steps. So the kernel is the forward grid kernel's GEMM with one "gate" and depth K = G*H:
``pk_geometry(1, U, B, K, k_tile, threads)`` in the .cu, ``bwd_geometry`` here; the lane grid,
tiles, staging halves, partial sums and the pointwise cells are the forward's (persistent.py
describes them) with M = U rows. Every block must be resident at once (one block per SM:
blocks <= SMs), as for the forward grid kernel.

What the kernel does not do: the gradients of W, R, the biases and the layer's input. They
are GEMMs over all T steps of the dg it writes (plan/backward_persistent.py).

``persistent_bwd_fit(cell, hidden, batch, props)`` chooses U (by the cost model, below), the
block size, the tile width and the dynamic shared memory from CuPy-style device properties
and says why when a shape does not fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cells import get_cell
from .budget import DeviceBudget, ceil_div
from .persistent import (
    BLOCK_SIZES,
    KG_MAX,
    PK_CPT,
    PK_MAX_THREADS,
    Fit,
    fewest_tiles,
    full_tile,
    lane_grid,
    partial_stride,
    stride_r,
    tile_stride,
)

NVCC_REGS = {"lstm": 255, "gru": 255, "rnn_tanh": 255, "rnn_relu": 255}
"""Registers a thread the fit assumes (the most __launch_bounds__(256, 1) allows; nvcc
13.0.88 gives LSTM 242, GRU 246, the RNNs 242, no spills; a test holds nvcc to at most
these)."""

# The cost model of one step (microseconds), calibrated on the forward grid kernel's H100
# measurements (docs/journal.md; the backward's own are the bench's to record):
#   step = STEP_FIXED_US + staged bytes (all blocks) / L2_BYTES_PER_US
#          + FMAs a block / FMAS_PER_US_PER_SM
# The forward grid kernel at GRU H 128 B 8 (128 blocks, next to nothing staged or
# multiplied) took 4.6 us a step: the fixed part (barrier, staging latency, pointwise,
# stores). At LSTM H 512 B 64 it took 11.6 us: 2048 FMAs a thread (256 threads, 128 FMAs a
# clock an SM at 1.98 GHz and ~65% issue efficiency, as the stack kernel's profile: ~3.2 us)
# and 128 blocks x 128 KiB of h_t staged a step (16.8 MB: the remaining ~3.9 us, ~4.3 TB/s
# out of L2).
STEP_FIXED_US = 4.5
L2_BYTES_PER_US = 4.3e6
FMAS_PER_US_PER_SM = 128 * 1980 * 0.65

def bwd_kernel_name(cell: str) -> str:
    """The persistent backward kernel of ``cell``: 'lstm' -> 'lstm_persistent_bwd'."""
    return f"{get_cell(cell).name}_persistent_bwd"


@dataclass(frozen=True)
class BwdFit(Fit):
    """How one layer's backward (cell, hidden H, batch B) runs as one persistent launch: the
    fields of ``persistent.Fit`` (a grid kernel: ``cluster`` 0), read for the backward's
    product: rows M = U (the units a block owns), depth K = G*H (``depth``: the columns of dg
    a step multiplies; ``tiles`` = ceil(K / k_tile)), smem_r the R^T slice [U][stride_r(K)]."""

    @property
    def kernel(self) -> str:
        return bwd_kernel_name(self.cell)

    @property
    def depth(self) -> int:
        """K = G * H: columns of dg_t (and rows of R) a step's product sums over."""
        return self.gates * self.hidden

    @property
    def rows(self) -> int:
        """M = U: rows of R^T a block holds."""
        return self.units_per_block

    def check_steps(self, steps: int) -> None:
        """Raise unless ``steps`` can run in one launch: T >= 1 and the barrier counter
        (T * blocks arrivals, an unsigned int) does not wrap."""
        if not 1 <= steps <= 2**31 - 1:
            raise ValueError(f"{self.kernel}: T = {steps} outside [1, 2^31-1]")
        if steps * self.blocks >= 2**32:
            raise ValueError(f"{self.kernel}: T = {steps} steps x {self.blocks} blocks overflow "
                             f"the 32-bit barrier counter; split the sequence")

    def step_us(self) -> float:
        """The cost model's microseconds a step (see the module's constants)."""
        return step_us(self.blocks, self.units_per_block, self.depth, self.batch)

    def describe(self) -> str:
        lr, lb, lk = self.lanes
        tiles = self.tiles
        head = (f"{self.cell} backward H {self.hidden} B {self.batch}: U {self.units_per_block}, "
                f"{self.blocks} blocks x {self.threads} threads (lanes {lr}x{lb}x{lk}, "
                f"{self.k_groups} k-groups), k_tile {self.k_tile} of {self.depth} ({tiles} tile"
                f"{'' if tiles == 1 else 's'} a step), shared {self.smem_bytes} B (R^T "
                f"{self.smem_r} + tile {self.smem_tile} + partials {self.smem_partials}), "
                f"~{self.step_us():.1f} us a step modelled")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def step_us(blocks: int, units: int, depth: int, batch: int) -> float:
    """The modelled microseconds of one step: fixed + staging (every block reads all of
    dg_t, batch x depth floats, from L2) + the FMAs of one block (units x depth x batch)."""
    staged = 4.0 * blocks * batch * depth
    return (STEP_FIXED_US + staged / L2_BYTES_PER_US
            + units * depth * batch / FMAS_PER_US_PER_SM)


def bwd_geometry(cell: str, hidden: int, batch: int, units_per_block: int,
                 threads: int | None = None, max_threads: int = PK_MAX_THREADS,
                 k_tile: int | None = None) -> BwdFit:
    """The backward kernel's decomposition for U = ``units_per_block`` with no device checks
    (ok is False only when the block cannot be launched as asked: threads not whole warps or
    more than max_threads, more cells than PK_CPT a thread, k_tile not a multiple of 4).
    ``k_tile``: columns of dg_t a tile, else all K = G*H of them; ``threads``: the block
    size, else the largest of BLOCK_SIZES within max_threads."""
    spec = get_cell(cell)
    for what, v in (("hidden", hidden), ("batch", batch), ("units_per_block", units_per_block),
                    ("k_tile", 4 if k_tile is None else k_tile)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"persistent backward: {what} must be a positive int, got {v!r}")
    G, H, B, U = spec.gates, int(hidden), int(batch), int(units_per_block)
    K = G * H
    kt = full_tile(K) if k_tile is None else int(k_tile)
    max_threads = min(int(max_threads), PK_MAX_THREADS)
    if threads is None:
        threads = max([t for t in BLOCK_SIZES if t <= max_threads] or [32])
    threads = int(threads)
    reason, ok = "fits", True
    if kt % 4:
        ok, reason = False, (f"k_tile {kt} is not a multiple of 4 (the tile is read in float4 "
                             f"chunks; the kernel traps on it)")
    elif threads % 32 or threads < 32:
        ok, reason = False, f"a block of {threads} threads is not whole warps"
    elif threads > max_threads:
        ok, reason = False, f"a block of {threads} threads > the {max_threads} a block may have"
    elif U * B > PK_CPT * threads:
        ok, reason = False, (f"{U} units x batch {B} = {U * B} cells > {PK_CPT} a thread x "
                             f"{threads} threads")
    lanes = lane_grid(1, U, B)
    nkg = max(1, threads // 32) * lanes[2]
    return BwdFit(cell=spec.name, hidden=H, batch=B, ok=ok, reason=reason, units_per_block=U,
                  blocks=ceil_div(H, U), threads=threads, lanes=lanes, k_groups=nkg,
                  cells_per_thread=ceil_div(U * B, max(threads, 1)), k_tile=kt,
                  smem_r=4 * U * stride_r(K), smem_tile=4 * B * tile_stride(kt),
                  smem_partials=4 * nkg * U * partial_stride(B, lanes[1]))


def persistent_bwd_fit(cell: str, hidden: int, batch: int, props: dict, *,
                       units_per_block: int | None = None, threads: int | None = None,
                       regs_per_thread: int | None = None,
                       k_tile: int | None = None) -> BwdFit:
    """Fit one layer's backward onto the device described by ``props`` (CuPy's
    getDeviceProperties keys, as persistent.persistent_fit). Rules, in order (the first that
    fails is the reason):
      1. U: given (knob), else of U0 = ceil(H / SMs) and its doublings (fewer blocks: less
         of dg_t staged from L2 every step, more FMAs a block) the one whose step the cost
         model (``step_us``) makes shortest among those that fit; blocks = ceil(H / U) <=
         SMs (one block on each SM, all co-resident).
      2. The block (knob, else each of BLOCK_SIZES the registers allow): U * B cells <=
         PK_CPT a thread.
      3. Dynamic shared memory (R^T slice + dg tile + partial sums) <= what a block may
         have (opt-in, and per SM with the reserved part). Unless given, k_tile is the
         fewest even tiles over K = G*H that fit; the block: the fewest tiles, then the
         fewest k-groups past KG_MAX, then the largest.
      4. Registers (NVCC_REGS unless given, per warp in units of 256) fit a block and an SM.
    """
    name = get_cell(cell).name
    H, B = int(hidden), int(batch)
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       PK_MAX_THREADS, BLOCK_SIZES, threads)
    if units_per_block is not None:
        return _fit_units(dev, name, H, B, int(units_per_block), k_tile)
    u0 = ceil_div(H, dev.sms)
    tried, u = [], u0
    while True:
        tried.append(_fit_units(dev, name, H, B, u, k_tile))
        if u >= H or u * B > PK_CPT * dev.max_threads:
            break
        u *= 2
    ok = [f for f in tried if f.ok]
    if not ok:
        return tried[0]
    best = min(ok, key=lambda f: (round(f.step_us(), 3), -f.blocks))
    return replace(best, reason=f"{best.reason}; U {best.units_per_block} of "
                                f"{', '.join(str(f.units_per_block) for f in ok)} by the "
                                f"cost model")


def _fit_units(dev: DeviceBudget, name: str, H: int, B: int, U: int, k_tile) -> BwdFit:
    """The fit at U units a block (rules 1-4 above)."""
    K, sms, limit = get_cell(name).gates * H, dev.sms, dev.limit
    scored = []
    for t in dev.candidates:
        kt = k_tile if k_tile is not None else (fewest_tiles(K, lambda k, t=t: bwd_geometry(
            name, H, B, U, t, dev.max_threads, k_tile=k).smem_bytes, limit) or 4)
        f = bwd_geometry(name, H, B, U, t, dev.max_threads, k_tile=kt)
        fits = f.ok and f.smem_bytes <= limit
        scored.append(((not fits, f.tiles, max(0, f.k_groups - KG_MAX), -t), f))
    fit = replace(min(scored, key=lambda x: x[0])[1], sms=sms, regs_per_thread=dev.regs)
    where = f"{name} backward hidden {H}, batch {B} on {sms} SMs"

    def no(reason):
        return replace(fit, ok=False, reason=f"{where}: {reason}")

    if fit.blocks > sms:
        return no(f"{fit.blocks} blocks of {U} units > {sms} SMs; the kernel needs one block "
                  f"per SM, all resident at once (U >= {ceil_div(H, sms)})")
    if fit.k_tile % 4 or not fit.ok:
        return no(fit.reason)
    if fit.smem_bytes > dev.optin or fit.smem_bytes + dev.reserved > dev.per_sm:
        return no(f"the R^T slice alone is {U} units x {K} gate rows = {U * K} floats; with "
                  f"the dg tile of {fit.k_tile} columns and partial sums ({fit.threads} "
                  f"threads) {fit.smem_bytes} bytes of shared memory > {dev.limit} a block "
                  f"can have (opt-in {dev.optin}, {dev.per_sm} per SM, {dev.reserved} "
                  f"reserved)")
    if not dev.regs_ok(fit.threads):
        return no(f"{fit.threads} threads x {dev.regs} registers = "
                  f"{ceil_div(fit.threads, 32) * dev.per_warp} registers > {dev.regs_sm} per "
                  f"SM ({dev.regs_block} per block): fewer threads a block")
    return replace(fit, reason=f"fits: {fit.blocks} of {sms} SMs, {fit.tiles} tile"
                               f"{'' if fit.tiles == 1 else 's'} of dg_t a step")
