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

Usage (GPU): python experiments/scripts/tile_bench.py [--out DIR] [--repeats 20]
Prints a table last; writes `kernels/tile-bench-fma-<device>-<stamp>.json` under --out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402

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

VARIANTS = (("tile_16x8", 16, 8, 256), ("tile_8x8", 8, 8, 512), ("tile_8x8", 8, 8, 256))
KT, ITERS = 32, 2000


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
        ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
        for _ in range(3):
            fn((sms,), (nt,), args, shared_mem=smem)
        ms = []
        for _ in range(a.repeats):
            ev0.record()
            fn((sms,), (nt,), args, shared_mem=smem)
            ev1.record()
            ev1.synchronize()
            ms.append(cp.cuda.get_elapsed_time(ev0, ev1))
        med = float(np.median(ms))
        tflops = 2.0 * tm * tn * nt * sms * KT * ITERS / (med * 1e-3) / 1e12
        rows.append({"kernel": kname, "tile": f"{tm}x{tn}", "threads": nt, "blocks": sms,
                     "kt": KT, "iters": ITERS, "ms_median": med, "tflops": tflops,
                     "share_of_fma_peak": tflops / peak, "check_ok": err <= 1.0,
                     "check_worst_scaled": err})
    created = now_iso()
    rec = {"schema": "rnnrt.tile_bench/1", "kind": "tile_bench", "created": created,
           "command": "experiments/scripts/tile_bench.py " + " ".join(argv or sys.argv[1:]),
           "device": {"device": name, "sm_count": sms, "sm_clock_mhz": mhz,
                      "fp32_fma_peak_tflops": peak},
           "versions": versions(cp), "rows": rows}
    if a.out:
        p = Path(a.out) / "kernels" / f"tile-bench-fma-{device_slug(name)}-{stamp(created)}.json"
        write_json(rec, p)
        print("record:", p)
    print(f"{name}: FP32 FMA peak {peak:.1f} TFLOPS ({sms} SMs x {mhz:.0f} MHz)")
    print(f"{'tile':>6} {'threads':>7} {'ms':>8} {'TFLOPS':>7} {'of peak':>7} check")
    for r in rows:
        print(f"{r['tile']:>6} {r['threads']:>7} {r['ms_median']:8.3f} {r['tflops']:7.1f} "
              f"{r['share_of_fma_peak']:7.0%} {'ok' if r['check_ok'] else 'FAIL'}")
    return 0 if all(r["check_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
