"""A small capture-safe cuBLASLt binding (ctypes): fp32 GEMMs with a chosen algorithm.

Why: cublasSgemm runs the kernel its heuristic picks for a problem alone on the GPU; a plan's
per-step GEMMs run beside the other layers' (the wavefront), where another tile or split can
be faster (experiments/scripts/gemm_algos_bench.py: up to 1.2x at the wide grid's GEMM-bound
points, and never a single best tile). cuBLASLt lists the algorithms that can run a problem
(``cublasLtMatmulAlgoGetHeuristic``) and runs the one it is given; which one runs is
kernels/gemm_algos.py's decision, not this module's.

Only the plain fp32 problem (CUDA_R_32F operands and output, CUBLAS_COMPUTE_32F: FMA kernels,
no TF32), batch 1. Row-major views as in cublas.py: row-major out[N, M] = op(a) @ op(b) is
column-major out^T[M, N] = op(b)^T op(a)^T, so cuBLASLt's A is our b and its B our a.
``cublasLtMatmul`` with a given algorithm and a workspace the caller owns allocates nothing, so
it can be captured in a graph like the cuBLAS calls; the heuristic query runs before (at
prepare time).
"""
from __future__ import annotations

import ctypes
import functools

from .cublas import CublasError, load_nvidia_lib

CUDA_R_32F, CUBLAS_COMPUTE_32F = 0, 68
DESC_TRANSA, DESC_TRANSB = 3, 4                       # cublasLtMatmulDescAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1                          # cublasLtMatmulPreferenceAttributes_t
PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}  # ..._MIN_ALIGNMENT_<X>_BYTES
CONFIG_TILE_ID, CONFIG_SPLITK_NUM, CONFIG_STAGES_ID = 1, 2, 6   # ...AlgoConfigAttributes_t
TILES = {11: "32x32", 12: "32x64", 13: "64x32", 14: "32x128", 15: "64x64", 16: "128x32",
         17: "64x128", 18: "128x64", 19: "64x256", 20: "128x128", 21: "256x64", 22: "64x512",
         23: "128x256", 24: "256x128", 25: "512x64"}
"""cublasLtMatmulTile_t ids of the tiles an fp32 GEMM uses (for the records; others by id)."""


class Heuristic(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t: an algorithm (opaque, 8 words) and what it needs."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


@functools.lru_cache(maxsize=1)
def load_lt() -> ctypes.CDLL:
    """Locate and load libcublasLt once per process (cublas.load_nvidia_lib)."""
    return _declare(load_nvidia_lib("cublasLt"))


def _declare(lib):
    vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    pvp = ctypes.POINTER(vp)
    lib.cublasLtCreate.argtypes = [pvp]
    lib.cublasLtDestroy.argtypes = [vp]
    lib.cublasLtMatmulDescCreate.argtypes = [pvp, i, i]
    lib.cublasLtMatmulDescDestroy.argtypes = [vp]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [pvp, i, ctypes.c_uint64, ctypes.c_uint64,
                                               ctypes.c_int64]
    lib.cublasLtMatrixLayoutDestroy.argtypes = [vp]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [pvp]
    lib.cublasLtMatmulPreferenceDestroy.argtypes = [vp]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, i,
                                                   ctypes.POINTER(Heuristic), ctypes.POINTER(i)]
    lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [vp, i, vp, sz, ctypes.POINTER(sz)]
    # handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, ws, ws bytes,
    # stream
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz,
                                   vp]
    for name in ("cublasLtCreate", "cublasLtDestroy", "cublasLtMatmulDescCreate",
                 "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
                 "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
                 "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
                 "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic",
                 "cublasLtMatmulAlgoConfigGetAttribute", "cublasLtMatmul"):
        getattr(lib, name).restype = i
    return lib


def _check(status, what):
    if status != 0:
        raise CublasError(f"{what} failed with cuBLASLt status {status}")


def lt_layouts(M, N, K, trans_a, trans_b, a_ld, b_ld, out_ld):
    """The column-major problem of row-major out[N, M] = op(a) @ op(b) (op(a) [N, K], op(b)
    [K, M]): (transA, transB, (rows, cols, ld) of cuBLASLt's A = our b, of its B = our a, of
    C = out). Pure arithmetic, tested on the CPU."""
    # our b: row-major [K, M] (not transposed) is column-major [M, K] with ld b_ld, op N;
    # transposed, row-major [M, K] is column-major [K, M], op T
    A = (K, M, b_ld) if trans_b else (M, K, b_ld)
    # our a: row-major [N, K] is column-major [K, N], op N; transposed ([K, N] row-major)
    # column-major [N, K], op T
    B = (N, K, a_ld) if trans_a else (K, N, a_ld)
    return int(bool(trans_b)), int(bool(trans_a)), A, B, (M, N, out_ld)


def alignment(ptr: int, cap: int = 256) -> int:
    """The largest power of two (<= cap) that divides ``ptr``: what an algorithm may assume
    of an operand's address (cuBLASLt's heuristic assumes 256 bytes unless told)."""
    a = 1
    while a < cap and ptr % (2 * a) == 0:
        a *= 2
    return a


class LtAlgo:
    """One algorithm the heuristic offered for a problem: the opaque struct, its workspace,
    and its configuration (tile, split-K, stages) for the records."""

    def __init__(self, lib, h: Heuristic):
        self.struct = Heuristic.from_buffer_copy(h)
        self.workspace, self.waves = int(h.workspace), float(h.waves)
        cfg = {}
        for name, attr in (("tile", CONFIG_TILE_ID), ("splitk", CONFIG_SPLITK_NUM),
                           ("stages", CONFIG_STAGES_ID)):
            v, w = ctypes.c_uint32(), ctypes.c_size_t()
            st = lib.cublasLtMatmulAlgoConfigGetAttribute(
                ctypes.byref(self.struct.algo), attr, ctypes.byref(v), 4, ctypes.byref(w))
            cfg[name] = int(v.value) if st == 0 else None
        self.config = cfg

    def describe(self) -> str:
        t = self.config.get("tile")
        return (f"{TILES.get(t, f'tile {t}')} split-K {self.config.get('splitk') or 1}"
                f" stages {self.config.get('stages')}")


class LtProblem:
    """The fp32 problem of one GEMM op (shapes, transposes, leading dimensions, operand
    alignments) on a cuBLASLt handle: ``algos(n, workspace)`` lists what can run it,
    ``prepare(...)`` binds one to pointers and a stream for the time loop."""

    def __init__(self, handle: "LtHandle", M, N, K, trans_a, trans_b, a_ld, b_ld, out_ld,
                 aligns=(256, 256, 256)):
        self.lib, self.handle = handle.lib, handle
        lib, vp = self.lib, ctypes.c_void_p
        ta, tb, A, B, C = lt_layouts(M, N, K, trans_a, trans_b, a_ld, b_ld, out_ld)
        self.aligns = tuple(int(x) for x in aligns)   # of our a, b, out
        self.desc = vp()
        self._layouts = []
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F,
                                            CUDA_R_32F), "cublasLtMatmulDescCreate")
        for attr, v in ((DESC_TRANSA, ta), (DESC_TRANSB, tb)):
            x = ctypes.c_int32(v)
            _check(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(x), 4),
                   "cublasLtMatmulDescSetAttribute")
        self.a_desc, self.b_desc, self.c_desc = (self._layout(*d) for d in (A, B, C))

    def _layout(self, rows, cols, ld):
        d = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(d), CUDA_R_32F, rows, cols,
                                                   ld), "cublasLtMatrixLayoutCreate")
        self._layouts.append(d)
        return d

    def algos(self, n: int, workspace_bytes: int) -> list[LtAlgo]:
        """Up to ``n`` algorithms the heuristic offers (its order: its own guess first), each
        within ``workspace_bytes`` and the operands' alignments."""
        lib, pref = self.lib, ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)),
               "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(workspace_bytes)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES,
                                                            ctypes.byref(ws), 8),
                   "cublasLtMatmulPreferenceSetAttribute")
            # cuBLASLt's A is our b, its B our a; C and D are out
            for which, al in (("a", self.aligns[1]), ("b", self.aligns[0]),
                              ("c", self.aligns[2]), ("d", self.aligns[2])):
                x = ctypes.c_uint32(al)
                _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MIN_ALIGNMENT[which],
                                                                ctypes.byref(x), 4),
                       "cublasLtMatmulPreferenceSetAttribute")
            res = (Heuristic * n)()
            got = ctypes.c_int()
            _check(lib.cublasLtMatmulAlgoGetHeuristic(self.handle.handle, self.desc,
                                                      self.a_desc, self.b_desc, self.c_desc,
                                                      self.c_desc, pref, n, res,
                                                      ctypes.byref(got)),
                   "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        return [LtAlgo(lib, res[i]) for i in range(got.value)
                if res[i].state == 0 and res[i].workspace <= workspace_bytes]

    def prepare(self, algo: LtAlgo, out_ptr, a_ptr, b_ptr, alpha, beta, workspace_ptr,
                workspace_bytes, stream_ptr):
        """A call that runs ``algo`` on these pointers (out = alpha op(a) op(b) + beta out)
        on ``stream_ptr``; keeps its arguments alive."""
        if algo.workspace > workspace_bytes:
            raise ValueError(f"algorithm needs {algo.workspace} B of workspace, "
                             f"{workspace_bytes} given")
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        vp = ctypes.c_void_p
        args = (self.handle.handle, self.desc, ctypes.byref(al), vp(b_ptr), self.a_desc,
                vp(a_ptr), self.b_desc, ctypes.byref(be), vp(out_ptr), self.c_desc,
                vp(out_ptr), self.c_desc, ctypes.byref(algo.struct.algo), vp(workspace_ptr),
                workspace_bytes, vp(stream_ptr))
        fn = self.lib.cublasLtMatmul

        def call(args=args, keep=(al, be, algo, self)):
            status = fn(*args)
            if status != 0:
                raise CublasError(f"cublasLtMatmul failed with status {status}")
        return call

    def __del__(self):   # the descriptors are host memory cuBLASLt allocated
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone
            pass

    def close(self):
        for d in self._layouts:
            self.lib.cublasLtMatrixLayoutDestroy(d)
        self._layouts.clear()
        if self.desc:
            self.lib.cublasLtMatmulDescDestroy(self.desc)
            self.desc = ctypes.c_void_p()


class LtHandle:
    """One cuBLASLt handle (not bound to a stream: each call names its own)."""

    def __init__(self):
        self.lib = load_lt()
        h = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
        self.handle = h

    def close(self):
        if self.handle:
            self.lib.cublasLtDestroy(self.handle)
            self.handle = None
