"""The backend seam (backend.py) on CUDA tensors: rnnrt's GpuRunner on the tensors' memory.

Each call site — the parameter tensors of one stack, or of one layer and direction — gets its
own ``rnnrt.gpu.GpuRunner`` (its plans, workspaces and CUDA graphs, and the schedule
selector's choice per shape: ``switches='auto'``). A call:

  1. runs on PyTorch's current stream of the tensors' device: CuPy is pointed at it
     (a CuPy view of it), and the runner orders its own streams after that
     stream's earlier work and before its later work with events — no host synchronisation;
  2. reads the module's parameters in place when they lie in the module's flat buffer
     (``flat.py``: ``.cuda()`` lays them out so, and the runner adopts the call's segment of
     it as its parameter buffer); otherwise copies them into the runner's buffer (one
     multi-tensor copy). Where they moved since (or came to lie in one buffer), the call
     site gets a new runner that adopts them as they lie now (``Site.stale``). Either way
     torch's version counters refuse a backward after an in-place change, so what the
     backward reads is what the forward ran with;
  3. hands x, h0 and c0 over through DLPack (zero-copy views; the plan copies x into its
     workspace), runs the runner's forward (and, for a training call, keeps its tape: the
     tape holds its own workspace until autograd drops it), and returns the outputs through
     DLPack; the backward returns the parameter gradients as views of one copy of the
     runner's gradient buffer (the buffer is reused by the next backward).

A batch whose sequences have one length runs the fixed-batch plans (the reverse direction on
the time-reversed sequence); a packed batch of different lengths runs ``forward_packed``:
variable-length plans with a per-step active batch, the reverse direction from each
sequence's own end.

Precision (nn/precision.py): a call with a CallPrecision runs a runner of that precision (a
site per precision); x, h0, c0 and the backward's dy, dh_n, dc_n go in as float32 (16-bit
values exactly), the parameters as the runner's fp32 buffer (a 16-bit module's copied in,
converted exactly); y, h_n, c_n come back in the precision's out_dtype, the gradients in
float32 (autograd casts each to its input's dtype). float64 raises NotImplementedError
before any work.
"""
from __future__ import annotations

import os
import weakref
from collections import OrderedDict

import numpy as np
import torch

from .flat import segment

MAX_RUNNERS = 64
"""Call sites a backend keeps runners for (least recently used go first)."""
RUNNER_CACHE_BYTES = int(os.environ.get("RNNRT_NN_CACHE_BYTES", 1 << 30))
"""Workspace bytes each runner keeps for the shapes it saw (GpuRunner's cache_bytes)."""
TOTAL_CACHE_BYTES = int(os.environ.get("RNNRT_NN_TOTAL_BYTES", 4 << 30))
"""Workspace bytes all call sites' runners keep together (a model of many layers,
directions and shapes: each site's own budget times the sites would be many GiB that
torch's allocator cannot use); past it, the idle states of the least recently used sites
go first (``CudaBackend.bound``). States a live tape holds are never dropped."""


def _current_stream(cp, device):
    """PyTorch's current stream of ``device`` as a CuPy stream (a view of it, not a new one):
    through the CUDA stream protocol where CuPy and torch have it, else by its handle."""
    ts = torch.cuda.current_stream(device)
    if hasattr(cp.cuda.Stream, "from_external") and hasattr(ts, "__cuda_stream__"):
        return cp.cuda.Stream.from_external(ts)
    return cp.cuda.ExternalStream(ts.cuda_stream, device.index)


def _model_for(cell: str, input_size: int, hidden: int, layers: int, bias: bool):
    """An rnnrt model of this shape (fp32): the GpuRunner's layout; its own random weights are
    never run (the runner reads the module's)."""
    import rnnrt
    kw = dict(num_layers=layers, bias=bias, seed=0)
    if cell == "lstm":
        return rnnrt.LSTM(input_size, hidden, **kw)
    if cell == "gru":
        return rnnrt.GRU(input_size, hidden, **kw)
    return rnnrt.RNN(input_size, hidden, nonlinearity=cell.split("_")[1], **kw)


def make_runner(model, precision: str, recompute: bool = False, **kw):
    """A GpuRunner of ``model`` at ``precision`` (precision.DTYPES), with ``recompute``."""
    from ..gpu import GpuRunner
    return GpuRunner(model, **kw, dtype=precision, recompute=recompute)


def adoptable(params, layout):
    """The 1-D float32 tensor over ``params`` that a runner can adopt as its parameter
    buffer (``flat.segment``), or None: 16-bit parameters are copied (converted) instead."""
    if params[0].dtype != torch.float32:
        return None
    return segment(params, layout)


def _flat_params(layers) -> list:
    """A call's parameters in torch's (and the layout's) order: [w_ih, w_hh, b_ih, b_hh] a
    layer, without absent biases."""
    return [t for layer in layers for t in layer if t is not None]


def copy_all(dst: list, src: list) -> None:
    """dst[i] <- src[i] for every i, in one multi-tensor launch where torch has it."""
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(dst, src)
        return
    for d, s in zip(dst, src):
        d.copy_(s)


class Site:
    """One call site on the GPU: its runner and how the parameters reach it.

    adopted: the runner's parameter buffer IS the module's (``flat.segment``); a call then
    only checks that every parameter still lies where it did (data pointers) and copies
    nothing. Otherwise each call copies them in. A site whose parameters moved, or whose
    copied parameters came to lie in one segment (``stale``), is replaced by the backend
    with one that adopts what is there now (``load_params`` on it still copies: right, but
    into the old buffer, which its runner, workspaces and graphs keep alive).
    """

    def __init__(self, runner, params, adopted: bool):
        self.runner = runner
        self.adopted_ptrs = [t.data_ptr() for t in params] if adopted else None
        entries = runner.model.layout.entries
        flat = torch.from_dlpack(runner.params)   # torch views of the runner's buffers
        self.dst = [flat[e.offset:e.end].view(e.shape) for e in entries]
        self.grads = torch.from_dlpack(runner.grads)
        self.entries = entries
        self.copies = 0
        self.states_seen = -1   # runner.cached_states() when the budget was last checked

    def adopts(self, params) -> bool:
        """Whether the runner reads ``params`` in place (they lie where it adopted them)."""
        return self.adopted_ptrs is not None and [t.data_ptr() for t in params] == \
            self.adopted_ptrs

    def stale(self, params) -> bool:
        """Whether another site would serve ``params`` better: adopted ones moved (the
        runner's buffer is no longer the module's), or copied ones that now lie in one
        segment it could adopt (after ``flatten_parameters()``)."""
        if self.adopted_ptrs is not None:
            return not self.adopts(params)
        return adoptable(params, self.runner.model.layout) is not None

    def load_params(self, params) -> None:
        if self.adopts(params):
            return   # the runner reads the module's flat buffer
        copy_all(self.dst, [t.detach() for t in params])
        self.copies += 1

    def grads_by_layer(self, num_layers: int) -> list:
        """[num_layers] tuples (weight_ih, weight_hh, bias_ih | None, bias_hh | None): views
        of one copy of the runner's gradient buffer (one launch)."""
        fresh = self.grads.clone()
        by = {(e.layer, e.kind): fresh[e.offset:e.end].view(e.shape) for e in self.entries}
        return [tuple(by.get((k, n)) for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
                for k in range(num_layers)]


def _to_cupy(cp, t):
    """A CuPy float32 view of tensor ``t`` (a float32 copy where it is 16-bit: exact), or
    None."""
    if t is None:
        return None
    t = t.detach()
    return cp.from_dlpack((t if t.dtype == torch.float32 else t.float()).contiguous())


def _to_torch(a, dtype):
    """CuPy array ``a`` as a torch tensor (a view), or a copy in ``dtype`` where given."""
    t = torch.from_dlpack(a)
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


class CudaBackend:
    """The seam on CUDA float32 tensors (module docstring)."""

    name = "cuda"

    def __init__(self):
        self._sites: OrderedDict = OrderedDict()
        self.trims = 0   # sites whose idle states the total budget dropped

    # -- call sites ------------------------------------------------------------------------------
    def _site(self, cell, layers, device, params, precision: str = "float32",
              recompute: bool = False) -> Site:
        """The site of this call: keyed by the identity of its first weight (one per module
        stack, or per layer and direction), the precision and ``recompute``, dropped with
        that weight; made
        again where the call's ``params`` (``_flat_params(layers)``) left it stale
        (``Site.stale``)."""
        w_ih, w_hh, b_ih, _ = layers[0]
        key = (id(w_ih), device.index, cell, len(layers), int(w_ih.shape[1]),
               int(w_hh.shape[1]), b_ih is not None, precision, bool(recompute))
        site = self._sites.get(key)
        if site is None or site.stale(params):
            import cupy as cp
            with torch.cuda.device(device), cp.cuda.Device(device.index):
                model = _model_for(cell, key[4], key[5], key[3], key[6])
                seg = adoptable(params, model.layout)
                runner = make_runner(model, precision, recompute=recompute,
                                     cache_bytes=RUNNER_CACHE_BYTES,
                                     params=None if seg is None else cp.from_dlpack(seg))
                fresh = Site(runner, params, seg is not None)
            if site is None:   # (a replaced site's key keeps its finalizer)
                weakref.finalize(w_ih, self._sites.pop, key, None)
            self._sites[key] = site = fresh
            while len(self._sites) > MAX_RUNNERS:
                self._sites.popitem(last=False)
        self._sites.move_to_end(key)
        return site

    def bound(self, site: Site, budget: int | None = None) -> None:
        """After a call of ``site``: where its runner keeps a state it did not before, the
        total of every site's kept workspaces against ``budget`` (TOTAL_CACHE_BYTES), the
        idle states of the least recently used other sites dropped until it fits. A call
        that kept nothing new costs one count."""
        n = site.runner.cached_states()
        if n == site.states_seen:
            return
        site.states_seen = n
        budget = TOTAL_CACHE_BYTES if budget is None else budget
        total = sum(s.runner.cached_bytes() for s in self._sites.values())
        for other in list(self._sites.values()):   # least recently used first
            if total <= budget:
                break
            if other is site:
                continue
            before = other.runner.cached_bytes()
            if other.runner.drop_idle():
                self.trims += 1
                total -= before - other.runner.cached_bytes()
                other.states_seen = other.runner.cached_states()

    def empty_cache(self) -> int:
        """Drop every site's idle states (``rnnrt.nn.empty_cache``); -> how many went."""
        n = 0
        for site in list(self._sites.values()):
            n += site.runner.drop_idle()
            site.states_seen = site.runner.cached_states()
        return n

    @staticmethod
    def _check(x, precision):
        if precision is None and x.dtype != torch.float32:
            raise NotImplementedError(
                f"rnnrt.nn on CUDA: dtype {x.dtype} is not supported (the GPU path runs "
                f"float32, and bfloat16 / float16 modules or autocast); use .float() on the "
                f"module and its inputs")

    # -- the seam -------------------------------------------------------------------------------
    def run_forward(self, cell, layers, x, batch_sizes, h0, c0, *, reverse, train,
                    precision=None, recompute=False):
        """See backend.py. x [N, I] packed; h0, c0 [L, B, H] | None -> (y [N, H],
        h_n [L, B, H], c_n | None, saved | None); at ``precision`` (a CallPrecision, or
        None: float32) the outputs in its out_dtype."""
        import cupy as cp
        self._check(x, precision)
        bs = tuple(np.asarray(batch_sizes).tolist())   # once; forward_packed checks it
        T = len(bs)
        B = bs[0] if T else 0
        if T == 0 or B == 0:
            raise NotImplementedError("rnnrt.nn on CUDA: an empty batch is not supported")
        uniform = bs[-1] == B   # non-increasing (the module checked): one length
        device = x.device
        params = _flat_params(layers)
        site = self._site(cell, layers, device, params,
                          "float32" if precision is None else precision.name, recompute)
        runner = site.runner
        I = int(x.shape[1])
        with torch.cuda.device(device), cp.cuda.Device(device.index), \
                _current_stream(cp, device):
            site.load_params(params)
            xc = _to_cupy(cp, x)
            hx = (_to_cupy(cp, h0), _to_cupy(cp, c0)) if cell == "lstm" else _to_cupy(cp, h0)

            if uniform:   # one length: the fixed-batch plans, reverse = the time-reversed run
                xc = xc.reshape(T, B, I)
                out = runner.forward(xc[::-1] if reverse else xc, hx, train=train)
                y = out[0][::-1] if reverse else out[0]
                y = cp.ascontiguousarray(y).reshape(T * B, -1)
            else:
                out = runner.forward_packed(xc, bs, hx, train=train, reverse=reverse)
                y = out[0]
            h_n, c_n = out[1] if cell == "lstm" else (out[1], None)
            out_dtype = None if precision is None else precision.out_dtype
            result = tuple(None if a is None else _to_torch(a, out_dtype) for a in (y, h_n, c_n))
        saved = (site, out[2], reverse, uniform, T, B, I, device) if train else None
        self.bound(site)
        return (*result, saved)

    def run_backward(self, saved, dy, dh_n, dc_n, *, need_dx, need_weights):
        """See backend.py. dy [N, H] | None; dh_n, dc_n [L, B, H] | None -> (dx [N, I] |
        None, dh0 [L, B, H], dc0 | None, dlayers | None)."""
        import cupy as cp
        site, tape, reverse, uniform, T, B, I, device = saved
        runner = site.runner
        cell = runner.model.cell_name
        with torch.cuda.device(device), cp.cuda.Device(device.index), \
                _current_stream(cp, device):
            def c(t):
                return _to_cupy(cp, t)

            dyc = c(dy)
            if uniform and dyc is not None:
                dyc = dyc.reshape(T, B, -1)
                dyc = dyc[::-1] if reverse else dyc
            dhx = (c(dh_n), c(dc_n)) if cell == "lstm" else c(dh_n)
            g = runner.backward(tape, dyc, dhx, need_dx=need_dx)
            dx = None
            if need_dx:
                dxc = g.dx
                if uniform:
                    dxc = cp.ascontiguousarray(dxc[::-1] if reverse else dxc).reshape(T * B, I)
                dx = torch.from_dlpack(dxc)
            dh0 = torch.from_dlpack(g.dh0)
            dc0 = None if g.dc0 is None else torch.from_dlpack(g.dc0)
            dlayers = site.grads_by_layer(runner.model.num_layers) if need_weights else None
        return dx, dh0, dc0, dlayers
