"""The tensor-core cluster kernels (cuda_src/persistent_mmac.cu, ``*_persistent_mmac_fwd``)
and their grid form (persistent_mmag.cu, ``*_persistent_mmacg_fwd``): how one layer is cut
(``mmac_layout``) and which shapes they take (``mmac_fit``). The NumPy twin is the grid
kernel's emulation (``emulate.emulate``) with this kernel's order of the sums over k.

Clusters of CN blocks, CN = PK_CLUSTER = 8 as the FMA cluster kernel (persistent.py), or 16
(the ``*_mmac16_*`` kernels: a non-portable cluster size, the launch opts in) where a block's
share of R does not fit at 8: each cluster holds all of R and updates its own slice of at
most MMAC_BG = 8 batches (one n8 tile of mma.sync m16n8k16: ``clusters`` = ceil(B / 8)), or,
in clusters of 8 past what the device holds at once (``cluster_count``), of up to
MMAC_WIDE_BATCH (the wide form, persistent_mmacw.cu, ``*_persistent_mmacw_fwd``: MMAC_WNT n8
tiles, MMAG_KR steps' A fragments in registers, as the grid form); block rank r owns the hidden units [r*U, r*U + U), U = ceil(H / CN), with all G gate rows
(M = G*U rows of R). The R slice and h_t (two buffers: pushed there by the blocks that
update it, then the cluster barrier) are kept in shared memory in the storage type (bf16 /
fp16: half the bytes of the FMA kernels' fp32 copies). The block's MT = ceil(M / 16) m16
tiles times KPARTS parts of the k16 steps over H are its warps (at most MMAC_MAX_THREADS
threads): warp w multiplies tile w % MT over part w // MT (two accumulator chains, even and
odd steps, added at the end; the A fragments of its first MMAC_KR steps held in registers for
the whole launch), the parts' sums meet in shared memory and are added in part order by the
thread that updates the cell.

bfloat16 and float16 keys only (mma.MMA_DTYPES_REASON): R and h_t are exact in the tensor
core's input type, so the kernel computes the other persistent kernels' math up to
summation order. Why a cluster and not the grid (mma.py): at a batch of 8-32 and H 256-512
the tensor-core grid kernel's step is its grid barrier and the L2 staging of h_t (~8 us on
the H200), while a cluster exchanges h_{t+1} through distributed shared memory and meets at
the hardware barrier; the FMA cluster kernel cannot hold LSTM H 256's R (fp32) with its
partial sums in one block's shared memory.

The grid form (``cluster`` 0, GRID_FORM) is for a layer whose R no cluster holds (LSTM H 1024:
8 MiB of fp16): one block an SM, U = ceil(H / SMs), every block all B <= MMAG_BATCH batches
(MMAG_NT n8 tiles), the same product and cells; h_{t+1} goes to global memory, the blocks meet
at the grid kernels' flag barrier and stage h_t from L2 at the top of a step, in pairs
(clusters of MMAG_CLUSTER: each block copies half of h_t, multicast into both; 5.07 -> 4.35 us
a step at LSTM H 1024 B 8, 7.60 -> 6.31 at B 32, H200 float16). At LSTM H 1024 B 8 the
tensor-core grid kernel (mma.py: R as fp32 in shared memory, its fragments converted every
step, h_t staged in k tiles) took 14.9 us a step on the H200
(`kernels/persistent-mma-bench-T100-nvidia-h200-20261129T102006.json`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cells import get_cell
from ..precision import get_precision
from .budget import DeviceBudget, ceil_div
from .mma import MMA_DTYPES, MMA_DTYPES_REASON
from .persistent import PK_CLUSTER, PK_CPT, Fit, rule_cluster_cap

# The kernel's compile-time constants (cuda_src/persistent_mmac.cu; a test holds them equal).
MMAC_MAX_THREADS = 256   # __launch_bounds__(PK_MMAC_MAX_THREADS, 1): up to 255 registers
MMAC_KR = 32             # k16 steps a warp holds the A fragments of in registers (PK_MMAC_KR)
MMAC_BG = 8              # most batches a cluster (PK_MMAC_BG): one n8 tile
NON_PORTABLE = 16        # PK_MMAC_CLUSTER16: past 8 blocks the launch opts in (library.py)
MMAC_CLUSTERS = (PK_CLUSTER, NON_PORTABLE)   # blocks a cluster
GRID_FORM = 0            # ``cluster`` of the grid form (persistent_mmag.cu), as persistent.Fit
MMAC_FORMS = MMAC_CLUSTERS + (GRID_FORM,)    # what mmac_fit tries, in order
MMAG_NT = 4              # the grid form's most n8 tiles (PK_MMAG_NT)
MMAG_BATCH = 8 * MMAG_NT                     # ... so its most batches
MMAG_KR = 16             # the grid form's k16 steps held in registers (PK_MMAG_KR)
MMAG_CLUSTER = 2         # the grid form's blocks a cluster (PK_MMAG_CLUSTER: a pair shares
                         # the staging of h_t; its blocks round up to a multiple of it)
MMAG_BARRIER = 16        # the grid form's bytes past the partial sums (PK_MMAG_BARRIER)
MMAC_RS_PAD1 = 1         # floats past 8 NT in a row of the partial sums at one n8 tile
MMAC_RS_PAD = 3          # ... and at more (PK_MMAC_RS_PAD1 / PK_MMAC_RS_PAD: bank conflicts)
MMAC_WNT = 4             # the wide cluster form's most n8 tiles a cluster (PK_MMAC_WNT)
MMAC_WIDE_BATCH = 8 * MMAC_WNT               # ... so its most batches a cluster

NVCC_REGS = {"lstm": 255, "gru": 255, "rnn_tanh": 255, "rnn_relu": 255}
"""Registers a thread the fit assumes: the most __launch_bounds__(256, 1) allows (nvcc 13.0,
sm_90a, --resource-usage: 206-241, the MMAC_KR steps' A fragments 128 of them, no spills; a
test holds nvcc to at most these)."""


def kernel_name(cell: str, cluster: int = PK_CLUSTER, wide: bool = False) -> str:
    """'lstm' -> 'lstm_persistent_mmac_fwd'; at clusters of 16, 'lstm_persistent_mmac16_fwd';
    the grid form (cluster GRID_FORM), 'lstm_persistent_mmacg_fwd'; ``wide`` (clusters of 8
    only: up to MMAC_WNT n8 tiles a cluster, persistent_mmacw.cu), 'lstm_persistent_mmacw_fwd'."""
    if cluster not in MMAC_FORMS:
        raise ValueError(f"mmac: cluster must be one of {MMAC_FORMS}, got {cluster!r}")
    if wide and cluster != PK_CLUSTER:
        raise ValueError(f"mmac: the wide form runs clusters of {PK_CLUSTER}, got {cluster!r}")
    tail = "w" if wide else {PK_CLUSTER: "", GRID_FORM: "g"}.get(cluster, str(cluster))
    return f"{get_cell(cell).name}_persistent_mmac{tail}_fwd"


def non_portable(name: str) -> bool:
    """Whether kernel ``name`` runs in clusters past the portable 8 blocks (its launch must
    opt in: cudaFuncAttributeNonPortableClusterSizeAllowed)."""
    return f"_persistent_mmac{NON_PORTABLE}_" in name


@dataclass(frozen=True)
class MmacFit(Fit):
    """How one layer runs as one tensor-core cluster launch (a ``persistent.Fit``: the plan
    builders read its kernel, grid, block, shared memory and scalars as the cluster kernel's).
    ``k_parts``: KPARTS, the parts of the k16 steps (threads = 32 * m_tiles * k_parts);
    ``k_groups`` is the same number (the partial sums each gate sum adds); ``k_tile`` is
    KP = H rounded up to 16 (one tile: all of h_t is in shared memory)."""

    @property
    def kernel(self) -> str:
        return kernel_name(self.cell, self.cluster, self.wide)

    @property
    def wide(self) -> bool:
        """Whether a cluster updates more than one n8 tile of batches (the wide form)."""
        return is_wide(self.cluster, self.batch_per_block)

    @property
    def n_tiles(self) -> int:
        """NT: the n8 tiles of a block's batches (1 in clusters of one tile)."""
        return tiles_of(self.cluster, self.batch_per_block)

    @property
    def m_tiles(self) -> int:
        """MT: m16 tiles of the block's G*U rows."""
        return ceil_div(self.rows, 16)

    @property
    def k_steps(self) -> int:
        """KS: k16 steps over H."""
        return ceil_div(self.hidden, 16)

    @property
    def k_parts(self) -> int:
        return self.k_groups

    def part_steps(self, part: int) -> range:
        """The k16 steps part ``part`` multiplies: [part*KS // KPARTS, (part+1)*KS // KPARTS)."""
        ks, n = self.k_steps, self.k_parts
        return range(part * ks // n, (part + 1) * ks // n)

    def part_columns(self, part: int) -> np.ndarray:
        """The columns k < H of h_t (and of R) part ``part`` sums over, in order."""
        s = self.part_steps(part)
        return np.arange(16 * s.start, min(16 * s.stop, self.hidden), dtype=np.int64)

    def describe(self) -> str:
        where = (f"{self.clusters} cluster{'' if self.clusters == 1 else 's'} of "
                 f"{self.cluster} blocks ({self.batch_per_block} batches each"
                 f"{f', {self.n_tiles} n8 tiles: the wide form' if self.wide else ''})"
                 if self.cluster
                 else f"grid form, {self.blocks} blocks ({self.batch} batches each)")
        head = (f"{self.cell} H {self.hidden} B {self.batch}: tensor-core cluster kernel "
                f"(mma.sync m16n8k16), U {self.units_per_block}, {where} x {self.threads} "
                f"threads "
                f"({self.m_tiles} m16 tiles x {self.k_parts} part"
                f"{'' if self.k_parts == 1 else 's'} of {self.k_steps} k16 steps), shared "
                f"{self.smem_bytes} B (R {self.smem_r} + h buffers {self.smem_tile} + "
                f"partials {self.smem_partials})")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def is_wide(cluster: int, bg: int) -> bool:
    """Whether clusters of ``cluster`` blocks of ``bg`` batches each run the wide form (past
    one n8 tile; clusters of 8 only)."""
    return cluster == PK_CLUSTER and bg > MMAC_BG


def partial_stride(n_tiles: int) -> int:
    """RS, the row stride (floats) of the kernel's partial sums [KPARTS][MT*16][RS] at
    ``n_tiles`` n8 tiles: 8 NT and a pad, so that the pointwise threads' reads of a gate row
    (U units a row apart) and the fragments' writes (8 rows) are at most 2-way bank conflicts
    in every form (the kernel's mmac_geom; at 8 NT the grid form's reads at B 32 were 8-way,
    ncu: 44% of its shared-load wavefronts)."""
    return 8 * n_tiles + (MMAC_RS_PAD1 if n_tiles == 1 else MMAC_RS_PAD)


def tiles_of(cluster: int, bg: int) -> int:
    """NT, the n8 tiles of ``bg`` batches a block in form ``cluster``: ceil(bg / 8) in the
    grid form (GRID_FORM) and the wide form, else one (the kernel's mmac_geom)."""
    return ceil_div(bg, 8) if cluster == GRID_FORM or is_wide(cluster, bg) else 1


def mmac_layout(cell: str, hidden: int, batch: int, k_parts: int = 1,
                clusters: int | None = None, cluster: int = PK_CLUSTER,
                units_per_block: int | None = None) -> MmacFit:
    """The kernel's cut at clusters of ``cluster`` blocks (MMAC_FORMS) with ``k_parts``
    parts of the k16 steps and ``clusters`` clusters (default ceil(B / MMAC_BG)), no device
    checks (ok False where the kernel would trap: a cluster past MMAC_BG batches (clusters of
    16) or MMAC_WIDE_BATCH (clusters of 8: past MMAC_BG the wide form) or empty, threads past
    MMAC_MAX_THREADS, more than PK_CPT cells a thread, more parts than k16 steps). Shared
    memory (the kernel's mmac_geom): R slice [MT*16][KP + 8] and two h buffers [8 NT][KP + 8]
    of 16-bit values (NT = ceil(BG / 8) n8 tiles in the wide form, else 1), partial sums
    [KPARTS][MT*16][RS] floats (``partial_stride``).
    The grid form (``cluster`` GRID_FORM): ``units_per_block`` U (required: the device's SMs
    set it), ceil(H / U) blocks rounded up to a multiple of MMAG_CLUSTER (its clusters; a
    block past H owns no units) of all B <= MMAG_BATCH batches in NT = ceil(B / 8) n8 tiles,
    one h buffer [8 NT][KP + 8], partial sums [KPARTS][MT*16][RS] and the staging's
    mbarrier (MMAG_BARRIER bytes, counted in smem_partials)."""
    for what, v in (("hidden", hidden), ("batch", batch), ("k_parts", k_parts),
                    ("clusters", 1 if clusters is None else clusters),
                    ("units_per_block", 1 if units_per_block is None else units_per_block)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"mmac: {what} must be a positive int, got {v!r}")
    spec = get_cell(cell)
    H, B, kparts, cn = int(hidden), int(batch), int(k_parts), int(cluster)
    kernel_name(spec.name, cn)   # checks cluster
    grid = cn == GRID_FORM
    if grid and units_per_block is None:
        raise ValueError("mmac: the grid form needs units_per_block (ceil(H / SMs))")
    ncl = 1 if grid else ceil_div(B, MMAC_BG) if clusters is None else int(clusters)
    U = int(units_per_block) if grid else ceil_div(H, cn)
    M = spec.gates * U
    mt, ks = ceil_div(M, 16), ceil_div(H, 16)
    kp = 16 * ks
    nt = 32 * mt * kparts
    BG = ceil_div(B, ncl)
    wide = is_wide(cn, BG)
    ntiles = tiles_of(cn, BG)
    rows_h = 8 * ntiles * (1 if grid else 2)
    fit = MmacFit(cell=spec.name, hidden=H, batch=B, ok=True, reason="fits",
                  units_per_block=U,
                  blocks=(MMAG_CLUSTER * ceil_div(ceil_div(H, U), MMAG_CLUSTER) if grid
                          else cn * ncl), threads=nt,
                  lanes=(1, 1, 1), k_groups=kparts, cells_per_thread=ceil_div(U * BG, nt),
                  k_tile=kp, smem_r=2 * mt * 16 * (kp + 8), smem_tile=2 * rows_h * (kp + 8),
                  smem_partials=(4 * kparts * mt * 16 * partial_stride(ntiles)
                                 + (MMAG_BARRIER if grid else 0)),
                  cluster=cn, clusters=ncl)
    problem = None
    if grid and B > MMAG_BATCH:
        problem = (f"batch {B} > {MMAG_BATCH} (the grid form's {MMAG_NT} n8 tiles: its "
                   f"accumulators are registers)")
    elif BG > MMAC_BG and not grid and not wide:
        problem = (f"{BG} batches a cluster > {MMAC_BG} (one n8 tile; the wide form runs "
                   f"clusters of {PK_CLUSTER}): more clusters")
    elif wide and BG > MMAC_WIDE_BATCH:
        problem = (f"{BG} batches a cluster > {MMAC_WIDE_BATCH} (the wide form's {MMAC_WNT} "
                   f"n8 tiles: its accumulators are registers): more clusters")
    elif (ncl - 1) * BG >= B:
        problem = f"{ncl} clusters of {BG} batches leave the last empty (batch {B})"
    elif nt > MMAC_MAX_THREADS:
        problem = (f"{mt} m16 tiles x {kparts} parts = {nt} threads > {MMAC_MAX_THREADS} "
                   f"(the kernel's launch bound)")
    elif kparts > ks:
        problem = f"{kparts} parts of {ks} k16 steps: a part would be empty"
    elif U * BG > PK_CPT * nt:
        problem = f"{U} units x {BG} batches > {PK_CPT} cells a thread x {nt} threads"
    return replace(fit, ok=False, reason=problem) if problem else fit


def mmac_declines(dtype) -> str | None:
    """MMA_DTYPES_REASON unless precision ``dtype`` is one the kernels run; else None."""
    return None if get_precision(dtype).name in MMA_DTYPES else MMA_DTYPES_REASON


def mmac_fit(cell: str, hidden: int, batch: int, props: dict, dtype="bfloat16", *,
             k_parts: int | None = None, clusters: int | None = None,
             cluster: int | None = None, regs_per_thread: int | None = None) -> MmacFit:
    """Fit one layer onto the device ``props`` (CuPy's getDeviceProperties keys, as
    persistent.persistent_fit), at precision ``dtype``. Rules in order (the first that fails
    is the reason):
      0. dtype bfloat16 or float16 (MMA_DTYPES_REASON), compute capability >= 9.0.
      1. Clusters of ``cluster`` blocks where given, else of 8 where the block's share fits
         and of 16 where only that fits (a non-portable size: on the H100 / H200 every GPC
         holds one); a cluster's SMs. Where neither fits, the grid form (GRID_FORM): U =
         ceil(H / SMs), one block an SM, all resident (as the grid kernels), B <= MMAG_BATCH;
         its reason is the one reported when it does not fit either.
      2. ``cluster_count`` clusters of 8 (one a n8 tile up to half the SMs, then the wide
         form), ceil(B / MMAC_BG) of 16, unless ``clusters`` is given (then no grid form;
         clusters wait only for their own blocks: more than the device holds at once run in
         waves, correctly).
      3. The k16 steps in ``k_parts`` parts, else the most parts whose block stays within
         MMAC_MAX_THREADS threads (more warps: shorter mma chains a step; the parts' sums
         are added by the pointwise threads), at least one.
      4. Shared memory (R slice + h buffers + partial sums, ``mmac_layout``) within a
         block's, registers (NVCC_REGS unless given) within the SM's.
    Any hidden size whose R slice fits: columns past H, rows past G*U and batches past B are
    zeros in the fragments, never stored."""
    name = get_cell(cell).name
    H, B = int(hidden), int(batch)
    dev = DeviceBudget(props, NVCC_REGS[name] if regs_per_thread is None else regs_per_thread,
                       MMAC_MAX_THREADS, (MMAC_MAX_THREADS,))
    where = f"{name} hidden {H}, batch {B}, tensor-core cluster kernel"
    fit = None
    forms = MMAC_FORMS if clusters is None else MMAC_CLUSTERS   # a count: clusters only
    for cn in (forms if cluster is None else (int(cluster),)):
        fit = _on_device(name, H, B, dev, dtype, where, k_parts, clusters, cn)
        if fit.ok:
            break
    return fit


def cluster_count(batch: int, sms: int, cells_most: int) -> int:
    """The clusters of 8 blocks the fit takes for ``batch`` on ``sms`` SMs, where a block's
    threads update at most ``cells_most`` batches of its units (PK_CPT cells a thread): one
    a n8 tile (ceil(B / MMAC_BG), the one-tile kernels) while they fill at most half the SMs
    (``persistent.rule_cluster_cap``, as the FMA cluster kernel's rule); past that, the wide
    form at the fewest n8 tiles a cluster that keeps the count within that cap, and the
    fewest clusters at those tiles. Why: a block takes an SM (255 registers a thread), and
    clusters past what the device holds at once run in waves, each adding all T steps (H200,
    float16, LSTM H 128 forward: B 8 0.19 ms in 1 cluster, B 128 0.36 in 16, B 256 0.54 in
    32). The selector times other counts up to the driver's co-resident cap
    (counts.count_schedules)."""
    one = ceil_div(int(batch), MMAC_BG)
    cap = rule_cluster_cap(int(sms))
    most = min(MMAC_WIDE_BATCH, int(cells_most))
    if one <= cap or most <= MMAC_BG:
        return one
    tiles = ceil_div(int(batch), 8 * cap)
    return ceil_div(int(batch), max(MMAC_BG, min(8 * tiles, most)))


def _on_device(name, H, B, dev, dtype, where, k_parts, clusters, cn) -> MmacFit:
    """mmac_fit's rules at clusters of ``cn`` blocks (GRID_FORM: the grid form)."""
    grid = cn == GRID_FORM
    U = ceil_div(H, dev.sms) if grid else ceil_div(H, cn)
    mt = ceil_div(get_cell(name).gates * U, 16)
    if k_parts is None:
        k_parts = max(1, min(dev.max_threads // (32 * mt), ceil_div(H, 16)))
    if clusters is None and cn == PK_CLUSTER:
        clusters = cluster_count(B, dev.sms, PK_CPT * 32 * mt * int(k_parts) // U)
    fit = replace(mmac_layout(name, H, B, k_parts, None if grid else clusters, cn,
                              units_per_block=U if grid else None),
                  sms=dev.sms, regs_per_thread=dev.regs)

    def no(why):
        return replace(fit, ok=False, reason=f"{where}{', grid form' if grid else ''}: {why}")

    storage = mmac_declines(dtype)
    if storage is not None:
        return no(f"{get_precision(dtype).name}: {storage}")
    problem = (dev.cluster_problem(cn) if not grid else None if dev.cc_major >= 9 else
               f"compute capability 9.0 or later, as the cluster kernels it shares its body "
               f"with (device: {dev.cc_major}.x)")
    if problem is not None:
        return no(problem)
    if not fit.ok:
        return no(fit.reason)
    if fit.threads > dev.max_threads:
        return no(f"{fit.threads} threads > {dev.max_threads} a block")
    if fit.smem_bytes > dev.limit:
        return no(f"{f'clusters of {cn}' if cn else 'one block an SM'}: R slice {fit.smem_r} "
                  f"+ h buffers {fit.smem_tile} + "
                  f"partial sums {fit.smem_partials} = {fit.smem_bytes} bytes of shared "
                  f"memory > {dev.limit} a block can have")
    if not dev.regs_ok(fit.threads):
        return no(f"{fit.threads} threads x {dev.regs} registers > {dev.regs_sm} per SM")
    if grid and fit.blocks > dev.sms:
        return no(f"{fit.blocks} blocks (ceil(H / U) rounded up to clusters of "
                  f"{MMAG_CLUSTER}) > {dev.sms} SMs: not all resident")
    if grid:
        return replace(fit, reason=f"fits: the grid form, {fit.blocks} of {dev.sms} SMs (one "
                                   f"block an SM, clusters of {MMAG_CLUSTER}), R slice and h_t "
                                   f"in shared memory as 16-bit values, h_t staged from L2 a "
                                   f"step, each pair's once")
    wide = (f"; the wide form, {fit.batch_per_block} batches ({fit.n_tiles} n8 tiles) a "
            f"cluster" if fit.wide else "")
    return replace(fit, reason=f"fits: {fit.clusters} cluster{'' if fit.clusters == 1 else 's'}"
                               f" of {cn} blocks ({fit.blocks} of {dev.sms} SMs{wide}), R slice "
                               f"and h_t in shared memory as 16-bit values")


# --- the registry's NumPy twins ---------------------------------------------------------------

def mmac_products(fit: MmacFit):
    """emulate's ``products`` for ``fit``: each part's columns (``part_columns``) as one
    float32 matmul, the parts added in order (the kernel's order over parts; inside a part
    the tensor core's, which the twin does not copy: the same math, not the same bits)."""
    from .emulate import sum_k_groups
    runs = [fit.part_columns(p) for p in range(fit.k_parts)]
    runs = [r if r.size else None for r in runs]

    def products(rs, ht):   # rs [G, Ub, H], ht [B, H] -> [G, Ub, B]
        return sum_k_groups(runs, lambda cols: rs[:, :, cols] @ ht[:, cols].T,
                            (*rs.shape[:2], ht.shape[0]), np.result_type(rs, ht))
    return products


def _fit_of(cell, B, H, units_per_block, k_tile, cluster):
    """(kernel name, fit, emulate's keywords) of the twin of clusters of ``cluster`` blocks
    (GRID_FORM: the grid form at the launch's U): the default cut (the parts only change the
    order of the sums over k)."""
    grid = cluster == GRID_FORM
    fit = mmac_layout(cell, H, B, cluster=cluster,
                      units_per_block=units_per_block if grid else None)
    if units_per_block != fit.units_per_block or k_tile < H:
        fit = replace(fit, ok=False, reason=f"the twin runs U {fit.units_per_block} and a "
                                            f"k_tile >= H, got U {units_per_block}, k_tile "
                                            f"{k_tile}")
    return kernel_name(cell, cluster), fit, {"products": mmac_products(fit)}


def mmac_twin(cell: str, cluster: int = PK_CLUSTER, wide: bool = False):
    """The registry's NumPy twin of ``cell``'s tensor-core cluster kernel at clusters of
    ``cluster`` blocks (``wide``: the wide form's, the same math): the grid kernel's
    emulation (``emulate.emulate``: the key's rounding, the cells ``owned`` as the other
    persistent kernels own them) with this kernel's parts of the sum over k."""
    import functools

    from .emulate import twin_of
    return functools.partial(twin_of(get_cell(cell).name, _fit_of,
                                     kernel_name(cell, cluster, wide)), cluster=cluster)
