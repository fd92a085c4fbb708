"""The backend seam: the one small interface through which rnnrt.nn's modules run a stack of
recurrent layers, and its implementations.

A *call* is one direction of one or more stacked layers over packed sequences (torch's
PackedSequence layout, see ``rnnrt.varlen``): the module makes one call for a whole
unidirectional stack without active dropout (the GPU runs it as one plan), and one call per
layer and direction otherwise (dropout and the [forward, reverse] concatenation sit between
layers, in torch ops).

    backend = backend_for(device)            # raises before any work for devices not done
    y, h_n, c_n, saved = backend.run_forward(cell, layers, x, batch_sizes, h0, c0,
                                             reverse=..., train=..., precision=...,
                                             recompute=...)
    dx, dh0, dc0, dlayers = backend.run_backward(saved, dy, dh_n, dc_n,
                                                 need_dx=..., need_weights=...)

Arguments (torch tensors, all on one device, one dtype unless ``precision``; ``L`` =
len(layers), B = batch_sizes[0], N = sum(batch_sizes)):

  cell         'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'
  layers       [L] tuples (weight_ih [G*H, I_l], weight_hh [G*H, H], bias_ih [G*H] | None,
               bias_hh [G*H] | None) -- the module's parameters themselves, torch's gate order
  x            [N, I] packed input, rows of step t at sum(batch_sizes[:t]) + 0..bs[t]-1
  batch_sizes  [T] int64 NumPy array on the host, non-increasing, entries >= 1 (B = 0 is
               allowed for a plain empty batch: then every entry is 0)
  h0, c0       [L, B, H] or None (zeros); c0 only for 'lstm'
  reverse      run each sequence from its own end to its start
  train        keep what run_backward needs (saved); False: keep nothing, saved is None
  precision    nn/precision.py's CallPrecision (autocast, or 16-bit parameters): the call
               runs at that precision, its outputs in precision.out_dtype; None: the
               tensors' own dtype (then all one dtype). Only the CUDA backend takes one.
  recompute    keep no gates in the chunks of a long training call (the module's
               ``recompute``): the CUDA backend's runner (GpuRunner's ``recompute``); the
               CPU one runs the NumPy reference unchunked, which keeps its activations

  -> y [N, H] packed like x; h_n, c_n [L, B, H] (c_n None unless 'lstm'); saved (opaque)

  run_backward(saved, dy [N, H] | None, dh_n [L, B, H] | None, dc_n [L, B, H] | None,
               need_dx, need_weights)
  -> dx [N, I] | None (None unless need_dx), dh0 [L, B, H], dc0 [L, B, H] | None,
     dlayers: [L] tuples of gradients shaped like ``layers`` (None for absent biases) | None
     (None unless need_weights). None for dy / dh_n / dc_n means zeros.

Implementations:

  CPU     ``NumpyBackend``: rnnrt.varlen on ``t.detach().numpy()`` views (no copies of the
          inputs or parameters), in the tensors' dtype (float32 or float64); results are
          ``torch.from_numpy`` views of the arrays it computed. At a ``precision``: varlen
          in float32 with that precision's storage rounding (16-bit tensors converted to
          float32 copies, exactly), the outputs in precision.out_dtype.
  CUDA    ``cuda.CudaBackend``: rnnrt's GpuRunner (at the call's precision: float32, or
          bfloat16 / float16 under autocast or for 16-bit parameters; the schedule
          selector's choice per shape, a bounded cache of plans and workspaces) on the
          tensors' memory through DLPack on PyTorch's current stream; ``saved`` is the
          runner's tape (its own workspace). Packed batches of different lengths run its
          variable-length plans (a per-step active batch). float64 raises
          NotImplementedError there, before any work.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import varlen

_CPU_DTYPES = (torch.float32, torch.float64)


class NumpyBackend:
    """The seam (module docstring) on the CPU: rnnrt.varlen's NumPy forward/backward."""

    name = "numpy"

    @staticmethod
    def _np(t):
        """A NumPy view of CPU tensor ``t`` (any shape; a float32 copy where it is 16-bit:
        NumPy has no bfloat16), or None."""
        if t is None:
            return None
        t = t.detach()
        return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()

    def run_forward(self, cell, layers, x, batch_sizes, h0, c0, *, reverse, train,
                    precision=None, recompute=False):
        """See the module docstring. x [N, I]; h0, c0 [L, B, H] | None -> (y [N, H],
        h_n [L, B, H], c_n [L, B, H] | None, saved varlen.Cache | None). At ``precision``
        (a CallPrecision) in float32 with its storage rounding, outputs in its out_dtype.
        ``recompute`` changes nothing here (nothing is chunked on the CPU)."""
        np32 = self._np if precision is None else self._np32
        params = [{"weight_ih": np32(w_ih), "weight_hh": np32(w_hh),
                   "bias_ih": np32(b_ih), "bias_hh": np32(b_hh)}
                  for w_ih, w_hh, b_ih, b_hh in layers]
        kw = {} if precision is None else {"dtype": precision.name}
        y, h_n, c_n, cache = varlen.forward(cell, params, np32(x), batch_sizes,
                                            np32(h0), np32(c0), reverse=reverse,
                                            train=train, **kw)

        def out(a):
            t = torch.from_numpy(a)
            return t if precision is None else t.to(precision.out_dtype)
        return out(y), out(h_n), None if c_n is None else out(c_n), cache

    @classmethod
    def _np32(cls, t):
        """A float32 NumPy array of CPU tensor ``t`` (a view where it is float32), or None."""
        a = cls._np(t)
        return None if a is None else a.astype(np.float32, copy=False)

    def run_backward(self, saved, dy, dh_n, dc_n, *, need_dx, need_weights):
        """See the module docstring. dy [N, H] | None; dh_n, dc_n [L, B, H] | None ->
        (dx [N, I] | None, dh0 [L, B, H], dc0 | None, [L] gradient tuples | None)."""
        g = varlen.backward(saved, self._np(dy), self._np(dh_n), self._np(dc_n),
                            need_dx=need_dx, need_params=need_weights)

        def t(a):
            return None if a is None else torch.from_numpy(a)

        dlayers = None
        if g["params"] is not None:
            dlayers = [tuple(t(p[k]) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
                       for p in g["params"]]
        return t(g["dx"]), t(g["dh0"]), t(g["dc0"]), dlayers


_NUMPY = NumpyBackend()
_CUDA = None   # built on first use: cuda.CudaBackend


def backend_for(device: torch.device, dtype: torch.dtype):
    """The backend that runs tensors of ``device`` and ``dtype``; raises (before any work)
    where there is none:

      NotImplementedError  a device other than CPU and CUDA, or a CPU dtype other than
                           float32 / float64 (the CUDA backend checks its own limits)
    """
    if device.type == "cpu":
        if dtype not in _CPU_DTYPES:
            raise NotImplementedError(
                f"rnnrt.nn: on the CPU the recurrent layers compute in float32 or float64 "
                f"(the NumPy reference), got {dtype}; convert the module and its inputs "
                f"with .float() or .double() (on CUDA, bfloat16 and float16 run)")
        return _NUMPY
    if device.type == "cuda":
        global _CUDA
        if _CUDA is None:
            from .cuda import (
                CudaBackend,  # CuPy is imported only when CUDA tensors come
            )
            _CUDA = CudaBackend()
        return _CUDA
    raise NotImplementedError(f"rnnrt.nn: tensors on device {device} are not supported; "
                              f"rnnrt.nn runs CPU and CUDA tensors")


def empty_cache() -> int:
    """Drop the workspaces (and CUDA graphs) that rnnrt keeps on CUDA for the shapes it has
    run, except those a live autograd graph still needs, their memory released (CuPy's pool
    frees its blocks) -- as torch.cuda.empty_cache does for torch's; -> how many went. The next
    call of a dropped shape builds its own again (milliseconds). On a machine that has not run
    CUDA tensors, nothing to do."""
    return 0 if _CUDA is None else _CUDA.empty_cache()


def group_layers(weights, num_layers: int, bias: bool) -> list[tuple]:
    """The flat parameter list of a call, torch's order (per layer weight_ih [G*H, I_l],
    weight_hh [G*H, H] and, with bias, bias_ih [G*H], bias_hh [G*H]), as [num_layers] tuples
    (w_ih, w_hh, b_ih | None, b_hh | None)."""
    per = 4 if bias else 2
    if len(weights) != per * num_layers:
        raise ValueError(f"weights: expected {per * num_layers} tensors for {num_layers} "
                         f"layer(s) with bias={bias}, got {len(weights)}")
    out = []
    for layer in range(num_layers):
        w = weights[layer * per:(layer + 1) * per]
        out.append((w[0], w[1], w[2], w[3]) if bias else (w[0], w[1], None, None))
    return out

