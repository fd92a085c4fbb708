"""What the benchmarks do per precision (precision.DTYPES): the check's tolerance, how
tables and file names say the precision. PlanKey, GpuRunner and the reference take the
``dtype`` itself."""
from __future__ import annotations

from ..precision import get_precision


def tolerance(dtype: str) -> dict:
    """compare_all's atol / rtol at precision ``dtype`` (float32: check.FP32_ATOL/RTOL)."""
    p = get_precision(dtype)
    return {"atol": p.atol, "rtol": p.rtol}


def reference_name(dtype: str) -> str:
    """How a check names the reference of precision ``dtype``."""
    return "float64 reference" + ("" if dtype == "float32" else f" ({dtype} rounding)")


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
