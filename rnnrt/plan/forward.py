"""The forward plan: ``forward_plan(key)`` turns (cell, shapes, switches) into a ``Plan``
(model.py): named buffers, the ops in host issue order (each on a stream), event records and
waits. The plan is what the switches change; the math of every op is fixed by its kernel
(cuda_src/ and its NumPy twin, kernels/), so every plan of a key computes the same function.
Which persistent kernel runs is not decided here: kernels/choice.py says, the builder follows.

How a forward plan is made: the (layer, step) grid is cut into *tasks* —
  ('xpose', l, 'W'|'R')  transpose W or R once per pass            (pretranspose), or
                         copy it into the 16-bit storage type (16-bit key, no pretranspose)
  ('wx', l, t0)          W.x for steps [t0, t0 + k) of layer l     (input stream)
  ('cell', l, t)         R.h_{t-1} and the pointwise update of step t   (recurrence stream)
  ('pcell', l, t0)       persistent: steps [t0, t0 + k) of layer l in one kernel launch
                         (recurrence stream; k = T unless chunked, below)
— each with the tasks it depends on and a priority. A list scheduler issues ready tasks in
priority order; a dependency that crosses streams becomes a Record on the producer's stream
and a Wait on the consumer's. Priorities: layer by layer (wavefront off) or by anti-diagonal
l + t (wavefront on: "next is the work with the fewest edges to the first cell").

Buffers of a forward plan (sizes in elements; G gates, H hidden, B batch, T steps, k chunk):
  params      the model's flat parameter buffer (rnnrt.params layout), read only
  zeros       [G*H] zeros, the bias of a model without bias (x + 0 == x exactly)
  x           [T, B, I]        the input sequence
  h{l}        [T+1, B, H]      h{l}[0] = h0 of layer l, h{l}[t+1] = h after step t
  c{l}        [S', B, H]       LSTM cell state, same indexing; S' = T+1 when training, 3 for
                               inference (c0 in slot 0, then slots 1 and 2 alternate)
  gx{l}       [T, B, G*H]      W.x (no bias) for every step
  gh{l}       [B, G*H]         R.h_{t-1} (no bias), reused each step
  act{l}      [S, B, 4*H]      gates kept for backward (LSTM: i,f,g,o; GRU: r,z,n,W_hn h+b_hn);
                               S = T when training, 1 for the naive rung's inference (its
                               temporaries: reused each step); none for a fused inference
                               plan, whose step kernels are the _noact ones (cuda_src/lstm.cu,
                               gru.cu: no gates stored, 4*B*H floats a step less to write;
                               ``keeps_act``)

What a training forward keeps beyond inference, per layer per step: act (4*B*H floats for
LSTM and GRU, none for RNN) and LSTM's c (B*H). h{l} and gx{l} are kept in both modes (the
next layer's input GEMM reads h over k steps; input batching writes gx ahead). fp32, so for
the paper's LSTM (B 64, H 512) training adds 640 KiB per layer per step.
  pre{l}      [B, G*H]         naive pointwise only: pre-activations
  tmp{l}      [2, B, H]        naive pointwise only: temporaries
  wT{l}, rT{l} [I, G*H], [H, G*H]  pre-transposed W and R
  sync        [2*L] unsigned   persistent only: a layer's SYNC_WORDS barrier counters (zero
                               between launches; cluster kernels leave them untouched)
  wS{l}, rS{l} [G*H, I], [G*H, H]  16-bit storage without pretranspose: W and R in the
                               storage type, copied (``ew_copy``, which rounds) from the
                               fp32 params once per pass, for the GEMMs to read

Precision (``key.dtype``; rnnrt/precision.py is the design): a buffer some GEMM of the key's
passes reads as an operand is a "store" buffer (storage.py ``store_names``: x, h{l}, the
weights the GEMMs read: params, or wT / rT, or wS / rS; the backward's dgx, dgh, ones),
everything else "float" (fp32). Rounding to 16-bit storage happens exactly where a value is written into a
store buffer: x and h0 when loaded, each step's h by the step's pointwise kernel (so the
next step's R.h, the next layer's W.x and y read the rounded h), W and R by their copy (or
transpose) at the start of the pass. gx, gh, c, act and the biases stay fp32. A per-layer
persistent kernel of a tf32 / 16-bit key is its typed instantiation: it stores h rounded and
reads R from the fp32 params, rounding it as it loads it (the copy's values; rS is then
unread), so it computes the rungs' math (kernels/choice.py PERSISTENT_STORAGE_REASON). The
stack family at bfloat16 / float16 is the tensor-core stack kernel (kernels/stack_mma.py):
it reads x and the h sequence in the storage type (both 'store' buffers), stores h rounded,
and reads W and R from the fp32 params, rounding them as it loads them; tf32 runs no stack
kernel.

Persistent plans (switch 'persistent', when the device fit accepts the layer shape): with
the grid kernel, per layer one W.x GEMM over all T steps (the kernel needs all of them before
its first step, so input_batch chunks would only add launches), then one ('pcell', l, 0) task
over all T steps; layer l+1's W.x waits for the whole of layer l, so two grid kernels never
run at the same time (they could deadlock: each needs every SM to be resident). With the
cluster kernel (no grid-wide barrier: a launch waits on nothing outside its clusters), the
wavefront switch and several layers, each layer is cut into input_batch chunks of k steps:
('pcell', l, t0) after ('wx', l, t0) and the layer's previous chunk, and ('wx', l+1, t0)
after ('pcell', l, t0), so the layers' launches overlap along the anti-diagonals; each layer
then runs on at most 1/L of the SMs' worth of clusters (``cluster_count(B, SMs, L)``, where
that fit holds), so that all L layers' launches can be resident together.
c{l} keeps T+1 slots and act{l} T slots even for inference: the kernel writes every step.
With the stack kernel (kernels/stack.py: every layer in one launch) h, c and act are one
buffer each for all layers, and the fp32 kernel's scratch: wt [L*H, G*H] (each layer's W^T)
and ht [(L+1)*(T+1)*H, 64] (the k-major inputs: x^T, each layer's h^T); the tensor-core
stack kernel (kernels/stack_mma.py) has no scratch.
When the fit declines the shape, the plan is the schedule without 'persistent' and
``Plan.fallback`` says why (the ladder and the sweep copy it into their records).

Variable-length plans (``key.batch_sizes``, a pattern P of plan/packing.py): the same tasks
and switches, with step t on its P[t] rows only. Every per-step array is packed: step t's
rows of x, gx, act and mask start at row off[t] = P[0] + ... + P[t-1]; h{l} and c{l} hold
slot 0 (h0, c0: B rows) then the output of step t at row B + off[t] (P[t] rows), so a chunk
of steps is one contiguous block (one W.x GEMM) and step t's R.h reads the first P[t] rows
of slot t. The step kernels are the masked ones (a row whose sequence has ended is frozen:
``mask`` [N] is an input), c keeps every slot, and a task ('final', l) copies each row's
last slot (where its group of the pattern ends) into hn / cn [L, B, H], the bindings of
h_n / c_n. Buffers are sized for ``key.capacity`` steps, so every pattern of a capacity
shares one workspace. The persistent kernels decline a pattern.
"""
from __future__ import annotations

import dataclasses

from ..cells import forward_flops, get_cell, layer_input_size
from ..kernels.choice import choose_persistent, choose_persistent_backward
from ..kernels.persistent import SYNC_WORDS
from ..kernels.registry import get_kernel
from ..params import make_layout
from ..sizes import check_plan
from .cache import plan_cache
from . import naive
from .model import Binding, Buffer, Plan, PlanKey, building, validate
from .ops import Gemm, Kernel, View
from .schedule import Task, schedule
from .storage import labelled


@plan_cache(maxsize=128)
def forward_plan(key: PlanKey) -> Plan:
    """The forward pass of ``key`` as a Plan (cached per key; plans are immutable). A key
    whose plan cannot fit the host's memory or the kernels' index range is refused first
    (sizes.SizeError, before any op is made)."""
    check_plan(key)
    with building():
        plan = ForwardBuilder(key).build()
        validate(plan)
    # the paper's count: every step's rows (a pattern's: sum(batch_sizes), as one batch)
    expect = forward_flops(key.cell, key.input_size, key.hidden_size, key.num_layers,
                           1, key.rows)
    if plan.gemm_flops() != expect:  # the plan does exactly the paper's GEMM work
        raise AssertionError(f"plan GEMM FLOPs {plan.gemm_flops()} != {expect}")
    return plan


class ForwardBuilder:
    """Builds the forward plan of one key: its tasks (``build``), buffers, streams and the
    views every op addresses. ``backward.BackwardBuilder`` extends it, so both passes agree
    on where each array lives."""

    def __init__(self, key: PlanKey):
        self.key = key
        self.cell = get_cell(key.cell)
        self.sw = key.switches
        self.T, self.B, self.H, self.L = key.steps, key.batch, key.hidden_size, key.num_layers
        self.G = self.cell.gates
        self.GH = self.G * self.H
        self.k = self.sw.steps_per_input_gemm(self.T)
        self.layout = make_layout(key.cell, key.input_size, key.hidden_size, key.num_layers,
                                  key.bias)
        # kind -> entry per layer, looked up once: every op's view asks for one
        self._params = [self.layout.layer(layer) for layer in range(self.L)]
        # views are immutable: the ones every step asks for again (biases, weight blocks, h
        # of step t, read by steps t and t+1) are made once and shared
        self._views = {}
        # the persistent switch: kernels/choice.py says which kernel runs (or why none does)
        self.choice = choose_persistent(key) if self.sw.persistent else None
        self.fit = self.choice.fit if self.choice else None
        self.stack = self.choice.stack if self.choice else None
        self.persist = bool(self.choice and self.choice.runs)
        self.chunked = bool(self.choice and self.choice.chunked)
        self.fallback = self.choice.fallback if self.choice else None
        if self.persist:
            self.k = self.choice.steps_per_launch
        # a training key whose backward is the stack backward (kernels/choice_backward.py):
        # it reads R and W from the params itself, so the forward transposes nothing for it
        self.stack_backward = bool(
            self.stack is not None and key.train and key.backward in ("stack", "persistent")
            and choose_persistent_backward(key).stack is not None)
        # slots of c and act: every step's when training, when a persistent kernel writes
        # them all or with a pattern (each row's last slot is its final state); else c has 3
        # (c0 kept, then two alternating) and act 1
        self.varlen = key.varlen
        self.all_slots = key.train or self.persist or self.varlen
        # act{l}: the gates a training pass's backward reads, which a persistent (or the
        # stack) kernel writes whatever the pass and the naive rung computes through; a fused
        # inference plan keeps none: its step kernels are the _noact variants
        self.keeps_act = bool(self.cell.saved_gates) and (
            key.train or self.persist or not self.sw.fused)
        # the per-step geometry: step t's rows (bs[t]) and its first packed row (off[t])
        self.bs = key.batch_sizes if self.varlen else (self.B,) * self.T
        self.off = [0]
        for b in self.bs:
            self.off.append(self.off[-1] + b)
        self.N = self.off[-1]
        self.Tc = key.capacity or self.T   # the steps the buffers hold
        if self.varlen and self.persist:
            raise AssertionError("a variable-length plan with a persistent kernel")
        # 16-bit storage: the GEMMs read the weights in the storage type, from copies made
        # at the start of the pass (or from the pre-transpose, which writes storage itself);
        # fp32 / tf32 read the params as they are (no copy: the plans are the fp32 ones)
        # (with the stack kernel, no forward GEMM: copies only for a per-step backward's)
        self.copies = key.precision.rounds and not self.sw.pretranspose and (
            self.stack is None or (key.train and not self.stack_backward))

    # -- streams ---------------------------------------------------------------------------
    def streams(self):
        if not self.sw.streams:
            return ("main",), (0,)
        if not self.sw.wavefront:
            return ("rec", "inp"), (-1, 0)
        names, prio = [], []
        for layer in range(self.L):
            names += [f"rec{layer}", f"inp{layer}"]
            prio += [-1, 0]   # the recurrence is the critical path: higher priority
        return tuple(names), tuple(prio)

    def rec(self, layer):
        if not self.sw.streams:
            return 0
        return 2 * layer if self.sw.wavefront else 0

    def inp(self, layer):
        if not self.sw.streams:
            return 0
        return 2 * layer + 1 if self.sw.wavefront else 1

    # -- buffers ---------------------------------------------------------------------------
    def I(self, layer):
        return layer_input_size(layer, self.key.input_size, self.H)

    def buffers(self):
        """The forward's buffers, each labelled with its element type (storage.py)."""
        return labelled(self, self.forward_buffers())

    def forward_buffers(self):
        """The forward's buffers, unlabelled (``buffers`` labels them)."""
        T, B, H, GH = self.Tc, self.B, self.H, self.GH
        bufs = [Buffer("params", self.layout.size, "param"), Buffer("zeros", GH, "const"),
                Buffer("x", T * B * self.key.input_size, "io")]
        if self.varlen:   # the per-step row mask, and each row's final state
            bufs += [Buffer("mask", T * B, "io"), Buffer("hn", self.L * B * H, "io")]
            if self.cell.has_cell_state:
                bufs.append(Buffer("cn", self.L * B * H, "io"))
        slots = T if self.all_slots else 1
        if self.persist:
            # a layer's words (the stack kernel: a row of them each batch group)
            groups = self.stack.groups if self.stack is not None else 1
            bufs.append(Buffer("sync", groups * SYNC_WORDS * self.L, "sync", "uint32"))
        if self.stack is not None:
            # every layer's h, c and act in one buffer each, as the stack kernel reads them;
            # no gx or gh (W.x and R.h are inside the kernel)
            n = self.L * B * H
            bufs += [Buffer("h", (T + 1) * n, "io")]
            if self.cell.has_cell_state:
                bufs.append(Buffer("c", (T + 1) * n, "io"))
            bufs.append(Buffer("act", T * n * self.cell.saved_gates, "scratch"))
            bufs += [Buffer(name, r * c, "scratch")   # the kernel's W^T and k-major inputs
                     for name, (r, c) in self.stack_scratch().items()]
        for layer in range(self.L):
            if self.xposed():
                bufs += [Buffer(f"wT{layer}", self.I(layer) * GH, "scratch"),
                         Buffer(f"rT{layer}", H * GH, "scratch")]
            elif self.copies:
                bufs += [Buffer(f"wS{layer}", self.I(layer) * GH, "scratch"),
                         Buffer(f"rS{layer}", H * GH, "scratch")]
            if self.stack is not None:
                continue
            bufs.append(Buffer(f"h{layer}", (T + 1) * B * H, "io"))
            if self.cell.has_cell_state:
                bufs.append(Buffer(f"c{layer}", ((T + 1) if self.all_slots else 3) * B * H,
                                   "io"))
            bufs += [Buffer(f"gx{layer}", T * B * GH, "scratch"),
                     Buffer(f"gh{layer}", B * GH, "scratch")]
            if self.keeps_act:
                bufs.append(Buffer(f"act{layer}", slots * B * self.cell.saved_gates * H,
                                   "scratch"))
            if not self.sw.fused:
                bufs += [Buffer(f"pre{layer}", B * GH, "scratch"),
                         Buffer(f"tmp{layer}", 2 * B * H, "scratch")]
        return tuple(bufs)

    # -- views -----------------------------------------------------------------------------
    def param(self, layer, kind):
        return self._params[layer].get(kind)

    def bias(self, layer, kind, rows=None):
        """[rows, G*H] broadcast view (ld 0; rows default B) of a bias, or of the zeros
        buffer without bias (made once per (layer, kind, rows))."""
        rows = self.B if rows is None else rows
        memo = ("bias", layer, kind, rows)
        v = self._views.get(memo)
        if v is None:
            e = self.param(layer, kind)
            v = (View("zeros", 0, rows, self.GH, 0) if e is None else
                 View("params", e.offset, rows, self.GH, 0))
            self._views[memo] = v
        return v

    def slot_row(self, index):
        """The first row of slot ``index`` of an h / c sequence: slot 0 (h0) at row 0, the
        output of step t (slot t+1) at row B + off[t]."""
        return 0 if index == 0 else self.B + self.off[index - 1]

    def slot_rows(self, index):
        """The rows slot ``index`` holds: B for slot 0, bs[t] for slot t+1."""
        return self.B if index == 0 else self.bs[index - 1]

    def mask(self, t):
        """Step t's row mask, [bs[t], 1] (variable-length plans)."""
        return View("mask", self.off[t], self.bs[t], 1, 1)

    def seq(self, kind, layer, row, rows, width):
        """Rows [row, row + rows) of layer ``layer``'s 'h', 'c' or 'act' sequence (rows of
        ``width``): the buffer h{layer} (c{layer}, act{layer}), or with the stack kernel
        layer ``layer``'s part of one buffer 'h' ('c', 'act') that holds every layer's, as
        the kernel addresses them (T+1 slots of B rows a layer for h and c, T for act)."""
        memo = (kind, layer, row, rows, width)
        v = self._views.get(memo)
        if v is None:
            if self.stack is None:
                v = View(f"{kind}{layer}", row * width, rows, width, width)
            else:
                per = (self.T if kind == "act" else self.T + 1) * self.B
                v = View(kind, (layer * per + row) * width, rows, width, width)
            self._views[memo] = v
        return v

    def h(self, layer, index, rows=None):
        """h{layer}[index] as [rows, H] (index 0 = h0, index t+1 = after step t; rows: the
        slot's, or its first ``rows``)."""
        rows = self.slot_rows(index) if rows is None else rows
        return self.seq("h", layer, self.slot_row(index), rows, self.H)

    def c(self, layer, index, rows=None):
        """c{layer}[index] as [rows, H] (as ``h``). Inference with a full batch every step
        keeps three slots: c0 in slot 0 (never overwritten, so a plan can be re-run without
        reloading its inputs) and the states after each step alternating in slots 1 and 2
        (nothing older is read again)."""
        rows = self.slot_rows(index) if rows is None else rows
        if self.all_slots or index == 0:
            return self.seq("c", layer, self.slot_row(index), rows, self.H)
        return self.seq("c", layer, (1 + (index - 1) % 2) * self.B, rows, self.H)

    def weight_blocks(self, layer, which):
        """The GEMM right-hand operand(s) for W ('ih') or R ('hh'): a list of
        (view, trans_b, first gate column), one per GEMM (G blocks of H rows, or one block
        of G*H with grouped GEMMs).

        Plain layout: the torch matrix [G*H, K] used transposed (out = in @ W^T, cuBLAS 'T').
        Pre-transposed: [K, G*H] used as is (cuBLAS 'N'), a gate block being a column slice.
        """
        memo = ("w", layer, which)
        if memo in self._views:
            return self._views[memo]
        K = self.I(layer) if which == "ih" else self.H
        GH, H = self.GH, self.H
        blocks = [(0, GH)] if self.sw.grouped else [(q * H, H) for q in range(self.G)]
        if self.sw.pretranspose:
            buf = f"{'w' if which == 'ih' else 'r'}T{layer}"
            out = [(View(buf, c0, K, w, GH), False, c0) for c0, w in blocks]
        else:
            buf, at = self.plain_weight(layer, which)
            out = [(View(buf, at + r0 * K, w, K, K), True, r0) for r0, w in blocks]
        self._views[memo] = out
        return out

    def plain_weight(self, layer, which):
        """(buffer, offset) of W ('ih') or R ('hh') [G*H, K] as the GEMMs read it without
        pretranspose: the params, or (16-bit storage) its copy wS / rS."""
        if self.copies:
            return f"{'w' if which == 'ih' else 'r'}S{layer}", 0
        return "params", self.param(layer, f"weight_{which}").offset

    @property
    def prepares_weights(self) -> bool:
        """Whether the pass starts with a ('xpose', l, 'ih'|'hh') task per weight matrix
        that the GEMMs reading it wait for: the pre-transpose, or the 16-bit copy."""
        return self.sw.pretranspose or self.copies

    # -- tasks -----------------------------------------------------------------------------
    def xpose_task(self, layer, which):
        """W ('ih') or R ('hh') of ``layer`` made ready for the GEMMs, once per pass:
        transposed (pretranspose), or copied into the storage type (16-bit storage; the
        copy's store rounds)."""
        K = self.I(layer) if which == "ih" else self.H
        e = self.param(layer, f"weight_{which}")
        src = View("params", e.offset, self.GH, K, K)
        stream = self.inp(layer) if which == "ih" else self.rec(layer)
        if self.sw.pretranspose:
            dst = View(f"{'w' if which == 'ih' else 'r'}T{layer}", 0, K, self.GH, self.GH)
            op = Kernel(stream, "transpose", self.GH, K, (dst,), (src,), kind="transpose",
                        layer=layer)
        else:
            dst = View(self.plain_weight(layer, which)[0], 0, self.GH, K, K)
            op = Kernel(stream, "ew_copy", self.GH, K, (dst,), (src,), kind="copy",
                        layer=layer)
        return Task(("xpose", layer, which), stream, [], (-1, layer, which), [op])

    def wx_task(self, layer, t0, t1):
        GH, r0 = self.GH, self.off[t0]
        n = self.off[t1] - r0   # the steps' rows, one block in the packed layout
        if layer == 0:
            I = self.key.input_size
            src = View("x", r0 * I, n, I, I)
        else:
            src = self.seq("h", layer - 1, self.slot_row(t0 + 1), n, self.H)
        stream = self.inp(layer)
        ops = []
        for w, trans_b, col0 in self.weight_blocks(layer, "ih"):
            width = w.cols if not trans_b else w.rows
            out = View(f"gx{layer}", r0 * GH + col0, n, width, GH)
            ops.append(Gemm(stream, out, src, w, trans_b=trans_b, kind="wx", layer=layer,
                            steps=(t0, t1)))
        deps = []
        if self.prepares_weights:
            deps.append(("xpose", layer, "ih"))
        if layer > 0 and self.persist:
            # the lower layer's launch that made these steps (all T of them unless chunked)
            deps.append(("pcell", layer - 1, t0 if self.chunked else 0))
        elif layer > 0:
            # the lower layer must have produced h for every step this GEMM reads; without
            # the wavefront, the whole lower layer must be finished first
            last = (t1 - 1) if self.sw.wavefront else (self.T - 1)
            deps.append(("cell", layer - 1, last))
        prio = (layer + t0, layer, 0) if self.sw.wavefront else (layer, t0, 0)
        return Task(("wx", layer, t0), stream, deps, prio, ops)

    def cell_task(self, layer, t):
        B, GH = self.bs[t], self.GH   # this step's rows
        stream = self.rec(layer)
        ops = []
        hprev = self.h(layer, t, B)
        for w, trans_b, col0 in self.weight_blocks(layer, "hh"):
            width = w.cols if not trans_b else w.rows
            out = View(f"gh{layer}", col0, B, width, GH)
            ops.append(Gemm(stream, out, hprev, w, trans_b=trans_b, kind="rh", layer=layer,
                            steps=(t, t + 1)))
        ops += self.pointwise(layer, t, stream)
        deps = [("wx", layer, (t // self.k) * self.k)]
        if t > 0:
            deps.append(("cell", layer, t - 1))
        if self.prepares_weights:
            deps.append(("xpose", layer, "hh"))
        prio = (layer + t, layer, 1) if self.sw.wavefront else (layer, t, 1)
        return Task(("cell", layer, t), stream, deps, prio, ops)

    def pcell_task(self, layer, t0, t1):
        """Steps [t0, t1) of layer ``layer`` as one persistent-kernel launch, after their
        W.x and the launch before it; all T steps in one launch unless ``chunked``."""
        B, H, GH, fit = self.B, self.H, self.GH, self.fit
        n = t1 - t0
        name = fit.kernel   # the grid or the cluster kernel of the cell
        # the kernel's slot 0 of h and c is the state it starts from (h{l}[t0], read)
        outs = [View(f"h{layer}", t0 * B * H, (n + 1) * B, H, H)]
        if self.cell.has_cell_state:
            outs.append(View(f"c{layer}", t0 * B * H, (n + 1) * B, H, H))
        if self.cell.saved_gates:
            m = self.cell.saved_gates * H
            outs.append(View(f"act{layer}", t0 * B * m, n * B, m, m))
        # each layer its own counters: concurrent cluster launches never share a buffer
        outs.append(View("sync", SYNC_WORDS * layer, 1, SYNC_WORDS, SYNC_WORDS))
        r = self.param(layer, "weight_hh")
        ins = (View(f"gx{layer}", t0 * B * GH, n * B, GH, GH),
               View("params", r.offset, GH, H, H),
               self.bias(layer, "bias_ih"), self.bias(layer, "bias_hh"))
        known = fit.scalars(n)
        scalars = tuple((k, known[k]) for k in get_kernel(name).scalars)
        stream = self.rec(layer)
        # slot 0 of h (and c) is read, not written: the previous launch's last state, which
        # the next layer's W.x may be reading at the same time
        nstate = 2 if self.cell.has_cell_state else 1
        start = tuple(dataclasses.replace(v, rows=B) for v in outs[:nstate])
        after = tuple(dataclasses.replace(v, offset=v.offset + B * H, rows=n * B)
                      for v in outs[:nstate])
        op = Kernel(stream, name, B, H, tuple(outs), ins, kind="persistent", layer=layer,
                    steps=(t0, t1), scalars=scalars,
                    launch=(fit.grid, fit.block, fit.smem_bytes),
                    flops=2 * GH * H * B * n,
                    footprint=(ins + start, after + tuple(outs[nstate:])))
        if self.chunked:
            deps = [("wx", layer, t0)] + ([("pcell", layer, t0 - self.k)] if t0 else [])
            prio = (layer + t0, layer, 1)
        else:
            deps = [("wx", layer, s) for s in range(0, self.T, self.k)]
            prio = (layer, self.T, 1)
        return Task(("pcell", layer, t0), stream, deps, prio, [op])

    # -- pointwise ---------------------------------------------------------------------------
    def pointwise(self, layer, t, s):
        B, H, GH = self.bs[t], self.H, self.GH   # this step's rows
        gx = View(f"gx{layer}", self.off[t] * GH, B, GH, GH)
        gh = View(f"gh{layer}", 0, B, GH, GH)
        bw, br = self.bias(layer, "bias_ih", B), self.bias(layer, "bias_hh", B)
        hprev, hnew = self.h(layer, t, B), self.h(layer, t + 1)
        row = self.off[t] if self.all_slots else 0
        nsave = self.cell.saved_gates
        act = self.seq("act", layer, row, B, nsave * H) if self.keeps_act else None
        saved = (act,) if act is not None else ()
        meta = dict(layer=layer, steps=(t, t + 1))
        name = self.cell.name
        # a cell with saved gates whose plan keeps none runs the kernel without act
        noact = "_noact" if nsave and act is None else ""
        if self.sw.fused and self.varlen:   # the masked kernels: frozen rows pass through
            cprev = (self.c(layer, t, B),) if name == "lstm" else ()
            outs = (hnew,) + ((self.c(layer, t + 1),) if name == "lstm" else ()) + saved
            ins = (gx, gh, bw, br) + cprev + (hprev, self.mask(t))
            return [Kernel(s, f"{name}_fwd_mask{noact}", B, H, outs, ins, **meta)]
        if self.sw.fused:
            if name == "lstm":
                outs = (hnew, self.c(layer, t + 1)) + saved
                ins = (gx, gh, bw, br, self.c(layer, t))
                return [Kernel(s, f"lstm_fwd{noact}", B, H, outs, ins, **meta)]
            if name == "gru":
                return [Kernel(s, f"gru_fwd{noact}", B, H, (hnew,) + saved,
                               (gx, gh, bw, br, hprev), **meta)]
            return [Kernel(s, f"{name}_fwd", B, H, (hnew,), (gx, gh, bw, br), **meta)]
        ops = naive.forward_ops(self, layer, t, s, gx, gh, bw, br, hprev, hnew, act, meta)
        if self.varlen:   # frozen rows: the state they had (the naive rung's select)
            m = self.mask(t)
            ops.append(Kernel(s, "ew_select", B, H, (hnew,), (m, hnew, hprev), **meta))
            if name == "lstm":
                cnew, cprev = self.c(layer, t + 1), self.c(layer, t, B)
                ops.append(Kernel(s, "ew_select", B, H, (cnew,), (m, cnew, cprev), **meta))
        return ops

    # -- assembly --------------------------------------------------------------------------
    def xposed(self):
        """Whether the forward transposes W and R once (pretranspose switch): for its own
        GEMMs, or with the stack kernel (no GEMMs) only for a training pass's per-step
        backward, which reads wT / rT (the stack backward reads the params)."""
        return self.sw.pretranspose and (self.stack is None
                                         or (self.key.train and not self.stack_backward))

    def stack_scratch(self):
        """{name: (rows, cols)} of the stack kernel's scratch outputs (the fp32 kernel's wt,
        ht; the tensor-core kernel has none), from its registry shapes."""
        info = get_kernel(self.stack.kernel)
        outs, _ = info.arg_shapes(self.B, self.H, **self.stack.scalars(self.T))
        return {name: shape for (name, _), shape in zip(info.outs, outs)
                if name in ("wt", "ht")}

    def stack_param_rows(self, kind, cols):
        """[L, cols] view of parameter ``kind`` of every layer, as the stack kernels read
        them: layer l's at (layer 0's offset + l * stride), row l of one view (every layer's
        entries have one size: I = H; L > 1, kernels/choice.py's condition); the zeros
        buffer (ld 0) for a missing bias."""
        L = self.L
        stride = self.param(1, "weight_ih").offset - self.param(0, "weight_ih").offset
        e0 = self.param(0, kind)
        if e0 is None:
            return View("zeros", 0, L, cols, 0)
        for layer in range(L):
            if self.param(layer, kind).offset != e0.offset + layer * stride:
                raise AssertionError(f"stack plan: {kind} of layer {layer} is not at "
                                     f"a uniform stride")
        return View("params", e0.offset, L, cols, stride)

    def stack_task(self):
        """Every layer and step as one launch of the stack kernel (kernels/stack.py)."""
        T, B, H, L, GH, st = self.T, self.B, self.H, self.L, self.GH, self.stack
        rows_of = self.stack_param_rows
        ins = (View("x", 0, T * B, H, H), rows_of("weight_ih", GH * H),
               rows_of("weight_hh", GH * H), rows_of("bias_ih", GH), rows_of("bias_hh", GH))
        states = ("h", "c") if self.cell.has_cell_state else ("h",)
        act_w = self.cell.saved_gates * H   # (GRU: r, z, n, hn: 4H, GH = 3H)
        outs = (*(View(k, 0, L * (T + 1) * B, H, H) for k in states),
                View("act", 0, L * T * B, act_w, act_w),
                View("sync", 0, st.groups, SYNC_WORDS * L, SYNC_WORDS * L),
                *(View(name, 0, r, c, c) for name, (r, c) in self.stack_scratch().items()))
        # slot 0 of each layer's h and c is read (h0, c0), the rest written
        start = tuple(self.seq(k, layer, 0, B, H) for k in states for layer in range(L))
        after = tuple(self.seq(k, layer, B, T * B, H) for k in states for layer in range(L))
        known = st.scalars(T)
        name = st.kernel
        scalars = tuple((k, known[k]) for k in get_kernel(name).scalars)
        flops = forward_flops(self.key.cell, self.key.input_size, H, L, B, T)
        op = Kernel(self.rec(0), name, B, H, outs, ins, kind="persistent", layer=0,
                    steps=(0, T), scalars=scalars, launch=(st.grid, st.block, st.smem_bytes),
                    flops=flops, footprint=(ins + start, after + outs[len(states):]))
        return Task(("pstack",), self.rec(0), [], (0, 0, 1), [op])

    def group_ends(self):
        """Variable-length plans: [(slot, first row, rows)] for each slot s of the pattern
        that is the last of some rows -- rows [bs[s], bs[s-1]) of slot s (bs[T] = 0), those
        whose group of the pattern ends with step s-1: there they hold their final state
        (frozen after their own sequence's end)."""
        nxt = self.bs[1:] + (0,)
        return [(t + 1, lo, hi - lo) for t, (hi, lo) in enumerate(zip(self.bs, nxt))
                if lo < hi]

    def final_copies(self, layer, pairs, into_final: bool) -> list:
        """Variable-length plans: ew_copy ops between each row's last slot (``group_ends``)
        of layer ``layer``'s sequence buffers and [L, B, H] buffers of final states, on the
        layer's recurrence stream. pairs: ((sequence kind, final buffer), ...);
        into_final: slot -> final (the forward's h_n), else final -> slot (the backward's
        dh_n)."""
        H, s, ops = self.H, self.rec(layer), []
        for slot, lo, n in self.group_ends():
            for kind, final in pairs:
                at_slot = self.seq(kind, layer, self.slot_row(slot) + lo, n, H)
                at_final = View(final, (layer * self.B + lo) * H, n, H, H)
                dst, src = (at_final, at_slot) if into_final else (at_slot, at_final)
                ops.append(Kernel(s, "ew_copy", n, H, (dst,), (src,), layer=layer,
                                  steps=(slot - 1, slot)))
        return ops

    def final_task(self, layer):
        """Variable-length plans: copy each row's last slot of h and c into hn / cn
        [L, B, H] (the h_n / c_n bindings), after the layer's last step."""
        pairs = (("h", "hn"), ("c", "cn")) if self.cell.has_cell_state else (("h", "hn"),)
        prio = (layer + self.T, layer, 2) if self.sw.wavefront else (layer, self.T, 2)
        return Task(("final", layer), self.rec(layer), [("cell", layer, self.T - 1)], prio,
                    self.final_copies(layer, pairs, into_final=True))

    def build(self) -> Plan:
        tasks = [self.stack_task()] if self.stack is not None else []
        for layer in range(self.L):
            if self.xposed() or self.copies:
                tasks += [self.xpose_task(layer, "ih"), self.xpose_task(layer, "hh")]
            if self.stack is not None:
                continue
            for t0 in range(0, self.T, self.k):
                tasks.append(self.wx_task(layer, t0, min(t0 + self.k, self.T)))
            if self.persist:
                for t0 in range(0, self.T, self.k):
                    tasks.append(self.pcell_task(layer, t0, min(t0 + self.k, self.T)))
                continue
            for t in range(self.T):
                tasks.append(self.cell_task(layer, t))
            if self.varlen:
                tasks.append(self.final_task(layer))
        ops, nev = schedule(tasks)
        names, prio = self.streams()
        inputs, outputs = self.bindings()
        return Plan(self.key, self.buffers(), ops, names, prio, nev, inputs, outputs,
                    fallback=self.fallback,
                    fit=None if self.choice is None else self.choice.describe())

    def bindings(self):
        """(inputs, outputs) of the forward plan: {name: Binding} (Plan's docstring)."""
        T, B, H, L, N = self.T, self.B, self.H, self.L, self.N
        I = self.key.input_size
        state = (L, B, H)
        seqs = (N, ) if self.varlen else (T, B)   # a pattern's rows are packed
        inputs = {"x": Binding(seqs + (I,), (View("x", 0, N, I, I),)),
                  "h0": Binding(state, tuple(self.h(layer, 0) for layer in range(L)))}
        outputs = {"y": Binding(seqs + (H,), (self.seq("h", L - 1, B, N, H),))}
        if self.varlen:
            inputs["mask"] = Binding((N,), (View("mask", 0, N, 1, 1),))
            outputs["h_n"] = Binding(state, (View("hn", 0, L * B, H, H),))
        else:
            outputs["h_n"] = Binding(state, tuple(self.h(layer, T) for layer in range(L)))
        if self.cell.has_cell_state:
            inputs["c0"] = Binding(state, tuple(self.c(layer, 0) for layer in range(L)))
            outputs["c_n"] = (Binding(state, (View("cn", 0, L * B, H, H),)) if self.varlen
                              else Binding(state, tuple(self.c(layer, T) for layer in range(L))))
        return inputs, outputs
