"""The backward plan (backpropagation through time) with the same switches as the forward.

``backward_plan(key, accumulate)`` runs after ``forward_plan(key)`` (key.train must be True)
on the same workspace: it reads what the forward saved (h{l}, c{l}, act{l}, x, and wT{l} /
rT{l} when pre-transposed — transposed once per training step, by the forward) and writes
the gradients. Its buffer list is the forward's plus its own, so one workspace serves both.

Data pass, per layer l from the top, steps t = T-1 .. 0 (the forward's grid run backwards):
  ('cellb', l, t)  pointwise backward of step t (fused: one kernel; naive: one per op), then
                   dh_rec[t] (+)= dG_h[t] @ R  (grouped: one GEMM; else one per gate)
                   — recurrence stream
  ('dxb', l, t0)   the gradient into layer l's input for steps [t0, t0+k): dG_x[t0:t1] @ W,
                   written into dhin{l-1} (or dx for layer 0) — input stream; input batching
                   applies (k steps per GEMM)
Wavefront (reverse): layer l's step t needs layer l+1's step t (through dhin{l}) and its own
step t+1; priority by anti-diagonal from the top-right corner. Without it layer l starts when
layer l+1 has finished.
Weight gradients after the data pass of each layer (paper section 8): ('wgrad', l) = one
GEMM per weight matrix over all T*B rows, dW = dG_x^T X, dR = dG_h^T H[0:T], and each bias a
reduction (a GEMM with a ones vector; kind 'db', not counted in FLOPs). With accumulate=True
they add into the 'grads' buffer (beta = 1), so a caller can sum over minibatches.
In chunks (PlanKey.wgrad_steps, kernels/gemm_split.py's rule): ('wgrad', l, t0) the same
over the rows of steps [t0, t1), each after ('cellb', l, t0) (the chain has written those
steps' dg) and the chunk after it in time (beta 1: the chunks add up in one fixed order, the
same bits every run), on a stream of their own (wg{l}, lowest priority), so they overlap the
rest of the chain instead of following it (measured slower: the rule keeps one chunk).
Placement (PlanKey.wgrad_streams, kernels/gemm_split.py ``wgrad_stream_count``): on the
layer's input stream after its dx GEMMs (1), on a stream of their own (2: wg{l}), or the W
side (dW, bias_ih) on wg{l} and the R side (dR, bias_hh) on wh{l} (3: the rule's at one
layer, where the dx GEMM and the two sides are the whole tail and overlap).

A key with ``backward`` set gets the persistent backward instead (backward_persistent.py:
per layer one kernel launch for the recurrent chain, or with the cluster kernel in a stack
one launch an input chunk along the reverse wavefront, each followed by its dx GEMM; then
one GEMM each for the weight and bias gradients), or this schedule with the reason where its
kernel does not fit. The recurrent GEMM of this schedule may be split along K
(kernels/gemm_split.py; ``split_dh``): its partial products are summed by the next step's
fused pointwise kernel (the *_split kernels; ``sums_splits``), so that in such a plan dhr's
slots 1..T-1 hold only the direct parts the GRU's and the masked kernels write (nothing for
the others), and by one ordered sum kernel at step 0 (into dh0's slot).

Buffers added to the forward's (sizes in elements):
  dhin{l}  [T, B, H]   gradient arriving at h{l}[t+1] from above (top layer: dy)
  dhr{l}   [T+1, B, H] gradient into h{l}[t] from step t (dhr[T] = dh_n, dhr[0] = dh0)
  dc{l}    [T+1, B, H] LSTM: gradient into c{l}[t] (dc[T] = dc_n, dc[0] = dc0)
  dgx{l}   [T, B, G*H] gradient of the W-side pre-activations (incl. bias_ih)
  dgh{l}   [T, B, G*H] GRU only: of the R-side pre-activations (others share dgx)
  dtmp{l}  [4, B, H]   naive pointwise temporaries
  dx       [T, B, I]   gradient of the input sequence
  grads    [layout.size] parameter gradients in the model's flat layout (role 'grad')
  ones     [T*B]       ones, for the bias reductions

Variable-length plans (key.batch_sizes, the forward's packed layout): step t works on its
P[t] rows; dhin, dgx, dgh and dx are packed like gx, dhr and dc like h (slot 0, then the
slot after each step). The masked backward kernels write the direct part of dh_{t-1} (0 on
running rows, the gradient passed through on frozen ones) into dhr's slot t, and the R
GEMMs add to it (beta = 1). A task ('dfinal', l) first copies dh_n / dc_n (inputs, in
dhn / dcn [L, B, H]) into each row's last slot. dR = dG_h^T H_prev is one GEMM per run of
steps with one active batch (two where the run starts after a larger batch: step t reads
the first P[t] rows of slot t, which holds P[t-1]).
  dhn, dcn [L, B, H]   dh_n, dc_n of a variable-length plan

Precision (forward.py's docstring; rnnrt/precision.py): dgx, dgh and ones are "store" (the
dx, dh, dW, dR GEMMs and the bias sums read them), so the pointwise kernels' writes of the
gate gradients round to the storage type and every GEMM reads the rounded ones; dhin, dhr,
dc, dx and the gradients stay fp32 (GEMM outputs). The weights are read where the forward
left them in the storage type (wT / rT, or the copies wS / rS of a 16-bit key). The naive
GRU backward keeps dn' (the n block's gate gradient) in a fp32 temporary where storage
rounds, so that dgh_n = dn' r and dr = dn' hn use the unrounded value, as the fused kernel
does (the rounding is only where dn' is stored for the GEMMs).
"""
from __future__ import annotations

from contextlib import contextmanager

from ..cells import backward_flops, forward_flops, get_cell
from ..kernels.gemm_split import dh_splits, wgrad_chunk_steps, wgrad_stream_count
from ..sizes import check_plan
from .cache import plan_cache
from .forward import ForwardBuilder, forward_plan
from . import naive
from .model import Binding, Buffer, Plan, PlanKey, building, validate
from .ops import Gemm, Kernel, View
from .recompute import after_recompute, recompute_buffers, recompute_tasks, recomputes
from .schedule import Task, schedule
from .storage import labelled


@contextmanager
def split_sums_unfolded():
    """Within the block, backward plans sum the split recurrent GEMM's partial products with
    ew_sum_splits at every step (``BackwardBuilder.sums_splits`` False): the plan before the
    fold, for timing the two in one process (experiments/scripts) and for the tests that
    compare their bits. The plan cache is cleared on entry and on exit, so that no plan of
    one kind is served inside the other's block. Not thread-safe (it swaps a method)."""
    original = BackwardBuilder.sums_splits
    backward_plan.cache_clear()
    BackwardBuilder.sums_splits = lambda self, t: False
    try:
        yield
    finally:
        BackwardBuilder.sums_splits = original
        backward_plan.cache_clear()


@plan_cache(maxsize=128)
def backward_plan(key: PlanKey, accumulate: bool = False, need_dx: bool = True) -> Plan:
    """The backward pass of ``key`` (key.train must be True) as a Plan, cached. need_dx
    False: without the gradient of the input sequence (layer 0's dx GEMMs and the 'dx'
    output: a caller whose input needs no gradient; the same buffers, so the same
    workspace)."""
    if not key.train:
        raise ValueError("backward_plan: key.train must be True (the forward must save "
                         "what the backward reads)")
    check_plan(key, backward=True)
    with building():
        if key.backward is not None:   # the persistent backward kernel (or why not)
            from .backward_persistent import persistent_backward
            plan = persistent_backward(key, accumulate, need_dx)
        else:
            plan = BackwardBuilder(key, accumulate, need_dx).build()
        validate(plan, also=forward_plan(key))
    expect = backward_flops(key.cell, key.input_size, key.hidden_size, key.num_layers,
                            1, key.rows)
    if not need_dx:   # less layer 0's dx GEMMs: 2 x rows x (G*H) x input_size
        expect -= 2 * key.rows * get_cell(key.cell).gates * key.hidden_size * key.input_size
    if recomputes(key):   # the forward's GEMMs again, remaking the gates (recompute.py)
        expect += forward_flops(key.cell, key.input_size, key.hidden_size, key.num_layers,
                                key.batch, key.steps)
    if plan.gemm_flops() != expect:
        raise AssertionError(f"backward plan GEMM FLOPs {plan.gemm_flops()} != {expect}")
    return plan


def workspace_buffers(key: PlanKey) -> tuple[Buffer, ...]:
    """The buffers of ``key``'s workspace, as its plans' builders list them (no op built):
    a training key's backward plan's (a superset of the forward's: one workspace serves
    both passes, the persistent backward's barrier counters included), else the forward's."""
    if not key.train:
        return ForwardBuilder(key).buffers()
    if key.backward is not None:
        from .backward_persistent import backward_builder
        return backward_builder(key)[0].buffers()
    return BackwardBuilder(key, False).buffers()


class BackwardBuilder(ForwardBuilder):
    """Builds the backward plan of a training key on top of the forward builder's views,
    buffers and streams (one workspace serves both passes)."""

    def __init__(self, key: PlanKey, accumulate: bool, need_dx: bool = True):
        super().__init__(key)
        self.need_dx = bool(need_dx)
        # the persistent switch may make the forward one input GEMM per layer (k = T); the
        # per-step backward keeps the switches' own chunking: with k = T, layer l-1's
        # backward could not start before all of layer l's dx GEMM (no wavefront across
        # layers; measured 16.1 against 11.6 ms fwd+bwd on the H100). The persistent
        # backward (backward_persistent.py) sets k = T: its launch writes all of dg first.
        self.k = self.sw.steps_per_input_gemm(self.T)
        self.accumulate = accumulate
        self.gru = self.cell.name == "gru"
        # the recurrent GEMM dh = dG_h @ R split along K (kernels/gemm_split.py)
        self.splits = dh_splits(key) if self.sw.grouped else 1

    # -- buffers -----------------------------------------------------------------------------
    def buffers(self):
        T, B, H, GH = self.Tc, self.B, self.H, self.GH
        bufs = list(super().buffers())   # the forward's (they do not depend on the chunk k)
        if self.varlen:
            bufs.append(Buffer("dhn", self.L * B * H, "io"))
            if self.cell.has_cell_state:
                bufs.append(Buffer("dcn", self.L * B * H, "io"))
        for layer in range(self.L):
            bufs += [Buffer(f"dhin{layer}", T * B * H, "io"),
                     Buffer(f"dhr{layer}", (T + 1) * B * H, "io"),
                     Buffer(f"dgx{layer}", T * B * GH, "scratch")]
            if self.cell.has_cell_state:
                bufs.append(Buffer(f"dc{layer}", (T + 1) * B * H, "io"))
            if self.gru:
                bufs.append(Buffer(f"dgh{layer}", T * B * GH, "scratch"))
            if not self.sw.fused:
                bufs.append(Buffer(f"dtmp{layer}", 4 * B * H, "scratch"))
            if self.splits > 1:
                bufs.append(Buffer(f"dpart{layer}", self.splits * B * H, "scratch"))
        bufs += [Buffer("dx", T * B * self.key.input_size, "io"),
                 Buffer("grads", self.layout.size, "grad"),
                 Buffer("ones", T * B, "ones")]
        return labelled(self, bufs + recompute_buffers(self))

    # -- views -----------------------------------------------------------------------------
    def step(self, buf, layer, t, width=None):
        """Step t's [bs[t], width] rows of a packed per-layer buffer (dhin, dgx, dgh; made
        once: steps t and t+1 ask for the same views)."""
        w = self.H if width is None else width
        memo = ("step", buf, layer, t, w)
        v = self._views.get(memo)
        if v is None:
            v = self._views[memo] = View(f"{buf}{layer}", self.off[t] * w, self.bs[t], w, w)
        return v

    def slot(self, buf, layer, index, rows=None):
        """Slot ``index`` of a per-layer buffer laid out like h (dhr, dc): [rows, H], rows
        the slot's own or its first ``rows`` (made once)."""
        rows = self.slot_rows(index) if rows is None else rows
        memo = ("slot", buf, layer, index, rows)
        v = self._views.get(memo)
        if v is None:
            v = self._views[memo] = View(f"{buf}{layer}", self.slot_row(index) * self.H, rows,
                                         self.H, self.H)
        return v

    def dgh_name(self, layer):
        return f"dgh{layer}" if self.gru else f"dgx{layer}"

    def dg_rows(self, layer, row, rows, side="x"):
        """Rows [row, row + rows) of layer ``layer``'s gate gradients [*, G*H]: of the W side
        (dgx{layer}), or ``side`` 'h' of the R side (the GRU's dgh{layer}; the others share
        dgx). The stack backward's builder keeps every layer's in one buffer."""
        name = self.dgh_name(layer) if side == "h" else f"dgx{layer}"
        return View(name, row * self.GH, rows, self.GH, self.GH)

    def data_weight_blocks(self, layer, which):
        """(view, trans_b, first gate column) per GEMM for out = dG @ W (or R): plain
        [G*H, K] used as is; pre-transposed [K, G*H] used transposed. Made once a layer."""
        memo = ("dw", layer, which)
        if memo not in self._views:
            self._views[memo] = self._data_weight_blocks(layer, which)
        return self._views[memo]

    def _data_weight_blocks(self, layer, which):
        K = self.I(layer) if which == "ih" else self.H
        GH, H = self.GH, self.H
        blocks = [(0, GH)] if self.sw.grouped else [(q * H, H) for q in range(self.G)]
        if self.sw.pretranspose:
            buf = f"{'w' if which == 'ih' else 'r'}T{layer}"
            return [(View(buf, c0, K, w, GH), True, c0) for c0, w in blocks]
        buf, at = self.plain_weight(layer, which)
        return [(View(buf, at + r0 * K, w, K, K), False, r0) for r0, w in blocks]

    # -- tasks -------------------------------------------------------------------------------
    def prio(self, layer, t, kind):
        rl, rt = self.L - 1 - layer, self.T - 1 - t
        return (rl + rt, rl, kind) if self.sw.wavefront else (rl, rt, kind)

    def cellb_task(self, layer, t):
        B, GH = self.bs[t], self.GH   # this step's rows
        s = self.rec(layer)
        ops = self.pointwise_bwd(layer, t, s)
        dgh_t = View(self.dgh_name(layer), self.off[t] * GH, B, GH, GH)
        out = self.slot("dhr", layer, t, B)
        # the GRU's pointwise kernel (and every masked one) wrote the direct part of dh_{t-1}
        # into dhr[t]: add to it
        first_beta = 1.0 if self.writes_direct_part else 0.0
        if self.splits > 1:
            ops += self.split_dh(layer, t, s, dgh_t, out, summed_later=self.sums_splits(t - 1))
        else:
            for i, (w, trans_b, c0) in enumerate(self.data_weight_blocks(layer, "hh")):
                width = w.rows if not trans_b else w.cols
                a = View(dgh_t.buf, dgh_t.offset + c0, B, width, GH)
                ops.append(Gemm(s, out, a, w, trans_b=trans_b,
                                beta=first_beta if i == 0 else 1.0, kind="dh", layer=layer,
                                steps=(t, t + 1)))
        deps = []
        if t < self.T - 1:
            deps.append(("cellb", layer, t + 1))
        elif self.varlen:
            deps.append(("dfinal", layer))
        if layer < self.L - 1:
            deps.append(("dxb", layer + 1, (t // self.k) * self.k))
        return Task(("cellb", layer, t), s, deps, self.prio(layer, t, 1), ops)

    def sums_splits(self, t) -> bool:
        """Whether step ``t``'s pointwise kernel sums step t+1's split-K partial products
        itself (the *_bwd_split and *_bwd_mask_split kernels: ew_sum_splits's sum, in its
        order, read straight from dpart instead of from dhr, one launch a step fewer on the
        chain): the fused kernels, at every step but the last (whose dh_rec is dh_n), where
        the recurrent GEMM is split."""
        return self.splits > 1 and self.sw.fused and 0 <= t < self.T - 1

    @property
    def writes_direct_part(self) -> bool:
        """Whether the pointwise backward kernels write the direct part of dh_{t-1} into
        dhr[t] (the GRU's, every masked one's), to which the recurrent GEMM's product adds."""
        return self.gru or self.varlen

    def sum_operands(self, layer, rows, direct):
        """(base, parts, n): ew_sum_splits's operands for the S partial products of a step's
        split GEMM over ``rows`` rows, summed as base + parts[0] + ... + parts[n - 1]: the
        direct part (the view ``direct``, where ``writes_direct_part``) and all S products,
        else the first product and the other S - 1."""
        S, H = self.splits, self.H
        if self.writes_direct_part:
            return direct, View(f"dpart{layer}", 0, S * rows, H, H), S
        return (View(f"dpart{layer}", 0, rows, H, H),
                View(f"dpart{layer}", rows * H, (S - 1) * rows, H, H), S - 1)

    def split_rec(self, layer, t):
        """(base, parts, n, part_rows) of step ``t``'s dh_rec where ``sums_splits(t)``: step
        t+1's ``sum_operands`` (the direct part in dhr[t+1], whose rows past step t+1's --
        a variable-length step t may have more -- hold dh_n alone), summed over its
        part_rows = bs[t+1] rows."""
        P = self.bs[t + 1]
        return (*self.sum_operands(layer, P, self.slot("dhr", layer, t + 1)), P)

    def split_dh(self, layer, t, s, dgh_t, out, summed_later=False):
        """dh_rec of step t-1 = dG_h[t] @ R as S products of K / S rows of R (K = G*H), one
        strided-batched GEMM writing S partial sums into dpart, then their sum in order
        (ew_sum_splits, ``sum_operands``) into ``out`` (after what is there where the
        pointwise kernels write a direct part) -- unless ``summed_later``: step t-1's
        pointwise kernel sums them (``sums_splits``).
        Why: at batch <= 64 the one GEMM has a handful of output tiles (B/64 x H/64), so it
        ran on ~8 of 132 SMs at ~44 us a step, the backward's critical path."""
        S, B, H, GH = self.splits, dgh_t.rows, self.H, self.GH
        ks = GH // S
        (w, trans_b, _), = self.data_weight_blocks(layer, "hh")
        if trans_b:   # rT [H, G*H]: K slices are column blocks
            b, sb = View(w.buf, w.offset, H, ks, w.ld), ks
        else:         # R [G*H, H]: K slices are row blocks
            b, sb = View(w.buf, w.offset, ks, H, w.ld), ks * w.ld
        a = View(dgh_t.buf, dgh_t.offset, B, ks, GH)
        part = View(f"dpart{layer}", 0, B, H, H)
        ops = [Gemm(s, part, a, b, trans_b=trans_b, kind="dh", layer=layer, steps=(t, t + 1),
                    batch=S, strides=(ks, sb, B * H))]
        if summed_later:
            return ops
        base, parts, n = self.sum_operands(layer, B, out)
        ops.append(Kernel(s, "ew_sum_splits", B, H, (out,), (base, parts), kind="reduce",
                          layer=layer, steps=(t, t + 1), scalars=(("splits", n),)))
        return ops

    def dxb_task(self, layer, t0, t1):
        GH, r0 = self.GH, self.off[t0]
        n = self.off[t1] - r0
        s = self.inp(layer)
        if layer == 0:
            I = self.key.input_size
            out = View("dx", r0 * I, n, I, I)
        else:
            out = View(f"dhin{layer - 1}", r0 * self.H, n, self.H, self.H)
        ops = []
        for i, (w, trans_b, c0) in enumerate(self.data_weight_blocks(layer, "ih")):
            width = w.rows if not trans_b else w.cols
            a = View(f"dgx{layer}", r0 * GH + c0, n, width, GH)
            ops.append(Gemm(s, out, a, w, trans_b=trans_b, beta=0.0 if i == 0 else 1.0,
                            kind="dx", layer=layer, steps=(t0, t1)))
        # the chunk's earliest step is computed last; without the wavefront the whole layer
        last = t0 if self.sw.wavefront else 0
        deps = [("cellb", layer, last)]
        return Task(("dxb", layer, t0), s, deps, self.prio(layer, t1 - 1, 0), ops)

    def wgrad_ops(self, layer, c0, c1, first, side):
        """The weight and bias gradient ops of layer ``layer`` from the steps [c0, c1):
        ``side`` 'x' the W side (dW = dG_x^T X, one GEMM, and bias_ih's sum), 'h' the R side
        (dR = dG_h^T H_prev, one GEMM a hprev block, and bias_hh's sum), on the side's
        stream (``wgrad_stream``); ``first``: the layer's first chunk to run (beta 0, or 1
        with accumulate), the later ones add to it (beta 1)."""
        B, H, GH = self.B, self.H, self.GH
        s = self.wgrad_stream(layer, side)
        beta = 1.0 if (self.accumulate or not first) else 0.0
        r0, n = self.off[c0], self.off[c1] - self.off[c0]
        meta = dict(layer=layer, steps=(c0, c1))
        ops = []
        if side == "x":
            if layer == 0:
                I = self.key.input_size
                X = View("x", r0 * I, n, I, I)
            else:
                I = H
                X = self.seq("h", layer - 1, B + r0, n, H)   # slot t + 1: step t's output
            dg = self.dg_rows(layer, r0, n)
            e = self.param(layer, "weight_ih")
            ops.append(Gemm(s, View("grads", e.offset, GH, I, I), dg, X, trans_a=True,
                            beta=beta, kind="dw", **meta))
        else:
            dg = self.dg_rows(layer, r0, n, "h")
            e = self.param(layer, "weight_hh")
            for i, (h0, t0, t1) in enumerate(self.hprev_blocks(c0, c1)):
                rows = self.off[t1] - self.off[t0]
                ops.append(Gemm(s, View("grads", e.offset, GH, H, H),
                                View(dg.buf, dg.offset + (self.off[t0] - r0) * GH, rows, GH,
                                     GH),
                                self.seq("h", layer, h0, rows, H), trans_a=True,
                                beta=beta if i == 0 else 1.0, kind="dw", **meta))
        if self.key.bias:
            e = self.param(layer, "bias_ih" if side == "x" else "bias_hh")
            ops.append(Gemm(s, View("grads", e.offset, 1, GH, GH), View("ones", 0, 1, n, n),
                            dg, beta=beta, kind="db", **meta))
        return ops

    # -- where and when the weight gradients run --------------------------------------------
    def wgrad_granule(self) -> int:
        """The steps a chunk of the weight gradients must be a multiple of: 1 here (the
        chain writes a step's dg at a time); the persistent builders' launches cover more."""
        return 1

    def wgrad_chunks(self):
        """[(t0, t1)]: the chunks of the weight gradients' GEMMs in the order they run, the
        last steps first (as the chain writes them): chunks of kernels/gemm_split.py's
        ``wgrad_chunk_steps`` k steps starting at multiples of k (the persistent builders'
        launches start there too), the last one short where k does not divide T. One chunk
        [(0, T)]: the GEMMs after the chain."""
        k = wgrad_chunk_steps(self.key, self.wgrad_granule())   # a multiple of the granule
        return [(t0, min(t0 + k, self.T)) for t0 in reversed(range(0, self.T, k))]

    def wgrad_placement(self) -> int:
        """Where the weight gradients run (kernels/gemm_split.py ``wgrad_stream_count``):
        1 on the layer's input stream after its dx GEMMs, 2 on a stream of their own (wg{l}),
        3 the W side on wg{l} and the R side on wh{l}. In chunks: at least 2 (a chunk must
        not hold back the next dx GEMM). Without the streams switch: one stream, 1."""
        if not self.sw.streams:
            return 1
        n = wgrad_stream_count(self.key)
        return max(n, 2) if len(self.wgrad_chunks()) > 1 else n

    def wgrad_stream_name(self, layer, side="x") -> str:
        """The name of the stream of layer ``layer``'s weight gradients of ``side`` ('x': W,
        'h': R) at placements 2 and 3: wg{l} (wh{l} for the R side at 3); one such stream
        for all layers without the wavefront."""
        tag = "wh" if (self.wgrad_placement() == 3 and side == "h") else "wg"
        return f"{tag}{layer}" if self.sw.wavefront else tag

    def wgrad_stream(self, layer, side="x"):
        """The stream index of layer ``layer``'s weight gradients of ``side``, as
        ``wgrad_placement`` says: the layer's input stream, or its own (``streams``)."""
        if self.wgrad_placement() == 1:
            return self.inp(layer)
        return self.streams()[0].index(self.wgrad_stream_name(layer, side))

    def streams(self):
        """The forward's streams, then the weight gradients' own (lowest priority), if any."""
        names, prio = super().streams()
        if self.wgrad_placement() == 1:
            return names, prio
        layers = range(self.L) if self.sw.wavefront else (0,)
        sides = ("x", "h") if self.wgrad_placement() == 3 else ("x",)
        extra = [self.wgrad_stream_name(layer, side) for side in sides for layer in layers]
        return tuple(names) + tuple(extra), tuple(prio) + (0,) * len(extra)

    def wgrad_tasks(self, layer, ready, prio):
        """Layer ``layer``'s weight-gradient tasks. One chunk: ('wgrad', l) after
        ``ready(0)``, both sides in one task unless they run on two streams (then the R side
        is ('wgradh', l)). In chunks: ('wgrad', l, t0) (and ('wgradh', l, t0)) per chunk
        [t0, t1), each after ``ready(t0)`` (the task after which the chain has written the
        gate gradients of steps [t0, T)) and its side's chunk before it (they add into the
        same gradients, in this fixed order: the same bits every run), issued at
        ``prio(t0)``."""
        chunks = self.wgrad_chunks()
        two = self.wgrad_placement() == 3
        sides = (("x", "wgrad"), ("h", "wgradh")) if two else ((None, "wgrad"),)
        out = []
        for side, tag in sides:
            before = None
            for i, (t0, t1) in enumerate(chunks):
                first = i == 0
                ops = (self.wgrad_ops(layer, t0, t1, first, side) if side else
                       self.wgrad_ops(layer, t0, t1, first, "x")
                       + self.wgrad_ops(layer, t0, t1, first, "h"))
                if len(chunks) == 1:
                    name, p = (tag, layer), (10**9, layer, 0 if tag == "wgrad" else 1)
                else:
                    name, p = (tag, layer, t0), prio(t0)
                deps = [ready(t0)] + ([before] if before else [])
                out.append(Task(name, ops[0].stream, deps, p, ops))
                before = name
        return out

    def hprev_blocks(self, c0=0, c1=None):
        """[(first row of h, t0, t1)]: the h_{t-1} of steps [t0, t1) within [c0, c1) (default
        all steps) as one block of rows of a per-layer h, aligned with those steps' rows of
        dG_h. A full batch every step: one block (slots c0 .. c1-1). A pattern: one per run
        of steps of one active batch, and its first step alone where the slot before holds
        more rows."""
        c1 = self.T if c1 is None else c1
        out, t = [], c0
        while t < c1:
            t1 = t + 1
            while t1 < c1 and self.bs[t1] == self.bs[t]:
                t1 += 1
            if self.slot_rows(t) != self.bs[t]:   # slot t holds the larger batch before
                out.append((self.slot_row(t), t, t + 1))
                t += 1
            if t < t1:
                out.append((self.slot_row(t), t, t1))
            t = t1
        return out

    def dfinal_task(self, layer):
        """Variable-length plans: dh_n / dc_n (dhn / dcn) into each row's last slot of dhr
        / dc (the forward's ``final_copies`` the other way), first on the layer's recurrence
        stream."""
        pairs = ((("dhr", "dhn"), ("dc", "dcn")) if self.cell.has_cell_state
                 else (("dhr", "dhn"),))
        return Task(("dfinal", layer), self.rec(layer), [], self.prio(layer, self.T - 1, -1),
                    self.final_copies(layer, pairs, into_final=False))

    def wants_dx(self, layer) -> bool:
        """Whether the plan computes the gradient into layer ``layer``'s input: always above
        layer 0 (the layer below reads it), at layer 0 (dx) only with need_dx."""
        return layer > 0 or self.need_dx

    # -- pointwise -----------------------------------------------------------------------------
    def pointwise_bwd(self, layer, t, s):
        B, H, GH = self.bs[t], self.H, self.GH   # this step's rows
        nsave = self.cell.saved_gates
        dhin = self.step("dhin", layer, t)
        dhr_next = self.slot("dhr", layer, t + 1)
        dgx = View(f"dgx{layer}", self.off[t] * GH, B, GH, GH)
        act = (self.seq("act", layer, self.off[t], B, nsave * H)
               if nsave else None)
        meta = dict(layer=layer, steps=(t, t + 1))
        name = self.cell.name
        # dh_rec: dhr[t+1], or step t+1's split-K products summed here (sums_splits)
        rec, suffix = (dhr_next,), ""
        if self.sums_splits(t):
            base, parts, n, part_rows = self.split_rec(layer, t)
            rec, suffix = (base, parts), "_split"
            meta["scalars"] = ((("splits", n), ("part_rows", part_rows)) if self.varlen
                               else (("splits", n),))
        if self.sw.fused and self.varlen:   # masked: frozen rows pass the gradient through
            dh_prev, m = self.slot("dhr", layer, t, B), self.mask(t)
            if name == "lstm":
                outs = (dgx, self.slot("dc", layer, t, B), dh_prev)
                ins = (dhin, *rec, self.slot("dc", layer, t + 1), act,
                       self.c(layer, t + 1), self.c(layer, t, B), m)
            elif name == "gru":
                outs = (dgx, self.step("dgh", layer, t, GH), dh_prev)
                ins = (dhin, *rec, act, self.h(layer, t, B), m)
            else:
                outs, ins = (dgx, dh_prev), (dhin, *rec, self.h(layer, t + 1), m)
            return [Kernel(s, f"{name}_bwd_mask{suffix}", B, H, outs, ins, **meta)]
        if self.sw.fused:
            if name == "lstm":
                outs = (dgx, self.slot("dc", layer, t, B))
                ins = (dhin, *rec, self.slot("dc", layer, t + 1), act, self.c(layer, t + 1),
                       self.c(layer, t, B))
                return [Kernel(s, f"lstm_bwd{suffix}", B, H, outs, ins, **meta)]
            if name == "gru":
                dgh = View(f"dgh{layer}", self.off[t] * GH, B, GH, GH)
                outs = (dgx, dgh, self.slot("dhr", layer, t, B))
                return [Kernel(s, f"gru_bwd{suffix}", B, H, outs,
                               (dhin, *rec, act, self.h(layer, t, B)), **meta)]
            return [Kernel(s, f"{name}_bwd{suffix}", B, H, (dgx,),
                           (dhin, *rec, self.h(layer, t + 1)), **meta)]
        ops = naive.backward_ops(self, layer, t, s, dhin, dhr_next, dgx, act, meta)
        if self.varlen:
            ops += naive.select_backward_ops(self, layer, t, s, dhr_next, dgx, meta)
        return ops

    # -- assembly ----------------------------------------------------------------------------
    def tasks(self) -> list[Task]:
        """Every task of the pass (backward_persistent.py's builder has its own)."""
        tasks = []
        for layer in range(self.L):
            if self.varlen:
                tasks.append(self.dfinal_task(layer))
            for t0 in range(0, self.T, self.k):
                if self.wants_dx(layer):
                    tasks.append(self.dxb_task(layer, t0, min(t0 + self.k, self.T)))
            for t in range(self.T):
                tasks.append(self.cellb_task(layer, t))
            tasks += self.wgrad_tasks(layer, lambda t0, l=layer: ("cellb", l, t0),
                                      lambda t0, l=layer: self.prio(l, t0, 2))
        return tasks

    def build(self) -> Plan:
        # a recompute key's gates first (recompute.py), every other task after them
        ops, nev = schedule(after_recompute(self.tasks(), recompute_tasks(self)))
        names, prio = self.streams()
        inputs, outputs = self.backward_bindings()
        # the forward's bindings too: one workspace (built from this plan's buffers, a
        # superset of the forward's) serves both passes
        fwd = forward_plan(self.key)
        inputs = {**fwd.inputs, **inputs}
        outputs = {**fwd.outputs, **outputs}
        return Plan(self.key, self.buffers(), ops, names, prio, nev, inputs, outputs)

    def backward_bindings(self):
        """(inputs, outputs) of the backward's own arrays: {name: Binding} (Plan's
        docstring)."""
        T, B, H, L, N = self.T, self.B, self.H, self.L, self.N
        I = self.key.input_size
        state = (L, B, H)
        seqs = (N,) if self.varlen else (T, B)   # a pattern's rows are packed
        inputs = {"dy": Binding(seqs + (H,), (View(f"dhin{L - 1}", 0, N, H, H),))}
        outputs = {"dh0": Binding(state, tuple(self.slot("dhr", lyr, 0) for lyr in range(L))),
                   "grads": Binding((self.layout.size,),
                                    (View("grads", 0, 1, self.layout.size, self.layout.size),))}
        kinds = (("dh_n", "dhr", "dhn"),) + ((("dc_n", "dc", "dcn"),)
                                             if self.cell.has_cell_state else ())
        for name, buf, final in kinds:
            inputs[name] = (Binding(state, (View(final, 0, L * B, H, H),)) if self.varlen
                            else Binding(state, tuple(self.slot(buf, lyr, T) for lyr in range(L))))
        if self.cell.has_cell_state:
            outputs["dc0"] = Binding(state, tuple(self.slot("dc", lyr, 0) for lyr in range(L)))
        if self.need_dx:
            outputs = {"dx": Binding(seqs + (I,), (View("dx", 0, N, I, I),)), **outputs}
        return inputs, outputs
