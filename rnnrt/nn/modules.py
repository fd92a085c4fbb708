"""``rnnrt.nn.LSTM``, ``GRU`` and ``RNN``: torch.nn.Module drop-ins for torch.nn's.

Same constructor arguments, parameter names, shapes, registration order and initialisation
as torch.nn (so ``torch.manual_seed(s)`` gives the same initial weights as torch.nn's module
and ``load_state_dict`` works both ways); same forward signature and return. The recurrence
itself runs through rnnrt's backend seam (``backend.py``), with rnnrt's backward
(``function.py``).

How a forward runs (``RNNBase.forward``): the arguments are checked and brought to torch's
packed layout (``inputs.prepare``; a plain [T, B, I] batch is packed data with batch_sizes
[B]*T), then

  - a unidirectional stack with no active dropout is ONE backend call for all layers;
  - otherwise each layer is one call per direction; a bidirectional layer's outputs are
    concatenated [forward, reverse] (torch's order) and, in training mode, torch's dropout
    (``torch.nn.functional.dropout``, torch's RNG on the module's device) is applied to every
    layer's output except the last one's;

and the packed output goes back to the caller's form (PackedSequence, padded [T, B, D*H],
batch_first, unbatched), h_n / c_n back to the caller's batch order.
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch
from torch.nn import Parameter, init
from torch.nn.utils.rnn import PackedSequence

from .flat import flatten
from .function import Call, run_call
from .inputs import prepare

_CELLS = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
_PROJ_RECOMPUTE = ("recompute: a module with proj_size > 0 (got proj_size={proj_size}) runs "
                   "torch's own LSTM, which has no recompute; use recompute=False")
_PROJ_WARNING = ("rnnrt.nn.LSTM(proj_size={proj_size}): rnnrt has no kernels for LSTM "
                 "projections; this module runs torch's own LSTM (cuDNN on CUDA): torch.nn's "
                 "results and speed, not rnnrt's (module.implementation == 'torch')")


class RNNBase(torch.nn.Module):
    """Shared by LSTM, GRU and RNN (torch.nn.RNNBase's arguments and attributes).

    mode: 'LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU'. The other arguments are torch.nn's:
    input_size I, hidden_size H, num_layers L, bias, batch_first, dropout (between layers,
    training mode only), bidirectional (D = 2 directions), proj_size (LSTM: P > 0 runs
    torch's own LSTM, ``implementation``), device, dtype; and rnnrt's own keyword ``recompute``
    (default False): on CUDA, the chunks of a training call longer than one chunk
    (rnnrt.chunked) keep no gates for the backward, which remakes them from h (and c): LSTM
    a third of the activations a step, GRU a fifth, for the forward's GEMMs again
    (rnnrt.plan.recompute); fp32 only (ValueError at the call under autocast or for 16-bit
    parameters); shorter calls, packed batches of different lengths and the CPU path run as
    without.

    Parameters, per layer l and direction (suffix '' or '_reverse'), registered in torch's
    order: weight_ih_l{l} [G*H, I_l] (I_l = I for l = 0, else D*P), weight_hh_l{l} [G*H, P],
    bias_ih_l{l} [G*H], bias_hh_l{l} [G*H] (with bias), weight_hr_l{l} [P, H] (proj_size P >
    0; else P = H and no weight_hr); all uniform(-1/sqrt(H), 1/sqrt(H)).
    """

    recompute = False   # (a module pickled before the keyword existed reads this)

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None, recompute=False):
        super().__init__()
        if mode not in _CELLS:
            raise ValueError(f"Unrecognized RNN mode: {mode}")
        # torch.nn.RNNBase's checks, in its order and with its exception types.
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout <= 1):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, "
                          f"so non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=3)
        for what, v in (("bias", bias), ("batch_first", batch_first),
                        ("recompute", recompute)):
            if not isinstance(v, bool):
                raise TypeError(f"{what} should be of type bool, got: {type(v).__name__}")
        for what, v in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(v, int):
                raise TypeError(f"{what} should be of type int, got: {type(v).__name__}")
            if v <= 0:
                raise ValueError(f"{what} must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size > 0 and recompute:
            raise ValueError(_PROJ_RECOMPUTE.format(proj_size=proj_size))
        if proj_size > 0:
            warnings.warn(_PROJ_WARNING.format(proj_size=proj_size), UserWarning, stacklevel=3)

        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        self.recompute = recompute
        factory = {"device": device, "dtype": dtype}
        gate_size = _GATES[mode] * hidden_size
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(self.num_directions):
                in_size = input_size if layer == 0 else self.out_size * self.num_directions
                suffix = "_reverse" if direction == 1 else ""
                shapes = [("weight_ih", (gate_size, in_size)),
                          ("weight_hh", (gate_size, self.out_size))]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes += [("weight_hr", (proj_size, hidden_size))]
                names = []
                for kind, shape in shapes:
                    n = f"{kind}_l{layer}{suffix}"
                    setattr(self, n, Parameter(torch.empty(shape, **factory)))
                    names.append(n)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    # ----------------------------------------------------------------- parameters

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def out_size(self) -> int:
        """The size of h (each step's output, h_0, h_n): proj_size where it is > 0, else
        hidden_size (torch.nn's ``real_hidden_size``)."""
        return self.proj_size if self.proj_size > 0 else self.hidden_size

    @property
    def implementation(self) -> str:
        """Which code runs the recurrence: 'rnnrt' (its backends: GpuRunner on CUDA, the
        NumPy reference on the CPU), or 'torch' for an LSTM with proj_size > 0 (torch's own
        LSTM, cuDNN on CUDA: rnnrt has no projection kernels; said by a warning at
        construction)."""
        return "torch" if self.proj_size > 0 else "rnnrt"

    @property
    def cell(self) -> str:
        """rnnrt's cell name: 'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'."""
        return _CELLS[self.mode]

    def reset_parameters(self) -> None:
        """Every parameter uniform(-1/sqrt(H), 1/sqrt(H)), drawn in registration order from
        torch's RNG -- torch.nn's procedure, so one seed gives torch.nn's initial values."""
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    @property
    def _flat_weights(self) -> list:
        """The parameters in torch's flat order, as torch.nn's attribute of that name holds
        them; looked up on each access, since they may be replaced (torch.func.functional_call,
        load_state_dict(assign=True), weight_norm)."""
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> list:
        """[L*D] lists of the parameters of each layer and direction (torch.nn's attribute)."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """On CUDA in float32: lay the parameters out in one flat buffer as rnnrt's GPU
        runs read them and make each a view of it (``flat.py``), so that the CUDA backend
        reads them in place, with no copy a call — as torch.nn compacts its weights for
        cuDNN here (nothing moves where they are laid out so already). Called by
        ``.cuda()`` / ``.to()``; after anything that replaces a
        parameter's storage (``load_state_dict(assign=True)``, ``p.data = ...``) the backend
        copies the parameters each call until this is called again. Elsewhere a no-op (the
        CPU path reads the parameters in place). A module that runs torch's LSTM
        (``implementation``) is compacted for cuDNN, by torch.nn's own method."""
        if self.implementation == "torch":
            torch.nn.RNNBase.flatten_parameters(self)
            return
        flatten(self)

    def _apply(self, fn, *args, **kwargs):
        # as torch.nn.RNNBase: after .cuda() / .to() / .float(), compact the parameters
        ret = super()._apply(fn, *args, **kwargs)
        self.flatten_parameters()
        return ret

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        if self.recompute:
            s += ", recompute=True"
        return s

    # ----------------------------------------------------------------- forward

    def _call(self, p, layers, direction, x, h0, c0):
        """One backend call over ``layers`` (consecutive) in ``direction`` (0 forward, 1
        reverse): x [N, I_l]; h0, c0 [len(layers), B, H] | None -> (y [N, H], h_n, c_n)."""
        names = [n for layer in layers for n in self._all_weights[layer * self.num_directions
                                                                 + direction]]
        call = Call(p.backend, self.cell, len(layers), self.bias, p.batch_sizes,
                    direction == 1, p.precision, self.recompute)
        return run_call(call, x, h0, c0, [getattr(self, n) for n in names])

    def _run_layers(self, p):
        """All layers over the packed data. -> (y [N, D*H], h_n [L*D, B, H], c_n or None)"""
        if self.implementation == "torch":
            return self._run_torch(p)
        L, D = self.num_layers, self.num_directions
        dropout = self.dropout if self.training else 0.0
        if D == 1 and (dropout == 0 or L == 1):
            return self._call(p, range(L), 0, p.data, p.h0, p.c0)  # the GPU's one plan

        def state(t, i):
            return None if t is None else t[i:i + 1]

        x, hs, cs = p.data, [], []
        for layer in range(L):
            ys = []
            for d in range(D):
                i = layer * D + d  # torch's h0 / h_n index of (layer, direction)
                y, h_n, c_n = self._call(p, [layer], d, x, state(p.h0, i), state(p.c0, i))
                ys.append(y)
                hs.append(h_n)
                cs.append(c_n)
            x = ys[0] if D == 1 else torch.cat(ys, dim=1)
            if dropout > 0 and layer < L - 1:
                x = torch.nn.functional.dropout(x, p=dropout, training=True)
        return x, torch.cat(hs, 0), (torch.cat(cs, 0) if self.mode == "LSTM" else None)

    def _run_torch(self, p):
        """torch's LSTM (``torch.lstm``, the op torch.nn.LSTM runs: cuDNN on CUDA, its
        autocast rules) over the checked call, on the caller's layout as torch.nn.LSTM
        passes it (so its results are torch.nn's bit for bit). -> (y [N, D*P] packed or
        time-major, h_n [L*D, B, P], c_n [L*D, B, H])"""
        LD, B = self.num_layers * self.num_directions, p.batch
        like = dict(dtype=p.data.dtype, device=p.data.device)
        h0 = p.h0 if p.h0 is not None else torch.zeros(LD, B, self.out_size, **like)
        c0 = p.c0 if p.c0 is not None else torch.zeros(LD, B, self.hidden_size, **like)
        args = ((h0, c0), self._flat_weights, self.bias, self.num_layers, self.dropout,
                self.training, self.bidirectional)
        if p.packed:
            return torch.lstm(p.data, p.batch_sizes_tensor, *args)
        x = p.data if p.batched else p.data.unsqueeze(0 if self.batch_first else 1)
        y, h_n, c_n = torch.lstm(x, *args, self.batch_first)
        if self.batch_first:
            y = y.transpose(0, 1)
        return y.reshape(p.steps * B, y.shape[-1]), h_n, c_n

    def forward(self, input, hx=None):
        """torch.nn's forward.

        input: [T, B, I] ([B, T, I] with batch_first), [T, I] unbatched, or a PackedSequence
               (data [N, I], e.g. from torch.nn.utils.rnn.pack_padded_sequence)
        hx:    LSTM (h_0, c_0), GRU / RNN h_0; each [L*D, B, H] ([L*D, H] unbatched) in the
               caller's batch order, or None for zeros
        -> (output, h_n) for GRU / RNN, (output, (h_n, c_n)) for LSTM. output is
           [T, B, D*H] ([B, T, D*H] with batch_first, [T, D*H] unbatched, zero past each
           sequence's end when padded back) or a PackedSequence like the input; h_n, c_n
           [L*D, B, H] ([L*D, H] unbatched), each sequence's state after its own last step.
        """
        if self.implementation == "torch" and self.recompute:   # (set after construction)
            raise ValueError(_PROJ_RECOMPUTE.format(proj_size=self.proj_size))
        p = prepare(self, input, hx)  # raises, before any work, on bad arguments
        y, h_n, c_n = self._run_layers(p)
        if p.packed:
            output = PackedSequence(y, p.batch_sizes_tensor, p.sorted_indices,
                                    p.unsorted_indices)
            if p.unsorted_indices is not None:  # back to the caller's batch order
                h_n = h_n.index_select(1, p.unsorted_indices)
                c_n = None if c_n is None else c_n.index_select(1, p.unsorted_indices)
        else:
            output = y.view(p.steps, p.batch, y.shape[-1])
            if not p.batched:
                output, h_n = output.squeeze(1), h_n.squeeze(1)
                c_n = None if c_n is None else c_n.squeeze(1)
            elif self.batch_first:
                output = output.transpose(0, 1).contiguous()  # contiguous, like torch.nn's
        return (output, (h_n, c_n)) if self.mode == "LSTM" else (output, h_n)


class LSTM(RNNBase):
    """torch.nn.LSTM's drop-in (gates i, f, g, o). Arguments as torch.nn.LSTM's:
    (input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0, device=None, dtype=None), and rnnrt's recompute=False
    (RNNBase); proj_size > 0 runs torch's own LSTM (warned at construction; ``implementation``).
    forward(input, (h_0, c_0)) -> output, (h_n, c_n)."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """torch.nn.GRU's drop-in (gates r, z, n). Arguments as torch.nn.GRU's: (input_size,
    hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None), and rnnrt's recompute=False (RNNBase).
    forward(input, h_0) -> output, h_n."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)


class RNN(RNNBase):
    """torch.nn.RNN's drop-in (Elman RNN, tanh or relu). Arguments as torch.nn.RNN's:
    (input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None), and
    rnnrt's recompute=False (RNNBase). forward(input, h_0) -> output, h_n."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        # torch.nn.RNN takes nonlinearity as the fourth positional argument.
        if len(args) > 3:
            nonlinearity, args = args[3], args[:3] + args[4:]
        else:
            nonlinearity = kwargs.pop("nonlinearity", "tanh")
        modes = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}
        if nonlinearity not in modes:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' "
                             f"or 'relu'.")
        super().__init__(modes[nonlinearity], *args, **kwargs)
        self.nonlinearity = nonlinearity
