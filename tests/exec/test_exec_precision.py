"""Precision in the workspace and the cuBLAS binding, without a GPU: 'store' buffers hold the
storage type (bfloat16 as uint16 bits, float16, 2 bytes an element), loads round to nearest
even bit for bit as precision.round_to_storage does, reads give float32 back exactly, poison
is NaN in every type; 'float' and 'uint32' buffers are as before; a prepared GEMM calls
cublasSgemm for float32 (as before) and cublasGemmEx with the storage type and compute type
otherwise."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rnnrt.exec import cublas
from rnnrt.exec.workspace import Workspace, from_bfloat16_bits, to_bfloat16_bits
from rnnrt.plan.model import Binding, Buffer
from rnnrt.plan.ops import View
from rnnrt.precision import round_to_bfloat16, round_to_storage


def _edge_values(rng):
    f32 = np.finfo(np.float32)
    edges = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, f32.max, -f32.max,
                      f32.tiny, 1e-40, 3.3895314e38, 65504.0, 65520.0, 1.00390625,
                      1.01171875, 1.0 + 2 ** -8 + 2 ** -20], dtype=np.float32)
    nan_bits = np.array([0x7F800001, 0xFFFFFFFF, 0xFFC00000], dtype=np.uint32).view(np.float32)
    return np.concatenate([edges, nan_bits, rng.standard_normal(5000).astype(np.float32) * 50,
                           rng.uniform(-1, 1, 3000).astype(np.float32)])


def test_bfloat16_bits_round_as_the_reference_does():
    a = _edge_values(np.random.default_rng(0))
    bits = to_bfloat16_bits(np, a)
    assert bits.dtype == np.uint16
    back = from_bfloat16_bits(np, bits)
    ref = round_to_bfloat16(a)
    same = (back.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(back) & np.isnan(ref))
    assert same.all(), a[~same]
    # ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    assert from_bfloat16_bits(np, to_bfloat16_bits(np, np.float32([1.00390625])))[0] == 1.0


class _Key:
    dtype = "bfloat16"


class _Plan:
    """A two-buffer plan: x (store) [4, 3] and y (float) [4, 3], a sync buffer, a ones
    vector (store)."""

    def __init__(self):
        self.key = _Key()
        self.buffers = (Buffer("params", 6, "param"), Buffer("x", 12, "io", "store"),
                        Buffer("y", 12, "io"), Buffer("ones", 4, "ones", "store"),
                        Buffer("sync", 8, "sync", "uint32"))
        self.inputs = {"x": Binding((4, 3), (View("x", 0, 4, 3, 3),))}
        self.outputs = {"y": Binding((4, 3), (View("y", 0, 4, 3, 3),)),
                        "x": Binding((4, 3), (View("x", 0, 4, 3, 3),))}

    def buffer(self, name):
        return next(b for b in self.buffers if b.name == name)


@pytest.mark.parametrize("store, kind", [("bfloat16", np.uint16), ("float16", np.float16),
                                         ("float32", np.float32)])
def test_store_buffers_hold_the_storage_type(store, kind):
    ws = Workspace(_Plan(), np, np.float32, np.zeros(6, np.float32), store=store)
    assert ws.bufs["x"].dtype == kind and ws.bufs["x"].nbytes == 12 * np.dtype(kind).itemsize
    assert ws.bufs["y"].dtype == np.float32 and ws.bufs["sync"].dtype == np.uint32
    assert ws.elements == {"params": "float32", "x": store, "y": "float32", "ones": store,
                           "sync": "uint32"}
    assert np.isnan(ws.read("x")).all()                         # poisoned, as NaN
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32) * 3
    ws.load(x=x)
    got = ws.read("x")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, round_to_storage(x, store))
    if store != "float32":
        assert not np.array_equal(got, x)                       # it really rounded
    ones = ws.bufs["ones"]
    ones = from_bfloat16_bits(np, ones) if store == "bfloat16" else ones
    assert (ones == 1).all()                                     # 1.0 in the storage's bits
    ws.poison(names=["x"])
    assert np.isnan(ws.read("x")).all()
    # a chunk's own activations (chunked.py): new buffers of the same element types,
    # poisoned, the others shared (on the H100 a bf16 chunk got fp32 ones: NaN gradients)
    own = ws.with_own(["x", "y"])
    for name in ("x", "y"):
        assert own.bufs[name].dtype == ws.bufs[name].dtype and own.bufs[name] is not ws.bufs[name]
        assert np.isnan(own.read(name)).all()
    assert own.bufs["ones"] is ws.bufs["ones"]


def test_default_store_on_numpy_is_the_workspace_float():
    """A NumPy workspace (the NumPy executor's float64, or float32 traces) keeps store
    buffers in its own float type: the NumPy executor rounds what it writes there."""
    for dt in (np.float64, np.float32):
        ws = Workspace(_Plan(), np, dt, np.zeros(6, dt))
        assert ws.bufs["x"].dtype == dt and ws.store == np.dtype(dt).name


def test_bad_store_is_refused():
    with pytest.raises(ValueError, match="store: expected one of"):
        Workspace(_Plan(), np, np.float32, np.zeros(6, np.float32), store="int8")


class _Lib:
    def __init__(self):
        self.calls = []

    def sgemm(self, *a):
        self.calls.append(("sgemm", a))
        return 0

    def gemm_ex(self, *a):
        self.calls.append(("gemm_ex", a))
        return 0


def _handle():
    """A CublasHandle over a recording stand-in for libcublas (no GPU)."""
    lib = _Lib()
    h = object.__new__(cublas.CublasHandle)
    h.handle = ctypes.c_void_p(1)
    h._sgemm, h._gemm_ex = lib.sgemm, lib.gemm_ex   # noqa: SLF001 - the binding's own slots
    return h, lib


@pytest.mark.parametrize("dtype, ab, compute", [
    ("tf32", cublas.CUDA_R_32F, cublas.CUBLAS_COMPUTE_32F_FAST_TF32),
    ("bfloat16", cublas.CUDA_R_16BF, cublas.CUBLAS_COMPUTE_32F),
    ("float16", cublas.CUDA_R_16F, cublas.CUBLAS_COMPUTE_32F)])
def test_gemm_ex_types(dtype, ab, compute):
    h, lib = _handle()
    h.gemm(h.prepare_gemm(1000, 8, 2000, 16, 3000, 32, 8, 4, 16, False, True, 1.0, 1.0,
                          dtype=dtype))
    name, a = lib.calls[-1]
    assert name == "gemm_ex" and len(a) == 19
    assert a[1:6] == (cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, 8, 4, 16)
    assert (a[8], a[11], a[15]) == (ab, ab, cublas.CUDA_R_32F)   # A, B storage; C fp32
    assert (a[9], a[12], a[16]) == (32, 16, 8)                   # ldb, lda, ldc (row-major)
    assert (a[17], a[18]) == (compute, cublas.CUBLAS_GEMM_DEFAULT)


def test_float32_gemm_is_sgemm_as_before():
    h, lib = _handle()
    h.gemm(h.prepare_gemm(1000, 8, 2000, 16, 3000, 32, 8, 4, 16))
    name, a = lib.calls[-1]
    assert name == "sgemm" and len(a) == 14
    with pytest.raises(ValueError, match="dtype: expected one of"):
        h.prepare_gemm(1, 1, 1, 1, 1, 1, 1, 1, 1, dtype="float64")


def test_params_must_stay_the_float_master():
    plan = _Plan()
    plan.buffers = (Buffer("params", 6, "param", "store"),) + plan.buffers[1:]
    with pytest.raises(ValueError, match="buffer params: expected a 'float' buffer"):
        Workspace(plan, np, np.float32, np.zeros(6, np.float32), store="bfloat16")
