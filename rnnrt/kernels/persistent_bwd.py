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

The grid kernel in cluster pairs (cuda_src/persistent_bwd_pair.cu, ``PairBwdFit``): the two
blocks of a cluster own 2U units together, each multiplies half of the G*H gate rows of dg_t
by the R^T rows of all 2U (half the staging, the same FMAs) and sends the other the half sums
of its units through distributed shared memory; ``pair_fit`` and ``pair_decline`` say where
it runs (fp32, sm_90+, every pair resident).

``persistent_bwd_fit(cell, hidden, batch, props)`` chooses the kernel, U (by the cost model,
below), the block size, the tile width and the dynamic shared memory from CuPy-style device
properties and says why when a shape does not fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..cells import get_cell
from .budget import DeviceBudget, ceil_div
from .persistent import (BLOCK_SIZES, PK_CLUSTER, PK_CPT, PK_MAX_THREADS, Fit, cluster_count,
                         cluster_fit, grid_fit, layout)
from .stack_bwd import PAIR_SM_SLACK

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

    def where_words(self) -> str:
        """Where the launch's blocks are, in the words of ``describe``."""
        return (f"{self.clusters} cluster{'' if self.clusters == 1 else 's'} of "
                f"{self.cluster} blocks ({self.batch_per_block} batches each)"
                if self.cluster else f"{self.blocks} blocks")

    def smem_words(self) -> str:
        """The shared memory's parts, in the words of ``describe``."""
        return (f"R^T {self.smem_r} + tile {self.smem_tile} + partials "
                f"{self.smem_partials}")

    def describe(self) -> str:
        lr, lb, lk = self.lanes
        tiles = self.tiles
        head = (f"{self.cell} backward H {self.hidden} B {self.batch}: U {self.units_per_block}, "
                f"{self.where_words()} x {self.threads} threads (lanes {lr}x{lb}x{lk}, "
                f"{self.k_groups} k-groups), k_tile {self.k_tile} of {self.depth} ({tiles} tile"
                f"{'' if tiles == 1 else 's'} a step), shared {self.smem_bytes} B "
                f"({self.smem_words()}), ~{self.step_us():.1f} us a step modelled")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


PAIR_EXCHANGE_US = 1.0
"""The pair kernel's exchange a step in the cost model (``pair_step_us``): the cluster
barrier (~0.4 us, the register-resident backward's budget), the U x B remote stores and the
second k-group sum a cell (the other block's unit), and the wait for the slower block of the
pair. A guess: the GPU timing (persistent_bwd_bench.py --kinds grid,pair) calibrates it."""


def half_depth(depth: int) -> int:
    """KH: the gate rows of block 0's half of a pair's product (float4-aligned, so block 1's
    half starts on a 16-byte boundary of every dg row): 4 * ceil(depth / 8); block 1 takes
    the other depth - KH."""
    return 4 * ceil_div(int(depth), 8)


def pair_kernel_name(cell: str) -> str:
    """The pair kernel of ``cell``: 'lstm' -> 'lstm_persistent_pair_bwd'."""
    return f"{get_cell(cell).name}_persistent_pair_bwd"


@dataclass(frozen=True)
class PairBwdFit(BwdFit):
    """The grid kernel in cluster pairs (cuda_src/persistent_bwd_pair.cu): BwdFit's fields
    for one block of a pair. Block x owns units [x*U, x*U + U) for its pointwise (as the grid
    kernel's rank x); pair p = x // 2 owns [2pU, 2pU + 2U), and block c = x % 2 multiplies
    gate rows [c*KH, c*KH + KC) of dg_{t+1} (KH = ``half_depth(G*H)``, ``halves``) by the R^T
    rows of all 2U units: the product of the layout is M = 2U rows (``rows``) of depth KH
    (``depth``: the layout is sized for block 0's half; block 1's may be shorter).
    blocks = 2 * ceil(H / 2U) (whole pairs; the last block may own no unit), all resident.
    smem_bytes adds the other block's half sums, U x B floats (``smem_recv``)."""

    @property
    def kernel(self) -> str:
        return pair_kernel_name(self.cell)

    @staticmethod
    def product(gates: int, hidden: int) -> tuple[int, int]:
        """(rows of R^T a block's unit brings: its own and the other block's one, depth KH):
        M = 2U rows of block 0's half of the G*H gate rows."""
        return 2, half_depth(gates * hidden)

    @staticmethod
    def grid_blocks(hidden: int, units_per_block: int) -> int:
        """2 * ceil(H / 2U): whole pairs."""
        return 2 * ceil_div(hidden, 2 * units_per_block)

    @property
    def pairs(self) -> int:
        return self.blocks // 2

    @property
    def halves(self) -> tuple[int, int]:
        """(KH, KC): the gate rows of block 0's half and of block 1's."""
        K = self.gates * self.hidden
        return self.depth, K - self.depth

    @property
    def smem_recv(self) -> int:
        """Bytes of the other block's half sums of this block's units: U x B floats."""
        return 4 * self.units_per_block * self.batch_per_block

    @property
    def smem_bytes(self) -> int:
        return super().smem_bytes + self.smem_recv

    @property
    def depth_words(self) -> str:
        return f"{self.depth} = half of G*H"

    def slice_words(self) -> str:
        return (f"R^T slice alone is {self.rows} units (the pair's) x {self.depth} gate rows "
                f"(a half)")

    def where_words(self) -> str:
        kh, kc = self.halves
        return (f"{self.blocks} blocks in {self.pairs} cluster pairs (a block {kh} or {kc} of "
                f"the {kh + kc} gate rows)")

    def smem_words(self) -> str:
        return f"{super().smem_words()} + the other half's sums {self.smem_recv}"

    def step_us(self) -> float:
        return pair_step_us(self.blocks, self.units_per_block, self.depth, self.batch)


def step_us(blocks: int, units: int, depth: int, batch: int) -> float:
    """The modelled microseconds of one step: fixed + staging (every block reads all of
    dg_t, batch x depth floats, from L2) + the FMAs of one block (units x depth x batch)."""
    staged = 4.0 * blocks * batch * depth
    return (STEP_FIXED_US + staged / L2_BYTES_PER_US
            + units * depth * batch / FMAS_PER_US_PER_SM)


def pair_step_us(blocks: int, units: int, half: int, batch: int) -> float:
    """The modelled microseconds of one step of the pair kernel: ``step_us``'s terms with
    every block staging only its half (``half`` = KH columns of dg_t) and multiplying it by
    2U rows (the grid kernel's FMAs at U), plus PAIR_EXCHANGE_US."""
    staged = 4.0 * blocks * batch * half
    return (STEP_FIXED_US + staged / L2_BYTES_PER_US
            + 2 * units * half * batch / FMAS_PER_US_PER_SM + PAIR_EXCHANGE_US)


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


def pair_geometry(cell: str, hidden: int, batch: int, units_per_block: int,
                  threads: int | None = None, max_threads: int = PK_MAX_THREADS,
                  k_tile: int | None = None) -> "PairBwdFit":
    """The pair kernel's decomposition for U = ``units_per_block`` with no device checks
    (``bwd_geometry``'s rules over PairBwdFit's product: 2U rows of half the gate rows;
    ``k_tile``: columns of a half a tile, else all KH of them)."""
    return layout(PairBwdFit, cell, hidden, batch, units_per_block, threads, max_threads,
                  k_tile)


def persistent_bwd_fit(cell: str, hidden: int, batch: int, props: dict, *,
                       kind: str | None = None, units_per_block: int | None = None,
                       threads: int | None = None, regs_per_thread: int | None = None,
                       k_tile: int | None = None, clusters: int | None = None,
                       layers: int = 1, dtype: str = "float32") -> BwdFit:
    """Fit one layer's backward onto the device described by ``props`` (CuPy's
    getDeviceProperties keys, as persistent.persistent_fit). ``kind``: 'grid', 'pair' (the
    grid kernel in cluster pairs, ``pair_fit``), 'cluster', or None: of those that fit, the
    one whose step the cost model makes shorter (of grid and pair the pair only where its
    modelled step, exchange included, is shorter; then against the cluster kernel, the grid
    kernel on a tie; with ``layers`` > 1 the grid kernels' step times layers, since the
    cluster kernel's chunked launches overlap the layers and the grid kernels' cannot);
    given ``units_per_block`` or ``k_tile`` mean 'grid', ``clusters`` 'cluster'. ``dtype``
    (the key's precision): the pair kernel runs float32 only.
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
    The pair kernel (``pair_fit``): rules 1-4 over its layout (2U rows of half the gate rows,
    2 ceil(H / 2U) blocks, U the most blocks that fit: ``most_blocks``), then ``pair_decline`` (float32, compute
    capability 9.0+, two non-empty halves, every pair resident at once).
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
    if kind not in (None, "grid", "pair", "cluster"):
        raise ValueError(f"persistent_bwd_fit: kind must be 'grid', 'pair', 'cluster' or None, "
                         f"got {kind!r}")
    if kind is None and (units_per_block is not None or k_tile is not None):
        kind = "grid"
    if kind is None and clusters is not None:
        kind = "cluster"
    name = get_cell(cell).name
    H, B = int(hidden), int(batch)
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       PK_MAX_THREADS, BLOCK_SIZES, threads)
    grid = cl = pair = None
    if kind in (None, "grid"):
        grid = _grid_fit(dev, name, H, B, units_per_block, k_tile)
    if kind in (None, "pair"):
        pair = pair_fit(dev, name, H, B, units_per_block, k_tile, dtype)
        if kind == "pair":
            return pair
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
    grid = _prefer(grid, pair, "grid kernel", "pair kernel")
    # with several layers the cluster kernel's chunked launches overlap them; the grid
    # kernels' run one after another (they need every SM): compare a layer-step of each
    return _prefer(grid, cl, "grid kernel", "cluster kernel", int(layers))


def _prefer(base: BwdFit, alt: BwdFit, base_name: str, alt_name: str,
            base_scale: int = 1) -> BwdFit:
    """``alt`` where it fits and its modelled step is shorter than ``base``'s times
    ``base_scale`` (or ``base`` does not fit), else ``base``; the reason names the other
    (its modelled step, or why it does not fit)."""
    take = alt.ok and (not base.ok or alt.step_us() < base.step_us() * base_scale)
    won, lost, name = (alt, base, base_name) if take else (base, alt, alt_name)
    other = f"the {name} " + (f"~{lost.step_us():.1f} us a step" if lost.ok
                              else f"does not fit: {lost.reason}")
    return replace(won, reason=f"{won.reason}; {other}")


def pair_fit(dev: DeviceBudget, name: str, H: int, B: int, units_per_block=None,
             k_tile=None, dtype: str = "float32") -> "PairBwdFit":
    """The pair kernel's fit (``PairBwdFit``): the grid kernel's rules 1-4 for its layout (U
    given, else the most blocks that fit, ``most_blocks``), each U's fit also declined where
    ``pair_decline`` says why (the first reason: fp32, clusters, the halves, the pairs
    resident at once)."""
    def fit_at(u):
        f = grid_fit(dev, PairBwdFit, name, H, B, u, k_tile)
        why = pair_decline(f, dev, dtype) if f.ok else None
        return replace(f, ok=False, reason=f"{name} backward pair kernel: {why}") if why else f
    if units_per_block is not None:
        return fit_at(int(units_per_block))
    return most_blocks(dev, H, B, fit_at)


def unit_ladder(dev: DeviceBudget, H: int, B: int, fit_at):
    """``fit_at(U)`` for U0 = ceil(H / SMs) and its doublings, while U < H and U * B cells fit
    PK_CPT a thread (the last one tried may break that rule: it is where the ladder stops):
    the U the grid and pair fits choose among, lazily, fewest units (most blocks) first."""
    u = ceil_div(H, dev.sms)
    while True:
        yield fit_at(u)
        if u >= H or u * B > PK_CPT * dev.max_threads:
            return
        u *= 2


def most_blocks(dev: DeviceBudget, H: int, B: int, fit_at) -> BwdFit:
    """Of ``unit_ladder``'s fits, the first that fits: the most blocks (the pair kernel's U),
    else the fit at U0 (saying why not). Not ``by_cost_model``: its staging term (every block
    reads its half of dg_t from L2) made fewer blocks look faster, but the H100 ran the pair
    at U 4 (128 blocks) 11-12% faster than at U 8 (64) at LSTM L1 H512 B32 / B64, fwd+bwd
    2.34 / 3.65 ms against 2.62 / 4.14 (kernels/persistent-bwd-bench-...-20261128T053434.json):
    the staging overlaps the FMAs, which halve with twice the blocks."""
    tried = []
    for f in unit_ladder(dev, H, B, fit_at):
        if f.ok:
            later = ", ".join(str(t.units_per_block) for t in tried)
            return replace(f, reason=f"{f.reason}; U {f.units_per_block}: the most blocks "
                                     f"that fit" + (f" (U {later} did not)" if tried else ""))
        tried.append(f)
    return tried[0]


def pair_decline(fit: "PairBwdFit", dev: DeviceBudget, dtype: str = "float32") -> str | None:
    """Why the pair kernel cannot run ``fit`` (a PairBwdFit that grid_fit accepted: one
    block an SM, its shared memory and registers), or None: float32 only (no typed
    instantiations); thread-block clusters (compute capability 9.0+); two halves of the
    G*H gate rows, neither empty; every pair resident at once: pairs <= (SMs -
    stack_bwd.PAIR_SM_SLACK) / 2 (a cluster lives on one GPC, whose size the properties do
    not give; the driver's count, cuOccupancyMaxActiveClusters, is checked on the GPU by
    tests/gpu/test_gpu_pair_bwd.py)."""
    if dtype != "float32":
        return f"float32 only (no {dtype} instantiation): the grid kernel runs it"
    if dev.cc_major < 9:
        return (f"compute capability {dev.cc_major}.x has no thread-block clusters (they need "
                f"9.0+)")
    kh, kc = fit.halves
    if kc < 1:
        return f"{kh + kc} gate rows are too few to halve (block 1's half would be empty)"
    cap = (dev.sms - PAIR_SM_SLACK) // 2
    if fit.pairs > cap:
        return (f"{fit.pairs} pairs > {cap} resident at once ((SMs - {PAIR_SM_SLACK}) / 2: a "
                f"pair lives on one GPC)")
    return None


def _grid_fit(dev: DeviceBudget, name: str, H: int, B: int, units_per_block, k_tile) -> BwdFit:
    """The grid kernel's fit (rules 1-4)."""
    if units_per_block is not None:
        return grid_fit(dev, BwdFit, name, H, B, int(units_per_block), k_tile)
    return by_cost_model(dev, H, B, lambda u: grid_fit(dev, BwdFit, name, H, B, u, k_tile))


def by_cost_model(dev: DeviceBudget, H: int, B: int, fit_at) -> BwdFit:
    """Of ``unit_ladder``'s fits (``fit_at(U)``: a grid kernel's fit at U units a block), the
    one whose step its cost model (``step_us``) makes shortest among those that fit (more
    blocks on a tie), its reason naming the U tried; else the fit at U0 (saying why not)."""
    tried = list(unit_ladder(dev, H, B, fit_at))
    ok = [f for f in tried if f.ok]
    if not ok:
        return tried[0]
    best = min(ok, key=lambda f: (round(f.step_us(), 3), -f.blocks))
    return replace(best, reason=f"{best.reason}; U {best.units_per_block} of "
                                f"{', '.join(str(f.units_per_block) for f in ok)} by the "
                                f"cost model")
