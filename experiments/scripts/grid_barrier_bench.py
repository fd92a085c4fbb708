"""What a step of the per-layer grid kernels' flag barrier costs, alone and with a step's
memory traffic around it, for several ways of writing it (cuda_src/persistent_layer.cuh
grid_barrier is variant 0).

Each launch: ``--blocks`` blocks (one an SM, all resident) x 256 threads run T steps. With
the payload, a step is what the grid kernels do around their barrier: each block stores 64
floats of its step-t output (st.cg), every thread loads one float of a streamed array (the
next step's gx, __ldcs), the barrier, then every block reads all blocks' step-t outputs
(ld.cg, the h_t staging) and counts the values that are not t (a barrier that lets a block
through early shows up there: the record keeps the count). Without the payload, the barrier
and __syncthreads only.

Variants (the arrival and the wait of thread 0; the rest of the block waits at
__syncthreads):
  0  the kernels' grid_barrier itself (persistent_layer.cuh): gx loaded, then fence.acq_rel,
     atomicAdd, a relaxed spin, fence.acq_rel (each fence waits for the thread's loads in
     flight, gx's too)
  1  0 with the gx load between the arrival and the wait
  2  red.release.gpu for the arrival, the stack kernels' ps_wait (a relaxed spin and one
     ld.acquire.gpu, no fence.acq_rel after it), the gx load between the arrival and the wait
  3  2 with the gx load before the arrival (the release then waits for it)
  4  2 over 8 counters a 128-byte line apart: block b arrives at counter b % 8, lanes 0..7 of
     warp 0 poll one counter each (an eighth of the arrivals on each address)
  5  no barrier (__syncthreads only): what the payload costs by itself; its reads race, so
     its count of wrong values is not 0
Each row: us a step (median over --repeats launches, CUDA events, counters zeroed before
each launch on the same stream), the wrong values seen (must be 0 but for variant 5).

Usage (GPU, repo root): python experiments/scripts/grid_barrier_bench.py --out DIR
  [--blocks 128,132] [--steps 2000] [--repeats 10]
Prints a table last; writes DIR/grid-barrier-bench-<device>-<stamp>.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402

VARIANTS = (0, 1, 2, 3, 4, 5)
COUNTERS = 8           # variant 4's counters
LINE = 32              # unsigned ints between two counters (128 bytes)

# The barrier's pieces are the kernels' own (cuda_src/persistent_layer.cuh and
# persistent_common.cuh, inlined by rnnrt.kernels.sources): grid_barrier, pk_fence_acq_rel,
# ld_relaxed_gpu / ld_acquire_gpu, ps_wait, PK_SPIN_LIMIT; only what they lack is here.
KERNEL = r"""
__device__ __forceinline__ void red_release(unsigned int* p, unsigned int v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
// thread 0's relaxed spin of the kernels' grid_barrier, without its fence
__device__ __forceinline__ void spin(const unsigned int* p, unsigned int target) {
    const long long start = clock64();
    while (ld_relaxed_gpu(p) < target)
        if (clock64() - start > PK_SPIN_LIMIT) __trap();
}

template <int V, int PAY>
__global__ void __launch_bounds__(256, 1) bar_t(unsigned int* sync, float* pay,
                                                 const float* big, long long big_n,
                                                 float* sink, unsigned int* wrong, int T) {
    const int tid = threadIdx.x, nt = blockDim.x, nb = gridDim.x, blk = blockIdx.x;
    const int lane = tid & 31;
    float acc = 0.f, x = 0.f;
    unsigned int bad = 0;
    auto gx = [&](int t) {
        if (PAY) x += __ldcs(big + (((long long)t * nb + blk) * nt + tid) % big_n);
    };
    for (int t = 0; t < T; ++t) {
        if (PAY && tid < 64) __stcg(pay + ((long long)(t & 1) * nb + blk) * 64 + tid, (float)t);
        const unsigned int target = (unsigned int)(t + 1) * nb;
        if (V == 0) {
            gx(t);
            grid_barrier(sync, target);
        } else if (V == 1) {
            __syncthreads();
            if (tid == 0) { pk_fence_acq_rel(); atomicAdd(sync, 1u); }
            gx(t);
            if (tid == 0) { spin(sync, target); pk_fence_acq_rel(); }
            __syncthreads();
        } else if (V == 2 || V == 3) {
            if (V == 3) gx(t);
            __syncthreads();
            if (tid == 0) red_release(sync, 1u);
            if (V == 2) gx(t);
            if (tid == 0) ps_wait(sync, target);
            __syncthreads();
        } else if (V == 4) {
            __syncthreads();
            if (tid == 0) red_release(sync + @LINE@ * (blk % @C@), 1u);
            gx(t);
            if (tid < 32) {
                // blocks arriving at counter `lane`: nb / C, one more for lane < nb % C
                const unsigned int n = nb / @C@ + (lane < nb % @C@ ? 1 : 0);
                const unsigned int* p = sync + @LINE@ * lane;
                bool done = lane >= @C@;
                const long long start = clock64();
                while (!__all_sync(0xffffffffu, done)) {
                    if (!done) done = ld_relaxed_gpu(p) >= (unsigned int)(t + 1) * n;
                    if (clock64() - start > PK_SPIN_LIMIT) __trap();
                }
                if (lane < @C@ && ld_acquire_gpu(p) < (unsigned int)(t + 1) * n) __trap();
                __syncwarp();
            }
            __syncthreads();
        } else {
            gx(t);
            __syncthreads();
        }
        if (PAY) {
            const float* src = pay + (long long)(t & 1) * nb * 64;
            for (int e = tid; e < nb * 64; e += nt) {
                const float v = __ldcg(src + e);
                bad += v != (float)t;
                acc += v;
            }
        }
    }
    sink[blk * nt + tid] = acc + x;
    if (bad) atomicAdd(wrong, bad);
}
""".replace("@LINE@", str(LINE)).replace("@C@", str(COUNTERS))


def source() -> str:
    """The bench's CUDA text: the kernels' barrier header, then its own kernel."""
    from rnnrt.kernels.sources import source as kernel_source
    return kernel_source("persistent_layer.cuh") + "\n" + KERNEL


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--blocks", default="128,132")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args(argv)
    import cupy as cp
    from rnnrt.session import GpuSession
    session = GpuSession()
    names = [f"bar_t<{v}, {p}>" for v in VARIANTS for p in (0, 1)]
    mod = cp.RawModule(code=source(), options=("-std=c++17",), name_expressions=names)
    T, nt = a.steps, 256
    big_n = 1 << 26                       # 256 MiB of floats: streamed, never L2-resident
    big = cp.random.random(big_n, dtype=cp.float32)
    sync = cp.zeros(COUNTERS * LINE, cp.uint32)
    wrong = cp.zeros(1, cp.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for nb in map(int, a.blocks.split(",")):
        pay = cp.full(2 * nb * 64, -1.0, cp.float32)
        sink = cp.empty(nb * nt, cp.float32)
        for v in VARIANTS:
            for p in (0, 1):
                fn = mod.get_function(f"bar_t<{v}, {p}>")
                args = (sync, pay, big, np.int64(big_n), sink, wrong, np.int32(T))

                def launch(fn=fn, args=args, nb=nb):
                    sync.fill(0)
                    fn((nb,), (nt,), args)

                with stream:
                    wrong.fill(0)
                    pay.fill(-1.0)
                    launch()
                    stream.synchronize()
                    bad = int(wrong.get()[0])
                    t = time_gpu(cp, launch, stream, repeats=a.repeats, warmup=2)
                row = {"blocks": nb, "threads": nt, "variant": v, "payload": bool(p),
                       "steps": T, "us_per_step": 1e3 * t.ms_median / T, "ms_min": t.ms_min,
                       "wrong_values_first_launch": bad}
                rows.append(row)
                print(f"blocks {nb} variant {v} payload {p}: {row['us_per_step']:.3f} us/step, "
                      f"wrong {bad}", flush=True)
    rec = {"schema": "rnnrt.grid_barrier_bench/1", "kind": "grid_barrier_bench",
           "created": now_iso(), "command": " ".join(sys.argv), "device": session.info,
           "versions": versions(cp), "rows": rows}
    path = Path(a.out) / (f"grid-barrier-bench-{device_slug(session.info['device'])}"
                          f"-{stamp(rec['created'])}.json")
    write_json(rec, path)
    print(f"\nrecord: {path}")
    print(f"{'blocks':>6}{'variant':>8}{'bare us':>9}{'payload us':>11}{'wrong':>7}")
    by = {(r["blocks"], r["variant"], r["payload"]): r for r in rows}
    for nb in map(int, a.blocks.split(",")):
        for v in VARIANTS:
            b0, b1 = by[(nb, v, False)], by[(nb, v, True)]
            print(f"{nb:>6}{v:>8}{b0['us_per_step']:>9.3f}{b1['us_per_step']:>11.3f}"
                  f"{b1['wrong_values_first_launch']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
