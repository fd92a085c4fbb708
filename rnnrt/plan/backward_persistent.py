"""The persistent backward plan: ``PlanKey.backward`` 'grid', 'pair' (the grid kernel in
cluster pairs: its arguments and one launch a layer), 'cluster', 'regs' (the
register-resident cluster backward: the cluster kernel's arguments and chunking, R^T in
registers) or 'persistent' (the one of grid, pair and cluster the cost model prefers; a
schedule the selector offers for training shapes, no switch turns it on, so the rungs'
backward is unchanged). Where the forward runs the stack kernel
and the stack backward fits ('stack', or 'persistent'), the plan is backward_stack.py's.

Per layer, from the top (kernels/choice_backward.py's ``choose_persistent_backward`` says
whether the kernel fits and the steps k one launch covers; where it does not fit, the plan
is backward.py's per-step schedule with the reason in ``Plan.fallback``), chunks [t0, t1) of
k steps from the last to the first (k = T: one chunk, one launch a layer):
  ('pbwd', l, t0) one launch of the cell's persistent backward kernel, grid or cluster
                (cuda_src/persistent_bwd.cu), grid in pairs (persistent_bwd_pair.cu) or
                register-resident
                (cuda_src/persistent_regs_bwd.cu) on the recurrence stream: the recurrent chain
                of layer l over t = t1-1 .. t0, on views offset to the chunk (the kernel's
                T = t1 - t0): reading dhin{l} rows t0..t1 (the gradient from above), dh_n =
                dhr{l}[t1] and dc_n = dc{l}[t1] (slot T: the plan's inputs dh_n, dc_n; else
                what the chunk after wrote), the forward's act rows t0..t1, c or h slots
                t0..t1 (inclusive: the kernel reads slot t and t+1 of step t) and R; writing
                dg of its steps (dgx{l}, and dgh{l} for the GRU), dh0 -> dhr{l}[t0] and dc0
                -> dc{l}[t0] (the gradients into h_t0, c_t0: the chunk before reads them as
                its dh_n, dc_n; the GRU's direct part z*dh is in the kernel's dh0, as in its
                carried dh_rec). After the layer's previous chunk (same stream) and layer
                l+1's dx GEMM of the same rows (it writes dhin{l} there).
  ('dxb', l, t0) the gradient into layer l's input of the chunk's rows, one GEMM: dgx{l} W,
                into dhin{l-1} (dx for layer 0) — input stream, after ('pbwd', l, t0).
  ('wgrad', l)  backward.py's: one GEMM a weight matrix and one reduction a bias over all
                T*B rows (fp32 accumulation in a fixed order: the same bits every run), on
                the input stream after the layer's last launch ('pbwd', l, 0), overlapping
                the layers below; or, with PlanKey.wgrad_steps (rounded up to k), in chunks
                ('wgrad', l, t0) each after the launch starting at t0 (backward.py's
                ``wgrad_tasks``).
k = T for the grid kernel (and its pairs): it needs every block resident on its own SM, so two of its
launches never run at once: layer l-1's waits for layer l's dx GEMM, which waits for layer
l's launch. The cluster kernels wait only for their own cluster (no grid barrier, no
counters): with several layers and the wavefront they run chunked (k = the switches' input
chunk), layer l-1's chunk issued as soon as layer l's dx of those rows is, so the layers'
chains overlap along the reverse wavefront (priority by anti-diagonal of (layer, chunk) from
the top-right corner, as backward.py's per-step one) instead of running one after another.
Buffers: backward.py's, plus
  bsync  [2*L] unsigned  a layer's barrier counters (zero between launches; the cluster
                         kernels never touch them; a layer's launches are on one stream)
(dhr{l} and dc{l} are written at the chunk boundaries only: nothing reads the other slots).
"""
from __future__ import annotations

import dataclasses

from ..kernels.choice_backward import choose_persistent_backward
from ..kernels.persistent import SYNC_WORDS
from ..kernels.registry import get_kernel
from .backward import BackwardBuilder
from .backward_stack import StackBackwardBuilder
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
    choice): backward_stack.py's StackBackwardBuilder where the choice is the stack backward,
    PersistentBackwardBuilder where a per-layer kernel fits, else backward.py's per-step
    BackwardBuilder. Nothing is built (the workspace's size reads the builder's buffers)."""
    choice = choose_persistent_backward(key)   # 16-bit storage: declined
    if not choice.runs:
        return BackwardBuilder(key, accumulate, need_dx), choice
    if choice.stack is not None:
        return StackBackwardBuilder(key, accumulate, choice, need_dx), choice
    return PersistentBackwardBuilder(key, accumulate, choice, need_dx), choice


class PersistentBackwardBuilder(BackwardBuilder):
    """backward.py's builder with the recurrent chain of each layer in persistent launches
    of ``choice.steps_per_launch`` steps (``choice``: kernels/choice_backward.py's
    BackwardChoice, its ``fit`` the kernel's persistent_bwd.BwdFit) and the dx of each
    launch's rows in one GEMM."""

    def __init__(self, key: PlanKey, accumulate: bool, choice, need_dx: bool = True):
        super().__init__(key, accumulate, need_dx)
        # the kernel does dh = dG_h @ R itself: no split GEMM, so no dpart buffers
        self.splits = 1
        self.bfit = choice.fit
        # the chunk a launch covers is the chunk of its dx GEMM (the launch writes all of
        # its rows of dg before it)
        self.k = choice.steps_per_launch

    def buffers(self):
        return super().buffers() + (Buffer("bsync", SYNC_WORDS * self.L, "sync", "uint32"),)

    def chunks(self):
        """[(t0, t1)]: a layer's launches in the order they run, the last chunk first. The
        chunks start at multiples of k (as the input chunks); where k does not divide T the
        last one, [k * (T // k), T), is short, and runs first."""
        return [(t0, min(t0 + self.k, self.T)) for t0 in reversed(range(0, self.T, self.k))]

    def pbwd_task(self, layer, t0, t1):
        """Layer ``layer``'s recurrent chain over steps [t0, t1) as one launch, on views of
        the chunk's rows (the kernel's calling convention with T = t1 - t0)."""
        B, H, GH, fit = self.B, self.H, self.GH, self.bfit
        n = t1 - t0
        lstm = self.cell.has_cell_state
        outs = [View(f"dgx{layer}", t0 * B * GH, n * B, GH, GH)]
        if self.gru:
            outs.append(View(f"dgh{layer}", t0 * B * GH, n * B, GH, GH))
        outs.append(self.slot("dhr", layer, t0))             # dh0: into h_t0
        if lstm:
            outs.append(self.slot("dc", layer, t0))          # dc0: into c_t0
        outs.append(View("bsync", SYNC_WORDS * layer, 1, SYNC_WORDS, SYNC_WORDS))
        ins = [View(f"dhin{layer}", t0 * B * H, n * B, H, H),
               self.slot("dhr", layer, t1)]                  # dh_n: the chunk after's dh0
        if lstm:
            ins.append(self.slot("dc", layer, t1))           # dc_n
        nsave = self.cell.saved_gates
        if nsave:
            ins.append(self.seq("act", layer, t0 * B, n * B, nsave * H))
        # slots t0 .. t1: step t reads slot t and t + 1 (c_t, c_{t+1}; h_t; h_{t+1})
        ins.append(self.seq("c" if lstm else "h", layer, t0 * B, (n + 1) * B, H))
        r = self.param(layer, "weight_hh")
        ins.append(View("params", r.offset, GH, H, H))
        known = fit.scalars(n)
        scalars = tuple((k, known[k]) for k in get_kernel(fit.kernel).scalars)
        stream = self.rec(layer)
        op = Kernel(stream, fit.kernel, B, H, tuple(outs), tuple(ins), kind="persistent",
                    layer=layer, steps=(t0, t1), scalars=scalars,
                    launch=(fit.grid, fit.block, fit.smem_bytes), flops=2 * GH * H * B * n)
        deps = []
        if t1 < self.T:
            deps.append(("pbwd", layer, t1))   # the chunk after: its dh0 is our dh_n
        if layer < self.L - 1:
            deps.append(("dxb", layer + 1, t0))   # dhin{layer} of these rows
        return Task(("pbwd", layer, t0), stream, deps, self.chunk_prio(layer, t1, 1), [op])

    def chunk_prio(self, layer, t1, kind):
        """The reverse wavefront's priority of the chunk ending at t1 (backward.py's
        ``prio`` by anti-diagonal, counted in chunks from the end): layer l's chunk c and
        layer l-1's chunk c-1 share a diagonal, so layer l-1's launches are issued between
        layer l's, each on the diagonal after the dx GEMM it waits for."""
        rl, rc = self.L - 1 - layer, -(-(self.T - t1) // self.k)
        return (rl + rc, rl, kind)

    def tasks(self) -> list[Task]:
        """Every task of the pass: per layer its launches with their dx GEMMs, last chunk
        first, then its weight gradients."""
        tasks = []
        for layer in range(self.L):
            for t0, t1 in self.chunks():
                tasks.append(self.pbwd_task(layer, t0, t1))
                if self.wants_dx(layer):
                    dx = self.dxb_task(layer, t0, t1)
                    dx.deps = [("pbwd", layer, t0)]   # it reads the dg the launch wrote
                    dx.prio = self.chunk_prio(layer, t1, 0)
                    tasks.append(dx)
            # a chunk of the weight gradients reads its steps' dg: after the launch that
            # starts there (and so after every later chunk's launch, on its stream)
            tasks += self.wgrad_tasks(
                layer, lambda t0, l=layer: ("pbwd", l, t0),
                lambda t0, l=layer: self.chunk_prio(l, min(t0 + self.k, self.T), 2))
        return tasks

    def wgrad_granule(self) -> int:
        """A chunk of the weight gradients starts where a launch does (k = T: one chunk)."""
        return self.k
