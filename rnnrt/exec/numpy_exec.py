"""The CPU executor: runs a plan's ops with NumPy, in program order or in a random
interleaving of its streams that respects only stream order and events.

With ``order='random'`` this is the dynamic half of the race checker: any interleaving
it picks is one a GPU could legally run, so if the result differs from program order
(or from the reference), the plan is missing a dependency. ``racecheck.find_races``
is the static half.

Precision (``plan.key.dtype``; rnnrt/precision.py): the workspace is float (float64 in the
tests), and every write into a "store" buffer (plan/model.py Buffer) is rounded to the
storage type with ``precision.round_to_storage``, exactly where the GPU rounds: a kernel's
outputs in a store buffer (its NumPy twin computes in float, the store rounds: the step's
h, the backward's gate gradients, the weights' copies and transposes), and the inputs bound
to store buffers (x, h0), rounded at the start of each run (no op writes them, so this is
their load's rounding; the runner's Workspace loads them just before). GEMMs never write a
store buffer (validate refuses it): their products stay float64, the GPU's fp32
accumulation differing by accumulation rounding only. fp32 / tf32 storage rounds nothing.
"""
from __future__ import annotations

import functools

import numpy as np

from ..kernels.registry import KERNELS
from ..plan.ops import Gemm, Kernel, Record, Wait
from ..precision import gemm_operand, round_to_storage
from .workspace import Workspace


@functools.lru_cache(maxsize=64)
def store_buffers(plan) -> frozenset:
    """The names of ``plan``'s buffers whose writes round (its "store" buffers where its
    key's storage is 16-bit; empty for fp32 storage). Cached per plan (64 plans)."""
    if not plan.key.precision.rounds:
        return frozenset()
    return frozenset(b.name for b in plan.buffers if b.dtype == "store")


def round_stored(ws: Workspace, views, dtype) -> None:
    """Round the elements of ``views`` (Views of store buffers) in place to ``dtype``'s
    storage."""
    for v in views:
        a = ws.view(v)
        a[...] = round_to_storage(a, dtype)


def round_inputs(plan, ws: Workspace) -> None:
    """The load's rounding of ``plan``'s inputs bound to store buffers (x, h0; idempotent:
    a value already rounded stays)."""
    store = store_buffers(plan)
    if store:
        round_stored(ws, [v for b in plan.inputs.values() for v in b.views if v.buf in store],
                     plan.key.dtype)


def run_op(op, ws: Workspace) -> None:
    """Execute one Gemm or Kernel op on the workspace's NumPy buffers; a kernel's outputs
    in store buffers are rounded to the storage type (the module's docstring)."""
    if isinstance(op, Gemm):
        dtype = ws.plan.key.dtype   # tf32: the product reads its operands TF32-rounded
        for va, vb, vo in op.entries():   # a batched GEMM: its products one by one
            a = gemm_operand(ws.view(va), dtype)
            b = gemm_operand(ws.view(vb), dtype)
            a = a.T if op.trans_a else a
            b = b.T if op.trans_b else b
            out = ws.view(vo)
            prod = a @ b
            if op.alpha != 1.0:
                prod = op.alpha * prod
            if op.beta != 0.0:
                prod = prod + op.beta * out
            out[...] = prod
    elif isinstance(op, Kernel):
        info = KERNELS[op.name]
        # a persistent kernel rounds inside its recurrence (each step's h or dg, its product
        # operands): its twin takes the key's precision
        extra = {"dtype": ws.plan.key.dtype} if info.persistent else {}
        info.numpy_fn(op.rows, op.cols, [ws.view(v) for v in op.outs],
                      [ws.view(v) for v in op.ins], *[v for _, v in op.scalars], **extra)
        store = store_buffers(ws.plan)
        if store:
            round_stored(ws, [v for v in op.outs if v.buf in store], ws.plan.key.dtype)
    else:
        raise TypeError(f"run_op: not a compute op: {op!r}")


def run(plan, ws: Workspace, order: str = "program", seed: int | None = None,
        max_burst: int = 8) -> list[int]:
    """Run ``plan`` on ``ws``; returns the op indices in the order they were executed.

    order='program': issue order. order='random': repeatedly pick a stream that can make
    progress and run 1..max_burst of its next ops (a Wait blocks its stream until the
    event's Record has run). The pick mixes two policies, both legal schedules: mostly the
    first runnable stream in a random priority order (reshuffled now and then), which lets
    one stream run as far ahead of another as the events allow — what exposes a missing
    wait — and sometimes a uniformly random runnable stream.
    """
    round_inputs(plan, ws)
    if order == "program":
        for op in plan.ops:
            if isinstance(op, (Gemm, Kernel)):
                run_op(op, ws)
        return list(range(len(plan.ops)))
    if order != "random":
        raise ValueError(f"order: expected 'program' or 'random', got {order!r}")
    rng = np.random.default_rng(seed)
    queues = [[i for i, op in enumerate(plan.ops) if op.stream == s]
              for s in range(len(plan.streams))]
    heads = [0] * len(queues)
    done_events = set()
    executed = []
    rank = rng.permutation(len(queues))

    def blocked(s):
        op = plan.ops[queues[s][heads[s]]]
        return isinstance(op, Wait) and op.event not in done_events

    while True:
        live = [s for s in range(len(queues)) if heads[s] < len(queues[s])]
        if not live:
            break
        runnable = [s for s in live if not blocked(s)]
        if not runnable:
            raise RuntimeError("numpy executor: deadlock (every stream waits on an event "
                               "whose record cannot run)")
        if rng.random() < 0.02:
            rank = rng.permutation(len(queues))
        if rng.random() < 0.25:
            s = runnable[rng.integers(len(runnable))]
        else:
            s = min(runnable, key=lambda q: rank[q])
        for _ in range(int(rng.integers(1, max_burst + 1))):
            if heads[s] >= len(queues[s]) or blocked(s):
                break
            i = queues[s][heads[s]]
            op = plan.ops[i]
            if isinstance(op, Record):
                done_events.add(op.event)
            elif not isinstance(op, Wait):
                run_op(op, ws)
            executed.append(i)
            heads[s] += 1
    return executed
