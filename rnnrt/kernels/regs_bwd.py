"""The register-resident cluster backward kernels (cuda_src/persistent_regs_bwd.cu,
``*_persistent_regs_bwd``): how one layer's recurrent chain is cut (the fit, ``regs_bwd_fit``)
and each lane's part in it. ``emulate_regs.emulate_regs_bwd`` runs exactly that cut in NumPy.

Like the cluster backward kernels (persistent_bwd.py): clusters of PK_CLUSTER = 8 blocks,
each cluster all of R^T and its own batch slice, block rank r owning the hidden units
[r*U, r*U + U) (U = ceil(H / 8)), dg_t pushed into every block's shared memory and the
cluster barrier between steps; the same arguments, outputs and chunking. Unlike them R^T is
held in registers as the forward regs kernel holds R (regs.py): the dg buffers hold a row
gate-interleaved (element j*G + q; G*RG_K floats, H <= RG_K = 128), lane l its float4 chunks
l + 32k (k < G); warp w owns the block-local units [w*UW, w*UW + UW) (UW = ceil(U / warps) <=
2) and lane l holds, in its warp's columns, the rows of R its chunks' elements name (G*UW
float4s, zeros past H). A step runs the cluster's batches in groups of BB: each lane
multiplies its chunks of dg_{t+1}[b] by its rows (UW x BB values, N = UW*BB <= 32, value
u*BB + bb, a chain over the chunks), a butterfly reduce-scatter over the warp leaves lane l the complete
dh_rec of value l >> (5 - log2 N); a round of NR = 32 / N groups gives every lane one cell
with no gather: lane l updates value l >> SH of group l & (NR - 1) of the round. No
__syncthreads and no partial sums in shared memory.

Every sum's order (each lane's chain over its 4G rows, then the butterfly's tree over the
lanes) is the same whatever the block size, the batch groups and the clusters: those change
which thread computes a cell, never its bits.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cells import get_cell
from .budget import DeviceBudget, ceil_div
from .persistent import PK_CLUSTER, cluster_count, pow2ceil
from .persistent_bwd import CLUSTER_STEP_FIXED_US, PUSHES_PER_US_PER_SM, BwdFit
from .regs import RG_K, cut_problem, cut_text, empty_last, lane_cut, on_device

# The kernel's compile-time constants (cuda_src/persistent_regs_bwd.cu; a test holds them).
RB_BB_MAX = 8           # most batches a group
RB_CPL = 2              # most pointwise cells a lane a step
RB_MAX_THREADS = 256    # __launch_bounds__(RB_MAX_THREADS, 1): up to 255 registers

BLOCK_SIZES = (256,)
"""Block sizes the fit tries: 8 warps (UW 2 at H 128: LSTM 32 floats of R^T a lane, as the
forward's 8-warp block). The kernel's bodies hold 1 or 2 units a warp; fewer warps would
need more (R floats, registers: nvcc spilled the LSTM at 4 units a warp)."""

NVCC_REGS = {"lstm": 213, "gru": 177, "rnn_tanh": 86, "rnn_relu": 86}
"""Registers a thread (nvcc 13.0, sm_90, -Xptxas -v: no spills; a test holds nvcc to at most
these)."""

# The cost model of a step (microseconds; uncalibrated until the bench times it): the cluster
# backward's fixed part and pushes (persistent_bwd.cluster_step_us), the FMAs at the full
# issue rate (no shared-memory operand for R), and the shared-memory reads of dg: every warp
# reads all of dg_{t+1} [BG, G*RG_K] a step at 128 bytes a clock an SM.
SMEM_BYTES_PER_US = 128 * 1980
FMAS_PER_US_PER_SM = 128 * 1980


def kernel_name(cell: str) -> str:
    """'lstm' -> 'lstm_persistent_regs_bwd'."""
    return f"{get_cell(cell).name}_persistent_regs_bwd"


@dataclass(frozen=True)
class RegsBwdFit(BwdFit):
    """How one layer's backward runs as one register-resident cluster launch (a
    ``persistent_bwd.BwdFit``: the plan reads its kernel, grid, block, shared memory and
    scalars as the cluster backward's). Besides its fields: ``units_per_warp`` UW and
    ``batch_group`` BB. lanes are (1, 1, 32) (the 32 lanes split k), k_groups 32, k_tile RG_K
    (the kernel's argument), cells_per_thread the cells a lane updates a step; smem_tile the
    two dg buffers (the only shared memory)."""

    units_per_warp: int = 1
    batch_group: int = 2

    @property
    def kernel(self) -> str:
        return kernel_name(self.cell)

    @property
    def values(self) -> int:
        """N: the values a lane reduce-scatters per group (UW x BB, <= 32)."""
        return self.units_per_warp * self.batch_group

    @property
    def groups_per_round(self) -> int:
        """NR: the groups one pointwise round reduce-scatters (32 / N: one cell a lane)."""
        return 32 // self.values

    @property
    def r_floats(self) -> int:
        """Floats of R^T a thread holds."""
        return 4 * self.gates * self.units_per_warp

    def step_us(self) -> float:
        """The modelled microseconds of a step: the cluster backward's fixed part and
        pushes, the FMAs of a block at the full rate, every warp's read of dg_{t+1}."""
        BG, U, G = self.batch_per_block, self.units_per_block, self.gates
        cells = U * BG
        smem = 4.0 * self.warps * BG * G * RG_K
        return (CLUSTER_STEP_FIXED_US + cells * G * PK_CLUSTER / PUSHES_PER_US_PER_SM
                + max(U * self.depth * BG / FMAS_PER_US_PER_SM, smem / SMEM_BYTES_PER_US))

    def describe(self) -> str:
        head = (f"{cut_text(self, f'{self.cell} backward H', 'R^T')}, "
                f"~{self.step_us():.1f} us a step modelled")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def regs_bwd_geometry(cell: str, hidden: int, batch: int, threads: int = BLOCK_SIZES[0],
                      clusters: int = 1, units_per_block: int | None = None) -> RegsBwdFit:
    """The kernel's cut for ``clusters`` clusters of blocks of ``threads`` threads, no device
    checks (ok False where the kernel would trap or has no body: hidden > RG_K, threads not
    whole warps or past RB_MAX_THREADS, UW > 2, more than RB_CPL cells a lane, an empty
    cluster, U short of covering H)."""
    spec, H, B, nt, ncl, U, BG, nw, uw = lane_cut("regs backward", cell, hidden, batch,
                                                  threads, clusters, units_per_block)
    bb = max(2, min(RB_BB_MAX, 32 // pow2ceil(uw), pow2ceil(BG)))
    groups = ceil_div(BG, bb)
    nr = max(1, 32 // (uw * bb))
    cpl = ceil_div(groups, nr)
    fit = RegsBwdFit(cell=spec.name, hidden=H, batch=B, ok=True, reason="fits",
                     units_per_block=U, blocks=PK_CLUSTER * ncl, threads=nt,
                     lanes=(1, 1, 32), k_groups=32, cells_per_thread=cpl, k_tile=RG_K,
                     smem_r=0, smem_tile=4 * 2 * groups * bb * spec.gates * RG_K,
                     smem_partials=0, cluster=PK_CLUSTER, clusters=ncl, units_per_warp=uw,
                     batch_group=bb)
    problem = cut_problem(H, nt, RB_MAX_THREADS, U, nw, uw, "4 rows of R^T a gate each (the "
                          "cluster backward holds R^T in shared memory)")
    if problem is None and cpl > RB_CPL:
        problem = (f"{BG} batches a cluster in groups of {bb}, {nr} groups a round = {cpl} "
                   f"cells a lane > RB_CPL {RB_CPL}: more clusters")
    problem = problem or empty_last(ncl, BG, B)
    return replace(fit, ok=False, reason=problem) if problem else fit


def regs_bwd_fit(cell: str, hidden: int, batch: int, props: dict, *,
                 threads: int | None = None, clusters: int | None = None,
                 regs_per_thread: int | None = None, layers: int = 1) -> RegsBwdFit:
    """Fit one layer's backward onto the device ``props`` (CuPy's getDeviceProperties keys,
    as persistent_bwd.persistent_bwd_fit): compute capability >= 9.0 and a cluster's SMs,
    hidden <= RG_K; the clusters: ``clusters`` where given, else the cluster backward's rule
    (``persistent.cluster_count(B, SMs, layers)``: the layers' share of the SMs where the
    launches overlap along the reverse wavefront; where that many do not fit, the fewest
    more up to the one-layer count that do); the block size ``threads``, else the first of
    BLOCK_SIZES whose cut fits; the dg buffers within a block's shared memory, the registers
    (NVCC_REGS[cell] unless given) within the SM's. A cluster is scheduled whole and waits
    only for itself: no co-residency rule. Where it does not fit, ok is False and ``reason``
    says why."""
    name = get_cell(cell).name
    if clusters is not None and (isinstance(clusters, bool) or int(clusters) < 1):
        raise ValueError(f"regs_bwd_fit: clusters must be >= 1, got {clusters!r}")
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       RB_MAX_THREADS, BLOCK_SIZES, threads)
    where = f"{name} backward hidden {hidden}, batch {batch}, register-resident clusters"

    def at(n):
        tries = [regs_bwd_geometry(name, hidden, batch, t, n) for t in dev.candidates]
        return on_device(next((f for f in tries if f.ok), tries[0]), dev, where, "dg buffers",
                         "R^T")

    if clusters is not None:
        return at(int(clusters))
    first = cluster_count(int(batch), dev.sms, int(layers))
    for n in range(first, max(first, cluster_count(int(batch), dev.sms)) + 1):
        fit = at(n)
        if fit.ok:
            break
    return fit


def lane_cells(fit: RegsBwdFit, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tid, b, jj) of every (b, j) cell block ``block`` updates, as the kernel assigns them:
    lane l of warp w, v = l >> SH (SH = 5 - log2 N), gi = l & (NR - 1), u = v // BB,
    bb = v % BB, updates unit jj = w*UW + u (block-local, live below the block's units) of
    batch (i*NR + gi)*BB + bb for i < the cells a lane (live below the cluster's batches);
    b is returned as the batch row (the cluster's start added)."""
    BB, NR, UW = fit.batch_group, fit.groups_per_round, fit.units_per_warp
    shift = 5 - (fit.values.bit_length() - 1)
    batches = fit.batches(block)
    nunits = len(fit.units(block))
    tid = np.arange(fit.threads)
    lane, warp = tid % 32, tid // 32
    v, gi = lane >> shift, lane & (NR - 1)
    jj = warp * UW + v // BB
    out = []
    for i in range(fit.cells_per_thread):
        b = (i * NR + gi) * BB + v % BB
        keep = (jj < nunits) & (b < len(batches))
        out.append((tid[keep], b[keep] + batches.start, jj[keep]))
    return tuple(np.concatenate(x) for x in zip(*out))
