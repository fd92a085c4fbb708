"""The per-layer persistent kernels (cuda_src/persistent.cu: the grid and the cluster kernels):
how one layer is cut over the GPU (the fit). ``emulate.py`` runs exactly that cut in NumPy.

One launch runs all T steps of one layer. Block x owns the hidden units
[x*U, min(H, x*U + U)) and all G gate rows of them (rows q*H + j of R), keeps those M = G*U
rows of R in shared memory for the whole sequence, reads all of h_t each step, updates its
units, and meets the other blocks at a grid barrier before step t+1. The barrier spins, so
every block must be resident at once: the fit puts one block on each SM (blocks <= SMs) and
checks that one block's shared memory, threads and registers fit one SM.

Inside a block (the .cu header says the same; the constants below are the kernel's): each
warp is a split-K slice of the small GEMM R_slice [M, H] x h_t^T [H, B]. Its 32 lanes are
LR row groups x LB batch groups x LK k-groups; a lane accumulates PK_TM rows x PK_TB batches
in registers. Warp w stages (cp.async) and multiplies its own CPW float4 chunks of every
h tile (k_tile columns; the fit takes the widest that fits, ideally all of H), in two
halves; k-group kg = w*LK + lk adds its tiles into partial sums red[kg]; then every thread
updates up to PK_CPT (b, j) cells, e = tid + i*threads, jj = e % U, b = e // U, summing the
NKG partial sums in k-group order.

The cluster kernels (``*_persistent_cluster_fwd``, sm_90+) cut the same way inside a block,
but a grid of clusters of PK_CLUSTER blocks: each cluster holds all of R (block rank r owns
units [r*U, r*U + U), U = ceil(H / PK_CLUSTER)) and updates its own slice of the batch
(``Fit.batches``); h_{t+1} goes straight into every block's shared memory and the cluster
meets at the hardware cluster barrier, so no grid-wide co-residency is needed.

``persistent_fit(cell, hidden, batch, props)`` chooses the kernel, U, the block size, the tile width and
the dynamic shared memory from CuPy-style device properties and says why when a shape does
not fit. ``emulate.emulate`` runs that decomposition with NumPy (block by block, step by step,
each block reading only h_t and its own rows of R, each (b, j) written by the one thread that
owns it), so the partition and the indexing are tested without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..cells import get_cell
from .budget import DeviceBudget, Launch1D, ceil_div

# The kernel's compile-time constants (cuda_src/persistent.cu; a test holds them equal).
PK_TM = 4               # register tile: rows of the R slice a lane accumulates
PK_TB = 8               # register tile: batches a lane accumulates
PK_CPT = 2              # pointwise: most (b, j) cells one thread updates
PK_LR_MAX = 16          # most row groups of a warp's lanes
PK_MAX_THREADS = 256    # __launch_bounds__(PK_MAX_THREADS, 1)
PK_CLUSTER = 8          # blocks a cluster of the cluster kernels (__cluster_dims__)

BLOCK_SIZES = (256, 128, 64, 32)
"""Block sizes the fit tries, most warps first (more warps: more staging and FMAs in flight;
fewer: smaller partial sums, so a wider h tile where shared memory is short). It takes the
one with the fewest h tiles a step; of those, the largest with at most KG_MAX k-groups (else
the one with the fewest)."""

KG_MAX = 32
"""k-groups the pointwise phase adds one after the other for each gate sum: past a few tens
that serial sum costs more than the split saves (B 3, H 37 at 256 threads would take 256)."""

NVCC_REGS = {"lstm": 255, "gru": 255, "rnn_tanh": 255, "rnn_relu": 255}
"""Registers a thread the fit assumes (the most __launch_bounds__(256, 1) allows; nvcc 13.0.88
gives the grid kernels LSTM 245, GRU 245, the RNNs 234 and the cluster kernels 243-254, no
spills; a test holds nvcc to at most these). The fit uses the compiled
kernel's own count where it is given (``regs_per_thread``, from
``RawKernel.attributes['num_regs']``)."""

CLUSTER_MAX_FMAS = 512
"""The most FMAs a thread a step (G*U*H*BG / threads) for which the default fit takes the
cluster kernel over the grid kernel. A cluster does all of R for its batches on 8 SMs, so its
FMA phase is longer; it saves the grid barrier and the L2 staging of h_t. Measured on the
H100 (experiments/results/persistent-cluster-*-s4.json): 512 a thread (LSTM H 128 B 32) ran
4.1 us a step against the grid kernel's 6.2; 864 (GRU H 192 B 32, three output tiles a lane)
6.7 against 5.7."""

SYNC_WORDS = 2
"""The barrier buffer: 2 unsigned ints (arrivals, departures), zero between launches."""

DEFAULT_SHARED_BYTES = 48 * 1024
"""Dynamic shared memory a kernel may use without opting in (cudaFuncSetAttribute)."""

def kernel_name(cell: str, cluster: bool = False) -> str:
    """The persistent kernel of ``cell``: 'lstm' -> 'lstm_persistent_fwd' (the grid
    kernel), with ``cluster`` 'lstm_persistent_cluster_fwd' (the cluster kernel)."""
    return f"{get_cell(cell).name}_persistent{'_cluster' if cluster else ''}_fwd"


CLUSTER_BATCH = 4
"""Batches a cluster of the cluster kernel, by default (``cluster_count``): on the lent H200,
LSTM H 128 B 32 took 3.59 us a step in 8 clusters of 4 batches against 3.77 in 4 of 8 (GRU
2.71 against 2.88): the FMA phase halves, the pointwise stays one cell a thread."""


def cluster_count(batch: int, sms: int, layers: int = 1) -> int:
    """Clusters the cluster kernel runs (each its own batch slice, R copied into each): one
    per CLUSTER_BATCH batches, on at most half the SMs (measured on the H200, 132 SMs: 16
    clusters of 8 ran in two waves, 1.8x the step time of 8; a lone launch in two waves
    doubles its steps). With ``layers`` launches overlapping along the wavefront (chunked
    plans) each takes its 1/layers share of the SMs instead: one not yet resident only
    waits for the layers beside it to finish a chunk."""
    return max(1, min(ceil_div(int(batch), CLUSTER_BATCH), rule_cluster_cap(sms, layers)))


def rule_cluster_cap(sms: int, layers: int = 1) -> int:
    """The most clusters ``cluster_count``'s rule gives a launch: half the SMs' worth for one
    layer, the 1/layers share for several (at least one). The cap where the device's own
    count of co-resident clusters (occupancy.cluster_cap) cannot be had."""
    cap = int(sms) // (2 * PK_CLUSTER) if layers == 1 else (int(sms) // layers) // PK_CLUSTER
    return max(1, cap)


def stride_r(hidden: int) -> int:
    """Row stride (floats) of the R slice in shared memory: hidden rounded up to float4s,
    an odd number of them (pk_stride_r in the kernel), so that one column of 8 consecutive
    rows lies in 8 different groups of 4 banks."""
    return 4 * (((hidden + 3) // 4) | 1)


def tile_stride(k_tile: int) -> int:
    """Row stride (floats) of the h tile in shared memory: k_tile (a multiple of 4) as an
    odd number of float4s, 4 * ((k_tile / 4) | 1): k_tile + 4 when k_tile / 4 is even (64
    -> 68, 512 -> 516), k_tile itself when odd (12 -> 12). The kernel's pk_stride_r(k_tile)."""
    return stride_r(k_tile)


def full_tile(hidden: int) -> int:
    """The k_tile that holds all of h_t: hidden rounded up to a multiple of 4."""
    return 4 * ceil_div(hidden, 4)


def pow2ceil(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def lane_grid(gates: int, units_per_block: int, batch: int) -> tuple[int, int, int]:
    """(LR, LB, LK): a warp's lanes as row groups x batch groups x k-groups (product 32), as
    the kernel's pk_geometry: LR = min(PK_LR_MAX, pow2ceil(ceil(M / PK_TM))) for M = G*U rows,
    LB = min(32 / LR, pow2ceil(ceil(B / PK_TB))), LK = 32 / (LR * LB)."""
    M = gates * units_per_block
    lr = min(PK_LR_MAX, pow2ceil(ceil_div(M, PK_TM)))
    lb = min(32 // lr, pow2ceil(ceil_div(batch, PK_TB)))
    return lr, lb, 32 // (lr * lb)


def partial_stride(batch: int, lb: int) -> int:
    """Row stride BP (floats) of the partial sums: >= B and = LB mod 32, so that a warp's
    LR x LB partial stores fall in 32 different banks."""
    return 32 * ceil_div(batch - lb, 32) + lb


@dataclass(frozen=True)
class Fit(Launch1D):
    """How one layer of ``cell`` (hidden H, batch B) runs as one persistent launch.

    ok / reason: whether it fits the device (reason says why not, or what was chosen).
    units_per_block U, blocks = ceil(H / U) (the grid, one block per SM), threads (the
    block, whole warps), lanes (LR, LB, LK: a warp's row groups, batch groups, k-groups),
    k_groups NKG = warps * LK, cells_per_thread (pointwise (b, j) cells a thread updates),
    k_tile (columns of h_t a tile, the kernel's last argument; tiles = ceil(H / k_tile)
    load phases a step): the kernel's decomposition. smem_r, smem_tile, smem_partials:
    dynamic shared memory in bytes (R slice, h tile, partial sums); smem_bytes their sum.
    sms: the device's SM count (None for geometry only). regs_per_thread: what the register
    check assumed.
    cluster: 0 for the grid kernel; else the cluster kernel's blocks a cluster (PK_CLUSTER),
    with ``clusters`` of them (blocks = cluster * clusters): block x is rank x % cluster
    (units [rank*U, rank*U + U)) of cluster x // cluster (batches [n*BG, n*BG + BG), BG =
    ``batch_per_block``); every layout size above is for BG batches, and the h tile is two
    buffers of all of h_t.
    """

    # What a step multiplies, for the layout and its messages (persistent_bwd.BwdFit
    # overrides them): the staged operand's name ("h": the h_t tile), and the words the
    # fit's messages put after the cell's name ("" here, " backward" there).
    STAGED: ClassVar[str] = "h"
    PASS: ClassVar[str] = ""

    cell: str
    hidden: int
    batch: int
    ok: bool
    reason: str
    units_per_block: int
    blocks: int
    threads: int
    lanes: tuple[int, int, int]
    k_groups: int
    cells_per_thread: int
    k_tile: int
    smem_r: int
    smem_tile: int
    smem_partials: int
    sms: int | None = None
    regs_per_thread: int | None = None
    cluster: int = 0
    clusters: int = 1

    @property
    def batch_per_block(self) -> int:
        """BG: the batches one block updates (all B for the grid kernel)."""
        return ceil_div(self.batch, self.clusters)

    @property
    def gates(self) -> int:
        return get_cell(self.cell).gates

    @property
    def fmas_per_thread(self) -> int:
        """FMAs a thread a step, G*U*H*BG / threads (rows, columns and batches a block
        multiplies, rounded up over its threads)."""
        return ceil_div(self.rows * self.depth * self.batch_per_block, self.threads)

    @staticmethod
    def product(gates: int, hidden: int) -> tuple[int, int]:
        """(rows of R a unit brings, depth K) of a step's product: each unit's G gate rows
        of R times h_t, K = H (the backward: one row of R^T, K = G*H)."""
        return gates, hidden

    @staticmethod
    def grid_blocks(hidden: int, units_per_block: int) -> int:
        """Blocks of the grid kernel: ceil(H / U), one a U units (persistent_bwd.PairBwdFit:
        whole pairs)."""
        return ceil_div(hidden, units_per_block)

    @property
    def rows(self) -> int:
        """M: rows of R a block holds (G * U here)."""
        return self.product(self.gates, self.hidden)[0] * self.units_per_block

    @property
    def depth(self) -> int:
        """K: the columns of the staged operand (h_t: H) a step's product sums over, in
        tiles of k_tile (the backward fit's is G*H)."""
        return self.product(self.gates, self.hidden)[1]

    @property
    def depth_words(self) -> str:
        """K in the words of the messages."""
        return f"hidden {self.hidden}"

    def slice_words(self) -> str:
        """The R slice a block holds, in the words of the shared-memory refusal."""
        G = self.gates
        return (f"R slice alone is {f'{G} gates' if G > 1 else '1 gate'} x "
                f"{self.units_per_block} units x {self.hidden}")

    @property
    def k_split(self) -> int:
        """The k-groups whose partial sums each gate sum adds (NKG)."""
        return self.k_groups

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def chunks_per_warp(self) -> int:
        """CPW: float4 chunks of every h tile one warp stages and multiplies."""
        return ceil_div(self.k_tile // 4, self.warps)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block (bytes): the launch's shared_mem argument."""
        return self.smem_r + self.smem_tile + self.smem_partials

    @property
    def tiles(self) -> int:
        """Tiles of h_t a step (each staged and multiplied by every warp in two halves)."""
        return ceil_div(self.depth, self.k_tile)

    @property
    def kernel(self) -> str:
        return kernel_name(self.cell, self.cluster > 0)

    def units(self, block: int) -> range:
        """The hidden units block ``block`` owns."""
        rank = block % self.cluster if self.cluster else block
        j0 = rank * self.units_per_block
        return range(min(j0, self.hidden), min(self.hidden, j0 + self.units_per_block))

    def batches(self, block: int) -> range:
        """The batch rows block ``block`` updates (its cluster's slice; all for the grid
        kernel)."""
        if not self.cluster:
            return range(self.batch)
        b0 = (block // self.cluster) * self.batch_per_block
        return range(min(b0, self.batch), min(self.batch, b0 + self.batch_per_block))

    def scalars(self, steps: int) -> dict:
        """The kernel's int scalars for a launch over ``steps`` steps, by name (the order
        the kernel takes them is the registry's, ``KernelInfo.scalars``)."""
        return {"T": int(steps), "units_per_block": self.units_per_block,
                "k_tile": self.k_tile}

    def barrier_arrivals(self, steps: int) -> int:
        """Arrivals at the grid barrier's counter over ``steps`` steps: one a block at each
        of the T-1 barriers between steps; none for a cluster kernel (its barrier is the
        hardware's)."""
        return 0 if self.cluster else (steps - 1) * self.blocks

    def check_steps(self, steps: int) -> None:
        """Raise unless ``steps`` can run in one launch: T >= 1 and the barrier counter
        (``barrier_arrivals``, an unsigned int) does not wrap."""
        if not 1 <= steps <= 2**31 - 1:
            raise ValueError(f"{self.kernel}: T = {steps} outside [1, 2^31-1]")
        if self.barrier_arrivals(steps) >= 2**32:
            raise ValueError(f"{self.kernel}: T = {steps} steps x {self.blocks} blocks overflow "
                             f"the 32-bit barrier counter; split the sequence")

    def describe(self) -> str:
        tiles = self.tiles
        lr, lb, lk = self.lanes
        where = (f"{self.clusters} cluster{'' if self.clusters == 1 else 's'} of "
                 f"{self.cluster} blocks ({self.batch_per_block} batches each)"
                 if self.cluster else f"{self.blocks} blocks")
        head = (f"{self.cell} H {self.hidden} B {self.batch}: U {self.units_per_block}, "
                f"{where} x {self.threads} threads (lanes {lr}x{lb}x{lk}, "
                f"{self.k_groups} k-groups), k_tile {self.k_tile} ({tiles} tile"
                f"{'' if tiles == 1 else 's'} a step), shared {self.smem_bytes} B "
                f"(R {self.smem_r} + tile {self.smem_tile} + partials {self.smem_partials})")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"



def block_problem(k_tile: int, threads: int, max_threads: int, units: int,
                  batch_per_block: int) -> str | None:
    """Why a persistent block of this shape cannot run (the forward and the backward kernels
    share the rules), or None: the tile is read in float4s, a block is whole warps within the
    device's limit, and each thread updates at most PK_CPT (unit, batch) cells."""
    if k_tile % 4:
        return (f"k_tile {k_tile} is not a multiple of 4 (the tile is read in float4 chunks; "
                f"the kernel traps on it)")
    if threads % 32 or threads < 32:
        return f"a block of {threads} threads is not whole warps"
    if threads > max_threads:
        return f"a block of {threads} threads > the {max_threads} a block may have"
    cells = units * batch_per_block
    if cells > PK_CPT * threads:
        return (f"{units} units x batch {batch_per_block} = {cells} cells > {PK_CPT} a thread "
                f"x {threads} threads: a smaller batch, or fewer units per block where there "
                f"are SMs to spare")
    return None


def geometry(cell: str, hidden: int, batch: int, units_per_block: int,
             threads: int | None = None, max_threads: int = PK_MAX_THREADS,
             k_tile: int | None = None, clusters: int = 0) -> Fit:
    """The kernel's decomposition for U = ``units_per_block`` with no device checks (ok is
    False only when the block cannot be launched as asked: threads not whole warps or more
    than max_threads, more cells than PK_CPT a thread, k_tile not a multiple of 4; for the
    cluster kernel also: U too small for PK_CLUSTER blocks to cover H, k_tile short of H,
    an empty cluster).
    ``k_tile``: columns of h_t a tile, else all of them (``full_tile``: one tile).
    ``threads``: the block size, else BLOCK_SIZES[0] (within max_threads).
    ``clusters``: 0 for the grid kernel; n >= 1 for the cluster kernel with n clusters."""
    return layout(Fit, cell, hidden, batch, units_per_block, threads, max_threads, k_tile,
                  clusters)


def layout(fit_class: type[Fit], cell: str, hidden: int, batch: int, units_per_block: int,
           threads: int | None = None, max_threads: int = PK_MAX_THREADS,
           k_tile: int | None = None, clusters: int = 0) -> Fit:
    """The decomposition of one persistent launch of class ``fit_class`` (Fit: the forward's,
    ``geometry``; persistent_bwd.BwdFit: the backward's, ``bwd_geometry``): the same
    lane grid, tiles, staging and partial sums over the product that ``fit_class.product``
    names (M = rows a unit x U rows of depth K). The arguments are ``geometry``'s; k_tile
    defaults to all K columns."""
    for what, v in (("hidden", hidden), ("batch", batch), ("units_per_block", units_per_block),
                    ("k_tile", 4 if k_tile is None else k_tile)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"persistent{fit_class.PASS}: {what} must be a positive int, got {v!r}")
    spec = get_cell(cell)
    H, B, U = int(hidden), int(batch), int(units_per_block)
    per_unit, K = fit_class.product(spec.gates, H)
    kt = full_tile(K) if k_tile is None else int(k_tile)
    ncl = int(clusters)
    if ncl < 0:
        raise ValueError(f"persistent{fit_class.PASS}: clusters must be >= 0, got {clusters!r}")
    BG = ceil_div(B, ncl) if ncl else B   # batches a block updates
    max_threads = min(int(max_threads), PK_MAX_THREADS)
    if threads is None:
        threads = max([t for t in BLOCK_SIZES if t <= max_threads] or [32])
    threads = int(threads)
    lanes = lane_grid(per_unit, U, BG)
    nkg = max(1, threads // 32) * lanes[2]
    M = per_unit * U
    fit = fit_class(cell=spec.name, hidden=H, batch=B, ok=True, reason="fits", units_per_block=U,
               blocks=PK_CLUSTER * ncl if ncl else fit_class.grid_blocks(H, U),
               threads=threads,
               lanes=lanes, k_groups=nkg, cells_per_thread=ceil_div(U * BG, max(threads, 1)),
               k_tile=kt, smem_r=4 * M * stride_r(K),
               smem_tile=4 * (2 if ncl else 1) * BG * tile_stride(kt),
               smem_partials=4 * nkg * M * partial_stride(BG, lanes[1]),
               cluster=PK_CLUSTER if ncl else 0, clusters=max(ncl, 1))
    problem = block_problem(kt, threads, max_threads, U, BG)
    if not problem and ncl:
        if PK_CLUSTER * U < H:
            problem = (f"{PK_CLUSTER} blocks of {U} units do not cover hidden {H} (a cluster "
                       f"holds all of R)")
        elif kt < K:
            problem = (f"k_tile {kt} < {fit.depth_words}: the cluster kernel keeps all of "
                       f"{fit_class.STAGED}_t in one tile")
        elif (ncl - 1) * BG >= B:
            problem = f"{ncl} clusters of {BG} batches leave the last empty (batch {B})"
    return replace(fit, ok=False, reason=problem) if problem else fit


def fewest_tiles(depth: int, smem_of, limit: int) -> int | None:
    """The k_tile the fits take: the fewest tiles over ``depth`` columns (ideally one)
    whose shared memory ``smem_of(k_tile)`` (bytes) is <= ``limit``, and of those the
    narrowest (ceil(depth / n) rounded up to 4 for n tiles, so the tiles come out even: H
    1024 in 4 tiles is 4 x 256, not 3 x 292 + 148); None when even k_tile 4 does not fit.
    The forward fit tiles h_t (depth H), the backward fit dg_t (depth G*H)."""
    if smem_of(4) > limit:
        return None
    n = 1
    while True:
        kt = full_tile(ceil_div(depth, n))
        if smem_of(kt) <= limit:
            return kt
        # the next tile count that makes k_tile narrower
        n = max(n + 1, ceil_div(depth, kt - 4) if kt > 4 else n + 1)


def persistent_fit(cell: str, hidden: int, batch: int, props: dict, *,
                   units_per_block: int | None = None, threads: int | None = None,
                   regs_per_thread: int | None = None, k_tile: int | None = None,
                   kind: str | None = None, clusters: int | None = None) -> Fit:
    """Fit one layer onto the device described by ``props`` (CuPy's getDeviceProperties:
    multiProcessorCount, sharedMemPerBlockOptin, sharedMemPerMultiprocessor,
    reservedSharedMemPerBlock, maxThreadsPerBlock, maxThreadsPerMultiProcessor,
    regsPerMultiprocessor, regsPerBlock, major).

    ``kind``: 'cluster' (the cluster kernel), 'grid' (the grid kernel), or None: the
    cluster kernel where it fits, else the grid kernel (the cluster kernel has neither the
    grid barrier nor the L2 staging of h_t; where R fits in one cluster it is the shorter
    step). Given ``units_per_block`` or ``k_tile`` (knobs of the grid kernel) mean 'grid';
    given ``clusters`` (the cluster kernel's knob: clusters instead of ``cluster_count``)
    means 'cluster'.

    The grid kernel, rules in order (the first that fails is the reason):
      1. U = ceil(H / SMs) unless given (knob 1), blocks = ceil(H / U) <= SMs: one block on
         each SM, so all are co-resident.
      2. k_tile, if given (knob 3), a multiple of 4.
      3. The block (knob 2, else each of BLOCK_SIZES the registers and
         min(256, maxThreadsPerBlock, maxThreadsPerMultiProcessor) allow): U * B cells <=
         PK_CPT per thread.
      4. Dynamic shared memory (R slice + h tile + partial sums) <= sharedMemPerBlockOptin
         and, with reservedSharedMemPerBlock, <= sharedMemPerMultiprocessor. Unless given,
         k_tile is the widest that fits (``fewest_tiles``: all of H in one tile where it
         can, else the fewest even tiles); without a given block size the fit takes the
         block with the fewest tiles, then the fewest k-groups past KG_MAX, then the
         largest.
      5. Registers (NVCC_REGS[cell] unless given, allocated per warp in units of 256)
         <= regsPerBlock and <= regsPerMultiprocessor.
    The cluster kernel: compute capability >= 9.0 (``major``; clusters of PK_CLUSTER = 8
    blocks are the portable size there) and >= PK_CLUSTER SMs; U = ceil(H / PK_CLUSTER),
    ``cluster_count(B, SMs)`` clusters, all of h_t in one tile (two buffers); then rules 3-5
    as above for its layout (block: the fewest k-groups past KG_MAX, then the largest). The
    default (kind None) takes it only with at most CLUSTER_MAX_FMAS FMAs a thread a step.
    A cluster is scheduled whole, and its blocks wait only for each other, so co-residency
    across clusters is not needed.
    """
    if kind not in (None, "grid", "cluster"):
        raise ValueError(f"persistent_fit: kind must be 'grid', 'cluster' or None, got {kind!r}")
    if kind is None and (units_per_block is not None or k_tile is not None):
        kind = "grid"
    if clusters is not None:
        if kind == "grid":
            raise ValueError("persistent_fit: clusters is the cluster kernel's knob, not the "
                             "grid kernel's")
        if isinstance(clusters, bool) or not isinstance(clusters, (int, np.integer)) \
                or clusters < 1:
            raise ValueError(f"persistent_fit: clusters must be an int >= 1, got {clusters!r}")
        kind = "cluster"
    dev = DeviceBudget(props, NVCC_REGS[get_cell(cell).name] if regs_per_thread is None
                       else regs_per_thread, PK_MAX_THREADS, BLOCK_SIZES, threads)
    cl = None
    if kind in (None, "cluster"):
        cl = cluster_fit(dev, Fit, cell, int(hidden), int(batch), clusters)
        if kind == "cluster":
            return cl
        if cl.ok and cl.fmas_per_thread > CLUSTER_MAX_FMAS:
            cl = replace(cl, ok=False, reason=f"{cl.fmas_per_thread} FMAs a thread a step > "
                                              f"CLUSTER_MAX_FMAS {CLUSTER_MAX_FMAS}: the grid "
                                              f"kernel's shorter FMA phase wins")
        if cl.ok:
            return cl
    fit = _grid_fit(dev, cell, int(hidden), int(batch), units_per_block, k_tile)
    if cl is not None and fit.ok:
        fit = replace(fit, reason=f"{fit.reason}; the cluster kernel does not fit: {cl.reason}")
    return fit


def finish_fit(dev: DeviceBudget, fit: Fit, where: str, given_k_tile: bool = False) -> Fit:
    """``fit`` (a Fit or a BwdFit) with the shared-memory and register checks (rules 4 and
    5) applied; ``where`` opens every refusal."""
    fit = replace(fit, sms=dev.sms, regs_per_thread=dev.regs)

    def no(reason):
        return replace(fit, ok=False, reason=reason)

    # no block size changes these, and a block the device cannot run (a given size) is the
    # cause whatever its shared memory
    bad_block = fit.threads % 32 or not 32 <= fit.threads <= dev.max_threads
    if fit.k_tile % 4 or (not fit.ok and (fit.cluster or bad_block)):
        return no(f"{where}: {fit.reason}")
    if fit.smem_bytes > dev.optin or fit.smem_bytes + dev.reserved > dev.per_sm:
        floats = fit.rows * fit.depth
        tile = (f"the {fit.STAGED} tile of {fit.k_tile} columns" if given_k_tile or fit.cluster
                else f"even the narrowest {fit.STAGED} tile ({fit.k_tile} columns)")
        return no(f"{where}: the {fit.slice_words()} = {floats} floats = "
                  f"{floats * 4 / 1024:.0f} KiB per block; with {tile} and partial sums "
                  f"({fit.threads} threads) {fit.smem_bytes} bytes of shared memory > "
                  f"{dev.limit} a block can have (opt-in {dev.optin}, {dev.per_sm} per SM, "
                  f"{dev.reserved} reserved)")
    if not fit.ok:
        return no(f"{where}: {fit.reason}")
    if not dev.regs_ok(fit.threads):
        warps = ceil_div(fit.threads, 32)
        return no(f"{where}: {fit.threads} threads x {dev.regs} registers = "
                  f"{warps * dev.per_warp} registers > {dev.regs_sm} per SM "
                  f"({dev.regs_block} per block): fewer threads a block")
    return fit


def _grid_fit(dev: DeviceBudget, cell: str, H: int, B: int, units_per_block, k_tile) -> Fit:
    """The grid kernel's fit (persistent_fit's rules 1-5)."""
    U = int(units_per_block) if units_per_block is not None else ceil_div(H, dev.sms)
    return grid_fit(dev, Fit, cell, H, B, U, k_tile)


def grid_fit(dev: DeviceBudget, fit_class: type[Fit], cell: str, H: int, B: int, U: int,
             k_tile: int | None) -> Fit:
    """The grid kernel's fit of class ``fit_class`` (Fit, or persistent_bwd.BwdFit) at U units a
    block: of the block sizes ``dev`` allows, the one with the fewest tiles a step (k_tile
    given, else ``fewest_tiles`` over the depth), then the fewest k-groups past KG_MAX,
    then the largest; then one block per SM, and ``finish_fit``."""
    name, sms, limit = get_cell(cell).name, dev.sms, dev.limit
    depth = fit_class.product(get_cell(cell).gates, H)[1]
    scored = []
    for t in dev.candidates:
        kt = k_tile if k_tile is not None else (fewest_tiles(depth, lambda k, t=t: layout(
            fit_class, name, H, B, U, t, dev.max_threads, k_tile=k).smem_bytes, limit) or 4)
        f = layout(fit_class, name, H, B, U, t, dev.max_threads, k_tile=kt)
        fits = f.ok and f.smem_bytes <= limit
        over = max(0, f.k_groups - KG_MAX)
        scored.append(((not fits, f.tiles, over, -t), f))
    fit = min(scored, key=lambda x: x[0])[1]
    where = f"{name}{fit_class.PASS} hidden {H}, batch {B} on {sms} SMs"
    if fit.blocks > sms:
        return replace(fit, sms=sms, regs_per_thread=dev.regs, ok=False,
                       reason=f"{where}: {fit.blocks} blocks of {U} units > {sms} SMs; the "
                              f"kernel needs one block per SM, all resident at once "
                              f"(U >= {ceil_div(H, sms)})")
    fit = finish_fit(dev, fit, where, given_k_tile=k_tile is not None)
    if not fit.ok:
        return fit
    return replace(fit, reason=f"fits: {fit.blocks} of {sms} SMs, {fit.tiles} tile"
                               f"{'' if fit.tiles == 1 else 's'} of {fit_class.STAGED}_t a step")


def cluster_fit(dev: DeviceBudget, fit_class: type[Fit], cell: str, H: int, B: int,
                clusters: int | None = None) -> Fit:
    """The cluster kernel's fit of class ``fit_class`` (Fit, or persistent_bwd.BwdFit; see
    persistent_fit): U = ceil(H / PK_CLUSTER), ``cluster_count`` clusters unless given, all
    of the staged operand in one tile; the block with the fewest k-groups past KG_MAX, then
    the largest; compute capability 9.0 and a cluster's SMs; ``finish_fit``."""
    name, sms, limit = get_cell(cell).name, dev.sms, dev.limit
    U = ceil_div(H, PK_CLUSTER)
    ncl = cluster_count(B, sms) if clusters is None else int(clusters)
    depth = fit_class.product(get_cell(cell).gates, H)[1]
    scored = []
    for t in dev.candidates:
        f = layout(fit_class, name, H, B, U, t, dev.max_threads, k_tile=full_tile(depth),
                   clusters=ncl)
        fits = f.ok and f.smem_bytes <= limit
        scored.append(((not fits, max(0, f.k_groups - KG_MAX), -t), f))
    fit = min(scored, key=lambda x: x[0])[1]
    where = f"{name}{fit_class.PASS} hidden {H}, batch {B}, clusters of {PK_CLUSTER}"
    problem = dev.cluster_problem(PK_CLUSTER)
    if problem is not None:
        return replace(fit, sms=sms, regs_per_thread=dev.regs, ok=False,
                       reason=f"{where}: {problem}")
    fit = finish_fit(dev, fit, where)
    if not fit.ok:
        return fit
    return replace(fit, reason=f"fits: {fit.clusters} cluster{'' if fit.clusters == 1 else 's'}"
                               f" of {PK_CLUSTER} blocks ({fit.blocks} of {sms} SMs), "
                               f"{fit.batch_per_block} batches a cluster, all of "
                               f"{fit_class.STAGED}_t in shared memory")
