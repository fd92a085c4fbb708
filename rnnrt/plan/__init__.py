"""Plans: the schedule of one pass as plain data, built by pure functions.

  switches.py  the paper's optimizations as switches, the one ladder, the rules
  ops.py       the vocabulary: views into named buffers; Gemm, Kernel, Record, Wait
  model.py     PlanKey, Buffer, Binding, Plan and the checks every plan passes
  schedule.py  tasks -> ops in host issue order, with events across streams
  forward.py   forward_plan(key): the forward pass
  backward.py  backward_plan(key): backpropagation through time, the same switches

The names below are loaded on first use (PEP 562), so that the leaf modules (switches, ops)
import without pulling in the builders and, through them, the kernels.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "ALL": "switches", "Rung": "switches", "Switches": "switches", "ladder": "switches",
    "Buffer": "model", "Binding": "model", "Plan": "model", "PlanKey": "model",
    "validate": "model", "forward_plan": "forward", "backward_plan": "backward",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
