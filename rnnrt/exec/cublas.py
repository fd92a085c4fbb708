"""A small capture-safe cuBLAS binding (ctypes, libcublas called directly).

Why not CuPy's wrappers: cupy.matmul and cupy.cublas raise inside a stream capture, and the
low-level ``cupy_backends.cuda.libs.cublas.sgemm`` re-binds its handle to CuPy's *current*
stream on every call, so under a capture on another stream the GEMM silently runs eagerly and
is missing from the graph (seen on the H100: outputs poisoned before the capture were filled
before the graph ran; docs/journal.md, first session). Here each ``CublasHandle`` is
bound once to one stream and given its own preallocated workspace (so cuBLAS allocates
nothing during a capture), and every call checks its status.

Row-major GEMMs: rnnrt's views are row-major; cuBLAS is column-major. A row-major [r, c]
view with leading dimension ld is the column-major [c, r] matrix with the same ld, so
row-major C = op(A) @ op(B) is column-major C^T = op(B)^T-ish @ op(A)^T-ish: we call
sgemm(transa=op of B, transb=op of A, m=M, n=N, k=K, A=B, lda=ldb, B=A, ldb=lda, C, ldc).

Precisions (rnnrt/precision.py): a float32 GEMM is ``cublasSgemm`` on a handle in
CUBLAS_DEFAULT_MATH (no TF32), exactly as before precisions existed. Every other precision
calls ``cublasGemmEx`` with its types per call, not per handle (a handle is shared by all
the plans a runner issues on its stream, whatever their precision, and the math mode stays
the default): A and B of the storage type (CUDA_R_32F for tf32, CUDA_R_16BF, CUDA_R_16F), C
CUDA_R_32F, compute CUBLAS_COMPUTE_32F_FAST_TF32 for tf32 (TF32 tensor cores, fp32
accumulation) and CUBLAS_COMPUTE_32F for the 16-bit types (tensor cores, fp32 accumulation),
alpha and beta fp32, CUBLAS_GEMM_DEFAULT. Like Sgemm it allocates nothing outside the
handle's workspace, so it is as capture-safe. A batched Gemm op (plan/ops.py: the split-K
recurrent backward GEMM) is ``cublasSgemmStridedBatched`` / ``cublasGemmStridedBatchedEx``
with the same arguments plus a stride after each matrix and the batch count.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUBLAS_DEFAULT_MATH = 0          # no TF32: fp32 GEMMs stay fp32 (the paper's arithmetic)
CUBLAS_PEDANTIC_MATH = 2
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14                 # cudaDataType_t
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77      # cublasComputeType_t
CUBLAS_GEMM_DEFAULT = -1

GEMM_TYPES = {
    # precision -> (A and B's cudaDataType, compute type); None: cublasSgemm
    "float32": None,
    "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32),
    "bfloat16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F),
    "float16": (CUDA_R_16F, CUBLAS_COMPUTE_32F),
}
"""The GEMM of each precision (rnnrt.precision.DTYPES): C is always CUDA_R_32F."""


class CublasError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def load_library() -> ctypes.CDLL:
    """Locate and load libcublas once per process (``load_nvidia_lib``)."""
    return _declare(load_nvidia_lib("cublas"))


def load_nvidia_lib(name: str) -> ctypes.CDLL:
    """Locate and load lib<name> ('cublas', 'cublasLt'): cuda-pathfinder (a CuPy dependency)
    first, then the usual sonames. Raises CublasError listing what was tried."""
    tried = []
    try:
        from cuda import pathfinder  # type: ignore
        path = getattr(pathfinder.load_nvidia_dynamic_lib(name), "abs_path", None)
        if path:
            return ctypes.CDLL(path)
        tried.append("cuda.pathfinder (no abs_path)")
    except Exception as e:  # noqa: BLE001 - report and try the next way
        tried.append(f"cuda.pathfinder: {e}")
    names = [f"lib{name}.so.13", f"lib{name}.so.12", f"lib{name}.so"]
    found = ctypes.util.find_library(name)
    if found:
        names.append(found)
    for so in names:
        try:
            return ctypes.CDLL(so)
        except OSError as e:
            tried.append(f"{so}: {e}")
    raise CublasError(f"could not load lib{name}; tried: " + "; ".join(tried))


def _declare(lib):
    vp, i, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    fp = ctypes.POINTER(ctypes.c_float)
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasDestroy_v2.argtypes = [vp]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, c]
    lib.cublasSetMathMode.argtypes = [vp, i]
    lib.cublasGetVersion_v2.argtypes = [vp, ctypes.POINTER(i)]
    lib.cublasSgemm_v2.argtypes = [vp, i, i, i, i, i, fp, vp, i, vp, i, fp, vp, i]
    # handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype,
    # ldc, computeType, algo
    lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
    ll = ctypes.c_longlong
    # the same with a stride (elements) after each matrix's ld, and the batch count after C's
    lib.cublasSgemmStridedBatched.argtypes = [vp, i, i, i, i, i, fp, vp, i, ll, vp, i, ll, fp,
                                              vp, i, ll, i]
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i,
                                               ll, vp, vp, i, i, ll, i, i, i]
    for name in ("cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2",
                 "cublasSetWorkspace_v2", "cublasSetMathMode", "cublasGetVersion_v2",
                 "cublasSgemm_v2", "cublasGemmEx", "cublasSgemmStridedBatched",
                 "cublasGemmStridedBatchedEx"):
        getattr(lib, name).restype = i
    return lib


def _check(status, what):
    if status != 0:
        raise CublasError(f"{what} failed with cuBLAS status {status}")


class CublasHandle:
    """One cuBLAS handle bound to one CUDA stream, with its own workspace.

    stream_ptr: the raw cudaStream_t (cupy Stream.ptr); workspace_ptr/bytes: device memory
    the caller keeps alive for the handle's lifetime (cuBLAS recommends 32 MiB on Hopper).
    """

    def __init__(self, stream_ptr: int, workspace_ptr: int, workspace_bytes: int):
        self.lib = load_library()
        h = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        self.handle = h
        _check(self.lib.cublasSetStream_v2(h, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
        _check(self.lib.cublasSetWorkspace_v2(h, ctypes.c_void_p(workspace_ptr),
                                              workspace_bytes), "cublasSetWorkspace")
        _check(self.lib.cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode")
        self._sgemm = self.lib.cublasSgemm_v2
        self._gemm_ex = self.lib.cublasGemmEx

    def version(self) -> int:
        v = ctypes.c_int()
        _check(self.lib.cublasGetVersion_v2(self.handle, ctypes.byref(v)), "cublasGetVersion")
        return v.value

    def prepare_gemm(self, out_ptr, out_ld, a_ptr, a_ld, b_ptr, b_ld, M, N, K,
                     trans_a=False, trans_b=False, alpha=1.0, beta=0.0, dtype="float32",
                     batch=1, strides=(0, 0, 0)):
        """Prebuild the argument tuple of row-major out[N, M] = op(a) @ op(b) (+ beta*out),
        so the time loop only calls ``gemm(args)``. Keeps alpha/beta objects alive.
        dtype: the precision (GEMM_TYPES): a and b hold its storage type, out is fp32.
        batch > 1: that many products, product i on a, b, out moved by i * strides (a, b,
        out; elements): the strided-batched call."""
        if dtype not in GEMM_TYPES:
            raise ValueError(f"dtype: expected one of {list(GEMM_TYPES)}, got {dtype!r}")
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        ex = GEMM_TYPES[dtype]
        # Sgemm's arguments are GemmEx's without the types (after each matrix, and at the end)
        ab, c, tail = ((), (), ()) if ex is None else ((ex[0],), (CUDA_R_32F,),
                                                       (ex[1], CUBLAS_GEMM_DEFAULT))
        # the batched calls: a stride after each matrix's ld, the count after C's
        sa, sb, so = ((), (), ()) if batch == 1 else ((strides[0],), (strides[1],),
                                                      (strides[2], batch))
        args = (self.handle,
                CUBLAS_OP_T if trans_b else CUBLAS_OP_N,
                CUBLAS_OP_T if trans_a else CUBLAS_OP_N,
                M, N, K, ctypes.byref(al),
                ctypes.c_void_p(b_ptr), *ab, b_ld, *sb,
                ctypes.c_void_p(a_ptr), *ab, a_ld, *sa,
                ctypes.byref(be),
                ctypes.c_void_p(out_ptr), *c, out_ld, *so, *tail)
        if batch > 1:
            if ex is None:
                return (args, al, be, self.lib.cublasSgemmStridedBatched,
                        "cublasSgemmStridedBatched")
            return (args, al, be, self.lib.cublasGemmStridedBatchedEx,
                    "cublasGemmStridedBatchedEx")
        if ex is None:
            return (args, al, be, self._sgemm, "cublasSgemm")
        return (args, al, be, self._gemm_ex, "cublasGemmEx")

    def gemm(self, prepared) -> None:
        status = prepared[3](*prepared[0])
        if status != 0:
            raise CublasError(f"{prepared[4]} failed with status {status}")

    def close(self):
        if self.handle is not None:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = None


def cublas_version() -> str:
    """The loaded libcublas's version, 'major.minor.patch' (cublasGetProperty)."""
    lib = load_library()
    lib.cublasGetProperty.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    v = ctypes.c_int()
    parts = []
    for prop in (0, 1, 2):  # MAJOR, MINOR, PATCH
        _check(lib.cublasGetProperty(prop, ctypes.byref(v)), "cublasGetProperty")
        parts.append(str(v.value))
    return ".".join(parts)
