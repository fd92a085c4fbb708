"""A plan's buffers on one array module (NumPy or CuPy): allocation, inputs in, outputs out.

Shared by every executor so that binding inputs and reading outputs is written once.
All buffers are allocated here, before any op runs; executors allocate nothing while
running a plan.
"""
from __future__ import annotations

import numpy as np

from ..ops import View


class Workspace:
    """The buffers of ``plan`` as flat arrays of module ``xp`` (numpy or cupy).

    params: the model's flat parameter buffer [layout.size] (copied in; ``set_params``
    replaces it). Every buffer but 'params' and 'zeros' starts poisoned with NaN so that an
    element no op writes shows up in the outputs.
    """

    def __init__(self, plan, xp, dtype, params):
        self.plan = plan
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.bufs = {}
        for b in plan.buffers:
            if b.role == "const":
                self.bufs[b.name] = xp.zeros(b.size, dtype=self.dtype)
            else:
                self.bufs[b.name] = xp.full(b.size, np.nan, dtype=self.dtype)
        self.set_params(params)

    def set_params(self, params):
        """Copy the model's flat parameters [layout.size] in (same layout as the plan's)."""
        dst = self.bufs["params"]
        if tuple(params.shape) != tuple(dst.shape):
            raise ValueError(f"params: expected shape {tuple(dst.shape)}, got {tuple(params.shape)}")
        dst[...] = self.xp.asarray(params, dtype=self.dtype)

    def poison(self, roles=("io", "scratch")):
        """Fill every buffer of the given roles with NaN (tests: unwritten elements show)."""
        for b in self.plan.buffers:
            if b.role in roles:
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

    def load_inputs(self, x, h0=None, c0=None):
        """Copy x [T, B, I], h0 [L, B, H] (None: zeros) and c0 [L, B, H] (LSTM) in."""
        xp = self.xp
        (xv,) = self.plan.inputs["x"]
        self.view(xv)[...] = xp.asarray(x, dtype=self.dtype).reshape(xv.rows, xv.cols)
        for name, arr in (("h0", h0), ("c0", c0)):
            if name not in self.plan.inputs:
                continue
            for layer, v in enumerate(self.plan.inputs[name]):
                if arr is None:
                    self.view(v)[...] = 0
                else:
                    self.view(v)[...] = xp.asarray(arr[layer], dtype=self.dtype)

    def outputs(self, copy=True):
        """dict: 'y' [T, B, H], 'h_n' [L, B, H], 'c_n' [L, B, H] (LSTM)."""
        xp = self.xp
        k = self.plan.key
        out = {}
        (yv,) = self.plan.outputs["y"]
        y = self.view(yv).reshape(k.steps, k.batch, k.hidden_size)
        out["y"] = y.copy() if copy else y
        for name in ("h_n", "c_n"):
            if name in self.plan.outputs:
                out[name] = xp.stack([self.view(v) for v in self.plan.outputs[name]])
        return out
