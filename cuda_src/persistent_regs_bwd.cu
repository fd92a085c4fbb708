/*
 * persistent_regs_bwd.cu: the register-resident cluster BACKWARD kernels (fp32) for small
 * hidden sizes (H <= RG_K = 128), the twin of persistent_regs.cu's forward. ONE launch runs
 * the recurrent chain of ONE layer's backward over ALL T steps of it (or one chunk of them),
 * last step first, in thread-block clusters of PK_CLUSTER = 8 blocks as the cluster backward
 * kernels of persistent_bwd.cu do (each cluster all of R^T and its own batch slice; block
 * rank r owns hidden units [r*U, r*U + U); each block pushes its cells' dg_t into every
 * block's shared memory; the hardware cluster barrier a step), but R^T lives in REGISTERS,
 * split over the 32 lanes of a warp by k (lane l: 4G of the G*H rows of R, its warp's
 * units' columns; dg gate-interleaved in shared memory, below), and dh_rec = dg_{t+1} R is
 * a warp butterfly reduce-scatter (regs_common.cuh) instead of k-group partial sums in
 * shared memory and a __syncthreads. The pointwise backward is cell_bwd.cuh's, as
 * persistent_bwd.cuh calls it.
 * What is not recurrent (dx, dW, dR, the biases) stays the GEMMs after the launch
 * (plan/backward_persistent.py). Design and latency budget: docs/kernels.md ("The
 * register-resident cluster backward"); host side: rnnrt/kernels/regs_bwd.py (fit, lane
 * map), emulate_regs.py (NumPy cut).
 *
 * Variants: one template regs_bwd<G, CELL, UW, BB> per cell, dispatched at run time on
 *   UW (units a warp: 1 or 2) and BB (batches a group: 2, 4 or 8) (regs_bwd_dispatch);
 *   a single entry point `*_persistent_regs_bwd` a cell (sm_90+). Compile-time: RB_* below.
 *
 * Calling convention: exactly the cluster backward kernels' (persistent_bwd.cu's header;
 *   registry entries have persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile)
 *   sync is not touched; units_per_block U >= ceil(H / PK_CLUSTER); k_tile must be RG_K (the
 *   units a dg row's 32 lanes cover: G*RG_K elements, 4G a lane); the block is NW =
 *   threads / 32 warps with UW = ceil(U / NW) <= 2 units a warp.
 *
 * Kernels (one variant each, fp32; per step t = T-1 .. 0 for every (b, j): the cluster
 *   backward's arithmetic -- cell_bwd.cuh's pointwise on dh = dh_above + dh_rec, dh_rec =
 *   sum over the G*H gate rows r of dg_{t+1}[b, r] R[r, j] (+ the GRU's direct part dh*z
 *   after the sum), dh0 = dh_rec after step 0 -- only the order of the sum over r differs:
 *   lane partials over its 4G rows (its chunks of the gate-interleaved row, in order), then a
 *   butterfly tree):
 *   kernel lstm_persistent_regs_bwd(rows = B, cols = H)
 *     out dgx    [T*B, 4H]     gradient of the gate pre-activations i, f, g, o, every step
 *     out dh0    [B, H]        gradient of h0
 *     out dc0    [B, H]        gradient of c0
 *     out sync   [1, 2]        not used
 *     in  dhin   [T*B, H]      gradient of h_{t+1} from above
 *     in  dh_n   [B, H]        gradient of h_T
 *     in  dc_n   [B, H]        gradient of c_T
 *     in  act    [T*B, 4H]     the forward's i, f, g, o after activation
 *     in  c      [(T+1)*B, H]  the forward's cell states, c[0] = c0
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     int T                    steps (>= 1)
 *     int units_per_block      U: rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               RG_K
 *   kernel gru_persistent_regs_bwd(rows = B, cols = H)
 *     out dgx    [T*B, 3H]     gradient of W x_t + b_ih, blocks r, z, n
 *     out dgh    [T*B, 3H]     gradient of R h_{t-1} + b_hh (what multiplies R)
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  act    [T*B, 4H]     r, z, n, hn
 *     in  h      [(T+1)*B, H]  the forward's hidden states, h[0] = h0
 *     in  w_hh   [3H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_regs_bwd(rows = B, cols = H)
 *     out dgx    [T*B, H]
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  h      [(T+1)*B, H]
 *     in  w_hh   [H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_regs_bwd(rows = B, cols = H)
 *     out dgx    [T*B, H]
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  h      [(T+1)*B, H]
 *     in  w_hh   [H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *
 * Resources: __launch_bounds__(RB_MAX_THREADS = 256, 1): up to 255 registers a thread
 *   (rnnrt.kernels.regs_bwd.NVCC_REGS: nvcc 13.0's counts, no spills). Dynamic shared memory:
 *   the two dg buffers only, 2 x BGP x G x RG_K floats (BGP: the cluster's batches rounded up
 *   to a multiple of BB; a row gate-interleaved: element j*G + q), e.g. 128 KiB for the LSTM
 *   at 32 batches a cluster.
 */
// pk_bwd_cell_inputs (a step's inputs of a cell) and, through it, persistent_layer.cuh and
// cell_bwd.cuh (the pointwise backward: the fused kernels' arithmetic)
#include "persistent_bwd.cuh"
// RG_K, rg_pow2, rg_log2, the butterfly reduce-scatter (the forward's)
#include "regs_common.cuh"

#define RB_BB_MAX 8         // most batches a group (a lane's values: UW x BB <= 32)
#define RB_CPL 2            // most pointwise cells a lane a step (rounds of NR groups)
#define RB_MAX_THREADS 256  // __launch_bounds__: up to 255 registers; the fit takes 256

// The dg buffers hold a row of dg (G*H values, gate q of unit j at column q*H + j in global
// memory) gate-interleaved: element m = j*G + q, G*RG_K floats a row (zeros past G*H), so
// that a cell's G values lie side by side (the LSTM pushes them as one 16-byte store). Lane
// l's part of a row is its float4 chunks l + 32k, k = 0 .. G-1: elements m = 4(l + 32k) + e,
// each (j, q) = (m / G, m % G) -- consecutive lanes, consecutive 16 bytes: conflict-free.
// One batch group's dh_rec sums: the lane's rows of R^T (r: G*UW float4s, chunk k of unit u
// at k*UW + u: element e the row q*H + j of element m above, its warp's unit's column)
// times its chunks of BB rows of dg_{t+1} (drow: the group's first row), UW*BB values (value
// u*BB + bb), each a chain over the chunks (k = 0: a product and three FMAs, then four FMAs
// a chunk), reduce-scattered: the lane's complete sum of value lane >> (5 - log2(UW*BB)).
template <int G, int UW, int BB>
__device__ __forceinline__ float rb_group(const float4 (&r)[G * UW], const float* drow,
                                          int lane) {
    constexpr int KS = G * RG_K;
    float v[32];
#pragma unroll
    for (int k = 0; k < G; ++k) {
        float4 dv[BB];
#pragma unroll
        for (int bb = 0; bb < BB; ++bb)
            dv[bb] = pk_lds128(pk_smem_addr(drow + bb * KS + 4 * (lane + 32 * k)));
#pragma unroll
        for (int u = 0; u < UW; ++u)
#pragma unroll
            for (int bb = 0; bb < BB; ++bb) {
                const float4 rr = r[k * UW + u];
                float a = k == 0 ? rr.x * dv[bb].x : fmaf(rr.x, dv[bb].x, v[u * BB + bb]);
                a = fmaf(rr.y, dv[bb].y, a);
                a = fmaf(rr.z, dv[bb].z, a);
                a = fmaf(rr.w, dv[bb].w, a);
                v[u * BB + bb] = a;
            }
    }
    return rg_reduce_scatter<UW * BB, 16>(v, lane);
}

// The body: rank `rank` of a cluster whose batches are [b_off, b_off + B) of Bfull (the
// layout sized for BG; every pointer already offset to b_off). Warp w owns block-local units
// [w*UW, w*UW + UW); lane l holds their columns of R at the rows of its chunks of a dg row
// (above: rows q*H + j of elements m = j*G + q; zeros past H and past the block's units).
// A step runs the batch groups (BB batches each) in rounds of NR = 32 / (UW*BB) groups:
// after the round's reduce-scatters
// lane l holds value l >> SH of every group of the round, and it is the lane that updates
// that value's cell of group gi = l & (NR - 1): unit u, batch bb of value u*BB + bb, no
// gather. The cell's pointwise backward follows at once, and its dg_t (what multiplies R)
// is pushed into every block's other buffer.
template <int G, int CELL, int UW, int BB>
__device__ __forceinline__ void regs_bwd(int Bfull, int H, float* dgx, long long lddgx,
                                         float* dgh, long long lddgh, float* dh0,
                                         long long lddh0, float* dc0, long long lddc0,
                                         const float* dhin, long long lddhin,
                                         const float* dhn, long long lddhn, const float* dcn,
                                         long long lddcn, const float* act, long long ldact,
                                         const float* st, long long ldst, const float* w,
                                         long long ldw, int T, int U, int B, int BG, int rank) {
    constexpr int N = UW * BB, SH = 5 - rg_log2(N), NR = 32 / N, KS = G * RG_K;
    static_assert(N <= 32 && (N & (N - 1)) == 0, "a group's values: a power of two <= 32");
    float* const ds = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int S = Bfull;   // rows of a step in every time-major array
    const int NGRP = (B + BB - 1) / BB, NCH = (NGRP + NR - 1) / NR;
    const int BGP = ((BG + BB - 1) / BB) * BB;   // rows of a dg buffer
    const int j0 = rank * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns
    // what multiplies R (pushed every step): dgh for the GRU, dgx for the others
    float* const dgs = CELL == CELL_GRU ? dgh : dgx;
    const long long lds = CELL == CELL_GRU ? lddgh : lddgx;

    // R^T: the lane's rows of its warp's columns, once, into registers (a column of R is
    // strided: read once per launch)
    float4 r[G * UW];
#pragma unroll
    for (int k = 0; k < G; ++k)
#pragma unroll
        for (int u = 0; u < UW; ++u) {
            const int jl = warp * UW + u;
            float e[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int m = 4 * (lane + 32 * k) + x, jm = m / G, qm = m - jm * G;
                e[x] = (jl < Ub && jm < H)
                           ? __ldg(w + ((long long)qm * H + jm) * ldw + j0 + jl) : 0.f;
            }
            r[k * UW + u] = make_float4(e[0], e[1], e[2], e[3]);
        }

    // The lane's pointwise cells: cell i (i < NCH) is unit j of batch (i*NR + gi)*BB + cbb.
    const int cv = lane >> SH, gi = lane & (NR - 1), cu = cv / BB, cbb = cv % BB;
    const int j = j0 + warp * UW + cu;
    const bool lane_live = warp * UW + cu < Ub;
    auto cell_b = [&](int i) { return (i * NR + gi) * BB + cbb; };
    auto live = [&](int i) { return lane_live && i < NCH && cell_b(i) < B; };
    // A step's inputs of the cells, loaded a step ahead (between the previous step's arrive
    // and wait): dh_above, the saved gates, c_{t+1}, c_t (LSTM) / h_t (GRU) / h_{t+1} (RNN)
    float pdh[RB_CPL], pa[4][RB_CPL], ps1[RB_CPL], ps0[RB_CPL];
    auto prefetch = [&](int t) {
#pragma unroll
        for (int i = 0; i < RB_CPL; ++i)
            pk_bwd_cell_inputs<G, CELL>(i, live(i), (long long)t * S + cell_b(i), S, H, j, dhin,
                                        lddhin, act, ldact, st, ldst, pdh, pa, ps1, ps0);
    };
    // Carried from step to step: dh_rec (the product's sum, then the next pointwise's
    // input), dc (LSTM: dc_n, then dc_{t-1}), the GRU's direct part dh_t * z_t.
    float dhrec[RB_CPL], dcarry[RB_CPL], direct[RB_CPL];
#pragma unroll
    for (int i = 0; i < RB_CPL; ++i) {
        const bool lv = live(i);
        const int b = cell_b(i);
        dhrec[i] = lv ? __ldg(dhn + b * lddhn + j) : 0.f;
        dcarry[i] = (lv && CELL == CELL_LSTM) ? __ldg(dcn + b * lddcn + j) : 0.f;
        direct[i] = 0.f;
    }
    prefetch(T - 1);

    // zeros in both buffers (elements past G*H, rows past B: the lanes and the padded
    // batches of the last group read them; the pushes write the rest)
    for (int e = tid; e < 2 * BGP * KS; e += nt) ds[e] = 0.f;
    pk_cluster_sync();   // every block of the cluster runs (and is zeroed) before any push

    // s = 0 .. T: the product of dg_{t+1} (s > 0), then the pointwise of step t = T-1-s
    // (s < T); s = T ends with dh0.
    for (int s = 0; s <= T; ++s) {
        const int t = T - 1 - s;
        const float* const cur = ds + ((s + 1) & 1) * BGP * KS;   // dg_{t+1}: pushed last step
        float* const nxt = ds + (s & 1) * BGP * KS;               // dg_t goes here
        float keep[G][RB_CPL] = {}, keepx[3][RB_CPL] = {};
#pragma unroll
        for (int i = 0; i < RB_CPL; ++i) {
            if (i >= NCH) break;   // warp-uniform
            if (s > 0) {
                float sums[NR];
#pragma unroll
                for (int g2 = 0; g2 < NR; ++g2) {
                    const int g = i * NR + g2;
                    sums[g2] = 0.f;
                    if (g < NGRP)   // warp-uniform: every lane shuffles
                        sums[g2] = rb_group<G, UW, BB>(r, cur + g * BB * KS, lane);
                }
                float v = 0.f;
#pragma unroll
                for (int g2 = 0; g2 < NR; ++g2)
                    if (g2 == gi) v = sums[g2];
                dhrec[i] = CELL == CELL_GRU ? v + direct[i] : v;   // the GEMM, then + dh*z
            }
            if (s == T || !live(i)) continue;
            // the pointwise backward of step t at this cell: cell_bwd.cuh's functions, as
            // persistent_bwd.cuh calls them; keep: what multiplies R (dgx; the GRU's dgh),
            // keepx: the GRU's dgx
            const float dh = pdh[i] + dhrec[i];   // dh_above + dh_rec
            if constexpr (CELL == CELL_LSTM) {
                dcarry[i] = lstm_bwd_point(dh, dcarry[i], pa[0][i], pa[1][i], pa[2][i],
                                           pa[3][i], ps1[i], ps0[i],
                                           [&](int q, float x) { keep[q][i] = x; });
            } else if constexpr (CELL == CELL_GRU) {
                float gx[3], gh[3];
                gru_bwd_point(dh, pa[0][i], pa[1][i], pa[2][i], pa[3][i], ps1[i], gx, gh,
                              direct[i]);
#pragma unroll
                for (int q = 0; q < 3; ++q) {
                    keepx[q][i] = gx[q];
                    keep[q][i] = gh[q];
                }
            } else {
                keep[0][i] = rnn_bwd_point<CELL == CELL_RNN_RELU>(dh, ps1[i]);   // h_{t+1}
            }
            // dg_t[b, q*H + j] into every block's buffer s & 1, elements j*G .. j*G + G-1
            // (the LSTM's four in one 16-byte store: 8 a cell instead of 32)
            const pk_saddr a = pk_smem_addr(nxt + cell_b(i) * KS + j * G);
            if constexpr (G == 4) {
                const float4 v4 = make_float4(keep[0][i], keep[1][i], keep[2][i], keep[3][i]);
#pragma unroll
                for (int rk = 0; rk < PK_CLUSTER; ++rk)
                    pk_st_cluster4(a, (unsigned int)rk, v4);
            } else {
#pragma unroll
                for (int q = 0; q < G; ++q)
#pragma unroll
                    for (int rk = 0; rk < PK_CLUSTER; ++rk)
                        pk_st_cluster(a + 4u * q, (unsigned int)rk, keep[q][i]);
            }
        }
        if (s == T) break;
        // this step's dg to global memory (the GEMMs after the launch read them; nothing in
        // the launch does)
        auto store = [&]() {
#pragma unroll
            for (int i = 0; i < RB_CPL; ++i) {
                if (!live(i)) continue;
                const long long row = (long long)t * S + cell_b(i);
                float* const y = dgs + row * lds + j;
#pragma unroll
                for (int q = 0; q < G; ++q) __stcg(y + q * (long long)H, keep[q][i]);
                if constexpr (CELL == CELL_GRU) {
                    float* const x = dgx + row * lddgx + j;
#pragma unroll
                    for (int q = 0; q < 3; ++q) x[q * (long long)H] = keepx[q][i];
                }
            }
        };
        // After every step (the cluster backward's argument): dg_t is in every buffer
        // before any block reads it (next step), every block has read buffer (s + 1) & 1
        // before the next step pushes into it, and no block exits while another may still
        // push into it (the last pushes are step 0's, before this barrier). The global
        // stores and the next step's loads go between the arrive and the wait.
        pk_cluster_arrive();
        store();
        if (t > 0) prefetch(t - 1);
        pk_cluster_wait();
    }
#pragma unroll
    for (int i = 0; i < RB_CPL; ++i) {
        if (!live(i)) continue;
        const int b = cell_b(i);
        dh0[b * lddh0 + j] = dhrec[i];
        if constexpr (CELL == CELL_LSTM) dc0[b * lddc0 + j] = dcarry[i];
    }
}

// The launch's geometry checked against its arguments, then the body of its (UW, BB).
template <int G, int CELL>
__device__ __forceinline__ void regs_bwd_dispatch(
        int Bfull, int H, float* dgx, long long lddgx, float* dgh, long long lddgh, float* dh0,
        long long lddh0, float* dc0, long long lddc0, const float* dhin, long long lddhin,
        const float* dhn, long long lddhn, const float* dcn, long long lddcn, const float* act,
        long long ldact, const float* st, long long ldst, const float* w, long long ldw, int T,
        int U, int KT) {
    const int nt = blockDim.x, NW = nt / 32;
    if (U < 1 || Bfull < 1 || H < 1 || T < 1 || H > RG_K || KT != RG_K || nt % 32 != 0 ||
        NW < 1 || (long long)PK_CLUSTER * U < H)
        __trap();
    const int UW = (U + NW - 1) / NW;
    const int rank = (int)pk_cluster_rank(), ncl = (int)pk_clusters();
    const int BG = (Bfull + ncl - 1) / ncl, b_off = (int)pk_cluster_id() * BG;
    const int B = min(BG, Bfull - b_off);
    const int BB = max(2, min(min(RB_BB_MAX, 32 / UW), pk_pow2ceil(BG)));
    const int NR = 32 / (UW * BB);
    const int NCH = ((BG + BB - 1) / BB + NR - 1) / NR;
    const long long need = 4LL * 2 * ((BG + BB - 1) / BB) * BB * G * RG_K;
    if (B < 1 || UW > 2 || NCH > RB_CPL || (long long)dynamic_smem_bytes() < need) __trap();
    // row b of step t of every time-major array is now row t*S + b (the slice's b)
    dgx += b_off * lddgx;
    if (dgh) dgh += b_off * lddgh;
    dh0 += b_off * lddh0;
    if (dc0) dc0 += b_off * lddc0;
    dhin += b_off * lddhin;
    dhn += b_off * lddhn;
    if (dcn) dcn += b_off * lddcn;
    if (act) act += b_off * ldact;
    st += b_off * ldst;
#define RB_BODY(uw, bb)                                                                      \
    if (UW == uw && BB == bb) {                                                              \
        regs_bwd<G, CELL, uw, bb>(Bfull, H, dgx, lddgx, dgh, lddgh, dh0, lddh0, dc0, lddc0,  \
                                  dhin, lddhin, dhn, lddhn, dcn, lddcn, act, ldact, st, ldst, \
                                  w, ldw, T, U, B, BG, rank);                                \
        return;                                                                              \
    }
    RB_BODY(1, 2) RB_BODY(1, 4) RB_BODY(1, 8) RB_BODY(2, 2) RB_BODY(2, 4) RB_BODY(2, 8)
#undef RB_BODY
    __trap();   // no body for this (UW, BB): the fit never asks for one
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
extern "C" __global__ void __launch_bounds__(RB_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_regs_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, float* dc0, int lddc0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* dc_n, int lddc_n, const float* act, int ldact, const float* c,
        int ldc, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    regs_bwd_dispatch<4, CELL_LSTM>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, dc0, lddc0,
                                    dhin, lddhin, dh_n, lddh_n, dc_n, lddc_n, act, ldact, c,
                                    ldc, w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(RB_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_regs_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dgh, int lddgh, float* dh0, int lddh0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* act, int ldact, const float* h, int ldh, const float* w_hh,
        int ldw_hh, int T, int units_per_block, int k_tile) {
    regs_bwd_dispatch<3, CELL_GRU>(rows, cols, dgx, lddgx, dgh, lddgh, dh0, lddh0, nullptr, 0,
                                   dhin, lddhin, dh_n, lddh_n, nullptr, 0, act, ldact, h, ldh,
                                   w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(RB_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_regs_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    regs_bwd_dispatch<1, CELL_RNN_TANH>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr,
                                        0, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0,
                                        h, ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(RB_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_regs_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    regs_bwd_dispatch<1, CELL_RNN_RELU>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr,
                                        0, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0,
                                        h, ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}
#endif
