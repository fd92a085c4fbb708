"""Input checks shared by the CPU (NumPy reference) and GPU (CuPy) paths.

Every check runs before any work is done or any state is touched, so a bad call leaves the
model, its buffers and any caches exactly as they were. Errors name the argument, say what
was expected and what was given:

  TypeError   not an array (a Python list, a torch tensor, None where one is required),
              or an array of the wrong dtype (integer, bool, complex, or a float dtype
              other than the model's — nothing is cast silently, as in torch)
  ValueError  wrong rank or shape, empty sequence or batch, a batch that disagrees between
              x and the states, a cell state given to a cell that has none

Arrays are duck-typed: anything with ``.ndim``, ``.shape`` and a NumPy-compatible ``.dtype``
passes the type check, so NumPy and CuPy arrays are both accepted and nothing is copied
to or from the device. Python lists and tuples are rejected (asking for an array) rather
than converted, since a conversion would pick its own dtype and, on the GPU path, copy.

NaN and Inf values are *not* checked: scanning every input would cost a full pass over x
(and a device synchronisation on the GPU) on every call. They propagate through the
arithmetic like any other value — a NaN in x at step t makes that batch column NaN in
every later step and layer, and in the gradients.

``config`` below is anything with the attributes ``cell_name`` (or ``cell`` with a
``.name``), ``input_size``, ``hidden_size``, ``num_layers``, ``batch_first`` and ``dtype``:
an ``rnnrt.models.RNNBase`` is one.
"""
from __future__ import annotations

import numpy as np

from .cells import get_cell


def _cell_name(config) -> str:
    name = getattr(config, "cell_name", None)
    if name is None:
        name = config.cell.name
    return name


def _kind_word(cell: str) -> str:
    """'LSTM', 'GRU', 'RNN' (for messages)."""
    return get_cell(cell).mode.split("_")[0]


def check_flag(name: str, value) -> bool:
    """``value`` as a bool when it is one (Python's or NumPy's); TypeError naming ``name``
    otherwise: a string such as 'no' is truthy and would silently mean True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {value!r} "
                        f"of type {type(value).__name__}")
    return bool(value)


def array_dtype(name: str, a) -> np.dtype:
    """The NumPy dtype of array ``a`` (NumPy or CuPy), or TypeError naming ``name`` when ``a``
    is not an array: a list, a scalar, or an array type whose dtype NumPy cannot read
    (a torch tensor)."""
    if isinstance(a, (list, tuple)):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got a Python "
                        f"{type(a).__name__}; convert it first, e.g. np.asarray({name}, "
                        f"dtype=np.float32)")
    if not all(hasattr(a, attr) for attr in ("ndim", "shape", "dtype")):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(a).__name__}")
    try:
        return np.dtype(a.dtype)
    except TypeError:
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(a).__name__} "
                        f"with dtype {a.dtype} (a torch tensor? pass t.numpy())") from None


def check_dtype(name: str, a, dtype) -> None:
    """TypeError unless array ``a`` has exactly ``dtype`` (the model's float32 or float64).

    a: NumPy or CuPy array of any shape.
    """
    got = array_dtype(name, a)
    want = np.dtype(dtype)
    if got.kind != "f":
        what = {"b": "bool", "i": "integer", "u": "unsigned integer",
                "c": "complex"}.get(got.kind, "non-floating")
        raise TypeError(f"{name}: expected a floating array of the model's dtype {want}, got "
                        f"{what} dtype {got}; cast it with {name}.astype(np.{want})")
    if got != want:
        raise TypeError(f"{name}: dtype {got} does not match the model's dtype {want}; cast "
                        f"it with {name}.astype(np.{want}) (nothing is cast implicitly)")


def _shape_str(a) -> str:
    return str(tuple(int(d) for d in a.shape))


def _check_state(name: str, a, num_layers: int, batch: int, hidden: int, dtype) -> None:
    """Check a state or state gradient ``a`` [num_layers, B, H] against the model and x."""
    check_dtype(name, a, dtype)
    want = (num_layers, batch, hidden)
    if a.ndim != 3:
        raise ValueError(f"{name}: expected 3 dimensions [num_layers, B, H] = {want}, got "
                         f"{a.ndim} with shape {_shape_str(a)}")
    got = tuple(int(d) for d in a.shape)
    if got[0] != num_layers:
        raise ValueError(f"{name}: expected num_layers = {num_layers} in [num_layers, B, H] "
                         f"= {want}, got shape {got}")
    if got[1] != batch:
        raise ValueError(f"{name}: batch {got[1]} does not match x's batch {batch}; expected "
                         f"[num_layers, B, H] = {want} (states are [num_layers, B, H] even "
                         f"with batch_first)")
    if got[2] != hidden:
        raise ValueError(f"{name}: expected hidden size {hidden} in [num_layers, B, H] = "
                         f"{want}, got shape {got}")


def _check_no_cell_state(name: str, cell: str, a) -> None:
    if a is not None and not get_cell(cell).has_cell_state:
        raise ValueError(f"{name}: a {_kind_word(cell)} has no cell state, so {name} must be "
                         f"None (only LSTM takes a cell state)")


def split_hx(config, hx, name: str = "hx"):
    """torch's state argument -> (h, c), for a forward's hx or a backward's dhx.

    hx: LSTM: a tuple (h, c) (a list is accepted too), each [num_layers, B, H] or None;
        GRU / RNN: one [num_layers, B, H] array; None for zeros everywhere.
    -> (h, c), c None unless LSTM. Shapes are checked later by check_forward_inputs /
    check_backward_inputs; here only the structure is (TypeError naming ``name``).
    """
    if hx is None:
        return None, None
    cell = _cell_name(config)
    if get_cell(cell).has_cell_state:
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{name}: an LSTM takes a tuple (h, c) of [num_layers, B, H] "
                            f"arrays (either may be None), got {type(hx).__name__}")
        return hx[0], hx[1]
    if isinstance(hx, (tuple, list)):
        raise TypeError(f"{name}: a {_kind_word(cell)} takes one [num_layers, B, H] array "
                        f"(it has no cell state), got a {type(hx).__name__}")
    return hx, None


def check_forward_inputs(config, x, h0=None, c0=None) -> tuple[int, int]:
    """Check a forward call's inputs against ``config``; -> (T, B).

    config: the model (or any object with its attributes; see the module docstring)
    x:      [T, B, I] time-major, or [B, T, I] when config.batch_first; the model's dtype
    h0:     [num_layers, B, H] or None (zeros); the model's dtype
    c0:     [num_layers, B, H] or None (zeros); LSTM only — any other cell must pass None

    Raises TypeError / ValueError as listed in the module docstring; values (NaN, Inf) are
    not inspected.
    """
    layout = "[B, T, I]" if config.batch_first else "[T, B, I]"
    check_dtype("x", x, config.dtype)
    if x.ndim != 3:
        raise ValueError(f"x: expected 3 dimensions {layout}"
                         f"{' (batch_first=True)' if config.batch_first else ' (time-major)'}, "
                         f"got {x.ndim} with shape {_shape_str(x)}")
    d0, d1, size = (int(d) for d in x.shape)
    steps, batch = (d1, d0) if config.batch_first else (d0, d1)
    if size != config.input_size:
        raise ValueError(f"x: expected input size {config.input_size} (the last dimension of "
                         f"{layout}), got shape {_shape_str(x)}")
    if steps == 0:
        raise ValueError(f"x: empty sequence (T = 0 in {layout}, shape {_shape_str(x)}); "
                         f"expected at least one step")
    if batch == 0:
        raise ValueError(f"x: empty batch (B = 0 in {layout}, shape {_shape_str(x)}); "
                         f"expected at least one sequence")
    _check_pair(config, batch, ("h0", h0), ("c0", c0))
    return steps, batch


def check_backward_inputs(config, steps: int, batch: int, dy, dh_n=None, dc_n=None) -> None:
    """Check a backward call's output gradients against ``config`` and the forward's (T, B).

    config: as for check_forward_inputs
    steps, batch: T and B of the forward this backward belongs to
    dy:     [T, B, H] (or [B, T, H] when config.batch_first), the gradient w.r.t. y, or None
            (y does not reach the loss: zeros)
    dh_n:   [num_layers, B, H] or None (zeros)
    dc_n:   [num_layers, B, H] or None (zeros); LSTM only

    All in the model's dtype. Raises TypeError / ValueError as listed in the module
    docstring; values are not inspected.
    """
    hidden = config.hidden_size
    if dy is not None:
        check_dtype("dy", dy, config.dtype)
        if config.batch_first:
            want, layout = (batch, steps, hidden), "[B, T, H] (batch_first=True)"
        else:
            want, layout = (steps, batch, hidden), "[T, B, H] (time-major)"
        got = tuple(int(d) for d in dy.shape)
        if got != want:
            raise ValueError(f"dy: expected the shape of y, {layout} = {want}, got {got}")
    _check_pair(config, batch, ("dh_n", dh_n), ("dc_n", dc_n))


def check_packed_inputs(config, x, batch_sizes, h0=None, c0=None) -> tuple[int, ...]:
    """Check a forward call on packed sequences against ``config``; -> batch_sizes as
    ``plan.packing.check_pattern``'s tuple of Python ints (checked once: what the caller
    hands on needs no check again).

    x:           [N, I] packed (torch's PackedSequence layout: step t's rows after step
                 t-1's), N = sum(batch_sizes); the model's dtype
    batch_sizes: [T] ints, non-increasing, >= 1 (sequences sorted longest first)
    h0, c0:      [num_layers, B, H] or None, B = batch_sizes[0], in the packed (sorted)
                 order; c0 for LSTM only

    Raises ValueError / TypeError naming the argument (batch_first does not apply: packed
    data has no batch dimension).
    """
    from .plan.packing import check_pattern
    bs = check_pattern(batch_sizes)
    check_dtype("x", x, config.dtype)
    n = sum(bs)
    if x.ndim != 2 or tuple(int(d) for d in x.shape) != (n, config.input_size):
        raise ValueError(f"x: expected packed [N, I] = ({n}, {config.input_size}) (N = "
                         f"sum(batch_sizes)), got shape {_shape_str(x)}")
    _check_pair(config, bs[0], ("h0", h0), ("c0", c0))
    return bs


def check_packed_backward_inputs(config, rows: int, batch: int, dy, dh_n=None,
                                 dc_n=None) -> None:
    """Check a backward call on packed sequences: dy [rows, H] (like the forward's packed
    y) or None; dh_n, dc_n [num_layers, batch, H] or None (dc_n LSTM only)."""
    if dy is not None:
        check_dtype("dy", dy, config.dtype)
        want = (rows, config.hidden_size)
        if tuple(int(d) for d in dy.shape) != want:
            raise ValueError(f"dy: expected the shape of the packed y, {want}, got "
                             f"{_shape_str(dy)}")
    _check_pair(config, batch, ("dh_n", dh_n), ("dc_n", dc_n))


def _check_pair(config, batch: int, h, c) -> None:
    """A state pair (or its gradients): h = (name, [num_layers, batch, H] or None), c likewise
    (LSTM only: another cell must pass None)."""
    _check_no_cell_state(c[0], _cell_name(config), c[1])
    for name, a in (h, c):
        if a is not None:
            _check_state(name, a, config.num_layers, batch, config.hidden_size, config.dtype)
