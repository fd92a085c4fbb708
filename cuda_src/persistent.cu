/*
 * persistent.cu: persistent recurrent kernels, v2 (forward, fp32). ONE launch runs ALL T
 * steps of ONE layer's recurrence: R stays in shared memory for the whole sequence, every
 * block works on every step, and the blocks meet at a flag barrier in global memory between
 * steps instead of ending a kernel. W x is not done here: gx = W x_t for all t comes from one
 * cuBLAS GEMM before the launch.
 *
 * v2 against v1 (44 us a step at LSTM H 512 B 64 on an H100, latency bound:
 * h_t in 8 tiles of 64 columns, each a serial L2 round trip of 4-byte loads; the pointwise
 * inputs loaded after the dot products): the tile width is an argument (k_tile; the fit
 * takes all of h_t where it fits: one load phase a step), h_t is staged with 16-byte loads
 * PK_LD at a time in flight, and gx, bw, br are loaded before they are needed (c_t and
 * GRU's h_t stay in registers). Same math, same order of arithmetic, same outputs: for the
 * same k-split and k_tile 64 v2's results are v1's bit for bit (checked on the CPU threads
 * of tests/persistent_host_sim.cpp, all four cells, both staging paths).
 *
 * Calling convention (rnnrt/kernels.py builds the arguments; registry entries have
 * persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile)
 *   each view a (pointer, int ld) pair, row-major: element (r, c) at p[r*ld + c]; ld = 0
 *   broadcasts one row (the biases). The pointers are float*, except the barrier counters
 *   `sync` (unsigned int*). Gate q of hidden unit j is column q*H + j (torch order: LSTM
 *   i, f, g, o; GRU r, z, n). Time-major sequences are one view of T*B (or (T+1)*B) rows:
 *   step t, batch b is row t*B + b. No output may overlap an input (h[0] and c[0] are read
 *   from the outputs' own slot 0, which the kernel never writes).
 *
 * Kernels (one variant each, fp32; per step t = 0..T-1, for every (b, j)):
 *   kernel lstm_persistent_fwd(rows = B, cols = H)
 *       gh_q = sum_k R[q*H + j, k] h_t[b, k];  pre_q = ((gx + bw) + gh) + br   (per gate q)
 *       i, f, g, o = sigma(pre_0), sigma(pre_1), tanh(pre_2), sigma(pre_3)
 *       c_{t+1} = f * c_t + i * g;  h_{t+1} = o * tanh(c_{t+1})   (lstm_fwd's arithmetic)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    i, f, g, o after activation, for the backward pass
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0 (the zeros buffer without bias)
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of h_t a tile, a positive multiple of 4
 *   kernel gru_persistent_fwd(rows = B, cols = H)
 *       r = sigma(((gx_r + bw_r) + gh_r) + br_r);  z likewise;  hn = gh_n + br_n
 *       n = tanh((gx_n + bw_n) + r * hn);  h_{t+1} = n + z * (h_t - n)   (gru_fwd's)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    r, z, n, hn (columns 0, H, 2H, 3H)
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_fwd(rows = B, cols = H)   h_{t+1} = tanh(((gx + bw) + gh) + br)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_fwd(rows = B, cols = H)   h_{t+1} = max(((gx+bw)+gh)+br, 0)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *
 * Decomposition (rnnrt/persistent.py computes it for the host and emulates it in NumPy):
 *   grid = ceil(H / U) blocks, one per SM; block x owns units j in [x*U, x*U + U) and ALL G
 *   gate rows q*H + j of them, so the pointwise update is local to the block. Before the
 *   first step it copies those G*U rows of R into shared memory (rows padded to SR floats,
 *   zeros past H). Each step it reads all of h_t [B, H] in tiles of KT = k_tile columns
 *   (ceil(H / KT) tiles; KT >= H: one) through shared memory, from L2 (ld.global.cg: other
 *   blocks wrote h_t), 16-byte loads where H and ldh are multiples of 4 and h is 16-byte
 *   aligned (checked at run time; else 4-byte loads), each thread PK_LD loads in flight
 *   before it stores any. Then each thread accumulates G x PK_BT dot products:
 *     NB = ceil(B / PK_BT) batch groups; P = U * NB positions p = jj * NB + bg;
 *     KS = max(1, min(KT / 4, blockDim.x / P)) k-groups; thread tid is position tid % P
 *     of k-group tid / P (tid >= P*KS: staging only); it owns unit jj, batches
 *     bg + i*NB (i < PK_BT), and in every tile the float4 column chunks g, g + KS, ...
 *   k-groups 1..KS-1 leave their partial sums in shared memory; k-group 0 adds them in
 *   order g = 1, 2, ... and does the pointwise update of its (b, j): the gate sums are
 *   ((gx + bw) + gh) + br, exactly as the fused per-step kernels (lstm_fwd, gru_fwd, ...).
 *   k-group 0 loads step t+1's gx and bw before the barrier that ends step t, br before it
 *   adds the partial sums, and keeps c_t (LSTM) and h_t[b, j] (GRU), which it wrote itself,
 *   in registers.
 *   Dynamic shared memory, in floats: G*U*SR (R slice, SR = 4*(ceil(H/4) | 1))
 *     + NB*PK_BT*SH (h tile, SH = 4*((KT/4) | 1): KT as an odd number of float4s, so one
 *     column of 8 consecutive rows falls in 8 different groups of 4 banks; KT + 4 when KT/4
 *     is even) + (KS - 1)*G*PK_BT*P (partial sums).
 *
 * Barrier contract (flag-based, no cooperative launch, so it can be captured in a graph):
 *   sync[0] counts arrivals, sync[1] departures. Between step t and t+1 every block does
 *   __syncthreads(); thread 0: __threadfence(); atomicAdd(&sync[0], 1); spin until an acquire
 *   load of sync[0] >= (t+1)*gridDim.x; then __syncthreads(). The fence (cumulative through
 *   the first __syncthreads) publishes the block's h_{t+1} before its arrival counts; the
 *   acquire load and the second __syncthreads order every later read of h_{t+1} after all
 *   arrivals. There is no barrier after the last step. On exit thread 0 adds 1 to sync[1];
 *   the block that sees gridDim.x - 1 (the last out) resets both counters to 0: by then every
 *   block has passed its last spin, so no block can read the reset, and the next kernel on
 *   the stream (or the next graph replay) starts from zero.
 *   Why it cannot deadlock: a block spins only until all gridDim.x blocks have arrived at the
 *   same barrier, and every block that runs reaches it (no early exits, uniform loop bounds).
 *   That needs every block of the grid to be RUNNING at once: a block that is not yet
 *   resident waits for an SM that a spinning block never gives back. So the host must
 *   guarantee co-residency: gridDim.x <= SMs x (max active blocks per SM of this kernel at
 *   this block size and dynamic shared memory; the fit uses one block per SM and checks its
 *   shared memory, threads and registers; the occupancy API confirms it on the device), and
 *   must never run two persistent kernels concurrently (two grids that each hold part of the
 *   GPU and wait for the rest deadlock; one sync buffer also serves one launch at a time).
 *   Other kernels running beside it only delay it (their blocks finish and free their SMs).
 *   A spin that lasts PK_SPIN_LIMIT clock cycles (~8.6 s at 2 GHz) traps, so a broken
 *   co-residency guarantee fails the launch instead of hanging the GPU. A launch whose
 *   geometry disagrees with its arguments (fewer units than H, fewer threads than positions,
 *   k_tile not a positive multiple of 4, less dynamic shared memory than the layout needs
 *   for its k_tile) traps at once. After a failed launch the host must zero sync again.
 *
 * Resources (sm_90, measured 2026-11-21; nvcc 13.0 --resource-usage, and NVRTC 13.0's PTX through
 * ptxas -v, which is what CuPy runs; rnnrt.persistent.NVCC_REGS holds the larger of the two):
 *   lstm_persistent_fwd      128 registers (NVRTC 128), 0 bytes stack, no spills
 *   gru_persistent_fwd       128 registers (NVRTC 127), 0 bytes stack, no spills
 *   rnn_tanh_persistent_fwd  96 registers (NVRTC 106), 0 bytes stack, no spills
 *   rnn_relu_persistent_fwd  96 registers (NVRTC 106), 0 bytes stack, no spills
 *   no static shared memory; __launch_bounds__(PK_MAX_THREADS = 512, 1) caps a thread at 128
 *   registers (512 x 128 = one H100 SM's 64 K): LSTM and GRU sit at that cap (the prefetched
 *   pointwise inputs and PK_LD staging loads take registers; the owner's addresses are
 *   recomputed each step, pk_opaque, rather than kept). Dynamic shared memory by the layout
 *   above, e.g. LSTM B 64 on 132 SMs (512 threads): H 512 (U 4, KS 8, k_tile 512, one tile):
 *   33,024 (R) + 132,096 (h tile) + 28,672 (partial sums) = 193,792 bytes; H 1024 (U 8,
 *   KS 4, k_tile 256, 4 tiles): 222,720 bytes; H 2048 (U 16) needs 525,312 bytes for R
 *   alone: does not fit (227 KB a block).
 */

#define PK_BT 4                // batch register tile: batches per thread
#define PK_LD 8                // h staging: loads a thread has in flight (a batch of rows)
#define PK_MAX_THREADS 512     // __launch_bounds__ and the fit's cap on threads a block
#ifndef PK_SPIN_LIMIT
#define PK_SPIN_LIMIT (1LL << 34)   // clock cycles one barrier may spin before it traps
#endif

#define CELL_LSTM 0
#define CELL_GRU 1
#define CELL_RNN_TANH 2
#define CELL_RNN_RELU 3

// sigma(x) from exp of a non-positive number only: no overflow for large |x|, no inf/inf.
__device__ __forceinline__ float sigmoidf(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

// Row stride (floats) of a shared-memory array whose rows hold n floats: n rounded up to
// float4s, made an odd number of float4s, so that the same column of 8 consecutive rows
// (a quarter warp's 16-byte reads) falls in 8 different groups of 4 banks. Used for the R
// slice (n = H) and for the h tile (n = k_tile, a multiple of 4: 4 * ((k_tile/4) | 1)).
__device__ __forceinline__ int pk_stride_r(int H) { return 4 * (((H + 3) / 4) | 1); }

// x, but opaque to the compiler: an address built from it inside the step loop is computed
// there, where it is used, instead of being hoisted out of the loop as one more 64-bit
// pointer kept in registers for the whole kernel (the owner's 16 gx, bw, br, c, act
// addresses would take the registers the staging loads need to be in flight together).
__device__ __forceinline__ int pk_opaque(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

// The four hardware primitives. tests/persistent_host_sim.cpp defines PK_HOST_SIM and its
// own versions of them (and of __syncthreads, the atomics, the cache-hinted loads, ...) to
// run this file's kernels on CPU threads, one per CUDA thread, all blocks at once.
#ifndef PK_HOST_SIM
__device__ __forceinline__ unsigned int ld_acquire_gpu(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned int dynamic_smem_bytes() {
    unsigned int v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

__device__ __forceinline__ float* dynamic_smem() {
    extern __shared__ float4 smem4[];   // float4: 16-byte aligned
    return reinterpret_cast<float*>(smem4);
}

// One 16-byte shared-memory store (p 16-byte aligned). A plain float4 store after the
// staging's loads came out of the compiler as four 4-byte stores (4-way bank conflicts).
__device__ __forceinline__ void sts128(float* p, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "r"(static_cast<unsigned int>(__cvta_generic_to_shared(p))), "f"(v.x),
                    "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
#endif

// Every block waits here until all gridDim.x blocks have arrived `target / gridDim.x` times.
__device__ __forceinline__ void grid_barrier(unsigned int* sync, unsigned int target) {
    __syncthreads();   // the whole block's writes of this step are issued
    if (threadIdx.x == 0) {
        __threadfence();   // ... and visible GPU-wide before the arrival counts
        atomicAdd(sync, 1u);
        const long long start = clock64();
        while (ld_acquire_gpu(sync) < target) {
            if (clock64() - start > PK_SPIN_LIMIT) __trap();   // not co-resident: fail, not hang
        }
    }
    __syncthreads();   // no thread reads the next step's h before thread 0 saw all arrivals
}

// The last block out resets the counters for the next launch (see the header).
__device__ __forceinline__ void grid_exit(unsigned int* sync) {
    if (threadIdx.x == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        atomicExch(sync, 0u);
        atomicExch(sync + 1, 0u);
    }
}

// What one staging load moves: a float4 (16-byte loads) or a float.
template <bool VEC> struct pk_word { using type = float4; };
template <> struct pk_word<false> { using type = float; };
__device__ __forceinline__ float4 pk_ldcg(const float4* p) { return __ldcg(p); }
__device__ __forceinline__ float pk_ldcg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ void pk_sts(float* p, float4 v) { sts128(p, v); }
__device__ __forceinline__ void pk_sts(float* p, float v) { *p = v; }

// Stage columns [k0, k0 + 4*CH) of rows [0, B) of h_t into the h tile hs (row stride SH).
// A row is CW words: VEC, CH float4s, one 16-byte ld.global.cg each (H and ldh multiples of
// 4 and h 16-byte aligned, checked by the caller); else 4*CH floats, zeros past H. The
// threads form a grid of nrow x ncol (ncol = min(threads, CW), threads past it idle):
// thread (tr, tc) moves the words c = tc, tc + ncol, ... of the rows tr, tr + nrow, ...,
// PK_LD rows of one column a batch. All loads of a batch go to registers before the first
// of them is stored, so each thread has up to PK_LD L2 round trips in flight instead of one
// (v1 loaded and stored one float at a time); the batch's addresses are one fixed stride
// apart (nrow rows), so nothing but the loads sits between them. A warp's loads are
// consecutive words of one row. ld.cg: from L2, not L1, since other blocks wrote h_t during
// this launch.
template <bool VEC>
__device__ __forceinline__ void stage_tile(float* hs, int SH, const float* ht, long long ldh,
                                           int B, int H, int k0, int CH) {
    using word = typename pk_word<VEC>::type;
    constexpr int W = VEC ? 4 : 1;                 // floats a word
    const int tid = threadIdx.x, nt = blockDim.x;
    const int CW = CH * (4 / W);                   // words a row
    const int ncol = min(nt, CW), nrow = nt / ncol;
    const int tr = tid / ncol, tc = tid - tr * ncol;
    if (tr >= nrow) return;
    const long long gstep = nrow * ldh;            // from one row of a batch to the next
    const int sstep = nrow * SH;
    for (int c = tc; c < CW; c += ncol) {
        const int k = k0 + W * c;
        const bool in_h = VEC || k < H;            // scalar words past H are zeros
        for (int b0 = tr; b0 < B; b0 += PK_LD * nrow) {
            const float* const src = ht + b0 * ldh + k;
            word v[PK_LD];
#pragma unroll
            for (int u = 0; u < PK_LD; ++u) {
                // A word past B (or past H) loads one that exists, the tile's first, and is
                // not stored (or stored as 0): no branch around a load, so they issue back
                // to back.
                const bool ok = b0 + u * nrow < B && in_h;
                const word x = pk_ldcg(reinterpret_cast<const word*>(ok ? src + u * gstep
                                                                        : ht + k0));
                if constexpr (VEC)
                    v[u] = x;
                else
                    v[u] = ok ? x : 0.f;
            }
            float* const dst = hs + b0 * SH + W * c;
#pragma unroll
            for (int u = 0; u < PK_LD; ++u)
                if (b0 + u * nrow < B) pk_sts(dst + u * sstep, v[u]);
        }
    }
}

template <int G, int CELL>
__device__ __forceinline__ void persistent_fwd(
        int B, int H, float* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, const float* gx, long long ldgx, const float* w,
        long long ldw, const float* bw, long long ldbw, const float* br, long long ldbr,
        int T, int U, int KT) {
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x;
    if (U < 1 || B < 1 || H < 1 || KT < 4 || KT % 4 != 0) __trap();
    const int NB = (B + PK_BT - 1) / PK_BT;
    const int P = U * NB;
    const int KS = max(1, min(KT / 4, nt / P));
    const int SR = pk_stride_r(H);
    const int SH = pk_stride_r(KT);   // KT % 4 == 0: 4 * ((KT/4) | 1), an odd number of float4s
    const long long need = 4LL * ((long long)G * U * SR + (long long)NB * PK_BT * SH
                                  + (long long)(KS - 1) * G * PK_BT * P);
    if ((long long)gridDim.x * U < H || nt < P || (long long)dynamic_smem_bytes() < need)
        __trap();
    const int j0 = blockIdx.x * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns
    float* const Rs = smem;                              // [G*U][SR]
    float* const hs = Rs + G * U * SR;                   // [NB*PK_BT][SH]
    float* const red = hs + NB * PK_BT * SH;             // [(KS-1)*G*PK_BT][P]

    const int p = tid % P, g = tid / P;
    const bool computes = g < KS;
    const int jj = p / NB, bg = p - jj * NB;
    const int j = j0 + jj;
    const bool owner = computes && g == 0 && jj < Ub;   // updates (bg + i*NB, j), i < PK_BT
    // 16-byte staging loads where every row of h_t starts 16-byte aligned and has whole
    // float4s (H, ldh multiples of 4, h 16-byte aligned; the same for every block)
    const bool vec = H % 4 == 0 && ldh % 4 == 0 &&
                     (reinterpret_cast<unsigned long long>(h) & 15ull) == 0;

    // The pointwise inputs of step t+1, loaded by their owner at the end of step t, before the
    // grid barrier, so that their DRAM / L2 latency hides under the barrier: gx (streamed,
    // ld.cs) and bw (read-only, the same every step: ld.nc, L1 hits after the first step).
    // xg += bw once they are needed, at the start of the step: that is (gx + bw) of
    // ((gx + bw) + gh) + br, the fused kernels' order. br (ld.nc too) is loaded after the
    // FMAs, under the partial sums' reduction: fewer registers live through the FMA loop.
    // (v1 loaded all of them, and c_t, after the reduction, each a dependent round trip.)
    float xg[G][PK_BT], bwv[G][PK_BT], brv[G][PK_BT];
    auto prefetch = [&](int t) {
        const int bo = pk_opaque(bg), jo = pk_opaque(j), Ho = pk_opaque(H);
#pragma unroll
        for (int i = 0; i < PK_BT; ++i) {
            const int b = bo + i * NB;
            const bool live = owner && b < B;
            const float* const x = gx + ((long long)t * B + b) * ldgx + jo;
            const float* const y = bw + b * ldbw + jo;
#pragma unroll
            for (int q = 0; q < G; ++q) {
                xg[q][i] = live ? __ldcs(x + q * (long long)Ho) : 0.f;
                bwv[q][i] = live ? __ldg(y + q * (long long)Ho) : 0.f;
            }
        }
    };
    auto load_br = [&]() {
        const int bo = pk_opaque(bg), jo = pk_opaque(j), Ho = pk_opaque(H);
#pragma unroll
        for (int i = 0; i < PK_BT; ++i) {
            const int b = bo + i * NB;
            const bool live = owner && b < B;
            const float* const y = br + b * ldbr + jo;
#pragma unroll
            for (int q = 0; q < G; ++q) brv[q][i] = live ? __ldg(y + q * (long long)Ho) : 0.f;
        }
    };
    // c_t (LSTM) and h_t (GRU) at (b, j) are what this thread itself wrote the step before:
    // kept in registers, read from memory only for t = 0 (c0, h0).
    float carry[PK_BT];
#pragma unroll
    for (int i = 0; i < PK_BT; ++i) {
        const int b = bg + i * NB;
        carry[i] = 0.f;
        if constexpr (CELL == CELL_LSTM) {
            if (owner && b < B) carry[i] = c[b * ldc + j];
        } else if constexpr (CELL == CELL_GRU) {
            if (owner && b < B) carry[i] = h[b * ldh + j];
        }
    }
    prefetch(0);   // step 0's: in flight during the copy of R

    // R slice, once: row q*U + ju holds R[q*H + j0 + ju, :], zeros past H and past Ub.
    for (int e = tid; e < G * U * SR; e += nt) {
        const int row = e / SR, k = e - row * SR;
        const int q = row / U, ju = row - q * U;
        Rs[e] = (ju < Ub && k < H) ? w[((long long)q * H + j0 + ju) * ldw + k] : 0.f;
    }
    // h tile rows B .. NB*PK_BT-1 are read (batch groups past B) but never loaded: zero them
    // once. Rows < B are only ever written by the staging, so this does not race with it.
    for (int e = tid; e < (NB * PK_BT - B) * SH; e += nt) hs[B * SH + e] = 0.f;

    for (int t = 0; t < T; ++t) {
        const float* const ht = h + (long long)t * B * ldh;   // h_t: rows t*B .. t*B+B-1
        float acc[G][PK_BT];
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int i = 0; i < PK_BT; ++i) acc[q][i] = 0.f;

        // The previous reads of hs were before the last grid barrier (its __syncthreads; at
        // t = 0 nothing read it yet, and the zeroing above wrote only rows >= B), so the
        // first tile is staged at once.
        auto stage = [&](int k0) {
            const int CH = min(KT / 4, (H - k0 + 3) / 4);   // float4 chunks the FMAs read
            if (vec)
                stage_tile<true>(hs, SH, ht, ldh, B, H, k0, CH);
            else
                stage_tile<false>(hs, SH, ht, ldh, B, H, k0, CH);
        };
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int i = 0; i < PK_BT; ++i) xg[q][i] = xg[q][i] + bwv[q][i];   // gx + bw
        stage(0);
        __syncthreads();
        for (int k0 = 0;;) {
            if (computes) {
                const int chunks = min(KT / 4, (H - k0 + 3) / 4);
                for (int cc = g; cc < chunks; cc += KS) {
                    float4 hv[PK_BT];
#pragma unroll
                    for (int i = 0; i < PK_BT; ++i)
                        hv[i] = *reinterpret_cast<const float4*>(hs + (bg + i * NB) * SH + 4 * cc);
#pragma unroll
                    for (int q = 0; q < G; ++q) {
                        const float4 rv = *reinterpret_cast<const float4*>(
                            Rs + (q * U + jj) * SR + k0 + 4 * cc);
#pragma unroll
                        for (int i = 0; i < PK_BT; ++i) {
                            acc[q][i] = fmaf(rv.x, hv[i].x, acc[q][i]);
                            acc[q][i] = fmaf(rv.y, hv[i].y, acc[q][i]);
                            acc[q][i] = fmaf(rv.z, hv[i].z, acc[q][i]);
                            acc[q][i] = fmaf(rv.w, hv[i].w, acc[q][i]);
                        }
                    }
                }
            }
            k0 += KT;
            if (k0 >= H) break;
            __syncthreads();   // this tile is consumed
            stage(k0);
            __syncthreads();
        }

        // k-groups 1..KS-1 hand their partial sums to k-group 0 (consecutive p: no conflicts)
        if (computes && g > 0) {
#pragma unroll
            for (int q = 0; q < G; ++q)
#pragma unroll
                for (int i = 0; i < PK_BT; ++i)
                    red[(((g - 1) * G + q) * PK_BT + i) * P + p] = acc[q][i];
        }
        __syncthreads();
        if (owner) {
            load_br();
            for (int g2 = 1; g2 < KS; ++g2) {
#pragma unroll
                for (int q = 0; q < G; ++q)
#pragma unroll
                    for (int i = 0; i < PK_BT; ++i)
                        acc[q][i] += red[(((g2 - 1) * G + q) * PK_BT + i) * P + p];
            }
            // Gate sums, all at once so that xg and brv die before the activations:
            // ((gx + bw) + gh) + br, the fused kernels' order (GRU's n gate: gh_n + br_n,
            // r * (gh_n + br_n) is added to gx_n + bw_n below).
#pragma unroll
            for (int q = 0; q < G; ++q)
#pragma unroll
                for (int i = 0; i < PK_BT; ++i)
                    acc[q][i] = (CELL == CELL_GRU && q == 2)
                                    ? acc[q][i] + brv[q][i]
                                    : (xg[q][i] + acc[q][i]) + brv[q][i];
            const int bo = pk_opaque(bg), jo = pk_opaque(j), Ho = pk_opaque(H);
#pragma unroll
            for (int i = 0; i < PK_BT; ++i) {
                const int b = bo + i * NB;
                if (b >= B) continue;
                const long long row = (long long)t * B + b;   // step t, batch b
                auto pre = [&](int q) { return acc[q][i]; };
                float* const hn_out = h + (row + B) * ldh + jo;   // h_{t+1}[b, j]
                if constexpr (CELL == CELL_LSTM) {
                    const float pre_i = pre(0), pre_f = pre(1), pre_g = pre(2), pre_o = pre(3);
                    const float cp = carry[i];
                    const float ig = sigmoidf(pre_i), fg = sigmoidf(pre_f);
                    const float gg = tanhf(pre_g), og = sigmoidf(pre_o);
                    const float cn = fg * cp + ig * gg;
                    carry[i] = cn;
                    c[(row + B) * ldc + jo] = cn;
                    __stcg(hn_out, og * tanhf(cn));
                    float* const a = act + row * ldact + jo;
                    a[0] = ig;
                    a[Ho] = fg;
                    a[2 * (long long)Ho] = gg;
                    a[3 * (long long)Ho] = og;
                } else if constexpr (CELL == CELL_GRU) {
                    const float pre_r = pre(0), pre_z = pre(1);
                    const float xn = xg[2][i];                 // gx_n + bw_n
                    const float hn = acc[2][i];                // gh_n + br_n
                    const float hp = carry[i];
                    const float r = sigmoidf(pre_r), z = sigmoidf(pre_z);
                    const float n = tanhf(xn + r * hn);
                    const float hnew = n + z * (hp - n);
                    carry[i] = hnew;
                    __stcg(hn_out, hnew);
                    float* const a = act + row * ldact + jo;
                    a[0] = r;
                    a[Ho] = z;
                    a[2 * (long long)Ho] = n;
                    a[3 * (long long)Ho] = hn;
                } else if constexpr (CELL == CELL_RNN_TANH) {
                    __stcg(hn_out, tanhf(pre(0)));
                } else {
                    const float v = pre(0);
                    __stcg(hn_out, v < 0.f ? 0.f : v);   // NaN stays NaN, as rnn_relu_fwd
                }
            }
        }
        if (t + 1 < T) {
            prefetch(t + 1);   // step t+1's gx and biases: in flight across the barrier
            grid_barrier(sync, (unsigned int)(t + 1) * gridDim.x);
        }
    }
    grid_exit(sync);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM>(rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx, w_hh,
                                 ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx, ldgx,
                                w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx,
                                     ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                     units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx,
                                     ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                     units_per_block, k_tile);
}
