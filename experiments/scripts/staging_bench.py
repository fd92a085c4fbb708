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
  mc2p   mc2 with the rows' copies issued by all the block's warps (row i of the block's
         by warp i % 8), not warp 0's lanes one after another
  mc2w   clusters of 2, h_t's rows in global memory at the shared buffer's padded stride
         (H + 8), so that block r's half of the rows is one contiguous bulk copy (one copy
         a block a step, multicast; mc2 issues one a row, lane by lane)
  ll     no barrier, no copy: h_{t+1} goes out with its step number beside every two
         values (8-byte words {2 values, step}, stored and loaded as single-copy atomic
         64-bit elements; NCCL's LL protocol), and each block polls all of h_t's words
         until every step number is t's, writing the values into its buffer
  ll2    the same in clusters of 2: block r polls rows r, r + 2, ... and writes them into
         both blocks' buffers (st.shared::cluster), then the cluster barrier
  none, none2   no staging (the step's other costs: the reads of the buffer, the stores,
         the barrier), the latter in clusters of 2; its count of wrong values is not 0
Barriers (--barriers; the grid barrier a step, thread 0 of a block after __syncthreads):
  counter  the kernels' (fence.acq_rel, atomicAdd on one counter, a relaxed spin, then one
           acquire load: ps_wait)
  acqspin  the same, spinning on acquire loads (no load after the spin)
  red      red.release.gpu.add (no separate fence), spinning on acquire loads
  flags    no counter: each block stores its own flag (st.release.gpu, the step number);
           warp 0 polls all the flags (16-byte acquire loads, 4 flags a lane)
  pair     clusters of 2: the cluster barrier, then rank 0 of each pair arrives on the
           counter for both (half the atomics); both spin on acquire loads
  pairflags  clusters of 2: the cluster barrier, then rank 0 stores the pair's flag; both
           poll the pairs' flags
Each row: us a step (median over --repeats launches, CUDA events, counters zeroed before
each launch on the same stream) and the wrong values of the first launch (0 but for none).

Usage (GPU, repo root): python experiments/scripts/staging_bench.py --out DIR
  [--blocks 128] [--hidden 1024] [--batch 8,32] [--steps 1000] [--repeats 10]
  [--variants copy,bulk,mc2,mc4,none] [--barriers counter]
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

VARIANTS = {"copy": (0, 1), "bulk": (1, 1), "mc2": (2, 2), "mc4": (2, 4), "none": (3, 1),
            "none2": (3, 2), "ll": (4, 1), "ll2": (4, 2), "mc2w": (5, 2), "mc2p": (6, 2)}
BARRIERS = {"counter": 0, "acqspin": 1, "red": 2, "flags": 3, "pair": 4, "pairflags": 5,
            "none": 6}   # none: the LL stagings' (their words are the barrier)
PAIR_BARRIERS = ("pair", "pairflags")   # need clusters of 2

# The barrier, the copies (plain and multicast), the proxy fence and the mbarrier are the
# kernels' own (persistent_common.cuh, persistent_layer.cuh, inlined by rnnrt.kernels.sources).
KERNEL = r"""
__device__ __forceinline__ void red_release_gpu(unsigned int* p, unsigned int v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(unsigned int* p, unsigned int v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_acquire_gpu4(const unsigned int* p) {
    uint4 v;
    asm volatile("ld.acquire.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_ll(unsigned long long* p, unsigned long long a,
                                      unsigned long long b) {
    asm volatile("st.relaxed.gpu.global.v2.b64 [%0], {%1, %2};" :: "l"(p), "l"(a), "l"(b)
                 : "memory");
}
__device__ __forceinline__ void ld_ll(const unsigned long long* p, unsigned long long& a,
                                      unsigned long long& b) {
    asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p)
                 : "memory");
}
// The step's grid barrier, variant BV (the module's BARRIERS), after the block's stores.
// flags: [128] words, zero at launch; n flags live (blocks, or pairs).
template <int BV, int CS>
__device__ __forceinline__ void bench_barrier(unsigned int* sync, unsigned int* flags, int t,
                                              int nb) {
    const int tid = threadIdx.x;
    __syncthreads();   // the block's stores are issued
    if (BV >= 4) {     // the pair's stores, at cluster scope, before rank 0 releases them
        pk_cluster_arrive();
        pk_cluster_wait();
    }
    const unsigned int step = (unsigned int)(t + 1);
    if (BV <= 2 || BV == 4) {
        if (tid == 0) {
            const bool leader = BV != 4 || pk_cluster_rank() == 0;
            const unsigned int n = BV == 4 ? (unsigned int)(nb / CS) : (unsigned int)nb;
            if (leader) {
                if (BV == 2) {
                    red_release_gpu(sync, 1u);
                } else {
                    pk_fence_acq_rel();
                    atomicAdd(sync, 1u);
                }
            }
            if (BV == 0) ps_wait(sync, step * n);
            else pk_spin_acquire(sync, step * n);   // the grid form's wait
        }
    } else {
        const int n = BV == 5 ? nb / CS : nb;
        const int me = BV == 5 ? (int)pk_cluster_id() : (int)blockIdx.x;
        if (tid == 0 && (BV == 3 || pk_cluster_rank() == 0)) st_release_gpu(flags + me, step);
        if (tid < 32) {
            const long long start = clock64();
            for (;;) {
                bool ok = true;
                if (4 * tid < n) {
                    const uint4 v = ld_acquire_gpu4(flags + 4 * tid);
                    ok = v.x >= step && (4 * tid + 1 >= n || v.y >= step) &&
                         (4 * tid + 2 >= n || v.z >= step) && (4 * tid + 3 >= n || v.w >= step);
                }
                if (__all_sync(0xffffffffu, ok)) break;
                if (clock64() - start > PK_SPIN_LIMIT) __trap();
            }
        }
    }
    __syncthreads();
}

// LL staging of h_t: ll [2][B][H/2] 64-bit words {two values, step} (step t's in buffer
// t & 1, its step number t; h_0's word step 0). Lines of 2 words (4 values): line w of
// row b holds columns 4w..4w+3. CS 2: rows rank, rank + 2, ... polled, pushed into both.
template <int CS>
__device__ __forceinline__ void ll_stage(unsigned short* hs, int SRH,
                                         const unsigned long long* ll, int t, int B, int H,
                                         int tid, int nt, unsigned int rank) {
    const unsigned long long* buf = ll + (long long)(t & 1) * B * (H / 2);
    const int lines = H / 4, rows = (B - (int)rank + CS - 1) / CS;
    const long long start = clock64();
    constexpr int NL = 8;   // lines a thread has in flight at once
    for (int e0 = tid; e0 < rows * lines; e0 += NL * nt) {
        unsigned long long a[NL], c[NL];
        unsigned int pending = 0;
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int e = e0 + i * nt;
            if (e < rows * lines) {
                const int b = (int)rank + CS * (e / lines), w = e % lines;
                ld_ll(buf + (long long)b * (H / 2) + 2 * w, a[i], c[i]);
                pending |= 1u << i;
            }
        }
        while (pending) {
#pragma unroll
            for (int i = 0; i < NL; ++i) {
                if (!(pending & (1u << i))) continue;
                const int e = e0 + i * nt;
                const int b = (int)rank + CS * (e / lines), w = e % lines;
                if ((unsigned int)(a[i] >> 32) == (unsigned int)t &&
                    (unsigned int)(c[i] >> 32) == (unsigned int)t) {
                    const unsigned int lo = (unsigned int)a[i], hi = (unsigned int)c[i];
                    unsigned short* dst = hs + b * SRH + 4 * w;
                    if (CS == 1) {
                        *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
                    } else {   // into every block of the cluster
                        const pk_saddr sa = pk_smem_addr(reinterpret_cast<const float*>(dst));
                        for (unsigned int r = 0; r < (unsigned int)CS; ++r) {
                            pk_st_cluster(sa, r, __uint_as_float(lo));
                            pk_st_cluster(sa + 4, r, __uint_as_float(hi));
                        }
                    }
                    pending &= ~(1u << i);
                } else {
                    ld_ll(buf + (long long)b * (H / 2) + 2 * w, a[i], c[i]);   // again
                }
            }
            if (clock64() - start > PK_SPIN_LIMIT) __trap();
        }
    }
    if (CS == 1) __syncthreads();
    else { pk_cluster_arrive(); pk_cluster_wait(); }
}

// V (the module's VARIANTS): 0 copy, 1 bulk, 2 multicast in clusters of CS, 3 none, 4 LL,
// 5 multicast of rows at the padded stride (one copy a block), 6 multicast issued by every
// warp. h [T+1][B][LDH] 16-bit values (their bits: step t's value is t & 0x7fff), then the
// LL words.
template <int V, int CS, int BV>
__device__ __forceinline__ void body(unsigned short* h, unsigned int* sync, unsigned int* flags,
                                     unsigned int* wrong, float* sink, int T, int B, int H) {
    unsigned long long* const ll = reinterpret_cast<unsigned long long*>(h + (long long)(T + 1) * B * (H + 8));
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, nb = gridDim.x;
    const int SRH = H + 8;                  // the grid form's row stride (16-bit values)
    unsigned short* hs = reinterpret_cast<unsigned short*>(smem_raw);
    const pk_saddr bar = pk_smem_addr(reinterpret_cast<const float*>(hs + B * SRH));
    const int U = H / nb, j0 = blockIdx.x * U;
    const int LDH = V == 5 ? SRH : H;       // h's row stride in global memory
    const unsigned int rank = CS > 1 ? pk_cluster_rank() : 0;
    if (V == 1 || V == 2 || V == 5 || V == 6) {
        if (tid == 0) {
            pk_mbar_init(bar, 1);
            pk_mbar_init_fence();
        }
    }
    if (CS > 1) pk_cluster_sync(); else __syncthreads();
    unsigned int bad = 0;
    float acc = 0.f;
    for (int t = 0; t < T; ++t) {
        const unsigned short* ht = h + (long long)t * B * LDH;
        if (V == 0) {
            for (int e = tid; e < B * H / 8; e += nt) {
                const int b = e / (H / 8), q = e - b * (H / 8);
                pk_cp_async16(reinterpret_cast<float*>(hs + b * SRH + 8 * q),
                              reinterpret_cast<const float*>(ht + b * H + 8 * q));
            }
            pk_cp_commit();
            pk_cp_wait<0>();
            __syncthreads();
        } else if (V == 1 || V == 2 || V == 6) {
            // the block's i-th row (b = rank + CS i) by warp i % nw, lane i / nw: warp 0's
            // lanes alone (nw 1), or every warp (V 6)
            const int nw = V == 6 ? nt / 32 : 1, warp = tid >> 5;
            if (warp < nw) {
                pk_fence_async_global();   // the other blocks' h_t (acquired) before the copies
                if (tid == 0) pk_mbar_expect(bar, (unsigned int)(B * H * 2));
                __syncwarp();
                for (int b = (int)rank + CS * (warp + nw * lane); b < B; b += CS * 32 * nw) {
                    const pk_saddr dst = pk_smem_addr(reinterpret_cast<const float*>(hs + b * SRH));
                    if (V == 1) pk_bulk_g2s(dst, ht + b * H, (unsigned int)(H * 2), bar);
                    else pk_bulk_g2s_mc(dst, ht + b * H, (unsigned int)(H * 2), bar,
                                 (unsigned short)((1u << CS) - 1u));
                }
            }
            pk_mbar_wait(bar, (unsigned int)(t & 1));
        } else if (V == 5) {
            if (tid == 0) {
                pk_fence_async_global();
                pk_mbar_expect(bar, (unsigned int)(B * SRH * 2));
                const int half = (B + CS - 1) / CS, r0 = (int)rank * half;
                const int r1 = min(B, r0 + half);
                if (r1 > r0)
                    pk_bulk_g2s_mc(pk_smem_addr(reinterpret_cast<const float*>(hs + r0 * SRH)),
                                   ht + r0 * SRH, (unsigned int)((r1 - r0) * SRH * 2), bar,
                                   (unsigned short)((1u << CS) - 1u));
            }
            pk_mbar_wait(bar, (unsigned int)(t & 1));
        } else if (V == 4) {
            if (t == 0) {   // h_0: plain
                for (int e = tid; e < B * H; e += nt) hs[(e / H) * SRH + e % H] = ht[e];
                if (CS > 1) pk_cluster_sync(); else __syncthreads();
            } else {
                ll_stage<CS>(hs, SRH, ll, t, B, H, tid, nt, rank);
            }
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
        if (V == 1 || V == 2 || V == 5 || V == 6) pk_fence_async_smem();   // these reads before the next copies
        const unsigned short next = (unsigned short)((t + 1) & 0x7fff);
        for (int e = tid; e < B * U; e += nt) {
            const int b = e / U, j = j0 + e % U;
            __stcg(h + ((long long)(t + 1) * B + b) * LDH + j, next);
        }
        if (V == 4) {   // the LL words of h_{t+1}: 4 columns a thread (U % 4 == 0)
            unsigned long long* buf = ll + (long long)((t + 1) & 1) * B * (H / 2);
            const unsigned long long word = (unsigned long long)next | ((unsigned long long)next << 16) |
                                            ((unsigned long long)(t + 1) << 32);
            for (int e = tid; e < B * U / 4; e += nt) {
                const int b = e / (U / 4), j = j0 + 4 * (e % (U / 4));
                st_ll(buf + (long long)b * (H / 2) + j / 2, word, word);
            }
            if (CS > 1) {   // no block runs ahead into a buffer its pair may still be reading
                pk_cluster_arrive();
                pk_cluster_wait();
            } else {
                __syncthreads();   // nor a thread into the block's own
            }
        } else {
            bench_barrier<BV, CS>(sync, flags, t, nb);
        }
    }
    if (CS > 1) pk_cluster_sync();   // no block exits while a copy may land in it
    sink[blockIdx.x * nt + tid] = acc;
    if (bad) atomicAdd(wrong, bad);
}

template <int V, int BV>
__global__ void __launch_bounds__(256, 1) stage_t(unsigned short* h, unsigned int* sync,
        unsigned int* flags, unsigned int* wrong, float* sink, int T, int B, int H) {
    body<V, 1, BV>(h, sync, flags, wrong, sink, T, B, H);
}
template <int V, int CS, int BV>
__global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(256, 1) stage_cl_t(
        unsigned short* h, unsigned int* sync, unsigned int* flags, unsigned int* wrong,
        float* sink, int T, int B, int H) {
    body<V, CS, BV>(h, sync, flags, wrong, sink, T, B, H);
}
"""


def kernel_of(variant: str, barrier: str = "counter") -> str:
    v, cs = VARIANTS[variant]
    bv = BARRIERS[barrier]
    return f"stage_cl_t<{v}, {cs}, {bv}>" if cs > 1 else f"stage_t<{v}, {bv}>"


def combos(variants, barriers):
    """The (staging, barrier) pairs to time: the pair barriers only in clusters of 2."""
    out = [(v, b) for v in variants for b in barriers
           if VARIANTS[v][0] != 4 and b != "none"
           and (b not in PAIR_BARRIERS or VARIANTS[v][1] == 2)]
    return out + [(v, "none") for v in variants if VARIANTS[v][0] == 4]


def declarations(todo) -> list:
    """The explicit instantiations of the (staging, barrier) pairs ``todo`` (for a compile
    check without a GPU: tests/kernels/test_kernels_staging_bench.py)."""
    params = "unsigned short*, unsigned int*, unsigned int*, unsigned int*, float*, int, int, int"
    return [f"template __global__ void {n}({params});" for n in (kernel_of(v, b) for v, b in todo)]


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
    ap.add_argument("--variants", default="copy,bulk,mc2,mc4,none")
    ap.add_argument("--barriers", default="counter")
    a = ap.parse_args(argv)
    variants, barriers = a.variants.split(","), a.barriers.split(",")
    for name, given, known in (("--variants", variants, VARIANTS),
                               ("--barriers", barriers, BARRIERS)):
        if any(x not in known for x in given):
            ap.error(f"{name}: a comma-separated list of {', '.join(known)}; got {given}")
    if a.blocks > 128 or a.blocks % 2:
        ap.error("--blocks: even, at most 128 (the flag barriers poll 128 flags)")
    if a.hidden % a.blocks or (a.hidden // a.blocks) % 4 or a.hidden % 8:
        ap.error("--hidden: a multiple of --blocks (4 columns a block at least) and of 8")
    import cupy as cp
    from rnnrt.session import GpuSession
    session = GpuSession()
    todo = combos(variants, barriers)
    names = [kernel_of(v, b) for v, b in todo]
    mod = cp.RawModule(code=source(), options=("-std=c++17", "-arch=sm_90a"),
                       name_expressions=names)
    T, nt, H, nb = a.steps, 256, a.hidden, a.blocks
    sync = cp.zeros(1, cp.uint32)
    flags = cp.zeros(128, cp.uint32)
    wrong = cp.zeros(1, cp.uint32)
    sink = cp.empty(nb * nt, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for B in map(int, a.batch.split(",")):
        h = cp.zeros((T + 1) * B * (H + 8) + 2 * B * H * 4, cp.uint16)   # + the LL words
        smem = B * (H + 8) * 2 + 16
        for variant, barrier in todo:
            fn = mod.get_function(kernel_of(variant, barrier))
            fn.max_dynamic_shared_size_bytes = smem
            args = (h, sync, flags, wrong, sink, np.int32(T), np.int32(B), np.int32(H))

            def launch(fn=fn, args=args):
                sync.fill(0)
                flags.fill(0)
                h[(T + 1) * B * (H + 8):].fill(0)   # the LL words: step 0 everywhere
                fn((nb,), (nt,), args, shared_mem=smem)

            row = {"variant": variant, "barrier": barrier, "cluster": VARIANTS[variant][1],
                   "blocks": nb,
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
    print(f"{'batch':>6}{'variant':>9}{'barrier':>10}{'us/step':>9}{'wrong':>7}")
    for r in rows:
        us = f"{r['us_per_step']:.3f}" if "us_per_step" in r else "error"
        print(f"{r['batch']:>6}{r['variant']:>9}{r['barrier']:>10}{us:>9}"
              f"{r.get('wrong_values_first_launch', '-'):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
