"""Running a model on the GPU: ``GpuRunner`` holds the device state and the per-shape plans.

    runner = rnnrt.gpu.GpuRunner(model, switches=rnnrt.ladder()[-1].switches, executor="graph")
    y, (h_n, c_n) = runner.forward(x, (h0, c0))      # x: NumPy or CuPy [T, B, I]

fp32 only on the GPU (the paper's arithmetic; cuBLAS math mode is plain fp32, no TF32).
"""
from __future__ import annotations

import numpy as np

from .device import require_gpu
from .plan import PlanKey, forward_plan
from .switches import Switches
from .validate import check_forward_inputs, split_hx


class GpuRunner:
    """A model's parameters on the GPU plus, per (shape, switches), a plan, its workspace
    and its executor — built on first use and reused, so repeated calls allocate nothing.

    model: an rnnrt.LSTM / GRU / RNN with dtype float32. Its flat parameters are copied to
    the device at construction; ``sync_params()`` copies them again after you change them.
    switches: the paper's optimizations (rnnrt.switches.Switches).
    executor: 'eager' (Python issues each op) or 'graph' (captured once, replayed).
    """

    def __init__(self, model, switches: Switches | None = None, executor: str = "graph"):
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
        self.cp = cp
        self.model = model
        self.switches = switches
        self.executor_name = executor
        self._executor_cls = EXECUTORS[executor]
        self.ctx = GpuContext(cp, KernelLibrary())
        self.params = cp.asarray(model.flat, dtype=cp.float32)
        self._states = {}

    def sync_params(self):
        """Copy the model's flat parameters to the device again (and into every workspace)."""
        self.params[...] = self.cp.asarray(self.model.flat, dtype=self.cp.float32)
        for ws, _ in self._states.values():
            ws.set_params(self.params)

    def plan_key(self, steps: int, batch: int, train: bool = False) -> PlanKey:
        m = self.model
        return PlanKey(m.cell_name, steps, batch, m.input_size, m.hidden_size, m.num_layers,
                       m.bias, self.switches, train)

    def state(self, key: PlanKey):
        """(workspace, executor) for ``key``, built once."""
        if key not in self._states:
            from .exec.workspace import Workspace
            plan = forward_plan(key)
            with self.ctx.stream(0, plan.stream_priority[0])[0]:
                ws = Workspace(plan, self.cp, np.float32, self.params)
            self._states[key] = (ws, self._executor_cls(plan, ws, self.ctx))
        return self._states[key]

    def forward(self, x, hx=None):
        """Forward pass on the GPU. Shapes as the model's ``forward`` (batch_first honoured).

        x: [T, B, I] (or [B, T, I] with batch_first), NumPy or CuPy, float32.
        hx: LSTM (h0, c0), each [L, B, H] or None; GRU / RNN h0 [L, B, H] or None.
        Returns CuPy arrays shaped like the model's forward: LSTM (y, (h_n, c_n)), else (y, h_n).
        """
        cp = self.cp
        m = self.model
        h0, c0 = split_hx(m, hx)
        check_forward_inputs(m, x, h0, c0)
        if m.batch_first:
            x = x.transpose(1, 0, 2)
        T, B = int(x.shape[0]), int(x.shape[1])
        ws, ex = self.state(self.plan_key(T, B))
        caller = cp.cuda.get_current_stream()
        s0 = ex.stream
        start = cp.cuda.Event(disable_timing=True)
        start.record(caller)
        s0.wait_event(start)          # inputs the caller produced are ready
        with s0:
            ws.load_inputs(x, h0, c0)
            ex.run()
            out = ws.outputs(copy=True)
        done = cp.cuda.Event(disable_timing=True)
        done.record(s0)
        caller.wait_event(done)       # the caller's stream sees the results
        y = out["y"].transpose(1, 0, 2) if m.batch_first else out["y"]
        if m.cell.has_cell_state:
            return y, (out["h_n"], out["c_n"])
        return y, out["h_n"]

    def close(self):
        self._states.clear()
        self.ctx.close()
