"""The stack backward (cuda_src/persistent_stack_bwd.cu, ``lstm_persistent_stack_bwd``): the
recurrent chain of every layer of an LSTM stack's backward in ONE persistent launch, along the
reverse wavefront, with dx = dg.W inside the kernel: the stack kernel's (stack.py) backward
twin.

Why: after the stack forward (3.1 ms at the paper's shape) the per-step backward is ~7 ms of
per-step cuBLAS GEMMs and pointwise kernels, and the per-layer persistent backward kernels
either do not hold R^T at H 512 (cluster) or run the layers one after another (grid). Here,
as in the forward, the SMs are cut into L groups of NB = H / U blocks, all resident at once.
Block (l, rank) owns units J = [rank*U, rank*U + U) of layer l (U = 16) and each step t
(T-1 .. 0) runs the pointwise backward of its cells, then multiplies dg_t (every gate row,
every batch; all ranks' pointwise of the layer) by [R_l[:, J] | W_l[:, J]]: R's half is
the gradient into h_t at its own units (the next step's dh_rec: it never leaves the block),
W's half the gradient into the layer below's h_{t+1} at the same units (what block
(l-1, rank) adds as dh_above at its step t), or dx for layer 0. Layer l's step t waits for
layer l+1's product of step t and for its own layer's dg_t; the top layer waits only on
itself, so the stack cannot deadlock once every block is resident (induction from the top).
The weight and bias gradients stay GEMMs after the launch (plan/backward_stack.py).

Two kernels a cell (LSTM; GRU, ``gru_``, with K = 4H product rows dr, dz, dn, dhn):
``lstm_persistent_stack_bwd`` (a block multiplies all 4H gate rows by its 16 units' columns)
and ``lstm_persistent_stack_bwd_pair`` (cuda_src/persistent_stack_bwd_pair.cu: the two blocks
of a thread-block cluster split the gate rows, so a block stages half of dg_t, and exchange
their half sums through distributed shared memory), the same arguments.

``stack_bwd_fit(cell, hidden, batch, layers, input_size, props, steps, pairs=True)`` says
whether a shape runs (and why not): where the forward stack kernel's fit holds (the backward
runs only after it, on the forward's saved act and c) and its own shared memory fits; the
pair kernel where ``pair_decline`` finds nothing against it, else the one-block kernel; the
functions of the kernels' names are the registry's NumPy twins. The kernel's constants are
mirrored below; a test holds them equal.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import twins as knp
from .budget import DeviceBudget, ceil_div
from .persistent import PK_MAX_THREADS
from .stack import StackFit, batch_groups_phrase, check_twin_groups, stack_fit

# The kernel's compile-time constants (cuda_src/persistent_stack_bwd.cu, SB_*).
SB_U = 16             # units of a block
SB_M = 2 * SB_U       # product rows: R's U columns, then W's
SB_BMAX = 64          # most batches (the width of a dgt row)
SB_KT = 64            # k rows of a staged tile
SB_NS = 3             # pipeline stages
SB_KG = PK_MAX_THREADS // 32   # k-groups: one a warp
SB_KPW = SB_KT // SB_KG        # k rows of a tile a k-group takes (half each a half-warp)
SB_WOFF = 4                    # a stage: padding, W's part [SB_KT][SB_U], dg^T's


def stage_floats(k_tile: int = SB_KT) -> int:
    """Floats of one stage (the kernel's SB_STAGE): padding, W's part [k_tile][SB_U], dg^T's
    [k_tile][64], up to a multiple of 16."""
    return -(-(SB_WOFF + int(k_tile) * (SB_U + SB_BMAX)) // 16) * 16


SB_STAGE = stage_floats()

# The cluster-pair kernel's (cuda_src/persistent_stack_bwd_pair.cu, SP_*): block c of a pair
# multiplies k rows [2Hc, 2Hc + 2H) by the pair's 32 columns of R and of W.
SP_PU = 32            # units of a pair (the product's columns of R, of W)
SP_KT = 64            # k rows of a staged tile
SP_NS = 3             # pipeline stages
SP_KPW = SP_KT // SB_KG        # k rows of a tile a warp takes (whole rows: no half-warps)
SP_STAGE = SP_KT * SP_PU + SP_KT * SB_BMAX   # a stage: W's part [KT][32], dg^T's [KT][64]
SP_RECV = SB_BMAX * SP_PU      # the other block's sums a block receives: [64][32]
# SMs left out of the pairs' budget: a cluster lives on one GPC, and a GPC with an odd number
# of SMs strands one of them (the device properties do not give the GPCs); the driver's
# count for the H100 and H200 (132 SMs: 66 pairs) is checked by tests/gpu/test_gpu_stack_bwd.py
PAIR_SM_SLACK = 4
# registers a thread at most (nvcc 13.0 -arch=sm_90 and NVRTC 13.5 + ptxas 13.0: 254; the
# launch bounds' limit: a test holds ptxas's build to it, no spills)
SB_REGS = 255

STACK_BWD_KERNEL = "lstm_persistent_stack_bwd"
STACK_BWD_PAIR_KERNEL = "lstm_persistent_stack_bwd_pair"
STACK_BWD_GRU_KERNEL = "gru_persistent_stack_bwd"
"""GRU's one-block kernel: K = 4H product rows dr, dz, dn, dhn."""
STACK_BWD_GRU_PAIR_KERNEL = "gru_persistent_stack_bwd_pair"
"""... and its cluster-pair form (block 0 of a pair dr, dz; block 1 dn, dhn)."""


@dataclass(frozen=True)
class StackBwdFit(StackFit):
    """How a stack of ``layers`` layers (hidden H, batch B) runs its backward as one launch:
    the stack kernel's fit's fields (stack.StackFit: the same grid, U, blocks, threads), its
    own kernel and shared memory: R's U columns k-major (4H x U floats) + SB_NS stages of
    SB_KT k rows of W's U columns and of dg^T's 64 batches (the dg^T tile and the partial
    sums reuse them)."""

    pair: bool = False   # the cluster-pair kernel (else one block a 16 units' product)

    label = "stack backward"
    # the fp32 kernels run batch groups (whole ones: B = 64 * groups; not a field)
    batch_groups = True
    # whether the kernel copies dg_t into a k-major scratch (the dgt argument: the fp32
    # kernels; the tensor-core one, stack_mma_bwd.py, stages dgx's rows) (not a field)
    dg_scratch = True

    @property
    def kernel(self) -> str:
        if self.cell == "gru":
            return STACK_BWD_GRU_PAIR_KERNEL if self.pair else STACK_BWD_GRU_KERNEL
        return STACK_BWD_PAIR_KERNEL if self.pair else STACK_BWD_KERNEL



def stack_bwd_smem_bytes(hidden: int, k_tile: int = SB_KT, stages: int = SB_NS) -> int:
    """Dynamic shared memory of one block (bytes): R's U columns k-major + pipeline stages
    (W's U columns and dg^T's 64 batches of SB_KT k rows, padded: SB_STAGE floats; k_tile
    and stages: a build with other SB_KT, SB_NS, as stack_bwd_bench.py --define makes)."""
    return 4 * (4 * int(hidden) * SB_U + int(stages) * stage_floats(k_tile))


def stack_bwd_pair_smem_bytes(hidden: int, stages: int = SP_NS, bulk: bool = False) -> int:
    """Dynamic shared memory of one block of the cluster-pair kernel (bytes): R's k rows of
    the block's half (2H) by the pair's 32 columns + ``stages`` stages (W's 32 columns and
    dg^T's 64 batches of SP_KT k rows) + the other block's sums [64][32]; ``bulk``: a build
    with SP_BULK 1 (the bulk copies' 8-byte barriers, one a stage and warp)."""
    bars = 2 * int(stages) * SB_KG if bulk else 0
    return 4 * (2 * int(hidden) * SP_PU + int(stages) * SP_STAGE + SP_RECV + bars)


def pair_decline(hidden: int, layers: int, props: dict, smem: int | None = None,
                 regs: int = SB_REGS, groups: int = 1) -> str | None:
    """Why a cluster-pair stack backward kernel does not run a stack of ``layers`` layers of
    ``hidden`` units on the device of ``props`` (None: it does): thread-block clusters
    (compute capability 9.0+), whole pairs a layer (H / 16 even), every pair resident at once
    (pairs <= (SMs - PAIR_SM_SLACK) / 2), its shared memory (``smem`` bytes a block: the fp32
    pair kernel's by default; ``regs``: its registers a thread, for the budget)."""
    H, L = int(hidden), int(layers)
    dev = DeviceBudget(props, regs, PK_MAX_THREADS, threads=PK_MAX_THREADS)
    nb = ceil_div(H, SB_U)
    if int(props.get("major", 0)) < 9:
        return (f"compute capability {props.get('major')}.{props.get('minor', 0)} has no "
                f"thread-block clusters (they need 9.0+)")
    if nb % 2:
        return f"{nb} blocks a layer are not whole pairs (hidden / 16 odd)"
    cap = (dev.sms - PAIR_SM_SLACK) // 2
    pairs = int(groups) * L * nb // 2
    if pairs > cap:
        lots = f" ({groups} batch groups)" if groups > 1 else ""
        return (f"{pairs} pairs{lots} > {cap} resident at once ((SMs - {PAIR_SM_SLACK}) / 2: "
                f"a pair lives on one GPC)")
    smem = stack_bwd_pair_smem_bytes(H) if smem is None else int(smem)
    if smem > dev.limit:
        return f"{smem} bytes of shared memory > {dev.limit} a block can have"
    return None


def stack_bwd_fit(cell: str, hidden: int, batch: int, layers: int, input_size: int,
                  props: dict, steps: int = 1, pairs: bool = True) -> StackBwdFit:
    """Fit a whole stack's backward onto the device described by ``props`` (as
    stack.stack_fit). Rules in order (the first that fails is the reason):
      1. cell 'lstm' or 'gru', then the forward stack
         kernel's fit (stack_fit: 2 or more layers, input size = hidden, hidden a multiple of
         64, groups x L x H/16 blocks <= SMs, its shared memory and registers, the
         counters): the backward reads what that kernel saved, as it saved it, and has its
         grid; past SB_BMAX batches, whole batch groups (B a multiple of SB_BMAX: the
         kernel's cells of a group are all live);
      2. its own shared memory <= what a block can have;
      3. registers of 256 threads (SB_REGS each) <= one SM's;
    then the cluster-pair kernel where ``pairs`` and it runs, every group's pairs resident
    (``pair_decline``: on the H100 it stages half of dg_t a block a step), else the one-block
    kernel, saying why.
    """
    H, B, L = int(hidden), int(batch), int(layers)
    dev = DeviceBudget(props, SB_REGS, PK_MAX_THREADS, threads=PK_MAX_THREADS)
    U = SB_U
    nb = ceil_div(H, U)
    smem = stack_bwd_smem_bytes(H)
    fwd = stack_fit(cell, H, B, L, input_size, props, steps=steps)

    groups = fwd.groups

    def no(reason):
        return StackBwdFit(cell, H, B, L, False, reason, U, nb, smem, dev.sms)

    where = f"stack backward {cell} hidden {H}, batch {B}, {L} layers on {dev.sms} SMs"
    if cell not in ("lstm", "gru"):
        return no(f"{where}: the stack backward is built for LSTM and GRU only")
    if not fwd.ok:
        return no(f"the stack kernel's fit: {fwd.reason}")
    if groups > 1 and B % SB_BMAX:
        return no(f"{where}: batch over {SB_BMAX} and not a multiple of it (the backward's "
                  f"batch groups are whole groups of {SB_BMAX})")
    if smem > dev.limit:
        return no(f"{where}: {smem} bytes of shared memory (R slice {4 * 4 * H * U} + "
                  f"stages) > {dev.limit} a block can have")
    if not dev.regs_ok(PK_MAX_THREADS):
        return no(f"{where}: {PK_MAX_THREADS} threads x {SB_REGS} registers > {dev.regs_sm} "
                  f"a SM")
    head = (f"fits: {groups * L * nb} of {dev.sms} SMs ({batch_groups_phrase(groups)}{L} "
            f"layers x {nb} blocks), every layer's backward chain in one launch")
    why = pair_decline(H, L, props, groups=groups) if pairs else "not asked for"
    if why is None:
        return StackBwdFit(cell, H, B, L, True, f"{head}, in cluster pairs (a block half the "
                           f"gate rows)", U, nb, stack_bwd_pair_smem_bytes(H), dev.sms,
                           pair=True)
    return StackBwdFit(cell, H, B, L, True, f"{head}; cluster pairs decline: {why}", U, nb,
                       smem, dev.sms)


def k_groups(depth: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The gate rows k of dg_t each k-group (warp) multiplies, as its two half-warps take
    them, each in its order: tile by tile (SB_KT rows), of the warp's SB_KPW rows of each
    the even ones (half 0) and the odd ones (half 1)."""
    def rows(w, half):
        return np.array([n + w * SB_KPW + kk for n in range(0, depth, SB_KT)
                         for kk in range(half, SB_KPW, 2)], np.int64)
    return [(rows(w, 0), rows(w, 1)) for w in range(SB_KG)]


def product(dg, M, groups):
    """dg [B, K] @ M [K, N] summed as the kernel sums it: each half-warp's partial (``groups``,
    ``k_groups``), added in the kernel's four passes into four sums (q_m = a(m, 0) + (a(m, 1)
    + (a(m+4, 0) + a(m+4, 1))), a(w, h): warp w's half h), then those four in order. Within a
    half-warp a matmul, where the kernel chains FMAs over its rows in order: close to the
    kernel's sums, not bitwise."""
    a = [(dg[:, r0] @ M[r0], dg[:, r1] @ M[r1]) for r0, r1 in groups]
    half = SB_KG // 2
    q = [a[m][0] + (a[m][1] + (a[m + half][0] + a[m + half][1])) for m in range(half)]
    acc = q[0]
    for v in q[1:]:
        acc = acc + v
    return acc


def pair_product(dg, M):
    """dg [B, 4H] @ M [4H, H] summed as the cluster-pair kernel sums it: block c of a pair
    over k rows [2Hc, 2Hc + 2H); for B > 32 each warp w over rows 8w .. 8w+7 of every SP_KT
    tile (a matmul here, where the kernel chains FMAs: close, not bitwise), warps 0..3 adding
    warps 4..7's (q_m = a(m) + a(m+4)); for B <= 32 each half-warp (w, h) over rows 8w + h,
    + 2, .. of every tile, q_m = a(m, 0) + (a(m, 1) + (a(m+4, 0) + a(m+4, 1))) (the kernel's
    four passes); the four q in order; then block 0's half + block 1's (the owning block adds
    the other's to its own: the same value, addition commutes)."""
    K = dg.shape[1]
    half = K // 2
    wide = dg.shape[0] > SB_BMAX // 2
    s = []
    for c in range(2):
        def rows(w, h, step):
            return np.array([c * half + n + w * SP_KPW + kk for n in range(0, half, SP_KT)
                             for kk in range(h, SP_KPW, step)], np.int64)
        if wide:
            a = [dg[:, r] @ M[r] for r in (rows(w, 0, 1) for w in range(SB_KG))]
            q = [a[m] + a[m + SB_KG // 2] for m in range(SB_KG // 2)]
        else:
            a = [(dg[:, rows(w, 0, 2)] @ M[rows(w, 0, 2)], dg[:, rows(w, 1, 2)] @ M[rows(w, 1, 2)])
                 for w in range(SB_KG)]
            g = SB_KG // 2
            q = [a[m][0] + (a[m][1] + (a[m + g][0] + a[m + g][1])) for m in range(g)]
        acc = q[0]
        for v in q[1:]:
            acc = acc + v
        s.append(acc)
    return s[0] + s[1]


def _check_twin_call(name, sync, units_per_block, dtype="float32"):
    """A stack backward twin's refusals: fp32 only (kernels/choice_backward.py declines the
    rest), the counters zero on entry, U = SB_U."""
    if dtype != "float32":
        raise ValueError(f"{name}: fp32 only, got dtype {dtype!r}")
    if np.any(np.asarray(sync) != 0):
        raise ValueError(f"{name}: the sync counters must be zero on entry, got "
                         f"{np.asarray(sync).ravel().tolist()}")
    if int(units_per_block) != SB_U:
        raise ValueError(f"{name}: units_per_block {units_per_block} != {SB_U}")


def _k_major_slots(dgt, groups, rows, cols, L):
    """publish(layer, t, dg) of the fp32 stack backward kernels: dg_t^T of each batch group
    (64 batches) into its block of the scratch dgt [groups*8*L*H, 64], slot t & 1 of the
    layer."""
    check_twin_groups("stack backward", rows, groups, whole=True)
    groups = int(groups)
    dgts = dgt.reshape(groups, int(L), 2, 4 * int(cols), dgt.shape[-1])

    def publish(n, t, dg):
        for g in range(groups):
            part = dg[g * SB_BMAX:(g + 1) * SB_BMAX]
            dgts[g, n, t & 1, :, :part.shape[0]] = part.T
    return publish


def _stack_bwd_twin(name, prod, rows, cols, outs, ins, T, L, units_per_block, dtype,
                    groups=1):
    """The fp32 stack backward kernels' schedule in NumPy, ``prod(dg, M)`` their sum over k."""
    if dtype != "float32":   # kernels/choice_backward.py declines it
        raise ValueError(f"{name}: fp32 only, got dtype {dtype!r}")
    dgx, dhin, dx, dh0, dc0, sync, dgt = outs
    publish = _k_major_slots(dgt, groups, rows, cols, L)
    stack_bwd_schedule(name, prod, rows, cols, (dgx, dhin, dx, dh0, dc0, sync), ins, T, L,
                       units_per_block, publish=publish)


def stack_bwd_schedule(name, prod, rows, cols, outs, ins, T, L, units_per_block,
                       store=None, publish=None):
    """The stack backward kernels' schedule in NumPy (every stack backward's twin runs it):
    steps T-1 .. 0, each layer from the top (the reverse wavefront), lstm_bwd's arithmetic on
    dh_above + dh_rec, dg_t as stored (``store(dg)``: the storage type's rounding, or none),
    then ``prod(dg, R)`` and ``prod(dg, W)``, the kernel's sums over k (W and R as the kernel
    reads them: ``store`` applied once). outs (dgx [L*T*B, 4H], dhin [L*T*B, H], dx [T*B, H],
    dh0 [L*B, H], dc0 [L*B, H], sync [1, 2L]), ins (dh_n, dc_n [L*B, H], act [L*T*B, 4H], c
    [L*(T+1)*B, H], w_ih, w_hh [L, 4*H*H]). ``publish(layer, t, dg)``: where the kernel also
    copies dg_t (the fp32 kernels' k-major scratch)."""
    B, H = int(rows), int(cols)
    dgx, dhin, dx, dh0, dc0, sync = outs
    dh_n, dc_n, act, c, w_ih, w_hh = ins
    _check_twin_call(name, sync, units_per_block)
    store = store or (lambda a: a)
    K = 4 * H
    Ws = [store(np.asarray(w_ih[n]).reshape(K, H)) for n in range(L)]
    Rs = [store(np.asarray(w_hh[n]).reshape(K, H)) for n in range(L)]
    dgxs = dgx.reshape(L, T, B, K)
    dhins = dhin.reshape(L, T, B, H)
    acts = np.asarray(act).reshape(L, T, B, K)
    cs = np.asarray(c).reshape(L, T + 1, B, H)
    dhrec = [np.array(dh_n[n * B:(n + 1) * B]) for n in range(L)]
    dc = [np.array(dc_n[n * B:(n + 1) * B]) for n in range(L)]
    for t in reversed(range(T)):
        for n in reversed(range(L)):
            dc_prev = np.empty_like(dc[n])
            knp.lstm_bwd(B, H, (dgxs[n, t], dc_prev),
                         (dhins[n, t], dhrec[n], dc[n], acts[n, t], cs[n, t + 1], cs[n, t]))
            dc[n] = dc_prev
            dgxs[n, t] = store(dgxs[n, t])
            dg = dgxs[n, t]
            if publish is not None:
                publish(n, t, dg)
            dhrec[n] = prod(dg, Rs[n])
            down = dhins[n - 1, t] if n else dx.reshape(T, B, H)[t]
            down[...] = prod(dg, Ws[n])
    for n in range(L):
        dh0[n * B:(n + 1) * B] = dhrec[n]
        dc0[n * B:(n + 1) * B] = dc[n]


_TWIN_DOC = """ of the stack backward (the registry's numpy_fn): rows = B, cols = H; outs
    dgx [L*T*B, 4H], dhin [L*T*B, H] (layer L-1's rows read: dy; the others written), dx
    [T*B, H], dh0 [L*B, H], dc0 [L*B, H], sync [groups, 2L], dgt [groups*8*L*H, 64] (scratch:
    left as the kernel leaves it, slot l*2 + (t & 1) of batch group g holding dg_t^T of steps
    1 and 0 in its first columns; ``groups``: 1, or B / 64 whole batch groups); ins dh_n [L*B, H], dc_n [L*B, H], act [L*T*B, 4H], c [L*(T+1)*B, H], w_ih
    [L, 4*H*H], w_hh [L, 4*H*H]. The kernel's schedule: steps T-1 .. 0, each layer from the
    top (the reverse wavefront), lstm_bwd's arithmetic on dh_above + dh_rec, then dg_t R and
    dg_t W summed over k in the kernel's order, in the arrays' dtype."""


def lstm_persistent_stack_bwd(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                              dtype="float32"):
    kg = k_groups(4 * int(cols))
    _stack_bwd_twin(STACK_BWD_KERNEL, lambda dg, M: product(dg, M, kg), rows, cols, outs,
                    ins, T, L, units_per_block, dtype, groups)


def lstm_persistent_stack_bwd_pair(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                                   dtype="float32"):
    _stack_bwd_twin(STACK_BWD_PAIR_KERNEL, pair_product, rows, cols, outs, ins, T, L,
                    units_per_block, dtype, groups)


lstm_persistent_stack_bwd.__doc__ = "NumPy twin (one block a 16 units' product)" + _TWIN_DOC
lstm_persistent_stack_bwd_pair.__doc__ = "NumPy twin (the cluster-pair kernel)" + _TWIN_DOC


def gru_persistent_stack_bwd(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                             dtype="float32"):
    kg = k_groups(4 * int(cols))
    _gru_stack_bwd_twin(STACK_BWD_GRU_KERNEL, lambda dg, M: product(dg, M, kg), rows, cols,
                        outs, ins, T, L, units_per_block, dtype, groups)


def gru_persistent_stack_bwd_pair(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                                  dtype="float32"):
    _gru_stack_bwd_twin(STACK_BWD_GRU_PAIR_KERNEL, pair_product, rows, cols, outs, ins, T, L,
                        units_per_block, dtype, groups)


_GRU_TWIN_DOC = """ of the GRU stack backward (the registry's numpy_fn): rows = B, cols = H;
    outs dgx, dgh [L*T*B, 3H] (r, z, n: the W side's and the R side's gate gradients), dhin
    [L*T*B, H] (layer L-1's rows read: dy), dx [T*B, H], dh0 [L*B, H], sync [groups, 2L], dgt
    [groups*8*L*H, 64] (scratch: slot l*2 + (t & 1) of 4H rows dr, dz, dn, dhn, a block each
    batch group); ins dh_n [L*B, H],
    act [L*T*B, 4H] (r, z, n, hn), h [L*(T+1)*B, H] (the forward's: slot t = h_{t-1} of step
    t), w_ih, w_hh [L, 3*H*H]. The kernel's schedule: steps T-1 .. 0, each layer from the top,
    gru_bwd's arithmetic on dh_above + dh_rec, then dh_rec = [dr dz dn dhn] [R_r; R_z; 0; R_n]
    (summed over k in the kernel's order) + dh z, and the input's gradient [dr dz dn dhn]
    [W_r; W_z; W_n; 0], in the arrays' dtype."""
gru_persistent_stack_bwd.__doc__ = "NumPy twin (one block a 16 units' product)" + _GRU_TWIN_DOC
gru_persistent_stack_bwd_pair.__doc__ = "NumPy twin (the cluster-pair kernel)" + _GRU_TWIN_DOC


def _gru_stack_bwd_twin(name, prod, rows, cols, outs, ins, T, L, units_per_block, dtype,
                        groups=1):
    """The GRU stack backward kernels' schedule in NumPy, ``prod(dg, M)`` their sum over k."""
    B, H = int(rows), int(cols)
    dgx, dgh, dhin, dx, dh0, sync, dgt = outs
    dh_n, act, h, w_ih, w_hh = ins
    _check_twin_call(name, sync, units_per_block, dtype)
    K = 4 * H
    zero = np.zeros((H, H), np.asarray(w_hh).dtype)
    Ms = []
    for n in range(L):
        W = np.asarray(w_ih[n]).reshape(3 * H, H)
        R = np.asarray(w_hh[n]).reshape(3 * H, H)
        Ms.append((np.concatenate([R[:2 * H], zero, R[2 * H:]]),
                   np.concatenate([W, zero])))
    dgxs, dghs = dgx.reshape(L, T, B, 3 * H), dgh.reshape(L, T, B, 3 * H)
    dhins = dhin.reshape(L, T, B, H)
    acts = np.asarray(act).reshape(L, T, B, K)
    hs = np.asarray(h).reshape(L, T + 1, B, H)
    publish = _k_major_slots(dgt, groups, rows, cols, L)
    dhrec = [np.array(dh_n[n * B:(n + 1) * B]) for n in range(L)]
    for t in reversed(range(T)):
        for n in reversed(range(L)):
            dhz = np.empty_like(dhrec[n])
            knp.gru_bwd(B, H, (dgxs[n, t], dghs[n, t], dhz),
                        (dhins[n, t], dhrec[n], acts[n, t], hs[n, t]))
            dg = np.concatenate([dgxs[n, t], dghs[n, t][:, 2 * H:]], axis=1)   # dr dz dn dhn
            publish(n, t, dg)
            R4, W4 = Ms[n]
            dhrec[n] = prod(dg, R4) + dhz
            down = dhins[n - 1, t] if n else dx.reshape(T, B, H)[t]
            down[...] = prod(dg, W4)
    for n in range(L):
        dh0[n * B:(n + 1) * B] = dhrec[n]
