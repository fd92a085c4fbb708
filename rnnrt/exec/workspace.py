"""A plan's buffers on one array module (NumPy or CuPy): allocation, inputs in, outputs out.

Shared by every executor so that binding inputs and reading outputs is written once.
All buffers are allocated here, before any op runs; executors allocate nothing while
running a plan.
"""
from __future__ import annotations

import numpy as np

from ..plan.ops import View


class Workspace:
    """The buffers of ``plan`` as flat arrays of module ``xp`` (numpy or cupy).

    params: the model's flat parameter buffer [layout.size]. An array of module ``xp`` with
    the workspace's dtype is adopted as the 'params' buffer (shared, not copied: an optimiser
    that updates it in place updates every workspace that shares it, graphs included);
    anything else is copied in. grads: likewise adopted as the 'grads' buffer (backward
    plans), so gradients land in (or accumulate into) a buffer the caller owns. Every other buffer but the 'const' ones starts poisoned with
    NaN so that an element no op writes shows up in the outputs.
    """

    def __init__(self, plan, xp, dtype, params, grads=None):
        self.plan = plan
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.bufs = {}
        for b in plan.buffers:
            if b.name == "params" and self._adoptable(params, b.size):
                self.bufs["params"] = params
            elif b.name == "grads" and grads is not None:
                if not self._adoptable(grads, b.size):
                    raise ValueError(f"grads: expected a contiguous {self.dtype} array of "
                                     f"shape ({b.size},) of the workspace's array module")
                self.bufs["grads"] = grads
            elif b.role == "sync":     # barrier counters: zero, and only kernels touch them
                self.bufs[b.name] = xp.zeros(b.size, dtype=np.uint32)
            elif b.role in ("const", "grad"):
                self.bufs[b.name] = xp.zeros(b.size, dtype=self.dtype)
            elif b.role == "ones":
                self.bufs[b.name] = xp.ones(b.size, dtype=self.dtype)
            else:
                self.bufs[b.name] = xp.full(b.size, np.nan, dtype=self.dtype)
        if self.bufs["params"] is not params:
            self.set_params(params)

    def sharing(self, plan) -> Workspace:
        """A Workspace of ``plan`` over these buffers, allocating nothing: for a plan whose
        buffers are among this one's (variable-length plans of one capacity have the same
        buffers; a forward plan's are among its backward plan's). Its bindings are
        ``plan``'s."""
        missing = set(plan.buffers) - set(self.plan.buffers)
        if missing:
            raise ValueError(f"sharing: the plan needs buffers this workspace lacks: "
                             f"{sorted(b.name for b in missing)}")
        ws = object.__new__(Workspace)
        ws.plan, ws.xp, ws.dtype, ws.bufs = plan, self.xp, self.dtype, self.bufs
        return ws

    def with_own(self, names) -> Workspace:
        """A Workspace of the same plan whose buffers ``names`` are new (NaN-poisoned) and
        every other one is this workspace's (shared, nothing else allocated): a chunked
        training pass (rnnrt/chunked.py) keeps each chunk's activations in buffers of its
        own over one set of scratch buffers."""
        ws = self.sharing(self.plan)
        ws.bufs = dict(self.bufs)
        for name in names:
            b = self.plan.buffer(name)
            ws.bufs[name] = self.xp.full(b.size, np.nan, dtype=self.dtype)
        return ws

    def _adoptable(self, params, size):
        return (isinstance(params, self.xp.ndarray) and params.dtype == self.dtype
                and params.shape == (size,) and params.flags.c_contiguous)

    def set_params(self, params):
        """Copy the model's flat parameters [layout.size] in (same layout as the plan's)."""
        dst = self.bufs["params"]
        if tuple(params.shape) != tuple(dst.shape):
            raise ValueError(f"params: expected shape {tuple(dst.shape)}, got {tuple(params.shape)}")
        dst[...] = self.xp.asarray(params, dtype=self.dtype)

    def poison(self, roles=("io", "scratch"), names=None):
        """Fill every buffer of the given roles (or the given names) with NaN, so that
        elements no op writes show up (tests). 'grad' buffers (gradients the caller may
        accumulate into) are only poisoned when named."""
        for b in self.plan.buffers:
            if (b.name in names) if names is not None else (b.role in roles):
                self.bufs[b.name].fill(np.nan)

    def view(self, v: View):
        """The [rows, cols] array for view ``v`` (shares memory with the buffer)."""
        buf = self.bufs[v.buf]
        if v.ld == v.cols:
            return buf[v.offset:v.offset + v.rows * v.cols].reshape(v.rows, v.cols)
        item = buf.itemsize
        base = buf[v.offset:]
        return self.xp.lib.stride_tricks.as_strided(
            base, shape=(v.rows, v.cols), strides=(v.ld * item, item))

    def load(self, **arrays):
        """Copy arrays into the plan's input bindings (None: zeros), e.g. load(x=..., h0=...).
        Names must be inputs of the plan; each array has its binding's shape."""
        xp = self.xp
        for name, arr in arrays.items():
            if name not in self.plan.inputs:
                raise KeyError(f"{name!r} is not an input of this plan "
                               f"(inputs: {sorted(self.plan.inputs)})")
            b = self.plan.inputs[name]
            if arr is None:
                for v in b.views:
                    self.view(v)[...] = 0
                continue
            a = xp.asarray(arr, dtype=self.dtype)
            if tuple(a.shape) != tuple(b.shape):
                raise ValueError(f"{name}: expected shape {b.shape}, got {tuple(a.shape)}")
            if len(b.views) == 1:
                v = b.views[0]
                self.view(v)[...] = a.reshape(v.rows, v.cols)
            else:
                for i, v in enumerate(b.views):
                    self.view(v)[...] = a[i].reshape(v.rows, v.cols)

    def read(self, name, copy=True):
        """The array bound to output (or input) ``name``, in its binding's shape."""
        b = self.plan.outputs.get(name) or self.plan.inputs[name]
        xp = self.xp
        if len(b.views) == 1:
            a = self.view(b.views[0]).reshape(b.shape)
            return a.copy() if copy else a
        return xp.stack([self.view(v).reshape(b.shape[1:]) for v in b.views])

    def rows_view(self, name):
        """The [rows, cols] array of input or output ``name`` (a one-view binding: a
        variable-length plan's x, y, dy, dx; shares memory with the buffer)."""
        b = self.plan.inputs.get(name) or self.plan.outputs[name]
        if len(b.views) != 1:
            raise ValueError(f"{name}: bound to {len(b.views)} views, not one")
        return self.view(b.views[0])

    def load_rows(self, name, rows, a, fill=None):
        """Scatter ``a`` [n, cols] into the rows ``rows`` [n] (an integer array of the
        workspace's module) of input ``name`` (``rows_view``); with ``fill`` the other rows
        are set to it first, else they keep what they hold. a None: zeros."""
        v = self.rows_view(name)
        if fill is not None:
            v.fill(fill)
        if a is None:
            v[rows] = 0
        else:
            v[rows] = self.xp.asarray(a, dtype=self.dtype).reshape(len(rows), v.shape[1])

    def read_rows(self, name, rows):
        """The rows ``rows`` [n] of output ``name`` (``rows_view``): a [n, cols] copy."""
        return self.rows_view(name)[rows]

    def load_inputs(self, x, h0=None, c0=None):
        """Forward inputs: x [T, B, I], h0 [L, B, H] (None: zeros), c0 [L, B, H] (LSTM)."""
        arrays = {"x": x, "h0": h0}
        if "c0" in self.plan.inputs:
            arrays["c0"] = c0
        self.load(**arrays)

    def outputs(self, copy=True):
        """Forward outputs: dict 'y' [T, B, H], 'h_n' [L, B, H], 'c_n' [L, B, H] (LSTM)."""
        return {name: self.read(name, copy) for name in ("y", "h_n", "c_n")
                if name in self.plan.outputs}
