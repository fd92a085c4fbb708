"""The precisions a pass can run in, and where their rounding happens.

One rule for every rung and executor (the plan builders apply it, the executors and the
rounding-aware reference follow it):

- **storage**: the buffers a GEMM reads as an operand (x, the weights or their transposed
  copies, each step's h, the backward's gate gradients) hold the storage type: a value is
  rounded to it (round to nearest, ties to even) when it is written there, and read back
  exactly;
- **accumulate**: everything else is fp32: every GEMM accumulates and writes in fp32 (the
  pre-activations, dh, dx, the weight gradients), and the cell state and all pointwise math
  are fp32.

``float32``: true fp32 everywhere (the paper's arithmetic; storage = fp32, so no rounding).
``tf32``: fp32 storage, GEMMs on the tensor cores in TF32: each GEMM reads its operands
rounded to a 10-bit mantissa (``gemm_operand``; to nearest), accumulates in fp32. The
persistent kernels decline it (their on-chip products are fp32 FMAs: other math).
``bfloat16`` / ``float16``: 16-bit storage, GEMMs on the tensor cores with fp32 accumulation.

Where the rule lives: ``PlanKey.dtype`` names the precision; the plan builders label each
buffer 'store' or 'float' (plan/storage.py ``store_names``; plan/model.py ``validate``
checks the labels against the GEMMs) and, for 16-bit storage, give the GEMMs copies of the
weights made at the start of the forward (``ew_copy``, or the pre-transpose) -- the fp32
params stay the master, and the weight gradients are fp32; the NumPy executor rounds every
write into a store buffer (exec/numpy_exec.py); ``rnnrt.reference`` / ``rnnrt.varlen`` with
``dtype`` round at the same points. The rounding points, in a pass: x and h0 where loaded,
W and R once per pass, each step's h as its kernel stores it (so R.h, the next layer's W.x, y
and h_n read the rounded h), and in the backward each step's gate gradients as their kernel
stores them (the dx, dh, dW, dR GEMMs and the bias sums read the rounded ones). Nothing else
rounds: gx, gh, c, the saved gates, dh, dc, dx and the weight gradients are fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Precision:
    """One precision. storage: the GEMM operands' element type ('float32', 'bfloat16',
    'float16'); gemm: the GEMMs' math ('fp32' or 'tf32'; 16-bit operands always accumulate
    in fp32); atol / rtol: a fast path's tolerance against the rounding-aware float64
    reference of the same precision (the rounding points are the same on both sides, so what
    remains is fp32 accumulation order and, where storage rounds, one storage ulp of a value
    near a rounding boundary carried forward)."""

    name: str
    storage: str
    gemm: str
    atol: float
    rtol: float

    @property
    def itemsize(self) -> int:
        """Bytes of one stored element."""
        return 4 if self.storage == "float32" else 2

    @property
    def rounds(self) -> bool:
        """Whether writing to storage rounds (16-bit storage)."""
        return self.storage != "float32"


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("float32", "float32", "fp32", 1e-4, 1e-3),
    # tf32: the reference rounds the GEMM operands to nearest; cuBLAS does not document its
    # conversion, and on the H100 a sum of 24 products was off by 1.4 x 2e-3 (one TF32 ulp
    # of a few operands rounded the other way)
    Precision("tf32", "float32", "tf32", 5e-3, 1e-2),
    Precision("bfloat16", "bfloat16", "fp32", 2e-2, 2e-2),
    Precision("float16", "float16", "fp32", 4e-3, 4e-3),
)}
DTYPES = tuple(PRECISIONS)
"""The names a ``dtype`` argument takes, the default first."""


def get_precision(dtype) -> Precision:
    """The Precision named ``dtype`` (one of DTYPES); ValueError naming the allowed ones."""
    if isinstance(dtype, Precision):
        return dtype
    if not isinstance(dtype, str) or dtype not in PRECISIONS:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {dtype!r}")
    return PRECISIONS[dtype]


def _drop_low_bits(a, n: int) -> np.ndarray:
    """``a`` as float32 with the low ``n`` mantissa bits rounded off (to nearest, ties to
    even: add half an ulp of the dropped bits, plus one where the kept part is odd, and
    clear them), as float32. NaN stays NaN; a value that rounds past the largest finite
    value becomes Inf, as the GPU's conversion does."""
    f = np.asarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    half = (1 << (n - 1)) - 1
    rounded = (bits + half + ((bits >> n) & 1)) & (0xFFFFFFFF ^ ((1 << n) - 1))
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), f, out)


def round_to_bfloat16(a) -> np.ndarray:
    """``a`` (any real array) rounded to the nearest bfloat16 (ties to even), as float32:
    bfloat16 is float32's top 16 bits."""
    return _drop_low_bits(a, 16)


def round_to_tf32(a) -> np.ndarray:
    """``a`` rounded to TF32 (fp32 with a 10-bit mantissa: the low 13 bits rounded off, to
    nearest, ties to even), as float32: what a TF32 tensor-core GEMM reads of an fp32
    operand. NaN stays NaN."""
    return _drop_low_bits(a, 13)


def gemm_operand(a, dtype) -> np.ndarray:
    """What a GEMM of precision ``dtype`` reads of operand ``a`` (already in storage), in
    ``a``'s float dtype: TF32-rounded for tf32, ``a`` itself otherwise (fp32 GEMMs read it
    exactly; 16-bit operands were rounded when stored)."""
    arr = np.asarray(a)
    if get_precision(dtype).gemm != "tf32":
        return arr
    kind = arr.dtype if arr.dtype.kind == "f" else np.dtype(np.float64)
    return round_to_tf32(arr).astype(kind)


def round_to_storage(a, dtype) -> np.ndarray:
    """``a`` rounded where precision ``dtype`` stores it, returned in ``a``'s float dtype
    (float64 stays float64, so a float64 reference can carry exactly the stored values):
    unchanged for fp32 storage, else rounded to bfloat16 / float16 (to nearest, ties to
    even; overflow to Inf). a: any shape."""
    p = get_precision(dtype)
    arr = np.asarray(a)
    if not p.rounds:
        return arr
    kind = arr.dtype if arr.dtype.kind == "f" else np.dtype(np.float64)
    # through float32 first: the GPU rounds the fp32 value it computed (a float64 reference
    # value is one fp32 rounding from it; rounding twice is what the hardware does too)
    if p.storage == "bfloat16":
        return round_to_bfloat16(arr).astype(kind)
    with np.errstate(over="ignore"):   # overflow to Inf is the rounding's defined result
        return arr.astype(np.float32).astype(np.float16).astype(kind)
