/*
 * persistent_mmac.cuh: the body of the tensor-core cluster kernels, mmac_fwd<G, CELL, TS, CN,
 * NTC> (its geometry MmacGeom, the grid form's staging mmag_stage, mmag_stage_mc: by
 * the cluster's multicast bulk copies). #included by
 * persistent_mmac.cu (clusters of CN = 8 or 16 blocks, one n8 tile), persistent_mmacw.cu (the
 * wide form: clusters of 8, NTC = PK_MMAC_WNT n8 tiles) and persistent_mmag.cu (CN = 0: the
 * grid form), whose headers document the kernels, their arguments and variants; rnnrt's
 * loader inlines it. No kernels of its own.
 *   PK_MMAC_*   the cluster forms' constants; PK_MMAG_*: the grid form's
 */
#ifndef RNNRT_PERSISTENT_MMAC_CUH
#define RNNRT_PERSISTENT_MMAC_CUH

#include "persistent_layer.cuh"

#define PK_MMAC_MAX_THREADS 256   // __launch_bounds__ and the fit's cap on threads a block
                                  // (255 registers a thread: PK_MMAC_KR steps' A fragments)
#define PK_MMAC_BG 8              // most batches a cluster: one n8 tile
#define PK_MMAC_CLUSTER16 16      // blocks a cluster of the *_mmac16_* kernels
#define PK_MMAC_KR 32             // k16 steps a warp holds the A fragments of (even)
#define PK_MMAC_UNROLL 4          // k16 steps whose fragments are loaded together (even)
#define PK_MMAC_LOADS 8           // R elements a thread loads at once in the prologue
#define PK_MMAG_NT 4              // the grid form: most n8 tiles (batches 8 * PK_MMAG_NT)
#define PK_MMAG_KR 16             // the grid form: k16 steps held in registers (even; its
                                  // PK_MMAG_NT tiles' accumulators take the registers)
#define PK_MMAG_CLUSTER 2         // the grid form's blocks a cluster: a pair shares the
                                  // staging of h_t (one L2 read a pair, multicast; an SM
                                  // pair is a TPC, so every pair of SMs holds a cluster)
#define PK_MMAG_BARRIER 16        // the grid form: bytes past the partial sums (its staging's
                                  // mbarrier, 8 bytes, and 8 to keep 16-byte alignment)
#define PK_MMAC_RS_PAD1 1         // floats past 8 NT in a row of the partial sums at one n8
#define PK_MMAC_RS_PAD 3          // tile, and at more: the cells' reads of a gate row (U units
                                  // a row apart) and the fragments' writes (8 rows) at most
                                  // 2-way bank conflicts in every form (at 8 NT the grid
                                  // form's B 32 reads were 8-way, 44% of its shared-load
                                  // wavefronts: ncu, session 31; mmac.py partial_stride)
#define PK_MMAC_WNT 4             // the wide cluster form (*_mmacw_*): most n8 tiles a
                                  // cluster (batches 8 * PK_MMAC_WNT), PK_MMAG_KR in registers

// The block's decomposition (rnnrt/kernels/mmac.py mmac_layout: the same numbers).
struct MmacGeom {
    int M, MT;        // rows of the R slice (G * U), its m16 tiles
    int KS, KP;       // k16 steps over H, and H rounded up to them
    int NW, KPARTS;   // warps; parts of the k16 steps (warps = MT * KPARTS)
    int SRH;          // row stride of the R slice and of the h buffers (TS elements)
    int NT;           // n8 tiles of batches: ceil(B / 8) in the grid and the wide cluster
                      // forms, else 1
    int HR;           // rows of the h buffers: 2 x 8 NT (a cluster's two) / 8 NT (the grid
                      // form's one)
    int RS;           // row stride of the partial sums (floats): 8 NT + the pad above
};

// tiled: several n8 tiles (the grid and the wide forms), else one.
__device__ __forceinline__ MmacGeom mmac_geom(int G, int U, int H, int nt, int B, bool grid,
                                              bool tiled) {
    MmacGeom g;
    g.M = G * U;
    g.MT = (g.M + 15) / 16;
    g.KS = (H + 15) / 16;
    g.KP = 16 * g.KS;
    g.NW = nt / 32;
    g.KPARTS = g.NW / g.MT;
    g.SRH = g.KP + 8;
    g.NT = tiled ? (B + 7) / 8 : 1;
    g.HR = grid ? 8 * g.NT : 2 * 8 * g.NT;
    g.RS = 8 * g.NT + ((PK_TIMING & 32) ? 0 : g.NT == 1 ? PK_MMAC_RS_PAD1 : PK_MMAC_RS_PAD);
    return g;
}

// Floats of the R slice and the h buffers, 16-bit values (a multiple of 4: SRH * 2 bytes is
// a multiple of 16).
__device__ __forceinline__ int mmac_rh_floats(const MmacGeom& g) {
    return (g.MT * 16 + g.HR) * g.SRH / 2;
}

// The grid form's staging of h_t [B][H] (row stride ldh) into the buffer's rows 0..B-1
// (stride SRH) where its rows are not 16-byte aligned (else mmag_stage_mc): 2-byte L2 loads
// (ld.cg: the other blocks wrote h_t during this launch), each block all of h_t. The caller
// syncs.
template <class TS>
__device__ __forceinline__ void mmag_stage(TS* hs, int SRH, const TS* ht, long long ldh, int B,
                                           int H, int tid, int nt) {
    if (PK_TIMING & 1) return;
    for (int e = tid; e < B * H; e += nt) {
        const int b = e / H, k = e - b * H;
        hs[b * SRH + k] = from_f<TS>(pk_ldcg(ht + b * ldh + k));
    }
}

// The grid form's staging of h_t by the bulk copy engine, where rows are 16-byte aligned:
// block rank r of a cluster of PK_MMAG_CLUSTER copies rows r, r + PK_MMAG_CLUSTER, ... of
// h_t [B][H] once, multicast into the same rows of every block's buffer (stride SRH), and
// each block's mbarrier `bar` expects all B rows (its phase t & 1 completes when they have
// landed: the caller waits on it). Warp 0 issues; lane 0's arrival carries the byte count.
// (A bulk copy issues lane by lane. Spread over every warp, the copies cut the staging alone
// by ~0.1 us a step but slowed the kernel's step at three of four shapes, LSTM H 1024 B 32
// 5.73 -> 5.91 us: `kernels/staging-bench-nvidia-h200-20261129T203109.json`,
// `kernels/persistent-mmac-bench-T100-nvidia-h200-20261129T203942.json`.)
// The other block's copies may land before this block's expect: the phase also needs that
// one arrival, so it cannot complete early.
template <class TS>
__device__ __forceinline__ void mmag_stage_mc(TS* hs, int SRH, const TS* ht, long long ldh,
                                              int B, int H, pk_saddr bar, int tid) {
    if (tid >= 32) return;
    pk_fence_async_global();   // the other blocks' h_t, acquired at the barrier, before the
                               // copies read it
    if (tid == 0) pk_mbar_expect(bar, (unsigned int)(B * H * (int)sizeof(TS)));
    __syncwarp();
    const unsigned int rank = pk_cluster_rank();
    for (int b = (int)rank + PK_MMAG_CLUSTER * tid; b < B; b += 32 * PK_MMAG_CLUSTER)
        pk_bulk_g2s_mc(pk_smem_addr(reinterpret_cast<const float*>(hs + b * SRH)),
                       ht + b * ldh, (unsigned int)(H * (int)sizeof(TS)), bar,
                       (unsigned short)((1u << PK_MMAG_CLUSTER) - 1u));
}

// CN blocks a cluster (8, 16), or CN = 0: the grid form (every block of the grid is one
// "cluster" over all B <= 8 PK_MMAG_NT batches; h_{t+1} goes to global memory, the blocks meet
// at the flag grid barrier on `sync`, and each stages h_t from L2 at the top of a step: in
// clusters of PK_MMAG_CLUSTER (the launch's) sharing the copy where rows are 16-byte aligned,
// mmag_stage_mc; else each block its own, mmag_stage). NTC:
// the n8 tiles a cluster's registers are sized for (1; PK_MMAC_WNT: the wide cluster form,
// up to 8 NTC batches a cluster, PK_MMAG_KR steps' A fragments in registers).
template <int G, int CELL, class TS, int CN, int NTC = 1>
__device__ __forceinline__ void mmac_fwd(
        int Bfull, int H, TS* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, const float* gx, long long ldgx, const float* w,
        long long ldw, const float* bw, long long ldbw, const float* br, long long ldbr, int T,
        int U, int KT) {
    constexpr bool GRID = CN == 0;
    constexpr int NTX = GRID ? PK_MMAG_NT : NTC;      // n8 tiles the registers are sized for
    constexpr bool TILED = NTX > 1;                   // several n8 tiles (grid or wide form)
    constexpr int KR = TILED ? PK_MMAG_KR : PK_MMAC_KR;
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    int rank, BG, b_off;
    if constexpr (GRID) {
        rank = blockIdx.x;
        BG = Bfull;
        b_off = 0;
    } else {
        rank = (int)pk_cluster_rank();
        BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();
        b_off = (int)pk_cluster_id() * BG;
    }
    const int B = min(BG, Bfull - b_off);
    const int ranks = GRID ? (int)gridDim.x : CN;
    const MmacGeom g = mmac_geom(G, U, H, nt, BG, GRID, TILED);
    const long long need = 4LL * (mmac_rh_floats(g) + (long long)g.KPARTS * g.MT * 16 * g.RS) +
                           (GRID ? PK_MMAG_BARRIER : 0);
    if (U < 1 || H < 1 || B < 1 || BG > 8 * NTX || KT < H || nt % 32 != 0 ||
        g.KPARTS < 1 || g.NW != g.MT * g.KPARTS || (long long)ranks * U < H ||
        (long long)U * BG > (long long)PK_CPT * nt || (long long)dynamic_smem_bytes() < need)
        __trap();
    const int S = Bfull;   // rows of a step in every time-major array
    h += b_off * ldh;      // row b of step t of every array is now row t*S + b
    if (c) c += b_off * ldc;
    if (act) act += b_off * ldact;
    gx += b_off * ldgx;
    bw += b_off * ldbw;
    br += b_off * ldbr;
    const int j0 = rank * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns
    // timing variant 8 (no pointwise update): a runtime test, so that the code it skips
    // is not "unreachable" to the compiler (-Werror)
    const bool no_update = (PK_TIMING & 8) && T > 0;
    TS* const Rs = reinterpret_cast<TS*>(smem);           // [MT*16][SRH]
    TS* const hs = Rs + g.MT * 16 * g.SRH;                // [HR][SRH]
    float* const red = smem + mmac_rh_floats(g);          // [KPARTS][MT*16][RS] (8 NT used)
    // the grid form's staging by the cluster's multicast bulk copies (mc), completing on
    // the mbarrier `bar`: where the rows of h are 16-byte aligned, whole 16-byte chunks
    [[maybe_unused]] const bool mc = GRID && !(PK_TIMING & 1) && H % 8 == 0 &&
                     ldh % 8 == 0 && (reinterpret_cast<unsigned long long>(h) & 15ull) == 0;
    [[maybe_unused]] const pk_saddr bar =
            pk_smem_addr(red + (long long)g.KPARTS * g.MT * 16 * g.RS);

    // Pointwise cells of this thread: e = tid + i*nt, jj = e % U, b = e / U (live: jj < Ub,
    // b < B), as the other persistent kernels (emulate.owned). gx of step t+1 is loaded
    // between the barrier's arrive and wait of step t; the biases once; c_t (LSTM) and h_t
    // (GRU) of the cells are the thread's own writes of the step before: registers.
    float xg[G][PK_CPT], bwv[G][PK_CPT], brv[G][PK_CPT], carry[PK_CPT];
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
    auto prefetch = [&](int t) {
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            const float* const x = gx + ((long long)t * S + cell_b[i]) * ldgx + cell_j[i];
#pragma unroll
            for (int q = 0; q < G; ++q)
                xg[q][i] = cell_live[i] ? __ldcs(x + q * (long long)H) : 0.f;
        }
    };
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        const bool live = cell_live[i];
        const int b = cell_b[i], j = cell_j[i];
#pragma unroll
        for (int q = 0; q < G; ++q) {
            bwv[q][i] = live ? __ldg(bw + b * ldbw + j + q * (long long)H) : 0.f;
            brv[q][i] = live ? __ldg(br + b * ldbr + j + q * (long long)H) : 0.f;
        }
        carry[i] = 0.f;
        if constexpr (CELL == CELL_LSTM) {
            if (live) carry[i] = c[b * ldc + j];
        } else if constexpr (CELL == CELL_GRU) {
            if (live) carry[i] = to_f(h[b * ldh + j]);
        }
    }
    prefetch(0);   // step 0's: in flight during the copy of R

    // R slice, once, rounded to TS (exactly what the rungs' GEMMs read of R): row q*U + ju
    // holds R[q*H + j0 + ju, :]; zeros past H, past Ub and in the rows past M of the last
    // m16 tile.
    // PK_MMAC_LOADS elements a thread at a time, all loads before any store: each load is
    // an L2 / DRAM round trip, and one at a time (the compiler may not move a global load
    // above a store through a generic pointer) the copy took ~20 us of a 20-step launch.
    for (int e0 = tid; e0 < g.MT * 16 * g.SRH; e0 += PK_MMAC_LOADS * nt) {
        float v[PK_MMAC_LOADS];
#pragma unroll
        for (int u = 0; u < PK_MMAC_LOADS; ++u) {
            const int e = e0 + u * nt;
            const int row = e / g.SRH, k = e - row * g.SRH;
            const int q = row / U, ju = row - q * U;
            const bool live = e < g.MT * 16 * g.SRH && row < g.M && ju < Ub && k < H;
            v[u] = live ? __ldg(w + ((long long)q * H + j0 + ju) * ldw + k) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < PK_MMAC_LOADS; ++u)
            if (e0 + u * nt < g.MT * 16 * g.SRH) Rs[e0 + u * nt] = from_f<TS>(v[u]);
    }
    if constexpr (GRID) {
        // zeros in the buffer (rows past B and columns past H are read by the fragments,
        // never staged); h_t is staged at the top of every step, h_0 too
        for (int e = tid; e < g.HR * g.SRH; e += nt) hs[e] = from_f<TS>(0.f);
        if (mc) {
            if (tid == 0) {
                pk_mbar_init(bar, 1);
                pk_mbar_init_fence();
            }
            pk_fence_async_smem();   // the zeros before the copies into the buffer
        }
        // the R slice and the zeros before any fragment is read; in every block of the
        // cluster, with its barrier, before the other block's first copy lands in it
        pk_cluster_sync();
    } else {
        // h_0 of the cluster's batches into buffer 0; zeros everywhere else in both buffers
        // (rows past B and columns past H are read by the fragments, never pushed)
        for (int e = tid; e < g.HR * g.SRH; e += nt) {
            const int buf = e / (8 * g.NT * g.SRH), r = e - buf * 8 * g.NT * g.SRH;
            const int b = r / g.SRH, k = r - b * g.SRH;
            hs[e] = (buf == 0 && b < B && k < H) ? h[b * ldh + k] : from_f<TS>(0.f);
        }
        pk_cluster_sync();   // every block of the cluster runs before any block pushes to it
    }

    // This warp's m16 tile and k16 steps [ks0, ks1); its fragments' rows g and g + 8 of the
    // tile and columns 2c, 2c + 1 (+ 8) of each step (persistent_mma.cuh: the layout).
    const int mt = warp % g.MT, kp = warp / g.MT;
    const int ks0 = kp * g.KS / g.KPARTS, ks1 = (kp + 1) * g.KS / g.KPARTS;
    const int fg = lane >> 2, fc = lane & 3;
    const TS* const a_lo = Rs + (mt * 16 + fg) * g.SRH + 2 * fc;   // row g
    const TS* const a_hi = a_lo + 8 * g.SRH;                        // row g + 8
    float* const red_mine = red + ((kp * g.MT + mt) * 16 + fg) * g.RS + 2 * fc;
    // The A fragments of this warp's first KR k16 steps, held in registers for the whole
    // launch (R does not change), so that a step reads only h_t's B fragments from shared
    // memory. Read from the R slice every step, the fragments were the step's shared-memory
    // traffic: the whole slice a step, 128 bytes a clock (GRU H 512: 196 KB, ~0.8 us of a
    // 4.5 us step; `kernels/persistent-mmac-bench-T100-...-20261129T084857.json`).
    unsigned int ar[KR][4];
#pragma unroll
    for (int u = 0; u < KR; ++u) {
        const int k = 16 * (ks0 + u);
        const bool in = ks0 + u < ks1;
        ar[u][0] = in ? pk_ld_pair(a_lo + k) : 0u;
        ar[u][1] = in ? pk_ld_pair(a_hi + k) : 0u;
        ar[u][2] = in ? pk_ld_pair(a_lo + k + 8) : 0u;
        ar[u][3] = in ? pk_ld_pair(a_hi + k + 8) : 0u;
    }

    for (int t = 0; t < T; ++t) {
        if constexpr (GRID) {   // h_t, complete since the last barrier (h_0: the caller's)
            if (mc) {
                mmag_stage_mc(hs, g.SRH, h + (long long)t * S * ldh, ldh, B, H, bar, tid);
                pk_mbar_wait(bar, (unsigned int)(t & 1));
            } else {
                mmag_stage(hs, g.SRH, h + (long long)t * S * ldh, ldh, B, H, tid, nt);
                __syncthreads();
            }
        }
        // batch g of n8 tile n: b_row + 8 n SRH
        const TS* const b_row = hs + ((GRID ? 0 : (t & 1) * 8 * g.NT) + fg) * g.SRH + 2 * fc;
        float d0[NTX][4], d1[NTX][4];
#pragma unroll
        for (int n = 0; n < NTX; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) d0[n][r] = d1[n][r] = 0.f;
        // the B fragments of tile n at k16 step ks (column k = 16 ks)
        auto bfrag = [&](unsigned int (&b)[2], int n, int k) {
            const TS* const p = b_row + n * 8 * g.SRH + k;
            b[0] = pk_ld_pair(p);
            b[1] = pk_ld_pair(p + 8);
        };
        // the A fragments of k16 step ks (rows g, g + 8; columns 2c, 2c + 8)
        auto afrag = [&](unsigned int (&a)[4], int ks) {
            const int k = 16 * ks;
            a[0] = pk_ld_pair(a_lo + k);
            a[1] = pk_ld_pair(a_hi + k);
            a[2] = pk_ld_pair(a_lo + k + 8);
            a[3] = pk_ld_pair(a_hi + k + 8);
        };
        auto step = [&](float (&d)[NTX][4], int ks) {
            unsigned int a[4];
            afrag(a, ks);
#pragma unroll
            for (int n = 0; n < NTX; ++n) {
                if (n >= g.NT) break;
                unsigned int b[2];
                bfrag(b, n, 16 * ks);
                pk_mma16816<TS>(d[n], a, b);
            }
        };
        // Two chains (even and odd steps from ks0). The steps held in registers first; any
        // past KR from the R slice, PK_MMAC_UNROLL steps' fragments loaded before their
        // mma.sync (that unrolling alone did not shorten a step: the fragment loads were
        // bound by shared-memory bandwidth, not latency; `kernels/persistent-mmac-bench-
        // T100-...-20261129T084857.json`)
        int ks = (PK_TIMING & 2) ? ks1 : ks0;
        if (!(PK_TIMING & 2)) {   // the steps held in registers (KR is even)
            // The wide form branches out past the part's last step (uniform in the warp):
            // predicated off, its KR x NTX unrolled fragment loads and mma.sync still issue
            // (LSTM H 128 B 256 in 14 clusters, 4 live steps of 16: a third of the step's
            // stall samples in this loop, `profiles/ncu-persistent-mmacw-lstm-H128-B256-...`;
            // the branch took its step from 3.83 to 3.70 us, GRU 3.52 to 3.40, 11 clusters
            // 3.62 to 3.14). The one-tile and grid forms keep the predicates: timed against
            // them in one process (PK_TIMING 16), the branch wins where few of the KR steps
            // are live (LSTM H 128 B 8 2.21 -> 1.95 us) and loses where most are (GRU H 512
            // B 8 3.32 -> 3.75, LSTM H 1024 B 32 7.54 -> 7.65;
            // `kernels/persistent-mmac-bench-T100-nvidia-h200-20261129T1336*.json`).
            constexpr bool BRANCH = (!GRID && NTC > 1) || (PK_TIMING & 16);
#pragma unroll
            for (int u = 0; u < KR; u += 2) {
                if (BRANCH && ks0 + u >= ks1) break;
                const int k = 16 * (ks0 + u);
#pragma unroll
                for (int n = 0; n < NTX; ++n) {
                    if (n >= g.NT) break;
                    if (BRANCH || ks0 + u < ks1) {
                        unsigned int b[2];
                        bfrag(b, n, k);
                        pk_mma16816<TS>(d0[n], ar[u], b);
                    }
                    if (ks0 + u + 1 < ks1) {
                        unsigned int b[2];
                        bfrag(b, n, k + 16);
                        pk_mma16816<TS>(d1[n], ar[u + 1], b);
                    }
                }
            }
            ks = min(ks1, ks0 + KR);
        }
        // the rest from the R slice in shared memory (ks - ks0 is even here)
        for (; ks + PK_MMAC_UNROLL <= ks1; ks += PK_MMAC_UNROLL) {
            unsigned int a[PK_MMAC_UNROLL][4], b[PK_MMAC_UNROLL][NTX][2];
#pragma unroll
            for (int u = 0; u < PK_MMAC_UNROLL; ++u) {
                afrag(a[u], ks + u);
#pragma unroll
                for (int n = 0; n < NTX; ++n)
                    if (n < g.NT) bfrag(b[u][n], n, 16 * (ks + u));
            }
#pragma unroll
            for (int u = 0; u < PK_MMAC_UNROLL; u += 2)
#pragma unroll
                for (int n = 0; n < NTX; ++n) {
                    if (n >= g.NT) break;
                    pk_mma16816<TS>(d0[n], a[u], b[u][n]);
                    pk_mma16816<TS>(d1[n], a[u + 1], b[u + 1][n]);
                }
        }
        for (; ks + 1 < ks1; ks += 2) {   // the last few (ks - ks0 is even here)
            step(d0, ks);
            step(d1, ks + 1);
        }
        if (ks < ks1) step(d0, ks);
        if (GRID && mc) pk_fence_async_smem();   // this step's reads of h_t before the next
                                                 // step's copies into the buffer
        // D of tile n: d0, d1 (row g, batches 8n + 2c, 8n + 2c + 1), d2, d3 (row g + 8)
#pragma unroll
        for (int n = 0; n < NTX; ++n) {
            if (n >= g.NT) break;
            red_mine[8 * n] = d0[n][0] + d1[n][0];
            red_mine[8 * n + 1] = d0[n][1] + d1[n][1];
            red_mine[8 * g.RS + 8 * n] = d0[n][2] + d1[n][2];
            red_mine[8 * g.RS + 8 * n + 1] = d0[n][3] + d1[n][3];
        }
        __syncthreads();   // every part's sums are in red

        float keep_h[PK_CPT] = {}, keep_c[PK_CPT] = {}, keep_a[4][PK_CPT] = {};
        TS* const hnext = hs + ((t + 1) & 1) * 8 * g.NT * g.SRH;   // the cluster form's
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            if (!cell_live[i] || no_update) continue;
            const int b = cell_b[i], j = cell_j[i], jj = j - j0;
            float s[G], xb[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float* const p = red + (q * U + jj) * g.RS + b;
                float v = p[0];
                for (int k = 1; k < g.KPARTS; ++k) v += p[k * g.MT * 16 * g.RS];
                xb[q] = xg[q][i] + bwv[q][i];
                const float brq = brv[q][i];
                // ((gx + bw) + gh) + br, the fused kernels' order (GRU's n gate: gh_n + br_n)
                s[q] = (CELL == CELL_GRU && q == 2) ? v + brq : (xb[q] + v) + brq;
            }
            const float hv = pk_cell_update<G, CELL, TS>(s, xb, carry[i], keep_c[i],
                                                         keep_a[0][i], keep_a[1][i],
                                                         keep_a[2][i], keep_a[3][i]);
            keep_h[i] = hv;
            if constexpr (GRID) {   // h_{t+1}[b, j], rounded to TS: read after the barrier
                pk_stcg(h + ((long long)(t + 1) * S + b) * ldh + j, hv);
            } else {   // h_{t+1}[b, j], rounded to TS, into every block's next buffer
                const pk_saddr a = pk_smem_addr(
                        reinterpret_cast<const float*>(hnext + b * g.SRH + j));
                const unsigned short bits = from_f<TS>(hv).bits;
#pragma unroll
                for (int r = 0; r < ((PK_TIMING & 1) ? 0 : CN); ++r)
                    pk_st_cluster_b16(a, (unsigned int)r, bits);
            }
        }
        // After every step, the last too (the cluster form): h_{t+1} is in every buffer
        // before any block reads it, every block has read buffer t & 1 and red before they
        // are rewritten, and no block exits while another may still push into it. The
        // global stores and step t+1's gx loads go between the arrive and the wait
        // (persistent_layer.cuh: why). The grid form between steps: its arrival (thread 0,
        // after the block's stores of h_{t+1}: a fence, then the counter) releases h_{t+1},
        // the wait (a relaxed spin, then one acquire load, not a fence: that would also wait
        // for the gx loads in flight) acquires every block's.
        const bool barrier = GRID ? t + 1 < T : true;
        if (GRID && barrier) {
            __syncthreads();   // the block's stores of h_{t+1} are issued
            if (tid == 0 && !(PK_TIMING & 4)) {
                pk_fence_acq_rel();
                atomicAdd(sync, 1u);
            }
        } else if (!GRID && !(PK_TIMING & 4)) {
            pk_cluster_arrive();
        }
        if (t + 1 < T) prefetch(t + 1);
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            if (!cell_live[i] || no_update) continue;
            const int b = cell_b[i], j = cell_j[i];
            const long long row = (long long)t * S + b;   // step t, batch b
            if constexpr (CELL == CELL_LSTM) c[(row + S) * ldc + j] = keep_c[i];
            if constexpr (CELL == CELL_LSTM || CELL == CELL_GRU)
                store_gates(act + row * ldact + j, H, keep_a[0][i], keep_a[1][i], keep_a[2][i],
                            keep_a[3][i]);
            if constexpr (!GRID)
                pk_stcg(h + (row + S) * ldh + j, keep_h[i]);   // h_{t+1}[b, j], rounded to TS
        }
        if constexpr (GRID) {
            if (barrier) {
                if (tid == 0) {   // pk_spin_acquire: why
                    if (PK_TIMING & 64) ps_wait(sync, (unsigned int)(t + 1) * gridDim.x);
                    else pk_spin_acquire(sync, (unsigned int)(t + 1) * gridDim.x);
                }
                __syncthreads();   // no thread stages h_{t+1} before thread 0 saw every block's
            }
        } else if (PK_TIMING & 4) {
            __syncthreads();   // timing only: red is rewritten next step
        } else {
            pk_cluster_wait();
        }
    }
    if constexpr (GRID) {
        pk_cluster_sync();   // the grid form: no block exits while a copy may land in it
        grid_exit(sync);
    } else if (PK_TIMING & 4) {
        pk_cluster_sync();   // timing only: no exit before the pushes
    }
}

#endif  // RNNRT_PERSISTENT_MMAC_CUH
