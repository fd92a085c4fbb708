"""Autograd for one backend call: a ``torch.autograd.Function`` whose forward is the seam's
``run_forward`` and whose backward is the seam's ``run_backward`` (rnnrt's backward, not
torch's), plus ``run_call``, which skips autograd entirely when nothing needs a gradient.

Why a Function per call rather than per step: the backend runs the whole recurrence (and on
the GPU, a whole plan); torch only sees its inputs and outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from .backend import group_layers


@dataclass(frozen=True, eq=False)
class Call:
    """One backend call's fixed arguments (everything but the tensors).

    backend:     the seam implementation (backend.backend_for)
    cell:        'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'
    num_layers:  layers in this call (1 for a layer of a bidirectional or dropout stack)
    bias:        whether each layer's weights include bias_ih, bias_hh
    batch_sizes: [T] int64 NumPy array (host), the packed schedule
    reverse:     the reverse direction of a bidirectional layer
    precision:   nn/precision.py's CallPrecision, or None (the tensors' own dtype)
    recompute:   the module's ``recompute`` (backend.py)
    """

    backend: object
    cell: str
    num_layers: int
    bias: bool
    batch_sizes: np.ndarray
    reverse: bool
    precision: object = None
    recompute: bool = False

    @property
    def has_cell_state(self) -> bool:
        return self.cell == "lstm"


class RNNFunction(torch.autograd.Function):
    """apply(call, x, h0, c0, *weights) -> (y, h_n) or, for LSTM, (y, h_n, c_n).

    x [N, I] packed; h0, c0 [L, B, H] or None (zeros; c0 None unless LSTM); weights: the
    call's parameters flat, torch's order (backend.group_layers). y [N, H], h_n, c_n
    [L, B, H]. Gradients are computed only for the inputs that ``needs_input_grad`` marks.
    """

    @staticmethod
    def forward(ctx, call: Call, x, h0, c0, *weights):
        layers = group_layers(weights, call.num_layers, call.bias)
        y, h_n, c_n, saved = call.backend.run_forward(
            call.cell, layers, x, call.batch_sizes, h0, c0, reverse=call.reverse, train=True,
            precision=call.precision, recompute=call.recompute)
        ctx.call, ctx.saved = call, saved
        ctx.has_h0, ctx.has_c0 = h0 is not None, c0 is not None
        # The backend's saved state holds x, the weights and y by reference (no copies);
        # saving them here too makes torch's version counters refuse a backward after any of
        # them was modified in place (torch.nn refuses it for its inputs and weights too),
        # instead of a silently wrong gradient.
        ctx.save_for_backward(x, h0, c0, y, *weights)
        # An unused output (h_n, say) then reaches backward as None, not a zero tensor.
        ctx.set_materialize_grads(False)
        return (y, h_n, c_n) if call.has_cell_state else (y, h_n)

    @staticmethod
    @once_differentiable  # rnnrt's backward is not itself differentiable: say so, loudly
    def backward(ctx, dy, dh_n, dc_n=None):
        ctx.saved_tensors  # noqa: B018 -- reading them is torch's in-place-modification check
        need = ctx.needs_input_grad  # (call, x, h0, c0, *weights)
        need_weights = any(need[4:])
        dx, dh0, dc0, dlayers = ctx.call.backend.run_backward(
            ctx.saved, dy, dh_n, dc_n, need_dx=need[1], need_weights=need_weights)
        dweights = [None] * (len(need) - 4)
        if need_weights:
            flat = [g for layer in dlayers for g in layer if g is not None]
            dweights = [g if n else None for g, n in zip(flat, need[4:])]
        return (None, dx if need[1] else None,
                dh0 if (need[2] and ctx.has_h0) else None,
                dc0 if (need[3] and ctx.has_c0) else None, *dweights)


def run_call(call: Call, x, h0, c0, weights):
    """One backend call, with autograd when anything needs a gradient. -> (y, h_n, c_n)

    x [N, I]; h0, c0 [L, B, H] or None; weights: flat list, torch's order. y [N, H], h_n
    [L, B, H], c_n [L, B, H] or None. Under torch.no_grad(), or when no input requires a
    gradient, the backend runs its inference path (train=False): nothing is saved and the
    outputs have no grad_fn.
    """
    tensors = [t for t in (x, h0, c0, *weights) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        out = RNNFunction.apply(call, x, h0, c0, *weights)
        return out if call.has_cell_state else (out[0], out[1], None)
    layers = group_layers(weights, call.num_layers, call.bias)
    y, h_n, c_n, saved = call.backend.run_forward(
        call.cell, layers, x, call.batch_sizes, h0, c0, reverse=call.reverse, train=False,
        precision=call.precision, recompute=call.recompute)
    if saved is not None:  # the inference path must keep nothing; a backend that does is wrong
        raise RuntimeError(f"{type(call.backend).__name__}.run_forward(train=False) returned "
                           f"saved state; the inference path keeps nothing")
    return y, h_n, c_n
