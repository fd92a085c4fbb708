"""The flat parameter buffer: one 1-D array holding every weight and bias of a stacked RNN,
with torch-named views into it.

All of a model's parameters live in one buffer so that a GPU copy is one allocation and one
transfer, gradients can be accumulated, zeroed and reduced as one array, and every GEMM reads
its weight matrix straight out of the buffer (no per-step gathers). This is what cuDNN does
with its flat weight space; torch re-packs its per-tensor parameters into one for the same
reason. The *order* and *names* here are torch's (``torch.nn.LSTM._flat_weights_names``), so a
torch ``state_dict`` maps onto it one key per entry.

Layout (L layers, G gates — ``cells.Cell.gates``: LSTM 4, GRU 3, RNN 1 —, hidden H,
I_l = input_size for layer 0 and H above it). Arrays are row-major; the gate blocks inside
each matrix / bias are stacked in torch's order (``cells.Cell.gate_names``):

    =================  ============  ==============  ==========================================
    entry              shape         elements        offset (elements into the flat buffer)
    =================  ============  ==============  ==========================================
    weight_ih_l{l}     [G*H, I_l]    G*H*I_l         align(end of the previous entry)
    weight_hh_l{l}     [G*H, H]      G*H*H           align(end of weight_ih_l{l})
    bias_ih_l{l}       [G*H]         G*H             align(end of weight_hh_l{l})   (bias only)
    bias_hh_l{l}       [G*H]         G*H             align(end of bias_ih_l{l})     (bias only)
    =================  ============  ==============  ==========================================

    repeated for l = 0 .. L-1 in that order; the first entry is at offset 0.
    align(n) = n rounded up to a multiple of ALIGN = 64 elements;
    size = align(end of the last entry).

Why 64 elements: the GPU GEMMs read these views in place, and cuBLAS picks faster
(vectorised) kernels when every matrix pointer is aligned; 64 elements is 256 bytes for
float32 (512 for float64), the alignment cudaMalloc itself guarantees, so every view is
exactly as aligned as a fresh allocation would be. ``size`` is rounded up too, so buffers
laid end to end (a gradient buffer beside the weights, one per model) stay aligned.
The gaps between entries are padding: they are zero-filled, never read by any op, and a
gradient buffer in this layout has zeros there as well.

Nothing here depends on NumPy beyond building the layout: ``views`` and ``per_layer`` only
slice and reshape, so they work unchanged on a CuPy array (duck-typed).
"""
from __future__ import annotations

import numpy as np

import operator
from dataclasses import dataclass

from .cells import get_cell, layer_input_size

ALIGN = 64
"""Every entry's offset (and the buffer's size) is a multiple of this many elements."""

KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
"""Parameter kinds of one layer, in torch's order."""


def align(n: int) -> int:
    """``n`` rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class ParamEntry:
    """One parameter in the flat buffer.

    name:   torch's name, e.g. 'weight_ih_l0'
    layer:  the layer it belongs to (0 = the one reading the model input)
    kind:   'weight_ih', 'weight_hh', 'bias_ih' or 'bias_hh'
    offset: elements from the start of the flat buffer (a multiple of ALIGN)
    shape:  its shape ([G*H, I_l], [G*H, H] or [G*H])
    """

    name: str
    layer: int
    kind: str
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements (the product of ``shape``)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def end(self) -> int:
        """One past its last element in the flat buffer."""
        return self.offset + self.numel


@dataclass(frozen=True)
class ParamLayout:
    """Where every parameter of a model lives in its flat buffer (see the module docstring).

    cell:        'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'
    input_size, hidden_size, num_layers, bias: the model's configuration
    entries:     ParamEntry per parameter, in torch's order (per layer: weight_ih,
                 weight_hh, then bias_ih, bias_hh when bias)
    size:        elements of the flat buffer, padding included
    """

    cell: str
    input_size: int
    hidden_size: int
    num_layers: int
    bias: bool
    entries: tuple[ParamEntry, ...]
    size: int

    def names(self) -> tuple[str, ...]:
        """Torch's parameter names, in torch's order (= a torch state_dict's key order)."""
        return tuple(e.name for e in self.entries)

    def entry(self, name: str) -> ParamEntry:
        """The entry called ``name`` (e.g. 'weight_hh_l1'); KeyError listing the valid names."""
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"no parameter {name!r} in this {self.cell} layout; "
                       f"expected one of {list(self.names())}")

    def layer(self, layer: int) -> dict[str, ParamEntry]:
        """Layer ``layer``'s entries as kind -> ParamEntry (no bias kinds when bias=False)."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer: expected 0 <= layer < {self.num_layers}, got {layer}")
        return {e.kind: e for e in self.entries if e.layer == layer}


def positive_int(name: str, value) -> int:
    """``value`` as an int if it is a positive integer (not a bool); ValueError/TypeError
    naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a positive integer, got the bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected a positive integer, got {value!r} "
                        f"of type {type(value).__name__}") from None
    if v < 1:
        raise ValueError(f"{name}: expected a positive integer, got {v}")
    return v


def make_layout(cell: str, input_size: int, hidden_size: int, num_layers: int,
                bias: bool) -> ParamLayout:
    """The flat-buffer layout of a ``cell`` model (table in the module docstring).

    cell: 'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'; the sizes are positive integers.
    """
    spec = get_cell(cell)
    input_size = positive_int("input_size", input_size)
    hidden_size = positive_int("hidden_size", hidden_size)
    num_layers = positive_int("num_layers", num_layers)
    bias = bool(bias)
    rows = spec.gates * hidden_size
    entries = []
    end = 0
    for layer in range(num_layers):
        shapes = {
            "weight_ih": (rows, layer_input_size(layer, input_size, hidden_size)),
            "weight_hh": (rows, hidden_size),
        }
        if bias:
            shapes["bias_ih"] = (rows,)
            shapes["bias_hh"] = (rows,)
        for kind, shape in shapes.items():
            e = ParamEntry(f"{kind}_l{layer}", layer, kind, align(end), shape)
            entries.append(e)
            end = e.end
    return ParamLayout(spec.name, input_size, hidden_size, num_layers, bias,
                       tuple(entries), align(end))


def _check_flat(flat, layout: ParamLayout):
    """Raise unless ``flat`` is a 1-D array of ``layout.size`` elements (NumPy or CuPy)."""
    shape = getattr(flat, "shape", None)
    if shape is None or not hasattr(flat, "reshape"):
        raise TypeError(f"flat: expected a 1-D NumPy or CuPy array, got {type(flat).__name__}")
    if tuple(shape) != (layout.size,):
        raise ValueError(f"flat: expected shape ({layout.size},) for this {layout.cell} layout, "
                         f"got {tuple(shape)}")
    flags = getattr(flat, "flags", None)
    # A strided buffer would make reshape copy, and the views would silently stop sharing it.
    if flags is not None and not flags.c_contiguous:
        raise ValueError("flat: expected a contiguous array (its views must share its memory), "
                         "got a strided one; pass flat.copy() or the original buffer")


def views(flat, layout: ParamLayout) -> dict:
    """Torch name -> view of that parameter inside ``flat``, in torch's order.

    flat: [layout.size] NumPy or CuPy array; the views share its memory (writing a view
          writes the buffer), since a 1-D slice of a contiguous array reshapes without a copy.
    """
    _check_flat(flat, layout)
    return {e.name: flat[e.offset:e.end].reshape(e.shape) for e in layout.entries}


def per_layer(flat, layout: ParamLayout) -> list[dict]:
    """The parameters in ``reference``'s format: one dict per layer, kind -> view into
    ``flat`` (kinds 'weight_ih', 'weight_hh', 'bias_ih', 'bias_hh'; the bias kinds are None
    when the layout has no biases).

    flat: [layout.size] NumPy or CuPy array (the views share its memory).
    """
    _check_flat(flat, layout)
    out = [dict.fromkeys(KINDS) for _ in range(layout.num_layers)]
    for e in layout.entries:
        out[e.layer][e.kind] = flat[e.offset:e.end].reshape(e.shape)
    return out


def to_flat(arrays, layout: ParamLayout, dtype=np.float64) -> np.ndarray:
    """The inverse of ``per_layer`` / ``views``: gather per-parameter arrays into a new
    [layout.size] NumPy buffer in ``layout`` (padding zero).

    arrays: ``reference``'s per-layer format (a list of dicts kind -> array or None, e.g. the
            gradients ``reference.backward`` returns), or a dict torch name -> array.
    """
    if isinstance(arrays, dict):
        named = arrays
    else:
        named = {f"{kind}_l{layer}": a for layer, d in enumerate(arrays)
                 for kind, a in d.items() if a is not None}
    flat = np.zeros(layout.size, dtype)
    for name, view in views(flat, layout).items():
        view[...] = np.asarray(named[name])
    return flat
