/*
 * persistent.cu: persistent recurrent kernels, v1 (forward, fp32). ONE launch runs ALL T
 * steps of ONE layer's recurrence: R stays in shared memory for the whole sequence, every
 * block works on every step, and the blocks meet at a flag barrier in global memory between
 * steps instead of ending a kernel. W x is not done here: gx = W x_t for all t comes from one
 * cuBLAS GEMM before the launch.
 *
 * Calling convention (rnnrt/kernels.py builds the arguments; registry entries have
 * persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block)
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
 *   kernel rnn_tanh_persistent_fwd(rows = B, cols = H)   h_{t+1} = tanh(((gx + bw) + gh) + br)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *   kernel rnn_relu_persistent_fwd(rows = B, cols = H)   h_{t+1} = max(((gx+bw)+gh)+br, 0)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *
 * Decomposition (rnnrt/persistent.py computes it for the host and emulates it in NumPy):
 *   grid = ceil(H / U) blocks, one per SM; block x owns units j in [x*U, x*U + U) and ALL G
 *   gate rows q*H + j of them, so the pointwise update is local to the block. Before the
 *   first step it copies those G*U rows of R into shared memory (rows padded to SR floats,
 *   zeros past H). Each step it reads all of h_t [B, H] in tiles of PK_KT columns through
 *   shared memory (L2 loads, ld.global.cg: other blocks wrote h_t), and each thread
 *   accumulates G x PK_BT dot products:
 *     NB = ceil(B / PK_BT) batch groups; P = U * NB positions p = jj * NB + bg;
 *     KS = max(1, min(PK_KT / 4, blockDim.x / P)) k-groups; thread tid is position tid % P
 *     of k-group tid / P (tid >= P*KS: staging only); it owns unit jj, batches
 *     bg + i*NB (i < PK_BT), and in every tile the float4 column chunks g, g + KS, ...
 *   k-groups 1..KS-1 leave their partial sums in shared memory; k-group 0 adds them in
 *   order g = 1, 2, ... and does the pointwise update of its (b, j): the gate sums are
 *   ((gx + bw) + gh) + br, exactly as the fused per-step kernels (lstm_fwd, gru_fwd, ...).
 *   Dynamic shared memory, in floats: G*U*SR (R slice, SR = 4*(ceil(H/4) | 1))
 *     + NB*PK_BT*PK_SH (h tile, PK_SH = PK_KT + 4) + (KS - 1)*G*PK_BT*P (partial sums).
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
 *   less dynamic shared memory than the layout needs) traps at once. After a failed launch
 *   the host must zero sync again.
 *
 * Resources (sm_90, 2026-11-22; nvcc 13.0 --resource-usage, and NVRTC 13.0's PTX through
 * ptxas -v, which is what CuPy runs; rnnrt.persistent.NVCC_REGS holds the larger of the two):
 *   lstm_persistent_fwd      127 registers (NVRTC 128), 0 bytes stack, no spills
 *   gru_persistent_fwd       128 registers (NVRTC 127), 0 bytes stack, no spills
 *   rnn_tanh_persistent_fwd  96 registers (NVRTC 96), 0 bytes stack, no spills
 *   rnn_relu_persistent_fwd  96 registers (NVRTC 96), 0 bytes stack, no spills
 *   no static shared memory; __launch_bounds__(PK_MAX_THREADS = 512, 1) caps a thread at 128
 *   registers (512 x 128 = one H100 SM's 64 K). Dynamic shared memory by the layout above,
 *   e.g. LSTM B 64 on 132 SMs: H 512 (U 4, 128 blocks x 256 threads, KS 4): 33,024 (R) +
 *   17,408 (h tile) + 12,288 (partial sums) = 62,720 bytes; H 1024 (U 8, KS 2): 157,184
 *   bytes; H 2048 (U 16) needs 525,312 bytes for R alone: does not fit (227 KB a block).
 */

#define PK_BT 4                // batch register tile: batches per thread
#define PK_KT 64               // columns of h_t staged in shared memory at a time
#define PK_SH (PK_KT + 4)      // row stride of the h tile (floats): 17 float4s, odd
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

// Row stride of the R slice in shared memory (floats): H rounded up to float4s, made an odd
// number of float4s so that rows of neighbouring units fall in different banks.
__device__ __forceinline__ int pk_stride_r(int H) { return 4 * (((H + 3) / 4) | 1); }

// The three hardware primitives. tests/persistent_host_sim.cpp defines PK_HOST_SIM and its
// own versions of them (and of __syncthreads, the atomics, ...) to run this file's kernels
// on CPU threads, one per CUDA thread, all blocks at once.
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

template <int G, int CELL>
__device__ __forceinline__ void persistent_fwd(
        int B, int H, float* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, const float* gx, long long ldgx, const float* w,
        long long ldw, const float* bw, long long ldbw, const float* br, long long ldbr,
        int T, int U) {
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x;
    if (U < 1 || B < 1 || H < 1) __trap();
    const int NB = (B + PK_BT - 1) / PK_BT;
    const int P = U * NB;
    const int KS = max(1, min(PK_KT / 4, nt / P));
    const int SR = pk_stride_r(H);
    const int j0 = blockIdx.x * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns
    float* const Rs = smem;                              // [G*U][SR]
    float* const hs = Rs + G * U * SR;                   // [NB*PK_BT][PK_SH]
    float* const red = hs + NB * PK_BT * PK_SH;          // [(KS-1)*G*PK_BT][P]
    const unsigned int need = 4u * (G * U * SR + NB * PK_BT * PK_SH + (KS - 1) * G * PK_BT * P);
    if ((long long)gridDim.x * U < H || nt < P || dynamic_smem_bytes() < need) __trap();

    // R slice, once: row q*U + jj holds R[q*H + j0 + jj, :], zeros past H and past Ub.
    for (int e = tid; e < G * U * SR; e += nt) {
        const int row = e / SR, k = e - row * SR;
        const int q = row / U, jj = row - q * U;
        Rs[e] = (jj < Ub && k < H) ? w[((long long)q * H + j0 + jj) * ldw + k] : 0.f;
    }
    // h tile rows >= B are never loaded: zero them once.
    for (int e = tid; e < NB * PK_BT * PK_SH; e += nt) hs[e] = 0.f;

    const int p = tid % P, g = tid / P;
    const bool computes = g < KS;
    const int jj = p / NB, bg = p - jj * NB;

    for (int t = 0; t < T; ++t) {
        const float* const ht = h + (long long)t * B * ldh;   // h_t: rows t*B .. t*B+B-1
        float acc[G][PK_BT];
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int i = 0; i < PK_BT; ++i) acc[q][i] = 0.f;

        for (int k0 = 0; k0 < H; k0 += PK_KT) {
            __syncthreads();   // the previous tile is consumed
            for (int e = tid; e < B * PK_KT; e += nt) {
                const int b = e / PK_KT, kk = e - b * PK_KT;
                hs[b * PK_SH + kk] = (k0 + kk < H) ? __ldcg(ht + (long long)b * ldh + k0 + kk)
                                                    : 0.f;
            }
            __syncthreads();
            if (computes) {
                const int chunks = min(PK_KT / 4, (H - k0 + 3) / 4);
                for (int cc = g; cc < chunks; cc += KS) {
                    float4 hv[PK_BT];
#pragma unroll
                    for (int i = 0; i < PK_BT; ++i)
                        hv[i] = *reinterpret_cast<const float4*>(hs + (bg + i * NB) * PK_SH + 4 * cc);
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
        if (computes && g == 0 && jj < Ub) {
            for (int g2 = 1; g2 < KS; ++g2) {
#pragma unroll
                for (int q = 0; q < G; ++q)
#pragma unroll
                    for (int i = 0; i < PK_BT; ++i)
                        acc[q][i] += red[(((g2 - 1) * G + q) * PK_BT + i) * P + p];
            }
            const long long j = j0 + jj;
#pragma unroll
            for (int i = 0; i < PK_BT; ++i) {
                const int b = bg + i * NB;
                if (b >= B) continue;
                const long long row = (long long)t * B + b;   // step t, batch b
                const float* const x = gx + row * ldgx;
                const float* const bwb = bw + b * ldbw;
                const float* const brb = br + b * ldbr;
                // ((gx + bw) + gh) + br at column k: the fused kernels' order
                auto pre = [&](int q) {
                    const long long k = q * (long long)H + j;
                    return ((x[k] + bwb[k]) + acc[q][i]) + brb[k];
                };
                float* const hn_out = h + (row + B) * ldh + j;   // h_{t+1}[b, j]
                if constexpr (CELL == CELL_LSTM) {
                    const float pre_i = pre(0), pre_f = pre(1), pre_g = pre(2), pre_o = pre(3);
                    const float cp = c[row * ldc + j];
                    const float ig = sigmoidf(pre_i), fg = sigmoidf(pre_f);
                    const float gg = tanhf(pre_g), og = sigmoidf(pre_o);
                    const float cn = fg * cp + ig * gg;
                    c[(row + B) * ldc + j] = cn;
                    __stcg(hn_out, og * tanhf(cn));
                    float* const a = act + row * ldact + j;
                    a[0] = ig;
                    a[H] = fg;
                    a[2 * (long long)H] = gg;
                    a[3 * (long long)H] = og;
                } else if constexpr (CELL == CELL_GRU) {
                    const float pre_r = pre(0), pre_z = pre(1);
                    const long long kn = 2 * (long long)H + j;
                    const float xn = x[kn] + bwb[kn];
                    const float hn = acc[2][i] + brb[kn];
                    const float hp = __ldcg(h + row * ldh + j);
                    const float r = sigmoidf(pre_r), z = sigmoidf(pre_z);
                    const float n = tanhf(xn + r * hn);
                    __stcg(hn_out, n + z * (hp - n));
                    float* const a = act + row * ldact + j;
                    a[0] = r;
                    a[H] = z;
                    a[2 * (long long)H] = n;
                    a[3 * (long long)H] = hn;
                } else if constexpr (CELL == CELL_RNN_TANH) {
                    __stcg(hn_out, tanhf(pre(0)));
                } else {
                    const float v = pre(0);
                    __stcg(hn_out, v < 0.f ? 0.f : v);   // NaN stays NaN, as rnn_relu_fwd
                }
            }
        }
        if (t + 1 < T) grid_barrier(sync, (unsigned int)(t + 1) * gridDim.x);
    }
    grid_exit(sync);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block) {
    persistent_fwd<4, CELL_LSTM>(rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx, w_hh,
                                 ldw_hh, bw, ldbw, br, ldbr, T, units_per_block);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block) {
    persistent_fwd<3, CELL_GRU>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx, ldgx,
                                w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block) {
    persistent_fwd<1, CELL_RNN_TANH>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx,
                                     ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                     units_per_block);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block) {
    persistent_fwd<1, CELL_RNN_RELU>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx,
                                     ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                     units_per_block);
}
