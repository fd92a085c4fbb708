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
      rounding only, ours the more precise: tests/gpu/test_gpu_nn_precision.py.)
  CUDA float32 parameters, no autocast
      float32, exactly as before. TF32 is not taken from torch.backends' allow_tf32 flags:
      rnnrt.nn in float32 is fp32 math, whatever those flags (they default to on for cuDNN).
  CPU
      float32 / float64 through the NumPy reference. Under ``torch.autocast("cpu", ...)``
      the call is refused (NotImplementedError saying why and what to do): torch.nn.LSTM
      runs bfloat16 there, the NumPy path has no 16-bit storage rounding, and running fp32
      silently would compute something other than asked.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

RUNNER_DEVICES = ("cuda",)
"""Device types whose backend is a GpuRunner (the one that runs every precision)."""
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
    ac = autocast_dtype(device.type)
    if device.type in RUNNER_DEVICES:
        if ac is not None:
            if ac not in _NAMES:
                raise NotImplementedError(
                    f"rnnrt.nn: torch.autocast with dtype {ac} is not supported; rnnrt runs "
                    f"autocast in torch.bfloat16 or torch.float16")
            return CallPrecision(_NAMES[ac], ac, True)
        if param_dtype in _NAMES:
            return CallPrecision(_NAMES[param_dtype], param_dtype, False)
        return None
    if ac is not None:
        raise NotImplementedError(
            f"rnnrt.nn on the CPU: torch.autocast('{device.type}', dtype={ac}) is not "
            f"supported (the CPU path computes in float32 / float64 and has no 16-bit "
            f"storage rounding; running float32 silently would not be what autocast asks). "
            f"Run the module outside autocast (with torch.autocast('{device.type}', "
            f"enabled=False): ...), or on CUDA, where autocast runs in {ac}")
    return None


def check_autocast_inputs(tensors: dict) -> None:
    """Under autocast: each of ``tensors`` ({name: tensor | None}) float32, bfloat16 or
    float16 (what the runner takes), else ValueError naming it."""
    for name, t in tensors.items():
        if t is not None and t.dtype not in INPUT_DTYPES:
            raise ValueError(f"{name}: under torch.autocast rnnrt.nn takes float32, bfloat16 "
                             f"or float16 tensors, got {t.dtype}")
