"""A forward call's arguments, checked and brought to the one form the layers run on.

Every check runs before any work and nothing here writes into the caller's tensors, so a
bad call raises with the caller's input, states and the module's parameters untouched.
The errors are torch.nn's kinds (and, where torch's own is clear, its wording):

  ValueError          input not 2-D or 3-D; input dtype differs from the weights' dtype
  RuntimeError        input feature size, sequence length 0, hx rank or shape, hx dtype,
                      devices that differ (input / hidden / parameters), a PackedSequence
                      whose batch_sizes or indices are inconsistent with its data
  TypeError           input not a tensor or PackedSequence; hx of the wrong structure
  NotImplementedError a device or dtype with no rnnrt backend (backend.backend_for), or a
                      precision rnnrt.nn does not run there (nn/precision.py: CPU autocast)

Packed sequences are checked as far as the module can see them: pack_padded_sequence already
refused unsorted lengths (enforce_sorted=True) or lengths < 1; what reaches the module is
batch_sizes, which must be non-increasing, >= 1 and sum to the data's rows, and the
sorted/unsorted indices, which must be inverse permutations of the batch (their values are
checked on the CPU only: on CUDA it would cost a device synchronisation every call).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence

from .backend import backend_for
from .precision import CallPrecision, autocast_dtype, call_precision, check_autocast_inputs


@dataclass
class Prepared:
    """The checked forward call, in the packed form the layers run on.

    data:        [N, I] packed input (for a plain tensor: x time-major reshaped, [T*B, I]; for a
                 module that runs torch's LSTM, a plain tensor as the caller gave it)
    batch_sizes: [T] int64 NumPy array (host); batch_sizes[t] sequences active at step t
    batch_sizes_tensor: the same as a CPU int64 tensor (the caller's, for packed input)
    sorted_indices, unsorted_indices: [B] int64 tensors, or None (no permutation)
    h0, c0:      [L*D, B, H] in the packed (sorted) order, or None for zeros
    packed:      the input was a PackedSequence (the output will be one)
    batched:     False for an unbatched 2-D tensor (outputs lose the batch dimension)
    steps, batch: T and B
    backend:     the seam implementation for the input's device and dtype; None for a module
                 that runs torch's LSTM (proj_size > 0: modules.RNNBase.implementation)
    precision:   nn/precision.py's CallPrecision (autocast, or 16-bit parameters on CUDA), or
                 None for the plain path in the tensors' dtype
    """

    data: torch.Tensor
    batch_sizes: np.ndarray
    batch_sizes_tensor: torch.Tensor
    sorted_indices: torch.Tensor | None
    unsorted_indices: torch.Tensor | None
    h0: torch.Tensor | None
    c0: torch.Tensor | None
    packed: bool
    batched: bool
    steps: int
    batch: int
    backend: object
    precision: CallPrecision | None = None


def _split_hx(module, hx):
    """hx -> (h0, c0): LSTM a (h0, c0) tuple, GRU / RNN one tensor, each [L*D, B, H]
    ([L*D, H] unbatched; shapes are checked by ``prepare``); None for zeros. TypeError for
    any other structure."""
    name = type(module).__name__
    if hx is None:
        return None, None
    if module.mode == "LSTM":
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"hx: an LSTM takes a tuple (h_0, c_0) of tensors "
                            f"[num_layers * num_directions, B, hidden_size], got "
                            f"{type(hx).__name__}")
        h0, c0 = hx
        for what, t in (("hx[0]", h0), ("hx[1]", c0)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{what}: expected a tensor, got {type(t).__name__}")
        return h0, c0
    if not isinstance(hx, torch.Tensor):
        raise TypeError(f"hx: a {name} takes one tensor [num_layers * num_directions, B, "
                        f"hidden_size] (it has no cell state), got {type(hx).__name__}")
    return hx, None


def _check_packed(data, batch_sizes, sorted_indices, unsorted_indices) -> np.ndarray:
    """Raise RuntimeError unless the PackedSequence is consistent: data [N, I], batch_sizes
    [T] (int64, CPU, non-increasing, >= 1, summing to N), sorted_indices / unsorted_indices
    [B] (int64 on data's device, inverse permutations) or both None. -> batch_sizes [T]
    int64 NumPy (a copy)."""
    if (not isinstance(batch_sizes, torch.Tensor) or batch_sizes.dim() != 1
            or batch_sizes.dtype != torch.int64 or batch_sizes.device.type != "cpu"):
        raise RuntimeError("batch_sizes: expected a 1-D int64 CPU tensor, as "
                           "pack_padded_sequence makes it")
    bs = batch_sizes.numpy()
    if bs.shape[0] == 0:
        raise RuntimeError("batch_sizes: empty (a PackedSequence of zero steps)")
    if (bs < 1).any():
        raise RuntimeError(f"batch_sizes: every step needs at least one sequence (all "
                           f"lengths >= 1), got {bs.tolist()}")
    if (bs[1:] > bs[:-1]).any():
        raise RuntimeError(f"batch_sizes: expected non-increasing entries (sequences sorted "
                           f"by decreasing length), got {bs.tolist()}; build it with "
                           f"pack_padded_sequence / pack_sequence")
    if int(bs.sum()) != data.size(0):
        raise RuntimeError(f"batch_sizes: they sum to {int(bs.sum())}, but the packed data "
                           f"has {data.size(0)} rows")
    if (sorted_indices is None) != (unsorted_indices is None):
        raise RuntimeError("sorted_indices and unsorted_indices: expected both or neither")
    if sorted_indices is not None:
        batch = int(bs[0])
        for what, idx in (("sorted_indices", sorted_indices),
                          ("unsorted_indices", unsorted_indices)):
            if (not isinstance(idx, torch.Tensor) or idx.shape != (batch,)
                    or idx.dtype != torch.int64 or idx.device != data.device):
                raise RuntimeError(f"{what}: expected an int64 tensor of shape ({batch},) on "
                                   f"{data.device}, got {getattr(idx, 'shape', idx)}")
        # The values are checked where that costs no device synchronisation: on the CPU
        # (torch.nn checks them nowhere; pack_padded_sequence makes them right).
        if data.device.type == "cpu":
            ok = torch.equal(sorted_indices.sort().values, torch.arange(batch))
            if not ok or not torch.equal(sorted_indices[unsorted_indices], torch.arange(batch)):
                raise RuntimeError("sorted_indices / unsorted_indices: expected a permutation "
                                   "of the batch and its inverse")
    # A copy ([T] integers): the schedule a backward replays must not alias the caller's.
    return np.array(bs, dtype=np.int64)


def prepare(module, input, hx) -> Prepared:
    """Check ``module(input, hx)``'s arguments (module docstring) and bring them to the
    packed form. Nothing is computed before every check has passed.

    input: [T, B, I] ([B, T, I] with batch_first), [T, I] unbatched, or a PackedSequence
           whose data is [N, I]
    hx:    LSTM (h_0, c_0), GRU / RNN h_0: [L*D, B, H] ([L*D, H] for unbatched input), or None;
           an LSTM's h_0 is [L*D, B, P] where proj_size P > 0
    """
    name = type(module).__name__
    weights = module._flat_weights
    wdtype, wdevice = weights[0].dtype, weights[0].device
    for n, w in zip(module._flat_weights_names, weights):
        if w.dtype != wdtype or w.device != wdevice:
            raise RuntimeError(f"{n}: {w.dtype} on {w.device}, but "
                               f"{module._flat_weights_names[0]} is {wdtype} on {wdevice}; "
                               f"every parameter must share one dtype and device "
                               f"(module.to(...) converts them together)")
    h0, c0 = _split_hx(module, hx)
    states = [t for t in (h0, c0) if t is not None]

    sorted_indices = unsorted_indices = None
    if isinstance(input, PackedSequence):
        data, bs_tensor, sorted_indices, unsorted_indices = input
        packed, batched = True, True
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"input.data: expected a tensor, got {type(data).__name__}")
    elif isinstance(input, torch.Tensor):
        data, bs_tensor, packed = input, None, False
        if input.dim() not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}D "
                             f"instead")
        batched = input.dim() == 3
        want = 3 if batched else 2
        for what, t in zip(("hx", "cx"), states):
            if t.dim() != want:
                raise RuntimeError(f"For {'batched 3-D' if batched else 'unbatched 2-D'} "
                                   f"input, {what} should also be {want}-D but got "
                                   f"{t.dim()}-D tensor")
    else:
        raise TypeError(f"input: expected a tensor or a PackedSequence, got "
                        f"{type(input).__name__}")

    # the precision first: a refusal (CPU autocast, an autocast dtype rnnrt has not) comes
    # before anything else is looked at; under autocast the dtypes may differ (as torch.nn's).
    # A module that runs torch's LSTM (proj_size > 0) takes torch's rules: no rnnrt backend.
    rnnrt_runs = module.implementation == "rnnrt"
    if rnnrt_runs:
        precision = call_precision(data.device, wdtype)
        autocast = precision is not None and precision.autocast
    else:
        precision = None
        autocast = autocast_dtype(data.device.type) is not None
    if autocast and rnnrt_runs:
        check_autocast_inputs({"input": data, "hx[0]" if c0 is not None else "hx": h0,
                               "hx[1]": c0})
    # torch.nn.RNNBase.check_input, in its order.
    if data.dtype != wdtype and not autocast:
        raise ValueError(f"RNN input dtype ({data.dtype}) does not match weight dtype "
                         f"({wdtype}). Convert input: input.to({wdtype}), or convert model: "
                         f"model.to({data.dtype})")
    if packed and data.dim() != 2:
        raise RuntimeError(f"input must have 2 dimensions, got {data.dim()}")
    if data.size(-1) != module.input_size:
        raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                           f"{module.input_size}, got {data.size(-1)}")
    if data.device != wdevice:
        raise RuntimeError(f"Input and parameter tensors are not at the same device, found "
                           f"input tensor at {data.device} and parameter tensor at {wdevice}")
    for t in states:
        if t.device != data.device:
            raise RuntimeError(f"Input and hidden tensors are not at the same device, found "
                               f"input tensor at {data.device} and hidden tensor at {t.device}")

    if packed:
        bs = _check_packed(data, bs_tensor, sorted_indices, unsorted_indices)
        steps, batch = bs.shape[0], int(bs[0])
    else:
        batch_dim = 0 if (module.batch_first and batched) else 1
        if batched:
            steps = data.size(1 - batch_dim)
            batch = data.size(batch_dim)
        else:
            steps, batch = data.size(0), 1
        if steps == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")

    for i, t in enumerate(states):
        # h is out_size (proj_size where > 0), c hidden_size
        expected = (module.num_layers * module.num_directions, batch,
                    module.out_size if i == 0 else module.hidden_size)
        got = tuple(t.shape) if (packed or batched) else (t.shape[0], 1, *t.shape[1:])
        if got != expected:
            what = f"hidden[{i}] size" if module.mode == "LSTM" else "hidden size"
            shown = list(t.shape) if (packed or batched) else list(got)
            raise RuntimeError(f"Expected {what} {expected}, got {shown}")
        if t.dtype != data.dtype and not autocast:
            raise RuntimeError(f"hx: dtype {t.dtype} does not match the input's dtype "
                               f"{data.dtype}; convert it with .to({data.dtype})")
    backend = (backend_for(data.device, torch.float32 if precision is not None else data.dtype)
               if rnnrt_runs else None)

    # ---- every check passed: only views and (for batch_first) one copy from here on.
    if not packed:
        if not batched:
            h0 = None if h0 is None else h0.unsqueeze(1)
            c0 = None if c0 is None else c0.unsqueeze(1)
        if rnnrt_runs:   # (torch's LSTM takes the caller's layout as it is)
            if not batched:
                data = data.unsqueeze(1)
            elif module.batch_first:
                data = data.transpose(0, 1)
            # [T, B, I] -> [T*B, I]: a plain batch is the packed layout with batch_sizes
            # [B]*T (a view when x is contiguous time-major; batch_first costs one copy).
            data = data.reshape(steps * batch, module.input_size)
        bs = np.full(steps, batch, np.int64)
        bs_tensor = torch.from_numpy(bs)
    elif sorted_indices is not None:
        # torch.nn's permute_hidden: h0 is given in the caller's order.
        h0 = None if h0 is None else h0.index_select(1, sorted_indices)
        c0 = None if c0 is None else c0.index_select(1, sorted_indices)
    return Prepared(data, bs, bs_tensor, sorted_indices, unsorted_indices, h0, c0, packed,
                    batched, steps, batch, backend, precision)
