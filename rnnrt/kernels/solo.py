"""The block-persistent ("solo") kernels (cuda_src/persistent_solo.cu, ``*_persistent_solo_fwd``):
how one layer is cut (the fit, ``solo_fit``), each lane's part in it, the NumPy emulation of
that cut (``emulate_solo``) and the registry's twins.

Each block holds ALL of R (G*H rows, stride SR = 4*ceil(H/4) floats) in shared memory and runs
its own batches [x*BG, x*BG + BG) (BG = ceil(B / blocks)) for all T steps; blocks never wait for
each other (no grid barrier, no cluster), so any block count is correct and the fit takes one
wave where it can. Thread tid = 8*j + s is k-split s of unit j: its FMA chains multiply rows
q*H + j (q < G) over the float4 chunks s, s + 8, s + 16, s + 24 (< ceil(H/4)) by h_t of each
of the block's BB = pow2(BG) batches (h_t double-buffered in shared memory); a shuffle
reduce-scatter over the 8 k-split lanes (masks 4, 2, 1, in whole batches) leaves lane s the
G gate sums of batch s >> (3 - log2 BB); the lanes with s % (8 / BB) == 0 write them to shared
memory, a __syncthreads, and thread bb*H + j updates cell (bb, j) (``lane_cells``: the cell
updates fill whole warps), a second __syncthreads ends the step.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cells import get_cell
from .budget import DeviceBudget, ceil_div
from .emulate import emulate, twin_of
from .persistent import Fit, full_tile, pow2ceil

# The kernel's compile-time constants (cuda_src/persistent_solo.cu; a test holds them equal).
SO_KS = 8               # k-split lanes of a unit (adjacent lanes)
SO_NCH = 4              # most float4 chunks of a row a lane multiplies
SO_MAX_H = 128          # SO_KS * SO_NCH * 4 columns
SO_BB_MAX = 4           # most batches a block (GRU, RNNs)
SO_BB_MAX_LSTM = 1      # most batches a block (LSTM)
SO_MAX_THREADS = 1024   # __launch_bounds__(SO_MAX_THREADS, 1): at most 64 registers
SO_BB_MAX_RR = 2        # most batches a block of the _rr kernels (part of R in registers)
SO_RR_THREADS = 512     # their __launch_bounds__(SO_RR_THREADS, 1): at most 128 registers
SO_RR_CHUNKS = 3        # chunks of each of its rows an _rr lane holds in registers (BB 1)
SO_RR_CHUNKS_BB2 = 1    # ... at 2 batches a block
RR_CELLS = ("gru", "rnn_tanh", "rnn_relu")   # the _rr kernels (LSTM's 4 rows a unit spill)
RR_PHRASE = ", part of it in registers, 2 units a thread"   # the _rr fits' description

NVCC_REGS = {"lstm": 64, "gru": 64, "rnn_tanh": 54, "rnn_relu": 54}
NVCC_REGS_RR = {"gru": 128, "rnn_tanh": 72, "rnn_relu": 72}
"""Registers a thread (nvcc 13.0, sm_90a, -Xptxas -v: no spills; a test holds nvcc to at most
these). The 8-batch bodies spilled at 64 (LSTM's 4-batch one too): hence SO_BB_MAX."""


def kernel_name(cell: str, upt: int = 1) -> str:
    """'lstm' -> 'lstm_persistent_solo_fwd'; upt 2 (two units a thread, part of R in
    registers): 'gru' -> 'gru_persistent_solo_rr_fwd'."""
    return f"{get_cell(cell).name}_persistent_solo{'_rr' if upt == 2 else ''}_fwd"


def launch_bound(upt: int = 1) -> int:
    """The kernels' __launch_bounds__ threads: SO_MAX_THREADS (64 registers a thread), the _rr
    kernels' SO_RR_THREADS (128)."""
    return SO_RR_THREADS if upt == 2 else SO_MAX_THREADS


def nvcc_regs(cell: str, upt: int = 1) -> int:
    """Registers a thread of ``cell``'s kernel (NVCC_REGS, the _rr kernels' NVCC_REGS_RR)."""
    return (NVCC_REGS_RR if upt == 2 else NVCC_REGS)[get_cell(cell).name]


def body_problem(cell: str, hidden: int, upt: int = 1) -> str | None:
    """Why no kernel body takes ``cell`` at ``hidden`` with ``upt`` units a thread (None: one
    does), whatever the batch and the device."""
    name = get_cell(cell).name
    if upt == 2 and name not in RR_CELLS:
        return f"no two-unit (_rr) kernel for {name} (its rows in registers spill)"
    if upt == 2 and hidden % 2:
        return f"hidden {hidden} is odd: two units a thread take units j and j + H/2"
    if hidden > SO_MAX_H:
        return (f"hidden {hidden} > {SO_MAX_H}: {SO_KS} lanes a unit hold at most {SO_NCH} "
                f"float4 chunks of a row each")
    return None


def batch_max(cell: str, upt: int = 1) -> int:
    """The most batches a block of ``cell`` takes (the kernel's so_bb_max(G, UPT))."""
    if upt == 2:
        return SO_BB_MAX_RR
    return SO_BB_MAX_LSTM if get_cell(cell).gates == 4 else SO_BB_MAX


def threads_for(hidden: int, upt: int = 1) -> int:
    """The block: SO_KS threads a unit (upt 2: two units a thread), whole warps."""
    return 32 * ceil_div(SO_KS * int(hidden) // upt, 32)


@dataclass(frozen=True)
class SoloFit(Fit):
    """How one layer runs as one block-persistent launch (a ``persistent.Fit``: the plan
    builders read its kernel, grid, block, shared memory and scalars as any per-layer fit's).
    units_per_block = H (every block owns every unit), blocks = ``clusters`` (each its batch
    slice: ``batch_per_block`` BG = ceil(B / blocks)), lanes (1, 1, SO_KS), k_groups SO_KS,
    cells_per_thread 1, k_tile = 4*ceil(H/4) (the kernel's argument: R's and h's row stride),
    smem_r all of R, smem_tile the two h buffers of BB rows; cluster 0 (no clusters).
    upt: units a thread, 1 (the *_persistent_solo_fwd kernels) or 2 (*_persistent_solo_rr_fwd:
    half the threads, each lane's first chunks of its rows in registers; the same sums)."""

    upt: int = 1

    @property
    def kernel(self) -> str:
        return kernel_name(self.cell, self.upt)

    @property
    def batch_group(self) -> int:
        """BB: the block's batches rounded up to a power of two (the body the kernel runs)."""
        return pow2ceil(self.batch_per_block)

    def units(self, block: int) -> range:
        return range(self.hidden)

    def batches(self, block: int) -> range:
        b0 = block * self.batch_per_block
        return range(min(b0, self.batch), min(self.batch, b0 + self.batch_per_block))

    def barrier_arrivals(self, steps: int) -> int:
        return 0   # no barrier between blocks

    def describe(self) -> str:
        head = (f"{self.cell} H {self.hidden} B {self.batch}: block-persistent, {self.blocks} "
                f"block{'' if self.blocks == 1 else 's'} of {self.batch_per_block} batch"
                f"{'' if self.batch_per_block == 1 else 'es'} x {self.threads} threads (all "
                f"of R on chip{RR_PHRASE if self.upt == 2 else ''}, {SO_KS} k-splits a unit), "
                f"shared {self.smem_bytes} B "
                f"(R {self.smem_r} + h {self.smem_tile} + gate sums {self.smem_partials})")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def solo_geometry(cell: str, hidden: int, batch: int, blocks: int = 1, upt: int = 1) -> SoloFit:
    """The kernel's cut over ``blocks`` blocks, ``upt`` units a thread, no device checks (ok
    False where the kernel would trap or has no body: hidden > SO_MAX_H, more than
    ``batch_max`` batches a block, an empty last block; upt 2: a cell without an _rr kernel,
    an odd hidden size)."""
    for what, v in (("hidden", hidden), ("batch", batch), ("blocks", blocks)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"solo: {what} must be a positive int, got {v!r}")
    spec = get_cell(cell)
    H, B, n = int(hidden), int(batch), int(blocks)
    BG = ceil_div(B, n)
    kt = full_tile(H)
    if upt not in (1, 2):
        raise ValueError(f"solo: upt must be 1 or 2, got {upt!r}")
    fit = SoloFit(cell=spec.name, hidden=H, batch=B, ok=True, reason="fits", upt=upt,
                  units_per_block=H, blocks=n, threads=threads_for(H, upt), lanes=(1, 1, SO_KS),
                  k_groups=SO_KS, cells_per_thread=1, k_tile=kt,
                  smem_r=4 * spec.gates * H * kt, smem_tile=4 * 2 * pow2ceil(BG) * kt,
                  smem_partials=4 * pow2ceil(BG) * spec.gates * H, cluster=0, clusters=n)
    problem = body_problem(spec.name, H, upt)
    if problem is None and BG > batch_max(spec.name, upt):
        problem = (f"{BG} batches a block > {batch_max(spec.name, upt)} (the kernel's bodies: "
                   f"more batches spill its {65536 // launch_bound(upt)} registers): more "
                   f"blocks")
    elif problem is None and (n - 1) * BG >= B:
        problem = f"{n} blocks of {BG} batches leave the last empty (batch {B})"
    return replace(fit, ok=False, reason=problem) if problem else fit


def blocks_per_sm(fit: SoloFit, dev: DeviceBudget, props: dict) -> int:
    """How many blocks of ``fit`` one SM holds at once (threads, shared memory, registers)."""
    by_threads = int(props.get("maxThreadsPerMultiProcessor", fit.threads)) // fit.threads
    by_smem = dev.per_sm // (fit.smem_bytes + dev.reserved)
    by_regs = dev.regs_sm // (ceil_div(fit.threads, 32) * dev.per_warp)
    return max(0, min(by_threads, by_smem, by_regs))


def wave_count(fit: SoloFit, props: dict) -> int:
    """Waves of blocks ``fit`` runs in on the device ``props``: its blocks over the SMs' worth
    of them (blocks_per_sm with the fit's own threads and registers)."""
    dev = DeviceBudget(props, fit.regs_per_thread or nvcc_regs(fit.cell, fit.upt),
                       launch_bound(fit.upt), (fit.threads,), fit.threads)
    return ceil_div(fit.blocks, dev.sms * max(1, blocks_per_sm(fit, dev, props)))


def solo_fit(cell: str, hidden: int, batch: int, props: dict, *, blocks: int | None = None,
             regs_per_thread: int | None = None, upt: int | None = None) -> SoloFit:
    """Fit one layer onto the device ``props`` (CuPy's getDeviceProperties keys, as
    persistent.persistent_fit): hidden <= SO_MAX_H; all of R and two h buffers within a
    block's shared memory (LSTM H 128's R alone is 256 KiB: declined); SO_KS * H threads
    within the device's block and the registers (NVCC_REGS[cell] unless given) within the
    SM's. Blocks: ``blocks`` if given, else one wave, SMs x ``blocks_per_sm`` blocks, with
    the batch spread evenly (BG = ceil(B / wave) batches a block, at most ``batch_max``: past
    it more blocks, which run in waves, still correct: blocks never wait for each other).
    ``upt`` 2: the _rr kernels (two units a thread, SO_RR_THREADS at most, NVCC_REGS_RR); 1
    the 8-threads-a-unit kernels; None (the default): 2 where it fits in as few waves of
    blocks as the one-unit kernel (it takes at most 2 batches a block, the one-unit kernel 4:
    past two per SM it would need more waves, which no run has timed), else 1. The _rr
    kernels were as fast or faster at every point measured (H200, T 100, the kernels alone,
    one run, `kernels/persistent-solo-bench-T100-nvidia-h200-20261129T014132.json`, us a
    step _rr / one-unit: GRU H 128 B 8 1.57 / 2.16, B 128 1.86 / 2.25, B 256 2.47 / 2.82;
    RNN tanh H 128 B 128 1.07 / 1.56; GRU and RNN tanh at H 64, B 8-256: 0.81-1.77 /
    0.93-1.83)."""
    if upt is None:
        two = solo_fit(cell, hidden, batch, props, blocks=blocks,
                       regs_per_thread=regs_per_thread, upt=2)
        one = solo_fit(cell, hidden, batch, props, blocks=blocks,
                       regs_per_thread=regs_per_thread, upt=1)
        if two.ok and (not one.ok or wave_count(two, props) <= wave_count(one, props)):
            return two
        return one
    name = get_cell(cell).name
    H, B = int(hidden), int(batch)
    nt = threads_for(H, upt)
    problem = body_problem(name, H, upt)   # declined below; its registers: the one-unit count
    regs = nvcc_regs(name, 1 if problem else upt) if regs_per_thread is None else regs_per_thread
    dev = DeviceBudget(props, regs, launch_bound(upt), (nt,), nt)
    where = f"{name} hidden {H}, batch {B}, block-persistent"
    first = solo_geometry(name, H, B, 1 if blocks is None else int(blocks), upt)
    first = replace(first, sms=dev.sms, regs_per_thread=dev.regs)

    def no(fit, why):
        return replace(fit, ok=False, reason=f"{where}: {why}")

    if problem:
        return no(first, problem)
    one = solo_geometry(name, H, B, B, upt)   # one batch a block: the least shared memory
    if one.smem_bytes > dev.limit:
        return no(first, f"R alone is {first.gates} x {H} x {H} floats = {one.smem_r} bytes; "
                         f"with the h buffers {one.smem_bytes} bytes of shared memory > "
                         f"{dev.limit} a block can have (a block holds all of R)")
    if nt > dev.max_threads:
        return no(first, f"{nt} threads ({SO_KS} a unit) > {dev.max_threads} a block")
    if not dev.regs_ok(nt):
        return no(first, f"{nt} threads x {dev.regs} registers > {dev.regs_sm} per SM")
    if blocks is None:
        wave = dev.sms * max(1, blocks_per_sm(one, dev, props))
        bg = min(ceil_div(B, wave), batch_max(name, upt))
        while bg > 1 and solo_geometry(name, H, B, ceil_div(B, bg), upt).smem_bytes > dev.limit:
            bg -= 1
        blocks = ceil_div(B, bg)
    fit = replace(solo_geometry(name, H, B, int(blocks), upt), sms=dev.sms,
                  regs_per_thread=dev.regs)
    if not fit.ok:
        return no(fit, fit.reason)
    if fit.smem_bytes > dev.limit:
        return no(fit, f"R and the h buffers of {fit.batch_per_block} batches = "
                       f"{fit.smem_bytes} bytes of shared memory > {dev.limit} a block can have")
    waves = wave_count(fit, props)
    return replace(fit, reason=f"fits: {fit.blocks} independent blocks ({dev.sms} SMs, "
                               f"{waves} wave{'' if waves == 1 else 's'}), all of R in each "
                               f"block's shared memory")


# --- the lanes, and the kernel's cut in NumPy ----------------------------------------------

def lane_cells(fit: SoloFit, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tid, b, jj) of every (b, j) cell block ``block`` updates, as the kernel assigns them:
    batch bb of the block (bb < its batches) and unit j are thread tid = bb*H + j (the cell
    updates fill whole warps; the gate sums reach them through shared memory); b is returned
    as the batch row (the block's start added)."""
    batches = fit.batches(block)
    bb, j = np.meshgrid(np.arange(len(batches)), np.arange(fit.hidden), indexing="ij")
    bb, j = bb.ravel(), j.ravel()
    return bb * fit.hidden + j, bb + batches.start, j


def lane_tree(rs: np.ndarray, ht: np.ndarray) -> np.ndarray:
    """gh [G, Ub, B] of rows rs [G, Ub, H] and h_t ht [B, H], summed as the kernel sums: lane s
    (of 8) runs one FMA chain over columns 4c .. 4c+3 of its chunks c = s, s + 8, s + 16, s + 24
    (each FMA computed in float64 and rounded once to the working dtype: an fp32 FMA but for
    rare double roundings; columns past H are zeros, which leave a chain unchanged), then the
    reduce-scatter's tree over the lanes: s and s + 4, then + 2, then + 1."""
    dtype = np.result_type(rs, ht)
    G, Ub, H = rs.shape
    B = ht.shape[0]
    K = SO_KS * SO_NCH * 4
    r = np.zeros((G, Ub, K), dtype)
    r[:, :, :H] = rs
    h = np.zeros((B, K), dtype)
    h[:, :H] = ht
    # column 32i + 4s + e: chunk s + 8i, element e
    r = r.reshape(G, Ub, 1, SO_NCH, SO_KS, 4).astype(np.float64)
    h = h.reshape(1, 1, B, SO_NCH, SO_KS, 4).astype(np.float64)
    p = np.zeros((G, Ub, B, SO_KS), dtype)
    for i in range(SO_NCH):
        for e in range(4):
            p = (p.astype(np.float64) + r[..., i, :, e] * h[..., i, :, e]).astype(dtype)
    for half in (4, 2, 1):
        p = p[..., :half] + p[..., half:2 * half]
    return p[..., 0]


def emulate_solo(cell: str, fit: SoloFit, gx, R, bw, br, h0, c0=None, train: bool = True):
    """``emulate.emulate`` with the block-persistent kernel's sums and cells (same arguments
    and results: (h [T+1, B, H], c, act))."""
    return emulate(cell, fit, gx, R, bw, br, h0, c0, train, products=lane_tree,
                   owners=lane_cells)


def twin_fit(cell: str, batch: int, hidden: int) -> SoloFit:
    """The fit the twins assume: ``batch_max`` batches a block (the fewest blocks; the block
    count does not change the order of any sum)."""
    return solo_geometry(cell, hidden, batch, ceil_div(batch, batch_max(cell)))


def _fit_of(cell, B, H, units_per_block, k_tile, cluster):
    fit = twin_fit(cell, B, H)
    if fit.ok and (units_per_block != H or k_tile != full_tile(H)):
        fit = replace(fit, ok=False, reason=f"units_per_block {units_per_block} / k_tile "
                                            f"{k_tile}: the kernel takes H and 4*ceil(H/4)")
    return kernel_name(cell), fit, {"products": lane_tree, "owners": lane_cells}


def solo_twin(cell: str):
    """The registry's NumPy twin of ``cell``'s block-persistent kernel."""
    return twin_of(get_cell(cell).name, _fit_of, kernel_name(cell))
