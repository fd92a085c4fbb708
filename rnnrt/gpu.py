"""Running a model on the GPU: ``GpuRunner`` holds the device state and the per-shape plans.

    runner = rnnrt.gpu.GpuRunner(model)                           # the fastest schedule per shape
    y, (h_n, c_n) = runner.forward(x, (h0, c0))                  # inference
    y, (h_n, c_n), tape = runner.forward(x, (h0, c0), train=True)
    g = runner.backward(tape, dy)                                 # g.dx, g.dh0, g.dc0, g.flat
    runner.params -= lr * g.flat                                  # every plan sees the update

``dtype`` (rnnrt/precision.py): 'float32' (the default: the paper's arithmetic, plain fp32
GEMMs, no TF32), 'tf32' (TF32 tensor-core GEMMs), 'bfloat16' or 'float16' (16-bit storage
of x, h and the GEMMs' weight copies, fp32 accumulation and pointwise math). The weights
and their gradients stay the fp32 flat buffers whatever the dtype.
``switches='auto'`` (the default) runs the schedule selector's choice for each shape;
explicit ``rnnrt.Switches`` run exactly that schedule.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import partial

import numpy as np

from .chunked import ChunkedRunner, ChunkedTape
from .gpu_state import MAX_EXECUTORS, RunState, StateCache
from .gpu_tuning import ScheduleTimer, runner_selector
from .plan.forward import forward_plan
from .plan.model import PlanKey
from .plan.switches import Switches
from .validate import (
    check_backward_inputs,
    check_flag,
    check_forward_inputs,
    check_packed_backward_inputs,
    check_packed_inputs,
    split_hx,
)

__all__ = ["DEFAULT_CACHE_BYTES", "GpuGrads", "GpuRunner", "GpuTape", "StateCache"]


@dataclass(eq=False)
class GpuTape:
    """What ``backward`` needs from a training forward: the key of its plans and the state
    (workspace + executors) holding the saved activations. While a tape is alive its state
    is not reused, so several training forwards of one shape (a module applied twice, both
    directions of a layer) each keep their own activations; dropping the tape frees it."""

    key: PlanKey
    generation: int
    batch_first: bool
    state: object = None
    device: int = -1       # the CUDA device its activations live on (its runner's)
    rows: object = None   # packed sequences: the batch's rows in its plan (a CuPy int64 [N])


@dataclass
class GpuGrads:
    """Gradients on the GPU (CuPy arrays).

    dx [T, B, I] (x's layout, batch_first honoured; packed [N, I] after forward_packed),
    dh0 [L, B, H], dc0 [L, B, H] or None.
    flat: the runner's gradient buffer [layout.size] in the model's flat layout (zero in the
    padding) — live, not a copy: the next backward overwrites it (or adds, accumulate=True).
    params: torch-named views into ``flat``.
    """

    dx: object
    dh0: object
    dc0: object
    flat: object
    params: dict


DEFAULT_CACHE_BYTES = 4 << 30
"""Workspace bytes a runner keeps for the shapes it saw (least recently used go first)."""
MAX_KEYS = 1024
"""Plan keys a runner remembers per call shape (its selector keeps its own bound)."""
MAX_SEEN = MAX_EXECUTORS // 4
"""Packed batches (their batch_sizes) a runner remembers: one seen again runs its exact
pattern (nothing frozen) instead of its bucket's. A quarter of a workspace's executors: a
pattern needs a forward and up to three backward graphs (accumulate, need_dx), so the exact
patterns of a loop over MAX_SEEN batches stay captured. A loop over more batches never
finds one among the last MAX_SEEN when it comes again: it runs the bucketed plans, as
random batches do, instead of re-capturing a graph (and rebuilding a plan) every call."""
MAX_ROW_MAPS = 64
"""Row maps of packed batches a runner keeps on the device (a repeated batch reuses its):
room for a loop over MAX_SEEN batches (a map for the bucket's pattern and one for the
exact) and more (tests/core/test_core_runner_caches.py holds the bounds together)."""


class GpuRunner:
    """A model's parameters on the GPU plus, per (shape, schedule, train), a plan, its
    workspace and its executors — built on first use and reused, so repeated calls
    allocate nothing but their results.

    model: an rnnrt.LSTM / GRU / RNN with dtype float32. Its flat parameters are copied to
    the device at construction (``params``, [layout.size], shared by every workspace: update
    it in place); ``sync_params()`` copies the model's again.
    switches: 'auto' (the default: the schedule selector's choice for each shape, timed on
    first use and remembered on disk, kernels/selector.py; ``schedule(steps, batch)`` says
    what it chose and why), or an explicit rnnrt.Switches, run exactly as given.
    executor: 'graph' (captured once, replayed; the default) or 'eager' (Python issues each
    op).
    grads: optional caller-provided CuPy float32 [layout.size] buffer for the parameter
    gradients (default: one allocated here); backward(accumulate=True) adds into it.
    cache_bytes: workspace bytes kept for the shapes seen (default DEFAULT_CACHE_BYTES, or
    the RNNRT_CACHE_BYTES environment variable); least recently used shapes are evicted.
    schedule_cache: where tuned choices persist: a kernels.tuning.ScheduleCache, None for
    the default file (kernels/tuning.py), or False for memory only.
    params: optional contiguous CuPy float32 [layout.size] buffer to run on as is (shared,
    not copied; e.g. a view of another framework's tensor through DLPack): its values are
    the weights, not the model's (``sync_params`` would copy the model's into it).
    dtype: the precision the passes run in (rnnrt.precision.DTYPES; ``runner.dtype``): part
    of every plan key and of the schedule selector's shape. Inputs stay float32 arrays,
    rounded to the storage type where the plan stores them (x, h0: the GEMMs' operands);
    outputs come back as float32 arrays (y and h_n hold storage values, c_n, dx, dh0, dc0
    and the gradients fp32 results). 16-bit keys never run a persistent kernel (they take
    fp32 storage only: the plan falls back, saying why).
    recompute: the chunks of a chunked training pass (a sequence longer than one chunk,
    chunked.py) keep no gates for the backward, which remakes them (plan/recompute.py: the
    forward's GEMMs again, over pieces of 64 steps, and its pointwise kernel): a chunk keeps
    LSTM h and c instead of h, c and the 4 gates a step (a third), GRU h instead of h and
    its 4 (a fifth). An unchunked pass runs as without (it holds its whole workspace either
    way: nothing to save), as do packed sequences. LSTM and GRU at fp32 storage (float32,
    tf32): ValueError for a 16-bit dtype.

    Packed sequences of different lengths (``forward_packed``) run variable-length plans: a
    batch's pattern is bucketed (plan/packing.py), the plans of every pattern of one
    capacity (the steps bucket) share one workspace and keep a CUDA graph each
    (gpu_state.MAX_EXECUTORS a workspace, least recently used first out). A batch seen
    before (its batch_sizes among the last MAX_SEEN) runs its exact pattern instead, with no
    frozen rows: a loop over a fixed set of up to MAX_SEEN batches pays for no padding after
    its first pass; random batches never repeat and stay on their few bucketed plans, as do
    the batches of a larger fixed set (whose exact plans would not stay cached).
    """

    def __init__(self, model, switches: Switches | str = "auto", executor: str = "graph",
                 grads=None, cache_bytes: int | None = None, schedule_cache=None,
                 params=None, dtype: str = "float32", recompute: bool = False):
        import os

        from .precision import get_precision
        from .session import GpuSession, executor_names
        self.dtype = get_precision(dtype).name   # ValueError naming the allowed ones
        if not isinstance(recompute, bool):
            raise TypeError(f"recompute: expected a bool, got {recompute!r}")
        if recompute and self.dtype not in ("float32", "tf32"):
            raise ValueError(f"recompute: fp32 storage only (dtype float32 or tf32), got dtype "
                             f"{self.dtype!r}: 16-bit passes keep their gates")
        self.recompute = recompute
        if np.dtype(model.dtype) != np.float32:
            raise ValueError(f"model.dtype: the GPU path is fp32 only, got {np.dtype(model.dtype)}")
        if switches is None:
            switches = "auto"
        if not (switches == "auto" or isinstance(switches, Switches)):
            raise TypeError(f"switches: expected 'auto' or an rnnrt.Switches, got {switches!r}")
        if executor not in executor_names():
            raise ValueError(f"executor: expected one of {list(executor_names())}, "
                             f"got {executor!r}")
        if cache_bytes is None:
            cache_bytes = int(os.environ.get("RNNRT_CACHE_BYTES", DEFAULT_CACHE_BYTES))
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes: expected an int >= 0, got {cache_bytes!r}")
        session = GpuSession()
        cp = session.cp
        size = model.layout.size
        from .sizes import gpu_available, refuse_if
        # only the buffers this runner allocates count: adopted ones are already on the GPU
        owned = [what for what, buf in (("parameters", params), ("gradients", grads))
                 if buf is None]
        if owned:
            refuse_if(size * 4 * len(owned), gpu_available(cp),
                      f"the {' and '.join(owned)} of {model!r}", "GPU memory")
        for name, buf in (("grads", grads), ("params", params)):
            if buf is not None and not (isinstance(buf, cp.ndarray) and buf.dtype == cp.float32
                                        and buf.shape == (size,) and buf.flags.c_contiguous):
                raise ValueError(f"{name}: expected a contiguous CuPy float32 array of shape "
                                 f"({size},)")
        if grads is None:
            grads = cp.zeros(size, dtype=cp.float32)
        self.cp = cp
        self.device_id = cp.cuda.Device().id
        self.model = model
        self.switches = switches
        self.executor_name = executor
        self.session = session
        self.limits = session.limits   # what a persistent plan's fit reads
        self.params = cp.asarray(model.flat, dtype=cp.float32) if params is None else params
        self.grads = grads
        self._states = StateCache(cache_bytes, free=cp.get_default_memory_pool().free_all_blocks)
        self._schedule_cache = schedule_cache
        self._selector = None
        self._keys = OrderedDict()       # (steps, batch, train, pattern) -> (key, skey)
        self._row_maps = OrderedDict()   # (batch_sizes, pattern, reverse) -> device RowMap
        self._seen = OrderedDict()       # batch_sizes of recent packed batches
        self._events = None              # the two events _on_stream records, made once
        self._grad_views = None
        self._compiled = False           # _precompile ran
        self.timer = ScheduleTimer(self)   # the selector's timer (gpu_tuning.py)
        self.long = ChunkedRunner(self)   # sequences longer than a chunk (chunked.py)

    def sync_params(self):
        """Copy the model's flat parameters to the device again. Every workspace shares
        ``self.params`` (adopted, not copied), so an in-place update reaches them all."""
        self.params[...] = self.cp.asarray(self.model.flat, dtype=self.cp.float32)

    def zero_grad(self):
        self.grads.fill(0)

    # -- the schedule --------------------------------------------------------------------------
    def selector_shape(self, steps: int, batch: int, train: bool, varlen: bool = False):
        """The schedule selector's Shape (kernels/selector.py) of a call of this runner."""
        from .kernels.selector import Shape
        m = self.model
        return Shape(m.cell_name, m.num_layers, m.input_size, m.hidden_size, int(batch),
                     int(steps), bool(train), m.bias, self.dtype, self.executor_name,
                     bool(varlen))

    @property
    def selector(self):
        """The schedule selector of this runner (built on first use; gpu_tuning.py)."""
        if self._selector is None:
            self._selector = runner_selector(self, self._schedule_cache, self.timer, log=_log)
        return self._selector

    def schedule(self, steps: int, batch: int, train: bool = False, varlen: bool = False):
        """What runs for (steps, batch, train) — and with varlen, for packed sequences of
        different lengths: a kernels.selector.Selection (schedule, where the choice came from,
        each candidate's time) — with explicit switches, those."""
        from .kernels.schedules import Schedule
        from .kernels.selector import Selection
        if self.switches != "auto":
            return Selection(Schedule(self.switches.label(), self.switches), "explicit")
        shape = self.selector_shape(steps, batch, train, varlen)
        self._precompile()
        return self.selector.select(shape)

    def plan_key(self, steps: int, batch: int, train: bool = False,
                 pattern: tuple | None = None, chunk: bool = False) -> PlanKey:
        """The PlanKey a call runs: ``pattern`` (plan/packing.py) for packed sequences of
        different lengths (steps = len(pattern); its buffers sized for the steps bucket, so
        every pattern of the bucket shares a workspace); ``chunk``: a piece of a chunked
        pass (chunked.py; with ``recompute``, a training piece's key recomputes). Remembered
        per call shape."""
        return self._key(int(steps), int(batch), bool(train), pattern, bool(chunk))[0]

    def _key(self, steps: int, batch: int, train: bool, pattern: tuple | None,
             chunk: bool = False):
        """(``plan_key``'s key, its workspace key), remembered per call shape: a call does
        one lookup (the arguments are ints, bools and a checked pattern)."""
        k = (steps, batch, train, pattern, self.recompute and chunk and train)
        entry = self._keys.get(k)
        if entry is not None:
            self._keys.move_to_end(k)
            return entry
        if self.switches == "auto":
            sched = self.schedule(steps, batch, train, pattern is not None).schedule
            sw, family, backward = sched.switches, sched.family, sched.backward
            clusters, gemm = sched.clusters, sched.gemm
        else:
            sw, family, backward, clusters, gemm = self.switches, None, None, None, "cublas"
        capacity = None
        if pattern is not None:
            from .kernels.selector import bucket_steps
            capacity = max(bucket_steps(len(pattern)), len(pattern))
        key = self.new_key(steps, batch, train, sw, family, backward, pattern, capacity,
                           clusters, chunk=chunk, gemm=gemm)
        entry = self._keys[k] = (key, self._workspace_key(key))
        while len(self._keys) > MAX_KEYS:
            self._keys.popitem(last=False)
        return entry

    def new_key(self, steps: int, batch: int, train: bool, switches, family=None,
                backward=None, pattern: tuple | None = None,
                capacity: int | None = None, clusters: int | None = None,
                chunk: bool = False, gemm: str = "cublas") -> PlanKey:
        """The PlanKey of this runner's model, limits and dtype for a schedule (switches,
        family, backward, the cluster count; ``chunk``: a piece of a chunked pass, whose
        training key recomputes where the runner does, PlanKey.recompute; ``gemm``: who
        picks the GEMM kernels, PlanKey.gemm) — the one place a
        runner's keys are made (``plan_key``, the selector's timer, chunked.py's
        candidates). Not remembered: ``plan_key`` is."""
        m = self.model
        # a pattern takes the per-step backward (PlanKey refuses a persistent one)
        return PlanKey(m.cell_name, int(steps), int(batch), m.input_size, m.hidden_size,
                       m.num_layers, m.bias, switches, bool(train), device=self.limits,
                       family=family, backward=backward if train and pattern is None else None,
                       batch_sizes=pattern, capacity=capacity, dtype=self.dtype,
                       clusters=clusters,
                       recompute=self.recompute and bool(train) and chunk and pattern is None,
                       gemm=gemm)

    def _precompile(self):
        """Compile every kernel file once, before any timing (a first use on a machine takes
        a while: kernels/library.py says so per file; CuPy keeps the result on disk)."""
        if self._compiled:
            return
        from .kernels.library import precompile
        precompile(self.session.ctx.kernels, self.dtype, cluster=self.limits.cc_major >= 9)
        self._compiled = True

    # -- states ----------------------------------------------------------------------------------
    def build_state(self, key: PlanKey, grads) -> RunState:
        """A new state of ``key`` (not cached: ``state`` caches; the selector's timer holds
        one of its own): its workspace (its training plan's buffers for a
        training key) on ``self.params`` and ``grads`` (the gradient buffer it adopts;
        None: a zeroed one of its own)."""
        from .plan.backward import backward_plan
        from .sizes import SizeError, check_workspace, gpu_available
        # the workspace must fit before any plan is built or buffer allocated; where it does
        # not, the idle workspaces of other shapes go first
        try:
            check_workspace(key, gpu_available(self.cp))
        except SizeError:
            if not (self._states.drop_idle() + self.long.drop_idle()):
                raise
            check_workspace(key, gpu_available(self.cp))
        wplan = backward_plan(key) if key.train else forward_plan(key)
        ws = self.session.workspace(wplan, self.params, grads=grads)
        st = RunState(ws, partial(self.session.executor, self.executor_name))
        st.owner = self
        return st

    @staticmethod
    def _workspace_key(key: PlanKey):
        """What a state is cached by: the plan key, or for a pattern every pattern of its
        capacity (their plans have the same buffers)."""
        if not key.varlen:
            return key
        from dataclasses import replace
        return ("varlen", replace(key, batch_sizes=None, steps=key.capacity, capacity=None))

    def state(self, key: PlanKey, skey=None) -> RunState:
        """A state (workspace + executors) of ``key`` that no live tape holds, built once and
        kept in the bounded cache. A training key's workspace holds the backward plan's
        buffers too (a superset of the forward's). skey: the key's ``_workspace_key`` where
        the caller has it."""
        if skey is None:
            skey = self._workspace_key(key)
        slot = 0
        while True:
            st = self._states.get((skey, slot))
            if st is None:
                self.timer.release()   # tuning is over: free its workspace
                st = self.build_state(key, self.grads)
                self._states.add((skey, slot), st)
                return st
            if not st.busy:
                return st
            slot += 1

    def _row_map(self, batch_sizes: tuple, pattern: tuple, reverse: bool):
        """The RowMap (plan/packing.py) of a packed batch in its pattern's plan, on the
        device (rows int64, mask float32), kept for the last MAX_ROW_MAPS batches.
        batch_sizes [T], pattern: checked tuples (``pattern``'s input and result)."""
        k = (batch_sizes, pattern, bool(reverse))
        rm = self._row_maps.get(k)
        if rm is None:
            from .plan.packing import RowMap, row_map
            host = row_map(batch_sizes, pattern, reverse, checked=True)
            rm = RowMap(self.cp.asarray(host.rows), self.cp.asarray(host.mask))
            self._row_maps[k] = rm
            while len(self._row_maps) > MAX_ROW_MAPS:
                self._row_maps.popitem(last=False)
        else:
            self._row_maps.move_to_end(k)
        return rm

    @staticmethod
    def _load_states(st: RunState, ws, **arrays):
        """Load state inputs (h0, c0, dh_n, dc_n; None: zeros). No plan writes them (plan
        validate() refuses one that does: plan.model.STATE_INPUTS), so a None after a None
        (the usual training loop) loads nothing."""
        for name, a in arrays.items():
            if name not in ws.plan.inputs:
                continue
            if a is None:
                if name in st.zeroed:
                    continue
                st.zeroed.add(name)
            else:
                st.zeroed.discard(name)
            ws.load(**{name: a})

    def _on_stream(self, ex, fn):
        """Run ``fn()`` on the executor's first stream, ordered after the caller's stream's
        prior work and before its later work (two events, made once; no host wait)."""
        cp = self.cp
        if self._events is None:
            self._events = (cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True))
        start, done = self._events
        caller = cp.cuda.get_current_stream()
        s0 = ex.stream
        start.record(caller)
        s0.wait_event(start)
        with s0:
            out = fn()
        done.record(s0)
        caller.wait_event(done)
        return out

    # -- passes ------------------------------------------------------------------------------------
    def forward(self, x, hx=None, train: bool = False):
        """Forward pass on the GPU. Shapes as the model's ``forward`` (batch_first honoured).

        x: [T, B, I] (or [B, T, I] with batch_first), NumPy or CuPy, float32.
        hx: LSTM (h0, c0), each [L, B, H] or None; GRU / RNN h0 [L, B, H] or None.
        Returns CuPy arrays shaped like the model's forward: LSTM (y, (h_n, c_n)), else
        (y, h_n); with train=True also a GpuTape for ``backward``.
        """
        m = self.model
        train = check_flag("train", train)
        h0, c0 = split_hx(m, hx)
        check_forward_inputs(m, x, h0, c0)
        if m.batch_first:
            x = x.transpose(1, 0, 2)
        parts = self.long.pieces(int(x.shape[0]), int(x.shape[1]), train)
        if parts is not None:   # longer than a chunk: chunk plans, the state carried
            y, h_n, c_n, tape = self.long.forward(x, h0, c0, train, parts)
            y = y.transpose(1, 0, 2) if m.batch_first else y
            hx_n = (h_n, c_n) if m.cell.has_cell_state else h_n
            if tape is not None:
                tape.batch_first = m.batch_first
            return (y, hx_n, tape) if train else (y, hx_n)
        key, skey = self._key(int(x.shape[0]), int(x.shape[1]), train, None)
        st = self.state(key, skey)
        ex = st.executor_of(key, "fwd", partial(forward_plan, key))
        ws = ex.prepared.ws

        def run():
            ws.load(x=x)
            self._load_states(st, ws, h0=h0, c0=c0)
            ex.run()
            return ws.outputs(copy=True)

        out = self._on_stream(ex, run)
        y = out["y"].transpose(1, 0, 2) if m.batch_first else out["y"]
        return self._forward_result(st, key, y, out, train, m.batch_first, None)

    def forward_packed(self, x, batch_sizes, hx=None, train: bool = False,
                       reverse: bool = False):
        """Forward pass over packed sequences of different lengths (torch's PackedSequence
        layout), each row of a step on its own sequence's state, nothing computed past a
        sequence's end, h_n / c_n each sequence's state after its own last step.

        x: [N, I] packed (NumPy or CuPy float32), N = sum(batch_sizes); batch_sizes: [T]
        ints (host), non-increasing, >= 1; hx: as ``forward``'s, [L, B, H] in the packed
        (sorted) order, B = batch_sizes[0]. reverse: each sequence from its own end to its
        start (a bidirectional layer's second direction; y stays in x's row order).
        Returns y [N, H] packed like x and h_n / (h_n, c_n) as ``forward``; with train=True
        also a GpuTape (``backward`` takes dy [N, H] and gives dx [N, I]).
        """
        m = self.model
        train = check_flag("train", train)
        reverse = check_flag("reverse", reverse)
        h0, c0 = split_hx(m, hx)
        bs = check_packed_inputs(m, x, batch_sizes, h0, c0)   # checked once, here
        pattern = self.pattern(bs)
        key, skey = self._key(len(pattern), bs[0], train, pattern)
        rm = self._row_map(bs, pattern, reverse)
        st = self.state(key, skey)
        ex = st.executor_of(key, "fwd", partial(forward_plan, key))
        ws = ex.prepared.ws

        def run():
            if st.rows is not rm:   # the padding of x (zero) and the mask of another batch
                ws.load_rows("x", rm.rows, x, fill=0.0)
                ws.load(mask=rm.mask)
                st.rows = rm
            else:
                ws.load_rows("x", rm.rows, x)
            self._load_states(st, ws, h0=h0, c0=c0)
            ex.run()
            return {"y": ws.read_rows("y", rm.rows),
                    **{k: ws.read(k) for k in ("h_n", "c_n") if k in ws.plan.outputs}}

        out = self._on_stream(ex, run)
        return self._forward_result(st, key, out["y"], out, train, False, rm.rows)

    def pattern(self, batch_sizes: tuple) -> tuple:
        """The pattern a packed batch runs: its bucket's (plan/packing.py), or its own if the
        runner saw it among its last MAX_SEEN batches (a repeated batch: no frozen rows).
        batch_sizes: [T], plan.packing.check_pattern's tuple (checked by the caller)."""
        from .plan.packing import bucket
        if batch_sizes in self._seen:
            self._seen.move_to_end(batch_sizes)
            return batch_sizes
        self._seen[batch_sizes] = True
        while len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        return bucket(batch_sizes, checked=True)

    def _forward_result(self, st, key, y, out, train, batch_first, rows):
        hx_n = (out["h_n"], out["c_n"]) if self.model.cell.has_cell_state else out["h_n"]
        if not train:
            return y, hx_n
        st.generation += 1
        tape = GpuTape(key, st.generation, batch_first, st, self.device_id, rows=rows)
        st.hold(tape)
        return y, hx_n, tape

    def backward(self, tape: GpuTape, dy, dhx=None, accumulate: bool = False,
                 need_dx: bool = True) -> GpuGrads:
        """Backpropagation through time for the training forward that made ``tape``.

        dy: [T, B, H] like y (batch_first honoured; [N, H] packed after forward_packed);
        dhx: like hx (LSTM (dh_n, dc_n), either None; GRU / RNN dh_n or None). Parameter
        gradients go to ``self.grads`` (overwritten, or added to with accumulate=True);
        need_dx=False skips the input's gradient (layer 0's dx GEMMs; GpuGrads.dx None).
        Returns GpuGrads.
        """
        from .plan.backward import backward_plan
        m = self.model
        if not isinstance(tape, (GpuTape, ChunkedTape)):
            raise TypeError(f"tape: expected the GpuTape of runner.forward(train=True), "
                            f"got {type(tape).__name__}")
        accumulate = check_flag("accumulate", accumulate)
        need_dx = check_flag("need_dx", need_dx)
        dh_n, dc_n = split_hx(m, dhx, "dhx")
        if isinstance(tape, ChunkedTape):   # chunked.py checks its states' owner and age
            check_backward_inputs(m, tape.steps, tape.batch, dy, dh_n, dc_n)
            if tape.batch_first and dy is not None:
                dy = dy.transpose(1, 0, 2)
            dx, dh0, dc0 = self.long.backward(tape, dy, dh_n, dc_n, accumulate, need_dx)
            return self._grads(dx, dh0, dc0, tape.batch_first)
        st = tape.state
        # its state's owner: this runner, open (a runner is on one device, in its dtype)
        if st is None or st.owner is not self:
            raise ValueError("tape: it is not one of this runner's (a tape of another runner, "
                             "or of one that was closed); run backward on the runner whose "
                             "forward made it")
        if st.generation != tape.generation:
            raise ValueError("tape: stale — a later training forward overwrote its "
                             "activations (a copy of a tape outlived the original, which "
                             "held them); run forward again")
        packed = tape.rows is not None
        if packed:
            check_packed_backward_inputs(m, int(tape.rows.shape[0]), tape.key.batch, dy,
                                         dh_n, dc_n)
        else:
            check_backward_inputs(m, tape.key.steps, tape.key.batch, dy, dh_n, dc_n)
            if tape.batch_first and dy is not None:
                dy = dy.transpose(1, 0, 2)
        ex = st.executor_of(tape.key, ("bwd", accumulate, need_dx),
                            partial(backward_plan, tape.key, accumulate, need_dx))
        ws = ex.prepared.ws

        def run():
            if packed:
                ws.load_rows("dy", tape.rows, dy)
            else:
                ws.load(dy=dy)
            self._load_states(st, ws, dh_n=dh_n, dc_n=dc_n)
            ex.run()
            dx = None
            if need_dx:
                dx = ws.read_rows("dx", tape.rows) if packed else ws.read("dx")
            return dx, {name: ws.read(name) for name in ("dh0", "dc0") if name in ws.plan.outputs}

        dx, out = self._on_stream(ex, run)
        return self._grads(dx, out["dh0"], out.get("dc0"), tape.batch_first)

    def _grads(self, dx, dh0, dc0, batch_first: bool) -> GpuGrads:
        """The GpuGrads of a backward: dx [T, B, I] time-major (or None; [B, T, I] back
        with batch_first), dh0 / dc0 [L, B, H], the runner's gradient buffer and views."""
        if self._grad_views is None:
            from .params import views
            self._grad_views = views(self.grads, self.model.layout)
        if batch_first and dx is not None:
            dx = dx.transpose(1, 0, 2)
        return GpuGrads(dx, dh0, dc0, self.grads, self._grad_views)

    def cached_states(self) -> int:
        """How many states (workspaces and their executors) the runner keeps: its
        StateCache's and the chunk states'. Cheap: a caller can watch it for growth."""
        return len(self._states) + len(self.long.states())

    def cached_bytes(self) -> int:
        """Device bytes the kept states' workspaces hold (each array once: chunk states
        share theirs; params and grads not counted)."""
        arrays = {id(a): a for st in list(self._states) + self.long.states()
                  for a in st.arrays()}
        return sum(int(a.nbytes) for a in arrays.values())

    def drop_idle(self) -> int:
        """Drop every kept state that no live tape needs (their graphs too: the next call
        of those shapes builds them again), memory back to CuPy's pool; -> how many."""
        n = self._states.drop_idle() + self.long.drop_idle()
        if n:
            self.timer.release()
        return n

    def close(self):
        for st in self._states:   # their tapes' backward is refused from now on
            st.owner = None
        self._states.clear()
        self.long.clear()
        self.timer.release()
        self.session.close()


def _log(msg: str) -> None:
    import sys
    print(f"[rnnrt] {msg}", file=sys.stderr, flush=True)
