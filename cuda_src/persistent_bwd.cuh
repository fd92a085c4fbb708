/*
 * persistent_bwd.cuh: the body of the per-layer persistent backward kernels,
 * persistent_bwd<G, CELL, CL, TS, TF32, MMA> (one layer's recurrent chain over all T steps,
 * last first). #included by persistent_bwd.cu (the FMA grid and cluster kernels, fp32 and
 * typed) and persistent_mma_bwd.cu (the tensor-core grid kernels, MMA, bf16 / fp16), whose
 * headers document the kernels, their arguments and variants; rnnrt's loader inlines it.
 * No kernels of its own. Design: docs/kernels.md ("The persistent backward kernels", "The
 * tensor-core backward grid kernel").
 */
#ifndef RNNRT_PERSISTENT_BWD_CUH
#define RNNRT_PERSISTENT_BWD_CUH

#include "persistent_layer.cuh"
// the pointwise backward: the fused kernels' (lstm.cu, gru.cu, rnn.cu) arithmetic
#include "cell_bwd.cuh"

// One pointwise cell's inputs of a backward step, slot i of the step's arrays (row: its
// time-major row t*S + b, S rows a step; j its hidden unit): dh_above, the saved gates
// (LSTM, GRU), and c_{t+1}, c_t (LSTM) / h_t (GRU) / h_{t+1} (RNN) as s1, s0; zeros where
// not live. The persistent backward kernels load them a step ahead (persistent_bwd below,
// persistent_regs_bwd.cu); st is the forward's c (fp32) or h (TS).
template <int G, int CELL, int N, class TST>
__device__ __forceinline__ void pk_bwd_cell_inputs(
        int i, bool live, long long row, long long S, int H, int j, const float* dhin,
        long long lddhin, const float* act, long long ldact, const TST* st, long long ldst,
        float (&pdh)[N], float (&pa)[4][N], float (&ps1)[N], float (&ps0)[N]) {
    pdh[i] = live ? __ldcs(dhin + row * lddhin + j) : 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q)
        pa[q][i] = (live && G > 1) ? __ldcs(act + row * ldact + q * (long long)H + j) : 0.f;
    // LSTM: c[t+1], c[t]; GRU: h[t]; RNN: h[t+1]
    const long long r1 = CELL == CELL_GRU ? row : row + S;
    ps1[i] = live ? pk_ldcs(st + r1 * ldst + j) : 0.f;
    ps0[i] = (live && CELL == CELL_LSTM) ? pk_ldcs(st + row * ldst + j) : 0.f;
}

// One block of the backward: it owns hidden units [j0, j0 + U) and holds the U rows of R^T
// (columns j0.. of R, all G*H gate rows: M = U rows of length K = G*H) in shared memory. A
// step multiplies that slice by dg_{t+1} [B, K] into the k-groups' partial sums; after one
// __syncthreads each thread sums its cells' partials in k-group order (dh_rec), runs the
// cell's pointwise backward on them and writes dg_t at its cells.
// CL = 0, the grid kernel: dg_{t+1} is staged from L2 in tiles of KT columns (warp w staging
// and multiplying its own chunks of every tile, two halves ping-ponged across the tiles, as
// the forward grid kernel stages h_t), and the grid barrier after each step makes every
// block's dg_t visible before any block stages it.
// CL = PK_CLUSTER, the cluster kernel: cluster n owns batches [n*BG, n*BG + BG) and its 8
// blocks all of R; each block pushes its cells' dg_t into buffer s & 1 of every block of the
// cluster (distributed shared memory), the cluster barrier ends the step, and the next step
// multiplies that buffer (all K columns: one tile, nothing staged).
// The product phase is the forward kernels' (persistent_layer.cuh, grid and cluster
// branches alike) written out again for one "gate": the forward kernels' code stays as it
// was measured, and anything shared would have to be called from it (tried: moving the
// forward's into a shared helper let nvcc 13.0 reorder and renumber its PTX; no test pins
// that PTX, the check was a manual one, docs/journal.md).
// TS, TF32 (persistent_common.cuh): dg is stored rounded to TS (dgx, dgh), and what the
// product reads of dg and R is rounded as the rungs' GEMMs read it (pk_operand); the state
// input st is the forward's h (TS) for GRU / RNN, its c (fp32) for the LSTM. <float, false>
// is the fp32 kernel.
// MMA (persistent_mma_bwd.cu; the grid kernel at TS bf16 / fp16 only): the product on
// tensor cores, the forward tensor-core kernel's machinery (persistent_mma.cuh) with A = the
// R^T slice [U][K] and B = dg_{t+1}^T (the staged tile [B][KT]): each warp one k-group, its
// chunks of every tile by mma.sync m16n8k16 into red[warp][ju][b]. The layout is
// pk_geom<true>'s (strides for 8-byte fragment loads); staging, barrier, pointwise phase
// and stores are the FMA path's. The operands are the typed FMA kernel's (dg stored rounded
// to TS, R rounded to TS as loaded: exact in the tensor core's input type, their products
// exact in fp32), so the math is the same up to the order of the sum over k.
// PAIR (persistent_bwd_pair.cu; the FMA grid kernel at fp32 only, clusters of 2 blocks): the
// pair (cluster ranks c = 0, 1) owns units [p*2U, p*2U + 2U), block c the pointwise of
// [p*2U + c*U, + U) as rank 2p + c of the grid kernel. Block c's product: its half of the
// K gate rows, columns [c*KH, c*KH + KC) of dg_{t+1} (KH = 4 * ceil(K / 8), KC = KH for c = 0,
// K - KH for c = 1), by the R^T rows of all 2U units of the pair (M = 2U rows of KH): the
// same FMAs a block as the grid kernel, half the staging. Then each thread sends the other
// block, for each of its cells' (b, jj), this block's half sum of the other's unit jj (the
// k-groups' partials in order) into the other's recv[e] (e = b*U + jj: distributed shared
// memory), the cluster barrier (its arrive, this block's own half sums, its wait), and each
// cell adds half 0 + half 1 (both blocks the same sum: addition commutes; the same bits every
// run). The grid barrier between the steps is the grid kernel's.
template <int G, int CELL, int CL, class TS = float, bool TF32 = false, bool MMA = false,
          bool PAIR = false>
__device__ __forceinline__ void persistent_bwd(
        int Bfull, int H, TS* dgx, long long lddgx,
        typename PkIf<true, TS, TS>::type* dgh, long long lddgh, float* dh0,
        long long lddh0, float* dc0, long long lddc0, unsigned int* sync, const float* dhin,
        long long lddhin, const float* dhn, long long lddhn, const float* dcn,
        long long lddcn, const float* act, long long ldact,
        const typename PkIf<CELL == CELL_LSTM, float, TS>::type* st, long long ldst,
        const float* w, long long ldw, int T, int U, int KT) {
    static_assert(!MMA || (CL == 0 && !TF32 && !PkRaw<TS, TF32>::v),
                  "the tensor-core backward: the grid kernel, bf16 / fp16 storage only");
    static_assert(!PAIR || (CL == 0 && !MMA), "the pair kernel: the FMA grid kernel's product");
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    if (U < 1 || Bfull < 1 || H < 1 || T < 1 || KT < 4 || KT % 4 != 0 || nt % 32 != 0)
        __trap();
    const int K = G * H;   // the product's depth: dg_t has G*H columns
    // This block's units (rank) and batch slice [b_off, b_off + B) of Bfull; BG (the batch
    // the layout is sized for) is the same in every block.
    const int S = Bfull;   // rows of a step in every time-major array
    int rank = blockIdx.x, ranks = gridDim.x, BG = Bfull, b_off = 0, B = Bfull;
    if (CL) {
        rank = (int)pk_cluster_rank();
        ranks = CL;
        BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();
        b_off = (int)pk_cluster_id() * BG;
        B = min(BG, Bfull - b_off);
        if (B < 1 || KT < K) __trap();   // an empty cluster; the cluster kernel's one tile
    }
    // PAIR: this block's cluster rank pc, its columns [kb, kb + KC) of dg, the layout's
    // depth KD = KH (both blocks alike); else all K columns
    int pc = 0, kb = 0, KC = K, KD = K;
    if constexpr (PAIR) {
        pc = (int)pk_cluster_rank();
        KD = 4 * ((K + 7) / 8);
        kb = pc * KD;
        KC = pc ? K - KD : KD;
        if (KC < 1 || (ranks & 1) || pc != (rank & 1)) __trap();   // an empty half; not pairs
    }
    // the forward's geometry with one "gate" and hidden K: M = U rows of K columns (MMA:
    // the tensor-core grid kernel's, pk_geom<true>; PAIR: M = 2U rows of KD columns)
    const PkGeom g = pk_geom<MMA>(1, PAIR ? 2 * U : U, BG, KD, KT, nt);
    const long long need = 4LL * ((long long)g.M * g.SR + (CL ? 2LL : 1LL) * BG * g.SH
                                  + (long long)g.NKG * g.M * g.BP + (PAIR ? (long long)U * BG : 0));
    if ((long long)ranks * U < H || (long long)U * BG > (long long)PK_CPT * nt ||
        (long long)dynamic_smem_bytes() < need)
        __trap();
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
    const int j0 = rank * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns
    float* const Rs = smem;                   // [U][SR]: row ju = column j0 + ju of R
    float* const hs = Rs + g.M * g.SR;        // [B][SH]: a tile of dg ([2][BG][SH] clusters)
    float* const red = hs + (CL ? 2 : 1) * BG * g.SH;   // [NKG][M][BP]
    float* const recv = red + g.NKG * g.M * g.BP;        // PAIR: [U * BG] the other's half sums
    // PAIR: the pair's first unit (row 0 of Rs) and the units of it that exist; this block's
    // own rows of the product start at row pc*U, the other block's at (1 - pc)*U
    const int r0 = j0 - pc * U;
    const int Mb = PAIR ? max(0, min(g.M, H - r0)) : Ub;
    const int lr = lane % g.LR, lb = (lane / g.LR) % g.LB, lk = lane / (g.LR * g.LB);
    const int kg = MMA ? warp : warp * g.LK + lk;
    // what multiplies R (staged or pushed every step): dgh for the GRU, dgx for the others
    TS* const dgs = CELL == CELL_GRU ? dgh : dgx;
    const long long lds = CELL == CELL_GRU ? lddgh : lddgx;
    const bool vec = PkRaw<TS, TF32>::v && KC % 4 == 0 && lds % 4 == 0 &&
                     (reinterpret_cast<unsigned long long>(dgs + kb) & 15ull) == 0;

    // The pointwise cells of this thread, as the forward: e = tid + i*nt, jj = e % U,
    // b = e / U (live: jj < Ub, b < B).
    int cell_b[PK_CPT], cell_j[PK_CPT];
    bool cell_live[PK_CPT];
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        const int e = tid + i * nt;
        const int jj = e % U;
        cell_b[i] = e / U;
        cell_j[i] = j0 + jj;
        cell_live[i] = cell_b[i] < B && jj < Ub;
    }
    // A step's inputs of the cells, loaded before the barrier that precedes the step (the
    // latency hides under the barrier and the product): dh_above, the saved gates, and
    // c_t, c_{t-1} (LSTM) / h_{t-1} (GRU) / h_t (RNN) as s1, s0.
    float pdh[PK_CPT], pa[4][PK_CPT], ps1[PK_CPT], ps0[PK_CPT];
    auto prefetch = [&](int t) {
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i)
            pk_bwd_cell_inputs<G, CELL>(i, cell_live[i], (long long)t * S + cell_b[i], S, H,
                                        cell_j[i], dhin, lddhin, act, ldact, st, ldst, pdh, pa,
                                        ps1, ps0);
    };
    // Carried from step to step in registers: dh_rec (the product's sum, then the next
    // step's input), dc (LSTM: dc_n, then dc_{t-1}), the GRU's direct part dh_t * z_t.
    float dhrec[PK_CPT], dcarry[PK_CPT], direct[PK_CPT];
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        const int b = cell_b[i], j = cell_j[i];
        const bool live = cell_live[i];
        dhrec[i] = live ? __ldg(dhn + b * lddhn + j) : 0.f;
        dcarry[i] = (live && CELL == CELL_LSTM) ? __ldg(dcn + b * lddcn + j) : 0.f;
        direct[i] = 0.f;
    }
    prefetch(T - 1);   // in flight during the copy of R^T

    // R^T slice, once: Rs[ju][r] = R[kb + r, r0 + ju], zeros past KC and past Mb (the grid
    // kernel: kb 0, KC = K, r0 = j0, Mb = Ub). Consecutive threads take consecutive units of
    // one row of R (the reads are M floats contiguous).
    for (int e = tid; e < g.M * g.SR; e += nt) {
        const int r = e / g.M, ju = e - r * g.M;
        Rs[ju * g.SR + r] = (ju < Mb && r < KC)
                                ? pk_operand<TS, TF32>(w[(long long)(kb + r) * ldw + r0 + ju])
                                : 0.f;
    }
    if (CL) {
        // zeros in both buffers' columns past K (the last float4 chunk reads them; the
        // pushes write columns < K of rows < B only, and no row >= B is read)
        for (int e = tid; e < 2 * BG * g.SH; e += nt)
            if (e % g.SH >= K) hs[e] = 0.f;
        pk_cluster_sync();   // every block of the cluster runs before any block pushes to it
    } else if (PAIR) {
        pk_cluster_sync();   // the R^T slice is read by every warp; the other block runs
    } else {
        __syncthreads();   // the R^T slice is read by every warp
    }

    // s = 0 .. T: the product of dg_{t+1} (s > 0), then the pointwise of step t = T-1-s
    // (s < T); s = T ends with dh0.
    for (int s = 0; s <= T; ++s) {
        const int t = T - 1 - s;
        if (s > 0) {
            // dg_{t+1}: the cluster kernel's buffer (s - 1) & 1, pushed last step; the grid
            // kernel stages it from L2 after the barrier
            const float* const hcur = CL ? hs + ((s - 1) & 1) * BG * g.SH : hs;
            if (!CL) grid_barrier(sync, (unsigned int)s * gridDim.x);   // dg_{t+1} complete
            const TS* const src = dgs + (long long)(t + 1) * S * lds + kb;
            // Warp w's chunks of the tile at column k0: [ca, cb), in halves [ca, cm), [cm, cb)
            auto range = [&](int k0, int& ca, int& cm, int& cb) {
                const int CH = min(KT / 4, (KC - k0 + 3) / 4);   // float4 chunks of this tile
                ca = min(CH, warp * g.CPW);
                cb = min(CH, ca + g.CPW);
                cm = ca + (cb - ca + 1) / 2;
            };
            int ca, cm, cb;
            range(0, ca, cm, cb);
            if (!CL) {
                pk_stage<TS, TF32>(hs, g.SH, src, lds, B, KC, 0, ca, cm, vec, lane);
                pk_cp_commit();
                pk_stage<TS, TF32>(hs, g.SH, src, lds, B, KC, 0, cm, cb, vec, lane);
                pk_cp_commit();
            }
            // as the forward kernels: one output tile keeps its sums in registers over all
            // tiles, several add each half's sums into red (the cluster kernel's one tile:
            // both halves into registers, stored once); MMA: one group of register tiles
            // (U <= 16 PK_MMA_MT units, B <= 8 PK_MMA_NT batches) likewise
            const bool one_tile = MMA ? g.RT <= PK_MMA_MT && g.BT <= PK_MMA_NT
                                      : g.RT * g.BT == 1;
            float acc1[PK_TM][PK_TB];
#pragma unroll
            for (int i = 0; i < PK_TM; ++i)
#pragma unroll
                for (int jb = 0; jb < PK_TB; ++jb) acc1[i][jb] = 0.f;
            float macc[PK_MMA_MT][PK_MMA_NT][4];
            if constexpr (MMA) pk_mma_zero(macc);
            auto tile_sums = [&](int k0, int c0, int c1, int c2, int c3, bool first) {
                for (int rt = 0; rt < g.RT; ++rt)
                    for (int bt = 0; bt < g.BT; ++bt) {
                        const int r0 = rt * PK_TM * g.LR + lr, b0 = bt * PK_TB * g.LB + lb;
                        float acc[PK_TM][PK_TB];
#pragma unroll
                        for (int i = 0; i < PK_TM; ++i)
#pragma unroll
                            for (int jb = 0; jb < PK_TB; ++jb) acc[i][jb] = 0.f;
                        pk_fma_span(acc, g, Rs, hcur, B, k0, c0, c1, r0, b0, lk);
                        if (c2 < c3) pk_fma_span(acc, g, Rs, hcur, B, k0, c2, c3, r0, b0, lk);
                        pk_flush(acc, g, red, B, r0, b0, kg, first);
                    }
            };
            auto half = [&](int k0, int c0, int c1, bool first) {
                if (!CL) {
                    pk_cp_wait<1>();   // this half has landed (this lane's part of it) ...
                    __syncwarp();      // ... and every lane's
                }
                if constexpr (MMA) {
                    if (one_tile) pk_mma_span<TS>(macc, g, Rs, hcur, B, K, k0, c0, c1, 0, 0, lane);
                    else pk_mma_groups<TS>(g, Rs, hcur, B, K, k0, c0, c1, red, kg, lane, first);
                } else if (one_tile) {
                    pk_fma_span(acc1, g, Rs, hcur, B, k0, c0, c1, lr, lb, lk);
                } else {
                    tile_sums(k0, c0, c1, c1, c1, first);
                }
                if (!CL) __syncwarp();   // the half is read: the next tile's may land there
            };
            if (CL && !one_tile) {
                tile_sums(0, ca, cm, cm, cb, true);
            } else {
                for (int k0 = 0; k0 < KC; k0 += KT) {
                    const int kn = k0 + KT;
                    int na = 0, nm = 0, nb = 0;
                    if (kn < KC) range(kn, na, nm, nb);
                    half(k0, ca, cm, k0 == 0);
                    if (!CL) {
                        pk_stage<TS, TF32>(hs, g.SH, src, lds, B, KC, kn, na, nm, vec, lane);
                        pk_cp_commit();
                    }
                    half(k0, cm, cb, false);
                    if (!CL) {
                        pk_stage<TS, TF32>(hs, g.SH, src, lds, B, KC, kn, nm, nb, vec, lane);
                        pk_cp_commit();
                    }
                    ca = na;
                    cm = nm;
                    cb = nb;
                }
            }
            if constexpr (MMA) {
                if (one_tile) pk_mma_flush(macc, g, red, B, 0, 0, kg, lane, true);
            } else if (one_tile) {
                pk_flush(acc1, g, red, B, lr, lb, kg, true);
            }
            __syncthreads();   // every k-group's partial sums are in red
            // cell i's sum over the k-groups (in order) of product row pc*U + jj, or with
            // `other` (PAIR) of the other block's unit jj, row (1 - pc)*U + jj
            auto k_sum = [&](int i, bool other) {
                const int row = (other ? 1 - pc : pc) * U + cell_j[i] - j0;
                const float* const p = red + row * g.BP + cell_b[i];
                const int kstride = g.M * g.BP;
                float v = p[0];
                for (int k = 1; k < g.NKG; ++k) v += p[k * kstride];
                return v;
            };
            if constexpr (PAIR) {
                // this block's half sums of the other block's units, the same cells (b, jj)
                // there, into its recv[e]: every cell of a batch row, live or not (units
                // past H sum zeros)
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i)
                    if (cell_b[i] < B)
                        pk_st_cluster(pk_smem_addr(recv + tid + i * nt), (unsigned int)(1 - pc),
                                      k_sum(i, true));
                // release: the sends before the other's reads; this block's own half while
                // the other block arrives. recv is next written after the next grid barrier,
                // which this block reaches after its reads below.
                pk_cluster_arrive();
                float own[PK_CPT];
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i) own[i] = cell_live[i] ? k_sum(i, false) : 0.f;
                pk_cluster_wait();   // acquire: the other's half is in recv
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i) {
                    if (!cell_live[i]) continue;
                    // half 0 + half 1, whichever block adds them
                    const float o = recv[tid + i * nt];
                    const float v = pc ? o + own[i] : own[i] + o;
                    dhrec[i] = CELL == CELL_GRU ? v + direct[i] : v;   // the GEMM, then + dh*z
                }
            } else {
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i) {
                    if (!cell_live[i]) continue;
                    const float v = k_sum(i, false);
                    dhrec[i] = CELL == CELL_GRU ? v + direct[i] : v;   // the GEMM, then + dh*z
                }
            }
        }
        if (s == T) break;

        // The pointwise backward of step t at this thread's cells, the fused kernels' own
        // functions (cell_bwd.cuh): vr, what multiplies R (dgx; the GRU's dgh), and the
        // GRU's dgx as vx. The grid kernel stores them at once; the cluster kernel pushes vr
        // into every block's buffer s & 1, then stores both between its barrier's arrive
        // and wait (nothing in the launch reads them).
        float vr[G][PK_CPT] = {}, vx[3][PK_CPT] = {};
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            if (!cell_live[i]) continue;
            const float dh = pdh[i] + dhrec[i];   // dh_above + dh_rec
            if constexpr (CELL == CELL_LSTM) {
                dcarry[i] = lstm_bwd_point(dh, dcarry[i], pa[0][i], pa[1][i], pa[2][i], pa[3][i],
                                           ps1[i], ps0[i], [&](int q, float v) { vr[q][i] = v; });
            } else if constexpr (CELL == CELL_GRU) {
                float gx[3], gh[3];
                gru_bwd_point(dh, pa[0][i], pa[1][i], pa[2][i], pa[3][i], ps1[i], gx, gh,
                              direct[i]);
#pragma unroll
                for (int q = 0; q < 3; ++q) {
                    vx[q][i] = gx[q];
                    vr[q][i] = gh[q];
                }
            } else {
                vr[0][i] = rnn_bwd_point<CELL == CELL_RNN_RELU>(dh, ps1[i]);   // ps1 = h_{t+1}
            }
            if (CL) {   // dg_t[b, q*H + j] into every block's buffer s & 1
                const pk_saddr a = pk_smem_addr(hs + (s & 1) * BG * g.SH + cell_b[i] * g.SH
                                                + cell_j[i]);
#pragma unroll
                for (int q = 0; q < G; ++q)
#pragma unroll
                    for (int rr = 0; rr < CL; ++rr)
                        pk_st_cluster(a + 4u * q * H, (unsigned int)rr,
                                      pk_operand<TS, TF32>(vr[q][i]));   // as staged
            }
        }
        // this step's dg to global memory (the GEMMs after the launch read them; the grid
        // kernel's next step stages the R side from L2)
        auto store = [&]() {
#pragma unroll
            for (int i = 0; i < PK_CPT; ++i) {
                if (!cell_live[i]) continue;
                const long long row = (long long)t * S + cell_b[i];
                TS* const y = dgs + row * lds + cell_j[i];
#pragma unroll
                for (int q = 0; q < G; ++q) pk_stcg(y + q * (long long)H, vr[q][i]);   // rounded
                if constexpr (CELL == CELL_GRU) {
                    TS* const x = dgx + row * lddgx + cell_j[i];
#pragma unroll
                    for (int q = 0; q < 3; ++q) x[q * (long long)H] = from_f<TS>(vx[q][i]);
                }
            }
        };
        if (CL) {
            // After every step: dg_t is in every buffer before any block reads it (next
            // step), every block has read buffer (s - 1) & 1 and red before they are
            // rewritten, and no block exits while another may still push into it (the
            // last pushes are step 0's, before this barrier). The global stores and the
            // next step's loads go between the arrive and the wait (as the forward).
            pk_cluster_arrive();
            store();
            if (t > 0) prefetch(t - 1);
            pk_cluster_wait();
        } else {
            store();
            if (t > 0) prefetch(t - 1);   // step t-1's inputs: in flight across the barrier
        }
    }
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        if (!cell_live[i]) continue;
        const int b = cell_b[i], j = cell_j[i];
        dh0[b * lddh0 + j] = dhrec[i];
        if constexpr (CELL == CELL_LSTM) dc0[b * lddc0 + j] = dcarry[i];
    }
    if (!CL) grid_exit(sync);
}

#endif  // RNNRT_PERSISTENT_BWD_CUH
