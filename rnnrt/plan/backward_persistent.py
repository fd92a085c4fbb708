"""The persistent backward plan: ``PlanKey.backward`` 'grid', 'cluster' or 'persistent' (the
one the cost model prefers; a schedule the selector offers for training shapes, no switch
turns it on, so the rungs' backward is unchanged).

Per layer, from the top (kernels/choice.py's ``choose_persistent_backward`` says whether the
kernel fits; where it does not, the plan is backward.py's per-step schedule with the reason
in ``Plan.fallback``):
  ('pbwd', l)   one launch of the cell's persistent backward kernel, grid or cluster
                (cuda_src/persistent_bwd.cu) on the recurrence stream: the whole recurrent
                chain of layer l, t = T-1 .. 0, reading dhin{l} (every step's gradient from
                above), dh_n (dhr{l}[T]), dc_n (dc{l}[T]), the forward's act, c or h and R;
                writing dg of every step (dgx{l}, and dgh{l} for the GRU), dh0 (dhr{l}[0])
                and dc0 (dc{l}[0]). After layer l+1's dx GEMM (it writes dhin{l}).
  ('dxb', l, 0) the gradient into layer l's input, ONE GEMM over all T*B rows: dgx{l} W,
                into dhin{l-1} (dx for layer 0) — input stream, after ('pbwd', l).
  ('wgrad', l)  backward.py's: one GEMM a weight matrix and one reduction a bias over all
                T*B rows (fp32 accumulation in a fixed order: the same bits every run), on
                the input stream after ('pbwd', l), overlapping layer l-1's kernel.
Two persistent backward launches never run at once (a grid kernel needs its blocks resident
on their own SMs): layer l-1's waits for layer l's dx GEMM, which waits for layer l's launch.
(The cluster kernels do not touch bsync.)
Buffers: backward.py's, plus
  bsync  [2*L] unsigned  a layer's barrier counters (zero between launches)
(dhr{l}[1..T-1] are not written: nothing reads them in this plan).
"""
from __future__ import annotations

import dataclasses

from ..kernels.choice import choose_persistent_backward
from ..kernels.persistent import SYNC_WORDS
from ..kernels.registry import get_kernel
from .backward import BackwardBuilder
from .model import Buffer, Plan, PlanKey
from .ops import Kernel, View
from .schedule import Task


def persistent_backward(key: PlanKey, accumulate: bool, need_dx: bool = True) -> Plan:
    """The backward Plan of a training key with ``backward`` set: the persistent kernel's
    schedule where it fits, else the per-step one with ``fallback`` saying why. need_dx as
    backward.backward_plan's."""
    builder, choice = backward_builder(key, accumulate, need_dx)
    plan = builder.build()
    return dataclasses.replace(plan, fit=choice.describe(),
                               fallback=None if choice.runs else choice.fallback)


def backward_builder(key: PlanKey, accumulate: bool = False, need_dx: bool = True):
    """-> (the builder of the backward plan of a key with ``backward`` set, the persistent
    choice): PersistentBackwardBuilder where the kernel fits, else backward.py's per-step
    BackwardBuilder. Nothing is built (the workspace's size reads the builder's buffers)."""
    choice = choose_persistent_backward(key)   # 16-bit storage: declined
    if not choice.runs:
        return BackwardBuilder(key, accumulate, need_dx), choice
    return PersistentBackwardBuilder(key, accumulate, choice.fit, need_dx), choice


class PersistentBackwardBuilder(BackwardBuilder):
    """backward.py's builder with the recurrent chain of each layer in one persistent launch
    (``fit``: the kernel's persistent_bwd.BwdFit) and each layer's dx in one GEMM."""

    def __init__(self, key: PlanKey, accumulate: bool, fit, need_dx: bool = True):
        super().__init__(key, accumulate, need_dx)
        self.bfit = fit
        self.k = self.T   # one dx GEMM a layer: the kernel writes all of dg before it

    def buffers(self):
        return super().buffers() + (Buffer("bsync", SYNC_WORDS * self.L, "sync", "uint32"),)

    def pbwd_task(self, layer):
        """Layer ``layer``'s recurrent chain, all T steps, as one launch."""
        T, B, H, GH, fit = self.T, self.B, self.H, self.GH, self.bfit
        lstm = self.cell.has_cell_state
        outs = [View(f"dgx{layer}", 0, T * B, GH, GH)]
        if self.gru:
            outs.append(View(f"dgh{layer}", 0, T * B, GH, GH))
        outs.append(self.slot("dhr", layer, 0))              # dh0
        if lstm:
            outs.append(self.slot("dc", layer, 0))           # dc0
        outs.append(View("bsync", SYNC_WORDS * layer, 1, SYNC_WORDS, SYNC_WORDS))
        ins = [View(f"dhin{layer}", 0, T * B, H, H), self.slot("dhr", layer, T)]
        if lstm:
            ins.append(self.slot("dc", layer, T))            # dc_n
        nsave = self.cell.saved_gates
        if nsave:
            ins.append(self.seq("act", layer, 0, T * B, nsave * H))
        ins.append(self.seq("c" if lstm else "h", layer, 0, (T + 1) * B, H))
        r = self.param(layer, "weight_hh")
        ins.append(View("params", r.offset, GH, H, H))
        known = fit.scalars(T)
        scalars = tuple((k, known[k]) for k in get_kernel(fit.kernel).scalars)
        stream = self.rec(layer)
        op = Kernel(stream, fit.kernel, B, H, tuple(outs), tuple(ins), kind="persistent",
                    layer=layer, steps=(0, T), scalars=scalars,
                    launch=(fit.grid, fit.block, fit.smem_bytes), flops=2 * GH * H * B * T)
        deps = [("dxb", layer + 1, 0)] if layer < self.L - 1 else []
        return Task(("pbwd", layer), stream, deps, (self.L - 1 - layer, 0, 1), [op])

    def tasks(self) -> list[Task]:
        tasks = []
        for layer in range(self.L):
            tasks.append(self.pbwd_task(layer))
            dx = (self.dxb_task(layer, 0, self.T),) if self.wants_dx(layer) else ()
            for task in (*dx, self.wgrad_task(layer)):
                task.deps = [("pbwd", layer)]   # both read the dg the launch wrote
                tasks.append(task)
        return tasks
