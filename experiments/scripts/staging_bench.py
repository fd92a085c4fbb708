"""What the tensor-core grid form's staging of h_t costs a step (persistent_mmag.cu: every
block copies all of h_t [B, H] (16-bit) from L2 into its shared memory at the top of each
step), and whether thread-block clusters sharing the copy through the bulk copy engine's
multicast would cut it: the question before building a clustered grid form.

Each launch: ``--blocks`` blocks (one an SM, all resident) x 256 threads run T steps, the
grid form's step without its product: stage h_t into shared memory, read every staged
element once (16-byte loads; an element that is not step t's value is counted: a copy that
lands late shows up there), store the block's U = H / blocks columns of h_{t+1} (st.cg,
B x U 16-bit values), the flag grid barrier (the kernels' fence + atomicAdd, ps_wait).

Variants (the staging):
  copy   16-byte cp.async copies by all 256 threads, then wait and __syncthreads (the
         grid form's mmag_stage, vec path)
  bulk   one bulk copy (cp.async.bulk, TMA) a row of h_t into the block's own shared
         memory, issued by warp 0's lanes, completing on an mbarrier every thread waits on
  mc2, mc4   clusters of 2 / 4 blocks: block r of a cluster issues rows r, r + CS, ... once,
         multicast into every block of its cluster (.multicast::cluster), so the cluster
         reads h_t out of L2 once instead of CS times; each block's mbarrier expects all
         B rows (the other blocks' copies may land before its own expect: the barrier's
         phase needs its one arrival too)
  none   no staging (the step's other costs: the reads of the buffer, the stores, the
         barrier); its count of wrong values is not 0
Each row: us a step (median over --repeats launches, CUDA events, counters zeroed before
each launch on the same stream) and the wrong values of the first launch (0 but for none).

Usage (GPU, repo root): python experiments/scripts/staging_bench.py --out DIR
  [--blocks 128] [--hidden 1024] [--batch 8,32] [--steps 1000] [--repeats 10]
Prints a table last; writes DIR/staging-bench-<device>-<stamp>.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402

VARIANTS = {"copy": (0, 1), "bulk": (1, 1), "mc2": (2, 2), "mc4": (2, 4), "none": (3, 1)}

# The barrier, the copies (plain and multicast), the proxy fence and the mbarrier are the
# kernels' own (persistent_common.cuh, persistent_layer.cuh, inlined by rnnrt.kernels.sources).
KERNEL = r"""
// V: 0 copy, 1 bulk, 2 multicast in clusters of CS, 3 none. h [T+1][B][H] 16-bit values
// (their bits: step t's value is t & 0x7fff).
template <int V, int CS>
__device__ __forceinline__ void body(unsigned short* h, unsigned int* sync,
                                     unsigned int* wrong, float* sink, int T, int B, int H) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, nb = gridDim.x;
    const int SRH = H + 8;                  // the grid form's row stride (16-bit values)
    unsigned short* hs = reinterpret_cast<unsigned short*>(smem_raw);
    const pk_saddr bar = pk_smem_addr(reinterpret_cast<const float*>(hs + B * SRH));
    const int U = H / nb, j0 = blockIdx.x * U;
    const unsigned int rank = CS > 1 ? pk_cluster_rank() : 0;
    if (V == 1 || V == 2) {
        if (tid == 0) {
            pk_mbar_init(bar, 1);
            pk_mbar_init_fence();
        }
        if (CS > 1) pk_cluster_sync(); else __syncthreads();
    }
    unsigned int bad = 0;
    float acc = 0.f;
    for (int t = 0; t < T; ++t) {
        const unsigned short* ht = h + (long long)t * B * H;
        if (V == 0) {
            for (int e = tid; e < B * H / 8; e += nt) {
                const int b = e / (H / 8), q = e - b * (H / 8);
                pk_cp_async16(reinterpret_cast<float*>(hs + b * SRH + 8 * q),
                              reinterpret_cast<const float*>(ht + b * H + 8 * q));
            }
            pk_cp_commit();
            pk_cp_wait<0>();
            __syncthreads();
        } else if (V == 1 || V == 2) {
            if (tid < 32) {
                pk_fence_async_global();   // the other blocks' h_t (acquired) before the copies
                if (lane == 0) pk_mbar_expect(bar, (unsigned int)(B * H * 2));
                __syncwarp();
                for (int b = (int)rank + CS * lane; b < B; b += 32 * CS) {
                    const pk_saddr dst = pk_smem_addr(reinterpret_cast<const float*>(hs + b * SRH));
                    if (V == 1) pk_bulk_g2s(dst, ht + b * H, (unsigned int)(H * 2), bar);
                    else pk_bulk_g2s_mc(dst, ht + b * H, (unsigned int)(H * 2), bar,
                                 (unsigned short)((1u << CS) - 1u));
                }
            }
            pk_mbar_wait(bar, (unsigned int)(t & 1));
        } else {
            __syncthreads();
        }
        const unsigned short want = (unsigned short)(t & 0x7fff);
        for (int e = tid; e < B * H / 8; e += nt) {
            const int b = e / (H / 8), q = e - b * (H / 8);
            const uint4 v = *reinterpret_cast<const uint4*>(hs + b * SRH + 8 * q);
            const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                bad += (w[i] & 0xffffu) != want;
                bad += (w[i] >> 16) != want;
                acc += (float)(w[i] & 0xffu);
            }
        }
        if (V == 1 || V == 2) pk_fence_async_smem();   // these reads before the next copies
        const unsigned short next = (unsigned short)((t + 1) & 0x7fff);
        for (int e = tid; e < B * U; e += nt) {
            const int b = e / U, j = j0 + e % U;
            __stcg(h + ((long long)(t + 1) * B + b) * H + j, next);
        }
        __syncthreads();
        if (tid == 0) {
            pk_fence_acq_rel();
            atomicAdd(sync, 1u);
            ps_wait(sync, (unsigned int)(t + 1) * nb);
        }
        __syncthreads();
    }
    if (CS > 1) pk_cluster_sync();   // no block exits while a copy may land in it
    sink[blockIdx.x * nt + tid] = acc;
    if (bad) atomicAdd(wrong, bad);
}

template <int V>
__global__ void __launch_bounds__(256, 1) stage_t(unsigned short* h, unsigned int* sync,
        unsigned int* wrong, float* sink, int T, int B, int H) {
    body<V, 1>(h, sync, wrong, sink, T, B, H);
}
template <int CS>
__global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(256, 1) stage_mc_t(
        unsigned short* h, unsigned int* sync, unsigned int* wrong, float* sink, int T, int B,
        int H) {
    body<2, CS>(h, sync, wrong, sink, T, B, H);
}
"""


def kernel_of(variant: str) -> str:
    v, cs = VARIANTS[variant]
    return f"stage_mc_t<{cs}>" if v == 2 else f"stage_t<{v}>"


def source() -> str:
    """The bench's CUDA text: the kernels' barrier header, then its own kernel."""
    from rnnrt.kernels.sources import source as kernel_source
    return kernel_source("persistent_layer.cuh") + "\n" + KERNEL


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", default="8,32")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args(argv)
    if a.hidden % a.blocks or (a.hidden // a.blocks) < 1 or a.hidden % 8:
        ap.error("--hidden: a multiple of --blocks and of 8")
    import cupy as cp
    from rnnrt.session import GpuSession
    session = GpuSession()
    names = [kernel_of(v) for v in VARIANTS]
    mod = cp.RawModule(code=source(), options=("-std=c++17", "-arch=sm_90a"),
                       name_expressions=names)
    T, nt, H, nb = a.steps, 256, a.hidden, a.blocks
    sync = cp.zeros(1, cp.uint32)
    wrong = cp.zeros(1, cp.uint32)
    sink = cp.empty(nb * nt, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for B in map(int, a.batch.split(",")):
        h = cp.zeros((T + 1) * B * H, cp.uint16)
        smem = B * (H + 8) * 2 + 16
        for variant in VARIANTS:
            fn = mod.get_function(kernel_of(variant))
            fn.max_dynamic_shared_size_bytes = smem
            args = (h, sync, wrong, sink, np.int32(T), np.int32(B), np.int32(H))

            def launch(fn=fn, args=args):
                sync.fill(0)
                fn((nb,), (nt,), args, shared_mem=smem)

            row = {"variant": variant, "cluster": VARIANTS[variant][1], "blocks": nb,
                   "threads": nt, "batch": B, "hidden": H, "steps": T,
                   "bytes_staged_per_block": B * H * 2}
            try:
                with stream:
                    h.fill(0)
                    wrong.fill(0)
                    launch()
                    stream.synchronize()
                    row["wrong_values_first_launch"] = int(wrong.get()[0])
                    t = time_gpu(cp, launch, stream, repeats=a.repeats, warmup=2)
                row.update(us_per_step=1e3 * t.ms_median / T, ms_min=t.ms_min)
            except Exception as exc:   # a launch the device refuses: say so, go on
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            print(row, flush=True)
    rec = {"schema": "rnnrt.staging_bench/1", "kind": "staging_bench", "created": now_iso(),
           "command": " ".join(sys.argv), "device": session.info, "versions": versions(cp),
           "rows": rows}
    path = Path(a.out) / (f"staging-bench-{device_slug(session.info['device'])}"
                          f"-{stamp(rec['created'])}.json")
    write_json(rec, path)
    print(f"\nrecord: {path}")
    print(f"{'batch':>6}{'variant':>9}{'us/step':>9}{'wrong':>7}")
    for r in rows:
        us = f"{r['us_per_step']:.3f}" if "us_per_step" in r else "error"
        print(f"{r['batch']:>6}{r['variant']:>9}{us:>9}{r.get('wrong_values_first_launch', '-'):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
