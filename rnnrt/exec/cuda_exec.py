"""The GPU executors: eager (Python issues each op) and graph (the plan captured once into a
CUDA graph, then replayed). Both run the same prepared launches of one plan on one
workspace, so they compute the same thing; the graph removes the host's per-op cost.

Everything a run needs — streams, cuBLAS handles, events, kernel argument tuples, GEMM
argument tuples — is built in the constructor; ``run()`` allocates nothing.

Precision (rnnrt/precision.py): each kernel launch runs the instantiation for its views'
element types (the workspace's ``elements``): all fp32, the ``extern "C"`` kernel (as before
precisions existed); else its typed twin (kernels/typed.py), all of a plan's compiled
together before anything is prepared. Each GEMM runs the plan's precision (cublas.py's
GEMM_TYPES): its a and b must lie in buffers of the storage type, its out in an fp32 one.
"""
from __future__ import annotations

import functools

from ..kernels.registry import KERNELS, kernel_args
from ..kernels.typed import persistent_types
from ..plan.ops import Gemm, Kernel, Record, Wait
from ..precision import get_precision
from .cublas import CublasHandle

WORKSPACE_BYTES = 32 << 20   # per cuBLAS handle (cuBLAS's recommendation on Hopper)


class GpuContext:
    """CUDA state owned by one runner: streams (with a cuBLAS handle each) and kernels.

    Streams are created on first use, keyed by (index, priority), and reused by every plan
    the runner executes. Nothing here is module-level.
    """

    def __init__(self, cupy_module, kernel_library):
        self.cp = cupy_module
        self.kernels = kernel_library
        self._streams = {}
        self._workspaces = {}                 # stream key -> the workspace its handle points into
        self._lt = None

    def stream(self, index: int, priority: int):
        """(cupy Stream, CublasHandle) for plan stream ``index`` at ``priority``
        (CUDA convention: lower = higher priority; CUDA clamps it to the device's range)."""
        prio = int(priority)
        key = (index, prio)
        if key not in self._streams:
            s = self.cp.cuda.Stream(non_blocking=True, priority=prio)
            ws = self.cp.empty(WORKSPACE_BYTES, dtype=self.cp.uint8)
            self._workspaces[key] = ws
            self._streams[key] = (s, CublasHandle(s.ptr, ws.data.ptr, WORKSPACE_BYTES))
        return self._streams[key]

    def workspace_ptr(self, index: int, priority: int) -> int:
        """The device address of stream (index, priority)'s GEMM workspace (WORKSPACE_BYTES;
        cuBLASLt calls on the stream use it too: the stream orders them)."""
        self.stream(index, priority)
        return self._workspaces[(index, int(priority))].data.ptr

    def lt(self, chooser=None):
        """The context's chosen-algorithm GEMMs (exec/lt_gemms.py), made on first use (with
        ``chooser``, a kernels.gemm_algos.GemmAlgoChooser; None: the default rule)."""
        if self._lt is None:
            from .lt_gemms import LtGemms
            self._lt = LtGemms(self.cp, WORKSPACE_BYTES, chooser)
        elif chooser is not None and chooser is not self._lt.chooser:
            raise ValueError("lt: this context's GEMMs already have a chooser")
        return self._lt

    def close(self):
        for _, h in self._streams.values():
            h.close()
        self._streams.clear()
        if self._lt is not None:
            self._lt.close()
            self._lt = None


def view_types(op, elements) -> tuple[str, ...]:
    """The element types of Kernel ``op``'s views, outputs then inputs (``elements``: buffer
    name -> element type, a Workspace's ``elements``)."""
    return tuple(elements[v.buf] for v in op.outs + op.ins)


def twin_requests(plan, elements) -> list[tuple[str, tuple[str, ...]]]:
    """The (kernel, element types) of every pointwise launch of ``plan`` (``elements`` as in
    ``view_types``): what KernelLibrary.instantiate takes, so that a caller with several plans
    (a runner's forward and backward) can compile their twins together."""
    return [(op.name, view_types(op, elements)) for op in plan.ops
            if isinstance(op, Kernel) and not KERNELS[op.name].persistent]


class Prepared:
    """The launches of ``plan`` on workspace ``ws``, ready to issue."""

    def __init__(self, plan, ws, ctx: GpuContext):
        cp = ctx.cp
        self.plan, self.ws, self.ctx = plan, ws, ctx
        pairs = [ctx.stream(i, plan.stream_priority[i]) for i in range(len(plan.streams))]
        self.streams = [p[0] for p in pairs]
        self.handles = [p[1] for p in pairs]
        self.events = [cp.cuda.Event(block=False, disable_timing=True, interprocess=False)
                       for _ in range(plan.num_events)]
        # fork/join: the plan's other streams start after stream 0 and end before it
        self.fork = cp.cuda.Event(disable_timing=True)
        self.joins = [cp.cuda.Event(disable_timing=True) for _ in self.streams[1:]]
        self.dtype = plan.key.dtype
        # the typed twins this plan runs, compiled together (one compile a file) up front
        ctx.kernels.instantiate(twin_requests(plan, ws.elements))
        self.gemm_choices = []   # PlanKey.gemm 'lt': (op kind, layer, choice label or why not)
        self.calls = [self._prepare(op) for op in plan.ops]

    def ptr(self, v):
        buf = self.ws.bufs[v.buf]
        return buf.data.ptr + v.offset * buf.itemsize

    def types(self, op) -> tuple[str, ...]:
        """The element types of kernel ``op``'s views (outputs, then inputs)."""
        return view_types(op, self.ws.elements)

    def _check_gemm(self, op):
        store = get_precision(self.dtype).storage
        for what, v, want in (("a", op.a, store), ("b", op.b, store), ("out", op.out, "float32")):
            got = self.ws.elements[v.buf]
            if got != want:
                raise ValueError(f"{self.dtype} plan: a {op.kind} GEMM's {what} lies in buffer "
                                 f"{v.buf} of {got}, expected {want} (plan/model.py: a GEMM "
                                 f"reads 'store' buffers and writes 'float' ones)")

    def _prepare(self, op):
        if isinstance(op, Gemm):
            self._check_gemm(op)
            m, n, k = op.mnk()
            h = self.handles[op.stream]
            if self.plan.key.gemm == "lt":
                call = self._chosen_gemm(op)
                if call is not None:
                    return call
            prepared = h.prepare_gemm(self.ptr(op.out), op.out.ld, self.ptr(op.a), op.a.ld,
                                      self.ptr(op.b), op.b.ld, m, n, k, op.trans_a,
                                      op.trans_b, op.alpha, op.beta, dtype=self.dtype,
                                      batch=op.batch, strides=op.strides)
            return functools.partial(h.gemm, prepared)
        if isinstance(op, Kernel):
            info = KERNELS[op.name]
            smem = 0
            if info.persistent:
                # geometry from the plan's device fit; past 48 KB of dynamic shared memory
                # the kernel must opt in, here (before any capture), not at launch
                grid, block, smem = op.launch
                # a tf32 / 16-bit key runs the kernel's typed instantiation, whose h / dg
                # pointers are the storage type (kernels/typed.py)
                want = persistent_types(op.name, self.dtype)
                if self.types(op) != want:
                    raise ValueError(f"{op.name}: a {self.dtype} plan's views are of "
                                     f"{self.types(op)}, the kernel takes {want}")
                fn = self.ctx.kernels.with_shared(op.name, smem, self.dtype).kernel
            else:
                grid, block = info.launch(op.rows, op.cols)
                fn = self.ctx.kernels.get_typed(op.name, self.types(op)).kernel
            args = kernel_args(info, op.rows, op.cols,
                               [(self.ptr(v), v.ld) for v in op.outs],
                               [(self.ptr(v), v.ld) for v in op.ins], dict(op.scalars))
            return functools.partial(fn, grid, block, args, smem, self.streams[op.stream])
        if isinstance(op, Record):
            return functools.partial(self.events[op.event].record, self.streams[op.stream])
        if isinstance(op, Wait):
            return functools.partial(self.streams[op.stream].wait_event, self.events[op.event])
        raise TypeError(f"unknown op {op!r}")

    def _chosen_gemm(self, op):
        """PlanKey.gemm 'lt': the call of ``op`` with the algorithm kernels/gemm_algos.py
        chooses (timed beside as many copies as the plan has layers, up to its cap), or None
        where cublasSgemm's own choice runs it (chosen, or the op is batched: declined, and
        ``gemm_choices`` says so)."""
        if op.batch != 1:
            self.gemm_choices.append((op.kind, op.layer, "declined: batched (cublasSgemm)"))
            return None
        m, n, k = op.mnk()
        prio = self.plan.stream_priority[op.stream]
        call, choice = self.ctx.lt().prepare(
            m, n, k, op.trans_a, op.trans_b, self.ptr(op.out), op.out.ld, self.ptr(op.a),
            op.a.ld, self.ptr(op.b), op.b.ld, op.alpha, op.beta, self.streams[op.stream].ptr,
            self.ctx.workspace_ptr(op.stream, prio), copies=self.plan.key.num_layers)
        self.gemm_choices.append((op.kind, op.layer, choice.label))
        return call

    def issue(self):
        """Issue fork, every op in plan order, join — on the plan's streams."""
        s0 = self.streams[0]
        self.fork.record(s0)
        for s in self.streams[1:]:
            s.wait_event(self.fork)
        for call in self.calls:
            call()
        for s, e in zip(self.streams[1:], self.joins):
            e.record(s)
            s0.wait_event(e)


class EagerExecutor:
    """Python issues every op of the plan on every run."""

    name = "eager"

    def __init__(self, plan, ws, ctx: GpuContext):
        self.prepared = Prepared(plan, ws, ctx)
        self.stream = self.prepared.streams[0]

    def run(self):
        self.prepared.issue()


class GraphExecutor:
    """The plan captured once into a CUDA graph (``capture()``), replayed by ``run()``.

    The capture bakes in the workspace's pointers: inputs are loaded into the same buffers
    before each replay. The capture runs nothing: a test proves it by poisoning outputs
    before capture and finding them still poisoned after.
    """

    name = "graph"

    def __init__(self, plan, ws, ctx: GpuContext, capture: bool = True):
        self.prepared = Prepared(plan, ws, ctx)
        self.stream = self.prepared.streams[0]
        self.graph = None
        if capture:
            self.capture()

    def capture(self):
        cp = self.prepared.ctx.cp
        s0 = self.stream
        s0.synchronize()
        mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)
        if mode is None:
            s0.begin_capture()
        else:
            s0.begin_capture(mode=mode)
        try:
            self.prepared.issue()
        finally:
            graph = s0.end_capture()
        self.graph = graph
        try:
            graph.upload(s0)   # pay the upload once, not in the first timed replay
        except Exception:  # noqa: BLE001 - upload is an optimisation, older CuPy lacks it
            pass

    def run(self):
        if self.graph is None:
            self.capture()
        self.graph.launch(self.stream)


EXECUTORS = {"eager": EagerExecutor, "graph": GraphExecutor}
