"""Is a tensor-core GEMM at fp32 accuracy (3xTF32) worth it for the big, non-recurrent GEMMs of
a training step (issue 22)? The paper shape's training step ends with the weight-gradient
GEMMs (dW = dG^T X, ~2.1 ms of its 8.6 on the H200 at the FP32 SGEMM rate); the forward's
W.x of layer 0 and the backward's dx are the same kind of GEMM.

3xTF32: each fp32 operand x is split into hi = tf32(x) (round to nearest, 10 stored mantissa
bits) and lo = tf32(x - hi) (x - hi is exact in fp32), and A B ~ lo(A) hi(B) + hi(A) lo(B) +
hi(A) hi(B) on TF32 tensor cores with fp32 accumulation (cuBLAS, compute type
CUBLAS_COMPUTE_32F_FAST_TF32: the operands are already tf32, so its conversion is exact); the
lo.lo term (~2^-22 of a product) is dropped. Variants timed here, each beside cuBLAS SGEMM:
  sgemm        cublasSgemm, plain fp32 math (the reference rate)
  tf32         one TF32 GEMM of the unsplit operands (for scale: not fp32 accuracy)
  3xtf32       three TF32 GEMMs of the presplit operands accumulating into out (beta 1)
  3xtf32-cat   one TF32 GEMM over K tripled: [hi(A) | hi(A) | lo(A)] . [hi(B); lo(B); hi(B)]
  split        the elementwise kernel that splits both operands (x -> hi, lo)
Accuracy: each variant's result against float64 on the same random operands, the worst
|err| / (|A| |B|) (the terms' magnitude) and the normwise ||err|| / ||ref||.

Usage (GPU): python experiments/scripts/gemm3x_bench.py [--out DIR] [--repeats 20]
Prints a table last; writes `kernels/gemm3x-bench-<device>-<stamp>.json` under --out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.records import now_iso, record_path, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402

# (label, N, M, K, trans_a, trans_b): row-major out[N, M] = op(a) @ op(b), op(a) [N, K]
SHAPES = (
    ("dW paper L4 H512 B64 T100 (W or R side)", 2048, 512, 6400, True, False),
    ("dW H1024 B64 T100", 4096, 1024, 6400, True, False),
    ("dW H2048 B128 T100", 8192, 2048, 12800, True, False),
    ("dx layer 0 paper", 6400, 512, 2048, False, False),
    ("Wx layer 0 paper", 6400, 2048, 512, False, True),
)

SPLIT_PREAMBLE = r"""
__device__ __forceinline__ float rnnrt_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results folder (the record goes to kernels/)")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    import cupy as cp
    from rnnrt.exec.cublas import CublasHandle, cublas_version
    split = cp.ElementwiseKernel(
        "float32 x", "float32 hi, float32 lo",
        "hi = rnnrt_tf32(x); lo = rnnrt_tf32(x - hi);", "rnnrt_split3x",
        preamble=SPLIT_PREAMBLE)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    stream = cp.cuda.Stream(non_blocking=True)
    ws = cp.empty(32 << 20, dtype=cp.uint8)
    h = CublasHandle(stream.ptr, ws.data.ptr, ws.nbytes)
    rng = np.random.default_rng(0)
    rows = []
    with stream:
        for label, N, M, K, ta, tb in SHAPES:
            ash = (K, N) if ta else (N, K)
            bsh = (M, K) if tb else (K, M)
            # gate gradients ~ N(0, 1e-2) (a's side), activations in (-1, 1) (b's side)
            A = cp.asarray((rng.standard_normal(ash) * 1e-2).astype(np.float32))
            B = cp.asarray(rng.uniform(-1, 1, bsh).astype(np.float32))
            A64, B64 = A.astype(cp.float64), B.astype(cp.float64)
            opa = (lambda x: x.T) if ta else (lambda x: x)
            opb = (lambda x: x.T) if tb else (lambda x: x)
            ref = opa(A64) @ opb(B64)
            mag = cp.abs(opa(A64)) @ cp.abs(opb(B64))
            del A64, B64
            Ahi, Alo = split(A)
            Bhi, Blo = split(B)
            cat_axis_a = 0 if ta else 1
            cat_axis_b = 1 if tb else 0
            Acat = cp.ascontiguousarray(cp.concatenate([Ahi, Ahi, Alo], axis=cat_axis_a))
            Bcat = cp.ascontiguousarray(cp.concatenate([Bhi, Blo, Bhi], axis=cat_axis_b))
            out = cp.empty((N, M), dtype=cp.float32)

            def prep(x, y, dtype, beta, k, xa=None, yb=None):
                lda = x.shape[1]
                ldb = y.shape[1]
                return h.prepare_gemm(out.data.ptr, M, x.data.ptr, lda, y.data.ptr, ldb,
                                      M, N, k, trans_a=ta, trans_b=tb, beta=beta, dtype=dtype)

            variants = {
                "sgemm": [prep(A, B, "float32", 0.0, K)],
                "tf32": [prep(A, B, "tf32", 0.0, K)],
                "3xtf32": [prep(Alo, Bhi, "tf32", 0.0, K), prep(Ahi, Blo, "tf32", 1.0, K),
                           prep(Ahi, Bhi, "tf32", 1.0, K)],
                "3xtf32-cat": [prep(Acat, Bcat, "tf32", 0.0, 3 * K)],
            }
            flops = 2.0 * M * N * K
            base = None
            for vname, calls in variants.items():
                out.fill(cp.nan)
                for c in calls:
                    h.gemm(c)
                stream.synchronize()
                err = cp.abs(out.astype(cp.float64) - ref)
                worst = float(cp.max(err / mag))
                normwise = float(cp.linalg.norm(err) / cp.linalg.norm(ref))
                t = time_gpu(cp, lambda: [h.gemm(c) for c in calls], stream, a.repeats, 3)
                base = t.ms_median if vname == "sgemm" else base
                rows.append({"shape": label, "N": N, "M": M, "K": K, "trans_a": ta,
                             "trans_b": tb, "variant": vname, "ms_median": t.ms_median,
                             "ms_min": t.ms_min, "ms_max": t.ms_max, "runs": t.runs,
                             "tflops_fp32_equiv": flops / (t.ms_median * 1e-3) / 1e12,
                             "speedup_vs_sgemm": base / t.ms_median,
                             "worst_err_over_terms": worst, "normwise_err": normwise,
                             "finite": bool(cp.isfinite(out).all())})
            t = time_gpu(cp, lambda: (split(A, Ahi, Alo), split(B, Bhi, Blo)), stream,
                         a.repeats, 3)
            rows.append({"shape": label, "N": N, "M": M, "K": K, "variant": "split",
                         "ms_median": t.ms_median, "ms_min": t.ms_min, "ms_max": t.ms_max,
                         "runs": t.runs, "bytes": int(3 * (A.nbytes + B.nbytes)),
                         "gbps": 3 * (A.nbytes + B.nbytes) / (t.ms_median * 1e-3) / 1e9})
            del Acat, Bcat, ref, mag
            cp.get_default_memory_pool().free_all_blocks()
    h.close()
    created = now_iso()
    rec = {"schema": "rnnrt.gemm3x_bench/1", "kind": "gemm3x_bench", "created": created,
           "command": "experiments/scripts/gemm3x_bench.py " + " ".join(argv or sys.argv[1:]),
           "device": {"device": name, "sm_count": int(props["multiProcessorCount"])},
           "versions": {**versions(cp), "cublas": cublas_version()}, "rows": rows}
    if a.out:
        path = write_json(rec, record_path("kernels", "gemm3x-bench", name, created,
                                           root=a.out))
        print("wrote", path)
    print(f"{'shape':42s} {'variant':11s} {'ms':>8s} {'TFLOPS':>7s} {'x sgemm':>7s} "
          f"{'worst':>9s} {'normwise':>9s}")
    for r in rows:
        if r["variant"] == "split":
            print(f"{r['shape']:42s} {'split':11s} {r['ms_median']:8.3f} "
                  f"{r['gbps']:6.0f}GB/s")
        else:
            print(f"{r['shape']:42s} {r['variant']:11s} {r['ms_median']:8.3f} "
                  f"{r['tflops_fp32_equiv']:7.1f} {r['speedup_vs_sgemm']:7.2f} "
                  f"{r['worst_err_over_terms']:9.2e} {r['normwise_err']:9.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
