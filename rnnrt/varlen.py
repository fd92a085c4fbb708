"""Plain NumPy forward and backward of a stacked RNN over *packed* variable-length sequences,
scheduled as cuDNN schedules them: a per-step active batch.

This is ``reference.py``'s math (the same cell step functions, the same torch conventions)
on a different data layout, so that sequences of different lengths cost what their real
steps cost. It is what ``rnnrt.nn`` runs for CPU tensors, and the schedule a GPU packed path
is to reproduce (and is checked against).

Layout -- exactly torch's ``PackedSequence``:

  batch_sizes [T]    non-increasing; ``batch_sizes[t]`` sequences are active at step t. The
                     sequences are sorted by length, longest first, so the active ones at
                     any step are always a prefix 0 .. batch_sizes[t]-1 of the batch, and
                     sequence b's length is the number of steps with batch_sizes[t] > b.
  x      [N, I]      N = sum(batch_sizes); step t's rows are x[off[t] : off[t] + bs[t]],
                     off[t] = bs[0] + ... + bs[t-1]; row off[t] + b is sequence b at step t.
  y      [N, H]      the top layer's h, laid out like x.
  h0, c0 [L, B, H]   B = batch_sizes[0], in that sorted order.
  h_n, c_n [L, B, H] each sequence's state after its own last step.

A plain (padded, equal-length) batch x [T, B, I] is the special case batch_sizes = [B]*T
with x reshaped to [T*B, I] (a view): there is one path.

No arithmetic touches padding (there is none): the input affine map W x + b_ih is one GEMM
over the N real rows of a layer, the recurrent one runs on the bs[t] active rows of step t,
and a finished sequence's state simply stops being updated, which makes it its h_n.

Reverse direction (``reverse=True``, a bidirectional layer's second half): the steps run
T-1 .. 0. A sequence of length len_b first becomes active at step len_b - 1 -- its own end,
not the padded end -- starting from its h0 row, and its h_n is its state after step 0.
The running state is one [B, H] array either way: in forward order rows that finished keep
their last state; in reverse order rows not yet started still hold their h0.

Everything is computed in x's dtype (float32 or float64). ``dtype`` (rnnrt/precision.py)
adds the storage rounding at reference.py's points: x, W, R, h0, each step's h as it is made,
and in the backward the gate gradients before anything reads them. Speed is not a goal beyond what
the layout gives for free; the activations a backward needs are kept explicitly (h and c
before and after every step), trading memory for plainness.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from .cells import get_cell, layer_input_size
from .precision import gemm_operand, get_precision, round_to_storage
from .reference import STEPS, layer_params, require, require_shape


# --------------------------------------------------------------------------- schedule

def check_batch_sizes(batch_sizes, rows: int | None = None, min_rows: int = 0,
                      name: str = "batch_sizes") -> np.ndarray:
    """``batch_sizes`` as an int64 [T] NumPy array, checked: 1-D integers (no bools, no
    floats), T >= 1, every entry >= ``min_rows`` (0: none negative, the reference allows
    empty steps; 1: every step has an active row, as a plan needs), non-increasing and, if
    ``rows`` is given, summing to it. ValueError naming ``name`` and what is wrong. The one
    check of a packed schedule (plan/packing.py check_pattern is this with min_rows=1).

    batch_sizes: [T] integers: a tuple, a list, a NumPy array or a CPU tensor
    rows:        the packed arrays' first dimension N, or None to skip that check
    """
    # (the messages are built only on failure: a passing check of T steps costs ~20 us)
    try:
        bs = np.asarray(batch_sizes)
    except (TypeError, ValueError):   # ragged, or nothing NumPy can read
        raise ValueError(f"{name}: expected a 1-D sequence of ints, got {batch_sizes!r}") \
            from None
    if bs.ndim != 1 or bs.shape[0] < 1:
        raise ValueError(f"{name}: expected at least one step, a 1-D array of ints, got shape "
                         f"{bs.shape}")
    if bs.dtype.kind not in "iu" or (isinstance(batch_sizes, (list, tuple))
                                     and bool in map(type, batch_sizes)):
        raise ValueError(f"{name}: expected integers, got "
                         f"{'bools' if bs.dtype.kind in 'biu' else f'dtype {bs.dtype}'} in "
                         f"{bs.tolist()}")
    bs = bs.astype(np.int64, copy=False)
    if int(bs.min()) < min_rows:
        raise ValueError(f"{name}: every step needs at least one active row, got {bs.tolist()}"
                         if min_rows else f"{name}: negative entry in {bs.tolist()}")
    if not np.all(bs[1:] <= bs[:-1]):
        raise ValueError(f"{name}: expected non-increasing entries (sequences sorted by "
                         f"length, longest first), got {bs.tolist()}")
    if rows is not None and int(bs.sum()) != rows:
        raise ValueError(f"{name}: they sum to {int(bs.sum())}, but the packed input has "
                         f"{rows} rows")
    return bs


def offsets(batch_sizes: np.ndarray) -> np.ndarray:
    """off [T]: the first packed row of each step (exclusive prefix sum of batch_sizes [T])."""
    off = np.zeros_like(batch_sizes)
    np.cumsum(batch_sizes[:-1], out=off[1:])
    return off


def lengths(batch_sizes: np.ndarray) -> np.ndarray:
    """[B] each sequence's length, longest first, from batch_sizes [T] (B = batch_sizes[0]):
    sequence b is active at every step t with batch_sizes[t] > b."""
    b = np.arange(int(batch_sizes[0]))
    return (batch_sizes[None, :] > b[:, None]).sum(axis=1)


def _order(steps: int, reverse: bool) -> range:
    return range(steps - 1, -1, -1) if reverse else range(steps)


# --------------------------------------------------------------------------- cache

@dataclass
class LayerCache:
    """What one layer's training forward keeps for its backward (all packed like x: row
    off[t] + b is sequence b at step t).

    x:     [N, I_l] the layer's input: the caller's x for layer 0 (held, not copied), the
           layer below's y above it
    y:     [N, H] h after each step (the layer's output)
    hprev: [N, H] h before each step (h0's row at a sequence's first step)
    c:     [N, H] c after each step (LSTM), else None
    cprev: [N, H] c before each step (LSTM), else None
    gates: [N, S*H] the cell's saved columns (cells.Cell.saved_gates; LSTM i|f|g|o, GRU
           r|z|n|gh_n), None for RNN
    """

    x: np.ndarray
    y: np.ndarray
    hprev: np.ndarray
    c: np.ndarray | None
    cprev: np.ndarray | None
    gates: np.ndarray | None


@dataclass
class Cache:
    """Everything ``backward`` needs: the cell, the schedule (batch_sizes [T], reverse), the
    parameters as given to forward, and one LayerCache per layer."""

    cell: str
    batch_sizes: np.ndarray
    reverse: bool
    params: list
    layers: list
    dtype: str = "float32"   # the precision whose rounding points the forward had


# --------------------------------------------------------------------------- forward

def forward(cell: str, params: list[dict], x, batch_sizes, h0=None, c0=None, *,
            reverse: bool = False, train: bool = True, dtype: str = "float32"):
    """Run the stacked RNN over packed sequences. -> (y, h_n, c_n, cache)

    cell:        'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'
    params:      one dict per layer l: 'weight_ih' [G*H, I_l], 'weight_hh' [G*H, H],
                 'bias_ih' [G*H] | None, 'bias_hh' [G*H] | None (reference's format)
    x:           [N, I] packed input (module docstring), N = sum(batch_sizes); sets the dtype
    batch_sizes: [T] non-increasing integers, batch_sizes[0] = B
    h0:          [L, B, H] initial hidden state in the packed (sorted) order, None for zeros
    c0:          [L, B, H] initial cell state (LSTM only), None for zeros
    reverse:     run every layer from each sequence's own end back to its start
    train:       keep the activations for ``backward`` (cache); False keeps nothing
    dtype:       the precision whose storage rounding to apply (reference.py's points)

    Returns y [N, H] (the top layer's h, packed like x), h_n [L, B, H], c_n [L, B, H]
    (None unless LSTM) and a Cache (None when not train). y is held by the cache: writing
    into it before backward changes the gradients.
    """
    spec = get_cell(cell)
    step, _ = STEPS[spec.name]
    prec = get_precision(dtype).name
    store = partial(round_to_storage, dtype=prec)   # a store's rounding
    op = partial(gemm_operand, dtype=prec)          # what a GEMM reads (tf32: rounded)
    x = np.asarray(x)
    require(x.ndim == 2, f"varlen: x must be packed [N, I], got shape {x.shape}")
    require(x.dtype.kind == "f", f"varlen: x must be floating, got {x.dtype}")
    require(len(params) >= 1, "varlen: params must hold one dict per layer, got none")
    bs = check_batch_sizes(batch_sizes, x.shape[0])
    off = offsets(bs)
    num_layers, batch, in_size = len(params), int(bs[0]), x.shape[1]
    hidden = np.shape(params[0]["weight_hh"])[1]
    dtype = x.dtype
    state_shape = (num_layers, batch, hidden)
    x = store(x)   # the caller's x itself where nothing rounds

    h0 = np.zeros(state_shape, dtype) if h0 is None else np.asarray(h0, dtype)
    require_shape("h0", h0, state_shape)
    if spec.has_cell_state:
        c0 = np.zeros(state_shape, dtype) if c0 is None else np.asarray(c0, dtype)
        require_shape("c0", c0, state_shape)
    else:
        require(c0 is None, f"varlen: c0 given, but {cell} has no cell state")

    n = x.shape[0]
    h_n = np.empty(state_shape, dtype)
    c_n = np.empty(state_shape, dtype) if spec.has_cell_state else None
    cast_params, layers = [], []
    inp = x
    for layer in range(num_layers):
        w, r, b_ih, b_hh = layer_params(cell, params, layer,
                                         layer_input_size(layer, in_size, hidden), hidden,
                                         dtype)
        w, r = store(w), store(r)
        cast_params.append({"weight_ih": w, "weight_hh": r, "bias_ih": b_ih, "bias_hh": b_hh})
        # W x for every real row of the layer at once: padding never exists to be multiplied.
        gi_all = op(inp) @ op(w).T
        rg = op(r)
        if b_ih is not None:
            gi_all += b_ih
        h = store(h0[layer]).copy()  # running state [B, H]: rows < bs[t] are the active ones
        c = c0[layer].copy() if spec.has_cell_state else None
        y = np.empty((n, hidden), dtype)
        if train:
            hprev = np.empty((n, hidden), dtype)
            cs = np.empty((n, hidden), dtype) if c is not None else None
            cprev = np.empty((n, hidden), dtype) if c is not None else None
            gates = np.empty((n, spec.saved_gates * hidden), dtype) if spec.saved_gates else None
        for t in _order(len(bs), reverse):
            a, rows = int(bs[t]), slice(int(off[t]), int(off[t] + bs[t]))
            gh = op(h[:a]) @ rg.T
            if b_hh is not None:
                gh += b_hh
            h_new, c_new, saved = step(gi_all[rows], gh, h[:a], None if c is None else c[:a])
            h_new = store(h_new)
            if train:  # before h / c are overwritten: they are this step's "previous" state
                hprev[rows] = h[:a]
                if c is not None:
                    cprev[rows] = c[:a]
                    cs[rows] = c_new
                if gates is not None:
                    gates[rows] = saved
            h[:a] = h_new
            if c is not None:
                c[:a] = c_new
            y[rows] = h_new
        # Rows stop being written after their sequence's last step (forward order) or were
        # last written at step 0 (reverse order): either way h is each sequence's own h_n.
        h_n[layer] = h
        if c_n is not None:
            c_n[layer] = c
        if train:
            layers.append(LayerCache(x=inp, y=y, hprev=hprev, c=cs, cprev=cprev, gates=gates))
        inp = y
    cache = Cache(spec.name, bs, bool(reverse), cast_params, layers, prec) if train else None
    return inp, h_n, c_n, cache


# --------------------------------------------------------------------------- backward

def backward(cache: Cache, dy=None, dh_n=None, dc_n=None, *, need_dx: bool = True,
             need_params: bool = True):
    """Backprop through time of ``forward(..., train=True)``. -> dict(dx, dh0, dc0, params)

    cache:  the Cache forward returned
    dy:     [N, H] loss gradient w.r.t. y (packed), or None for zeros
    dh_n:   [L, B, H] loss gradient w.r.t. h_n, or None for zeros
    dc_n:   [L, B, H] loss gradient w.r.t. c_n (LSTM only), or None for zeros
    need_dx: compute dx (False: the bottom layer's input GEMM is skipped, dx is None)
    need_params: compute the parameter gradients (False: their GEMMs are skipped, params
            is None); the data gradients do not depend on them

    Returns dx [N, I] (packed like x) | None, dh0 [L, B, H], dc0 [L, B, H] (None unless
    LSTM) and params: one dict per layer with reference's keys, gradients of the same shapes
    (None where the parameter is None) | None.
    """
    require(isinstance(cache, Cache), f"varlen: cache must be the Cache of forward(train=True), "
                                     f"got {type(cache).__name__}")
    store = partial(round_to_storage, dtype=cache.dtype)   # the forward's precision
    op = partial(gemm_operand, dtype=cache.dtype)          # what a GEMM reads (tf32: rounded)
    spec = get_cell(cache.cell)
    _, step_backward = STEPS[spec.name]
    bs, off = cache.batch_sizes, offsets(cache.batch_sizes)
    num_layers = len(cache.layers)
    top = cache.layers[-1]
    n, hidden = top.y.shape
    batch, dtype = int(bs[0]), top.y.dtype
    state_shape = (num_layers, batch, hidden)

    dy = np.zeros((n, hidden), dtype) if dy is None else np.asarray(dy, dtype)
    require_shape("dy", dy, (n, hidden))
    dh_n = np.zeros(state_shape, dtype) if dh_n is None else np.asarray(dh_n, dtype)
    require_shape("dh_n", dh_n, state_shape)
    if spec.has_cell_state:
        dc_n = np.zeros(state_shape, dtype) if dc_n is None else np.asarray(dc_n, dtype)
        require_shape("dc_n", dc_n, state_shape)
    else:
        require(dc_n is None, f"varlen: dc_n given, but {spec.name} has no cell state")

    dh0 = np.empty(state_shape, dtype)
    dc0 = np.empty(state_shape, dtype) if spec.has_cell_state else None
    grads = [None] * num_layers
    # GRU's gradients w.r.t. gi and gh differ (gh_n is scaled by r); the other cells' two
    # affine maps enter as a plain sum, so one array serves both.
    separate_gh = spec.name == "gru"
    dout = dy  # loss gradient w.r.t. the current layer's output y
    for layer in reversed(range(num_layers)):
        lc, p = cache.layers[layer], cache.params[layer]
        w, r = p["weight_ih"], p["weight_hh"]
        rg = op(r)
        dgi_all = np.empty((n, w.shape[0]), dtype)
        dgh_all = np.empty((n, w.shape[0]), dtype) if separate_gh else dgi_all
        # Running gradients w.r.t. the state [B, H]: a row is seeded by dh_n at its last
        # processed step (untouched until then) and ends as dh0 after its first.
        dh = dh_n[layer].copy()
        dc = dc_n[layer].copy() if spec.has_cell_state else None
        for t in reversed(_order(len(bs), cache.reverse)):
            a, rows = int(bs[t]), slice(int(off[t]), int(off[t] + bs[t]))
            dh_new = dout[rows] + dh[:a]  # y feeds the layer above (or the loss) and step t+1
            dgi, dgh, dh_direct, dc_prev = step_backward(
                None if lc.gates is None else lc.gates[rows], lc.hprev[rows],
                None if lc.cprev is None else lc.cprev[rows], lc.y[rows],
                None if lc.c is None else lc.c[rows], dh_new, None if dc is None else dc[:a])
            dgi, dgh = store(dgi), store(dgh)   # stored for the GEMMs that read them
            dgi_all[rows] = dgi
            if separate_gh:
                dgh_all[rows] = dgh
            dh_prev = op(dgh) @ rg
            if dh_direct is not None:
                dh_prev += dh_direct
            dh[:a] = dh_prev
            if dc is not None:
                dc[:a] = dc_prev
        dh0[layer] = dh
        if dc0 is not None:
            dc0[layer] = dc
        if need_params:
            # The weight gradients over all steps as one GEMM each, on the real rows only.
            gi, gh = op(dgi_all), op(dgh_all)
            grads[layer] = {
                "weight_ih": gi.T @ op(lc.x), "weight_hh": gh.T @ op(lc.hprev),
                "bias_ih": None if p["bias_ih"] is None else gi.sum(axis=0),
                "bias_hh": None if p["bias_hh"] is None else gh.sum(axis=0)}
        dout = op(dgi_all) @ op(w) if (layer > 0 or need_dx) else None
    return {"dx": dout, "dh0": dh0, "dc0": dc0, "params": grads if need_params else None}
