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

from ..cells import get_cell
from .budget import DeviceBudget, ceil_div
from .persistent import (BLOCK_SIZES, PK_CLUSTER, PK_CPT, PK_MAX_THREADS, Fit, cluster_count,
                         cluster_fit, grid_fit, layout)

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
# The cluster kernel: the forward cluster kernel took 2.6 us a step at GRU H 128 B 8 (no grid
# barrier, nothing staged); its pushes of dg_t (G values a cell into each of the 8 blocks'
# buffers) are assumed to go at 2 a clock an SM (a guess: the forward pushes G x fewer; the
# bench's timings of both variants are what calibrates it).
CLUSTER_STEP_FIXED_US = 2.5
PUSHES_PER_US_PER_SM = 2 * 1980

def bwd_kernel_name(cell: str, cluster: bool = False) -> str:
    """The persistent backward kernel of ``cell``: 'lstm' -> 'lstm_persistent_bwd' (the grid
    kernel), with ``cluster`` 'lstm_persistent_cluster_bwd'."""
    return f"{get_cell(cell).name}_persistent{'_cluster' if cluster else ''}_bwd"


@dataclass(frozen=True)
class BwdFit(Fit):
    """How one layer's backward (cell, hidden H, batch B) runs as one persistent launch: the
    fields of ``persistent.Fit`` (a grid kernel: ``cluster`` 0), read for the backward's
    product: rows M = U (the units a block owns), depth K = G*H (``depth``: the columns of dg
    a step multiplies; ``tiles`` = ceil(K / k_tile)), smem_r the R^T slice [U][stride_r(K)].
    The cluster kernel (``cluster`` = PK_CLUSTER, ``clusters`` of them): cluster n updates
    batches [n*BG, n*BG + BG) (BG = ``batch_per_block``), its block of rank r units
    [r*U, r*U + U); every layout size is for BG batches and the dg tile is two buffers of all
    K columns."""

    STAGED = "dg"
    PASS = " backward"

    @property
    def kernel(self) -> str:
        return bwd_kernel_name(self.cell, self.cluster > 0)

    @staticmethod
    def product(gates: int, hidden: int) -> tuple[int, int]:
        """(rows of R^T a unit brings, depth K): one row, K = G * H (the columns of dg_t
        and the rows of R a step's product sums over); so ``rows`` is M = U."""
        return 1, gates * hidden

    @property
    def depth_words(self) -> str:
        return f"{self.depth} = G*H"

    def slice_words(self) -> str:
        return f"R^T slice alone is {self.units_per_block} units x {self.depth} gate rows"

    def barrier_arrivals(self, steps: int) -> int:
        """One a block at each of the T barriers (after every step's dg, and before dh0);
        none for the cluster kernel, which never touches the counters."""
        return 0 if self.cluster else steps * self.blocks

    def step_us(self) -> float:
        """The cost model's microseconds a step (see the module's constants)."""
        if self.cluster:
            return cluster_step_us(self.units_per_block, self.gates, self.depth,
                                   self.batch_per_block)
        return step_us(self.blocks, self.units_per_block, self.depth, self.batch)

    def describe(self) -> str:
        lr, lb, lk = self.lanes
        tiles = self.tiles
        where = (f"{self.clusters} cluster{'' if self.clusters == 1 else 's'} of "
                 f"{self.cluster} blocks ({self.batch_per_block} batches each)"
                 if self.cluster else f"{self.blocks} blocks")
        head = (f"{self.cell} backward H {self.hidden} B {self.batch}: U {self.units_per_block}, "
                f"{where} x {self.threads} threads (lanes {lr}x{lb}x{lk}, "
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


def cluster_step_us(units: int, gates: int, depth: int, batch: int) -> float:
    """The modelled microseconds of one step of the cluster kernel: fixed + the pushes of a
    block's cells (units x batch cells, G values each into 8 blocks) + its FMAs."""
    cells = units * batch
    return (CLUSTER_STEP_FIXED_US + cells * gates * PK_CLUSTER / PUSHES_PER_US_PER_SM
            + units * depth * batch / FMAS_PER_US_PER_SM)


def bwd_geometry(cell: str, hidden: int, batch: int, units_per_block: int,
                 threads: int | None = None, max_threads: int = PK_MAX_THREADS,
                 k_tile: int | None = None, clusters: int = 0) -> BwdFit:
    """The backward kernel's decomposition for U = ``units_per_block`` with no device checks
    (ok is False only when the block cannot be launched as asked: threads not whole warps or
    more than max_threads, more cells than PK_CPT a thread, k_tile not a multiple of 4; for
    the cluster kernel also: U too small for PK_CLUSTER blocks to cover H, k_tile short of
    K, an empty cluster). ``k_tile``: columns of dg_t a tile, else all K = G*H of them;
    ``threads``: the block size, else the largest of BLOCK_SIZES within max_threads;
    ``clusters``: 0 for the grid kernel, n >= 1 for the cluster kernel with n clusters.
    The forward's layout (``persistent.layout``) over BwdFit's product."""
    return layout(BwdFit, cell, hidden, batch, units_per_block, threads, max_threads, k_tile,
                  clusters)


def persistent_bwd_fit(cell: str, hidden: int, batch: int, props: dict, *,
                       kind: str | None = None, units_per_block: int | None = None,
                       threads: int | None = None, regs_per_thread: int | None = None,
                       k_tile: int | None = None, clusters: int | None = None,
                       layers: int = 1) -> BwdFit:
    """Fit one layer's backward onto the device described by ``props`` (CuPy's
    getDeviceProperties keys, as persistent.persistent_fit). ``kind``: 'grid', 'cluster',
    or None: of the two that fit, the one whose step the cost model makes shorter (the grid
    kernel on a tie; with ``layers`` > 1 the grid kernel's step times layers, since the
    cluster kernel's chunked launches overlap the layers and the grid kernel's cannot); given ``units_per_block`` or ``k_tile`` mean 'grid', ``clusters``
    'cluster'.
    The grid kernel, rules in order (the first that fails is the reason):
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
    The cluster kernel: compute capability >= 9.0 and >= PK_CLUSTER SMs; U =
    ceil(H / PK_CLUSTER), ``persistent.cluster_count(B, SMs, layers)`` clusters (the
    forward's: one per 4 batches, on at most half the SMs, or with ``layers`` > 1 launches
    overlapping along the reverse wavefront their 1/layers share: measured on the H100 at
    LSTM / GRU L4 H128 B32-128, 4 clusters a layer beat 8 by 2-14% and 2, 6, 12 lost too:
    experiments/results/kernels/backward-probe-splits-nvidia-h100-...-20261127T221123.json;
    where that many do not fit, the fewest more up to the one-layer count that do) unless
    given, all of dg_t in one tile (two
    buffers); then rules 2-4 for its layout (block: the fewest k-groups past KG_MAX, then the
    largest). A cluster is scheduled whole and waits only for itself: no co-residency rule.
    """
    if kind not in (None, "grid", "cluster"):
        raise ValueError(f"persistent_bwd_fit: kind must be 'grid', 'cluster' or None, got "
                         f"{kind!r}")
    if kind is None and (units_per_block is not None or k_tile is not None):
        kind = "grid"
    if kind is None and clusters is not None:
        kind = "cluster"
    name = get_cell(cell).name
    H, B = int(hidden), int(batch)
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       PK_MAX_THREADS, BLOCK_SIZES, threads)
    grid = cl = None
    if kind in (None, "grid"):
        grid = _grid_fit(dev, name, H, B, units_per_block, k_tile)
    if kind in (None, "cluster"):
        if clusters is not None and int(clusters) < 1:
            raise ValueError(f"persistent_bwd_fit: clusters must be >= 1, got {clusters!r}")
        if clusters is not None:
            cl = cluster_fit(dev, BwdFit, name, H, B, clusters)
        else:   # the layers' share, else the fewest more clusters that fit (fewer batches each)
            for n in range(cluster_count(B, dev.sms, int(layers)), cluster_count(B, dev.sms) + 1):
                cl = cluster_fit(dev, BwdFit, name, H, B, n)
                if cl.ok:
                    break
    if kind is not None:
        return grid if kind == "grid" else cl
    # with several layers the cluster kernel's chunked launches overlap them; the grid
    # kernel's run one after another (it needs every SM): compare a layer-step of each
    grid_us = grid.step_us() * int(layers) if grid.ok else 0.0
    if cl.ok and (not grid.ok or cl.step_us() < grid_us):
        other = "the grid kernel " + (f"~{grid.step_us():.1f} us a step" if grid.ok
                                      else f"does not fit: {grid.reason}")
        return replace(cl, reason=f"{cl.reason}; {other}")
    other = "the cluster kernel " + (f"~{cl.step_us():.1f} us a step" if cl.ok
                                     else f"does not fit: {cl.reason}")
    return replace(grid, reason=f"{grid.reason}; {other}")


def _grid_fit(dev: DeviceBudget, name: str, H: int, B: int, units_per_block, k_tile) -> BwdFit:
    """The grid kernel's fit (rules 1-4)."""
    if units_per_block is not None:
        return grid_fit(dev, BwdFit, name, H, B, int(units_per_block), k_tile)
    return by_cost_model(dev, H, B, lambda u: grid_fit(dev, BwdFit, name, H, B, u, k_tile))


def by_cost_model(dev: DeviceBudget, H: int, B: int, fit_at) -> BwdFit:
    """Of ``fit_at(U)`` (a grid kernel's fit at U units a block) for U0 = ceil(H / SMs) and
    its doublings (while U < H and U * B cells fit PK_CPT a thread), the one whose step its
    cost model (``step_us``) makes shortest among those that fit (more blocks on a tie),
    its reason naming the U tried; else the fit at U0 (saying why not)."""
    tried, u = [], ceil_div(H, dev.sms)
    while True:
        tried.append(fit_at(u))
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
