"""The tensor-core stack backward (cuda_src/persistent_stack_mma_bwd.cu,
``lstm_persistent_stack_mma_bwd``): the recurrent chain of every layer of an LSTM stack's
backward in ONE persistent launch along the reverse wavefront, in cluster pairs, with the
product on tensor cores (mma.sync m16n8k16, bf16 / fp16 operands, fp32 accumulation): the
tensor-core stack forward's (stack_mma.py) backward, at the precisions that forward runs.

Why: at bf16 / fp16 the stack forward runs on tensor cores, but the fp32 stack backward
(stack_bwd.py) reads fp32 dg and weights, so a training step's backward after it fell back to
a per-layer one (choice_backward.stack_backward's old decline). Here the cut is the fp32
cluster-pair kernel's (block (l, rank) owns the pointwise of units 16 rank .. + 16 of layer
l; the pair of ranks 2p, 2p + 1 the product's 32 columns P of R_l and W_l; block c of the
pair the gate rows [2Hc, 2Hc + 2H)), the waits and counters too; the product is the forward
tensor-core kernel's (64 rows A = [R_l | W_l][K_c, P]^T resident in the storage type, 8 warps
= 2 batch halves x 4 k-groups, 4 x 4 m16 x n8 register tiles a lane) over dg_t staged as it
lies in dgx (the storage type, row-major [B, 4H]: no transposed scratch). Per step a block
stages 2H x B 16-bit values (128 KiB at H 512 B 64: what the forward stages, a quarter of the
fp32 one-block backward's 512 KiB); the weight and bias gradients stay GEMMs after the launch
(plan/backward_stack.py), reading dgx in the storage type as every typed backward's.

The math: dg is stored rounded to the storage type and the product reads those values, R and
W are rounded to it as loaded (the reference's rounding points: rnnrt.reference.backward);
the order of the sum over k is the kernel's: block c's k rows, k-group kg of 4 the columns
with (k % 64) // 16 == kg, its partial sums added (p0 + p2) + (p1 + p3), then the owning
block's half + the other's (the same value either way: addition commutes).

``stack_mma_bwd_fit(cell, hidden, batch, layers, input_size, props, dtype, steps)`` says
whether a shape runs (and why not); ``lstm_persistent_stack_mma_bwd`` is the registry's NumPy
twin. The kernel's constants are mirrored below; a test holds them equal.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..precision import get_precision, round_to_storage
from .budget import DeviceBudget, ceil_div
from .persistent import PK_MAX_THREADS
from .stack_bwd import SB_U, StackBwdFit, pair_decline, stack_bwd_schedule
from .stack import batch_groups_phrase, check_twin_groups
from .stack_mma import PSM_BMAX, PSM_KT, PSM_RP, PSM_SX, stack_mma_fit

# The kernel's compile-time constants (cuda_src/persistent_stack_mma_bwd.cu, SMB_*; the
# shared PSM_* of persistent_stack_mma.cuh: stack_mma.py's)
SMB_PU = 32            # units of a pair (the product's columns of R, of W)
SMB_M = 2 * SMB_PU     # product rows: R's 32 columns, then W's
SMB_NS = 5             # pipeline stages
SMB_KG = 4             # k-groups (warps 2kg, 2kg + 1: the two batch halves)
SMB_RECV = PSM_BMAX * SMB_PU   # the other block's sums a block receives: [64][32] floats
# registers a thread the fit assumes: __launch_bounds__(256, 1)'s most (nvcc 13.0 -arch=sm_90a
# --resource-usage: 193, no spills, bf16 and fp16; NVRTC's may differ, so the fit keeps the
# bound; a test holds nvcc's build to it)
SMB_REGS = 255

STACK_MMA_BWD_KERNEL = "lstm_persistent_stack_mma_bwd"


@dataclass(frozen=True)
class StackMmaBwdFit(StackBwdFit):
    """How a stack's backward runs as one tensor-core stack backward launch (cluster pairs):
    the stack backward's fit (its cut: U = 16 units a block, L x H/16 blocks), shared memory
    by this kernel's layout (``stack_mma_bwd_smem_bytes``); no dg^T scratch."""

    pair: bool = True
    label = "tensor-core stack backward (mma.sync m16n8k16, cluster pairs)"
    batch_groups = True   # whole batch groups, as the forward's (not a field)
    dg_scratch = False   # dg_t is staged from dgx (storage type), no k-major copy

    @property
    def kernel(self) -> str:
        return STACK_MMA_BWD_KERNEL


def stack_mma_bwd_smem_bytes(hidden: int, stages: int = SMB_NS) -> int:
    """Dynamic shared memory of one block (bytes): the pair's 64 product rows of [R | W]
    over the block's 2H k rows in the storage type (row stride 2H + 16 elements),
    ``stages`` stages of PSM_BMAX batch rows of PSM_SX elements (the partial sums reuse
    them), the other block's sums [64][32] (fp32)."""
    buf = max(2 * int(stages) * PSM_BMAX * PSM_SX, 4 * 2 * PSM_BMAX * PSM_RP)
    return 2 * SMB_M * (2 * int(hidden) + 16) + buf + 4 * SMB_RECV


def stack_mma_bwd_fit(cell: str, hidden: int, batch: int, layers: int, input_size: int,
                      props: dict, dtype="bfloat16", steps: int = 1) -> StackMmaBwdFit:
    """Fit a whole stack's backward onto the device ``props`` as one tensor-core stack
    backward launch at precision ``dtype``. Rules in order (the first that fails is the
    reason):
      1. the tensor-core stack forward's fit (stack_mma.stack_mma_fit: bfloat16 / float16,
         compute capability 8.0+, LSTM, 2+ layers, input size = hidden, hidden a multiple of
         64, batch <= 64, L x H/16 blocks <= SMs, the counters): the backward reads what that
         kernel saved and has its grid;
      2. the cluster pairs (stack_bwd.pair_decline with this kernel's shared memory and
         registers): compute capability 9.0+, H / 16 even, every pair resident at once
         ((SMs - PAIR_SM_SLACK) / 2 pairs), shared memory <= what a block can have;
      3. registers of 256 threads (SMB_REGS each) <= one SM's.
    There is no one-block form: where the pairs decline, the plan keeps the per-layer
    backward, saying why."""
    H, B, L = int(hidden), int(batch), int(layers)
    dev = DeviceBudget(props, SMB_REGS, PK_MAX_THREADS, threads=PK_MAX_THREADS)
    nb = ceil_div(H, SB_U)
    smem = stack_mma_bwd_smem_bytes(H)

    def no(reason):
        return StackMmaBwdFit(cell, H, B, L, False, reason, SB_U, nb, smem, dev.sms)

    fwd = stack_mma_fit(cell, H, B, L, input_size, props, dtype, steps=steps)
    if not fwd.ok:
        return no(f"the tensor-core stack kernel's fit: {fwd.reason}")
    name = get_precision(dtype).name   # the forward's fit took it
    where = (f"tensor-core stack backward {cell} hidden {H}, batch {B}, {L} layers, {name} "
             f"on {dev.sms} SMs")
    why = pair_decline(H, L, props, smem=smem, regs=SMB_REGS, groups=fwd.groups)
    if why is not None:
        return no(f"{where}: cluster pairs decline: {why}")
    if not dev.regs_ok(PK_MAX_THREADS):
        return no(f"{where}: {PK_MAX_THREADS} threads x {SMB_REGS} registers > "
                  f"{dev.regs_sm} a SM")
    g = fwd.groups
    return StackMmaBwdFit(cell, H, B, L, True,
                          f"fits: {g * L * nb} of {dev.sms} SMs ({batch_groups_phrase(g)}{L} "
                          f"layers x {nb} blocks, {g * L * nb // 2} cluster pairs), every layer's backward "
                          f"chain in one launch on tensor cores ({name})", SB_U, nb, smem,
                          dev.sms)


def k_group_rows(depth: int) -> list[list[np.ndarray]]:
    """The gate rows k of dg_t (depth 4H of them) that k-group kg of block c sums, [c][kg]:
    of the block's half [c * depth/2, (c + 1) * depth/2), each tile's PSM_KT rows, the 16 at
    16kg ((k % 64) // 16 == kg: 2H is a multiple of 64)."""
    half = int(depth) // 2
    out = []
    for c in range(2):
        rows = c * half + np.arange(half)
        out.append([rows[(rows % PSM_KT) // 16 == kg] for kg in range(SMB_KG)])
    return out


def mma_pair_product(dg, M, groups):
    """dg [B, 4H] @ M [4H, H] summed as the kernel sums it (``groups``: ``k_group_rows``):
    each block's four k-group partial sums (a matmul each here, where the tensor core has its
    own order inside a k16 step: the same math, not the same bits), added (p0 + p2) +
    (p1 + p3); then block 0's half + block 1's."""
    s = []
    for rows in groups:
        p = [dg[:, r] @ M[r] for r in rows]
        s.append((p[0] + p[2]) + (p[1] + p[3]))
    return s[0] + s[1]


def lstm_persistent_stack_mma_bwd(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                                  dtype="bfloat16"):
    """NumPy twin of the tensor-core stack backward (the registry's numpy_fn): rows = B,
    cols = H; outs dgx [L*T*B, 4H] (storage values), dhin [L*T*B, H] (layer L-1's rows read:
    dy; the others written), dx [T*B, H], dh0 [L*B, H], dc0 [L*B, H], sync [groups, 2L]
    (``groups``: 1, or B / 64 whole batch groups: the same math); ins dh_n
    [L*B, H], dc_n [L*B, H], act [L*T*B, 4H], c [L*(T+1)*B, H], w_ih [L, 4*H*H], w_hh
    [L, 4*H*H]. The stack backward's schedule (stack_bwd.stack_bwd_schedule) with dg_t, W and
    R rounded to the storage type, the sums in the kernel's order (``mma_pair_product``), in
    the arrays' dtype."""
    p = get_precision(dtype)
    if not p.rounds or p.gemm != "fp32":
        raise ValueError(f"{STACK_MMA_BWD_KERNEL}: bfloat16 / float16 only, got dtype "
                         f"{dtype!r}")
    check_twin_groups(STACK_MMA_BWD_KERNEL, rows, groups, whole=True)
    kg = k_group_rows(4 * int(cols))
    stack_bwd_schedule(STACK_MMA_BWD_KERNEL, lambda dg, M: mma_pair_product(dg, M, kg),
                       rows, cols, outs, ins, T, L, units_per_block,
                       store=lambda a: round_to_storage(a, p.name))
