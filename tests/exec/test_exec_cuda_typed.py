"""The CUDA executor's precision plumbing without a GPU (exec/cuda_exec.py's Prepared over a
stand-in context): in a 16-bit plan each pointwise launch gets the typed twin of its views'
element types and pointers that step 2 bytes an element in 16-bit buffers, each GEMM is
prepared in the plan's precision, a GEMM reading a non-storage buffer and a persistent
kernel over 16-bit views are refused with the reason; an fp32 plan launches only the
``extern "C"`` kernels and prepares only float32 GEMMs, as before.

The 16-bit plans are the builders' own (plan/storage.py): every GEMM operand's buffer
'store', the GEMMs reading 'store' copies of the fp32 weights made first by ew_copy."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from testkit import cpu_plan_key, fake_cupy_installed

from rnnrt.exec import cuda_exec
from rnnrt.exec.workspace import Workspace
from rnnrt.kernels import library as L
from rnnrt.kernels.registry import KERNELS
from rnnrt.plan import forward_plan
from rnnrt.plan.ops import Kernel
from rnnrt.plan.switches import ladder


class _Handle:
    def __init__(self):
        self.prepared = []

    def prepare_gemm(self, *args, dtype="float32", batch=1, strides=(0, 0, 0)):
        self.prepared.append(dtype)
        return (args, dtype)

    def gemm(self, prepared):   # never called here: nothing runs
        raise AssertionError("ran a GEMM")


class _Ctx:
    """GpuContext's surface for Prepared: streams with a handle each, kernels, events."""

    def __init__(self, kernels):
        self.kernels = kernels
        self.handle = _Handle()
        event = lambda **kw: SimpleNamespace(record=print)   # noqa: E731 - never called
        self.cp = SimpleNamespace(cuda=SimpleNamespace(Event=event))

    def stream(self, index, priority):
        return SimpleNamespace(wait_event=print), self.handle   # never called


def _device_ws(plan, store):
    """A Workspace's element types and buffers at made-up device addresses (NumPy arrays
    have no data.ptr): buffer i at 2**32 * (i + 1), its arrays' itemsize."""
    ws = Workspace(plan, np, np.float32, np.zeros(next(b.size for b in plan.buffers
                                                        if b.name == "params"), np.float32),
                   store=store)
    bufs = {name: SimpleNamespace(data=SimpleNamespace(ptr=(i + 1) << 32),
                                  itemsize=a.itemsize)
            for i, (name, a) in enumerate(ws.bufs.items())}
    return SimpleNamespace(bufs=bufs, elements=ws.elements)


def _relabelled(plan, dtype):
    """The plan of ``plan``'s key at precision ``dtype`` (the builders' own 16-bit plan: GEMM
    operands 'store', the weights read from ew_copy'd store copies) -> (plan, store buffer
    names)."""
    plan = forward_plan(dataclasses.replace(plan.key, dtype=dtype))
    return plan, {b.name for b in plan.buffers if b.dtype == "store"}


@pytest.fixture
def fake(monkeypatch):
    with fake_cupy_installed(monkeypatch) as f:
        yield f


@pytest.mark.parametrize("rung", [0, 3, 5], ids=lambda i: ladder(input_batch=2)[i].name)
@pytest.mark.parametrize("dtype, store", [("bfloat16", "bfloat16"), ("float16", "float16")])
def test_16bit_plan_launches_twins_and_gemm_ex(fake, rung, dtype, store):
    key = cpu_plan_key("lstm", 5, 3, 4, 6, 2, True, ladder(input_batch=2)[rung].switches)
    plan, operands = _relabelled(forward_plan(key), dtype)
    ws = _device_ws(plan, store)
    ctx = _Ctx(L.KernelLibrary())
    prep = cuda_exec.Prepared(plan, ws, ctx)
    assert ctx.handle.prepared and set(ctx.handle.prepared) == {dtype}
    twins = [c for c in fake.compiled if len(c) == 3]
    assert twins, "no typed twin compiled"
    assert len(twins) == len({KERNELS[n].file for n, t in prep.ctx.kernels.loaded_twins})
    kernels = [(op, call) for op, call in zip(plan.ops, prep.calls) if isinstance(op, Kernel)]
    for op, call in kernels:
        fn, args = call.func, call.args[2]
        types = tuple(ws.elements[v.buf] for v in op.outs + op.ins)
        assert any(t == store for t in types) == ("<" in fn.name), (op.name, types, fn.name)
        # the pointers: buffer base + offset * the element's bytes (2 in a store buffer)
        ptrs = [int(a) for a in args[2:2 + 2 * len(types):2]]
        for v, ptr in zip(op.outs + op.ins, ptrs):
            want = ws.bufs[v.buf].data.ptr + v.offset * (2 if v.buf in operands else 4)
            assert ptr == want, (op.name, v.buf)


def test_fp32_plan_is_as_before(fake):
    key = cpu_plan_key("gru", 5, 3, 4, 6, 2, True, ladder(input_batch=2)[5].switches)
    plan = forward_plan(key)
    ws = _device_ws(plan, "float32")
    ctx = _Ctx(L.KernelLibrary())
    prep = cuda_exec.Prepared(plan, ws, ctx)
    assert set(ctx.handle.prepared) == {"float32"}
    assert all(len(c) == 2 for c in fake.compiled)                # no name expressions
    names = {call.func.name for op, call in zip(plan.ops, prep.calls) if isinstance(op, Kernel)}
    assert names and all("<" not in n for n in names)


def test_gemm_reading_a_float_buffer_is_refused(fake):
    key = cpu_plan_key("lstm", 5, 3, 4, 6, 1, True, ladder(input_batch=2)[3].switches)
    plan, store = _relabelled(forward_plan(key), "bfloat16")
    assert "wS0" in store    # layer 0's 16-bit copy of W, which its W.x GEMM reads
    plan = dataclasses.replace(plan, buffers=tuple(dataclasses.replace(b, dtype="float")
                                                   if b.name == "wS0" else b
                                                   for b in plan.buffers))
    with pytest.raises(ValueError, match="GEMM's .* lies in buffer wS0 of float32, "
                                         "expected bfloat16"):
        cuda_exec.Prepared(plan, _device_ws(plan, "bfloat16"), _Ctx(L.KernelLibrary()))
