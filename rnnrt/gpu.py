"""Running a model on the GPU: ``GpuRunner`` holds the device state and the per-shape plans.

    runner = rnnrt.gpu.GpuRunner(model)                           # the fastest schedule per shape
    y, (h_n, c_n) = runner.forward(x, (h0, c0))                  # inference
    y, (h_n, c_n), tape = runner.forward(x, (h0, c0), train=True)
    g = runner.backward(tape, dy)                                 # g.dx, g.dh0, g.dc0, g.flat
    runner.params -= lr * g.flat                                  # every plan sees the update

fp32 only on the GPU (the paper's arithmetic; cuBLAS math mode is plain fp32, no TF32).
``switches='auto'`` (the default) runs the schedule selector's choice for each shape;
explicit ``rnnrt.Switches`` run exactly that schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan.forward import forward_plan
from .plan.model import PlanKey
from .plan.switches import Switches
from .validate import check_backward_inputs, check_flag, check_forward_inputs, split_hx


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
    device: int = -1       # the CUDA device its activations live on
    dtype: str = "float32"


@dataclass
class GpuGrads:
    """Gradients on the GPU (CuPy arrays).

    dx [T, B, I] (x's layout, batch_first honoured), dh0 [L, B, H], dc0 [L, B, H] or None.
    flat: the runner's gradient buffer [layout.size] in the model's flat layout (zero in the
    padding) — live, not a copy: the next backward overwrites it (or adds, accumulate=True).
    params: torch-named views into ``flat``.
    """

    dx: object
    dh0: object
    dc0: object
    flat: object
    params: dict


class _State:
    """Workspace and executors of one plan key (built once, reused until evicted). Busy
    while the tape of its last training forward is alive (its activations are needed)."""

    def __init__(self, ws, forward):
        self.ws, self.forward, self.backward = ws, forward, {}
        self.generation = 0
        self._tape = None

    @property
    def busy(self) -> bool:
        return self._tape is not None and self._tape() is not None

    def hold(self, tape) -> None:
        import weakref
        self._tape = weakref.ref(tape)

    @property
    def nbytes(self) -> int:
        """Device bytes the workspace holds (its buffers; params and grads are shared)."""
        return sum(int(b.nbytes) for name, b in self.ws.bufs.items()
                   if name not in ("params", "grads"))


DEFAULT_CACHE_BYTES = 4 << 30
"""Workspace bytes a runner keeps for the shapes it saw (least recently used go first)."""


class StateCache:
    """The runner's workspaces and executors by plan key, bounded: at most ``budget`` bytes
    of workspaces; adding past it evicts the least recently used states (never the newest,
    nor a busy one: a live tape needs it) and returns their memory to CuPy's pool, so a loop
    over many lengths does not grow."""

    def __init__(self, budget: int, free=None):
        from collections import OrderedDict
        self.budget, self.free = int(budget), free
        self._states = OrderedDict()
        self.evictions = 0

    def get(self, key):
        st = self._states.get(key)
        if st is not None:
            self._states.move_to_end(key)
        return st

    def add(self, key, st) -> None:
        self._states[key] = st
        self._states.move_to_end(key)
        evicted = False
        for old in list(self._states):
            if self.nbytes <= self.budget:
                break
            if old == key or getattr(self._states[old], "busy", False):
                continue   # the newest, and states whose activations a tape still needs
            del self._states[old]
            self.evictions += 1
            evicted = True
        if evicted and self.free is not None:
            self.free()

    @property
    def nbytes(self) -> int:
        return sum(st.nbytes for st in self._states.values())

    def __contains__(self, key) -> bool:
        return key in self._states

    def holds(self, st) -> bool:
        """Whether ``st`` (a state, not a key) is one of this cache's."""
        return any(s is st for s in self._states.values())

    def drop_idle(self) -> int:
        """Evict every state no live tape needs (to make room for a large one); -> how many."""
        idle = [k for k, st in self._states.items() if not getattr(st, "busy", False)]
        for k in idle:
            del self._states[k]
        self.evictions += len(idle)
        if idle and self.free is not None:
            self.free()
        return len(idle)

    def __len__(self) -> int:
        return len(self._states)

    def clear(self) -> None:
        self._states.clear()


class GpuRunner:
    """A model's parameters on the GPU plus, per (shape, schedule, train), a plan, its
    workspace and its executors — built on first use and reused, so repeated calls
    allocate nothing but their results.

    model: an rnnrt.LSTM / GRU / RNN with dtype float32. Its flat parameters are copied to
    the device at construction (``params``, [layout.size], shared by every workspace: update
    it in place); ``sync_params()`` copies the model's again.
    switches: 'auto' (the default: the schedule selector's choice for each shape, timed on
    first use and remembered on disk, kernels/choice.py; ``schedule(steps, batch)`` says
    what it chose and why), or an explicit rnnrt.Switches, run exactly as given.
    executor: 'graph' (captured once, replayed; the default) or 'eager' (Python issues each
    op).
    grads: optional caller-provided CuPy float32 [layout.size] buffer for the parameter
    gradients (default: one allocated here); backward(accumulate=True) adds into it.
    cache_bytes: workspace bytes kept for the shapes seen (default DEFAULT_CACHE_BYTES, or
    the RNNRT_CACHE_BYTES environment variable); least recently used shapes are evicted.
    schedule_cache: where tuned choices persist: a kernels.tuning.ScheduleCache, None for
    the default file (kernels/tuning.py), or False for memory only.
    """

    def __init__(self, model, switches: Switches | str = "auto", executor: str = "graph",
                 grads=None, cache_bytes: int | None = None, schedule_cache=None):
        import os

        from .session import GpuSession, executor_names
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
        refuse_if(size * 4 * (2 if grads is None else 1), gpu_available(cp),
                  f"the parameters{' and gradients' if grads is None else ''} of {model!r}",
                  "GPU memory")
        if grads is None:
            grads = cp.zeros(size, dtype=cp.float32)
        elif not (isinstance(grads, cp.ndarray) and grads.dtype == cp.float32
                  and grads.shape == (size,) and grads.flags.c_contiguous):
            raise ValueError(f"grads: expected a contiguous CuPy float32 array of shape ({size},)")
        self.cp = cp
        self.device_id = cp.cuda.Device().id
        self.model = model
        self.switches = switches
        self.executor_name = executor
        self.session = session
        self.limits = session.limits   # what a persistent plan's fit reads
        self.params = cp.asarray(model.flat, dtype=cp.float32)
        self.grads = grads
        self._states = StateCache(cache_bytes, free=cp.get_default_memory_pool().free_all_blocks)
        self._schedule_cache = schedule_cache
        self._selector = None

    def sync_params(self):
        """Copy the model's flat parameters to the device again. Every workspace shares
        ``self.params`` (adopted, not copied), so an in-place update reaches them all."""
        self.params[...] = self.cp.asarray(self.model.flat, dtype=self.cp.float32)

    def zero_grad(self):
        self.grads.fill(0)

    # -- the schedule --------------------------------------------------------------------------
    def _shape(self, steps: int, batch: int, train: bool):
        from .kernels.choice import Shape
        m = self.model
        return Shape(m.cell_name, m.num_layers, m.input_size, m.hidden_size, int(batch),
                     int(steps), bool(train), m.bias, "float32", self.executor_name)

    @property
    def selector(self):
        """The schedule selector of this runner (built on first use)."""
        if self._selector is None:
            from .kernels.choice import Selector
            from .kernels.tuning import ScheduleCache, device_key
            cache = self._schedule_cache
            if cache is None:
                from . import __version__
                cache = ScheduleCache(device_key({**self.session.info, "rnnrt": __version__}))
            elif cache is False:   # memory only (not `or None`: an empty cache is falsy)
                cache = None
            self._selector = Selector(self._time_schedule, self.limits, cache, log=_log)
        return self._selector

    def schedule(self, steps: int, batch: int, train: bool = False):
        """What runs for (steps, batch, train): a kernels.choice.Selection (schedule, where
        the choice came from, each candidate's time) — with explicit switches, those."""
        from .kernels.choice import Schedule, Selection
        if self.switches != "auto":
            return Selection(Schedule(self.switches.label(), self.switches), "explicit")
        shape = self._shape(steps, batch, train)
        self._precompile()
        return self.selector.select(shape)

    def plan_key(self, steps: int, batch: int, train: bool = False) -> PlanKey:
        m = self.model
        if self.switches == "auto":
            sched = self.schedule(steps, batch, train).schedule
            sw, family, backward = sched.switches, sched.family, sched.backward
        else:
            sw, family, backward = self.switches, None, None
        return PlanKey(m.cell_name, steps, batch, m.input_size, m.hidden_size, m.num_layers,
                       m.bias, sw, train, device=self.limits, family=family,
                       backward=backward if train else None)

    def _precompile(self):
        """Compile every kernel file once, before any timing (a first use on a machine takes
        a while: kernels/library.py says so per file; CuPy keeps the result on disk)."""
        if getattr(self, "_compiled", False):
            return
        from .kernels.registry import REGISTRY
        for k in REGISTRY:
            self.session.ctx.kernels.get(k.name)
        self._compiled = True

    def _build_state(self, key: PlanKey) -> _State:
        from .plan.backward import backward_plan
        from .sizes import SizeError, check_workspace, gpu_available
        # the workspace must fit before any plan is built or buffer allocated; where it does
        # not, the idle workspaces of other shapes go first
        try:
            check_workspace(key, gpu_available(self.cp))
        except SizeError:
            if not self._states.drop_idle():
                raise
            check_workspace(key, gpu_available(self.cp))
        fplan = forward_plan(key)
        wplan = backward_plan(key) if key.train else fplan
        ws = self.session.workspace(wplan, self.params, grads=self.grads)
        return _State(ws, self.session.executor(self.executor_name, fplan, ws))

    def _time_schedule(self, sched, shape, repeats: int) -> list:
        """The selector's timer: ``repeats`` timed runs (ms, CUDA events) of ``sched`` on
        random inputs of ``shape`` (the first ``choice.tuning_steps(shape)`` steps), after
        one warm-up run; forward, or forward + backward for a training shape. Nothing is
        cached."""
        from .kernels.choice import tuning_steps
        from .session import time_events
        m = self.model
        steps = tuning_steps(shape)
        key = PlanKey(m.cell_name, steps, shape.batch, m.input_size, m.hidden_size,
                      m.num_layers, m.bias, sched.switches, shape.train, device=self.limits,
                      family=sched.family, backward=sched.backward if shape.train else None)
        tkey = (sched.name, shape.key(), steps)
        if getattr(self, "_timing_key", None) != tkey:
            self._timing = None   # free the last candidate's workspace first
            st = self._build_state(key)
            cp = self.cp
            rng = cp.random.default_rng(0)
            arrays = {name: rng.standard_normal(b.shape, dtype=cp.float32)
                      for name, b in st.ws.plan.inputs.items()}
            st.ws.load(**arrays)
            runs = [st.forward]
            if shape.train:
                runs.append(self._backward_executor(st, key, False))
            cp.cuda.Device().synchronize()
            self._timing, self._timing_key = (st, runs), tkey
            warm = 1
        else:
            warm = 0
        st, runs = self._timing

        def run():
            for ex in runs:
                ex.run()

        return time_events(self.cp, run, runs[0].stream, repeats, warm)

    def state(self, key: PlanKey) -> _State:
        """A state (workspace + executors) of ``key`` that no live tape holds, built once and
        kept in the bounded cache. A training key's workspace holds the backward plan's
        buffers too (a superset of the forward's)."""
        slot = 0
        while True:
            st = self._states.get((key, slot))
            if st is None:
                self._timing, self._timing_key = None, None   # tuning is over: free it
                st = self._build_state(key)
                self._states.add((key, slot), st)
                return st
            if not st.busy:
                return st
            slot += 1

    def _backward_executor(self, st: _State, key: PlanKey, accumulate: bool):
        if accumulate not in st.backward:
            from .plan.backward import backward_plan
            st.backward[accumulate] = self.session.executor(
                self.executor_name, backward_plan(key, accumulate), st.ws)
        return st.backward[accumulate]

    def _on_stream(self, ex, fn):
        """Run ``fn()`` on the executor's first stream, ordered after the caller's stream's
        prior work and before its later work."""
        cp = self.cp
        caller = cp.cuda.get_current_stream()
        s0 = ex.stream
        start = cp.cuda.Event(disable_timing=True)
        start.record(caller)
        s0.wait_event(start)
        with s0:
            out = fn()
        done = cp.cuda.Event(disable_timing=True)
        done.record(s0)
        caller.wait_event(done)
        return out

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
        key = self.plan_key(int(x.shape[0]), int(x.shape[1]), bool(train))
        st = self.state(key)

        def run():
            st.ws.load_inputs(x, h0, c0)
            st.forward.run()
            return st.ws.outputs(copy=True)

        out = self._on_stream(st.forward, run)
        y = out["y"].transpose(1, 0, 2) if m.batch_first else out["y"]
        hx_n = (out["h_n"], out["c_n"]) if m.cell.has_cell_state else out["h_n"]
        if not train:
            return y, hx_n
        st.generation += 1
        tape = GpuTape(key, st.generation, m.batch_first, st, self.device_id)
        st.hold(tape)
        return y, hx_n, tape

    def backward(self, tape: GpuTape, dy, dhx=None, accumulate: bool = False) -> GpuGrads:
        """Backpropagation through time for the training forward that made ``tape``.

        dy: [T, B, H] like y (batch_first honoured); dhx: like hx (LSTM (dh_n, dc_n), either
        None; GRU / RNN dh_n or None). Parameter gradients go to ``self.grads`` (overwritten,
        or added to with accumulate=True); returns GpuGrads.
        """
        m = self.model
        if not isinstance(tape, GpuTape):
            raise TypeError(f"tape: expected the GpuTape of runner.forward(train=True), "
                            f"got {type(tape).__name__}")
        accumulate = check_flag("accumulate", accumulate)
        st = tape.state
        if tape.device != self.device_id or tape.dtype != "float32":
            raise ValueError(f"tape: recorded on CUDA device {tape.device} in {tape.dtype}; "
                             f"this runner is on device {self.device_id} in float32")
        if st is None or not self._states.holds(st):
            raise ValueError("tape: it is not one of this runner's (a tape of another runner, "
                             "or one copied by hand); run backward on the runner whose "
                             "forward made it")
        if st.generation != tape.generation:
            raise ValueError("tape: stale — its activations were overwritten (a tape of "
                             "another runner, or one copied by hand); run forward again")
        dh_n, dc_n = split_hx(m, dhx, "dhx")
        check_backward_inputs(m, tape.key.steps, tape.key.batch, dy, dh_n, dc_n)
        if tape.batch_first and dy is not None:
            dy = dy.transpose(1, 0, 2)
        ex = self._backward_executor(st, tape.key, bool(accumulate))

        def run():
            arrays = {"dy": dy, "dh_n": dh_n}
            if m.cell.has_cell_state:
                arrays["dc_n"] = dc_n
            st.ws.load(**arrays)
            ex.run()
            return {name: st.ws.read(name) for name in ("dx", "dh0", "dc0")
                    if name in st.ws.plan.outputs}

        out = self._on_stream(ex, run)
        from .params import views
        dx = out["dx"].transpose(1, 0, 2) if tape.batch_first else out["dx"]
        return GpuGrads(dx, out["dh0"], out.get("dc0"), self.grads, views(self.grads, m.layout))

    def close(self):
        self._states.clear()
        self._timing = None
        self.session.close()


def _log(msg: str) -> None:
    import sys
    print(f"[rnnrt] {msg}", file=sys.stderr, flush=True)
