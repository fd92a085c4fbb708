"""A NumPy emulation of the persistent backward kernels' decomposition (persistent_bwd.py's
fit), and the registry's NumPy twins of those kernels.

``emulate_bwd`` runs a layer's backward block by block and step by step as the kernel cuts
it (the grid kernel, or the cluster kernel: each block then reads only its cluster's batches
of dg_{t+1}): at each step every block reads only dg_{t+1} and its own U columns of R, sums its
k-groups' partial products in the kernel's order (k-group 0, 1, ...: ``emulate.k_columns``
over the K = G*H columns), and each (b, j) of dh_rec is written by the one thread that owns
it (checked: exactly once, at the barrier); the pointwise backward is the fused kernels' own
(their NumPy twins), elementwise. Every element has one writer and every sum a fixed order,
so the result does not depend on the order the blocks run in (``block_order``): the
determinism the GPU kernel has by construction (no atomics in any sum).
"""
from __future__ import annotations

import numpy as np

from ..cells import get_cell
from . import twins as knp
from .budget import ceil_div
from .emulate import k_group_runs, operand_of, owned, sum_k_groups
from .persistent import CLUSTER_BATCH
from .persistent_bwd import (BwdFit, PairBwdFit, bwd_geometry, bwd_kernel_name, pair_geometry,
                             pair_kernel_name)


def emulate_bwd(cell: str, fit: BwdFit, dhin, dh_n, R, act=None, st=None, dc_n=None,
                block_order=None, dtype: str = "float32", products=None,
                owners=None) -> dict:
    """Run the backward kernel's decomposition with NumPy. -> {"dgx", "dgh", "dh0", "dc0"}

    dhin [T, B, H]: the gradient of each step's output from above; dh_n [B, H]; R =
    weight_hh [G*H, H]; act [T, B, 4H] (LSTM, GRU: the forward's saved gates); st: the
    forward's c [T+1, B, H] (LSTM) or h [T+1, B, H] (GRU, RNN); dc_n [B, H] (LSTM only).
    Works in dhin's dtype. Returns dgx [T, B, G*H] (every step's gate gradients), dgh (GRU:
    the R side's; else None), dh0 [B, H], dc0 [B, H] (LSTM, else None). block_order: the
    order of the blocks' products (default 0, 1, ...). dtype (rnnrt.precision.DTYPES): the
    typed kernels' rounding -- each step's dg (dgx, dgh) stored rounded to the storage type,
    the product's operands R and dg as the rungs' GEMMs read them (emulate.operand_of); st
    is taken as stored (the forward's h was rounded when written).
    ``products(rs, dg) -> [Ub, Bc]`` (rs [Ub, K] a block's rows of R^T, dg [Bc, K] its
    cluster's batches of dg_{t+1}) and ``owners(fit, block) -> (tid, b, jj)``: another
    kernel's order of the sums over k and its cell owners (the register-resident backward's,
    emulate_regs.emulate_regs_bwd); default the k-group kernels' (``sum_k_groups``, ``owned``).
    """
    spec = get_cell(cell)
    G = spec.gates
    dhin = np.asarray(dhin)
    if dhin.ndim != 3:
        raise ValueError(f"emulate_bwd: dhin must be [T, B, H], got shape {dhin.shape}")
    T, B, H = dhin.shape
    precision, dtype = dtype, dhin.dtype
    stored, operand = operand_of(precision)
    if fit.cell != spec.name or fit.hidden != H or fit.batch != B:
        raise ValueError(f"emulate_bwd: fit is for {fit.cell} H {fit.hidden} B {fit.batch}, "
                         f"dhin {dhin.shape} is {spec.name} H {H} B {B}")
    R = np.asarray(R, dtype)
    if R.shape != (G * H, H):
        raise ValueError(f"emulate_bwd: R has shape {R.shape}, expected {(G * H, H)}")
    R = operand(R)
    st = np.asarray(st, dtype)
    if st.shape != (T + 1, B, H):
        raise ValueError(f"emulate_bwd: st has shape {st.shape}, expected {(T + 1, B, H)}")
    if spec.saved_gates:
        act = np.asarray(act, dtype)
        if act.shape != (T, B, 4 * H):
            raise ValueError(f"emulate_bwd: act has shape {act.shape}, expected "
                             f"{(T, B, 4 * H)}")
    if spec.has_cell_state == (dc_n is None):
        raise ValueError(f"emulate_bwd: dc_n is for lstm only (cell {spec.name})")
    gru = spec.name == "gru"
    dgx = np.full((T, B, G * H), np.nan, dtype)
    dgh = np.full((T, B, G * H), np.nan, dtype) if gru else None
    dgs = dgh if gru else dgx   # what multiplies R
    dhrec = np.array(dh_n, dtype)
    dc = np.array(dc_n, dtype) if spec.has_cell_state else None
    direct = np.zeros((B, H), dtype)

    if products is None:
        runs = k_group_runs(fit)

        def products(rs, mine):   # k-group 0, 1, ... in the kernel's order: [Ub, batches]
            return sum_k_groups(runs, lambda cols: rs[:, cols] @ mine[:, cols].T,
                                (rs.shape[0], mine.shape[0]), np.result_type(rs, mine))
    blocks = []
    for x in range(fit.blocks):
        units = fit.units(x)
        _, b_own, jj_own = (owners or owned)(fit, x)
        blocks.append((R[:, units.start:units.stop].T, fit.batches(x), b_own,
                       units.start + jj_own, jj_own))
    order = range(fit.blocks) if block_order is None else block_order
    if sorted(order) != list(range(fit.blocks)):
        raise ValueError(f"emulate_bwd: block_order must order the {fit.blocks} blocks")

    for s in range(T + 1):
        t = T - 1 - s
        if s > 0:
            dg = operand(dgs[t + 1])            # [B, K]: complete at the barrier
            new = np.full((B, H), np.nan, dtype)
            written = np.zeros((B, H), np.int64)
            for x in order:
                rs, rows, b, j, jj = blocks[x]  # rs [Ub, K]: the block's rows of R^T
                mine = dg[rows.start:rows.stop]   # its (cluster's) batches of dg_{t+1}
                acc = products(rs, mine)          # [Ub, batches]
                v = acc[jj, b - rows.start]
                new[b, j] = v + direct[b, j] if gru else v   # the GEMM, then + dh*z
                np.add.at(written, (b, j), 1)
            if not (written == 1).all():
                bad = np.argwhere(written != 1)[0]
                raise AssertionError(f"emulate_bwd: step {t}: dh_rec[{bad[0]}, {bad[1]}] "
                                     f"written {written[tuple(bad)]} times, not once")
            dhrec = new
        if s == T:
            break
        a = act[t] if spec.saved_gates else None
        if spec.name == "lstm":
            dc_prev = np.empty_like(dc)
            knp.lstm_bwd(B, H, (dgx[t], dc_prev), (dhin[t], dhrec, dc, a, st[t + 1], st[t]))
            dc = dc_prev
        elif gru:
            knp.gru_bwd(B, H, (dgx[t], dgh[t], direct), (dhin[t], dhrec, a, st[t]))
        else:
            getattr(knp, f"{spec.name}_bwd")(B, H, (dgx[t],), (dhin[t], dhrec, st[t + 1]))
        dgx[t] = stored(dgx[t])   # the kernel's stores (and the cluster's pushes) round
        if gru:
            dgh[t] = stored(dgh[t])
    return {"dgx": dgx, "dgh": dgh, "dh0": dhrec, "dc0": dc}


def pair_products(fit: PairBwdFit):
    """``emulate_bwd``'s products for the pair kernel's ``fit``: each block of a pair sums its
    half of the gate rows (block 0 columns [0, KH), block 1 [KH, K): ``fit.halves``) over its
    k-groups in order (``k_group_runs`` of the pair's layout, 2U rows, over the half's depth),
    the same for every row; then half 0 + half 1 (the owner adds the other's: the same value,
    addition commutes). -> products(rs [Ub, K], dg [Bc, K]) -> [Ub, Bc]."""
    kh, kc = fit.halves
    runs = [(k_group_runs(fit, kh), 0), (k_group_runs(fit, kc), kh)]

    def products(rs, dg):
        shape, dtype = (rs.shape[0], dg.shape[0]), np.result_type(rs, dg)
        s0, s1 = (sum_k_groups(r, lambda cols, o=off: rs[:, o + cols] @ dg[:, o + cols].T,
                               shape, dtype) for r, off in runs)
        return s0 + s1
    return products


# --- NumPy twins of the registry's kernels ------------------------------------------------
# fn(rows = B, cols = H, outs, ins, T, units_per_block, k_tile), the views as the registry
# hands them (persistent_bwd.cu's header): outs dgx [T*B, G*H], dgh (GRU), dh0 [B, H], dc0
# (LSTM), sync [1, 2]; ins dhin [T*B, H], dh_n [B, H], dc_n (LSTM), act [T*B, 4H] (LSTM,
# GRU), c or h [(T+1)*B, H], w_hh [G*H, H]; cluster=True for the cluster kernels; dtype:
# the key's precision (the typed kernels' rounding, emulate_bwd's). The block
# size is the default for (B, U, k_tile): it only changes the order of the partial sums.

def _grid_or_cluster_fit(cell, B, H, units_per_block, k_tile, cluster):
    """(kernel name, fit) of the FMA grid or cluster kernel's twin."""
    # the cluster twin: one cluster per CLUSTER_BATCH batches, the default without an SM
    # cap (the launch's own count only changes the order of the partial sums)
    fit = bwd_geometry(cell, H, B, units_per_block, k_tile=k_tile,
                       clusters=ceil_div(B, CLUSTER_BATCH) if cluster else 0)
    return bwd_kernel_name(cell, cluster), fit


def _pair_fit(cell, B, H, units_per_block, k_tile, cluster):
    """(kernel name, fit, emulate_bwd's keywords) of the pair kernel's twin."""
    if cluster:
        raise ValueError(f"{pair_kernel_name(cell)}: a grid kernel in pairs, no cluster=True")
    fit = pair_geometry(cell, H, B, units_per_block, k_tile=k_tile)
    return pair_kernel_name(cell), fit, {"products": pair_products(fit)}


def twin_of(cell: str, fit_of=_grid_or_cluster_fit, name: str | None = None):
    """The registry's NumPy twin of ``cell``'s persistent backward kernel: ``emulate_bwd``
    over the cut ``fit_of(cell, B, H, units_per_block, k_tile, cluster) -> (kernel name,
    fit)`` or (kernel name, fit, emulate_bwd's keywords) makes (by default the FMA grid or
    cluster kernel's; mma_bwd.py passes the tensor-core kernel's, emulate_regs.py the
    register-resident one's with its products and owners); ``name`` the twin's name."""
    spec = get_cell(cell)

    def twin(rows, cols, outs, ins, T, units_per_block, k_tile, cluster=False,
             dtype="float32"):
        B, H = rows, cols
        kname, fit, *emu = fit_of(cell, B, H, units_per_block, k_tile, cluster)
        emu = emu[0] if emu else {}
        outs, ins = list(outs), list(ins)
        G = spec.gates
        dgx = outs.pop(0)
        dgh = outs.pop(0) if spec.name == "gru" else None
        dh0 = outs.pop(0)
        dc0 = outs.pop(0) if spec.has_cell_state else None
        (sync,) = outs
        if np.any(np.asarray(sync) != 0):
            raise ValueError(f"{kname}: the sync counters must be zero on entry, "
                             f"got {np.asarray(sync).ravel().tolist()}")
        dhin, dh_n = ins.pop(0), ins.pop(0)
        dc_n = ins.pop(0) if spec.has_cell_state else None
        act = ins.pop(0) if spec.saved_gates else None
        st, w_hh = ins
        if not fit.ok:
            raise ValueError(f"{kname}: {fit.reason}")
        out = emulate_bwd(cell, fit, np.asarray(dhin).reshape(T, B, H), np.array(dh_n),
                          np.asarray(w_hh),
                          None if act is None else np.asarray(act).reshape(T, B, 4 * H),
                          np.asarray(st).reshape(T + 1, B, H),
                          None if dc_n is None else np.array(dc_n), dtype=dtype, **emu)
        # every input is read: now write
        dgx[...] = out["dgx"].reshape(T * B, G * H)
        if dgh is not None:
            dgh[...] = out["dgh"].reshape(T * B, G * H)
        dh0[...] = out["dh0"]
        if dc0 is not None:
            dc0[...] = out["dc0"]

    twin.__name__ = twin.__qualname__ = name or bwd_kernel_name(cell)
    return twin


lstm_persistent_bwd = twin_of("lstm")
gru_persistent_bwd = twin_of("gru")
rnn_tanh_persistent_bwd = twin_of("rnn_tanh")
rnn_relu_persistent_bwd = twin_of("rnn_relu")
# the grid kernels in cluster pairs (persistent_bwd_pair.cu): their cut and sum order
lstm_persistent_pair_bwd, gru_persistent_pair_bwd, rnn_tanh_persistent_pair_bwd, \
    rnn_relu_persistent_pair_bwd = (twin_of(c, _pair_fit, pair_kernel_name(c))
                                    for c in ("lstm", "gru", "rnn_tanh", "rnn_relu"))
