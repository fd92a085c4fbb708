"""Running a model on the GPU: ``GpuRunner`` holds the device state and the per-shape plans.

    runner = rnnrt.gpu.GpuRunner(model, switches=rnnrt.ladder()[-1].switches, executor="graph")
    y, (h_n, c_n) = runner.forward(x, (h0, c0))                  # inference
    y, (h_n, c_n), tape = runner.forward(x, (h0, c0), train=True)
    g = runner.backward(tape, dy)                                 # g.dx, g.dh0, g.dc0, g.flat
    runner.params -= lr * g.flat                                  # every plan sees the update

fp32 only on the GPU (the paper's arithmetic; cuBLAS math mode is plain fp32, no TF32).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .device import require_gpu
from .limits import DeviceLimits
from .plan import PlanKey, forward_plan
from .switches import Switches
from .validate import check_backward_inputs, check_forward_inputs, split_hx


@dataclass
class GpuTape:
    """What ``backward`` needs from a training forward: the key of its plans and the
    workspace holding the saved activations. Valid until the next training forward of the
    same shape on the same runner (which overwrites that workspace); ``backward`` checks."""

    key: PlanKey
    generation: int
    batch_first: bool


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
    """Workspace and executors of one plan key (built once, reused)."""

    def __init__(self, ws, forward):
        self.ws, self.forward, self.backward = ws, forward, {}
        self.generation = 0


class GpuRunner:
    """A model's parameters on the GPU plus, per (shape, switches, train), a plan, its
    workspace and its executors — built on first use and reused, so repeated calls
    allocate nothing but their results.

    model: an rnnrt.LSTM / GRU / RNN with dtype float32. Its flat parameters are copied to
    the device at construction (``params``, [layout.size], shared by every workspace: update
    it in place); ``sync_params()`` copies the model's again.
    switches: the paper's optimizations (rnnrt.switches.Switches).
    executor: 'eager' (Python issues each op) or 'graph' (captured once, replayed).
    grads: optional caller-provided CuPy float32 [layout.size] buffer for the parameter
    gradients (default: one allocated here); backward(accumulate=True) adds into it.
    """

    def __init__(self, model, switches: Switches | None = None, executor: str = "graph",
                 grads=None):
        from .exec.cuda_exec import EXECUTORS, GpuContext
        from .kernels import KernelLibrary
        cp = require_gpu()
        if np.dtype(model.dtype) != np.float32:
            raise ValueError(f"model.dtype: the GPU path is fp32 only, got {np.dtype(model.dtype)}")
        switches = Switches() if switches is None else switches
        if not isinstance(switches, Switches):
            raise TypeError(f"switches: expected rnnrt.switches.Switches, got {type(switches)}")
        if executor not in EXECUTORS:
            raise ValueError(f"executor: expected one of {sorted(EXECUTORS)}, got {executor!r}")
        size = model.layout.size
        if grads is None:
            grads = cp.zeros(size, dtype=cp.float32)
        elif not (isinstance(grads, cp.ndarray) and grads.dtype == cp.float32
                  and grads.shape == (size,) and grads.flags.c_contiguous):
            raise ValueError(f"grads: expected a contiguous CuPy float32 array of shape ({size},)")
        self.cp = cp
        self.model = model
        self.switches = switches
        self.executor_name = executor
        self._executor_cls = EXECUTORS[executor]
        self.ctx = GpuContext(cp, KernelLibrary())
        self.limits = DeviceLimits.from_device(cp)   # what a persistent plan's fit reads
        self.params = cp.asarray(model.flat, dtype=cp.float32)
        self.grads = grads
        self._states = {}

    def sync_params(self):
        """Copy the model's flat parameters to the device again. Every workspace shares
        ``self.params`` (adopted, not copied), so an in-place update reaches them all."""
        self.params[...] = self.cp.asarray(self.model.flat, dtype=self.cp.float32)

    def zero_grad(self):
        self.grads.fill(0)

    def plan_key(self, steps: int, batch: int, train: bool = False) -> PlanKey:
        m = self.model
        return PlanKey(m.cell_name, steps, batch, m.input_size, m.hidden_size, m.num_layers,
                       m.bias, self.switches, train, device=self.limits)

    def state(self, key: PlanKey) -> _State:
        """The workspace and executors of ``key``, built once. A training key's workspace
        holds the backward plan's buffers too (a superset of the forward's)."""
        if key not in self._states:
            from .exec.workspace import Workspace
            from .plan_backward import backward_plan
            fplan = forward_plan(key)
            wplan = backward_plan(key) if key.train else fplan
            with self.ctx.stream(0, fplan.stream_priority[0])[0]:
                ws = Workspace(wplan, self.cp, np.float32, self.params, grads=self.grads)
            self._states[key] = _State(ws, self._executor_cls(fplan, ws, self.ctx))
        return self._states[key]

    def _backward_executor(self, st: _State, key: PlanKey, accumulate: bool):
        if accumulate not in st.backward:
            from .plan_backward import backward_plan
            st.backward[accumulate] = self._executor_cls(backward_plan(key, accumulate), st.ws,
                                                         self.ctx)
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
        return y, hx_n, GpuTape(key, st.generation, m.batch_first)

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
        st = self._states.get(tape.key)
        if st is None or st.generation != tape.generation:
            raise ValueError("tape: stale — a later training forward of the same shape "
                             "overwrote the activations it refers to; run forward again")
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
        self.ctx.close()
