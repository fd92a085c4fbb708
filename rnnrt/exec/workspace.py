"""A plan's buffers on one array module (NumPy or CuPy): allocation, inputs in, outputs out.

Shared by every executor so that binding inputs and reading outputs is written once.
All buffers are allocated here, before any op runs; executors allocate nothing while
running a plan.
"""
from __future__ import annotations

import numpy as np

from ..plan.ops import View
from ..precision import get_precision

ARRAY_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
                "bfloat16": np.uint16, "uint32": np.uint32}
"""A buffer's element type -> the dtype of the array holding it: bfloat16 as its bits in
uint16 (neither NumPy nor CuPy has a bfloat16)."""
_BF16_NAN, _BF16_ONE = 0x7FC0, 0x3F80   # bfloat16 bits of NaN and of 1.0


def to_bfloat16_bits(xp, a):
    """float32 array ``a`` (module ``xp``) rounded to bfloat16 (nearest, ties to even; NaN
    stays NaN, past the largest finite value Inf), as uint16 bits: on the GPU for a CuPy
    array. The same rounding as precision.round_to_bfloat16 and the kernels' cvt.rn.bf16."""
    a = xp.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32)
    # + 0x7FFF + the kept part's lowest bit, then drop 16 bits: round half to even (no
    # overflow out of 32 bits for non-NaN values: the largest, -Inf's bits, carries into Inf)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype(np.uint16)
    return xp.where(xp.isnan(a), np.uint16(_BF16_NAN), rounded)


def from_bfloat16_bits(xp, bits):
    """uint16 bfloat16 bits -> float32 (exact: bfloat16 is float32's top half)."""
    return (xp.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def buffer_elements(plan, float_type: str, store: str) -> dict[str, str]:
    """{buffer name: element type} of ``plan``'s buffers: a 'float' buffer ``float_type``
    (the workspace's), a 'store' one ``store``, a 'uint32' (or 'sync') one 'uint32'."""
    out = {}
    for b in plan.buffers:
        if b.dtype not in ("float", "store", "uint32"):
            raise ValueError(f"buffer {b.name}: dtype {b.dtype!r}, expected 'float', 'store' "
                             f"or 'uint32'")
        out[b.name] = ("uint32" if b.dtype == "uint32" or b.role == "sync"
                       else store if b.dtype == "store" else float_type)
    return out


class Workspace:
    """The buffers of ``plan`` as flat arrays of module ``xp`` (numpy or cupy).

    params: the model's flat parameter buffer [layout.size]. An array of module ``xp`` with
    the workspace's dtype is adopted as the 'params' buffer (shared, not copied: an optimiser
    that updates it in place updates every workspace that shares it, graphs included);
    anything else is copied in. grads: likewise adopted as the 'grads' buffer (backward
    plans), so gradients land in (or accumulate into) a buffer the caller owns. Every other buffer but the 'const' ones starts poisoned with
    NaN so that an element no op writes shows up in the outputs.

    Element types (``elements``: buffer name -> 'float32', 'float64', 'bfloat16', 'float16'
    or 'uint32'): a 'float' buffer has the workspace's ``dtype``, a 'uint32' one uint32, a
    'store' one (plan/model.py: what a GEMM reads) ``store``: by default the plan key's
    storage type (precision.Precision.storage) on a float32 workspace of a GPU module (the
    CUDA executor's: 16-bit storage really is 2 bytes; bfloat16 held as uint16 bits), and
    the workspace's dtype on NumPy (the NumPy executor rounds what it writes there instead).
    ``load`` rounds the caller's values into a 16-bit buffer on the workspace's device (to
    nearest, ties to even); ``read`` gives them back as float32, exactly.
    """

    def __init__(self, plan, xp, dtype, params, grads=None, store=None):
        self.plan = plan
        self.xp = xp
        self.dtype = np.dtype(dtype)
        if store is None:
            gpu = xp is not np and self.dtype == np.float32
            store = get_precision(plan.key.dtype).storage if gpu else self.dtype.name
        if store not in ARRAY_DTYPES or store == "uint32":
            raise ValueError(f"store: expected one of float32, float64, bfloat16, float16, "
                             f"got {store!r}")
        self.store = store
        self.elements = buffer_elements(plan, self.dtype.name, store)
        for name in ("params", "grads"):   # the caller's fp32 master and its gradients
            if self.elements.get(name, self.dtype.name) != self.dtype.name:
                raise ValueError(f"buffer {name}: expected a 'float' buffer (the model's "
                                 f"{self.dtype} {name}), the plan makes it "
                                 f"{self.elements[name]}")
        self.bufs = {}
        for b in plan.buffers:
            kind = ARRAY_DTYPES[self.elements[b.name]]
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
                self.bufs[b.name] = xp.zeros(b.size, dtype=kind)   # all-zero bits: +0.0
            elif b.role == "ones":
                one = _BF16_ONE if self.elements[b.name] == "bfloat16" else 1
                self.bufs[b.name] = xp.full(b.size, one, dtype=kind)
            else:
                self.bufs[b.name] = xp.empty(b.size, dtype=kind)
                self._fill_nan(b.name)
        if self.bufs["params"] is not params:
            self.set_params(params)

    def _fill_nan(self, name):
        self.bufs[name].fill(_BF16_NAN if self.elements[name] == "bfloat16" else np.nan)

    def _stored(self, name, a):
        """Float array ``a`` as buffer ``name`` holds it: rounded to its 16-bit type (on the
        workspace's device), else cast to its float type."""
        element = self.elements[name]
        if element == "bfloat16":
            return to_bfloat16_bits(self.xp, a)
        return self.xp.asarray(a, dtype=ARRAY_DTYPES[element])

    def _floats(self, name, a):
        """Array ``a`` of buffer ``name``'s elements as floats: a 16-bit buffer's as float32
        (exactly; a new array), else ``a`` itself."""
        element = self.elements[name]
        if element == "bfloat16":
            return from_bfloat16_bits(self.xp, a)
        if element == "float16":
            return a.astype(np.float32)
        return a

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
        ws.store, ws.elements = self.store, self.elements
        return ws

    def with_own(self, names) -> Workspace:
        """A Workspace of the same plan whose buffers ``names`` are new (NaN-poisoned) and
        every other one is this workspace's (shared, nothing else allocated): a chunked
        training pass (rnnrt/chunked.py) keeps each chunk's activations in buffers of its
        own over one set of scratch buffers."""
        ws = self.sharing(self.plan)
        ws.bufs = dict(self.bufs)
        for name in names:   # in the buffer's own element type (2 bytes for 16-bit storage)
            b = self.plan.buffer(name)
            ws.bufs[name] = self.xp.empty(b.size, dtype=ARRAY_DTYPES[self.elements[name]])
            ws._fill_nan(name)
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
                self._fill_nan(b.name)

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
        Names must be inputs of the plan; each array has its binding's shape. Where a
        binding's buffer is 16-bit, the values are rounded to it (to nearest, ties to even)."""
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
                self.view(v)[...] = self._stored(v.buf, a.reshape(v.rows, v.cols))
            else:
                for i, v in enumerate(b.views):
                    self.view(v)[...] = self._stored(v.buf, a[i].reshape(v.rows, v.cols))

    def read(self, name, copy=True):
        """The array bound to output (or input) ``name``, in its binding's shape; a 16-bit
        buffer's values as float32 (exactly the stored ones; a new array even with
        copy=False)."""
        b = self.plan.outputs.get(name) or self.plan.inputs[name]
        xp = self.xp
        if len(b.views) == 1:
            v = b.views[0]
            raw = self.view(v).reshape(b.shape)
            a = self._floats(v.buf, raw)
            return a.copy() if copy and a is raw else a
        return xp.stack([self._floats(v.buf, self.view(v)).reshape(b.shape[1:])
                         for v in b.views])

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
        buf = self._binding_buf(name)
        if fill is not None:
            v[...] = self._stored(buf, self.xp.full(v.shape, fill, dtype=self.dtype))
        if a is None:
            v[rows] = 0
        else:
            a = self.xp.asarray(a, dtype=self.dtype).reshape(len(rows), v.shape[1])
            v[rows] = self._stored(buf, a)

    def read_rows(self, name, rows):
        """The rows ``rows`` [n] of output ``name`` (``rows_view``): a [n, cols] copy (a
        16-bit buffer's as float32)."""
        return self._floats(self._binding_buf(name), self.rows_view(name)[rows])

    def _binding_buf(self, name):
        b = self.plan.inputs.get(name) or self.plan.outputs[name]
        return b.views[0].buf

    def load_inputs(self, x, h0=None, c0=None):
        """Forward inputs: x [T, B, I], h0 [L, B, H] (None: zeros), c0 [L, B, H] (LSTM)."""
        arrays = {"x": x, "h0": h0}
        if "c0" in self.plan.inputs:
            arrays["c0"] = c0
        self.load(**arrays)

    def load_output_grads(self, dy, dh_n=None, dc_n=None):
        """The backward's inputs: dy [T, B, H], dh_n [L, B, H] (None: zeros), dc_n [L, B, H]
        (LSTM; None: zeros)."""
        arrays = {"dy": dy, "dh_n": dh_n}
        if "dc_n" in self.plan.inputs:
            arrays["dc_n"] = dc_n
        self.load(**arrays)

    def outputs(self, copy=True):
        """Forward outputs: dict 'y' [T, B, H], 'h_n' [L, B, H], 'c_n' [L, B, H] (LSTM)."""
        return {name: self.read(name, copy) for name in ("y", "h_n", "c_n")
                if name in self.plan.outputs}
