"""Plain NumPy forward and backward (backprop through time) of a stacked RNN.

This is the function everything in rnnrt is held against: every fast path (NumPy plan
executor, CuPy eager, CUDA graph, persistent kernels) must reproduce its outputs and
gradients. It is kept deliberately plain — a loop over layers, a loop over steps, one
function per cell step forward and one per cell step backward — so that it can be read
against torch.nn's documented equations and trusted. The products that do not depend on the
recurrence are each one product over all steps: W x in the forward; dx = dgi W, dW = dgi^T x,
dR = dgh^T h and the bias sums in the backward, once every step's gate gradients are known
(the same sums of the same rounded operands, in another order: per-step products made a
benchmark's check minutes long at small batches, each step re-reading or re-writing every
weight).

Math and parameter layout are torch.nn's, exactly (gate order from ``cells.py``):

  LSTM  gates = W x + b_ih + R h + b_hh, blocks i, f, g, o
        i, f, o = sigmoid, g = tanh;  c' = f*c + i*g;  h' = o*tanh(c')
  GRU   blocks r, z, n
        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z likewise,
        n = tanh(W_in x + b_in + r*(W_hn h + b_hn)),  h' = (1-z)*n + z*h
  RNN   h' = tanh(W x + b_ih + R h + b_hh)  (or relu)

Layer l > 0 takes layer l-1's h sequence as its input (no dropout). Arrays are
time-major: x [T, B, I], states [L, B, H]. Everything is computed in the dtype of x.

Each cell's step is split the same way the kernels split it: the two affine maps
(``gi = W x + b_ih``, ``gh = R h + b_hh``) are shared, and the cell's own step functions
do the pointwise part. The backward of a step returns the gradients with respect to gi and
gh (they differ only in GRU's n block, where gh_n is scaled by r); the shared code turns
those into dx, dh, dW, dR and the bias gradients.

Precision (``dtype``, rnnrt/precision.py): the math stays in x's dtype (float64 in the
tests), with exactly the plans' rounding points -- a value is rounded to the storage type
(``precision.round_to_storage``) where a plan stores it in a "store" buffer, a GEMM operand:
  forward:  x; each layer's W and R (not the biases); h0; each step's h as soon as it is
            made (so the next step's R h, the next layer's input, y and h_n are the rounded
            h, and so are the h the backward reads: GRU's h_{t-1}, RNN's h_t)
  backward: each step's gate gradients dgi, dgh, before anything reads them (dx = dgi W,
            dh_{t-1} = dgh R, dW = dgi^T x, dR = dgh^T h, the bias sums)
Nothing else rounds: gi, gh, c, the saved gates, dh (and GRU's z dh), dc, dx and the weight
gradients stay in float. float32 / tf32 storage rounds nothing; tf32's GEMMs read their
operands rounded to TF32 (``precision.gemm_operand``: every product above, the bias sums
included) while everything else reads them as stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from .cells import get_cell, layer_input_size
from .precision import gemm_operand, get_precision, round_to_storage

PARAM_KEYS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


# --------------------------------------------------------------------------- cache

@dataclass
class LayerCache:
    """What one layer's forward keeps for its backward.

    x:     [T, B, I_l] the layer's input sequence: the caller's x itself for layer 0 (held,
           not copied: writing into x before backward changes the gradients), a view of
           layer l-1's h[1:] above it
    h:     [T+1, B, H] hidden states; h[0] is the initial state, h[t+1] the output of step t
    c:     [T+1, B, H] cell states laid out like h (LSTM), else None
    gates: [T, B, S*H] per-step saved columns, S = cells.Cell.saved_gates:
           LSTM i, f, g, o (activated); GRU r, z, n (activated) and W_hn h + b_hn;
           None for RNN (its derivative is a function of h[t+1] itself)
    """

    x: np.ndarray
    h: np.ndarray
    c: np.ndarray | None
    gates: np.ndarray | None


@dataclass
class Cache:
    """Everything ``backward`` needs from ``forward``: the cell name, one LayerCache per layer."""

    cell: str
    layers: list[LayerCache]
    dtype: str = "float32"   # the precision whose rounding points the forward had

    def sequences(self):
        """Every layer's states after each step, stacked: (h [L, T, B, H], c [L, T, B, H] or
        None, gates [L, T, B, S*H] or None) -- what a whole-stack kernel writes."""
        def stacked(name):
            arrays = [getattr(lc, name) for lc in self.layers]
            if arrays[0] is None:
                return None
            return np.stack([a if name == "gates" else a[1:] for a in arrays])
        return stacked("h"), stacked("c"), stacked("gates")


# --------------------------------------------------------------------------- helpers

def _sigmoid(a):
    """Logistic sigmoid written through tanh: 1/(1+exp(-a)) overflows exp for a << 0,
    tanh does not, and the result stays in a's dtype."""
    return 0.5 * (1.0 + np.tanh(0.5 * a))


def require(cond: bool, msg: str):
    """Cheap precondition check; a ValueError (not assert) so ``python -O`` keeps it."""
    if not cond:
        raise ValueError(msg)


def require_shape(name: str, arr, shape: tuple):
    """Raise a ValueError naming ``name`` unless arr (any array) has exactly ``shape``."""
    require(tuple(arr.shape) == tuple(shape),
           f"reference: {name} has shape {tuple(arr.shape)}, expected {tuple(shape)}")


def layer_params(cell: str, params: list[dict], layer: int, in_size: int, hidden: int, dtype):
    """Layer ``layer``'s (W [G*H, I_l], R [G*H, H], b_ih [G*H] | None, b_hh [G*H] | None),
    shape-checked and cast to ``dtype`` (no copy when it already matches)."""
    g = get_cell(cell).gates
    p = params[layer]
    require(set(p) == set(PARAM_KEYS),
           f"reference: params[{layer}] keys {sorted(p)}, expected {sorted(PARAM_KEYS)}")
    require((p["bias_ih"] is None) == (p["bias_hh"] is None),
           f"reference: params[{layer}]: bias_ih and bias_hh must both be arrays or both None")
    w = np.asarray(p["weight_ih"], dtype=dtype)
    r = np.asarray(p["weight_hh"], dtype=dtype)
    require_shape(f"params[{layer}]['weight_ih']", w, (g * hidden, in_size))
    require_shape(f"params[{layer}]['weight_hh']", r, (g * hidden, hidden))
    if p["bias_ih"] is None:
        return w, r, None, None
    b_ih = np.asarray(p["bias_ih"], dtype=dtype)
    b_hh = np.asarray(p["bias_hh"], dtype=dtype)
    require_shape(f"params[{layer}]['bias_ih']", b_ih, (g * hidden,))
    require_shape(f"params[{layer}]['bias_hh']", b_hh, (g * hidden,))
    return w, r, b_ih, b_hh


def _sizes(params: list[dict], x):
    """(L, T, B, I, H) from params and x [T, B, I]; H is read off layer 0's weight_hh."""
    require(x.ndim == 3, f"reference: x must be [T, B, I] (time-major), got shape {x.shape}")
    require(np.issubdtype(x.dtype, np.floating), f"reference: x must be floating, got {x.dtype}")
    require(len(params) >= 1, "reference: params must hold one dict per layer, got none")
    t, b, i = x.shape
    hidden = np.shape(params[0]["weight_hh"])[1]
    return len(params), t, b, i, hidden


# --------------------------------------------------------------------------- cell steps
# Forward step: (gi [B,G*H], gh [B,G*H], h [B,H], c [B,H] | None) -> (h' [B,H], c' | None,
#   saved [B,S*H] | None). gi = W x + b_ih and gh = R h + b_hh are the two affine maps.
# Backward step: (saved, h, c, h', c', dh' [B,H], dc' [B,H] | None) ->
#   (dgi [B,G*H], dgh [B,G*H], dh_direct [B,H] | None, dc [B,H] | None), where dgi / dgh are
#   the loss gradients w.r.t. gi / gh, dh_direct the gradient reaching h other than through
#   gh (GRU's z*h term), dc the gradient w.r.t. the previous cell state (LSTM).

def lstm_step(gi, gh, h, c):
    """LSTM step. gi, gh [B, 4H]; h, c [B, H] -> (h' [B, H], c' [B, H], i|f|g|o [B, 4H])."""
    a = gi + gh
    i, f, g, o = np.split(a, 4, axis=1)
    i, f, g, o = _sigmoid(i), _sigmoid(f), np.tanh(g), _sigmoid(o)
    c_new = f * c + i * g
    h_new = o * np.tanh(c_new)
    return h_new, c_new, np.concatenate([i, f, g, o], axis=1)


def lstm_step_backward(saved, h, c, h_new, c_new, dh_new, dc_new):
    """saved i|f|g|o [B, 4H]; c, c', dh', dc' [B, H] -> (dgi, dgh [B, 4H], None, dc [B, H])."""
    i, f, g, o = np.split(saved, 4, axis=1)
    tc = np.tanh(c_new)
    # c' reaches the loss both directly (dc' from the next step / c_n) and through h'.
    dc_total = dc_new + dh_new * o * (1.0 - tc * tc)
    da = np.concatenate([
        dc_total * g * i * (1.0 - i),      # i: sigmoid' = i(1-i)
        dc_total * c * f * (1.0 - f),      # f
        dc_total * i * (1.0 - g * g),      # g: tanh' = 1-g^2
        dh_new * tc * o * (1.0 - o),       # o
    ], axis=1)
    # gi and gh enter as a plain sum, so both get the same gradient.
    return da, da, None, dc_total * f


def gru_step(gi, gh, h, c):
    """GRU step. gi, gh [B, 3H]; h [B, H]; c unused -> (h' [B, H], None, r|z|n|gh_n [B, 4H])."""
    gi_r, gi_z, gi_n = np.split(gi, 3, axis=1)
    gh_r, gh_z, gh_n = np.split(gh, 3, axis=1)
    r = _sigmoid(gi_r + gh_r)
    z = _sigmoid(gi_z + gh_z)
    # gh_n = W_hn h + b_hn is scaled by r *after* its bias (torch's GRU, not the paper's);
    # it is saved because the backward of r needs it.
    n = np.tanh(gi_n + r * gh_n)
    h_new = (1.0 - z) * n + z * h
    return h_new, None, np.concatenate([r, z, n, gh_n], axis=1)


def gru_step_backward(saved, h, c, h_new, c_new, dh_new, dc_new):
    """saved r|z|n|gh_n [B, 4H]; h, dh' [B, H] -> (dgi, dgh [B, 3H], z*dh' [B, H], None)."""
    r, z, n, gh_n = np.split(saved, 4, axis=1)
    dn_pre = dh_new * (1.0 - z) * (1.0 - n * n)       # through tanh into gi_n + r*gh_n
    dr_pre = dn_pre * gh_n * r * (1.0 - r)
    dz_pre = dh_new * (h - n) * z * (1.0 - z)
    dgi = np.concatenate([dr_pre, dz_pre, dn_pre], axis=1)
    dgh = np.concatenate([dr_pre, dz_pre, dn_pre * r], axis=1)
    return dgi, dgh, dh_new * z, None


def rnn_tanh_step(gi, gh, h, c):
    """tanh RNN step. gi, gh [B, H]; h, c unused -> (h' [B, H], None, None)."""
    return np.tanh(gi + gh), None, None


def rnn_tanh_step_backward(saved, h, c, h_new, c_new, dh_new, dc_new):
    """h', dh' [B, H] -> (dgi, dgh [B, H], None, None); tanh' = 1 - h'^2 needs nothing saved."""
    da = dh_new * (1.0 - h_new * h_new)
    return da, da, None, None


def rnn_relu_step(gi, gh, h, c):
    """ReLU RNN step. gi, gh [B, H]; h, c unused -> (h' [B, H], None, None)."""
    return np.maximum(gi + gh, 0.0), None, None


def rnn_relu_step_backward(saved, h, c, h_new, c_new, dh_new, dc_new):
    """h', dh' [B, H] -> (dgi, dgh [B, H], None, None); the mask h' > 0 needs nothing saved."""
    # relu'(0) = 0, torch's convention (its mask is h' > 0).
    da = dh_new * (h_new > 0)
    return da, da, None, None


# cell name -> (forward step, backward step)
STEPS = {
    "lstm": (lstm_step, lstm_step_backward),
    "gru": (gru_step, gru_step_backward),
    "rnn_tanh": (rnn_tanh_step, rnn_tanh_step_backward),
    "rnn_relu": (rnn_relu_step, rnn_relu_step_backward),
}


# --------------------------------------------------------------------------- forward

def forward(cell: str, params: list[dict], x, h0=None, c0=None, dtype: str = "float32"):
    """Run the stacked RNN forward. -> (y, h_n, c_n, cache)

    cell:   'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'
    params: one dict per layer l with 'weight_ih' [G*H, I_l], 'weight_hh' [G*H, H],
            'bias_ih' [G*H] | None, 'bias_hh' [G*H] | None (I_l = I for l = 0, else H)
    x:      [T, B, I] time-major input; sets the compute dtype
    h0:     [L, B, H] initial hidden state, or None for zeros
    c0:     [L, B, H] initial cell state (LSTM only), or None for zeros
    dtype:  the precision (rnnrt.precision.DTYPES) whose storage rounding to apply (the
            module's docstring says where); 'float32' / 'tf32': none

    Returns y [T, B, H] (last layer's h at every step), h_n [L, B, H], c_n [L, B, H]
    (None unless LSTM), and a ``Cache`` for ``backward``.
    """
    spec = get_cell(cell)
    step, _ = STEPS[spec.name]
    prec = get_precision(dtype).name
    store = partial(round_to_storage, dtype=prec)   # a store's rounding
    op = partial(gemm_operand, dtype=prec)          # what a GEMM reads (tf32: rounded)
    x = np.asarray(x)
    num_layers, steps, batch, in_size, hidden = _sizes(params, x)
    dtype = x.dtype
    x = store(x)   # the caller's x itself where nothing rounds

    h0 = np.zeros((num_layers, batch, hidden), dtype) if h0 is None else np.asarray(h0, dtype)
    require_shape("h0", h0, (num_layers, batch, hidden))
    if spec.has_cell_state:
        c0 = np.zeros((num_layers, batch, hidden), dtype) if c0 is None else np.asarray(c0, dtype)
        require_shape("c0", c0, (num_layers, batch, hidden))
    else:
        require(c0 is None, f"reference: c0 given, but {cell} has no cell state")

    layers = []
    inp = x
    for layer in range(num_layers):
        i_l = layer_input_size(layer, in_size, hidden)
        w, r, b_ih, b_hh = layer_params(cell, params, layer, i_l, hidden, dtype)
        w, r = store(w), store(r)
        wg, rg = op(w), op(r)
        h = np.empty((steps + 1, batch, hidden), dtype)
        h[0] = store(h0[layer])
        c = None
        if spec.has_cell_state:
            c = np.empty((steps + 1, batch, hidden), dtype)
            c[0] = c0[layer]
        gates = (np.empty((steps, batch, spec.saved_gates * hidden), dtype)
                 if spec.saved_gates else None)
        gis = (op(inp).reshape(steps * batch, i_l) @ wg.T).reshape(steps, batch, -1)
        if b_ih is not None:
            gis += b_ih
        for t in range(steps):
            gh = op(h[t]) @ rg.T
            if b_hh is not None:
                gh += b_hh
            h_new, c_new, saved = step(gis[t], gh, h[t], None if c is None else c[t])
            h[t + 1] = store(h_new)
            if c is not None:
                c[t + 1] = c_new
            if gates is not None:
                gates[t] = saved
        del gis   # (not alive beside the next layer's)
        layers.append(LayerCache(x=inp, h=h, c=c, gates=gates))
        inp = h[1:]  # the next layer's input is this layer's output sequence

    # Copies, so a caller writing into y / h_n / c_n cannot corrupt the cache.
    y = layers[-1].h[1:].copy()
    h_n = np.stack([lc.h[steps] for lc in layers])
    c_n = np.stack([lc.c[steps] for lc in layers]) if spec.has_cell_state else None
    return y, h_n, c_n, Cache(cell=spec.name, layers=layers, dtype=prec)


# --------------------------------------------------------------------------- backward

def backward(cell: str, params: list[dict], cache: Cache, dy, dh_n=None, dc_n=None,
             dtype: str | None = None):
    """Backprop through time of ``forward``. -> dict(dx, dh0, dc0, params)

    cell:   as given to forward
    params: as given to forward (same arrays)
    cache:  the Cache forward returned
    dy:     [T, B, H] loss gradient w.r.t. y
    dh_n:   [L, B, H] loss gradient w.r.t. h_n, or None for zeros
    dc_n:   [L, B, H] loss gradient w.r.t. c_n (LSTM only), or None for zeros
    dtype:  the precision whose rounding points to apply (the module's docstring); None:
            the forward's (``cache.dtype``), which a given one must equal

    Returns dx [T, B, I], dh0 [L, B, H], dc0 [L, B, H] (None unless LSTM), and params: one
    dict per layer with the keys of ``params`` holding gradients of the same shapes (None
    where the parameter is None).
    """
    spec = get_cell(cell)
    _, step_backward = STEPS[spec.name]
    require(cache.cell == spec.name,
           f"reference: cache is from a {cache.cell} forward, backward asked for {spec.name}")
    prec = cache.dtype if dtype is None else get_precision(dtype).name
    require(prec == cache.dtype, f"reference: dtype {prec!r}, but the cache is from a "
                                 f"{cache.dtype!r} forward")
    store = partial(round_to_storage, dtype=prec)   # a store's rounding
    op = partial(gemm_operand, dtype=prec)          # what a GEMM reads (tf32: rounded)
    num_layers = len(cache.layers)
    require(len(params) == num_layers,
           f"reference: {len(params)} param dicts, but the cache has {num_layers} layers")
    top = cache.layers[-1]
    steps, batch, hidden = top.h.shape[0] - 1, top.h.shape[1], top.h.shape[2]
    dtype = top.h.dtype

    dy = np.asarray(dy, dtype)
    require_shape("dy", dy, (steps, batch, hidden))
    state_shape = (num_layers, batch, hidden)
    dh_n = np.zeros(state_shape, dtype) if dh_n is None else np.asarray(dh_n, dtype)
    require_shape("dh_n", dh_n, state_shape)
    if spec.has_cell_state:
        dc_n = np.zeros(state_shape, dtype) if dc_n is None else np.asarray(dc_n, dtype)
        require_shape("dc_n", dc_n, state_shape)
    else:
        require(dc_n is None, f"reference: dc_n given, but {cell} has no cell state")

    dh0 = np.empty(state_shape, dtype)
    dc0 = np.empty(state_shape, dtype) if spec.has_cell_state else None
    grads = [None] * num_layers
    dout = dy  # loss gradient w.r.t. the current layer's output sequence h[1:]
    for layer in reversed(range(num_layers)):
        lc = cache.layers[layer]
        in_size = lc.x.shape[2]
        w, r, b_ih, b_hh = layer_params(cell, params, layer, in_size, hidden, dtype)
        w, r = store(w), store(r)
        wg, rg = op(w), op(r)
        gates = r.shape[0]
        dgis = np.empty((steps, batch, gates), dtype)   # every step's, as the GEMMs read them
        dghs = np.empty((steps, batch, gates), dtype)

        # dh / dc carry the gradient w.r.t. h[t+1] / c[t+1] arriving from step t+1.
        dh = dh_n[layer].copy()
        dc = dc_n[layer].copy() if spec.has_cell_state else None
        for t in reversed(range(steps)):
            dh_new = dout[t] + dh  # h[t+1] feeds both the output (or layer above) and step t+1
            dgi, dgh, dh_direct, dc = step_backward(
                None if lc.gates is None else lc.gates[t],
                lc.h[t], None if lc.c is None else lc.c[t],
                lc.h[t + 1], None if lc.c is None else lc.c[t + 1],
                dh_new, dc)
            dgis[t], dghs[t] = op(store(dgi)), op(store(dgh))   # stored for the GEMMs
            dh = dghs[t] @ rg   # gh = h R^T + b_hh: dh_{t-1} = dgh R, the recurrence
            if dh_direct is not None:
                dh = dh + dh_direct
        # gi = x W^T + b_ih and gh = h R^T + b_hh, every step at once: the same two affine
        # backward steps; the bias sums over the batch and the steps (GEMMs with ones)
        rows = steps * batch
        dgis, dghs = dgis.reshape(rows, gates), dghs.reshape(rows, gates)
        dx = (dgis @ wg).reshape(steps, batch, in_size)
        dw = dgis.T @ op(lc.x).reshape(rows, in_size)
        dr = dghs.T @ op(lc.h[:steps]).reshape(rows, hidden)
        db_ih = None if b_ih is None else dgis.sum(axis=0)
        db_hh = None if b_hh is None else dghs.sum(axis=0)
        del dgis, dghs   # (not alive beside the next layer's)
        dh0[layer] = dh
        if dc0 is not None:
            dc0[layer] = dc
        grads[layer] = {"weight_ih": dw, "weight_hh": dr, "bias_ih": db_ih, "bias_hh": db_hh}
        dout = dx  # this layer's input is the layer below's output

    return {"dx": dout, "dh0": dh0, "dc0": dc0, "params": grads}
