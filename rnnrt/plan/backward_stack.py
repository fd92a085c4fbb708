"""The stack backward plan: a training key whose forward runs the stack kernel (every layer of
an LSTM or GRU stack in one launch) and whose ``PlanKey.backward`` is 'stack' or 'persistent', where
kernels/choice_backward.py's ``choose_persistent_backward`` gives the stack backward's fit
(kernels/stack_bwd.py). backward_persistent.py's ``backward_builder`` hands such keys here.

Tasks:
  ('sbwd',)     one launch of the stack backward on layer 0's recurrence stream (the fit's
                kernel: lstm_persistent_stack_bwd or its cluster-pair form at float32, the
                tensor-core lstm_persistent_stack_mma_bwd at bfloat16 / float16): every
                layer's recurrent chain, steps T-1 .. 0, along the reverse wavefront, with
                the gradient into each layer's input inside it (dg_t W_l: into the layer
                below's dhin rows, layer 0's into dx); it reads the stack forward's act and c
                (one buffer each, every layer's) and R, W from the params; writes every
                layer's dg (dgx), dhin but the top layer's (dy, read), dx, dh0 and dc0.
  ('wgrad', l)  backward.py's: one GEMM a weight matrix and one reduction a bias over all
                T*B rows of layer l's dg, on layer l's input stream after ('sbwd',): the four
                layers' GEMMs overlap one another.
Buffers: the forward's (the stack kernel's h, c, act, wt, ht), plus (sizes in elements)
  dhin  [L, T, B, H]   the gradient from above into each layer's h_{t+1}; layer L-1's = dy
  dgx   [L, T, B, G*H] every layer's gate gradients ('store': the dW GEMMs read them; the
                       tensor-core kernel stages its product's dg_t from them)
  dgt   [L, 2, G*H, 64] the fp32 kernels' scratch: dg_t^T k-major, two slots a layer (the
                       tensor-core kernel has none: StackBwdFit.dg_scratch)
  dhn, dcn [L, B, H]   the inputs dh_n, dc_n; dh0, dc0 [L, B, H] the outputs
  bsync [2L] unsigned  the kernel's progress counters (zero between launches)
  dx [T, B, I], grads, ones   as backward.py's
(no dhr, dc, dgh or dpart: dh_rec and dc never leave the kernel.) GRU (gru_persistent_stack_bwd, or _pair):
  dgh [L, T, B, 3H] beside dgx (the R side's gate gradients, for dW_hh), the forward's h read
  for c, dgt of 4H rows (dr, dz, dn, dhn), no dcn or dc0.
"""
from __future__ import annotations

from ..kernels.persistent import SYNC_WORDS
from ..kernels.registry import get_kernel
from ..kernels.stack_bwd import SB_BMAX
from .backward import BackwardBuilder
from .model import Binding, Buffer
from .ops import Kernel, View
from .recompute import recompute_buffers
from .schedule import Task
from .storage import labelled


class StackBackwardBuilder(BackwardBuilder):
    """backward.py's builder with every layer's recurrent chain (and dx) in one launch of
    the stack backward (``choice.stack``: kernels/stack_bwd.py's StackBwdFit), then the
    weight gradients' GEMMs."""

    def __init__(self, key, accumulate: bool, choice, need_dx: bool = True):
        super().__init__(key, accumulate, need_dx)
        if self.stack is None or choice.stack is None:
            raise AssertionError("stack backward plan: the forward must run the stack kernel "
                                 "and the choice must be the stack backward")
        self.splits = 1   # no recurrent GEMM: no split-K buffers
        self.sfit = choice.stack
        self.k = self.T

    # -- buffers and views ---------------------------------------------------------------------
    def buffers(self):
        T, B, H, L, GH = self.Tc, self.B, self.H, self.L, self.GH
        state = L * B * H
        lstm = self.cell.has_cell_state
        bufs = list(self.forward_buffers())
        bufs += [Buffer("dhin", L * T * B * H, "io"), Buffer("dgx", L * T * B * GH, "scratch")]
        if not lstm:   # GRU: the R side's gate gradients apart
            bufs.append(Buffer("dgh", L * T * B * GH, "scratch"))
        if self.sfit.dg_scratch:   # the fp32 kernels' k-major dg^T (the tensor-core one has none)
            # 4H product rows, two slots a layer, a block of them each batch group
            bufs.append(Buffer("dgt", self.sfit.groups * L * 2 * 4 * H * SB_BMAX, "scratch"))
        bufs.append(Buffer("dhn", state, "io"))
        if lstm:
            bufs.append(Buffer("dcn", state, "io"))
        bufs.append(Buffer("dh0", state, "io"))
        if lstm:
            bufs.append(Buffer("dc0", state, "io"))
        bufs += [Buffer("bsync", self.sfit.groups * SYNC_WORDS * L, "sync", "uint32"),
                 Buffer("dx", T * B * self.key.input_size, "io"),
                 Buffer("grads", self.layout.size, "grad"), Buffer("ones", T * B, "ones")]
        return labelled(self, bufs + recompute_buffers(self))

    def layer_rows(self, buf, layer, row, rows, width):
        """Rows [row, row + rows) of layer ``layer``'s part of ``buf`` ('dgx', 'dhin': T*B
        rows a layer, as the kernel addresses them)."""
        return View(buf, (layer * self.T * self.B + row) * width, rows, width, width)

    def dg_rows(self, layer, row, rows, side="x"):
        """LSTM: one side (dgx); GRU: dgx for W's gradients, dgh for R's."""
        buf = "dgh" if side == "h" and not self.cell.has_cell_state else "dgx"
        return self.layer_rows(buf, layer, row, rows, self.GH)

    # -- tasks ---------------------------------------------------------------------------------
    def sbwd_task(self):
        """Every layer's backward chain as one launch of the stack backward."""
        T, B, H, L, GH, fit = self.T, self.B, self.H, self.L, self.GH, self.sfit
        n, state = L * T * B, L * B
        lstm = self.cell.has_cell_state
        dhin = View("dhin", 0, n, H, H)
        dgs = (View("dgx", 0, n, GH, GH),) + (() if lstm else (View("dgh", 0, n, GH, GH),))
        outs = (*dgs, dhin, View("dx", 0, T * B, H, H), View("dh0", 0, state, H, H),
                *((View("dc0", 0, state, H, H),) if lstm else ()),
                View("bsync", 0, fit.groups, SYNC_WORDS * L, SYNC_WORDS * L))
        if fit.dg_scratch:
            outs += (View("dgt", 0, fit.groups * 8 * L * H, SB_BMAX, SB_BMAX),)
        act_w = self.cell.saved_gates * H   # (GRU: r, z, n, hn: 4H, GH = 3H)
        ins = (View("dhn", 0, state, H, H),
               *((View("dcn", 0, state, H, H),) if lstm else ()),
               self.seq("act", 0, 0, n, act_w),
               self.seq("c" if lstm else "h", 0, 0, L * (T + 1) * B, H),
               self.stack_param_rows("weight_ih", GH * H),
               self.stack_param_rows("weight_hh", GH * H))
        # dhin: the top layer's rows (dy) are read, the others written; dgx (the tensor-core
        # kernel) is read too, but only what it wrote in this launch
        dy = self.layer_rows("dhin", L - 1, 0, T * B, H)
        below = View("dhin", 0, (L - 1) * T * B, H, H)
        known = fit.scalars(T)
        scalars = tuple((k, known[k]) for k in get_kernel(fit.kernel).scalars)
        # the paper's count: each layer's dh = dg R, and dx = dg W (layer 0's with need_dx)
        flops = 2 * GH * H * B * T * (2 * L - (0 if self.need_dx else 1))
        op = Kernel(self.rec(0), fit.kernel, B, H, outs, ins, kind="persistent", layer=0,
                    steps=(0, T), scalars=scalars,
                    launch=(fit.grid, fit.block, fit.smem_bytes), flops=flops,
                    footprint=(ins + (dy,), dgs + (below,) + outs[len(dgs) + 1:]))
        return Task(("sbwd",), self.rec(0), [], (0, 0, 1), [op])

    def tasks(self) -> list[Task]:
        """The launch, then each layer's weight gradients (they read every step's dg)."""
        tasks = [self.sbwd_task()]
        for layer in range(self.L):
            tasks += self.wgrad_tasks(layer, lambda t0: ("sbwd",), None)
        return tasks

    def wgrad_granule(self) -> int:
        """One launch writes every step's dg: the weight gradients run in one chunk."""
        return self.T

    def backward_bindings(self):
        T, B, H, L, I = self.T, self.B, self.H, self.L, self.key.input_size
        state = (L, B, H)
        size = self.layout.size

        def whole(buf, rows, cols):
            return (View(buf, 0, rows, cols, cols),)

        inputs = {"dy": Binding((T, B, H), (self.layer_rows("dhin", L - 1, 0, T * B, H),)),
                  "dh_n": Binding(state, whole("dhn", L * B, H))}
        outputs = {"dh0": Binding(state, whole("dh0", L * B, H)),
                   "grads": Binding((size,), whole("grads", 1, size))}
        if self.cell.has_cell_state:
            inputs["dc_n"] = Binding(state, whole("dcn", L * B, H))
            outputs["dc0"] = Binding(state, whole("dc0", L * B, H))
        if self.need_dx:
            outputs = {"dx": Binding((T, B, I), whole("dx", T * B, I)), **outputs}
        return inputs, outputs
