"""Recompute instead of store (``PlanKey.recompute``): the backward remakes the saved gates.

A training forward keeps, per layer and step, what its backward reads: h, LSTM's c and the
gates ``act{l}`` (LSTM i, f, g, o; GRU r, z, n, W_hn h + b_hn: 4 floats a hidden unit). The
gates are a function of what else is kept: per layer, a piece of steps [t0, t1) at a time,

  rgx = X_l  W^T        one GEMM over a piece's S*B rows (X_0 = x, X_l = layer l-1's h)
  rgh = H_l' R^T        one GEMM over the S*B rows (H_l' = layer l's h_{t-1} of the piece)
  act = the forward's own pointwise kernel (lstm_fwd / gru_fwd) over the S*B rows on rgx,
        rgh, the biases and c_{t-1} (LSTM) or h_{t-1} (GRU); its h (and c) outputs go to
        scratch: the kept sequences stay as the forward wrote them
in pieces of S = min(T, RECOMPUTE_STEPS) steps (the scratch bounded whatever T). So a
recompute key's backward starts with these ops (every other task of the backward
waits for them) and a training state need not keep ``act`` between the passes
(``recomputed``: chunked.py's chunk states share it like the pre-activations). Kept per
layer and step then: LSTM h, c (2 floats a unit of the 6), GRU h (1 of 5). Cost: the
forward's GEMM FLOPs again, as two large GEMMs and one pointwise launch a layer a piece.

The math is the cell's; the rounding is not the forward's: the pre-activations come from one
GEMM over a piece's steps (cuBLAS's summation order), not the forward's per-step GEMMs or the
persistent kernels' products, so the recomputed gates (and the gradients) differ from the
stored ones in the last bits, within the precision's tolerance of the float64 reference.
fp32 storage only (float32, tf32: PlanKey says why not 16-bit); the weights are read from
the fp32 parameters as they lie (transposed by the GEMM), whatever the forward made of them.
RNN cells save no gates: nothing to recompute.
"""
from __future__ import annotations

from ..cells import get_cell
from .model import Buffer
from .ops import Gemm, Kernel, View
from .schedule import Task

RECOMPUTE_STEPS = 64
"""Steps a recompute GEMM covers: its scratch is 2 x S*B*G*H + (1 or 2) x S*B*H floats
(LSTM at B 64, H 512: 80 MiB), and a GEMM over S*B rows is still large (4,096 rows at B 64)."""
RECOMPUTE_KIND = "recompute"
"""The ``kind`` of every op the recompute adds (its GEMMs and its pointwise launches)."""
SCRATCH = ("rgx", "rgh", "rh", "rc")
"""The recompute's scratch buffers (``recompute_buffers``; rc for LSTM only)."""


def recomputes(key) -> bool:
    """Whether ``key``'s backward recomputes gates: a recompute key of a cell that saves some."""
    return bool(key.train and key.recompute and get_cell(key.cell).saved_gates)


def recompute_buffers(b) -> list[Buffer]:
    """The recompute's scratch (``b`` a backward builder): rgx, rgh [S*B, G*H] the two
    GEMMs' products, rh (and LSTM's rc) [S*B, H] the pointwise kernel's h (c) outputs, read
    by nothing; one set shared by the layers and pieces (they run in turn on one stream)."""
    if not recomputes(b.key):
        return []
    rows = min(b.T, RECOMPUTE_STEPS) * b.B
    widths = dict(rgx=b.GH, rgh=b.GH, rh=b.H, rc=b.H)
    return [Buffer(name, rows * widths[name], "scratch") for name in SCRATCH
            if name != "rc" or b.cell.has_cell_state]


def recompute_ops(b, layer: int, t0: int, t1: int, stream: int) -> list:
    """The ops remaking layer ``layer``'s gates act{layer} of steps [t0, t1) (module
    docstring)."""
    B, H, GH = b.B, b.H, b.GH
    rows, r0 = (t1 - t0) * B, t0 * B
    meta = dict(layer=layer, steps=(t0, t1))
    if layer == 0:
        K = b.key.input_size
        X = View("x", r0 * K, rows, K, K)
    else:
        K = H
        X = b.seq("h", layer - 1, B + r0, rows, H)   # slots t0+1 ..: the layer below's outputs
    w, r = b.param(layer, "weight_ih"), b.param(layer, "weight_hh")
    rgx, rgh = View("rgx", 0, rows, GH, GH), View("rgh", 0, rows, GH, GH)
    hprev = b.seq("h", layer, r0, rows, H)           # slots t0 .. t1-1
    ops = [Gemm(stream, rgx, X, View("params", w.offset, GH, K, K), trans_b=True,
                kind=RECOMPUTE_KIND, **meta),
           Gemm(stream, rgh, hprev, View("params", r.offset, GH, H, H), trans_b=True,
                kind=RECOMPUTE_KIND, **meta)]
    act = b.seq("act", layer, r0, rows, b.cell.saved_gates * H)
    bw, br = b.bias(layer, "bias_ih", rows), b.bias(layer, "bias_hh", rows)
    rh = View("rh", 0, rows, H, H)
    if b.cell.has_cell_state:   # LSTM: (h, c, act) from (gx, gh, b_ih, b_hh, c_prev)
        outs = (rh, View("rc", 0, rows, H, H), act)
        ins = (rgx, rgh, bw, br, b.seq("c", layer, r0, rows, H))
    else:                       # GRU: (h, act) from (gx, gh, b_ih, b_hh, h_prev)
        outs, ins = (rh, act), (rgx, rgh, bw, br, hprev)
    ops.append(Kernel(stream, f"{b.cell.name}_fwd", rows, H, outs, ins, kind=RECOMPUTE_KIND,
                      **meta))
    return ops


def recompute_tasks(b) -> list[Task]:
    """One task a layer and piece, top layer first (its chain starts first), in a row on
    the top layer's recurrence stream (they share the scratch), ahead of every other task."""
    if not recomputes(b.key):
        return []
    stream = b.rec(b.L - 1)
    tasks, before = [], None
    for layer in reversed(range(b.L)):
        for t0 in range(0, b.T, RECOMPUTE_STEPS):
            name = (RECOMPUTE_KIND, layer, t0)
            tasks.append(Task(name, stream, [before] if before else [], (-1, len(tasks), 0),
                              recompute_ops(b, layer, t0, min(t0 + RECOMPUTE_STEPS, b.T),
                                            stream)))
            before = name
    return tasks


def after_recompute(tasks: list[Task], pro: list[Task]) -> list[Task]:
    """``pro`` then ``tasks``, each of ``tasks`` made to wait for all of ``pro`` (none of the
    backward reads a gate before it is remade; the layers' recomputes are short against the
    chain, so no finer order is kept)."""
    if not pro:
        return tasks
    names = [t.name for t in pro]
    for t in tasks:
        t.deps = list(t.deps) + names
    return pro + tasks


def recomputed(plan) -> frozenset:
    """The buffers ``plan`` (a backward plan) writes in its recompute ops: the gates that a
    training state need not keep between the passes (empty without recompute)."""
    return frozenset(v.buf for op in plan.ops if getattr(op, "kind", None) == RECOMPUTE_KIND
                     and isinstance(op, Kernel) for v in op.writes
                     if v.buf not in SCRATCH)
