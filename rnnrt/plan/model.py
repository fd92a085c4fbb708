"""The plan's data model: what a pass is, as plain data, and the checks every plan passes.

A ``Plan`` is the schedule of one pass (forward or backward) for one ``PlanKey``: named flat
buffers, the ops in host issue order (each on a stream; ``ops.py`` is the vocabulary), event
records and waits, and the bindings of the user-facing arrays (x, h0, y, ...) to views of
the buffers. Builders (``forward.py``, ``backward.py``) make plans; executors (``exec/``)
run them and decide nothing. ``validate`` checks a plan's invariants (views in bounds,
events recorded once and before their waits, kernel views of the shapes the kernel
addresses).
"""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..cells import get_cell
from ..kernels.limits import DeviceLimits
from ..kernels.registry import check_views, get_kernel
from ..precision import DTYPES, get_precision
from .ops import Gemm, Kernel, Op, Record, Wait
from .packing import check_pattern
from .switches import Switches

STATE_INPUTS = ("h0", "c0", "dh_n", "dc_n")
"""Inputs no op of a plan may write (``validate`` refuses one that does): GpuRunner loads a
None state (zeros) once and skips the fill while the caller keeps passing None
(gpu.py ``_load_states``), which is right only while nothing overwrites them."""
PERSISTENT_FAMILIES = ("stack", "grid", "cluster", "regs", "mma", "mmac", "solo")
CLUSTER_FAMILIES = ("cluster", "regs", "mmac")
"""The persistent families whose count of clusters is a launch parameter (PlanKey.clusters)."""
"""The persistent kernel families a PlanKey may name (kernels/choice.py)."""
GEMM_CHOICES = ("cublas", "lt")
"""PlanKey.gemm: who picks each cuBLAS GEMM's kernel (cublasSgemm's heuristic, or timed)."""
BACKWARD_FAMILIES = ("persistent", "grid", "cluster", "stack", "regs", "pair")
"""The persistent backward kernels a training PlanKey may name (``PlanKey.backward``):
'grid' or 'cluster', 'pair' (the grid kernel in cluster pairs, a block half the gate rows:
sm_90+, fp32), 'stack' (the stack backward: every layer in one launch, after the stack
forward), 'regs' (the register-resident cluster backward, H <= 128, fp32: only where named;
the selector times it beside the others), or 'persistent': the stack backward where the
forward runs the stack kernel and it fits, else the one of grid, pair and cluster
kernels/choice.py's cost model prefers."""


@dataclass(frozen=True)
class PlanKey:
    """Everything a plan depends on. Hashable: plans are cached per key.

    family: with the persistent switch, which persistent kernel family the plan must use —
    'stack', 'grid', 'cluster', 'regs' (the register-resident cluster kernel), 'mma' and
    'mmac' (the tensor-core grid and cluster kernels, bfloat16 / float16 keys) or 'solo' (the
    block-persistent kernel)
    — the schedule selector names one per candidate — or None:
    kernels/choice.py picks one by its rules. Where the named family does not fit, the plan
    falls back to the schedule without the switch and says why, as for None.

    backward: a training key's backward schedule: None, the switches' per-step schedule
    (cuBLAS GEMMs and fused pointwise kernels a step); 'grid', 'pair' (the grid kernel in
    cluster pairs), 'cluster' or 'regs' (the register-resident cluster kernel), that
    persistent backward kernel, or 'persistent', the one of grid, pair and cluster the cost
    model prefers (one launch a
    layer for the recurrent chain, then one GEMM a layer for each of dx, dW, dR and the
    biases; plan/backward_persistent.py), where its fit accepts the shape, else the
    per-step schedule with the reason (Plan.fallback); 'stack', the stack backward (every
    layer's chain in one launch, plan/backward_stack.py) after a stack forward, which
    'persistent' also takes where it fits (kernels/choice_backward.py decides). A schedule
    of its own, not a switch: the rungs' backward is unchanged; the selector offers it as a
    candidate. Not with batch_sizes (refused: the kernel runs the whole batch every step).
    batch_sizes: a variable-length plan's pattern (plan/packing.py), [steps] ints,
    non-increasing, batch_sizes[0] = batch: step t runs on its batch_sizes[t] rows only,
    packed step after step, with the masked step kernels; None: every step runs the whole
    batch. The persistent kernels decline a pattern (kernels/choice.py says why).
    capacity: the steps the plan's buffers are sized for (>= steps; None: steps), so that
    plans of one capacity share a workspace: every pattern of a capacity has the same
    buffers.
    dtype: the precision (rnnrt.precision.DTYPES: 'float32', 'tf32', 'bfloat16',
    'float16'): the element type of the plan's "store" buffers (Buffer) and the GEMMs' math.
    Part of the key (its hash, so plans, workspaces and executors are per dtype).
    clusters: with family 'cluster', the forward cluster kernel's cluster count, run exactly
    (the schedule selector times a few: kernels/selector.py); None: the rule's
    (kernels/persistent.py ``cluster_count``). A count past what the device holds at once is
    still correct (a cluster waits only for its own blocks); it runs in waves.
    bwd_splits: a training key's per-step backward: the K slices of its recurrent GEMM
    (kernels/gemm_split.py), run exactly (1: one GEMM); None: the rule's.
    bwd_clusters: a key with ``backward`` 'persistent', 'cluster' or 'regs': the cluster
    backward kernel's (or the register-resident one's) cluster count, run exactly (with
    'persistent' the kernel is then the cluster one, also where the stack backward would
    fit); None: the rule's (kernels/persistent_bwd.py
    ``persistent_bwd_fit``: the layers' share of the SMs where the launches overlap).
    bwd_units: a key with ``backward`` 'grid' or 'pair': the grid backward kernel's units a
    block U, run exactly (an experiment's knob: where that U does not fit, the per-step
    backward with the reason); None: the cost model's (``persistent_bwd_fit``).
    wgrad_steps: a training key's weight gradients in chunks of this many steps, each chunk's
    GEMMs issued as soon as the recurrent chain has written its steps' gate gradients, so
    they overlap the rest of the chain (kernels/gemm_split.py ``wgrad_chunk_steps``; rounded
    up to the backward's own chunk where its chain runs in launches of several steps; >= steps:
    one GEMM over all steps after the chain); None: the rule's.
    wgrad_streams: where a training key's weight gradients run (with the streams switch): 1
    on each layer's input stream after its dx GEMMs, 2 on a stream of their own a layer, 3
    the W side (dW, bias_ih) and the R side (dR, bias_hh) on two streams of their own, so
    the GEMMs of the backward's tail overlap (kernels/gemm_split.py
    ``wgrad_stream_count``); None: the rule's.
    recompute: a training key's backward recomputes the saved gates (act{l}: LSTM i, f, g,
    o; GRU r, z, n, W_hn h + b_hn) from x, the h and c sequences and the weights before its
    chain (plan/recompute.py: two GEMMs and the forward's pointwise kernel a layer, over
    pieces of up to 64 steps), so a training state need not keep them between the passes
    (chunked.py: a chunk keeps x, h, c; LSTM 2 of its 6 floats a hidden unit a step, GRU 1
    of 5). The same function, rounded differently: the recomputed gates come from GEMMs over
    a piece's steps, not the forward's products. fp32 storage only (float32, tf32), fixed
    lengths.
    gemm: who picks the kernel of each cuBLAS GEMM: 'cublas' (cublasSgemm's heuristic, as
    always) or 'lt' (fp32 only: the executor times the algorithms cuBLASLt offers for each
    GEMM against that one and runs the fastest, kernels/gemm_algos.py; the plan's ops are the
    same, only the GEMM kernels differ, and a GEMM it cannot take (batched) keeps cublasSgemm).
"""

    cell: str
    steps: int
    batch: int
    input_size: int
    hidden_size: int
    num_layers: int
    bias: bool
    switches: Switches
    train: bool = False
    device: DeviceLimits | None = None   # the persistent switch's fit reads it; else unused
    family: str | None = None
    backward: str | None = None
    batch_sizes: tuple[int, ...] | None = None
    capacity: int | None = None
    dtype: str = "float32"
    clusters: int | None = None
    bwd_splits: int | None = None
    bwd_clusters: int | None = None
    bwd_units: int | None = None
    wgrad_steps: int | None = None
    wgrad_streams: int | None = None
    recompute: bool = False
    gemm: str = "cublas"

    def __post_init__(self):
        get_cell(self.cell)
        if self.dtype not in DTYPES:   # a Precision is taken by its name
            try:
                object.__setattr__(self, "dtype", get_precision(self.dtype).name)
            except ValueError:
                raise ValueError(f"PlanKey.dtype: expected one of {list(DTYPES)}, got "
                                 f"{self.dtype!r}") from None
        if self.gemm not in GEMM_CHOICES:
            raise ValueError(f"PlanKey.gemm: expected one of {list(GEMM_CHOICES)}, got "
                             f"{self.gemm!r}")
        if self.gemm == "lt" and self.dtype != "float32":
            raise ValueError(f"PlanKey.gemm: 'lt' chooses among fp32 GEMM kernels, but dtype "
                             f"is {self.dtype!r} (float32 only)")
        for name in ("steps", "batch", "input_size", "hidden_size", "num_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"PlanKey.{name}: expected a positive int, got {v!r}")
        if self.batch_sizes is not None:
            bs = self.batch_sizes
            if not isinstance(bs, tuple):
                raise ValueError(f"PlanKey.batch_sizes: expected a tuple, got {bs!r}")
            check_pattern(bs, "PlanKey.batch_sizes")   # ints, >= 1, non-increasing
            if len(bs) != self.steps or bs[0] != self.batch:
                raise ValueError(f"PlanKey.batch_sizes: expected a tuple of {self.steps} "
                                 f"non-increasing ints >= 1 starting at batch {self.batch}, "
                                 f"got {bs!r}")
        c = self.capacity
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < self.steps):
            raise ValueError(f"PlanKey.capacity: expected an int >= steps ({self.steps}) or "
                             f"None, got {c!r}")
        if not isinstance(self.switches, Switches):
            raise TypeError(f"PlanKey.switches: expected Switches, got {type(self.switches)}")
        if self.device is not None and not isinstance(self.device, DeviceLimits):
            raise TypeError(f"PlanKey.device: expected DeviceLimits or None, got "
                            f"{type(self.device)}")
        if self.family is not None:
            if self.family not in PERSISTENT_FAMILIES:
                raise ValueError(f"PlanKey.family: expected one of {PERSISTENT_FAMILIES} or "
                                 f"None, got {self.family!r}")
            if not self.switches.persistent:
                raise ValueError(f"PlanKey.family: {self.family!r} names a persistent kernel "
                                 f"family, but the persistent switch is off")
        n = self.clusters
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"PlanKey.clusters: expected an int >= 1 or None, got {n!r}")
            if self.family not in CLUSTER_FAMILIES:
                raise ValueError(f"PlanKey.clusters: a cluster family's count, but family is "
                                 f"{self.family!r} (expected one of {CLUSTER_FAMILIES})")
        n = self.bwd_splits
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"PlanKey.bwd_splits: expected an int >= 1 or None, got {n!r}")
        n = self.wgrad_steps
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"PlanKey.wgrad_steps: expected an int >= 1 or None, got "
                                 f"{n!r}")
            if not self.train:
                raise ValueError("PlanKey.wgrad_steps: the weight gradients' chunk, but train "
                                 "is False (there is no backward)")
        n = self.wgrad_streams
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n not in (1, 2, 3):
                raise ValueError(f"PlanKey.wgrad_streams: expected 1, 2, 3 or None, got {n!r}")
            if not self.train:
                raise ValueError("PlanKey.wgrad_streams: where the weight gradients run, but "
                                 "train is False (there is no backward)")
        if self.recompute is not False:
            if self.recompute is not True:
                raise ValueError(f"PlanKey.recompute: expected a bool, got {self.recompute!r}")
            if not self.train:
                raise ValueError("PlanKey.recompute: the backward recomputes the saved gates, "
                                 "but train is False (there is no backward)")
            if self.batch_sizes is not None:
                raise ValueError("PlanKey.recompute: fixed-length keys only (batch_sizes is "
                                 "set); a variable-length pass keeps its gates")
            if self.dtype not in ("float32", "tf32"):
                raise ValueError(f"PlanKey.recompute: fp32 storage only (float32, tf32), got "
                                 f"dtype {self.dtype!r}: a 16-bit pass keeps its gates")
        n = self.bwd_clusters
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"PlanKey.bwd_clusters: expected an int >= 1 or None, got "
                                 f"{n!r}")
            if self.backward is None:
                raise ValueError("PlanKey.bwd_clusters: the cluster backward kernel's count, "
                                 "but backward is None (no persistent backward)")
            if self.backward in ("grid", "pair", "stack"):
                raise ValueError(f"PlanKey.bwd_clusters {n}: the cluster backward kernel's "
                                 f"count, but backward is {self.backward!r}")
        n = self.bwd_units
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"PlanKey.bwd_units: expected an int >= 1 or None, got {n!r}")
            if self.backward not in ("grid", "pair"):
                raise ValueError(f"PlanKey.bwd_units {n}: the grid backward kernel's units a "
                                 f"block, but backward is {self.backward!r} (expected 'grid' "
                                 f"or 'pair')")
        if self.backward is not None:
            if self.backward not in BACKWARD_FAMILIES:
                raise ValueError(f"PlanKey.backward: expected one of {BACKWARD_FAMILIES} or "
                                 f"None, got {self.backward!r}")
            if not self.train:
                raise ValueError("PlanKey.backward: names a backward schedule, but train is "
                                 "False (there is no backward)")
            if not self.switches.fused:
                raise ValueError("PlanKey.backward: the persistent backward kernel does the "
                                 "fused kernels' pointwise math and falls back to the fused "
                                 "schedule: it needs switches.fused")
            if self.device is None:
                raise ValueError("PlanKey.device: the persistent backward needs the device's "
                                 "limits (rnnrt.kernels.limits.DeviceLimits)")
            if self.batch_sizes is not None:
                raise ValueError("PlanKey.backward: a persistent backward runs the whole "
                                 "batch every step; a variable-length key (batch_sizes) takes "
                                 "the per-step backward (backward=None)")
        if self.switches.persistent and self.device is None:
            raise ValueError("PlanKey.device: the persistent switch needs the device's limits "
                             "(rnnrt.kernels.limits.DeviceLimits.from_device(cupy), or a "
                             "named device such as rnnrt.kernels.limits.H100_SXM for CPU runs)")
        # hashed once: a key is looked up on every call (the runner's executors, the plan
        # caches), and its batch_sizes (and switches, device) would make each hash O(steps)
        object.__setattr__(self, "_hash", hash(self._fields()))

    def _fields(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # a copy or an unpickled key is made by __init__, so its hash is this process's
        return type(self), self._fields()

    @property
    def precision(self):
        """The key's rnnrt.precision.Precision."""
        return get_precision(self.dtype)

    @property
    def varlen(self) -> bool:
        """Whether this is a variable-length plan (a per-step active batch)."""
        return self.batch_sizes is not None

    @property
    def rows(self) -> int:
        """Rows of one layer's packed sequence: sum(batch_sizes), or steps * batch."""
        return sum(self.batch_sizes) if self.varlen else self.steps * self.batch


BUFFER_DTYPES = ("float", "store", "uint32")
"""A Buffer's element types (Buffer's docstring)."""


@dataclass(frozen=True)
class Buffer:
    """A named flat buffer. role: 'param' (the model's weights), 'const' (filled once),
    'io' (inputs and outputs live here), 'scratch' (only the pass reads it), 'sync'
    (barrier counters: zeroed once, reset by the kernels themselves, never poisoned).

    dtype: 'float' (fp32 on the GPU; the NumPy executor's float64), 'store' (the key's
    storage type, ``PlanKey.precision.storage``: fp32, bf16 or fp16 on the GPU; in the
    NumPy executor float64 holding values rounded to it) or 'uint32'. The rule (``validate``
    enforces it; rnnrt/precision.py's docstring is the design): a buffer is 'store' iff some
    GEMM of the key's passes reads it as an operand (a or b); no GEMM writes a 'store'
    buffer (GEMMs accumulate and write fp32). Every write into a 'store' buffer rounds to
    the storage type (a kernel's store, a copy, the runner's load of an input); nothing
    else rounds."""

    name: str
    size: int
    role: str
    dtype: str = "float"

    def __post_init__(self):
        if self.dtype not in BUFFER_DTYPES:
            raise ValueError(f"Buffer {self.name}: dtype expected one of {BUFFER_DTYPES}, "
                             f"got {self.dtype!r}")

    def itemsize(self, dtype: str = "float32") -> int:
        """Bytes of one element on the GPU for a key of precision ``dtype`` (2 for a
        'store' buffer of 16-bit storage, else 4)."""
        return get_precision(dtype).itemsize if self.dtype == "store" else 4


@dataclass(frozen=True)
class Binding:
    """Where a user-facing array of ``shape`` lives in a plan's buffers: one view holding all
    of it (reshaped to [rows, cols]), or one view per leading index (e.g. per layer)."""

    shape: tuple
    views: tuple

    def __post_init__(self):
        n = 1
        for s in self.shape:
            n *= s
        if sum(v.rows * v.cols for v in self.views) != n:
            raise ValueError(f"Binding {self.shape}: views hold a different number of elements")


@dataclass(frozen=True, eq=False)
class Plan:
    """One pass as data. ``ops`` are in host issue order; executors must issue in that order.

    inputs / outputs map a name to a Binding (shape + the views where the array lives):
      forward  inputs  'x' [T, B, I], 'h0' [L, B, H], 'c0' [L, B, H] (LSTM)
               outputs 'y' [T, B, H], 'h_n' [L, B, H], 'c_n' [L, B, H] (LSTM)
      backward inputs  'dy' [T, B, H], 'dh_n' [L, B, H], 'dc_n' [L, B, H] (LSTM)
               outputs 'dx' [T, B, I], 'dh0' [L, B, H], 'dc0' (LSTM), 'grads' [layout.size]
    A variable-length plan (key.batch_sizes, N = sum of them) binds x [N, I], y [N, H],
    dy [N, H] and dx [N, I] in its packed pattern rows (plan/packing.py row_map), and takes
    'mask' [N] (1 where a row's sequence runs, 0 where it is frozen) besides.
    """

    key: PlanKey
    buffers: tuple[Buffer, ...]
    ops: tuple[Op, ...]
    streams: tuple[str, ...]
    stream_priority: tuple[int, ...]   # CUDA convention: lower number = higher priority
    num_events: int
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    fallback: str | None = None   # persistent switch declined: why (None: not asked, or ran);
    #                               a backward plan: its persistent kernel declined (key.backward)
    fit: str | None = None        # the persistent fit it used or declined

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def counts(self) -> Counter:
        """Op counts by kind: 'gemm:wx', 'gemm:rh', 'kernel:pointwise', 'kernel:transpose',
        'record', 'wait'."""
        c = Counter()
        for op in self.ops:
            if isinstance(op, Gemm):
                c[f"gemm:{op.kind}"] += 1
            elif isinstance(op, Kernel):
                c[f"kernel:{op.kind}"] += 1
            else:
                c[op.kind] += 1
        return c

    def gemm_flops(self) -> int:
        """2*M*N*K summed over the plan's GEMMs (equals the paper's count for the pass).
        Bias-gradient reductions (kind 'db', GEMMs with a ones vector) are not counted: the
        paper calls them a cheap reduction and its FLOP convention leaves them out."""
        total = 0
        for op in self.ops:
            if isinstance(op, Gemm) and op.kind != "db":
                total += op.flops()
            elif isinstance(op, Kernel):
                total += op.flops          # R.h inside a persistent kernel
        return total

    def ops_on(self, stream: int) -> list:
        return [op for op in self.ops if op.stream == stream]

    def describe(self, max_ops: int = 40) -> str:
        """A printable summary: key, streams, counts, and the first ``max_ops`` ops."""
        k = self.key
        lines = [
            f"plan {k.cell} T={k.steps} B={k.batch} I={k.input_size} H={k.hidden_size} "
            f"L={k.num_layers} bias={k.bias} train={k.train} switches={k.switches.label()}"
            + (f" dtype={k.dtype}" if k.dtype != "float32" else ""),
            *([(f"  per-step batch: {k.rows} rows, batches "
                f"{sorted(set(k.batch_sizes), reverse=True)} (capacity "
                f"{k.capacity or k.steps} steps)")] if k.varlen else []),
            f"  streams: {', '.join(f'{i}:{n}' for i, n in enumerate(self.streams))}",
            f"  events: {self.num_events}",
            "  ops: " + ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts().items())),
            f"  GEMM FLOPs: {self.gemm_flops():,}",
        ]
        for i, op in enumerate(self.ops[:max_ops]):
            lines.append(f"  {i:5d} s{op.stream} {op_str(op)}")
        if len(self.ops) > max_ops:
            lines.append(f"  ... {len(self.ops) - max_ops} more")
        return "\n".join(lines)

    def __str__(self):
        return self.describe()


def op_str(op) -> str:
    def vs(v):
        return f"{v.buf}[{v.offset}:{v.rows}x{v.cols}/{v.ld}]"
    if isinstance(op, Gemm):
        return (f"gemm:{op.kind} L{op.layer} t{op.steps} {vs(op.out)} = "
                f"{vs(op.a)}{'^T' if op.trans_a else ''} @ {vs(op.b)}{'^T' if op.trans_b else ''}"
                + (f" + {op.beta}*out" if op.beta else "")
                + (f" x{op.batch} strides {op.strides}" if op.batch > 1 else ""))
    if isinstance(op, Kernel):
        return (f"{op.name} L{op.layer} t{op.steps} [{op.rows}x{op.cols}] "
                f"out({', '.join(map(vs, op.outs))}) in({', '.join(map(vs, op.ins))})")
    return f"{op.kind} e{op.event}"


def cover(views) -> dict:
    """The elements ``views`` touch: buffer -> merged [start, stop) intervals."""
    spans = defaultdict(list)
    for v in views:
        spans[v.buf] += v.row_intervals()
    out = {}
    for buf, iv in spans.items():
        merged = []
        for a, b in sorted(iv):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out[buf] = merged
    return out


def _overlaps(v, spans) -> bool:
    """Whether view ``v`` touches any of ``spans`` (merged, sorted [start, stop) intervals
    of its buffer, as ``cover`` gives them)."""
    starts = [a for a, _ in spans]
    for a, b in ([(v.offset, v.end)] if v.ld == v.cols else v.row_intervals()):
        j = bisect.bisect_right(starts, a) - 1   # the last span starting at or before a
        if (j >= 0 and spans[j][1] > a) or (j + 1 < len(spans) and spans[j + 1][0] < b):
            return True
    return False


@contextlib.contextmanager
def building():
    """Pause Python's cyclic garbage collector while a plan is built and checked.

    A plan is hundreds of thousands of small acyclic objects (views, ops, tasks) that all
    stay alive; each full collection walks every one of them, so with the collector on, the
    build of a T-step plan costs O(T^2) (T = 10,000: 3.6 s instead of 1.3 s). Nothing built
    here is cyclic garbage, so pausing loses nothing; the previous state is restored."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def gemm_operands(plan: Plan) -> set:
    """The buffers some GEMM of ``plan`` reads as an operand (a or b)."""
    return {v.buf for op in plan.ops if isinstance(op, Gemm) for v in (op.a, op.b)}


PRODUCT_ARGS = ("h", "x", "dgx", "dgh")
"""The arguments of a persistent kernel that its on-chip product reads as an operand (h, the
stack kernel's x; the backward's dg): the typed kernels hold them in the storage type, as a
GEMM's operand (kernels/choice.py PERSISTENT_STORAGE_REASON)."""


def product_operands(plan: Plan) -> set:
    """The buffers some persistent kernel of ``plan`` reads as a product operand
    (PRODUCT_ARGS)."""
    out = set()
    for op in plan.ops:
        if isinstance(op, Kernel) and get_kernel(op.name).persistent:
            info = get_kernel(op.name)
            names = [a for a, _ in info.outs] + [a for a, _ in info.ins]
            out |= {v.buf for a, v in zip(names, op.outs + op.ins) if a in PRODUCT_ARGS}
    return out


def check_storage(plan: Plan, also=None) -> None:
    """The storage rule (Buffer's docstring): every GEMM operand lies in a 'store'
    buffer, no GEMM writes one, and -- where ``plan`` is all the GEMMs of its key (an
    inference forward), or with ``also`` (the other pass of a training key: a backward
    plan's forward) -- every 'store' buffer is some GEMM's operand. ValueError naming the
    first broken one."""
    store = {b.name for b in plan.buffers if b.dtype == "store"}
    for i, op in enumerate(plan.ops):
        if not isinstance(op, Gemm):
            continue
        for what, v in (("operand a", op.a), ("operand b", op.b)):
            if v.buf not in store:
                raise ValueError(f"op {i}: {op_str(op)}: {what} {v.buf!r} is not a 'store' "
                                 f"buffer (GEMMs read the storage type)")
        if op.out.buf in store:
            raise ValueError(f"op {i}: {op_str(op)}: writes the 'store' buffer "
                             f"{op.out.buf!r} (a GEMM's output is fp32: split the buffer)")
    if plan.key.train and also is None:
        return   # a training key's other pass reads some of them
    read = set().union(*(f(p) for p in (plan, also) if p is not None
                         for f in (gemm_operands, product_operands)))
    unread = sorted(store - read)
    if unread:
        raise ValueError(f"buffers {unread} are 'store' but no GEMM or persistent product "
                         f"reads them (only product operands hold the storage type)")


def validate(plan: Plan, also: Plan | None = None) -> None:
    """Check a plan's invariants; raise ValueError naming the first broken one.

    Every view lies inside its buffer; every stream index exists; every event is recorded
    exactly once and before (in issue order) every wait on it; no op writes the elements
    bound to a state input (``STATE_INPUTS``); the storage rule (``check_storage``; also:
    a backward plan's forward plan).
    """
    check_storage(plan, also)
    sizes = {b.name: b.size for b in plan.buffers}
    states = {name: cover(plan.inputs[name].views) for name in STATE_INPUTS
              if name in plan.inputs}
    recorded = set()
    # a kernel launch's shape check depends on its kernel, problem, views' shapes and
    # scalars, not on where the views are: a T-step plan has a handful of distinct ones
    shapes_ok = set()
    for i, op in enumerate(plan.ops):
        if not 0 <= op.stream < len(plan.streams):
            raise ValueError(f"op {i}: stream {op.stream} not in plan ({len(plan.streams)})")
        if isinstance(op, Record):
            if op.event in recorded:
                raise ValueError(f"op {i}: event {op.event} recorded twice")
            recorded.add(op.event)
        elif isinstance(op, Wait):
            if op.event not in recorded:
                raise ValueError(f"op {i}: wait on event {op.event} before its record")
        if isinstance(op, Kernel):
            # every launch's views have the shapes its kernel addresses (see cuda_src/)
            sig = (op.name, op.rows, op.cols, op.scalars,
                   *[(v.rows, v.cols, v.ld) for v in op.outs + op.ins])
            if sig not in shapes_ok:
                try:
                    check_views(get_kernel(op.name), op.rows, op.cols, op.outs, op.ins,
                                dict(op.scalars))
                except ValueError as e:
                    raise ValueError(f"op {i}: {e}") from None
                shapes_ok.add(sig)
            # a footprint may say which parts are read and which written, never hide any
            if op.footprint is not None and (cover(op.footprint[0] + op.footprint[1])
                                             != cover(op.ins + op.outs)):
                raise ValueError(f"op {i}: {op.name}: footprint does not cover exactly "
                                 f"the views it is handed")
        for v in tuple(op.reads) + tuple(op.writes):
            if v.buf not in sizes:
                raise ValueError(f"op {i}: unknown buffer {v.buf!r}")
            if v.end > sizes[v.buf]:
                raise ValueError(f"op {i}: view {v} ends at {v.end} > size {sizes[v.buf]}")
        for v in op.writes:
            for name, spans in states.items():
                if v.buf in spans and _overlaps(v, spans[v.buf]):
                    raise ValueError(f"op {i}: {op_str(op)} writes input {name!r} (the "
                                     f"runner skips reloading a zero state no op writes)")
    for name, binding in list(plan.inputs.items()) + list(plan.outputs.items()):
        for v in binding.views:
            if v.end > sizes[v.buf]:
                raise ValueError(f"binding {name}: view {v} out of bounds")


