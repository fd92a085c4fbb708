"""What the benchmarks do per precision (precision.DTYPES): the plan's and the reference's
``dtype`` keywords, the check's tolerance, how tables and file names say the precision.

SHIM(p23core): ``dtype_kw`` and ``reference_dtype`` pass ``dtype`` on only where it is not
float32 / where the precision rounds, so float32 (and tf32's reference) are called exactly as
before; PlanKey.dtype and the reference's ``dtype`` come with the p23core branch, and until it
is merged any other precision fails at the plan (TypeError: an unexpected keyword).
"""
from __future__ import annotations

from ..precision import get_precision


def dtype_kw(dtype: str) -> dict:
    """The ``dtype`` keyword of PlanKey and GpuRunner for precision ``dtype``: none for
    float32 (their default), so float32 plans and runners are built exactly as before.
    SHIM(p23core): their ``dtype`` comes with the p23core branch; until it is merged another
    precision fails here (TypeError)."""
    return {} if get_precision(dtype).name == "float32" else {"dtype": dtype}


def tolerance(dtype: str) -> dict:
    """compare_all's atol / rtol at precision ``dtype`` (float32: check.FP32_ATOL/RTOL)."""
    p = get_precision(dtype)
    return {"atol": p.atol, "rtol": p.rtol}


def reference_dtype(dtype: str) -> dict:
    """reference.forward/backward's keyword for precision ``dtype``: its storage rounding
    where the precision rounds (bfloat16, float16); none for float32 and tf32 (fp32 storage:
    the plain reference; TF32's operand rounding is not emulated). SHIM(p23core): the
    reference's ``dtype`` comes with the p23core branch."""
    return {"dtype": dtype} if get_precision(dtype).rounds else {}


def reference_name(dtype: str) -> str:
    """How a check names the reference of precision ``dtype``."""
    return "float64 reference" + (f" ({dtype} rounding)" if get_precision(dtype).rounds else "")


# how the table names a precision, and how cuDNN ran at it (bench/cudnn.py)
PRECISION_WORDS = {"float32": "fp32", "tf32": "tf32 (fp32 storage, TF32 GEMMs)",
                   "bfloat16": "bfloat16 storage, fp32 accumulation",
                   "float16": "float16 storage, fp32 accumulation"}
CUDNN_MODE = {"float32": "TF32 off", "tf32": "TF32 on", "bfloat16": "module and inputs bfloat16",
              "float16": "module and inputs float16"}


def dtype_suffix(dtype) -> str:
    """What a record's file name adds for its precision: '' for float32 (names as before),
    else '-<dtype>' (e.g. '-bfloat16')."""
    return "" if dtype in (None, "float32") else f"-{get_precision(dtype).name}"
