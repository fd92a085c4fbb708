"""A NumPy emulation of the per-layer persistent kernels' decomposition (persistent.py's fit),
and the registry's NumPy twins of those kernels.

``emulate`` runs a layer block by block and step by step exactly as the kernel cuts it: each
block reads only h_t and its own rows of R, sums its k-groups' partial products in the
kernel's order, and each (b, j) is written by the one thread that owns it; the end of a step
is the barrier, where every element of h_{t+1} must have been written exactly once. So the
partition and the indexing are tested without a GPU.
"""
from __future__ import annotations

import numpy as np

from ..cells import get_cell
from ..precision import gemm_operand, round_to_storage
from .budget import ceil_div
from .persistent import CLUSTER_BATCH, Fit, geometry, kernel_name
from .twins import relu, sigmoid


# --- the decomposition, as the kernel indexes it --------------------------------------------

def thread_roles(fit: Fit) -> dict[str, np.ndarray]:
    """Per thread of a block (index tid): its warp, lane, and the lane's row group lr,
    batch group lb, k-group lk within the warp and k-group kg = warp * LK + lk in the
    block. As the kernel: lr = lane % LR, lb = (lane / LR) % LB, lk = lane / (LR * LB)."""
    lr_n, lb_n, lk_n = fit.lanes
    tid = np.arange(fit.threads)
    warp, lane = tid // 32, tid % 32
    lk = lane // (lr_n * lb_n)
    return {"tid": tid, "warp": warp, "lane": lane, "lr": lane % lr_n,
            "lb": (lane // lr_n) % lb_n, "lk": lk, "kg": warp * lk_n + lk}


def owned(fit: Fit, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tid, b, jj) of every (b, j) cell block ``block`` updates: cells e = tid + i*threads,
    i < PK_CPT, jj = e % U, b = e // U (within the block's batches), for jj < the block's
    units and b < its batches; b is returned as the batch row (its slice's start added)."""
    U, BG = fit.units_per_block, fit.batch_per_block
    batches = fit.batches(block)
    e = np.arange(U * BG)
    jj, b = e % U, e // U
    keep = (jj < len(fit.units(block))) & (b < len(batches))
    return e[keep] % fit.threads, b[keep] + batches.start, jj[keep]


def k_columns(fit: Fit, group: int, depth: int | None = None) -> np.ndarray:
    """The columns k of h_t (and of R) k-group ``group`` (kg = warp * LK + lk) multiplies,
    in its order: tile by tile (k_tile columns), its warp's chunks [w*CPW, (w+1)*CPW)
    clipped to the tile, first half then second, chunks lk, lk + LK, ... of each half,
    skipping k >= H (R's padding there is zero). H is ``depth``, else ``fit.depth``: the
    backward kernel cuts the G*H columns of dg_t the same way (the pair kernel's block 1 its
    half, shorter than the KH its layout is sized for)."""
    H, kt = fit.depth if depth is None else int(depth), fit.k_tile
    lk_n = fit.lanes[2]
    w, lk = divmod(group, lk_n)
    cpw = fit.chunks_per_warp
    cols = []
    for k0 in range(0, H, kt):
        ch = min(kt // 4, ceil_div(H - k0, 4))
        ca = min(ch, w * cpw)
        cb = min(ch, ca + cpw)
        cm = ca + ceil_div(cb - ca, 2)
        for lo, hi in ((ca, cm), (cm, cb)):
            for cc in range(lo + lk, hi, lk_n):
                cols.extend(k for k in range(k0 + 4 * cc, k0 + 4 * cc + 4) if k < H)
    return np.array(cols, dtype=np.int64)


def k_group_runs(fit: Fit, depth: int | None = None) -> list:
    """``k_columns`` of k-groups 0, 1, ... in the kernel's order, each run of consecutive
    k-groups with no column as one None. At small H most k-groups own no column (H 6 at 256
    threads: 254 of 256), and a product per empty group was nearly all of the emulation's
    time; their partial sums are zero, and adding zero once or n times gives the same bits
    (it only turns -0.0 into +0.0), so ``sum_k_groups`` over these runs equals the sum over
    every k-group bit for bit. ``depth``: ``k_columns``'."""
    runs = []
    for g in range(fit.k_split):
        cols = k_columns(fit, g, depth)
        if cols.size:
            runs.append(cols)
        elif not runs or runs[-1] is not None:
            runs.append(None)
    return runs


def sum_k_groups(runs, part, shape, dtype):
    """The sum, in order, of ``part(cols)`` over ``k_group_runs``; an empty run adds zero
    (a first one: the zeros its empty product would give, of ``shape`` and ``dtype``)."""
    acc = None
    for cols in runs:
        if cols is None:
            acc = np.zeros(shape, dtype) if acc is None else acc + 0.0
        else:
            p = part(cols)
            acc = p if acc is None else acc + p
    return acc


def ownership(fit: Fit) -> np.ndarray:
    """[B, H] count of the threads (over all blocks) that write each element of h_{t+1}."""
    count = np.zeros((fit.batch, fit.hidden), np.int64)
    for x in range(fit.blocks):
        _, b, jj = owned(fit, x)
        np.add.at(count, (b, fit.units(x).start + jj), 1)
    return count


# --- the emulation ----------------------------------------------------------------------

def operand_of(dtype):
    """-> (stored, operand): a value as precision ``dtype`` stores it (rounded to storage)
    and as its product reads it (stored, then TF32-rounded for tf32): the persistent kernels'
    pk_stored and pk_operand (persistent_common.cuh). Both the identity for float32."""
    def stored(a):
        return round_to_storage(a, dtype)

    def operand(a):
        return gemm_operand(round_to_storage(a, dtype), dtype)
    return stored, operand


def emulate(cell: str, fit: Fit, gx, R, bw, br, h0, c0=None, train: bool = True,
            dtype: str = "float32", products=None, owners=None):
    """Run the persistent kernel's decomposition with NumPy. -> (h, c, act)

    gx [T, B, G*H] (W x_t, no bias); R = weight_hh [G*H, H]; bw, br: b_ih, b_hh, each
    [G*H], [B, G*H] or None (zeros); h0 [B, H]; c0 [B, H] (LSTM only). Works in gx's dtype.
    Returns h [T+1, B, H] (h[0] = h0), c [T+1, B, H] (LSTM, else None) and act [T, B, 4H]
    (LSTM i,f,g,o; GRU r,z,n,hn; None for RNN or when not ``train``).

    ``dtype`` (rnnrt.precision.DTYPES): the typed kernels' rounding -- h0 and every h_{t+1}
    stored rounded to the storage type (what the GRU's h_t - n and the next step read), the
    product's operands R and h_t as the rungs' GEMMs read them (operand_of); all else in
    gx's dtype.

    Block by block, step by step: before the first step each block takes its G*U rows of R
    (its shared-memory copy); at step t it reads only h_t, sums its k-groups' partial dot
    products in the kernel's order (k-group 0, 1, ...), and each (b, j) is written by the one
    thread that owns it. The
    end of a step is the barrier: there every element of h_{t+1} must have been written by
    exactly one thread (checked), and only then does step t+1 read it.

    ``products(rs, ht) -> gh`` (rs [G, Ub, H] a block's rows of R, ht [B, H]; gh [G, Ub, B]) and
    ``owners(fit, block) -> (tid, b, jj)``: another kernel's order of the sums over k and its
    cells (emulate_regs: the register-resident kernel's); by default this kernel's k-groups
    (``k_columns``) and cells (``owned``).
    """
    spec = get_cell(cell)
    G = spec.gates
    gx = np.asarray(gx)
    if gx.ndim != 3:
        raise ValueError(f"emulate: gx must be [T, B, G*H], got shape {gx.shape}")
    T, B, GH = gx.shape
    H = GH // G
    precision, dtype = dtype, gx.dtype
    if fit.cell != spec.name or fit.hidden != H or fit.batch != B or GH != G * H:
        raise ValueError(f"emulate: fit is for {fit.cell} H {fit.hidden} B {fit.batch}, "
                         f"gx {gx.shape} is {spec.name} H {H} B {B}")
    R = np.asarray(R, dtype)
    if R.shape != (GH, H):
        raise ValueError(f"emulate: R has shape {R.shape}, expected {(GH, H)}")
    stored, operand = operand_of(precision)
    R = operand(R)
    bias = [np.zeros((B, GH), dtype) if v is None else np.broadcast_to(np.asarray(v, dtype),
                                                                        (B, GH))
            for v in (bw, br)]
    bw, br = bias
    h = np.full((T + 1, B, H), np.nan, dtype)
    h[0] = stored(np.asarray(h0, dtype))
    c = None
    if spec.has_cell_state:
        if c0 is None:
            raise ValueError("emulate: lstm needs c0")
        c = np.full((T + 1, B, H), np.nan, dtype)
        c[0] = c0
    elif c0 is not None:
        raise ValueError(f"emulate: c0 given, but {cell} has no cell state")
    act = np.full((T, B, 4 * H), np.nan, dtype) if spec.saved_gates else None

    if products is None:
        runs = k_group_runs(fit)

        def products(rs, ht):   # k-group 0, 1, ... in the kernel's order
            return sum_k_groups(runs, lambda cols: rs[:, :, cols] @ ht[:, cols].T,   # [G, Ub, B]
                                (*rs.shape[:2], ht.shape[0]), np.result_type(rs, ht))
    blocks = []
    for x in range(fit.blocks):
        units = fit.units(x)
        rows = (np.arange(G)[:, None] * H + np.asarray(units, np.int64)[None, :])   # [G, Ub]
        _, b_own, jj_own = (owners or owned)(fit, x)
        blocks.append((R[rows], b_own, units.start + jj_own, jj_own))   # R slice [G, Ub, H]

    for t in range(T):
        written = np.zeros((B, H), np.int64)
        ht = operand(h[t])
        for rs, b, j, jj in blocks:
            gh = products(rs, ht)[:, jj, b]          # [G, n]: this block's (b, j) elements

            def pre(q):   # ((gx + bw) + gh) + br, the fused kernels' order
                k = q * H + j
                return ((gx[t, b, k] + bw[b, k]) + gh[q]) + br[b, k]

            if spec.name == "lstm":
                i_, f_, o_ = sigmoid(pre(0)), sigmoid(pre(1)), sigmoid(pre(3))
                g_ = np.tanh(pre(2))
                cn = f_ * c[t, b, j] + i_ * g_
                c[t + 1, b, j] = cn
                h[t + 1, b, j] = o_ * np.tanh(cn)
                saved = (i_, f_, g_, o_)
            elif spec.name == "gru":
                r_, z_ = sigmoid(pre(0)), sigmoid(pre(1))
                kn = 2 * H + j
                hn = gh[2] + br[b, kn]
                n_ = np.tanh((gx[t, b, kn] + bw[b, kn]) + r_ * hn)
                h[t + 1, b, j] = n_ + z_ * (h[t, b, j] - n_)
                saved = (r_, z_, n_, hn)
            elif spec.name == "rnn_tanh":
                h[t + 1, b, j] = np.tanh(pre(0))
                saved = ()
            else:
                h[t + 1, b, j] = relu(pre(0))
                saved = ()
            for q, v in enumerate(saved):
                act[t, b, q * H + j] = v
            np.add.at(written, (b, j), 1)
        h[t + 1] = stored(h[t + 1])   # the kernel's store (and the cluster's push) rounds
        # the grid barrier: h_{t+1} is complete, every element written exactly once
        if not (written == 1).all():
            bad = np.argwhere(written != 1)[0]
            raise AssertionError(f"emulate: step {t}: h[{t + 1}][{bad[0]}, {bad[1]}] written "
                                 f"{written[tuple(bad)]} times by the blocks, not once")
    return h, c, (act if train else None)


# --- NumPy twins of the registry's kernels ------------------------------------------------
# fn(rows = B, cols = H, outs, ins, T, units_per_block, k_tile, cluster=False,
# dtype='float32': the key's precision, the typed kernels' rounding), the views as
# the registry hands them: h [(T+1)*B, H] (slot 0 = h0 read), c likewise (LSTM), act [T*B, 4H], sync
# [1, 2]; gx [T*B, G*H], w_hh [G*H, H], bw and br [B, G*H] (ld 0 broadcasts). The block size
# is the default for (B, U, k_tile): it only changes the order in which partial sums are
# added.

def _grid_or_cluster_fit(cell, B, H, units_per_block, k_tile, cluster):
    """(kernel name, fit, emulate's keywords) of the grid or cluster kernel's twin."""
    # the cluster twin assumes one cluster per CLUSTER_BATCH batches, the default without
    # an SM cap (the launch's own count only changes the order of the partial sums)
    fit = geometry(cell, H, B, units_per_block, k_tile=k_tile,
                   clusters=ceil_div(B, CLUSTER_BATCH) if cluster else 0)
    return kernel_name(cell, cluster), fit, {}


def _twin(cell, rows, cols, h, c, act, sync, ins, T, units_per_block, k_tile,
          cluster=False, fit_of=_grid_or_cluster_fit, dtype="float32"):
    """Run a persistent forward kernel's twin on the registry's views; ``fit_of(cell, B,
    H, units_per_block, k_tile, cluster) -> (name, fit, emulate's keywords)``; ``dtype``
    the key's precision (the typed kernels' rounding)."""
    gx, w_hh, bw, br = ins
    B, H, G = rows, cols, get_cell(cell).gates
    name, fit, emu = fit_of(cell, B, H, units_per_block, k_tile, cluster)
    if np.any(np.asarray(sync) != 0):
        raise ValueError(f"{name}: the sync counters must be zero on entry, "
                         f"got {np.asarray(sync).ravel().tolist()}")
    if not fit.ok:
        raise ValueError(f"{name}: {fit.reason}")
    gx3 = np.asarray(gx).reshape(T, B, G * H)
    h_all, c_all, act_all = emulate(cell, fit, gx3, np.asarray(w_hh), bw, br,
                                    np.array(h[:B]), None if c is None else np.array(c[:B]),
                                    dtype=dtype, **emu)
    # Every input is read: now write slots 1..T (slot 0, h0 and c0, is left as it was).
    h[B:] = h_all[1:].reshape(T * B, H)
    if c is not None:
        c[B:] = c_all[1:].reshape(T * B, H)
    if act is not None:
        act[...] = act_all.reshape(T * B, 4 * H)


def twin_of(cell: str, fit_of=_grid_or_cluster_fit, name: str | None = None):
    """The registry's NumPy twin of ``cell``'s persistent forward kernel (``fit_of`` makes
    its fit: by default the grid or cluster kernel's; ``name`` the twin's name): its outs
    are h, then c (LSTM), act (LSTM, GRU), sync, as the registry lists them."""
    spec = get_cell(cell)

    def twin(rows, cols, outs, ins, T, units_per_block, k_tile, cluster=False,
             dtype="float32"):
        outs = list(outs)
        h = outs.pop(0)
        c = outs.pop(0) if spec.has_cell_state else None
        act = outs.pop(0) if spec.saved_gates else None
        (sync,) = outs
        _twin(spec.name, rows, cols, h, c, act, sync, ins, T, units_per_block, k_tile,
              cluster, fit_of, dtype)

    twin.__name__ = twin.__qualname__ = name or kernel_name(cell)
    return twin


lstm_persistent_fwd = twin_of("lstm")
gru_persistent_fwd = twin_of("gru")
rnn_tanh_persistent_fwd = twin_of("rnn_tanh")
rnn_relu_persistent_fwd = twin_of("rnn_relu")
