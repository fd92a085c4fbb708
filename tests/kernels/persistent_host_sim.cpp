// Runs cuda_src/persistent.cu's, persistent_bwd.cu's, persistent_stack.cu's and the stack
// backward's (persistent_stack_bwd.cu, persistent_stack_bwd_pair.cu) kernels on the
// CPU: one std::thread per CUDA thread, every block of the grid at once (co-resident, as the
// kernel requires), __syncthreads as a std::barrier per block, __syncwarp as one per 32
// threads, cp.async as an immediate copy (its commit / wait as no-ops: a copy that has
// already landed satisfies every wait), the grid barrier's atomics and acquire loads as
// std::atomic_ref.
// The kernel source is compiled as is (PK_HOST_SIM swaps in the primitives below), so
// its indexing, shared-memory layout, h staging, k-split reduction and barrier protocol run
// for real. Used by tests/kernels/test_kernels_persistent_sim.py, test_kernels_stack.py,
// test_kernels_stack_bwd.py (PK_SIM_STACK_BWD) and
// test_kernels_persistent_bwd_sim.py (PK_SIM_BWD: the backward kernels' main below;
// test_kernels_regs_bwd_sim.py: PK_SIM_REGS_BWD, the register-resident ones in it;
// test_kernels_pair_bwd_sim.py: PK_SIM_BWD_PAIR, the grid kernels in cluster pairs, CLUSTER 2:
// the grid barrier and the cluster primitives both) and
// test_kernels_mma_sim.py (PK_SIM_MMA: the tensor-core kernels at bf16 / fp16, mma.sync
// emulated over the warp's exchange buffer; test_kernels_mmac_sim.py: PK_SIM_MMAC and
// PK_SIM_MMAC16, the tensor-core cluster kernels in its main, CLUSTER 8 and 16,
// PK_SIM_MMACW their wide form and PK_SIM_MMACG their grid form) and test_kernels_mma_bwd_sim.py (PK_SIM_MMA_BWD:
// the tensor-core backward kernels, likewise) and test_kernels_stack_mma.py
// (PK_SIM_STACK_MMA: the tensor-core stack kernel, likewise) and
// test_kernels_stack_mma_bwd.py (PK_SIM_STACK_MMA_BWD: its backward, in cluster pairs)
// (g++ -std=c++20 -pthread); not part of rnnrt. The stack kernels' mains are in
// persistent_host_sim_stack.h, the tensor-core kernels' in persistent_host_sim_mma.h.
// The cluster kernels (CLUSTER > 0: blocks x of one cluster are x / CLUSTER alike): their
// barrier is a std::barrier over the cluster's threads, and a store into another block's
// shared memory (mapa + st.shared::cluster) writes that block's array at the same offset.
//
//   persistent_host_sim CELL B H T U BLOCKS THREADS SMEM_BYTES LAUNCHES DIR LDH LDC LDACT
//                       LDGX LDW LDBW LDBR K_TILE H_OFFSET CLUSTER
// reads DIR/{h,c,act,gx,w,bw,br}.f32 (flat float32, laid out with those lds; c and act may be
// empty), launches the kernel LAUNCHES times with one sync buffer (re-poisoning the outputs
// in between, checking the counters are back to zero after each), writes DIR/{h,c,act}.out.
// h is placed H_OFFSET floats past a 16-byte boundary (1: misaligned, the kernel must fall
// back to 4-byte staging loads). Prints how many 16-byte (cp.async) and 4-byte (__ldcg) h
// staging loads the kernel made: "ldcg128 N ldcg32 M".
#include "persistent_host_sim_std.h"   // the standard headers (precompiled by the tests)

#if defined(PK_SIM_MMAC16) || defined(PK_SIM_MMACG) || defined(PK_SIM_MMACW)
#define PK_SIM_MMAC   // ... those of clusters of 16 blocks, the grid form and the wide form
#endif
#ifdef PK_SIM_MMAC   // the tensor-core forward main runs the tensor-core cluster kernels
#define PK_SIM_MMA
#endif
#if defined(PK_SIM_REGS_BWD) || defined(PK_SIM_BWD_PAIR)   // the backward main below runs
#define PK_SIM_BWD                                          // their kernels
#endif

struct Dim3 { unsigned int x = 1, y = 1, z = 1; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { unsigned int x, y; };   // the stack mma kernel's 8-byte loads
[[maybe_unused]] static float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

static Dim3 gridDim, blockDim;
static thread_local Dim3 threadIdx, blockIdx;
static thread_local std::barrier<>* sim_block_barrier;
static thread_local std::barrier<>* sim_warp_barrier;
static thread_local float* sim_smem;
static thread_local unsigned int sim_smem_bytes;
static thread_local std::barrier<>* sim_cluster_barrier;
static int sim_cluster = 0;                 // blocks a cluster (0: the grid kernels)
static std::vector<float*> sim_block_smem;  // every block's shared memory

#define __global__
#define __host__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(a, b)
#define __cluster_dims__(x, y, z)

using std::max;
using std::min;

static void __syncthreads() { sim_block_barrier->arrive_and_wait(); }
static void __syncwarp() { sim_warp_barrier->arrive_and_wait(); }
// a warp shuffle: every lane of the warp calls it (the kernels shuffle in warp-uniform code)
static thread_local float* sim_warp_slots;
static float sim_shfl(float v, int src) {
    const int lane = threadIdx.x & 31;
    sim_warp_slots[lane] = v;
    __syncwarp();
    const float r = sim_warp_slots[src & 31];
    __syncwarp();   // every lane has read before the next shuffle overwrites a slot
    return r;
}
[[maybe_unused]] static float __shfl_sync(unsigned int, float v, int src) { return sim_shfl(v, src); }
[[maybe_unused]] static float __shfl_xor_sync(unsigned int, float v, int mask) {
    return sim_shfl(v, (threadIdx.x & 31) ^ mask);
}
static void __trap() {
    std::fprintf(stderr, "__trap() in block %u thread %u\n", blockIdx.x, threadIdx.x);
    std::abort();
}
static long long clock64() {
    // ~2 GHz cycles, so PK_SPIN_LIMIT means what it means on the GPU
    return 2 * std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch()).count();
}
static unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    return std::atomic_ref<unsigned int>(*p).fetch_add(v);
}
static unsigned int atomicExch(unsigned int* p, unsigned int v) {
    return std::atomic_ref<unsigned int>(*p).exchange(v);
}
// the cache-hinted loads and stores: plain accesses, counting the h staging loads (__ldcg)
static std::atomic<long long> sim_ldcg128{0}, sim_ldcg32{0};
static float __ldcg(const float* p) {
    sim_ldcg32.fetch_add(1, std::memory_order_relaxed);
    return *p;
}
static float __ldcs(const float* p) { return *p; }
[[maybe_unused]] static float __ldg(const float* p) { return *p; }
[[maybe_unused]] static float4 __ldg(const float4* p) { return *p; }
static void __stcg(float* p, float v) { *p = v; }
// the typed instantiations' 16-bit forms (persistent_common.cuh pk_ldcg / pk_stcg; the sim
// runs the float32 kernels, but their templates must compile)
[[maybe_unused]] static unsigned short __ldcg(const unsigned short* p) { return *p; }
[[maybe_unused]] static void __stcg(unsigned short* p, unsigned short v) { *p = v; }
[[maybe_unused]] static void __stcs(float* p, float v) { *p = v; }
[[maybe_unused]] static void __stcg(float4* p, float4 v) { *p = v; }
// the fast intrinsics (glibc has its own __expf: macros, not functions)
[[maybe_unused]] static float sim_fdividef(float x, float y) { return std::isinf(y) ? 0.f : x / y; }
#define __expf(x) std::exp(x)
#define __fdividef(x, y) sim_fdividef(x, y)
// the rounded add / subtract the backward kernels keep out of FMAs (no FMAs on the host)
[[maybe_unused]] static float __fadd_rn(float a, float b) { return a + b; }
[[maybe_unused]] static float __fsub_rn(float a, float b) { return a - b; }

// the primitives persistent.cu leaves to PK_HOST_SIM
// the spin's relaxed load is an acquire load here (stronger; ThreadSanitizer does not model
// the standalone fences that order it on the GPU), the fences seq_cst fences
static unsigned int ld_acquire_gpu(const unsigned int* p) {
    return std::atomic_ref<unsigned int>(*const_cast<unsigned int*>(p))
        .load(std::memory_order_acquire);
}
static unsigned int ld_relaxed_gpu(const unsigned int* p) {
    std::this_thread::yield();   // 2 cores, hundreds of threads: let the others run
    return ld_acquire_gpu(p);
}
static void pk_fence_acq_rel() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// shared-memory "addresses" are plain pointers here
using pk_saddr = std::uintptr_t;
[[maybe_unused]] static pk_saddr pk_smem_addr(const float* p) { return reinterpret_cast<pk_saddr>(p); }
[[maybe_unused]] static float4 pk_lds128(pk_saddr a) {
    if (a % 16 != 0) {
        std::fprintf(stderr, "misaligned 16-byte shared load at %p\n", reinterpret_cast<void*>(a));
        std::abort();
    }
    return *reinterpret_cast<const float4*>(a);
}
static unsigned int dynamic_smem_bytes() { return sim_smem_bytes; }
static float* dynamic_smem() { return sim_smem; }
[[maybe_unused]] static void pk_cp_async16(float* dst, const float* src) {
    for (const void* p : {static_cast<const void*>(dst), static_cast<const void*>(src)})
        if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) {   // the GPU faults on this
            std::fprintf(stderr, "misaligned 16-byte cp.async at %p\n", p);
            std::abort();
        }
    sim_ldcg128.fetch_add(1, std::memory_order_relaxed);
    std::memcpy(dst, src, 16);
}
static void pk_cp_commit() {}
[[maybe_unused]] static void pk_prefetch_l2(const void*) {}
template <int N> static void pk_cp_wait() {}
[[maybe_unused]] static unsigned int pk_cluster_rank() { return blockIdx.x % sim_cluster; }
static unsigned int pk_cluster_id() { return blockIdx.x / sim_cluster; }
[[maybe_unused]] static unsigned int pk_clusters() { return gridDim.x / sim_cluster; }
[[maybe_unused]] static void pk_cluster_sync() { sim_cluster_barrier->arrive_and_wait(); }
static thread_local std::optional<std::barrier<>::arrival_token> sim_cluster_token;
[[maybe_unused]] static void pk_cluster_arrive() { sim_cluster_token.emplace(sim_cluster_barrier->arrive()); }
[[maybe_unused]] static void pk_cluster_wait() {
    sim_cluster_barrier->wait(std::move(*sim_cluster_token));
    sim_cluster_token.reset();
}
[[maybe_unused]] static void pk_st_cluster(pk_saddr local, unsigned int rank, float v) {
    const std::ptrdiff_t off = reinterpret_cast<float*>(local) - sim_smem;
    if (rank >= (unsigned)sim_cluster || off < 0 || (std::size_t)off * 4 >= sim_smem_bytes) {
        std::fprintf(stderr, "st.shared::cluster out of range: rank %u offset %td\n", rank, off);
        std::abort();
    }
    sim_block_smem[pk_cluster_id() * sim_cluster + rank][off] = v;
}
[[maybe_unused]] static void pk_st_cluster_b16(pk_saddr local, unsigned int rank,
                                               unsigned short bits) {
    const std::ptrdiff_t off = reinterpret_cast<char*>(local) - reinterpret_cast<char*>(sim_smem);
    if (rank >= (unsigned)sim_cluster || off < 0 || off % 2 || (std::size_t)off + 2 > sim_smem_bytes) {
        std::fprintf(stderr, "st.shared::cluster.b16 out of range: rank %u offset %td\n", rank, off);
        std::abort();
    }
    std::memcpy(reinterpret_cast<char*>(sim_block_smem[pk_cluster_id() * sim_cluster + rank]) + off,
                &bits, 2);
}
// the bulk copy engine: an immediate copy, with the GPU's alignment rules, that completes
// its bytes on the mbarrier it names. The mbarriers are modelled as the PTX ISA defines them
// (a phase completes when its pending arrivals and its transaction count are both zero; then
// the next phase begins with the init's arrival count; a wait on parity P returns once the
// phase of that parity has completed), so a kernel that waits before every byte it expects
// has been sent (a copy another block issues late, a byte count too small) reads stale
// memory here as it would on the GPU, and one whose phase never completes traps.
struct SimMbar {
    std::mutex m;
    std::condition_variable cv;
    int count = 1, pending = 1;
    long long tx = 0;
    unsigned int phase = 0;
};
static std::mutex sim_mbars_mutex;
static std::map<pk_saddr, std::unique_ptr<SimMbar>> sim_mbars;
static SimMbar& sim_mbar(pk_saddr bar) {
    if (bar % 8) {
        std::fprintf(stderr, "misaligned mbarrier at %p\n", reinterpret_cast<void*>(bar));
        std::abort();
    }
    std::lock_guard<std::mutex> g(sim_mbars_mutex);
    auto& p = sim_mbars[bar];
    if (!p) p.reset(new SimMbar);
    return *p;
}
static void sim_mbar_update(SimMbar& b, int arrivals, long long tx) {   // b.m held
    b.pending -= arrivals;
    b.tx += tx;
    if (b.pending < 0) {
        std::fprintf(stderr, "mbarrier: more arrivals than its count\n");
        std::abort();
    }
    if (b.pending == 0 && b.tx == 0) {
        ++b.phase;
        b.pending = b.count;
        b.cv.notify_all();
    }
}
[[maybe_unused]] static void pk_mbar_init(pk_saddr bar, unsigned int count) {
    SimMbar& b = sim_mbar(bar);
    std::lock_guard<std::mutex> g(b.m);
    b.count = b.pending = (int)count;
    b.tx = 0;
    b.phase = 0;
}
[[maybe_unused]] static void pk_mbar_init_fence() {}
[[maybe_unused]] static void pk_mbar_expect(pk_saddr bar, unsigned int bytes) {
    SimMbar& b = sim_mbar(bar);
    std::lock_guard<std::mutex> g(b.m);
    sim_mbar_update(b, 1, (long long)bytes);
}
static void sim_mbar_complete_tx(pk_saddr bar, unsigned int bytes) {
    SimMbar& b = sim_mbar(bar);
    std::lock_guard<std::mutex> g(b.m);
    sim_mbar_update(b, 0, -(long long)bytes);
}
[[maybe_unused]] static void pk_mbar_wait(pk_saddr bar, unsigned int parity) {
    SimMbar& b = sim_mbar(bar);
    std::unique_lock<std::mutex> g(b.m);
    // PK_SIM_MBAR_WAIT_S: how long before a wait traps (default 60 s; the planted-fault
    // tests shorten it)
    static const int limit = std::getenv("PK_SIM_MBAR_WAIT_S")
                                 ? std::atoi(std::getenv("PK_SIM_MBAR_WAIT_S")) : 60;
    if (!b.cv.wait_for(g, std::chrono::seconds(limit),
                       [&] { return (b.phase & 1u) != parity; })) {
        std::fprintf(stderr, "mbarrier wait (parity %u) never completed: block %u thread %u\n",
                     parity, blockIdx.x, threadIdx.x);
        std::abort();
    }
}
[[maybe_unused]] static void pk_fence_async_smem() {}
[[maybe_unused]] static void pk_fence_async_global() {}
static void sim_bulk_check(pk_saddr dst, const void* src, unsigned int bytes, pk_saddr bar) {
    if (dst % 16 || reinterpret_cast<std::uintptr_t>(src) % 16 || bytes % 16 || bar % 8) {
        std::fprintf(stderr, "misaligned bulk copy: dst %p src %p bytes %u bar %p\n",
                     reinterpret_cast<void*>(dst), src, bytes, reinterpret_cast<void*>(bar));
        std::abort();
    }
}
[[maybe_unused]] static void pk_bulk_g2s(pk_saddr dst, const void* src, unsigned int bytes,
                                         pk_saddr bar) {
    sim_bulk_check(dst, src, bytes, bar);
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    sim_mbar_complete_tx(bar, bytes);
}
// multicast: the copy into each block of the cluster named in `mask`, at dst's offset in its
// shared memory, completing on its barrier at bar's offset
[[maybe_unused]] static void pk_bulk_g2s_mc(pk_saddr dst, const void* src, unsigned int bytes,
                                            pk_saddr bar, unsigned short mask) {
    sim_bulk_check(dst, src, bytes, bar);
    const pk_saddr base = reinterpret_cast<pk_saddr>(sim_smem);
    if (dst < base || dst + bytes > base + sim_smem_bytes || bar < base ||
        bar + 8 > base + sim_smem_bytes || mask >> sim_cluster) {
        std::fprintf(stderr, "multicast bulk copy out of range: dst %p bar %p mask %x\n",
                     reinterpret_cast<void*>(dst), reinterpret_cast<void*>(bar), mask);
        std::abort();
    }
    for (int r = 0; r < sim_cluster; ++r) {
        if (!(mask >> r & 1u)) continue;
        const pk_saddr other = reinterpret_cast<pk_saddr>(
                sim_block_smem[pk_cluster_id() * sim_cluster + r]);
        std::memcpy(reinterpret_cast<void*>(other + (dst - base)), src, bytes);
        sim_mbar_complete_tx(other + (bar - base), bytes);
    }
}
[[maybe_unused]] static void pk_st_cluster4(pk_saddr local, unsigned int rank, float4 v) {
    if (local % 16 != 0) {   // the GPU faults on this
        std::fprintf(stderr, "misaligned 16-byte st.shared::cluster at %p\n",
                     reinterpret_cast<void*>(local));
        std::abort();
    }
    const float* const f = &v.x;
    for (int e = 0; e < 4; ++e) pk_st_cluster(local + 4u * e, rank, f[e]);
}

// The tensor-core kernels' primitives (persistent_mma.cuh leaves them to PK_HOST_SIM): two
// floats packed as the 16-bit type's bits (lo in the low half), and mma.sync m16n8k16
// emulated over the warp: every lane deposits its A and B fragment registers in the warp's
// exchange buffer, a warp barrier, each lane rebuilds A [16][16] and B [16][8] by the PTX
// ISA's fragment layout (g = lane >> 2, c = lane & 3) and computes its own four D elements
// (fp32 accumulation of exact products), a warp barrier. A kernel that loads its fragments
// in another layout multiplies the wrong elements: its sums come out wrong.
template <class T> inline T from_f(float v);
static thread_local unsigned int* sim_mma_slots;   // the warp's 32 lanes x 6 words
template <class TS> static unsigned int pk_pack2(float lo, float hi) {
    return (static_cast<unsigned int>(from_f<TS>(hi).bits) << 16) | from_f<TS>(lo).bits;
}
template <class TS> static float sim_unpack(unsigned int r, int half) {
    TS v;
    v.bits = static_cast<unsigned short>(r >> (16 * half));
    return to_f(v);
}
// two TS values side by side as one packed register, p[0] in the low half (the device's
// 32-bit load, little-endian)
template <class TS> static unsigned int pk_ld_pair(const TS* p) {
    return static_cast<unsigned int>(p[0].bits) | (static_cast<unsigned int>(p[1].bits) << 16);
}
template <class TS>
static void pk_mma16816(float (&d)[4], const unsigned int (&a)[4], const unsigned int (&b)[2]) {
    const int lane = threadIdx.x & 31;
    unsigned int* const mine = sim_mma_slots + 6 * lane;
    for (int i = 0; i < 4; ++i) mine[i] = a[i];
    mine[4] = b[0];
    mine[5] = b[1];
    __syncwarp();
    float A[16][16], Bm[16][8];
    for (int l = 0; l < 32; ++l) {
        const unsigned int* const f = sim_mma_slots + 6 * l;
        const int g = l >> 2, c = l & 3;
        for (int e = 0; e < 2; ++e) {
            A[g][2 * c + e] = sim_unpack<TS>(f[0], e);
            A[g + 8][2 * c + e] = sim_unpack<TS>(f[1], e);
            A[g][2 * c + 8 + e] = sim_unpack<TS>(f[2], e);
            A[g + 8][2 * c + 8 + e] = sim_unpack<TS>(f[3], e);
            Bm[2 * c + e][g] = sim_unpack<TS>(f[4], e);
            Bm[2 * c + 8 + e][g] = sim_unpack<TS>(f[5], e);
        }
    }
    __syncwarp();   // every lane has gathered before the next mma overwrites a slot
    const int g = lane >> 2, c = lane & 3;
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), n = 2 * c + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; ++k) acc += A[r][k] * Bm[k][n];
        d[i] = acc;
    }
}

// The sim's clock64 is the wall clock, shared by hundreds of threads a core on a loaded CI
// machine (two test workers, TSan, the emulated mma's warp barriers): a wait may take far
// longer than on the GPU, so the GPU's spin limit (~8.6 s here) traps a kernel that is only
// starved. One limit for every sim: a kernel that hangs still traps, after ~9 minutes.
#ifndef PK_SPIN_LIMIT
#define PK_SPIN_LIMIT (1LL << 40)
#endif

#include PK_SOURCE

#ifdef PK_SIM_REGS_BWD   // the backward main runs the register-resident backward kernels
#define lstm_persistent_bwd lstm_persistent_regs_bwd
#define lstm_persistent_cluster_bwd lstm_persistent_regs_bwd
#define gru_persistent_bwd gru_persistent_regs_bwd
#define gru_persistent_cluster_bwd gru_persistent_regs_bwd
#define rnn_tanh_persistent_bwd rnn_tanh_persistent_regs_bwd
#define rnn_tanh_persistent_cluster_bwd rnn_tanh_persistent_regs_bwd
#define rnn_relu_persistent_bwd rnn_relu_persistent_regs_bwd
#define rnn_relu_persistent_cluster_bwd rnn_relu_persistent_regs_bwd
#endif

#ifdef PK_SIM_BWD_PAIR   // the backward main runs the grid kernels in cluster pairs (CLUSTER 2)
#define lstm_persistent_bwd lstm_persistent_pair_bwd
#define lstm_persistent_cluster_bwd lstm_persistent_pair_bwd
#define gru_persistent_bwd gru_persistent_pair_bwd
#define gru_persistent_cluster_bwd gru_persistent_pair_bwd
#define rnn_tanh_persistent_bwd rnn_tanh_persistent_pair_bwd
#define rnn_tanh_persistent_cluster_bwd rnn_tanh_persistent_pair_bwd
#define rnn_relu_persistent_bwd rnn_relu_persistent_pair_bwd
#define rnn_relu_persistent_cluster_bwd rnn_relu_persistent_pair_bwd
#endif

#ifdef PK_SIM_REGS   // the forward main runs the register-resident kernels in their stead
#define lstm_persistent_fwd lstm_persistent_regs_fwd
#define lstm_persistent_cluster_fwd lstm_persistent_regs_fwd
#define gru_persistent_fwd gru_persistent_regs_fwd
#define gru_persistent_cluster_fwd gru_persistent_regs_fwd
#define rnn_tanh_persistent_fwd rnn_tanh_persistent_regs_fwd
#define rnn_tanh_persistent_cluster_fwd rnn_tanh_persistent_regs_fwd
#define rnn_relu_persistent_fwd rnn_relu_persistent_regs_fwd
#define rnn_relu_persistent_cluster_fwd rnn_relu_persistent_regs_fwd
#endif

static std::vector<float> read_f32(const std::string& path) {
    std::vector<float> v;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) { std::perror(path.c_str()); std::exit(2); }
    std::fseek(f, 0, SEEK_END);
    const long n = std::ftell(f) / 4;
    std::fseek(f, 0, SEEK_SET);
    v.resize(n);
    if (n && std::fread(v.data(), 4, n, f) != (size_t)n) { std::perror("fread"); std::exit(2); }
    std::fclose(f);
    return v;
}

static void write_f32(const std::string& path, const std::vector<float>& v) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || (v.size() && std::fwrite(v.data(), 4, v.size(), f) != v.size())) {
        std::perror(path.c_str());
        std::exit(2);
    }
    std::fclose(f);
}

// n floats at `offset` floats past a 16-byte boundary, in `store` (float4: 16-byte aligned,
// zeroed): the kernels must take 4-byte loads where a row is not 16-byte aligned
[[maybe_unused]] static float* at_offset(std::vector<float4>& store, size_t n, int offset) {
    store.assign((offset + n) / 4 + 1, float4{0, 0, 0, 0});
    return reinterpret_cast<float*>(store.data()) + offset;
}

// The floats of file `path` in `store`, 16-byte aligned: (their first, how many)
[[maybe_unused]] static std::pair<float*, size_t> load_aligned(const std::string& path,
                                                               std::vector<float4>& store) {
    const std::vector<float> v = read_f32(path);
    float* const p = at_offset(store, v.size(), 0);
    std::copy(v.begin(), v.end(), p);
    return {p, v.size()};
}

// false (and why, on stderr) unless the n barrier counters are back to zero after `launch`
static bool counters_zero(const unsigned int* sync, size_t n, int launch) {
    for (size_t i = 0; i < n; ++i)
        if (sync[i] != 0) {
            std::fprintf(stderr, "launch %d left counter %zu at %u, not zero\n", launch, i,
                         sync[i]);
            return false;
        }
    return true;
}

// every block of the grid at once, each thread its own std::thread
static void launch(int blocks, int threads, unsigned int smem_bytes,
                   const std::function<void()>& kernel) {
    gridDim = {(unsigned)blocks, 1, 1};
    blockDim = {(unsigned)threads, 1, 1};
    std::vector<std::unique_ptr<std::barrier<>>> bars, warp_bars, cluster_bars;
    const int warps = (threads + 31) / 32;
    std::vector<float> warp_slots((size_t)blocks * warps * 32, 0.f);
    std::vector<unsigned int> mma_slots((size_t)blocks * warps * 32 * 6, 0u);
    std::vector<std::vector<float4>> smem(blocks);
    if (sim_cluster && blocks % sim_cluster) {
        std::fprintf(stderr, "%d blocks are not whole clusters of %d\n", blocks, sim_cluster);
        std::exit(2);
    }
    for (int n = 0; sim_cluster && n < blocks / sim_cluster; ++n)
        cluster_bars.emplace_back(new std::barrier<>(sim_cluster * threads));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int b = 0; b < blocks; ++b) {
        bars.emplace_back(new std::barrier<>(threads));
        for (int w = 0; w < (threads + 31) / 32; ++w)
            warp_bars.emplace_back(new std::barrier<>(std::min(32, threads - 32 * w)));
        smem[b].assign(smem_bytes / 16 + 1, float4{nan, nan, nan, nan});   // garbage: NaN
    }
    sim_block_smem.clear();
    sim_mbars.clear();   // a launch's mbarriers live in its shared memory: none outlives it
    for (int b = 0; b < blocks; ++b) sim_block_smem.push_back(reinterpret_cast<float*>(smem[b].data()));
    std::vector<std::thread> ts;
    for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, b, t] {
                blockIdx = {(unsigned)b, 1, 1};
                threadIdx = {(unsigned)t, 1, 1};
                sim_block_barrier = bars[b].get();
                sim_warp_barrier = warp_bars[b * warps + t / 32].get();
                sim_warp_slots = warp_slots.data() + ((size_t)b * warps + t / 32) * 32;
                sim_mma_slots = mma_slots.data() + ((size_t)b * warps + t / 32) * 32 * 6;
                sim_smem = reinterpret_cast<float*>(smem[b].data());
                sim_smem_bytes = smem_bytes;
                sim_cluster_barrier = sim_cluster ? cluster_bars[b / sim_cluster].get() : nullptr;
                kernel();
            });
    for (auto& t : ts) t.join();
}

#if defined(PK_SIM_STACK) || defined(PK_SIM_STACK_BWD) || defined(PK_SIM_STACK_MMA) || \
    defined(PK_SIM_STACK_MMA_BWD)
#include "persistent_host_sim_stack.h"   // the stack kernels' mains
#elif defined(PK_SIM_BWD)
// The per-layer backward kernels (persistent_bwd.cu), one layer:
//   persistent_host_sim_bwd CELL B H T U BLOCKS THREADS SMEM_BYTES LAUNCHES DIR LDG LDH LDA
//                           LDW K_TILE DG_OFFSET CLUSTER
// reads DIR/{dgx,dgh,dh0,dc0,dhin,dhn,dcn,act,st,w}.f32 (flat float32 with those lds: LDG for
// dgx and dgh, LDH for the [*, H] arrays, LDA for act, LDW for w; the outputs poisoned, the
// arrays a cell does not use empty), places dgx and dgh DG_OFFSET floats past a 16-byte
// boundary (1: misaligned, the kernel must stage dg with 4-byte loads), launches the kernel
// LAUNCHES times with one sync buffer (re-poisoning the outputs in between, checking the
// counters are back to zero after each), writes DIR/{dgx,dgh,dh0,dc0}.out and prints the
// staging loads ("ldcg128 N ldcg32 M"). CLUSTER > 0: the cluster kernels (blocks a cluster).
int main(int argc, char** argv) {
    if (argc != 18) {
        std::fprintf(stderr, "usage: see persistent_host_sim.cpp (PK_SIM_BWD)\n");
        return 2;
    }
    const std::string cell = argv[1], dir = argv[10];
    const int B = std::atoi(argv[2]), H = std::atoi(argv[3]), T = std::atoi(argv[4]);
    const int U = std::atoi(argv[5]), blocks = std::atoi(argv[6]), threads = std::atoi(argv[7]);
    const unsigned smem = (unsigned)std::atol(argv[8]);
    const int launches = std::atoi(argv[9]);
    const int ldg = std::atoi(argv[11]), ldh = std::atoi(argv[12]), lda = std::atoi(argv[13]);
    const int ldw = std::atoi(argv[14]), k_tile = std::atoi(argv[15]);
    const int dg_offset = std::atoi(argv[16]);
    sim_cluster = std::atoi(argv[17]);
    const bool cl = sim_cluster > 0;
    auto load = [&](const char* name) { return read_f32(dir + "/" + name + ".f32"); };
    // dgx and dgh at dg_offset floats past a 16-byte boundary (float4 storage is aligned)
    const std::vector<float> dgx_in = load("dgx"), dgh_in = load("dgh");
    std::vector<float4> dgx_store, dgh_store;
    float* const dgx = at_offset(dgx_store, dgx_in.size(), dg_offset);
    float* const dgh = at_offset(dgh_store, dgh_in.size(), dg_offset);
    std::vector<float> dh0 = load("dh0"), dc0 = load("dc0"), dhin = load("dhin");
    std::vector<float> dhn = load("dhn"), dcn = load("dcn"), act = load("act");
    std::vector<float> st = load("st"), w = load("w");
    alignas(8) unsigned int sync[2] = {0, 0};
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int l = 0; l < launches; ++l) {   // every output element poisoned: this launch writes it
        std::fill(dgx, dgx + dgx_in.size(), nan);
        std::fill(dgh, dgh + dgh_in.size(), nan);
        std::fill(dh0.begin(), dh0.end(), nan);
        std::fill(dc0.begin(), dc0.end(), nan);
        std::function<void()> k;
        if (cell == "lstm")
            k = [&] {
                (cl ? lstm_persistent_cluster_bwd : lstm_persistent_bwd)(
                    B, H, dgx, ldg, dh0.data(), ldh, dc0.data(), ldh, sync, 2, dhin.data(), ldh,
                    dhn.data(), ldh, dcn.data(), ldh, act.data(), lda, st.data(), ldh, w.data(),
                    ldw, T, U, k_tile);
            };
        else if (cell == "gru")
            k = [&] {
                (cl ? gru_persistent_cluster_bwd : gru_persistent_bwd)(
                    B, H, dgx, ldg, dgh, ldg, dh0.data(), ldh, sync, 2, dhin.data(), ldh,
                    dhn.data(), ldh, act.data(), lda, st.data(), ldh, w.data(), ldw, T, U,
                    k_tile);
            };
        else
            k = [&] {
                auto* tanh_k = cl ? rnn_tanh_persistent_cluster_bwd : rnn_tanh_persistent_bwd;
                auto* relu_k = cl ? rnn_relu_persistent_cluster_bwd : rnn_relu_persistent_bwd;
                (cell == "rnn_tanh" ? tanh_k : relu_k)(
                    B, H, dgx, ldg, dh0.data(), ldh, sync, 2, dhin.data(), ldh, dhn.data(), ldh,
                    st.data(), ldh, w.data(), ldw, T, U, k_tile);
            };
        launch(blocks, threads, smem, k);
        if (!counters_zero(sync, 2, l)) return 3;
    }
    write_f32(dir + "/dgx.out", std::vector<float>(dgx, dgx + dgx_in.size()));
    write_f32(dir + "/dgh.out", std::vector<float>(dgh, dgh + dgh_in.size()));
    write_f32(dir + "/dh0.out", dh0);
    write_f32(dir + "/dc0.out", dc0);
    std::printf("ldcg128 %lld ldcg32 %lld\n", sim_ldcg128.load(), sim_ldcg32.load());
    return 0;
}
#elif defined(PK_SIM_MMA) || defined(PK_SIM_MMA_BWD)
#include "persistent_host_sim_mma.h"   // the tensor-core kernels' mains
#else
int main(int argc, char** argv) {
    if (argc != 21) {
        std::fprintf(stderr, "usage: see the top of persistent_host_sim.cpp\n");
        return 2;
    }
    const std::string cell = argv[1], dir = argv[10];
    const int B = std::atoi(argv[2]), H = std::atoi(argv[3]), T = std::atoi(argv[4]);
    const int U = std::atoi(argv[5]), blocks = std::atoi(argv[6]), threads = std::atoi(argv[7]);
    const unsigned smem = (unsigned)std::atol(argv[8]);
    const int launches = std::atoi(argv[9]);
    const int ldh = std::atoi(argv[11]), ldc = std::atoi(argv[12]), ldact = std::atoi(argv[13]);
    const int ldgx = std::atoi(argv[14]), ldw = std::atoi(argv[15]);
    const int ldbw = std::atoi(argv[16]), ldbr = std::atoi(argv[17]);
    const int k_tile = std::atoi(argv[18]), h_offset = std::atoi(argv[19]);
    sim_cluster = std::atoi(argv[20]);
    const std::vector<float> h_in = read_f32(dir + "/h.f32");
    std::vector<float> c = read_f32(dir + "/c.f32");
    std::vector<float> act = read_f32(dir + "/act.f32"), gx = read_f32(dir + "/gx.f32");
    std::vector<float> w = read_f32(dir + "/w.f32"), bw = read_f32(dir + "/bw.f32");
    std::vector<float> br = read_f32(dir + "/br.f32");
    // h at h_offset floats past a 16-byte boundary (float4 storage is 16-byte aligned)
    std::vector<float4> h_store;
    float* const h = at_offset(h_store, h_in.size(), h_offset);
    std::copy(h_in.begin(), h_in.end(), h);
    const size_t h_size = h_in.size();
    alignas(8) unsigned int sync[2] = {0, 0};
    const float nan = std::numeric_limits<float>::quiet_NaN();

    for (int l = 0; l < launches; ++l) {
        if (l > 0) {   // poison every output element again: this launch must write it
            std::fill(h + (size_t)B * ldh, h + h_size, nan);
            if (!c.empty()) std::fill(c.begin() + (size_t)B * ldc, c.end(), nan);
            std::fill(act.begin(), act.end(), nan);
        }
        std::function<void()> k;
        const bool cl = sim_cluster > 0;
        if (cell == "lstm")
            k = [&] {
                (cl ? lstm_persistent_cluster_fwd : lstm_persistent_fwd)(
                    B, H, h, ldh, c.data(), ldc, act.data(), ldact, sync, 2, gx.data(), ldgx,
                    w.data(), ldw, bw.data(), ldbw, br.data(), ldbr, T, U, k_tile);
            };
        else if (cell == "gru")
            k = [&] {
                (cl ? gru_persistent_cluster_fwd : gru_persistent_fwd)(
                    B, H, h, ldh, act.data(), ldact, sync, 2, gx.data(), ldgx, w.data(), ldw,
                    bw.data(), ldbw, br.data(), ldbr, T, U, k_tile);
            };
        else if (cell == "rnn_tanh")
            k = [&] {
                (cl ? rnn_tanh_persistent_cluster_fwd : rnn_tanh_persistent_fwd)(
                    B, H, h, ldh, sync, 2, gx.data(), ldgx, w.data(), ldw, bw.data(), ldbw,
                    br.data(), ldbr, T, U, k_tile);
            };
        else
            k = [&] {
                (cl ? rnn_relu_persistent_cluster_fwd : rnn_relu_persistent_fwd)(
                    B, H, h, ldh, sync, 2, gx.data(), ldgx, w.data(), ldw, bw.data(), ldbw,
                    br.data(), ldbr, T, U, k_tile);
            };
        launch(blocks, threads, smem, k);
        if (!counters_zero(sync, 2, l)) return 3;
    }
    write_f32(dir + "/h.out", std::vector<float>(h, h + h_size));
    write_f32(dir + "/c.out", c);
    write_f32(dir + "/act.out", act);
    std::printf("ldcg128 %lld ldcg32 %lld\n", sim_ldcg128.load(), sim_ldcg32.load());
    return 0;
}
#endif
