"""The backend seam (backend.py) on CUDA tensors: rnnrt's GpuRunner on the tensors' memory.

Each call site — the parameter tensors of one stack, or of one layer and direction — gets its
own ``rnnrt.gpu.GpuRunner`` (its own flat parameter buffer, plans, workspaces and CUDA graphs,
and the schedule selector's choice per shape: ``switches='auto'``). A call:

  1. runs on PyTorch's current stream of the tensors' device: CuPy is pointed at it
     (a CuPy view of it), and the runner orders its own streams after that
     stream's earlier work and before its later work with events — no host synchronisation;
  2. copies the module's parameters into the runner's flat buffer (a few device-to-device
     copies; torch's version counters refuse a backward after an in-place change, so what the
     backward reads is what the forward ran with);
  3. hands x, h0 and c0 over through DLPack (zero-copy views; the plan copies x into its
     workspace), runs the runner's forward (and, for a training call, keeps its tape: the
     tape holds its own workspace until autograd drops it), and returns the outputs through
     DLPack.
The reverse direction runs the same plans on the time-reversed sequence.

What it does not do yet (NotImplementedError, before any work): variable lengths (a packed
batch whose batch_sizes vary: rnnrt's GPU plans run a fixed batch every step), dtypes other
than float32 (the GPU path computes in fp32).
"""
from __future__ import annotations

import os
import weakref
from collections import OrderedDict

import numpy as np
import torch

MAX_RUNNERS = 64
"""Call sites a backend keeps runners for (least recently used go first)."""
RUNNER_CACHE_BYTES = int(os.environ.get("RNNRT_NN_CACHE_BYTES", 1 << 30))
"""Workspace bytes each runner keeps for the shapes it saw (GpuRunner's cache_bytes)."""


def _current_stream(cp, device):
    """PyTorch's current stream of ``device`` as a CuPy stream (a view of it, not a new one):
    through the CUDA stream protocol where CuPy and torch have it, else by its handle."""
    ts = torch.cuda.current_stream(device)
    if hasattr(cp.cuda.Stream, "from_external") and hasattr(ts, "__cuda_stream__"):
        return cp.cuda.Stream.from_external(ts)
    return cp.cuda.ExternalStream(ts.cuda_stream, device.index)


def _model_for(cell: str, input_size: int, hidden: int, layers: int, bias: bool):
    """An rnnrt model of this shape (fp32): the GpuRunner's layout; its own random weights are
    replaced by the module's on every call."""
    import rnnrt
    kw = dict(num_layers=layers, bias=bias, seed=0)
    if cell == "lstm":
        return rnnrt.LSTM(input_size, hidden, **kw)
    if cell == "gru":
        return rnnrt.GRU(input_size, hidden, **kw)
    return rnnrt.RNN(input_size, hidden, nonlinearity=cell.split("_")[1], **kw)


class CudaBackend:
    """The seam on CUDA float32 tensors (module docstring)."""

    name = "cuda"

    def __init__(self):
        self._runners: OrderedDict = OrderedDict()

    # -- runners --------------------------------------------------------------------------------
    def _runner(self, cell, layers, device):
        """The runner of this call site: keyed by the identity of its first weight (one per
        module stack, or per layer and direction), dropped with that weight."""
        from ..gpu import GpuRunner
        w_ih, w_hh, b_ih, _ = layers[0]
        key = (id(w_ih), device.index, cell, len(layers), int(w_ih.shape[1]),
               int(w_hh.shape[1]), b_ih is not None)
        runner = self._runners.get(key)
        if runner is None:
            import cupy as cp
            with cp.cuda.Device(device.index):
                model = _model_for(cell, key[4], key[5], key[3], key[6])
                runner = GpuRunner(model, cache_bytes=RUNNER_CACHE_BYTES)
            self._runners[key] = runner
            weakref.finalize(w_ih, self._runners.pop, key, None)
            while len(self._runners) > MAX_RUNNERS:
                self._runners.popitem(last=False)
        self._runners.move_to_end(key)
        return runner

    @staticmethod
    def _load_params(runner, layers):
        """Copy the module's parameters into the runner's flat buffer (torch's names)."""
        import cupy as cp

        from ..params import views
        v = views(runner.params, runner.model.layout)
        for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(layers):
            for name, t in (("weight_ih", w_ih), ("weight_hh", w_hh), ("bias_ih", b_ih),
                            ("bias_hh", b_hh)):
                if t is not None:
                    v[f"{name}_l{k}"][...] = cp.from_dlpack(t.detach().contiguous())

    @staticmethod
    def _check(x, batch_sizes):
        if x.dtype != torch.float32:
            raise NotImplementedError(
                f"rnnrt.nn on CUDA: dtype {x.dtype} is not supported yet (the GPU path "
                f"computes in float32); use .float() on the module and its inputs")
        bs = np.asarray(batch_sizes)
        if len(bs) and (bs != bs[0]).any():
            raise NotImplementedError(
                "rnnrt.nn on CUDA: a packed batch of sequences of different lengths is not "
                "supported yet (rnnrt's GPU plans run the same batch at every step; the "
                "per-step active batch runs on CPU tensors); pad the batch to one length, or "
                "run on the CPU")

    # -- the seam -------------------------------------------------------------------------------
    def run_forward(self, cell, layers, x, batch_sizes, h0, c0, *, reverse, train):
        """See backend.py. x [N, I] packed (N = T*B here); h0, c0 [L, B, H] | None ->
        (y [N, H], h_n [L, B, H], c_n | None, saved | None)."""
        import cupy as cp
        self._check(x, batch_sizes)
        T = len(batch_sizes)
        B = int(batch_sizes[0]) if T else 0
        if T == 0 or B == 0:
            raise NotImplementedError("rnnrt.nn on CUDA: an empty batch is not supported")
        device = x.device
        runner = self._runner(cell, layers, device)
        I = int(x.shape[1])
        with torch.cuda.device(device), cp.cuda.Device(device.index), \
                _current_stream(cp, device):
            self._load_params(runner, layers)
            xc = cp.from_dlpack(x.detach().contiguous()).reshape(T, B, I)
            if reverse:
                xc = xc[::-1]
            h0c = None if h0 is None else cp.from_dlpack(h0.detach().contiguous())
            c0c = None if c0 is None else cp.from_dlpack(c0.detach().contiguous())
            hx = (h0c, c0c) if cell == "lstm" else h0c
            out = runner.forward(xc, hx, train=train)
            y, hx_n = out[0], out[1]
            if reverse:
                y = cp.ascontiguousarray(y[::-1])
            h_n, c_n = hx_n if cell == "lstm" else (hx_n, None)
            result = (torch.from_dlpack(y.reshape(T * B, -1)), torch.from_dlpack(h_n),
                      None if c_n is None else torch.from_dlpack(c_n))
        saved = (runner, out[2], reverse, T, B, I, device) if train else None
        return (*result, saved)

    def run_backward(self, saved, dy, dh_n, dc_n, *, need_dx, need_weights):
        """See backend.py. dy [N, H] | None; dh_n, dc_n [L, B, H] | None -> (dx [N, I] |
        None, dh0 [L, B, H], dc0 | None, dlayers | None)."""
        import cupy as cp
        runner, tape, reverse, T, B, I, device = saved
        cell = runner.model.cell_name
        with torch.cuda.device(device), cp.cuda.Device(device.index), \
                _current_stream(cp, device):
            dyc = None
            if dy is not None:
                dyc = cp.from_dlpack(dy.detach().contiguous()).reshape(T, B, -1)
                if reverse:
                    dyc = dyc[::-1]

            def c(t):
                return None if t is None else cp.from_dlpack(t.detach().contiguous())

            dhx = (c(dh_n), c(dc_n)) if cell == "lstm" else c(dh_n)
            g = runner.backward(tape, dyc, dhx)
            dx = None
            if need_dx:
                dxc = cp.ascontiguousarray(g.dx[::-1] if reverse else g.dx)
                dx = torch.from_dlpack(dxc.reshape(T * B, I))
            dh0 = torch.from_dlpack(g.dh0)
            dc0 = None if g.dc0 is None else torch.from_dlpack(g.dc0)
            dlayers = None
            if need_weights:   # copies: the runner's gradient buffer is reused next backward
                L = runner.model.num_layers
                dlayers = [tuple(None if f"{n}_l{k}" not in g.params else
                                 torch.from_dlpack(g.params[f"{n}_l{k}"].copy())
                                 for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
                           for k in range(L)]
        return dx, dh0, dc0, dlayers
