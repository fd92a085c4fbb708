"""The precision an rnnrt.nn call runs in (issue 23), decided before any work by torch.nn's
rules, and what each means for the tensors (rnnrt.precision says where the rounding happens):

  CUDA under ``torch.autocast("cuda", dtype=torch.bfloat16 / torch.float16)``
      the runner runs at that precision ('bfloat16' / 'float16'); x, h0, c0 may be float32
      or 16-bit (taken as float32: 16-bit values exactly); the parameters stay as they are
      (float32: the runner reads them as its fp32 master and rounds its own storage copy
      inside the pass); y, h_n, c_n come back in the autocast dtype; the parameters'
      gradients in the parameters' dtype (float32), dx in x's — torch.nn.LSTM's autocast
      behaviour (its cuDNN call casts inputs and weights, outputs in the autocast dtype,
      parameter gradients fp32).
  CUDA, parameters in bfloat16 / float16 (``module.to(torch.bfloat16)``, ``.half()``)
      the runner runs at that precision; inputs must be of the parameters' dtype (as
      torch.nn); the runner holds an fp32 copy of the 16-bit parameters (exact), made every
      call (a 16-bit module is not laid out in the flat buffer); outputs in that dtype; the
      gradients are accumulated in fp32 and rounded once to that dtype. (torch.nn in that
      dtype runs cuDNN's 16-bit RNN, its gradients 16-bit all the way; the values differ in
      rounding only: tests/gpu/test_gpu_nn_precision.py holds ours to at most 2x cuDNN's
      error against float64, tests/nn/test_nn_precision.py to 2x torch's CPU modules'.)
  CUDA float32 parameters, no autocast
      float32, exactly as before. TF32 is not taken from torch.backends' allow_tf32 flags:
      rnnrt.nn in float32 is fp32 math, whatever those flags (they default to on for cuDNN).
  CPU
      the same rules (torch.autocast("cpu", ...) and 16-bit modules, which torch.nn runs
      on the CPU too): ``rnnrt.varlen`` in float32 with the precision's storage rounding
      (``dtype=``: the rounding points of the GPU plans and of the rounding-aware reference),
      the tensors converted as above; float32 / float64 modules without autocast as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PRECISION_DEVICES = ("cuda", "cpu")
"""Device types whose backends run the 16-bit precisions (the GPU runner, rnnrt.varlen)."""
_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""What x, h0, c0 may be under autocast (taken as float32 by the runner)."""


@dataclass(frozen=True)
class CallPrecision:
    """A call that runs at a precision other than its tensors' float32 path.

    name: the runner's precision (precision.DTYPES: 'bfloat16' or 'float16');
    out_dtype: the dtype y, h_n, c_n come back in; autocast: whether torch.autocast chose it
    (else the parameters' dtype did)."""

    name: str
    out_dtype: torch.dtype
    autocast: bool


def autocast_dtype(device_type: str):
    """torch.autocast's dtype where it is enabled for ``device_type`` ('cuda' or 'cpu'), else
    None."""
    if device_type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def call_precision(device: torch.device, param_dtype: torch.dtype) -> CallPrecision | None:
    """The precision of a call on ``device`` with parameters of ``param_dtype`` (module
    docstring); None for the plain path (the tensors' own dtype, float32 / float64).
    NotImplementedError, before any work, where rnnrt.nn cannot do what torch.nn would."""
    if device.type not in PRECISION_DEVICES:
        return None          # backend_for refuses the device itself
    ac = autocast_dtype(device.type)
    if ac is not None:
        if ac not in _NAMES:
            raise NotImplementedError(
                f"rnnrt.nn: torch.autocast with dtype {ac} is not supported; rnnrt runs "
                f"autocast in torch.bfloat16 or torch.float16")
        return CallPrecision(_NAMES[ac], ac, True)
    if param_dtype in _NAMES:
        return CallPrecision(_NAMES[param_dtype], param_dtype, False)
    return None


def check_autocast_inputs(tensors: dict) -> None:
    """Under autocast: each of ``tensors`` ({name: tensor | None}) float32, bfloat16 or
    float16 (what the runner takes), else ValueError naming it."""
    for name, t in tensors.items():
        if t is not None and t.dtype not in INPUT_DTYPES:
            raise ValueError(f"{name}: under torch.autocast rnnrt.nn takes float32, bfloat16 "
                             f"or float16 tensors, got {t.dtype}")
