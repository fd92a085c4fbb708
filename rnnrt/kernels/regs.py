"""The register-resident cluster kernels (cuda_src/persistent_regs.cu, ``*_persistent_regs_fwd``):
how one layer is cut (the fit, ``regs_fit``) and each lane's part in it. ``emulate_regs.py``
runs exactly that cut in NumPy.

Like the cluster kernels (persistent.py): clusters of PK_CLUSTER = 8 blocks, each cluster all
of R and its own batch slice (``cluster_count`` clusters), block rank r owning the hidden
units [r*U, r*U + U) (U = ceil(H / 8)) with all G gate rows, h_{t+1} pushed into every
block's shared memory and the cluster barrier between steps. Unlike them R is held in
registers: warp w owns the block-local units [w*UW, w*UW + UW) (UW = ceil(U / warps) <= 2,
all G rows of each: the cell update stays in the warp), lane l holds columns [4l, 4l + 4) of
each of its warp's ROWS = G*UW rows (H <= RG_K = 128; zeros past H). A step runs the
cluster's batches in groups of BB: each lane multiplies its float4 of h_t[b] by its rows
(ROWS x BB partial sums, padded to a power of two N = pow2(ROWS) x BB <= 32 values, value
row*BB + bb), a butterfly reduce-scatter over the warp leaves lane l the complete sum of
value l >> (5 - log2 N); rounds of NR groups are then gathered by shuffles to the lanes
that update the cells (lane gi*C + u*BB + bb: group gi of the round, unit u, batch bb; C =
UW*BB), which push h_{t+1}. No __syncthreads and no partial sums in shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cells import get_cell
from .budget import DeviceBudget, ceil_div
from .persistent import PK_CLUSTER, Fit, cluster_count, pow2ceil

# The kernel's compile-time constants (cuda_src/persistent_regs.cu; a test holds them equal).
RG_K = 128              # columns of h the 32 lanes cover, 4 each: hidden <= RG_K
RG_BB_MAX = 8           # most batches a group
RG_NR_MAX = 4           # most groups one pointwise round gathers
RG_CPL = 2              # most pointwise cells a lane a step
RG_MAX_THREADS = 512    # __launch_bounds__(RG_MAX_THREADS, 1): at most 128 registers

BLOCK_SIZES = (256, 512)
"""Block sizes the fit tries, fewest warps first: 8 warps (UW 2 at H 128) hold R in 32
registers a lane for LSTM; 16 warps (UW 1) halve that and the cells a lane, for batches
a cluster too many for 8 warps (RG_CPL)."""

MAX_R_FLOATS = 48
"""The most floats of R a thread may hold (G*UW*4): beside them the lane's partial sums (up
to 32), its slice of h for a group (4*BB) and the pointwise state must fit 128 registers."""

NVCC_REGS = {"lstm": 128, "gru": 112, "rnn_tanh": 77, "rnn_relu": 77}
"""Registers a thread (nvcc 13.0, sm_90a, -Xptxas -v: no spills; a test holds nvcc to at most
these)."""


def kernel_name(cell: str) -> str:
    """'lstm' -> 'lstm_persistent_regs_fwd'."""
    return f"{get_cell(cell).name}_persistent_regs_fwd"


@dataclass(frozen=True)
class RegsFit(Fit):
    """How one layer runs as one register-resident cluster launch (a ``persistent.Fit``: the
    plan builders read its kernel, grid, block, shared memory and scalars as the cluster
    kernel's). Besides Fit's fields: ``units_per_warp`` UW and ``batch_group`` BB. Fit's
    lanes are (1, 1, 32) (the 32 lanes split k), k_groups 32, k_tile RG_K (the kernel's
    argument), cells_per_thread the cells a lane updates a step; smem_tile the two h
    buffers (the only shared memory)."""

    units_per_warp: int = 1
    batch_group: int = 2

    @property
    def kernel(self) -> str:
        return kernel_name(self.cell)

    @property
    def value_rows(self) -> int:
        """pow2(G*UW): the rows of a group's values (rows past G*UW are zeros)."""
        return pow2ceil(self.gates * self.units_per_warp)

    @property
    def values(self) -> int:
        """N: the values a lane reduce-scatters per group (value_rows x BB, <= 32)."""
        return self.value_rows * self.batch_group

    @property
    def cells_per_group(self) -> int:
        return self.units_per_warp * self.batch_group

    @property
    def groups_per_round(self) -> int:
        """NR: the groups one pointwise round gathers (one cell a lane where 32/C allows)."""
        return min(32 // self.cells_per_group, RG_NR_MAX)

    @property
    def r_floats(self) -> int:
        """Floats of R a thread holds."""
        return 4 * self.gates * self.units_per_warp

    def describe(self) -> str:
        head = cut_text(self, f"{self.cell} H", "R")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def cut_text(fit, what: str, r: str) -> str:
    """A register-resident fit's cut in words (the forward's and the backward's describe):
    ``what`` heads it, ``r`` names the matrix a thread holds."""
    return (f"{what} {fit.hidden} B {fit.batch}: register-resident, U "
            f"{fit.units_per_block}, {fit.clusters} cluster"
            f"{'' if fit.clusters == 1 else 's'} of {fit.cluster} blocks "
            f"({fit.batch_per_block} batches each) x {fit.threads} threads (UW "
            f"{fit.units_per_warp}, {fit.r_floats} floats of {r} a thread, groups of "
            f"{fit.batch_group} batches, {fit.cells_per_thread} cell"
            f"{'' if fit.cells_per_thread == 1 else 's'} a lane), shared "
            f"{fit.smem_bytes} B")


def regs_geometry(cell: str, hidden: int, batch: int, threads: int = BLOCK_SIZES[0],
                  clusters: int = 1, units_per_block: int | None = None) -> RegsFit:
    """The kernel's cut for ``clusters`` clusters of blocks of ``threads`` threads, no device
    checks (ok False where the kernel would trap or has no body: hidden > RG_K, threads not
    whole warps or past RG_MAX_THREADS, UW > 2, more than RG_CPL cells a lane, an empty
    cluster, U short of covering H)."""
    spec, H, B, nt, ncl, U, BG, nw, uw = lane_cut("regs", cell, hidden, batch, threads,
                                                  clusters, units_per_block)
    rp = pow2ceil(spec.gates * uw)
    bb = max(2, min(RG_BB_MAX, 32 // rp if rp <= 32 else 1, pow2ceil(BG)))
    groups = ceil_div(BG, bb)
    nr = min(32 // max(1, uw * bb), RG_NR_MAX) if uw * bb <= 32 else 1
    cpl = ceil_div(groups, max(nr, 1))
    fit = RegsFit(cell=spec.name, hidden=H, batch=B, ok=True, reason="fits",
                  units_per_block=U, blocks=PK_CLUSTER * ncl, threads=nt, lanes=(1, 1, 32),
                  k_groups=32, cells_per_thread=cpl, k_tile=RG_K, smem_r=0,
                  smem_tile=4 * 2 * groups * bb * RG_K, smem_partials=0,
                  cluster=PK_CLUSTER, clusters=ncl, units_per_warp=uw, batch_group=bb)
    problem = cut_problem(H, nt, RG_MAX_THREADS, U, nw, uw,
                          "4 columns of R each (the cluster kernel holds R in shared memory)")
    if problem is None and fit.r_floats > MAX_R_FLOATS:
        problem = (f"{fit.r_floats} floats of R a thread > MAX_R_FLOATS {MAX_R_FLOATS}: more "
                   f"warps")
    if problem is None and cpl > RG_CPL:
        problem = (f"{BG} batches a cluster in groups of {bb}, {nr} groups a round = {cpl} "
                   f"cells a lane > RG_CPL {RG_CPL}: more clusters or more warps")
    problem = problem or empty_last(ncl, BG, B)
    return replace(fit, ok=False, reason=problem) if problem else fit


def lane_cut(who: str, cell: str, hidden, batch, threads, clusters, units_per_block) -> tuple:
    """What the register-resident kernels' cuts share (forward, regs_geometry; backward,
    regs_bwd.regs_bwd_geometry): the arguments checked (``who`` names the kernel in the
    error), -> (cell spec, H, B, threads, clusters, U = ceil(H / PK_CLUSTER) unless given,
    BG batches a cluster, NW warps, UW = ceil(U / NW) units a warp)."""
    for what, v in (("hidden", hidden), ("batch", batch), ("threads", threads),
                    ("clusters", clusters)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{who}: {what} must be a positive int, got {v!r}")
    spec = get_cell(cell)
    H, B, nt, ncl = int(hidden), int(batch), int(threads), int(clusters)
    U = ceil_div(H, PK_CLUSTER) if units_per_block is None else int(units_per_block)
    nw = max(1, nt // 32)
    return spec, H, B, nt, ncl, U, ceil_div(B, ncl), nw, ceil_div(U, nw)


def cut_problem(H: int, nt: int, max_threads: int, U: int, nw: int, uw: int,
                lanes_hold: str) -> str | None:
    """Why a register-resident cut cannot run, of the reasons forward and backward share (H
    past RG_K: the 32 lanes hold ``lanes_hold``; threads; U not covering H; UW > 2), or
    None."""
    if H > RG_K:
        return f"hidden {H} > {RG_K}: the 32 lanes of a warp hold {lanes_hold}"
    if nt % 32 or not 32 <= nt <= max_threads:
        return f"{nt} threads: not whole warps within {max_threads}"
    if PK_CLUSTER * U < H:
        return f"{PK_CLUSTER} blocks of {U} units do not cover hidden {H}"
    if uw > 2:
        return (f"{U} units over {nw} warps = {uw} a warp > 2 (the kernel's bodies hold 1 or "
                f"2 units a warp)")
    return None


def empty_last(ncl: int, BG: int, B: int) -> str | None:
    """Why ``ncl`` clusters of BG batches cannot cover batch B (the last empty), or None."""
    if (ncl - 1) * BG >= B:
        return f"{ncl} clusters of {BG} batches leave the last empty (batch {B})"
    return None


def on_device(fit, dev: DeviceBudget, where: str, buffers: str, held: str):
    """A register-resident cut ``fit`` (RegsFit or regs_bwd.RegsBwdFit) checked on the
    device ``dev``: compute capability >= 9.0, a cluster's SMs, the cut itself, its
    ``buffers`` (the only shared memory) within a block's, the registers within the SM's;
    where any fails, ok False and the reason after ``where``; else the reason says what
    runs (``held``, e.g. 'R', in registers)."""
    fit = replace(fit, sms=dev.sms, regs_per_thread=dev.regs)

    def no(why):
        return replace(fit, ok=False, reason=f"{where}: {why}")

    problem = dev.cluster_problem(PK_CLUSTER)
    if problem is not None:
        return no(problem)
    if not fit.ok:
        return no(fit.reason)
    if fit.smem_bytes > dev.limit:
        return no(f"{buffers} of {fit.batch_per_block} batches = {fit.smem_bytes} bytes of "
                  f"shared memory > {dev.limit} a block can have")
    if not dev.regs_ok(fit.threads):
        return no(f"{fit.threads} threads x {dev.regs} registers > {dev.regs_sm} per SM")
    return replace(fit, reason=f"fits: {fit.clusters} cluster{'' if fit.clusters == 1 else 's'}"
                               f" of {PK_CLUSTER} blocks ({fit.blocks} of {dev.sms} SMs), "
                               f"{held} in registers ({fit.r_floats} floats a thread)")


def regs_fit(cell: str, hidden: int, batch: int, props: dict, *, threads: int | None = None,
             clusters: int | None = None, regs_per_thread: int | None = None) -> RegsFit:
    """Fit one layer onto the device ``props`` (CuPy's getDeviceProperties keys, as
    persistent.persistent_fit): compute capability >= 9.0 and a cluster's SMs, hidden <=
    RG_K; ``cluster_count(B, SMs)`` clusters unless ``clusters`` is given; the block size
    ``threads``, else the first of BLOCK_SIZES whose cut fits (R floats and cells a lane);
    the h buffers within a block's shared memory, the registers (NVCC_REGS[cell] unless
    given) within the SM's. Where it does not fit, ok is False and ``reason`` says why."""
    name = get_cell(cell).name
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       RG_MAX_THREADS, BLOCK_SIZES, threads)
    ncl = cluster_count(int(batch), dev.sms) if clusters is None else int(clusters)
    where = f"{name} hidden {hidden}, batch {batch}, register-resident clusters"
    tries = [regs_geometry(name, hidden, batch, t, ncl) for t in dev.candidates]
    fit = next((f for f in tries if f.ok), tries[0])
    return on_device(fit, dev, where, "h buffers", "R")


def lane_cells(fit: RegsFit, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tid, b, jj) of every (b, j) cell block ``block`` updates, as the kernel assigns them:
    lane l of warp w, gi = l // C, c = l % C, u = c // BB, bb = c % BB, updates unit
    jj = w*UW + u (block-local, live below the block's units) of batch (i*NR + gi)*BB + bb
    for i < the cells a lane (live below the cluster's batches; lanes gi >= NR idle); b is
    returned as the batch row (the cluster's start added)."""
    C, BB, NR, UW = fit.cells_per_group, fit.batch_group, fit.groups_per_round, \
        fit.units_per_warp
    batches = fit.batches(block)
    nunits = len(fit.units(block))
    tid = np.arange(fit.threads)
    lane, warp = tid % 32, tid // 32
    gi, cc = lane // C, lane % C
    jj = warp * UW + cc // BB
    out = []
    for i in range(fit.cells_per_thread):
        b = (i * NR + gi) * BB + cc % BB
        keep = (gi < NR) & (jj < nunits) & (b < len(batches))
        out.append((tid[keep], b[keep] + batches.start, jj[keep]))
    return tuple(np.concatenate(x) for x in zip(*out))


def gather_source(fit: RegsFit, lane: int, gate: int) -> int:
    """The lane whose reduce-scattered sum is gate ``gate`` of lane ``lane``'s cell:
    ((gate*UW + u)*BB + bb) << (5 - log2 N)."""
    C, BB = fit.cells_per_group, fit.batch_group
    cc = lane % C
    shift = 5 - (fit.values.bit_length() - 1)
    return ((gate * fit.units_per_warp + cc // BB) * BB + cc % BB) << shift
