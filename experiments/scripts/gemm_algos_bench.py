"""Does cuBLAS's default choice of fp32 GEMM kernel leave time on the table at the GEMM-bound
points of the wide grid? The wide grid's LSTM L4 forward at B 256 (H 512-2048) runs at
0.96-0.99x cuDNN fp32 on the H200 (and on the H100): there our per-step GEMMs (cublasSgemm,
the heuristic's kernel) already add up to no more GPU time than cuDNN's, whose R.h at H 2048 is
a CUTLASS SIMT 256x128 tile where ours is a 128x128 one.

For each GEMM of the forward (R.h of one step: out [B, 4H] = h [B, H] R^T, as stored ('tn') and
pre-transposed ('nn'); W.x of a 2- and a 10-step chunk), this times cublasSgemm (the default)
and every algorithm cublasLt's heuristic offers for the same fp32 problem (compute
CUBLAS_COMPUTE_32F: FMA kernels, no TF32), each alone and as four copies on four streams at
once (the wavefront's layers), CUDA events, warm-up, median. Each algorithm's result is checked
against the default's (same math: fp32 FMAs; the order of the sum may differ, so within 1e-5
of the terms' magnitude).

Usage (GPU): python experiments/scripts/gemm_algos_bench.py [--out DIR] [--repeats 20]
Prints a table last; writes `kernels/gemm-algos-bench-<device>-<stamp>.json` under --out.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402

CUDA_R_32F, CUBLAS_COMPUTE_32F = 0, 68
DESC_TRANSA, DESC_TRANSB = 3, 4                 # cublasLtMatmulDescAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1                    # cublasLtMatmulPreferenceAttributes_t
CONFIG_TILE_ID, CONFIG_SPLITK_NUM, CONFIG_STAGES_ID = 1, 2, 6   # ...AlgoConfigAttributes_t
TILES = {15: "64x64", 17: "64x128", 18: "128x64", 20: "128x128", 21: "256x64",
         23: "128x256", 24: "256x128", 19: "64x256", 14: "32x128", 16: "128x32", 11: "32x32",
         12: "32x64", 13: "64x32"}
WORKSPACE = 32 << 20


class Heuristic(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t"""
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


def load_lt():
    try:
        from cuda import pathfinder  # type: ignore
        return ctypes.CDLL(pathfinder.load_nvidia_dynamic_lib("cublasLt").abs_path)
    except Exception:  # noqa: BLE001 - fall back to the sonames
        for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
    raise RuntimeError("libcublasLt not found")


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} failed with status {status}")


class LtGemm:
    """One fp32 column-major problem C[m, n] = op(A) op(B) (beta 0) and its heuristic's
    algorithms."""

    def __init__(self, lt, handle, m, n, k, ta, tb, lda, ldb, ldc):
        self.lt, self.handle = lt, handle
        vp = ctypes.c_void_p
        self.desc = vp()
        check(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F,
                                          CUDA_R_32F), "MatmulDescCreate")
        for attr, v in ((DESC_TRANSA, ta), (DESC_TRANSB, tb)):
            x = ctypes.c_int32(v)
            check(lt.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(x),
                                                  ctypes.c_size_t(4)),
                  "MatmulDescSetAttribute")

        def layout(rows, cols, ld):
            d = vp()
            check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(d), CUDA_R_32F, ctypes.c_uint64(rows),
                                                ctypes.c_uint64(cols), ctypes.c_int64(ld)),
                  "MatrixLayoutCreate")
            return d

        self.a = layout(*((k, m) if ta else (m, k)), lda)
        self.b = layout(*((n, k) if tb else (k, n)), ldb)
        self.c = layout(m, n, ldc)
        pref = vp()
        check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE)
        check(lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES,
                                                      ctypes.byref(ws), ctypes.c_size_t(8)),
              "PreferenceSet")
        res = (Heuristic * 32)()
        got = ctypes.c_int()
        check(lt.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, self.a, self.b, self.c, self.c,
                                                pref, 32, res, ctypes.byref(got)),
              "AlgoGetHeuristic")
        self.algos = [res[i] for i in range(got.value) if res[i].state == 0]
        lt.cublasLtMatmulPreferenceDestroy(pref)

    def config(self, h):
        out = {}
        for name, attr in (("tile", CONFIG_TILE_ID), ("splitk", CONFIG_SPLITK_NUM),
                           ("stages", CONFIG_STAGES_ID)):
            v, w = ctypes.c_uint32(), ctypes.c_size_t()
            st = self.lt.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(h.algo), attr,
                                                              ctypes.byref(v), ctypes.c_size_t(4),
                                                              ctypes.byref(w))
            out[name] = int(v.value) if st == 0 else None
        out["tile_name"] = TILES.get(out["tile"], str(out["tile"]))
        return out

    def run(self, h, A, B, C, ws, stream):
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        vp = ctypes.c_void_p
        check(self.lt.cublasLtMatmul(self.handle, self.desc, ctypes.byref(one), vp(A), self.a,
                                     vp(B), self.b, ctypes.byref(zero), vp(C), self.c, vp(C),
                                     self.c, ctypes.byref(h.algo), vp(ws), ctypes.c_size_t(WORKSPACE),
                                     vp(stream)), "cublasLtMatmul")


def problems():
    """(label, M, N, K, pretransposed): row-major out[N, M] = in[N, K] @ W^T (W [M, K]) or,
    pre-transposed, @ Wt (Wt [K, M])."""
    out = []
    for H, B in ((2048, 256), (1024, 256), (512, 256), (2048, 128), (1024, 128)):
        out.append((f"R.h H{H} B{B} tn", 4 * H, B, H, False))
        out.append((f"R.h H{H} B{B} nn", 4 * H, B, H, True))
        out.append((f"W.x 2 steps H{H} B{B} tn", 4 * H, 2 * B, H, False))
        out.append((f"W.x 10 steps H{H} B{B} nn", 4 * H, 10 * B, H, True))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-algos", type=int, default=12)
    a = ap.parse_args(argv)
    import cupy as cp
    from rnnrt.exec.cublas import CublasHandle, cublas_version
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    lt = load_lt()
    lth = ctypes.c_void_p()
    check(lt.cublasLtCreate(ctypes.byref(lth)), "cublasLtCreate")
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
    wss = [cp.empty(WORKSPACE, dtype=cp.uint8) for _ in range(4)]
    handles = [CublasHandle(s.ptr, w.data.ptr, WORKSPACE) for s, w in zip(streams, wss)]
    main_s = streams[0]
    ev_start = cp.cuda.Event()
    rng = np.random.default_rng(0)
    rows = []
    for label, M, N, K, pre in problems():
        X = [cp.asarray(rng.uniform(-1, 1, (N, K)).astype(np.float32)) for _ in range(4)]
        W = cp.asarray(rng.uniform(-1, 1, (K, M) if pre else (M, K)).astype(np.float32))
        outs = [cp.empty((N, M), dtype=cp.float32) for _ in range(4)]
        mag = (cp.abs(X[0]) @ (cp.abs(W) if pre else cp.abs(W).T)).astype(cp.float32)
        # row-major out[N, M] = X W^T is column-major out^T[M, N] = op(W) X^T
        prep = [h.prepare_gemm(o.data.ptr, M, x.data.ptr, K, W.data.ptr, M if pre else K,
                               M, N, K, trans_b=not pre) for h, o, x in zip(handles, outs, X)]
        g = LtGemm(lt, lth, M, N, K, 0 if pre else 1, 0, M if pre else K, K, M)
        flops = 2.0 * M * N * K

        def four(fn):
            """fn(i, stream) on each of four streams at once; joined on stream 0."""
            ev_start.record(main_s)
            for i, s in enumerate(streams):
                s.wait_event(ev_start)
                fn(i, s)
            for s in streams[1:]:
                e = cp.cuda.Event(disable_timing=True)
                e.record(s)
                main_s.wait_event(e)

        handles[0].gemm(prep[0])
        main_s.synchronize()
        ref = outs[0].copy()
        t1 = time_gpu(cp, lambda: handles[0].gemm(prep[0]), main_s, a.repeats, 3)
        t4 = time_gpu(cp, lambda: four(lambda i, s: handles[i].gemm(prep[i])), main_s,
                      a.repeats, 3)
        base = {"shape": label, "M": M, "N": N, "K": K, "variant": "cublasSgemm",
                "ms_alone": t1.ms_median, "ms_four_streams": t4.ms_median,
                "tflops_alone": flops / t1.ms_median / 1e9,
                "tflops_four_streams": 4 * flops / t4.ms_median / 1e9}
        rows.append(base)
        for j, h in enumerate(g.algos[:a.max_algos]):
            if h.workspace > WORKSPACE:
                continue
            outs[0].fill(cp.nan)
            g.run(h, W.data.ptr, X[0].data.ptr, outs[0].data.ptr, wss[0].data.ptr, main_s.ptr)
            main_s.synchronize()
            err = float(cp.max(cp.abs(outs[0] - ref) / mag))
            t1 = time_gpu(cp, lambda: g.run(h, W.data.ptr, X[0].data.ptr, outs[0].data.ptr,
                                            wss[0].data.ptr, main_s.ptr), main_s, a.repeats, 3)
            t4 = time_gpu(cp, lambda: four(lambda i, s: g.run(h, W.data.ptr, X[i].data.ptr,
                                                              outs[i].data.ptr,
                                                              wss[i].data.ptr, s.ptr)),
                          main_s, a.repeats, 3)
            rows.append({"shape": label, "M": M, "N": N, "K": K, "variant": f"lt#{j}",
                         **g.config(h), "waves": float(h.waves), "workspace": int(h.workspace),
                         "ms_alone": t1.ms_median, "ms_four_streams": t4.ms_median,
                         "tflops_alone": flops / t1.ms_median / 1e9,
                         "tflops_four_streams": 4 * flops / t4.ms_median / 1e9,
                         "x_default_alone": base["ms_alone"] / t1.ms_median,
                         "x_default_four": base["ms_four_streams"] / t4.ms_median,
                         "worst_err_vs_default": err, "check_ok": bool(err <= 1e-5)})
        cp.get_default_memory_pool().free_all_blocks()
    for h in handles:
        h.close()
    lt.cublasLtDestroy(lth)
    created = now_iso()
    rec = {"schema": "rnnrt.gemm_algos_bench/1", "kind": "gemm_algos_bench", "created": created,
           "command": "experiments/scripts/gemm_algos_bench.py " + " ".join(argv or sys.argv[1:]),
           "device": {"device": name, "sm_count": int(props["multiProcessorCount"])},
           "versions": {**versions(cp), "cublas": cublas_version()}, "rows": rows}
    if a.out:
        p = Path(a.out) / "kernels" / f"gemm-algos-bench-{device_slug(name)}-{stamp(created)}.json"
        write_json(rec, p)
        print("wrote", p)
    print(f"{'shape':28s} {'variant':12s} {'tile':8s} {'sk':>3s} {'alone ms':>9s} {'TF':>5s} "
          f"{'x def':>6s} {'4 str ms':>9s} {'TF':>5s} {'x def':>6s} ok")
    for r in rows:
        if r["variant"] == "cublasSgemm":
            print(f"{r['shape']:28s} {'default':12s} {'':8s} {'':>3s} {r['ms_alone']:9.4f} "
                  f"{r['tflops_alone']:5.1f} {'':6s} {r['ms_four_streams']:9.4f} "
                  f"{r['tflops_four_streams']:5.1f}")
        else:
            print(f"{'':28s} {r['variant']:12s} {r['tile_name']:8s} {r['splitk'] or 0:3d} "
                  f"{r['ms_alone']:9.4f} {r['tflops_alone']:5.1f} {r['x_default_alone']:6.3f} "
                  f"{r['ms_four_streams']:9.4f} {r['tflops_four_streams']:5.1f} "
                  f"{r['x_default_four']:6.3f} {'ok' if r['check_ok'] else 'BAD'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
