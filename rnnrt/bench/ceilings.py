"""The GEMM ceiling a TFLOPS share is computed against, per precision (precision.DTYPES).

float32: the fp32 SGEMM through rnnrt's own cuBLAS binding, tensor cores off
(timing.gemm_ceiling, measured once a session: 51.6 TFLOPS on the H100 SXM). tf32, bfloat16,
float16: a large GEMM at that precision measured in the same process through torch (cuBLAS:
fp32 operands with TF32 allowed; bf16 / fp16 operands with fp32 accumulation, reduced-precision
reductions off, as rnnrt's GemmEx calls accumulate) — the precision's own tensor-core roof, so
that a 16-bit figure is not flattered by the fp32 one. Every ceiling record also carries the
device's datasheet dense peak for that precision where it is known (``DATASHEET``), so a
reader sees how far the measured roof sits below the marketing one.
"""
from __future__ import annotations

from ..precision import get_precision

# Dense (no 2:4 sparsity) peak TFLOPS of the H100 SXM5 80GB, from NVIDIA's "H100 Tensor Core
# GPU" datasheet (nvidia.com/en-us/data-center/h100, the SXM column): its tensor-core figures
# are quoted with sparsity (TF32 989, BF16 / FP16 1,979 TFLOPS), the dense ones are half;
# FP32 (CUDA cores) 67 TFLOPS. Keyed by the device slug (records.device_slug) prefix.
DATASHEET = {
    "nvidia-h100-80gb-hbm3": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4,
                              "float16": 989.4},
}
DATASHEET_SOURCE = ("NVIDIA H100 Tensor Core GPU datasheet, SXM5: dense = the quoted "
                    "with-sparsity tensor-core figure / 2")


def datasheet_tflops(device_name: str, dtype: str) -> float | None:
    """The datasheet dense peak (TFLOPS) of ``dtype`` on the device named ``device_name``,
    or None where the table has no entry."""
    from .records import device_slug
    return DATASHEET.get(device_slug(device_name), {}).get(get_precision(dtype).name)


def torch_gemm_ceiling(torch, dtype: str, n: int = 8192, repeats: int = 10) -> dict:
    """TFLOPS of an n^3 GEMM at precision ``dtype`` (tf32, bfloat16 or float16) through
    torch.matmul on the current CUDA device, torch's TF32 / reduced-reduction flags set for
    the measurement and restored after; the product spot-checked against float64."""
    from .timing import time_torch
    p = get_precision(dtype)
    if p.name == "float32":
        raise ValueError("dtype: the float32 ceiling is timing.gemm_ceiling (rnnrt's SGEMM)")
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16}[p.storage]
    m = torch.backends.cuda.matmul
    saved = (m.allow_tf32, m.allow_fp16_reduced_precision_reduction,
             m.allow_bf16_reduced_precision_reduction)
    try:
        m.allow_tf32 = p.gemm == "tf32"
        m.allow_fp16_reduced_precision_reduction = False
        m.allow_bf16_reduced_precision_reduction = False
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(n, n, device="cuda", generator=g).to(tdt)
        b = torch.randn(n, n, device="cuda", generator=g).to(tdt)
        c = torch.empty(n, n, device="cuda", dtype=tdt)
        t = time_torch(torch, lambda: torch.matmul(a, b, out=c), repeats, 2)
        ref = a[:4].double() @ b[:, :4].double()
        err = float((c[:4, :4].double() - ref).abs().max() / ref.abs().max())
        a = b = c = None   # freed before empty_cache (not del: the lambda names them)
    finally:
        m.allow_tf32, m.allow_fp16_reduced_precision_reduction, \
            m.allow_bf16_reduced_precision_reduction = saved
    torch.cuda.empty_cache()
    what = {"tf32": "fp32 operands, TF32 tensor cores", "bfloat16": "bf16 operands, fp32 "
            "accumulation", "float16": "fp16 operands, fp32 accumulation"}[p.name]
    return {"what": f"{p.name} GEMM {n}^3 through torch.matmul ({what})",
            "tflops": 2 * n**3 / (t.ms_median * 1e-3) / 1e12, "ms_median": t.ms_median,
            "rel_err_spot_check": err, "dtype": p.name}


def with_datasheet(ceiling: dict, device_name: str, dtype: str) -> dict:
    """``ceiling`` (a measured ceiling's dict) plus the datasheet's dense peak of ``dtype``
    on this device and its source (absent where the table has no entry)."""
    peak = datasheet_tflops(device_name, dtype)
    if peak is None:
        return {**ceiling, "dtype": get_precision(dtype).name}
    return {**ceiling, "dtype": get_precision(dtype).name, "datasheet_tflops": peak,
            "datasheet_source": DATASHEET_SOURCE}
