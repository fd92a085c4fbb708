"""Stacked LSTM / GRU / RNN models with PyTorch's parameter names, shapes and conventions.

A model owns one flat parameter buffer (``params.py`` documents its layout) and exposes
torch-named views into it: ``model.weight_ih_l0``, ``named_parameters()``, ``state_dict()``.
Its ``forward`` / ``backward`` are the NumPy reference (``reference.py``); the GPU paths
take the same model and read the same buffer.

    >>> m = LSTM(10, 20, num_layers=2, seed=0)
    >>> x = np.zeros((5, 3, 10), np.float32)          # [T, B, I]
    >>> y, (h_n, c_n), tape = m(x, train=True)         # y [5, 3, 20], h_n, c_n [2, 3, 20]
    >>> g = m.backward(tape, np.ones_like(y))          # g.dx [5, 3, 10], g.params, g.flat

What matches torch.nn.LSTM / GRU / RNN: constructor arguments (no dropout, no
bidirectional, no proj_size), parameter names, shapes, order and gate order, the
initialisation distribution, the return structure of forward, batch_first (x and y only;
states stay [num_layers, B, H]). A torch state_dict turned into NumPy arrays loads, and ours
loads into torch (``tests/core/test_core_models.py`` checks outputs and gradients against torch).
What differs: parameters are NumPy views, not tensors; gradients come from an explicit
``backward(tape, dy)`` rather than autograd; a training forward is ``forward(x, train=True)``.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .cells import Cell, backward_flops, forward_flops, get_cell
from .params import ParamLayout, positive_int, make_layout, per_layer, to_flat, views
from .sizes import check_model, check_reference
from .validate import check_backward_inputs, check_flag, check_forward_inputs, split_hx

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# torch's mode strings -> our cell names; 'RNN' is resolved through nonlinearity.
_MODES = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}
_NONLINEARITIES = {"tanh": "rnn_tanh", "relu": "rnn_relu"}

LoadResult = namedtuple("LoadResult", ["missing_keys", "unexpected_keys"])
"""What ``load_state_dict(strict=False)`` skipped (like torch's return value)."""


class StateDictError(ValueError):
    """A state_dict that cannot be loaded. The message lists every offending key with what
    was expected; ``problems`` holds the same lines. Nothing was copied."""

    def __init__(self, model_name: str, problems: list[str]):
        self.problems = list(problems)
        super().__init__(f"{model_name}.load_state_dict: {len(problems)} problem(s), nothing "
                         f"was loaded:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class Tape:
    """What a training forward hands to ``backward``.

    It is self-contained: the parameters and x are snapshot at forward time, so writing into
    the model's weights or into x between forward and backward does not change the gradients
    (they are those of the forward that ran). A tape can be used for several backwards.

    cell_name:  the cell that ran
    layout:     the model's ParamLayout (backward checks the tape is from a model like it)
    batch_first: whether x / y / dy / dx are [B, T, ...]
    steps, batch: T and B
    params:     the parameters used: per-layer dicts (reference's format) of views into
                ``flat``, a [layout.size] copy of the model's buffer
    cache:      reference.Cache (holds x [T, B, I] time-major and the per-step activations)
    dtype:      the dtype it was computed in (backward refuses a tape of another dtype)
    device:     where its arrays live: 'cpu' (backward refuses a tape of another device)
    """

    cell_name: str
    layout: ParamLayout
    batch_first: bool
    steps: int
    batch: int
    flat: np.ndarray
    params: list
    cache: Any
    dtype: np.dtype = np.dtype(np.float32)
    device: str = "cpu"


@dataclass(frozen=True)
class Grads:
    """Gradients from ``backward``.

    dx:     [T, B, I] (or [B, T, I] when batch_first), w.r.t. x
    dh0:    [num_layers, B, H] w.r.t. the initial hidden state
    dc0:    [num_layers, B, H] w.r.t. the initial cell state (LSTM), else None
    flat:   [layout.size] all parameter gradients in the model's flat layout, zero padding
    params: torch name -> gradient, views into ``flat`` with each parameter's shape
    """

    dx: np.ndarray
    dh0: np.ndarray
    dc0: np.ndarray | None
    flat: np.ndarray
    params: dict[str, np.ndarray]


def _numpy_only(**arrays):
    """TypeError for any non-NumPy array: this is the CPU reference path (validation has
    already accepted the array's shape and dtype, so it is a CuPy array or similar)."""
    for name, a in arrays.items():
        if a is not None and not isinstance(a, np.ndarray):
            raise TypeError(f"{name}: the model's forward/backward is the NumPy reference and "
                            f"takes NumPy arrays, got {type(a).__module__}."
                            f"{type(a).__name__}; copy it to the host first (a.get() for CuPy)")


def _model_dtype(dtype) -> np.dtype:
    # dtype=None is refused explicitly: np.dtype(None) is float64, which would hide a bug.
    try:
        d = None if dtype is None else np.dtype(dtype)
    except TypeError:
        d = None
    if d is None or not any(d == ok for ok in _DTYPES):
        raise TypeError(f"dtype: expected np.float32 or np.float64, got {dtype!r}")
    return d


def _resolve_cell(mode, nonlinearity) -> str:
    """torch's (mode, nonlinearity) -> our cell name, with errors naming the argument."""
    if not isinstance(mode, str):
        raise TypeError(f"mode: expected one of 'LSTM', 'GRU', 'RNN', 'RNN_TANH', 'RNN_RELU', "
                        f"got {mode!r}")
    m = mode.upper()
    if m == "RNN":
        nl = "tanh" if nonlinearity is None else nonlinearity
        if not isinstance(nl, str) or nl not in _NONLINEARITIES:
            raise ValueError(f"nonlinearity: expected 'tanh' or 'relu', got {nonlinearity!r}")
        return _NONLINEARITIES[nl]
    if m not in _MODES:
        raise ValueError(f"mode: expected one of 'LSTM', 'GRU', 'RNN', 'RNN_TANH', 'RNN_RELU', "
                         f"got {mode!r}")
    cell = _MODES[m]
    if nonlinearity is not None:
        if cell in ("lstm", "gru"):
            raise ValueError(f"nonlinearity: only a plain RNN takes one, got {nonlinearity!r} "
                             f"for mode {mode!r}")
        if not isinstance(nonlinearity, str) or _NONLINEARITIES.get(nonlinearity) != cell:
            raise ValueError(f"nonlinearity: {nonlinearity!r} contradicts mode {mode!r}")
    return cell


class RNNBase:
    """A stacked recurrent network whose parameters live in one flat buffer.

    mode:        'LSTM', 'GRU', 'RNN' (with nonlinearity), 'RNN_TANH' or 'RNN_RELU' (torch's)
    input_size:  I, features per step of x
    hidden_size: H, features of every layer's state
    num_layers:  L, stacked layers (layer l > 0 reads layer l-1's outputs)
    bias:        whether the layers have bias_ih / bias_hh
    batch_first: x and y are [B, T, *] instead of [T, B, *] (states stay [L, B, H])
    dtype:       np.float32 or np.float64; parameters, inputs and outputs all have it
    seed:        anything np.random.default_rng takes; same seed -> same weights
    nonlinearity: 'tanh' or 'relu' for mode 'RNN'; None otherwise

    Every parameter starts uniform in [-1/sqrt(H), 1/sqrt(H)], as in torch, drawn in
    torch's parameter order from ``np.random.default_rng(seed)`` (so the values are
    reproducible here, but not equal to torch's for the same seed).

    Configuration attributes are read-only after construction (the buffer and its layout
    depend on them): build a new model and ``load_state_dict`` to change one. Parameters are
    written in place: ``model.weight_ih_l0[...] = w``, ``model.flat[:] = other.flat``.
    """

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dtype=np.float32, seed=None, nonlinearity=None):
        cell = _resolve_cell(mode, nonlinearity)
        input_size = positive_int("input_size", input_size)
        hidden_size = positive_int("hidden_size", hidden_size)
        num_layers = positive_int("num_layers", num_layers)
        bias = check_flag("bias", bias)
        batch_first = check_flag("batch_first", batch_first)
        dtype = _model_dtype(dtype)
        # before the layout (a loop over layers) and the buffer: a size that cannot fit is
        # refused at once, naming the need and the host's memory (sizes.py)
        check_model(cell, input_size, hidden_size, num_layers, bias, dtype.itemsize)
        rng = np.random.default_rng(seed)

        d = self.__dict__  # plain dict writes: __setattr__ refuses public names (see below)
        d["cell"] = get_cell(cell)
        d["cell_name"] = cell
        d["input_size"] = input_size
        d["hidden_size"] = hidden_size
        d["num_layers"] = num_layers
        d["bias"] = bias
        d["batch_first"] = batch_first
        d["dtype"] = dtype
        d["layout"] = layout = make_layout(cell, input_size, hidden_size, num_layers, bias)
        d["flat"] = flat = np.zeros(layout.size, dtype)  # zeros: the padding stays zero
        bound = 1.0 / np.sqrt(hidden_size)
        for view in views(flat, layout).values():
            # Drawn in float64 and rounded, so float32 and float64 models of one seed agree
            # to float32 precision.
            view[...] = rng.uniform(-bound, bound, size=view.shape)

    # ----------------------------------------------------------------- parameters

    cell: Cell
    cell_name: str
    input_size: int
    hidden_size: int
    num_layers: int
    bias: bool
    batch_first: bool
    dtype: np.dtype
    layout: ParamLayout
    flat: np.ndarray  # [layout.size] the one buffer every parameter lives in

    def __getattr__(self, name):
        # Only reached when normal lookup fails: torch-style `model.weight_ih_l0`.
        layout = self.__dict__.get("layout")
        if layout is not None and not name.startswith("_"):
            for e in layout.entries:
                if e.name == name:
                    return self.flat[e.offset:e.end].reshape(e.shape)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name, value):
        layout = self.__dict__.get("layout")
        if layout is not None and name in layout.names():
            raise AttributeError(f"{name}: parameters are views into the flat buffer and "
                                 f"cannot be rebound; write in place, model.{name}[...] = "
                                 f"value, or use load_state_dict")
        if not name.startswith("_"):
            raise AttributeError(f"{name}: a {type(self).__name__}'s attributes are fixed at "
                                 f"construction; build a new model (and load_state_dict)")
        super().__setattr__(name, value)

    def named_parameters(self) -> dict[str, np.ndarray]:
        """Torch name -> view into ``flat`` (writing a view writes the model), torch's order."""
        return views(self.flat, self.layout)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Torch name -> a copy of that parameter, in torch's key order."""
        return {name: v.copy() for name, v in self.named_parameters().items()}

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, *,
                        allow_nonfinite: bool = False) -> LoadResult:
        """Copy parameters from ``state_dict`` (torch name -> array of that parameter's shape).

        A torch state_dict with its tensors turned into NumPy arrays (``t.numpy()``) loads
        as is. Values:
          - any real floating dtype (float16/32/64) is accepted and rounded to the model's
            dtype, as torch's load does (a float64 dict into a float32 model rounds);
            integer, bool, complex and object arrays are rejected — they mean a wrong key
            or a wrong file, not weights.
          - NaN / Inf are rejected unless ``allow_nonfinite``: weights that are not finite
            are almost always a diverged run, and loading is rare enough to scan.
        strict: missing and unexpected keys are errors (True), or skipped and returned
            (False). Shapes and dtypes are checked either way.

        Everything is checked before anything is copied: on any problem a StateDictError
        (a ValueError) lists every offending key and what was expected, and the model is
        unchanged. -> LoadResult(missing_keys, unexpected_keys).
        """
        strict = check_flag("strict", strict)
        allow_nonfinite = check_flag("allow_nonfinite", allow_nonfinite)
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict: expected a mapping of parameter name -> array, got "
                            f"{type(state_dict).__name__}")
        params = self.named_parameters()
        missing = [k for k in params if k not in state_dict]
        unexpected = [k for k in state_dict if k not in params]
        problems = []
        if strict:
            problems += [f"missing key {k!r}: expected an array of shape "
                         f"{params[k].shape}" for k in missing]
            problems += [f"unexpected key {k!r}: this {self!r} has only "
                         f"{list(params)}" for k in unexpected]
        values = {}
        for k, dest in params.items():
            if k not in state_dict:
                continue
            v = state_dict[k]
            try:
                a = np.asarray(v)
            except Exception as exc:  # e.g. a CuPy array refuses implicit conversion
                problems.append(f"{k!r}: cannot be read as a NumPy array ({type(v).__name__}: "
                                f"{exc}); pass NumPy arrays (t.numpy() for torch, a.get() "
                                f"for CuPy)")
                continue
            if a.dtype.kind != "f":
                problems.append(f"{k!r}: dtype {a.dtype}, expected a floating dtype (it is "
                                f"rounded to the model's {self.dtype})")
                continue
            if a.shape != dest.shape:
                problems.append(f"{k!r}: shape {a.shape}, expected {dest.shape}")
                continue
            if not allow_nonfinite and not np.all(np.isfinite(a)):
                problems.append(f"{k!r}: {int(np.sum(~np.isfinite(a)))} non-finite value(s) "
                                f"(NaN/Inf); pass allow_nonfinite=True to load them anyway")
                continue
            values[k] = a
        if problems:
            raise StateDictError(type(self).__name__, problems)
        # Only now write: every value is a float array of the right shape, so no copy fails.
        for k, a in values.items():
            params[k][...] = a
        return LoadResult(missing if not strict else [], unexpected if not strict else [])

    # ----------------------------------------------------------------- forward / backward

    def forward(self, x, hx=None, *, train: bool = False):
        """Run the network (NumPy reference).

        x:     [T, B, I] (time-major) or [B, T, I] (batch_first), the model's dtype
        hx:    LSTM: (h0, c0), each [num_layers, B, H] or None (zeros), or None;
               GRU / RNN: h0 [num_layers, B, H] or None (zeros)
        train: also return a Tape for ``backward``

        -> LSTM: (y, (h_n, c_n)); GRU / RNN: (y, h_n); plus the Tape when train.
           y [T, B, H] (or [B, T, H] when batch_first), h_n / c_n [num_layers, B, H].

        Inputs are checked first (``validate.check_forward_inputs``); NaN / Inf values are
        not checked and propagate into y and the states.
        """
        from . import reference  # lazily: models and layouts are usable without it

        train = check_flag("train", train)
        h0, c0 = split_hx(self, hx, "hx")
        steps, batch = check_forward_inputs(self, x, h0, c0)
        _numpy_only(x=x, h0=h0, c0=c0)
        check_reference(self.cell_name, self.input_size, self.hidden_size, self.num_layers,
                        batch, steps, self.dtype.itemsize, "train" if train else "forward")
        x_tm = x.transpose(1, 0, 2) if self.batch_first else x
        if train:
            # Snapshots, so the tape's gradients belong to this forward even if the caller
            # then writes into x or the weights (the cache holds x by reference).
            flat = self.flat.copy()
            x_tm = np.array(x_tm, copy=True)
        else:
            flat = self.flat
        params = per_layer(flat, self.layout)
        y, h_n, c_n, cache = reference.forward(self.cell_name, params, x_tm, h0, c0)
        if self.batch_first:
            y = np.ascontiguousarray(y.transpose(1, 0, 2))
        out = (y, (h_n, c_n)) if self.cell.has_cell_state else (y, h_n)
        if not train:
            return out
        return out + (Tape(self.cell_name, self.layout, self.batch_first, steps, batch,
                           flat, params, cache, self.dtype, "cpu"),)

    __call__ = forward

    def backward(self, tape: Tape, dy, dhx=None) -> Grads:
        """Backprop through time of the forward that produced ``tape``.

        tape: from ``forward(..., train=True)`` on this model (or one of the same layout)
        dy:   like y: [T, B, H] or [B, T, H] (batch_first); None if y does not reach the loss
        dhx:  like hx: LSTM (dh_n, dc_n), either None; GRU / RNN dh_n; [num_layers, B, H]
        -> Grads (dx in x's layout, dh0, dc0, parameter gradients by name and flat).
        """
        from . import reference

        if not isinstance(tape, Tape):
            raise TypeError(f"tape: expected the Tape from forward(x, train=True), got "
                            f"{type(tape).__name__}")
        if tape.layout != self.layout or tape.batch_first != self.batch_first:
            raise ValueError("tape: it comes from a model with a different configuration "
                             "(layout or batch_first) than this one")
        if tape.device != "cpu":
            raise ValueError(f"tape: it holds arrays on {tape.device!r}; this model's backward "
                             f"is the NumPy reference (cpu)")
        if np.dtype(tape.dtype) != self.dtype or np.dtype(tape.flat.dtype) != self.dtype:
            raise TypeError(f"tape: it was recorded by a {np.dtype(tape.dtype)} model, this "
                            f"model is {self.dtype}; run backward on the model that made it")
        dh_n, dc_n = split_hx(self, dhx, "dhx")
        check_backward_inputs(self, tape.steps, tape.batch, dy, dh_n, dc_n)
        _numpy_only(dy=dy, dh_n=dh_n, dc_n=dc_n)
        check_reference(self.cell_name, self.input_size, self.hidden_size, self.num_layers,
                        tape.batch, tape.steps, self.dtype.itemsize, "backward")
        if dy is None:
            dy_tm = np.zeros((tape.steps, tape.batch, self.hidden_size), self.dtype)
        else:
            dy_tm = dy.transpose(1, 0, 2) if self.batch_first else dy
        g = reference.backward(self.cell_name, tape.params, tape.cache, dy_tm, dh_n, dc_n)

        flat = to_flat(g["params"], self.layout, self.dtype)  # padding stays zero
        dx = g["dx"]
        if self.batch_first:
            dx = np.ascontiguousarray(dx.transpose(1, 0, 2))
        return Grads(dx=dx, dh0=g["dh0"], dc0=g["dc0"], flat=flat,
                     params=views(flat, self.layout))

    # ----------------------------------------------------------------- misc

    def flops(self, batch: int, steps: int, backward: bool = False) -> int:
        """GEMM FLOPs of one forward pass (or, with backward=True, of one backward pass
        alone: 2x the forward) over ``steps`` steps of ``batch`` sequences; the paper's
        convention (``cells.forward_flops``)."""
        f = backward_flops if check_flag("backward", backward) else forward_flops
        return f(self.cell_name, self.input_size, self.hidden_size, self.num_layers,
                 batch, steps)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.cell_name == "rnn_relu":
            s += ", nonlinearity='relu'"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dtype != np.float32:
            s += f", dtype=np.{self.dtype}"
        return s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"


class LSTM(RNNBase):
    """torch.nn.LSTM's equivalent (gates i, f, g, o). See RNNBase for the arguments."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dtype=np.float32, seed=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dtype, seed)


class GRU(RNNBase):
    """torch.nn.GRU's equivalent (gates r, z, n). See RNNBase for the arguments."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dtype=np.float32, seed=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dtype, seed)


class RNN(RNNBase):
    """torch.nn.RNN's equivalent: nonlinearity 'tanh' (cell 'rnn_tanh') or 'relu'
    ('rnn_relu'). See RNNBase for the other arguments."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dtype=np.float32, seed=None):
        if not isinstance(nonlinearity, str) or nonlinearity not in _NONLINEARITIES:
            raise ValueError(f"nonlinearity: expected 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN", input_size, hidden_size, num_layers, bias, batch_first,
                         dtype, seed, nonlinearity=nonlinearity)
