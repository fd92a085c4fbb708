/*
 * persistent_regs.cu: the register-resident cluster kernels (forward) for small hidden
 * sizes (H <= RG_K = 128). ONE launch runs ALL T steps of ONE layer (or one input chunk of
 * them) in thread-block clusters of PK_CLUSTER = 8 blocks, as the cluster kernels of
 * persistent.cu do (each cluster holds all of R and runs its own slice of the batch, h_{t+1}
 * pushed into every block's shared memory, the hardware cluster barrier between steps), but R
 * lives in REGISTERS, split over the 32 lanes of a warp by k, and a gate sum is a warp
 * butterfly reduce-scatter (shuffles) instead of partial sums in shared memory and a
 * __syncthreads. Design and latency budget: docs/kernels.md ("The register-resident cluster
 * kernels"); host side: rnnrt/kernels/regs.py (fit, lane map), emulate_regs.py (NumPy cut).
 *
 * Variants: one template regs_fwd<G, CELL, UW, BB, TS, TF32> per cell, dispatched at run time
 *   on UW (units a warp: 1 or 2) and BB (batches a group: 2, 4 or 8) (regs_dispatch); an
 *   entry point `*_persistent_regs_fwd` a cell (fp32, sm_90+) and its typed instantiation
 *   `*_persistent_regs_fwd_t<TS, TF32>` (bottom of the file; TS the storage of h: float, bf16,
 *   fp16; TF32: operands TF32-rounded; the rule of persistent.cu's typed kernels: R and h
 *   rounded as the rungs' GEMMs read them, h stored rounded to TS, all else fp32).
 *   Compile-time: RG_* below.
 *
 * Calling convention: exactly the cluster kernels' (persistent.cu's header; registry entries
 *   have persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile)
 *   sync is not touched; units_per_block U >= ceil(H / PK_CLUSTER); k_tile must be RG_K (the
 *   columns the 32 lanes cover, 4 each); the block is NW = threads / 32 warps with UW =
 *   ceil(U / NW) <= 2 units a warp.
 *
 * Kernels (fp32 shown: the typed ones take h as a TS*; per step t = 0..T-1, for every (b, j):
 *   the cluster kernels' arithmetic, ((gx + bw) + gh) + br, sigmoidf / tanhf, GRU's n gate; only the
 *   order of gh's sum over k differs: lane partials over 4 k's, then a butterfly tree):
 *   kernel lstm_persistent_regs_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    i, f, g, o after activation, for the backward pass
 *     out sync   [1, 2]        not used
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               RG_K
 *   kernel gru_persistent_regs_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out act    [T, B, 4H]    r, z, n, hn (columns 0, H, 2H, 3H)
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_regs_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_regs_fwd(rows = B, cols = H)
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
 * Resources: __launch_bounds__(RG_MAX_THREADS = 512, 1): at most 128 registers a thread
 *   (rnnrt.kernels.regs.NVCC_REGS: nvcc 13.0's counts, no spills). Dynamic shared memory:
 *   the two h buffers only, 2 x BGP x RG_K floats (BGP: the cluster's batches rounded up to
 *   a multiple of BB), e.g. 32 KiB at 32 batches a cluster.
 */
#include "persistent_layer.cuh"
// RG_K, rg_pow2, rg_log2, the butterfly reduce-scatter (shared with the backward)
#include "regs_common.cuh"

#define RG_BB_MAX 8         // most batches a group (the lanes' partial sums: RP x BB <= 32)
#define RG_NR_MAX 4         // most groups whose sums one pointwise round gathers
#define RG_CPL 2            // most pointwise cells a lane a step
#define RG_MAX_THREADS 512  // __launch_bounds__; the fit takes 256 or 512

// One batch group's gate sums: the lane's rows (r: ROWS float4s, its k-slice) times its
// slice of BB rows of h_t (hrow: the group's first row, RG_K floats a row), padded to RP rows
// of values (value row * BB + bb), reduce-scattered: the lane's complete sum.
template <int ROWS, int BB>
__device__ __forceinline__ float rg_group(const float4 (&r)[ROWS], const float* hrow,
                                          int lane) {
    constexpr int RP = rg_pow2(ROWS);
    float4 hv[BB];
#pragma unroll
    for (int bb = 0; bb < BB; ++bb) hv[bb] = pk_lds128(pk_smem_addr(hrow + bb * RG_K + 4 * lane));
    float v[32];
#pragma unroll
    for (int row = 0; row < RP; ++row)
#pragma unroll
        for (int bb = 0; bb < BB; ++bb) {
            float a = 0.f;
            if (row < ROWS) {
                a = r[row].x * hv[bb].x;
                a = fmaf(r[row].y, hv[bb].y, a);
                a = fmaf(r[row].z, hv[bb].z, a);
                a = fmaf(r[row].w, hv[bb].w, a);
            }
            v[row * BB + bb] = a;
        }
    return rg_reduce_scatter<RP * BB, 16>(v, lane);
}

// The body: rank `rank` of a cluster whose batches are [b_off, b_off + B) of Bfull (the
// layout sized for BG). Warp w owns block-local units [w*UW, w*UW + UW) with all G gate rows
// (row q*UW + u); lane l holds their columns [4l, 4l + 4) (zeros past H and past the block's
// units). A step runs the batch groups (BB batches each) in rounds of NR groups: each group's
// sums reduce-scattered (one per lane), then gathered by shuffles to the lane that updates
// the cell: lane = gi*C + u*BB + bb (C = UW*BB cells a group, gi the round's group) reads gate
// q from lane ((q*UW + u)*BB + bb) << SH of group gi's sums.
template <int G, int CELL, int UW, int BB, class TS, bool TF32>
__device__ __forceinline__ void regs_fwd(int Bfull, int H, TS* h, long long ldh, float* c,
                                         long long ldc, float* act, long long ldact,
                                         const float* gx, long long ldgx, const float* w,
                                         long long ldw, const float* bw, long long ldbw,
                                         const float* br, long long ldbr, int T, int U,
                                         int B, int BG, int rank) {
    constexpr int ROWS = G * UW, N = rg_pow2(ROWS) * BB, SH = 5 - rg_log2(N);
    constexpr int C = UW * BB, NR = (32 / C < RG_NR_MAX) ? 32 / C : RG_NR_MAX;
    static_assert(N <= 32, "a group's values exceed the warp");
    float* const hs = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int S = Bfull;   // rows of a step in every time-major array
    const int NGRP = (B + BB - 1) / BB, NCH = (NGRP + NR - 1) / NR;
    const int BGP = ((BG + BB - 1) / BB) * BB;   // rows of an h buffer
    const int j0 = rank * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns

    // R: the lane's k-slice of its warp's rows, once, into registers
    float4 r[ROWS];
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
        for (int u = 0; u < UW; ++u) {
            const int jl = warp * UW + u, k = 4 * lane;
            const float* const p = w + ((long long)q * H + j0 + jl) * ldw + k;
            float e[4];
#pragma unroll
            for (int x = 0; x < 4; ++x)
                e[x] = (jl < Ub && k + x < H) ? pk_operand<TS, TF32>(__ldg(p + x)) : 0.f;
            r[q * UW + u] = make_float4(e[0], e[1], e[2], e[3]);
        }

    // The lane's pointwise cells: cell i (i < NCH) is unit j of batch (i*NR + gi)*BB + cbb.
    const int gi = lane / C, cc = lane % C, cu = cc / BB, cbb = cc % BB;
    const int j = j0 + warp * UW + cu;
    const bool lane_live = gi < NR && warp * UW + cu < Ub;
    int src[G];   // the lanes holding the cell's gate sums
#pragma unroll
    for (int q = 0; q < G; ++q) src[q] = ((q * UW + cu) * BB + cbb) << SH;
    auto cell_b = [&](int i) { return (i * NR + gi) * BB + cbb; };
    auto live = [&](int i) { return lane_live && i < NCH && cell_b(i) < B; };
    float xg[G][RG_CPL], bwv[G][RG_CPL], brv[G][RG_CPL], carry[RG_CPL];
    auto prefetch = [&](int t) {
#pragma unroll
        for (int i = 0; i < RG_CPL; ++i) {
            const bool lv = live(i);
            const float* const x = gx + ((long long)t * S + cell_b(i)) * ldgx + j;
#pragma unroll
            for (int q = 0; q < G; ++q) xg[q][i] = lv ? __ldcs(x + q * (long long)H) : 0.f;
        }
    };
#pragma unroll
    for (int i = 0; i < RG_CPL; ++i) {
        const bool lv = live(i);
        const int b = cell_b(i);
#pragma unroll
        for (int q = 0; q < G; ++q) {
            bwv[q][i] = lv ? __ldg(bw + b * ldbw + j + q * (long long)H) : 0.f;
            brv[q][i] = lv ? __ldg(br + b * ldbr + j + q * (long long)H) : 0.f;
        }
        carry[i] = 0.f;
        if constexpr (CELL == CELL_LSTM) {
            if (lv) carry[i] = c[b * ldc + j];
        } else if constexpr (CELL == CELL_GRU) {
            if (lv) carry[i] = to_f(h[b * ldh + j]);
        }
    }
    prefetch(0);

    // h_0 of the cluster's batches into buffer 0; zeros everywhere else (columns past H,
    // rows past B: the lanes and the padded batches of the last group read them)
    for (int e = tid; e < 2 * BGP * RG_K; e += nt) {
        const int buf = e / (BGP * RG_K), rr = e - buf * BGP * RG_K;
        const int b = rr / RG_K, k = rr - b * RG_K;
        hs[e] = (buf == 0 && b < B && k < H) ? pk_operand<TS, TF32>(to_f(h[b * ldh + k])) : 0.f;
    }
    pk_cluster_sync();   // every block of the cluster runs (and has its h_0) before any push

    for (int t = 0; t < T; ++t) {
        const float* const hcur = hs + (t & 1) * BGP * RG_K;
        float* const hnext = hs + ((t + 1) & 1) * BGP * RG_K;
        float keep_h[RG_CPL] = {}, keep_c[RG_CPL] = {}, keep_a[4][RG_CPL] = {};
#pragma unroll
        for (int i = 0; i < RG_CPL; ++i) {
            if (i >= NCH) break;   // warp-uniform
            float sums[NR];
#pragma unroll
            for (int g2 = 0; g2 < NR; ++g2) {
                const int g = i * NR + g2;
                sums[g2] = 0.f;
                if (g < NGRP && !(PK_TIMING & 2))   // warp-uniform: every lane shuffles
                    sums[g2] = rg_group<ROWS, BB>(r, hcur + g * BB * RG_K, lane);
            }
            float s[G], xb[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                float v = 0.f;
#pragma unroll
                for (int g2 = 0; g2 < NR; ++g2) {
                    const float x = __shfl_sync(0xffffffffu, sums[g2], src[q]);
                    if (g2 == gi) v = x;
                }
                // ((gx + bw) + gh) + br, the fused kernels' order (GRU's n gate: gh_n + br_n)
                xb[q] = xg[q][i] + bwv[q][i];
                s[q] = (CELL == CELL_GRU && q == 2) ? v + brv[q][i] : (xb[q] + v) + brv[q][i];
            }
            if (!live(i) || (PK_TIMING & 8)) continue;
            const float hv = pk_cell_update<G, CELL, TS>(s, xb, carry[i], keep_c[i],
                                                         keep_a[0][i], keep_a[1][i],
                                                         keep_a[2][i], keep_a[3][i]);
            keep_h[i] = hv;
            if (!(PK_TIMING & 1)) {   // h_{t+1}[b, j] into every block's next buffer
                const pk_saddr a = pk_smem_addr(hnext + cell_b(i) * RG_K + j);
                const float hop = pk_operand<TS, TF32>(hv);   // as the product reads h_{t+1}
#pragma unroll
                for (int rk = 0; rk < PK_CLUSTER; ++rk) pk_st_cluster(a, (unsigned int)rk, hop);
            }
        }
        // The step's global stores and the next step's gx loads go between the arrive and
        // the wait (the cluster kernel's reason: the arrive's release waits for every memory
        // access in flight, and nothing in the launch reads these stores back).
        auto store_cells = [&]() {
#pragma unroll
            for (int i = 0; i < RG_CPL; ++i) {
                if (!live(i) || (PK_TIMING & 8)) continue;
                const long long row = (long long)t * S + cell_b(i);   // step t, batch b
                if constexpr (CELL == CELL_LSTM) c[(row + S) * ldc + j] = keep_c[i];
                if constexpr (CELL == CELL_LSTM || CELL == CELL_GRU)
                    store_gates(act + row * ldact + j, H, keep_a[0][i], keep_a[1][i],
                                keep_a[2][i], keep_a[3][i]);
                pk_stcg(h + (row + S) * ldh + j, keep_h[i]);   // h_{t+1}[b, j], rounded to TS
            }
        };
        // After every step, the last too (the cluster kernel's argument): the pushes are in
        // every buffer before step t+1 reads them, buffer t & 1 is read everywhere before
        // step t+1 pushes into it, and no block exits while another may push into it.
        if (PK_TIMING & 4) {   // timing only: no cluster barrier a step
            if (t + 1 < T) prefetch(t + 1);
            store_cells();
            __syncthreads();
        } else {
            pk_cluster_arrive();
            if (t + 1 < T) prefetch(t + 1);
            store_cells();
            pk_cluster_wait();
        }
    }
    if (PK_TIMING & 4) pk_cluster_sync();   // timing only: no exit before the pushes
}

// The launch's geometry checked against its arguments, then the body of its (UW, BB).
template <int G, int CELL, class TS = float, bool TF32 = false>
__device__ __forceinline__ void regs_dispatch(int Bfull, int H, TS* h, long long ldh,
                                              float* c, long long ldc, float* act,
                                              long long ldact, const float* gx,
                                              long long ldgx, const float* w, long long ldw,
                                              const float* bw, long long ldbw,
                                              const float* br, long long ldbr, int T, int U,
                                              int KT) {
    const int nt = blockDim.x, NW = nt / 32;
    if (U < 1 || Bfull < 1 || H < 1 || H > RG_K || KT != RG_K || nt % 32 != 0 || NW < 1 ||
        (long long)PK_CLUSTER * U < H)
        __trap();
    const int UW = (U + NW - 1) / NW;
    const int rank = (int)pk_cluster_rank(), ncl = (int)pk_clusters();
    const int BG = (Bfull + ncl - 1) / ncl, b_off = (int)pk_cluster_id() * BG;
    const int B = min(BG, Bfull - b_off);
    const int RP = pk_pow2ceil(G * UW);
    const int BB = max(2, min(min(RG_BB_MAX, 32 / RP), pk_pow2ceil(BG)));
    const int NR = min(32 / (UW * BB), RG_NR_MAX);
    const int NCH = ((BG + BB - 1) / BB + NR - 1) / NR;
    const long long need = 4LL * 2 * ((BG + BB - 1) / BB) * BB * RG_K;
    if (B < 1 || UW > 2 || NCH > RG_CPL || (long long)dynamic_smem_bytes() < need) __trap();
    h += b_off * ldh;   // row b of step t of every array is now row t*S + b
    if (c) c += b_off * ldc;
    if (act) act += b_off * ldact;
    gx += b_off * ldgx;
    bw += b_off * ldbw;
    br += b_off * ldbr;
#define RG_BODY(uw, bb)                                                                      \
    if constexpr (rg_pow2(G * uw) * bb <= 32) {                                              \
        if (UW == uw && BB == bb) {                                                          \
            regs_fwd<G, CELL, uw, bb, TS, TF32>(Bfull, H, h, ldh, c, ldc, act, ldact, gx,     \
                                                ldgx, w, ldw, bw, ldbw, br, ldbr, T, U, B, BG, \
                                                rank);                                       \
            return;                                                                          \
        }                                                                                    \
    }
    RG_BODY(1, 2) RG_BODY(1, 4) RG_BODY(1, 8) RG_BODY(2, 2) RG_BODY(2, 4) RG_BODY(2, 8)
#undef RG_BODY
    __trap();   // no body for this (UW, BB): the fit never asks for one
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// The fp32 kernels (extern "C"), left out of a module compiled for the typed instantiations
// only (-DRNNRT_TYPED_ONLY: rnnrt/kernels/library.py get_persistent, as persistent.cu's).
#ifndef RNNRT_TYPED_ONLY
extern "C" __global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_regs_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    regs_dispatch<4, CELL_LSTM>(rows, cols, h, ldh, c, ldc, act, ldact, gx, ldgx, w_hh, ldw_hh,
                                bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_regs_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    regs_dispatch<3, CELL_GRU>(rows, cols, h, ldh, nullptr, 0, act, ldact, gx, ldgx, w_hh,
                               ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_regs_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    regs_dispatch<1, CELL_RNN_TANH>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx, w_hh,
                                    ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_regs_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    regs_dispatch<1, CELL_RNN_RELU>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx, w_hh,
                                    ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}
#endif  // RNNRT_TYPED_ONLY

// The typed instantiations (NVRTC name expressions, rnnrt/kernels/typed.py
// persistent_expression): `K_t<TS, TF32>` for each kernel K above, TS the element type of h
// (float, bf16, fp16), TF32 whether the product reads its operands TF32-rounded; the same
// arguments as K with h a TS*. K_t<float, false> compiles to K's PTX (a test holds it).
template <class TS, bool TF32>
__global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_regs_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    regs_dispatch<4, CELL_LSTM, TS, TF32>(rows, cols, h, ldh, c, ldc, act, ldact, gx, ldgx,
                                          w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                          k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_regs_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    regs_dispatch<3, CELL_GRU, TS, TF32>(rows, cols, h, ldh, nullptr, 0, act, ldact, gx, ldgx,
                                         w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                         k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_regs_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    regs_dispatch<1, CELL_RNN_TANH, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx,
                                              ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                              units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(RG_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_regs_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    regs_dispatch<1, CELL_RNN_RELU, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx,
                                              ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                              units_per_block, k_tile);
}
#endif
