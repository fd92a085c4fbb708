"""How close can a K loop of register-tile outer products, fed from shared memory, get to the
SM's FP32 FMA peak? The persistent kernels' matrix-vector steps are such loops (a thread's tile
of R rows times h columns); this times the loop alone, no global memory inside it, no
synchronisation, one wave of blocks (one a SM), so the figure is the in-loop ceiling the
kernels' step time should be judged against (issue 22: the stack kernels' K loop ran ~65%).

Each variant: THREADS threads a block, each a TM x TN accumulator tile; per k one row of A
(TM floats) and one of B (TN floats) read from shared memory as float4s, TM*TN FMAs. The
block's A and B tiles (KT rows) are loaded once; the loop runs over them ITERS times. FLOPs =
2 * TM * TN * threads * blocks * KT * ITERS; peak = SMs x 128 FMA a clock x 2 x the SM clock
(the device's max, as the other records). CUDA events, warm-up, median of --repeats; the sum
of the tiles checked against NumPy's (the loop cannot be optimised away).

The same loop on tensor cores at fp32 accuracy (issue 22: is the recurrent product worth moving
there?): one block's step of the paper's stack kernel, 64 gate rows x 64 batches, K 256 a pass
from shared memory (A [64][K], B as [64][K]: k contiguous, rows padded by 4 floats), 8 warps
(4 tiles of C x 2 halves of K, the halves added at the end), mma.sync m16n8k8 tf32 with fp32
accumulation: 'mma-tf32' one MMA of the operands rounded to tf32 (not fp32 accuracy: for
scale), 'mma-3xtf32' each operand split into hi = tf32(x) and lo = tf32(x - hi) as it is
loaded and three MMAs (lo.hi + hi.lo + hi.hi; the lo.lo term dropped, ~2^-22 of the product),
'mma-3xtf32-presplit' the same with A's split done once into a second array (as a kernel
holding R would); warp tiles 64 x 16 (every warp reads all of A), the '-w32' ones 32 x 32.
FLOPs counted as fp32's (2 M N K, not 3x); the product of one pass checked against float64:
worst |err| / sum_k |a||b| reported beside NumPy float32's.

Usage (GPU): python experiments/scripts/tile_bench.py [--out DIR] [--repeats 20]
Prints a table last; writes `kernels/tile-bench-fma-<device>-<stamp>.json` under --out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.records import now_iso, record_path, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402

SOURCE = r"""
// tile_fma<TM, TN>: one block a SM; thread t owns rows (t / NY) * TM.. and cols (t % NY) * TN..
// of the block's product tile; A [KT][MB], B [KT][NB] in shared memory (MB = TM * NX,
// NB = TN * NY), loaded once; the k loop runs ITERS passes over them.
template <int TM, int TN>
__device__ void tile_fma(const float* a, const float* b, float* out, int kt, int iters) {
    extern __shared__ float4 smem4[];
    float* const sm = reinterpret_cast<float*>(smem4);
    const int nt = blockDim.x, t = threadIdx.x;
    const int NY = 16, NX = nt / NY, MB = TM * NX, NB = TN * NY;
    float* const As = sm;
    float* const Bs = sm + kt * MB;
    for (int e = t; e < kt * MB; e += nt) As[e] = a[e];
    for (int e = t; e < kt * NB; e += nt) Bs[e] = b[e];
    __syncthreads();
    const int x = t / NY, y = t % NY;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll 2
        for (int k = 0; k < kt; ++k) {
            float av[TM], bv[TN];
#pragma unroll
            for (int i = 0; i < TM; i += 4) {
                const float4 v = *reinterpret_cast<const float4*>(As + k * MB + x * TM + i);
                av[i] = v.x; av[i + 1] = v.y; av[i + 2] = v.z; av[i + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < TN; j += 4) {
                const float4 v = *reinterpret_cast<const float4*>(Bs + k * NB + y * TN + j);
                bv[j] = v.x; bv[j + 1] = v.y; bv[j + 2] = v.z; bv[j + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
    }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) s += acc[i][j];
    out[blockIdx.x * nt + t] = s;
}
extern "C" __global__ void __launch_bounds__(256, 1) tile_16x8(const float* a, const float* b,
                                                               float* o, int kt, int it) {
    tile_fma<16, 8>(a, b, o, kt, it);
}
extern "C" __global__ void __launch_bounds__(512, 1) tile_8x8(const float* a, const float* b,
                                                              float* o, int kt, int it) {
    tile_fma<8, 8>(a, b, o, kt, it);
}
"""

MMA_SOURCE = r"""
// mma_tile<MODE, WM, WN>: C[64][64] (+)= A[64][K] B[K][64] a pass, ITERS passes; MODE 0 tf32,
// 1 3xtf32 split on the fly, 2 3xtf32 with A's split stored (As hi, Al lo); a warp's tile of C
// WM x WN mma tiles (4 x 2: 64 x 16, every warp reads all of A; 2 x 4: 32 x 32). Fragments of
// mma.m16n8k8.tf32 (g = lane / 4, t = lane % 4): A regs (g, t), (g+8, t), (g, t+4),
// (g+8, t+4); B regs (k t, n g), (k t+4, n g); C (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
#define MK 256
#define MS (MK + 4)      // row stride: g * MS + t covers 32 banks
__device__ __forceinline__ unsigned tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void mma8(float (&d)[4], const unsigned (&a)[4],
                                     const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Warp tiles: WM m16 tiles x WN n8 tiles; the 4 warps of a K half cover 64 x 64.
template <int MODE, int WM, int WN>
__device__ void mma_tile(const float* a, const float* bt, float* out, int iters) {
    constexpr int NWN = 64 / (8 * WN);                 // warps along the columns
    static_assert((64 / (16 * WM)) * NWN == 4, "4 warps a K half");
    extern __shared__ float4 smem4[];
    float* const As = reinterpret_cast<float*>(smem4);
    float* const Bs = As + 64 * MS;
    float* const Al = Bs + 64 * MS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, wk = warp >> 2;
    const int wn = (warp & 3) % NWN, wm = (warp & 3) / NWN;   // the warp's tile of C
    for (int e = tid; e < 64 * MK; e += blockDim.x) {
        const int r = e / MK, k = e % MK;
        const float x = a[e];
        if (MODE == 2) {
            const float hi = __uint_as_float(tf32(x));
            As[r * MS + k] = hi;
            Al[r * MS + k] = __uint_as_float(tf32(x - hi));
        } else {
            As[r * MS + k] = x;
        }
        Bs[r * MS + k] = bt[e];
    }
    __syncthreads();
    float acc[WM][WN][4];
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll 2
        for (int kk = wk * (MK / 2); kk < (wk + 1) * (MK / 2); kk += 8) {
            unsigned ah[WM][4], al[WM][4], bh[WN][2], bl[WN][2];
#pragma unroll
            for (int i = 0; i < WM; ++i)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int o = (16 * (wm * WM + i) + g + 8 * (r & 1)) * MS + kk + t +
                                  4 * (r >> 1);
                    const float x = As[o];
                    if (MODE == 0) {
                        ah[i][r] = tf32(x);
                    } else if (MODE == 1) {
                        ah[i][r] = tf32(x);
                        al[i][r] = tf32(x - __uint_as_float(ah[i][r]));
                    } else {
                        ah[i][r] = __float_as_uint(x);
                        al[i][r] = __float_as_uint(Al[o]);
                    }
                }
#pragma unroll
            for (int j = 0; j < WN; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float y = Bs[(8 * (wn * WN + j) + g) * MS + kk + t + 4 * r];
                    bh[j][r] = tf32(y);
                    if (MODE != 0) bl[j][r] = tf32(y - __uint_as_float(bh[j][r]));
                }
#pragma unroll
            for (int i = 0; i < WM; ++i)
#pragma unroll
                for (int j = 0; j < WN; ++j) {
                    if (MODE != 0) {
                        mma8(acc[i][j], al[i], bh[j]);
                        mma8(acc[i][j], ah[i], bl[j]);
                    }
                    mma8(acc[i][j], ah[i], bh[j]);
                }
        }
    }
    __syncthreads();   // the K halves added through shared memory (As is free now)
    float* const red = As;
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int row = 16 * (wm * WM + i) + g + 8 * (c >> 1);
                const int col = 8 * (wn * WN + j) + 2 * t + (c & 1);
                if (wk == 1) red[row * 64 + col] = acc[i][j][c];
            }
    __syncthreads();
    if (wk == 0) {
#pragma unroll
        for (int i = 0; i < WM; ++i)
#pragma unroll
            for (int j = 0; j < WN; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int row = 16 * (wm * WM + i) + g + 8 * (c >> 1);
                    const int col = 8 * (wn * WN + j) + 2 * t + (c & 1);
                    out[blockIdx.x * 4096 + row * 64 + col] = acc[i][j][c] + red[row * 64 + col];
                }
    }
}
extern "C" __global__ void __launch_bounds__(256, 1) mma_tf32(const float* a, const float* b,
                                                              float* o, int it) {
    mma_tile<0, 4, 2>(a, b, o, it);
}
extern "C" __global__ void __launch_bounds__(256, 1) mma_3xtf32(const float* a, const float* b,
                                                                float* o, int it) {
    mma_tile<1, 4, 2>(a, b, o, it);
}
extern "C" __global__ void __launch_bounds__(256, 1) mma_3xtf32_presplit(
        const float* a, const float* b, float* o, int it) {
    mma_tile<2, 4, 2>(a, b, o, it);
}
extern "C" __global__ void __launch_bounds__(256, 1) mma_3xtf32_w32(
        const float* a, const float* b, float* o, int it) {
    mma_tile<1, 2, 4>(a, b, o, it);
}
extern "C" __global__ void __launch_bounds__(256, 1) mma_3xtf32_presplit_w32(
        const float* a, const float* b, float* o, int it) {
    mma_tile<2, 2, 4>(a, b, o, it);
}
"""

VARIANTS = (("tile_16x8", 16, 8, 256), ("tile_8x8", 8, 8, 512), ("tile_8x8", 8, 8, 256))
MMA_VARIANTS = (("mma-tf32", "mma_tf32"), ("mma-3xtf32", "mma_3xtf32"),
                ("mma-3xtf32-presplit", "mma_3xtf32_presplit"),
                ("mma-3xtf32-w32", "mma_3xtf32_w32"),
                ("mma-3xtf32-presplit-w32", "mma_3xtf32_presplit_w32"))
MMA_K, MMA_ITERS = 256, 400
KT, ITERS = 32, 2000


def time_launch(cp, launch, repeats):
    """Median ms of ``launch()`` on the current stream (rnnrt.bench.timing's protocol)."""
    return time_gpu(cp, launch, cp.cuda.get_current_stream(), repeats, 3).ms_median


def mma_rows(cp, sms, peak, repeats, rng):
    """The tensor-core variants: one pass checked against float64, then ITERS passes timed."""
    mod = cp.RawModule(code=MMA_SOURCE, options=("-std=c++17",))
    A = rng.uniform(-1, 1, (64, MMA_K)).astype(np.float32)
    Bt = rng.uniform(-1, 1, (64, MMA_K)).astype(np.float32)    # B^T: [batch][k]
    ref = A.astype(np.float64) @ Bt.astype(np.float64).T
    mag = np.abs(A).astype(np.float64) @ np.abs(Bt).astype(np.float64).T
    np32 = float(np.max(np.abs((A @ Bt.T).astype(np.float64) - ref) / mag))
    da, db = cp.asarray(A), cp.asarray(Bt)
    out = cp.empty(sms * 4096, dtype=cp.float32)
    smem = 4 * 3 * 64 * (MMA_K + 4)
    rows = []
    for label, kname in MMA_VARIANTS:
        fn = mod.get_function(kname)
        fn.max_dynamic_shared_size_bytes = smem
        out.fill(np.nan)
        fn((sms,), (256,), (da, db, out, np.int32(1)), shared_mem=smem)
        got = cp.asnumpy(out).reshape(sms, 64, 64).astype(np.float64)
        err = float(np.max(np.abs(got - ref[None]) / mag[None]))   # NaN (unwritten) -> nan
        args = (da, db, out, np.int32(MMA_ITERS))
        med = time_launch(cp, lambda: fn((sms,), (256,), args, shared_mem=smem), repeats)
        tflops = 2.0 * 64 * 64 * MMA_K * MMA_ITERS * sms / (med * 1e-3) / 1e12
        rows.append({"kernel": kname, "tile": label, "threads": 256, "blocks": sms,
                     "kt": MMA_K, "iters": MMA_ITERS, "ms_median": med, "tflops": tflops,
                     "share_of_fma_peak": tflops / peak,
                     # tf32 (10-bit mantissas) within 1e-3 of the terms' magnitude, 3xtf32 1e-5
                     "check_ok": bool(np.isfinite(err)) and err <= (1e-3 if label == "mma-tf32"
                                                                     else 1e-5),
                     "check_worst_scaled": err, "numpy_float32_worst_scaled": np32})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results folder (the record goes to kernels/)")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    sms, mhz = int(props["multiProcessorCount"]), props["clockRate"] / 1e3
    peak = sms * 128 * 2 * mhz * 1e6 / 1e12     # TFLOPS
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    rng = np.random.default_rng(0)
    rows = []
    for kname, tm, tn, nt in VARIANTS:
        nx = nt // 16
        A = rng.uniform(-1, 1, (KT, tm * nx)).astype(np.float32)
        B = rng.uniform(-1, 1, (KT, tn * 16)).astype(np.float32)
        da, db = cp.asarray(A), cp.asarray(B)
        out = cp.full(sms * nt, cp.nan, dtype=cp.float32)
        fn = mod.get_function(kname)
        smem = 4 * KT * (tm * nx + tn * 16)
        args = (da, db, out, np.int32(KT), np.int32(ITERS))
        fn((sms,), (nt,), args, shared_mem=smem)
        # the check: thread (x, y)'s sum over its tile is ITERS x sum_k (A row block . B col block)
        ref = np.einsum("kx,ky->xy", A.reshape(KT, nx, tm).sum(2).astype(np.float64),
                        B.reshape(KT, 16, tn).sum(2).astype(np.float64)).reshape(-1) * ITERS
        # scaled by the sum of the terms' magnitudes (fp32 rounding over KT * ITERS FMAs)
        mag = np.einsum("kx,ky->xy", np.abs(A).reshape(KT, nx, tm).sum(2).astype(np.float64),
                        np.abs(B).reshape(KT, 16, tn).sum(2).astype(np.float64)).reshape(-1)
        got = cp.asnumpy(out).reshape(sms, nt)
        err = float(np.max(np.abs(got - ref[None, :]) / (2e-4 * ITERS * mag[None, :])))
        med = time_launch(cp, lambda: fn((sms,), (nt,), args, shared_mem=smem), a.repeats)
        tflops = 2.0 * tm * tn * nt * sms * KT * ITERS / (med * 1e-3) / 1e12
        rows.append({"kernel": kname, "tile": f"{tm}x{tn}", "threads": nt, "blocks": sms,
                     "kt": KT, "iters": ITERS, "ms_median": med, "tflops": tflops,
                     "share_of_fma_peak": tflops / peak, "check_ok": err <= 1.0,
                     "check_worst_scaled": err})
    rows += mma_rows(cp, sms, peak, a.repeats, rng)
    created = now_iso()
    rec = {"schema": "rnnrt.tile_bench/1", "kind": "tile_bench", "created": created,
           "command": "experiments/scripts/tile_bench.py " + " ".join(argv or sys.argv[1:]),
           "device": {"device": name, "sm_count": sms, "sm_clock_mhz": mhz,
                      "fp32_fma_peak_tflops": peak},
           "versions": versions(cp), "rows": rows}
    if a.out:
        p = write_json(rec, record_path("kernels", "tile-bench-fma", name, created, root=a.out))
        print("record:", p)
    print(f"{name}: FP32 FMA peak {peak:.1f} TFLOPS ({sms} SMs x {mhz:.0f} MHz)")
    print(f"{'tile':>20} {'threads':>7} {'ms':>8} {'TFLOPS':>7} {'of peak':>7} check")
    for r in rows:
        err = (f" worst {r['check_worst_scaled']:.1e} (NumPy fp32 "
               f"{r['numpy_float32_worst_scaled']:.1e})" if "numpy_float32_worst_scaled" in r
               else "")
        print(f"{r['tile']:>20} {r['threads']:>7} {r['ms_median']:8.3f} {r['tflops']:7.1f} "
              f"{r['share_of_fma_peak']:7.0%} {'ok' if r['check_ok'] else 'FAIL'}{err}")
    return 0 if all(r["check_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
