"""NumPy twins of the pointwise CUDA kernels in cuda_src/, for the CPU plan executor and its
race checker.

One function per kernel, ``fn(rows, cols, outs, ins) -> None``, with the kernel's name and
argument order (see each .cu file's header; ``rnnrt.kernels.registry.KERNELS`` lists them). Each
argument is the already-made 2-D view of that (pointer, ld) pair, shape [view rows, view
cols]; an ld = 0 input is a broadcast view (row stride 0), so twins never write to inputs.
They write into ``outs`` in place, only after every input has been read (so an output may
alias an input exactly, as on the GPU), and follow the kernels' order of arithmetic; they
work in the arrays' own dtype (float32 as on the GPU, or float64).

``view`` makes those 2-D views over a flat buffer, the way a kernel addresses memory.

The persistent kernels' twins (one launch, a layer's or a stack's whole sequence) take the
kernels' int scalars after ``ins`` (``fn(rows, cols, outs, ins, T, units_per_block,
k_tile)``) and live beside their emulation: ``emulate.py`` and ``stack.py``.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided


def view(buf: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The [rows, cols] row-major view of flat ``buf`` with element (r, c) at offset + r*ld + c.

    ld = 0 gives a broadcast view (row stride 0), read-only when it has more than one row:
    writing through it would be a race on the GPU.
    """
    if buf.ndim != 1 or (buf.size > 1 and buf.strides[0] != buf.itemsize):
        raise ValueError(f"view: buf must be a contiguous 1-D array, got shape {buf.shape} "
                         f"strides {buf.strides}")
    if rows < 1 or cols < 1:
        raise ValueError(f"view: empty shape [{rows}, {cols}]")
    if ld != 0 and ld < cols:
        raise ValueError(f"view: ld {ld} < cols {cols} (rows would overlap)")
    if offset < 0:
        raise ValueError(f"view: negative offset {offset}")
    end = offset + (rows - 1) * ld + cols
    if end > buf.size:
        raise ValueError(f"view: [{rows}, {cols}] ld {ld} at offset {offset} ends at {end}, "
                         f"past the buffer's {buf.size} elements")
    return as_strided(buf[offset:], shape=(rows, cols), strides=(ld * buf.itemsize, buf.itemsize),
                      writeable=not (ld == 0 and rows > 1))


def sigmoid(x):
    """The kernels' sigmoid, elementwise."""
    # As the kernels: exp of a non-positive number only (no overflow, no warnings).
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def relu(x):
    """The kernels' ReLU, elementwise (NaN stays NaN)."""
    return np.where(x < 0, 0, x).astype(x.dtype, copy=False)  # NaN stays NaN, as the kernels


def _gate(a, q, cols):
    """Gate block q (columns q*cols .. (q+1)*cols) of a [B, G*H] view, H = cols."""
    return a[:, q * cols:(q + 1) * cols]


# --- elementwise.cu -----------------------------------------------------------------------

def ew_add(rows, cols, outs, ins):
    (out,), (a, b) = outs, ins
    out[...] = a + b


def ew_sub(rows, cols, outs, ins):
    (out,), (a, b) = outs, ins
    out[...] = a - b


def ew_mul(rows, cols, outs, ins):
    (out,), (a, b) = outs, ins
    out[...] = a * b


def ew_sigmoid(rows, cols, outs, ins):
    (out,), (a,) = outs, ins
    out[...] = sigmoid(a)


def ew_tanh(rows, cols, outs, ins):
    (out,), (a,) = outs, ins
    out[...] = np.tanh(a)


def ew_relu(rows, cols, outs, ins):
    (out,), (a,) = outs, ins
    out[...] = relu(a)


def ew_dsigmoid(rows, cols, outs, ins):
    (out,), (dy, y) = outs, ins
    out[...] = dy * (y * (1 - y))


def ew_dtanh(rows, cols, outs, ins):
    (out,), (dy, y) = outs, ins
    out[...] = dy * (1 - y * y)


def ew_drelu(rows, cols, outs, ins):
    (out,), (dy, y) = outs, ins
    out[...] = _drelu(dy, y)


def _drelu(dy, y):
    # y > 0 ? dy : 0, as the kernels: 0 where y <= 0 (or NaN) even if dy is NaN or Inf
    return np.where(y > 0, dy, 0).astype(dy.dtype, copy=False)


# --- transpose.cu -------------------------------------------------------------------------

def transpose(rows, cols, outs, ins):
    (out,), (a,) = outs, ins
    out[...] = a.T


# --- lstm.cu, gru.cu, rnn.cu (rows = B, cols = H) -----------------------------------------
# Forward and backward; the backward twins follow the kernels' order of operations, which is
# the naive rung's sequence of ew_* kernels.

def _pre(gx, gh, bw, br, q, cols):
    """((gx + bw) + gh) + br of gate block q, in the kernels' order of additions."""
    return ((_gate(gx, q, cols) + _gate(bw, q, cols)) + _gate(gh, q, cols)) + _gate(br, q, cols)


def _lstm_step(cols, ins):
    """(h, c, (i, f, g, o)) of one LSTM step, new arrays (nothing written)."""
    gx, gh, bw, br, c_prev = ins
    i, f, o = (sigmoid(_pre(gx, gh, bw, br, q, cols)) for q in (0, 1, 3))
    g = np.tanh(_pre(gx, gh, bw, br, 2, cols))
    c_new = f * c_prev + i * g
    return o * np.tanh(c_new), c_new, (i, f, g, o)


def _gru_step(cols, ins):
    """(h, (r, z, n, hn)) of one GRU step, new arrays (nothing written)."""
    gx, gh, bw, br, h_prev = ins
    r = sigmoid(_pre(gx, gh, bw, br, 0, cols))
    z = sigmoid(_pre(gx, gh, bw, br, 1, cols))
    hn = _gate(gh, 2, cols) + _gate(br, 2, cols)
    n = np.tanh((_gate(gx, 2, cols) + _gate(bw, 2, cols)) + r * hn)
    return n + z * (h_prev - n), (r, z, n, hn)


def _save(act, cols, gates):
    for q, v in enumerate(gates):
        _gate(act, q, cols)[...] = v


def lstm_fwd(rows, cols, outs, ins):
    h, c, act = outs
    h_new, c_new, gates = _lstm_step(cols, ins)
    # Every input is read: now write.
    c[...] = c_new
    h[...] = h_new
    _save(act, cols, gates)


def lstm_fwd_noact(rows, cols, outs, ins):
    """lstm_fwd without act (inference)."""
    h, c = outs
    h_new, c_new, _ = _lstm_step(cols, ins)
    c[...] = c_new
    h[...] = h_new


def gru_fwd(rows, cols, outs, ins):
    h, act = outs
    h_new, gates = _gru_step(cols, ins)
    # Every input is read: now write.
    h[...] = h_new
    _save(act, cols, gates)


def gru_fwd_noact(rows, cols, outs, ins):
    """gru_fwd without act (inference)."""
    (h,) = outs
    h[...] = _gru_step(cols, ins)[0]


def rnn_tanh_fwd(rows, cols, outs, ins):
    (h,), (gx, gh, bw, br) = outs, ins
    h[...] = np.tanh(_pre(gx, gh, bw, br, 0, cols))


def rnn_relu_fwd(rows, cols, outs, ins):
    (h,), (gx, gh, bw, br) = outs, ins
    h[...] = relu(_pre(gx, gh, bw, br, 0, cols))


def lstm_bwd(rows, cols, outs, ins):
    dgx, dc_prev = outs
    dh_above, dh_rec, dc_next, act, c, c_prev = ins
    i, f, g, o = (_gate(act, q, cols) for q in range(4))
    dh = dh_above + dh_rec
    tc = np.tanh(c)
    dho = dh * o
    t = dho * (1 - tc * tc)
    dcc = dc_next + t
    do_ = dh * tc
    di, df, dg = dcc * g, dcc * c_prev, dcc * i
    grads = (di * (i * (1 - i)), df * (f * (1 - f)), dg * (1 - g * g), do_ * (o * (1 - o)))
    dcp = dcc * f
    # Every input is read: now write.
    for q, v in enumerate(grads):
        _gate(dgx, q, cols)[...] = v
    dc_prev[...] = dcp


def gru_bwd(rows, cols, outs, ins):
    dgx, dgh, dh_prev = outs
    dh_above, dh_rec, act, h_prev = ins
    r, z, n, hn = (_gate(act, q, cols) for q in range(4))
    dh = dh_above + dh_rec
    dhz = dh * z
    dn = dh - dhz
    dn_p = dn * (1 - n * n)
    d = h_prev - n
    dz = dh * d
    dz_p = dz * (z * (1 - z))
    dhn = dn_p * r
    dr = dn_p * hn
    dr_p = dr * (r * (1 - r))
    # Every input is read: now write.
    for q, (vx, vh) in enumerate(((dr_p, dr_p), (dz_p, dz_p), (dn_p, dhn))):
        _gate(dgx, q, cols)[...] = vx
        _gate(dgh, q, cols)[...] = vh
    dh_prev[...] = dhz


def rnn_tanh_bwd(rows, cols, outs, ins):
    (dg,), (dh_above, dh_rec, h) = outs, ins
    dg[...] = (dh_above + dh_rec) * (1 - h * h)


def rnn_relu_bwd(rows, cols, outs, ins):
    (dg,), (dh_above, dh_rec, h) = outs, ins
    dg[...] = _drelu(dh_above + dh_rec, h)


def _split_sum(rows, base, parts, splits):
    """dh_rec of the *_bwd_split kernels: base, then each part in order, in the parts'
    type (what ew_sum_splits sums into: the plans' dhr and dpart are alike, fp32 on the
    GPU); parts of ``rows`` rows each, added to base's first ``rows`` rows (the masked
    kernels' part_rows: base alone past them)."""
    acc = base.astype(parts.dtype, copy=True)
    for s in range(splits):
        acc[:rows] += parts[s * rows:(s + 1) * rows]
    return acc


def _split(fn):
    """The *_split twin of backward twin ``fn`` (plain or masked): ``fn`` on dh_rec = base +
    the parts' sum (``_split_sum``) over the first part_rows rows (the masked kernels'
    scalar; the plain kernels' parts cover every row)."""
    def twin(rows, cols, outs, ins, splits, part_rows=None):
        dh_above, base, parts, *rest = ins
        rec = _split_sum(rows if part_rows is None else part_rows, base, parts, splits)
        fn(rows, cols, outs, (dh_above, rec, *rest))
    twin.__name__ = f"{fn.__name__}_split"
    return twin


lstm_bwd_split = _split(lstm_bwd)
gru_bwd_split = _split(gru_bwd)
rnn_tanh_bwd_split = _split(rnn_tanh_bwd)
rnn_relu_bwd_split = _split(rnn_relu_bwd)


# --- elementwise.cu: copies and row selects (variable-length plans) -----------------------

def ew_copy(rows, cols, outs, ins):
    (out,), (a,) = outs, ins
    out[...] = a


def ew_sum_splits(rows, cols, outs, ins, splits):
    """base, then each part in order (float32 sums, as the kernel adds)."""
    (out,), (base, parts) = outs, ins
    acc = base.astype(out.dtype, copy=True)   # a copy: base may be out itself
    for s in range(splits):
        acc += parts[s * rows:(s + 1) * rows]
    out[...] = acc


def ew_select(rows, cols, outs, ins):
    (out,), (mask, a, b) = outs, ins
    on = mask[:, 0] != 0
    picked = np.where(on[:, None], a, b)   # the side not taken is discarded, NaN or not
    out[...] = picked


# --- the masked step kernels (lstm.cu, gru.cu, rnn.cu) --------------------------------------
# Rows with mask != 0 run the plain twin (on those rows only); frozen rows (mask 0) pass
# their state, or its gradient, through. Everything is read before anything is written.

def _rows(views, on):
    """The rows ``on`` of each [rows, *] view (copies; a broadcast view gives its row
    repeated)."""
    return [np.array(v[on]) for v in views]


def _masked(plain, cols, outs, ins, on, frozen):
    """Run twin ``plain`` ([rows, cols] problem) on the rows ``on`` of ``ins`` into fresh
    arrays, then write them and the frozen rows' values (``frozen``: one array or 0 per
    output, for the rows not on)."""
    n = int(on.sum())
    tmp = [np.empty((n, o.shape[1]), o.dtype) for o in outs]
    if n:
        plain(n, cols, tmp, _rows(ins, on))
    for o, t, f in zip(outs, tmp, frozen):
        o[on] = t
        o[~on] = f


def lstm_fwd_mask(rows, cols, outs, ins):
    *plain_ins, h_prev, mask = ins
    on = mask[:, 0] != 0
    frozen = (np.array(h_prev[~on]), np.array(plain_ins[4][~on]), 0)   # h_prev, c_prev
    _masked(lstm_fwd, cols, outs, plain_ins, on, frozen)


def lstm_fwd_mask_noact(rows, cols, outs, ins):
    *plain_ins, h_prev, mask = ins
    on = mask[:, 0] != 0
    frozen = (np.array(h_prev[~on]), np.array(plain_ins[4][~on]))   # h_prev, c_prev
    _masked(lstm_fwd_noact, cols, outs, plain_ins, on, frozen)


def gru_fwd_mask(rows, cols, outs, ins):
    *plain_ins, mask = ins
    on = mask[:, 0] != 0
    _masked(gru_fwd, cols, outs, plain_ins, on, (np.array(plain_ins[4][~on]), 0))


def gru_fwd_mask_noact(rows, cols, outs, ins):
    *plain_ins, mask = ins
    on = mask[:, 0] != 0
    _masked(gru_fwd_noact, cols, outs, plain_ins, on, (np.array(plain_ins[4][~on]),))


def rnn_tanh_fwd_mask(rows, cols, outs, ins):
    *plain_ins, h_prev, mask = ins
    on = mask[:, 0] != 0
    _masked(rnn_tanh_fwd, cols, outs, plain_ins, on, (np.array(h_prev[~on]),))


def rnn_relu_fwd_mask(rows, cols, outs, ins):
    *plain_ins, h_prev, mask = ins
    on = mask[:, 0] != 0
    _masked(rnn_relu_fwd, cols, outs, plain_ins, on, (np.array(h_prev[~on]),))


def _with_zero_direct(plain):
    """``plain`` (a backward twin) plus a last output, the direct part dh_prev, zero."""
    def fn(rows, cols, outs, ins):
        plain(rows, cols, outs[:-1], ins)
        outs[-1][...] = 0
    return fn


def lstm_bwd_mask(rows, cols, outs, ins):
    *plain_ins, mask = ins                      # dh_above, dh_rec, dc_next, act, c, c_prev
    on = mask[:, 0] != 0
    frozen = (0, np.array(plain_ins[2][~on]), np.array(plain_ins[1][~on]))
    _masked(_with_zero_direct(lstm_bwd), cols, outs, plain_ins, on, frozen)


def gru_bwd_mask(rows, cols, outs, ins):
    *plain_ins, mask = ins                      # dh_above, dh_rec, act, h_prev
    on = mask[:, 0] != 0
    _masked(gru_bwd, cols, outs, plain_ins, on, (0, 0, np.array(plain_ins[1][~on])))


def rnn_tanh_bwd_mask(rows, cols, outs, ins):
    *plain_ins, mask = ins                      # dh_above, dh_rec, h
    on = mask[:, 0] != 0
    _masked(_with_zero_direct(rnn_tanh_bwd), cols, outs, plain_ins, on,
            (0, np.array(plain_ins[1][~on])))


def rnn_relu_bwd_mask(rows, cols, outs, ins):
    *plain_ins, mask = ins
    on = mask[:, 0] != 0
    _masked(_with_zero_direct(rnn_relu_bwd), cols, outs, plain_ins, on,
            (0, np.array(plain_ins[1][~on])))


lstm_bwd_mask_split = _split(lstm_bwd_mask)
gru_bwd_mask_split = _split(gru_bwd_mask)
rnn_tanh_bwd_mask_split = _split(rnn_tanh_bwd_mask)
rnn_relu_bwd_mask_split = _split(rnn_relu_bwd_mask)
