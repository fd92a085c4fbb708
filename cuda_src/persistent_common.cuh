/*
 * persistent_common.cuh: what the persistent kernels share. #included by persistent_layer.cuh (the
 * per-layer grid and cluster kernels), persistent_stack.cuh, persistent_stack.cu,
 * persistent_stack_mma.cu and persistent_stack_bwd.cu (the stack kernels); rnnrt's loader (rnnrt/kernels/sources.py) inlines it where it is included. No
 * kernels.
 *   PK_TIMING             timing variants, for the benchmarks only (below)
 *   PK_MAX_THREADS        threads a block at most (every persistent kernel's launch bounds)
 *   PK_SPIN_LIMIT         clock cycles a wait may spin before it traps
 *   CELL_*, sigmoidf      the cells, and the fused kernels' sigmoid
 *   hardware primitives   dynamic shared memory, 16-byte cp.async copies, 32-bit shared
 *                         addresses and 16-byte shared loads, the gpu-scope acq_rel fence,
 *                         acquire and relaxed loads, thread-block cluster rank / barrier /
 *                         distributed shared-memory store, bulk copies (plain and
 *                         multicast into a cluster) on mbarriers, async-proxy fences
 *                         (sm_90), L2 prefetch.
 *   ps_wait               the stack kernels' wait on a progress counter (forward and
 *                         backward: persistent_stack.cu, persistent_stack_mma.cu,
 *                         persistent_stack_bwd.cu)
 *   PS_NOTE, pk_trace     the stack kernels' PK_TRACE timeline (experiments only)
 *                         tests/kernels/persistent_host_sim.cpp defines PK_HOST_SIM and its
 *                         own versions of them, to run the kernels on CPU threads.
 *   PkRaw, PkIf, pk_operand, pk_stored, pk_ldcg, pk_ldcs, pk_stcg
 *                         the typed instantiations' storage (rnnrt/precision.py): TS, the
 *                         element type of the sequence the on-chip product reads (h forward,
 *                         dg backward: float, bf16, fp16; storage.cuh), and TF32, whether the
 *                         product reads its operands TF32-rounded. <float, false> is the fp32
 *                         kernel: every helper is the identity / the plain fp32 access there.
 */
#ifndef RNNRT_PERSISTENT_COMMON_CUH
#define RNNRT_PERSISTENT_COMMON_CUH

// Timing variants, for experiments/scripts/persistent_bench.py and
// stack_bench.py --variants only (they compute wrong
// results on purpose; rnnrt never defines PK_TIMING): a bit mask of the phases to leave out,
// to split a step's time between them.  1: staging h_t from L2 (cluster kernels: the pushes
// of h_{t+1} into the cluster's blocks);  2: the FMAs;  4: the grid barrier (blocks run
// free; the exit still resets the counters; cluster kernels: the per-step cluster barrier,
// a __syncthreads instead, and one cluster barrier before exit);  8: the pointwise update
// (no gate sums, no activations, no stores);  16 (the tensor-core cluster kernels, right
// results): the held-register loop branches out past a part's last step in every form, as
// the wide form's does (persistent_mmac.cuh: a one-process A/B of that choice);  32 (the
// same kernels, right results): their partial sums' rows unpadded, 8 NT floats (the pad's
// A/B);  64 (the tensor-core grid form, right results): its grid barrier's wait a relaxed
// spin and one acquire load (ps_wait), not a spin on acquire loads (pk_spin_acquire's A/B).
#ifndef PK_TIMING
#define PK_TIMING 0
#endif

#define PK_MAX_THREADS 256     // __launch_bounds__ and the fit's cap on threads a block
#ifndef PK_SPIN_LIMIT
#define PK_SPIN_LIMIT (1LL << 34)   // clock cycles one barrier may spin before it traps
#endif

#include "storage.cuh"

// Whether <TS, TF32> is the plain fp32 kernel: operands read as stored, so h / dg may be
// staged by 16-byte cp.async copies (the other instantiations convert on the way in).
template <class TS, bool TF32> struct PkRaw { static constexpr bool v = false; };
template <> struct PkRaw<float, false> { static constexpr bool v = true; };

// v as the cuBLAS rungs store it (rounded to TS), and as their GEMMs read it as an operand
// (then TF32-rounded where TF32): the product of two such values is exact in fp32 (8 x 8,
// 11 x 11 significand bits), so fp32 FMAs of them are the rungs' math up to summation order.
template <class TS> __device__ __forceinline__ float pk_stored(float v) {
    return to_f(from_f<TS>(v));
}
template <class TS, bool TF32> __device__ __forceinline__ float pk_operand(float v) {
    const float s = pk_stored<TS>(v);
    if constexpr (TF32) return round_tf32(s);
    return s;
}
// The cache-hinted (L2) load and store of one element of a TS sequence, as float.
__device__ __forceinline__ float pk_ldcg(const float* p) { return __ldcg(p); }
template <class T> __device__ __forceinline__ float pk_ldcg(const T* p) {
    T v;
    v.bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return to_f(v);
}
__device__ __forceinline__ void pk_stcg(float* p, float v) { __stcg(p, v); }
template <class T> __device__ __forceinline__ void pk_stcg(T* p, float v) {
    __stcg(reinterpret_cast<unsigned short*>(p), from_f<T>(v).bits);
}
// A streamed (evict-first) load of one element of a sequence of type T, as float.
__device__ __forceinline__ float pk_ldcs(const float* p) { return __ldcs(p); }
template <class T> __device__ __forceinline__ float pk_ldcs(const T* p) { return to_f(*p); }
// Type C where cond, else D (the backward's state input: c of the LSTM is fp32, h is TS).
template <bool cond, class C, class D> struct PkIf { using type = C; };
template <class C, class D> struct PkIf<false, C, D> { using type = D; };

#define CELL_LSTM 0
#define CELL_GRU 1
#define CELL_RNN_TANH 2
#define CELL_RNN_RELU 3

// sigma(x) from exp of a non-positive number only: no overflow for large |x|, no inf/inf.
__device__ __forceinline__ float sigmoidf(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

// The hardware primitives. tests/kernels/persistent_host_sim.cpp defines PK_HOST_SIM and its own
// versions of them (and of __syncthreads, __syncwarp, the atomics, the cache-hinted loads,
// ...) to run this file's kernels on CPU threads, one per CUDA thread, all blocks at once.
#ifndef PK_HOST_SIM
__device__ __forceinline__ unsigned int dynamic_smem_bytes() {
    unsigned int v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

__device__ __forceinline__ float* dynamic_smem() {
    extern __shared__ float4 smem4[];   // float4: 16-byte aligned
    return reinterpret_cast<float*>(smem4);
}

// 16 bytes from global (through L2, not L1: other blocks wrote them during this launch) to
// shared memory, asynchronously: no registers, any number in flight. dst and src 16-byte
// aligned. Completion: pk_cp_commit() closes a group, pk_cp_wait<N>() waits until at most
// N of this thread's groups are pending; then __syncwarp() shows the data to the warp.
__device__ __forceinline__ void pk_cp_async16(float* dst, const float* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(static_cast<unsigned int>(__cvta_generic_to_shared(dst))), "l"(src)
                 : "memory");
}
// The 32-bit shared-memory address of p, and a 16-byte shared load from one.
typedef unsigned int pk_saddr;
__device__ __forceinline__ pk_saddr pk_smem_addr(const float* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ float4 pk_lds128(pk_saddr a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}

// The grid barrier's ordering: a gpu-scope acq_rel fence (not __threadfence's fence.sc,
// MEMBAR.SC in SASS), and the spin's plain relaxed load (an ld.acquire polls with an L1
// invalidation, CCTL.IVALL, every time round; one fence after the spin orders what follows).
__device__ __forceinline__ void pk_fence_acq_rel() {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
// An acquire load (the stack kernel's waits end with one instead of a fence: a fence would
// also wait for the warp's cp.async copies in flight).
__device__ __forceinline__ unsigned int ld_acquire_gpu(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned int ld_relaxed_gpu(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Thread-block clusters (sm_90): this block's rank in its cluster, the cluster's index in
// the grid and the number of clusters; the cluster barrier (every thread of every block of
// the cluster; release / acquire: shared-memory writes to any block of the cluster before
// it are seen by every thread after it); and a 4-byte (pk_st_cluster4: 16-byte;
// pk_st_cluster_b16: 2-byte) store into
// block `rank`'s shared memory at the address that `local` is in this block's (mapa: the
// same offset there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900   // no clusters: the grid kernels only
__device__ __forceinline__ unsigned int pk_cluster_rank() { __trap(); return 0; }
__device__ __forceinline__ unsigned int pk_cluster_id() { __trap(); return 0; }
__device__ __forceinline__ unsigned int pk_clusters() { __trap(); return 1; }
__device__ __forceinline__ void pk_cluster_sync() { __trap(); }
__device__ __forceinline__ void pk_cluster_arrive() { __trap(); }
__device__ __forceinline__ void pk_cluster_wait() { __trap(); }
__device__ __forceinline__ void pk_st_cluster(pk_saddr, unsigned int, float) { __trap(); }
__device__ __forceinline__ void pk_st_cluster4(pk_saddr, unsigned int, float4) { __trap(); }
__device__ __forceinline__ void pk_st_cluster_b16(pk_saddr, unsigned int, unsigned short) {
    __trap();
}
#else
__device__ __forceinline__ unsigned int pk_cluster_rank() {
    unsigned int v;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(v));
    return v;
}
__device__ __forceinline__ unsigned int pk_cluster_id() {
    unsigned int v;
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ unsigned int pk_clusters() {
    unsigned int v;
    asm("mov.u32 %0, %%nclusterid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ void pk_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The same barrier in two halves: work between them overlaps the wait for the others (it
// must not touch what the barrier orders: the cluster's shared buffers).
__device__ __forceinline__ void pk_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void pk_cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void pk_st_cluster(pk_saddr local, unsigned int rank, float v) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
}
// The same for 2 bytes (`local` 2-byte aligned): a 16-bit value's bits (the tensor-core
// cluster kernel's h buffers in the storage type).
__device__ __forceinline__ void pk_st_cluster_b16(pk_saddr local, unsigned int rank,
                                                  unsigned short bits) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.b16 [%0], %1;" :: "r"(remote), "h"(bits) : "memory");
}
// The same for 16 bytes (`local` 16-byte aligned): one store where a thread pushes 4 floats
// that lie side by side (the register-resident backward's LSTM gates of one cell).
__device__ __forceinline__ void pk_st_cluster4(pk_saddr local, unsigned int rank, float4 v) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "r"(remote), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
#endif
// The bulk copy engine (TMA, sm_90; experiments: persistent_stack_bwd_pair.cu's SP_BULK):
// pk_bulk_g2s copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// to this block's shared memory, completing on the mbarrier `bar` (8 bytes of shared
// memory, pk_mbar_init'ed for one arrival), which pk_mbar_expect told to expect them;
// pk_mbar_wait waits for the barrier's phase of parity `parity` to complete (traps past
// PK_SPIN_LIMIT, as the other waits); pk_fence_async_smem orders this thread's earlier
// shared-memory accesses (generic proxy) before later bulk copies into it (async proxy).
// pk_bulk_g2s_mc: the same copy into every block of this block's cluster named in `mask`
// (bit r: rank r), at `dst`'s offset in each, completing on each one's barrier at `bar`'s
// offset (multicast: one read of the source for all of them); pk_fence_async_global orders
// the global memory this thread has seen (the other blocks' stores it acquired) before its
// later bulk copies read it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
__device__ __forceinline__ void pk_mbar_init(pk_saddr, unsigned int) { __trap(); }
__device__ __forceinline__ void pk_mbar_init_fence() { __trap(); }
__device__ __forceinline__ void pk_mbar_expect(pk_saddr, unsigned int) { __trap(); }
__device__ __forceinline__ void pk_bulk_g2s(pk_saddr, const void*, unsigned int, pk_saddr) {
    __trap();
}
__device__ __forceinline__ void pk_bulk_g2s_mc(pk_saddr, const void*, unsigned int, pk_saddr,
                                               unsigned short) {
    __trap();
}
__device__ __forceinline__ void pk_mbar_wait(pk_saddr, unsigned int) { __trap(); }
__device__ __forceinline__ void pk_fence_async_smem() { __trap(); }
__device__ __forceinline__ void pk_fence_async_global() { __trap(); }
#else
__device__ __forceinline__ void pk_mbar_init(pk_saddr bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
// the barriers' initialization visible to the bulk copies (before the block's first)
__device__ __forceinline__ void pk_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void pk_mbar_expect(pk_saddr bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void pk_bulk_g2s(pk_saddr dst, const void* src, unsigned int bytes,
                                            pk_saddr bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1], %2, [%3];" :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void pk_mbar_wait(pk_saddr bar, unsigned int parity) {
    const long long start = clock64();
    unsigned int done = 0;
    while (!done) {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        if (!done && clock64() - start > PK_SPIN_LIMIT) __trap();
    }
}
__device__ __forceinline__ void pk_bulk_g2s_mc(pk_saddr dst, const void* src,
                                               unsigned int bytes, pk_saddr bar,
                                               unsigned short mask) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1], %2, [%3], %4;"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask) : "memory");
}
__device__ __forceinline__ void pk_fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void pk_fence_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}
#endif

// Fetch the 128-byte line at p into L2 (a hint: no registers, nothing waits for it).
__device__ __forceinline__ void pk_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
__device__ __forceinline__ void pk_cp_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void pk_cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
#endif

// The stack kernels' register tile (persistent_stack.cu, persistent_stack_bwd.cu,
// persistent_stack_bwd_pair.cu): a lane accumulates 16 rows x 8 batches. ps_outer: one k's
// outer product from its 4 A float4s (rows 4g + e) and 2 X float4s (batches 4h + f), 128
// FMAs; SKIP (0..3): row group SKIP left out (its av[SKIP] unread: 96 FMAs).
template <int SKIP = -1>
__device__ __forceinline__ void ps_outer(float (&acc)[16][8], const float4 (&av)[4],
                                         const float4 (&xv)[2]) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        if (g == SKIP) continue;
        const float ar[4] = {av[g].x, av[g].y, av[g].z, av[g].w};
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float xr[4] = {xv[hh].x, xv[hh].y, xv[hh].z, xv[hh].w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int f = 0; f < 4; ++f)
                    acc[4 * g + e][4 * hh + f] = fmaf(ar[e], xr[f], acc[4 * g + e][4 * hh + f]);
        }
    }
}
// ps_flush<NH>: the k-groups' tiles into four partial sums red[m][b][row] (row stride rp;
// red + (warp & 3) * 64 * rp is one; a lane's rows 16g + 4lr + e at 4lr + 16g + e of a row),
// a __syncthreads after each pass. NH 2 (the 64-batch tile, batches 32h + 4lb + f): eight
// warp tiles, warps 4..7 store, warps 0..3 add theirs. NH 1 (the 32-batch tile, B <= 32:
// the warp's 32 lanes as two half-warps lk on alternate k rows, batches 16h + 4lb + f):
// sixteen, in four passes: (warps 4..7, lk 1) store, then (4..7, 0), (0..3, 1), (0..3, 0)
// add theirs. With 4 * rp = 16 mod 32 banks a quarter warp's two batch rows meet no bank
// twice.
template <int NH>
__device__ __forceinline__ void ps_flush(const float (&acc)[16][8], float* red, int warp,
                                         int lk, int lr, int lb, int rp) {
    constexpr int passes = NH == 2 ? 2 : 4, bh = NH == 2 ? 32 : 16;
    for (int pass = 0; pass < passes; ++pass) {
        const bool mine = NH == 2 ? (warp >= 4) == (pass == 0)
                                  : (warp >= 4) == (pass < 2) && lk == 1 - (pass & 1);
        if (mine) {
            float* const r0 = red + (warp & 3) * 64 * rp + 4 * lr;
#pragma unroll
            for (int g = 0; g < 4; ++g)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                    for (int f = 0; f < 4; ++f) {
                        float4* const q = reinterpret_cast<float4*>(
                            r0 + (bh * hh + 4 * lb + f) * rp + 16 * g);
                        float4 v = make_float4(acc[4 * g][4 * hh + f], acc[4 * g + 1][4 * hh + f],
                                               acc[4 * g + 2][4 * hh + f],
                                               acc[4 * g + 3][4 * hh + f]);
                        if (pass > 0) {
                            const float4 o = *q;
                            v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
                        }
                        *q = v;
                    }
        }
        __syncthreads();
    }
}

// Timeline of the stack kernels, for experiments only (rnnrt never defines PK_TRACE): thread
// 0 of each of the first PS_TRACE_BLOCKS blocks notes %globaltimer (ns) at PS_TRACE_POINTS
// points of its first PS_TRACE_STEPS steps into pk_trace[block][step][point]
// (stack_bench.py --trace and stack_bwd_bench.py --trace read it; each kernel says what its
// points are).
#define PS_TRACE_BLOCKS 160
#define PS_TRACE_STEPS 128
#define PS_TRACE_POINTS 6
#ifdef PK_TRACE
__device__ unsigned long long pk_trace[PS_TRACE_BLOCKS * PS_TRACE_STEPS * PS_TRACE_POINTS];
#define PS_NOTE(t, point)                                                                     \
    do {                                                                                      \
        if (threadIdx.x == 0 && (t) < PS_TRACE_STEPS && blockIdx.x < PS_TRACE_BLOCKS) {      \
            unsigned long long ns;                                                            \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));                            \
            pk_trace[(blockIdx.x * PS_TRACE_STEPS + (t)) * PS_TRACE_POINTS + (point)] = ns;   \
        }                                                                                     \
    } while (0)
#else
#define PS_NOTE(t, point) ((void)0)
#endif

// The stack kernels' progress-counter wait (persistent_stack.cu, persistent_stack_bwd.cu).
// Wait until *p >= target (lane 0 of a warp; the __syncwarp after it shows the wait to the
// warp). The acquire side of the progress counters: a relaxed poll, then one acquire load
// (not a fence: fence.acq_rel would wait for the warp's cp.async copies in flight; the
// profile of the first per-warp version: the waits cost 3.3 us a step, 0.75 us seen).
__device__ __forceinline__ void ps_wait(const unsigned int* p, unsigned int target) {
    if (PK_TIMING & 4) return;
    const long long start = clock64();
    while (ld_relaxed_gpu(p) < target) {
        if (clock64() - start > PK_SPIN_LIMIT) __trap();   // not co-resident: fail, not hang
    }
    if (ld_acquire_gpu(p) < target) __trap();   // counters only grow during a launch
}

// The tensor-core grid form's wait at its grid barrier (thread 0; the block's other warps
// wait at __syncthreads, with nothing of their own in L1): a spin on acquire loads, no load
// after it. One round trip sooner than ps_wait's relaxed spin and closing acquire load
// (`experiments/scripts/staging_bench.py`, the grid form's step without its product,
// 128 blocks in pairs, H200: B 8 2.36 -> 2.18 us a step, B 32 4.22 -> 4.08;
// `kernels/staging-bench-nvidia-h200-20261129T201137.json`). The kernel's step, float16 H
// 1024, one process, ps_wait -> this (timing variant 64 against 0): LSTM B 8 4.02 -> 3.92
// us, B 32 5.85 -> 5.73, GRU 3.69 -> 3.53, 6.05 -> 5.73 (`kernels/persistent-mmac-bench-
// T100-nvidia-h200-20261129T203942.json`, that run's variants 192 / 128); faster at 7 of 8
// in two processes (`...T202942.json`: GRU B 8 3.67 -> 3.83 the one slower).
__device__ __forceinline__ void pk_spin_acquire(const unsigned int* p, unsigned int target) {
    if (PK_TIMING & 4) return;
    const long long start = clock64();
    while (ld_acquire_gpu(p) < target) {
        if (clock64() - start > PK_SPIN_LIMIT) __trap();   // not co-resident: fail, not hang
    }
}

#endif  // RNNRT_PERSISTENT_COMMON_CUH
