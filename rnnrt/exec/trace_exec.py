"""Per-op timelines of one pass: when each GEMM and kernel of a plan ran, on which stream.

``TracingExecutor`` (GPU) issues a plan eagerly with a timing-enabled CUDA event recorded
on each compute op's own stream right before and right after it, and reads every event's
time relative to one start event on stream 0. ``trace_numpy`` is the CPU analogue (the
NumPy executor in program order, ``perf_counter`` around each op) so the drawing is tested
without a GPU.

Both return a list of ``TraceOp`` (one per Gemm / Kernel op of the plan, in plan order):
    (index, stream, kind, layer, steps, t_start_ms, t_end_ms)
index: the op's position in ``plan.ops``; stream: its plan stream index; kind: the op's kind
('wx', 'rh' for GEMMs; 'pointwise', 'transpose' for kernels); layer, steps: the cells of the
(layer, step) grid it serves (steps = (first, last + 1)); t_*: ms since the start event.

Why a "hold" on the GPU: issuing eagerly from Python costs ~10 us a call, as long as one
small GEMM, so an eager timeline mostly shows the host's issue rate. Before the start event
the tracer puts one spinning kernel on stream 0 that every other stream waits behind (through
the plan's fork); the host issues the whole traced pass while it spins, and the GPU then runs
the queued work at its own pace, as a CUDA graph replay would. The spin is time-bounded
(a clock64 loop), so if the host is slower, or the launch queue fills, nothing deadlocks: the
trace says ``host_bound`` and stays correct, only paced by the host.
"""
from __future__ import annotations

import functools
import time
from typing import NamedTuple

import numpy as np

from ..plan.ops import Gemm, Kernel
from .cuda_exec import GpuContext, Prepared

# A single-thread spin of ``cycles`` SM clock cycles (clock64 cannot be optimised away).
_HOLD_SRC = r"""
extern "C" __global__ void rnnrt_trace_hold(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""
HOLD_MIN_MS, HOLD_MAX_MS = 10.0, 2000.0


class TraceOp(NamedTuple):
    index: int
    stream: int
    kind: str
    layer: int
    steps: tuple
    t_start_ms: float
    t_end_ms: float


def compute_ops(plan):
    """Indices of the plan's Gemm and Kernel ops (what a trace times; records and waits are
    not work)."""
    return [i for i, op in enumerate(plan.ops) if isinstance(op, (Gemm, Kernel))]


class TracingExecutor:
    """The plan's prepared launches (``cuda_exec.Prepared``, shared with the eager and
    graph executors) issued with an event pair around every Gemm / Kernel op.

    Every event, the hold kernel and every bound call are made here, in the constructor;
    issuing allocates nothing. ``trace()`` runs one plain eager pass (warm-up), then the
    traced pass, and returns the TraceOps; facts of the last trace are in ``self.info``.

    hold_ms: 'auto' (from the warm-up's host issue time: twice the traced issue estimate,
    clamped to [HOLD_MIN_MS, HOLD_MAX_MS]), a number of ms, or 0 / None for no hold.
    """

    name = "trace"

    def __init__(self, plan, ws, ctx: GpuContext, hold_ms="auto"):
        cp = ctx.cp
        self.cp, self.plan = cp, plan
        self.prepared = p = Prepared(plan, ws, ctx)
        self.stream = p.streams[0]
        self.hold_ms = hold_ms

        def timed_event():
            return cp.cuda.Event(block=False, disable_timing=False, interprocess=False)

        self.hold_start, self.start, self.end = timed_event(), timed_event(), timed_event()
        self.compute = compute_ops(plan)
        self.before = {i: timed_event() for i in self.compute}
        self.after = {i: timed_event() for i in self.compute}
        # the traced op sequence, bound once: record(before), op, record(after) on its stream
        calls = []
        for i, (op, call) in enumerate(zip(plan.ops, p.calls)):
            if i in self.before:
                s = p.streams[op.stream]
                calls += [functools.partial(self.before[i].record, s), call,
                          functools.partial(self.after[i].record, s)]
            else:
                calls.append(call)
        self._calls = calls
        # the hold kernel, compiled here (loaded the way kernels.KernelLibrary loads ours)
        module = cp.RawModule(code=_HOLD_SRC, options=("-std=c++17",))
        self._hold_fn = module.get_function("rnnrt_trace_hold").kernel
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        self._clock_khz = float(props.get("clockRate") or 2.0e6)   # unknown: assume 2 GHz
        self.info = {}

    def _issue_plain(self) -> float:
        """One untraced eager pass (``Prepared.issue``); returns the host's issue time (ms)."""
        t0 = time.perf_counter()
        self.prepared.issue()
        return (time.perf_counter() - t0) * 1e3

    def _issue_traced(self, hold_args):
        """hold (optional), start, fork, every op between its events, join, end."""
        p = self.prepared
        s0 = self.stream
        self.hold_start.record(s0)
        if hold_args is not None:
            self._hold_fn((1, 1, 1), (1, 1, 1), hold_args, 0, s0)
        # start before the fork: every other stream waits on the fork, so every op of the
        # pass begins after the start event and no time is negative
        self.start.record(s0)
        p.fork.record(s0)
        for s in p.streams[1:]:
            s.wait_event(p.fork)
        t0 = time.perf_counter()
        for call in self._calls:
            call()
        issue_ms = (time.perf_counter() - t0) * 1e3
        for s, e in zip(p.streams[1:], p.joins):
            e.record(s)
            s0.wait_event(e)
        self.end.record(s0)
        return issue_ms

    def trace(self, reload=None) -> list[TraceOp]:
        """Warm-up pass, then the traced pass; returns one TraceOp per Gemm / Kernel op.

        reload: called between the two passes to load the inputs again (a pass may overwrite
        its inputs: inference keeps LSTM's c in two ping-pong slots, one of them c0's), so
        the traced pass computes from the caller's inputs. Copies it makes on any stream are
        finished (device synchronised) before the traced pass is issued.
        """
        cp = self.cp
        # warm-up: kernels loaded, cuBLAS heuristics cached, the hold kernel run once
        self._hold_fn((1, 1, 1), (1, 1, 1), (np.int64(0),), 0, self.stream)
        plain_ms = self._issue_plain()
        self.stream.synchronize()
        cp.cuda.runtime.deviceSynchronize()
        if reload is not None:
            reload()
            cp.cuda.runtime.deviceSynchronize()
        if self.hold_ms == "auto":
            # traced issue makes 3 calls per compute op where the plain pass made 1
            scale = len(self._calls) / max(1, len(self.prepared.calls))
            hold = min(HOLD_MAX_MS, max(HOLD_MIN_MS, 2.0 * plain_ms * scale))
        else:
            hold = float(self.hold_ms or 0.0)
        hold_args = (np.int64(int(hold * self._clock_khz)),) if hold > 0 else None
        issue_ms = self._issue_traced(hold_args)
        self.end.synchronize()
        elapsed = cp.cuda.get_elapsed_time
        ops = []
        for i in self.compute:
            op = self.plan.ops[i]
            ops.append(TraceOp(i, op.stream, op.kind, op.layer, tuple(op.steps),
                               elapsed(self.start, self.before[i]),
                               elapsed(self.start, self.after[i])))
        hold_real = elapsed(self.hold_start, self.start)
        self.info = {
            "total_ms": elapsed(self.start, self.end),
            "host_issue_ms": issue_ms,
            "warmup_issue_ms": plain_ms,
            "hold_ms": hold_real,
            # the host issued the traced pass after the GPU had started on it: the timeline
            # is (partly) paced by Python, not by the GPU
            "host_bound": bool(issue_ms > hold_real),
            "clock": "CUDA events (timing enabled) on each op's stream, ms since the start "
                     "event on stream 0",
        }
        return ops

    def run(self):
        """An untraced eager pass (same interface as the other executors)."""
        self.prepared.issue()


def trace_numpy(plan, ws, warmup: int = 1, reload=None) -> tuple[list[TraceOp], dict]:
    """The CPU analogue: run ``plan`` on a NumPy workspace in program order with
    ``perf_counter`` around each Gemm / Kernel op. Returns (TraceOps, info).
    reload: as ``TracingExecutor.trace``'s, called after the warm-up passes."""
    from .numpy_exec import run as run_numpy, run_op
    for _ in range(warmup):
        run_numpy(plan, ws)
    if warmup and reload is not None:
        reload()
    clock = time.perf_counter
    idx = compute_ops(plan)
    times = []
    t_begin = clock()
    for i in idx:
        t0 = clock()
        run_op(plan.ops[i], ws)
        times.append((t0, clock()))
    t_total = clock() - t_begin
    ops = [TraceOp(i, plan.ops[i].stream, plan.ops[i].kind, plan.ops[i].layer,
                   tuple(plan.ops[i].steps), (a - t_begin) * 1e3, (b - t_begin) * 1e3)
           for i, (a, b) in zip(idx, times)]
    info = {"total_ms": t_total * 1e3, "host_issue_ms": t_total * 1e3, "hold_ms": 0.0,
            "host_bound": True,
            "clock": "perf_counter around each op, NumPy executor in program order (CPU: "
                     "streams do not overlap; the rows show the schedule, not concurrency)"}
    return ops, info
