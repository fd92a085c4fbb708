"""The tensor-core stack kernel (cuda_src/persistent_stack_mma.cu,
``lstm_persistent_stack_mma_fwd``): every layer of an LSTM stack in ONE persistent launch along
the wavefront, as the stack kernel (stack.py), with the product on tensor cores (mma.sync
m16n8k16, bf16 / fp16 operands, fp32 accumulation).

Why a second stack kernel: in 16-bit storage the operands are half the bytes, so a block's 64
gate rows of BOTH W_l and R_l fit in shared memory (64 x 2H x 2 bytes: 128 KiB at H 512),
and a step streams only its inputs, [B, H] each in the storage type as they lie in the h
output (the layer below's h_{t+1}, or x_t; and its own h_t): no transposed copies, no
scratch, a quarter of the fp32 stack kernel's bytes a step, and the product on the tensor
cores. Same cut as the stack kernel (block (l, rank): 16 units x 4 gates of layer l, L
groups of H/16 blocks all resident, per-layer progress counters), the same waits.

The math: W and R rounded to the storage type as the kernel loads them (the rungs' copies'
values), x and every h stored rounded, so every product is exact in fp32 and the tensor core
accumulates in fp32: the rungs' math up to summation order. The order: warp w is k-group
kg = w >> 1 of 4, which sums the columns 64n + 16kg .. 64n + 16kg + 15 of the 2H columns of
[W | R] (every n: tiles of the input half, then of the h half), the four partial sums
added (p0 + p2) + (p1 + p3), then (sum + b_ih) + b_hh and the fused kernel's cell.

``stack_mma_fit(cell, hidden, batch, layers, input_size, props, dtype, steps)`` says whether
a shape runs (and why not): the stack kernel's rules (``stack.stack_rules``) plus the
precision; ``lstm_persistent_stack_mma_fwd`` is the registry's NumPy twin. The kernel's
constants are mirrored below; a test holds them equal.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..precision import get_precision, round_to_storage
from .budget import DeviceBudget
from .mma import mma_declines
from .persistent import PK_MAX_THREADS
from .stack import StackFit, check_twin_groups, stack_rules
from .twins import lstm_fwd

# The kernel's compile-time constants (cuda_src/persistent_stack_mma.cu, PSM_*).
PSM_M = 64            # rows of a block: G * U
PSM_BMAX = 64         # most batches
PSM_KT = 64           # columns of a staged tile (one k16 step each of 4 k-groups)
PSM_NS = 6            # pipeline stages
PSM_SX = 80           # row stride (16-bit elements) of a staged tile's batch rows
PSM_RP = 68           # row stride (floats) of a batch's partial sums (they reuse the stages)
PSM_KG = 4            # k-groups (warps 2kg, 2kg + 1: the two batch halves)
# registers a thread the fit assumes: __launch_bounds__(256, 1)'s most (nvcc 13.0 -arch=sm_90
# -Xptxas -v: 184, no spills, bf16 and fp16; NVRTC's may differ, so the fit keeps the bound)
PSM_REGS = 255

STACK_MMA_KERNEL = "lstm_persistent_stack_mma_fwd"


@dataclass(frozen=True)
class StackMmaFit(StackFit):
    """How a stack runs as one tensor-core stack launch: the stack kernel's fit (its cut:
    U = 16 units a block, L x H/16 blocks), shared memory by this kernel's layout
    (``stack_mma_smem_bytes``)."""

    label = "tensor-core stack (mma.sync m16n8k16)"
    storage_io = True   # x and h in the storage type
    whole_groups = True   # batch groups of PSM_BMAX, whole ones (not a field)

    @property
    def kernel(self) -> str:
        return STACK_MMA_KERNEL


def stack_mma_smem_bytes(hidden: int) -> int:
    """Dynamic shared memory of one block (bytes): the block's 64 rows of [W | R] in the
    storage type (row stride 2H + 16 elements), PSM_NS stages of PSM_BMAX batch rows of
    PSM_SX elements (the partial sums reuse them), the two bias rows (fp32)."""
    stages = max(2 * PSM_NS * PSM_BMAX * PSM_SX, 4 * 2 * PSM_BMAX * PSM_RP)   # PSM_BUF_BYTES
    return 2 * PSM_M * (2 * int(hidden) + 16) + stages + 4 * 2 * PSM_M


def stack_mma_fit(cell: str, hidden: int, batch: int, layers: int, input_size: int,
                  props: dict, dtype="bfloat16", steps: int = 1) -> StackMmaFit:
    """Fit a whole stack onto the device ``props`` as one tensor-core stack launch at
    precision ``dtype``. Rules in order: dtype bfloat16 or float16 (mma.MMA_DTYPES_REASON),
    compute capability >= 8.0 (mma.sync with bf16 operands), then ``stack.stack_rules`` with
    this kernel's registers and shared memory (its W | R rows resident: H <= 640 on an
    H100)."""
    H = int(hidden)
    fit = stack_rules(StackMmaFit, PSM_REGS, stack_mma_smem_bytes(H), 2 * PSM_M * 2 * H,
                      "W | R rows", cell, H, batch, layers, input_size, props, steps,
                      where="tensor-core stack")
    storage = mma_declines(dtype)
    if storage is not None:
        return replace(fit, ok=False, reason=f"tensor-core stack: {get_precision(dtype).name}: "
                                             f"{storage}")
    cc = DeviceBudget(props, PSM_REGS, PK_MAX_THREADS, threads=PK_MAX_THREADS).cc_major
    if cc < 8:
        return replace(fit, ok=False, reason=f"tensor-core stack: mma.sync with bf16 operands "
                                             f"needs compute capability 8.0 or later "
                                             f"(device: {cc}.x)")
    return fit


def k_group_columns(hidden: int) -> list[np.ndarray]:
    """The columns of [W | R] (2H of them) that k-group kg sums, for kg = 0..PSM_KG-1: of
    each tile of PSM_KT columns, the 16 at 16kg."""
    cols = np.arange(2 * int(hidden))
    return [cols[(cols % PSM_KT) // 16 == kg] for kg in range(PSM_KG)]


def lstm_persistent_stack_mma_fwd(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                                  dtype="bfloat16"):
    """NumPy twin of the tensor-core stack kernel (the registry's numpy_fn): rows = B,
    cols = H; outs h [L*(T+1)*B, H] (storage values), c [L*(T+1)*B, H], act [L*T*B, 4H], sync
    [groups, 2L]; ins x [T*B, H] (storage values), w_ih [L, 4*H*H], w_hh [L, 4*H*H], bw [L, 4H]
    (or one broadcast row), br. Slot 0 of each layer's h and c is read, slots 1..T written.
    Each step sums as the kernel sums (``k_group_columns``: four partial sums in the arrays'
    dtype, added (p0 + p2) + (p1 + p3)), then the fused kernel's twin (twins.lstm_fwd, whose
    ((gx + b_ih) + gh) + b_hh with gh = 0 is the kernel's (sum + b_ih) + b_hh), h rounded to
    the storage type as the kernel stores it. The tensor core's order within a k16 step is
    its own: the same math, not the same bits (checked against the reference)."""
    p = get_precision(dtype)
    if not p.rounds or p.gemm != "fp32":
        raise ValueError(f"{STACK_MMA_KERNEL}: bfloat16 / float16 only, got dtype {dtype!r}")
    B, H = int(rows), int(cols)
    h, c, act, sync = outs
    x, w_ih, w_hh, bw, br = ins
    if np.any(np.asarray(sync) != 0):
        raise ValueError(f"{STACK_MMA_KERNEL}: the sync counters must be zero on entry, got "
                         f"{np.asarray(sync).ravel().tolist()}")
    if int(units_per_block) * 4 != PSM_M:
        raise ValueError(f"{STACK_MMA_KERNEL}: units_per_block {units_per_block} != "
                         f"{PSM_M // 4}")
    check_twin_groups(STACK_MMA_KERNEL, B, groups, whole=True)
    S1 = (T + 1) * B
    bw = np.broadcast_to(bw, (L, 4 * H))
    br = np.broadcast_to(br, (L, 4 * H))
    groups = k_group_columns(H)
    inp = np.asarray(x).reshape(T, B, H)
    for layer in range(L):
        W = np.asarray(w_ih[layer]).reshape(4 * H, H)
        R = np.asarray(w_hh[layer]).reshape(4 * H, H)
        A = round_to_storage(np.concatenate([W, R], axis=1), dtype)   # [4H, 2H]
        hs = h[layer * S1:(layer + 1) * S1].reshape(T + 1, B, H)
        cs = c[layer * S1:(layer + 1) * S1].reshape(T + 1, B, H)
        acts = act[layer * T * B:(layer + 1) * T * B].reshape(T, B, 4 * H)
        zero = np.zeros((B, 4 * H), A.dtype)
        for t in range(T):
            X = np.concatenate([inp[t], hs[t]], axis=1)                 # [B, 2H]
            part = [X[:, g] @ A[:, g].T for g in groups]                # [B, 4H] each
            gates = (part[0] + part[2]) + (part[1] + part[3])
            lstm_fwd(B, H, (hs[t + 1], cs[t + 1], acts[t]),
                     (gates, zero, bw[layer:layer + 1], br[layer:layer + 1], cs[t]))
            hs[t + 1] = round_to_storage(hs[t + 1], dtype)   # the kernel's store rounds
        inp = hs[1:]
