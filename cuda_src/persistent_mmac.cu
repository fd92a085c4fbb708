/*
 * persistent_mmac.cu: the tensor-core cluster kernels (forward; bf16 and fp16 storage, fp32
 * math, sm_90+). One launch runs all T steps of one layer on clusters of CN blocks (8, or 16
 * for the *_mmac16_* kernels): each cluster holds all of R and updates its own slice of at
 * most PK_MMAC_BG batches (one n8 tile); block rank r owns the hidden units [r*U, r*U + U)
 * with all G gate rows. Unlike the FMA cluster kernel (persistent.cu) the R slice and h_t are
 * kept in shared memory in the storage type (half the bytes: LSTM H 384 and GRU H 512 fit a
 * cluster of 8, LSTM H 512 one of 16) and the product R_slice [G*U, H] x h_t^T [H, BG] runs
 * on tensor cores (mma.sync m16n8k16, fp32 accumulation); warp w multiplies m16 tile w % MT
 * over its part w / MT of the k16 steps (KPARTS = warps / MT parts, two accumulator chains,
 * even and odd steps), the parts' sums meet in shared memory, each (b, j) cell is updated by
 * one thread, and h_{t+1} (rounded to TS) is pushed into every block's shared memory before
 * the cluster barrier. Design: docs/kernels-tensor-core.md ("The tensor-core cluster
 * kernel"); host side rnnrt/kernels/mmac.py (fit, geometry, twin).
 *
 * Variants: one template mmac_fwd<G, CELL, TS, CN>, CN = PK_CLUSTER (8) or 16 (the *_mmac16_*
 *   kernels: a non-portable cluster size, the launch opts in to it); typed instantiations
 *   only, `K_t<TS, false>` for each kernel K below, TS bf16 or fp16 (typed.py: MMA_FILES). No
 *   `extern "C"` kernels. Compile-time: PK_TIMING (persistent_common.cuh; timing variants,
 *   wrong results on purpose, experiments/scripts/mmac_bench.py only): 1 no pushes of
 *   h_{t+1}, 2 no mma.sync, 4 no cluster barrier a step (a __syncthreads, one cluster
 *   barrier before exit), 8 no pointwise update (no sums, pushes or stores).
 *
 * Calling convention: persistent.cu's cluster kernels' (registry entries persistent=True;
 *   sync is not touched), h a TS*; units_per_block U with CN * U >= H; k_tile KT >= H (all
 *   of h_t is in shared memory); blockDim.x = 32 * MT * KPARTS, MT = ceil(G*U / 16);
 *   gridDim.x = CN * clusters, ceil(B / clusters) <= PK_MMAC_BG.
 *
 * Kernels (one variant each a storage type; per step t = 0..T-1, for every (b, j): the
 *   persistent kernels' arithmetic, gh summed over k by mma.sync: each k-part's steps in
 *   order over two chains (even, odd) added at the end, the parts in order):
 *   kernel lstm_persistent_mmac_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    saved gates (LSTM i, f, g, o; GRU r, z, n, hn)
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel gru_persistent_mmac_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    saved gates (LSTM i, f, g, o; GRU r, z, n, hn)
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, 3H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [3H, H]       R = weight_hh, row-major
 *     in  bw     [B, 3H]       b_ih, usually ld 0
 *     in  br     [B, 3H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel rnn_tanh_persistent_mmac_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel rnn_relu_persistent_mmac_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *
 *   kernel lstm_persistent_mmac16_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    saved gates (LSTM i, f, g, o; GRU r, z, n, hn)
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel gru_persistent_mmac16_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    saved gates (LSTM i, f, g, o; GRU r, z, n, hn)
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, 3H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [3H, H]       R = weight_hh, row-major
 *     in  bw     [B, 3H]       b_ih, usually ld 0
 *     in  br     [B, 3H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel rnn_tanh_persistent_mmac16_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel rnn_relu_persistent_mmac16_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *
 * Shared memory (mmac.py mmac_layout computes the same): the R slice [MT*16][KP + 8] TS and
 * two h buffers [PK_MMAC_BG][KP + 8] TS (KP = H rounded up to 16; the row stride is 4 mod 8
 * words, so a fragment's 32-bit loads by rows g = 0..7 and words c = 0..3 hit 32 banks),
 * partial sums [KPARTS][MT*16][8] floats.
 * Resources (nvcc 13.0, sm_90a, no spills): __launch_bounds__(PK_MMAC_MAX_THREADS = 256, 1),
 *   206-241 registers (128 of them the PK_MMAC_KR steps' A fragments);
 *   rnnrt.kernels.mmac.NVCC_REGS.
 */
#include "persistent_layer.cuh"

#define PK_MMAC_MAX_THREADS 256   // __launch_bounds__ and the fit's cap on threads a block
                                  // (255 registers a thread: PK_MMAC_KR steps' A fragments)
#define PK_MMAC_BG 8              // most batches a cluster: one n8 tile
#define PK_MMAC_CLUSTER16 16      // blocks a cluster of the *_mmac16_* kernels
#define PK_MMAC_KR 32             // k16 steps a warp holds the A fragments of (even)
#define PK_MMAC_UNROLL 4          // k16 steps whose fragments are loaded together (even)
#define PK_MMAC_LOADS 8           // R elements a thread loads at once in the prologue

// The block's decomposition (rnnrt/kernels/mmac.py mmac_layout: the same numbers).
struct MmacGeom {
    int M, MT;        // rows of the R slice (G * U), its m16 tiles
    int KS, KP;       // k16 steps over H, and H rounded up to them
    int NW, KPARTS;   // warps; parts of the k16 steps (warps = MT * KPARTS)
    int SRH;          // row stride of the R slice and of the h buffers (TS elements)
};

__device__ __forceinline__ MmacGeom mmac_geom(int G, int U, int H, int nt) {
    MmacGeom g;
    g.M = G * U;
    g.MT = (g.M + 15) / 16;
    g.KS = (H + 15) / 16;
    g.KP = 16 * g.KS;
    g.NW = nt / 32;
    g.KPARTS = g.NW / g.MT;
    g.SRH = g.KP + 8;
    return g;
}

// Floats of the R slice and the two h buffers, 16-bit values (a multiple of 4: SRH * 2
// bytes is a multiple of 16).
__device__ __forceinline__ int mmac_rh_floats(const MmacGeom& g) {
    return (g.MT * 16 + 2 * PK_MMAC_BG) * g.SRH / 2;
}

template <int G, int CELL, class TS, int CN>
__device__ __forceinline__ void mmac_fwd(
        int Bfull, int H, TS* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, const float* gx, long long ldgx, const float* w, long long ldw,
        const float* bw, long long ldbw, const float* br, long long ldbr, int T, int U,
        int KT) {
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int rank = (int)pk_cluster_rank();
    const int BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();
    const int b_off = (int)pk_cluster_id() * BG;
    const int B = min(BG, Bfull - b_off);
    const MmacGeom g = mmac_geom(G, U, H, nt);
    const long long need = 4LL * (mmac_rh_floats(g) + (long long)g.KPARTS * g.MT * 16 * 8);
    if (U < 1 || H < 1 || B < 1 || BG > PK_MMAC_BG || KT < H || nt % 32 != 0 ||
        g.KPARTS < 1 || g.NW != g.MT * g.KPARTS || (long long)CN * U < H ||
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
    TS* const hs = Rs + g.MT * 16 * g.SRH;                // [2][PK_MMAC_BG][SRH]
    float* const red = smem + mmac_rh_floats(g);          // [KPARTS][MT*16][8]

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
    // h_0 of the cluster's batches into buffer 0; zeros everywhere else in both buffers
    // (rows past B and columns past H are read by the fragments, never pushed)
    for (int e = tid; e < 2 * PK_MMAC_BG * g.SRH; e += nt) {
        const int buf = e / (PK_MMAC_BG * g.SRH), r = e - buf * PK_MMAC_BG * g.SRH;
        const int b = r / g.SRH, k = r - b * g.SRH;
        hs[e] = (buf == 0 && b < B && k < H) ? h[b * ldh + k] : from_f<TS>(0.f);
    }
    pk_cluster_sync();   // every block of the cluster runs before any block pushes to it

    // This warp's m16 tile and k16 steps [ks0, ks1); its fragments' rows g and g + 8 of the
    // tile and columns 2c, 2c + 1 (+ 8) of each step (persistent_mma.cuh: the layout).
    const int mt = warp % g.MT, kp = warp / g.MT;
    const int ks0 = kp * g.KS / g.KPARTS, ks1 = (kp + 1) * g.KS / g.KPARTS;
    const int fg = lane >> 2, fc = lane & 3;
    const TS* const a_lo = Rs + (mt * 16 + fg) * g.SRH + 2 * fc;   // row g
    const TS* const a_hi = a_lo + 8 * g.SRH;                        // row g + 8
    float* const red_mine = red + ((kp * g.MT + mt) * 16 + fg) * 8 + 2 * fc;
    // The A fragments of this warp's first PK_MMAC_KR k16 steps, held in registers for the
    // whole launch (R does not change), so that a step reads only h_t's B fragments from
    // shared memory. Read from the R slice every step, the fragments were the step's
    // shared-memory traffic: the whole slice a step, 128 bytes a clock (GRU H 512: 196 KB,
    // ~0.8 us of a 4.5 us step; `kernels/persistent-mmac-bench-T100-...-20261129T084857.json`).
    unsigned int ar[PK_MMAC_KR][4];
#pragma unroll
    for (int u = 0; u < PK_MMAC_KR; ++u) {
        const int k = 16 * (ks0 + u);
        const bool in = ks0 + u < ks1;
        ar[u][0] = in ? pk_ld_pair(a_lo + k) : 0u;
        ar[u][1] = in ? pk_ld_pair(a_hi + k) : 0u;
        ar[u][2] = in ? pk_ld_pair(a_lo + k + 8) : 0u;
        ar[u][3] = in ? pk_ld_pair(a_hi + k + 8) : 0u;
    }

    for (int t = 0; t < T; ++t) {
        const TS* const b_row = hs + ((t & 1) * PK_MMAC_BG + fg) * g.SRH + 2 * fc;   // batch g
        float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
        // the fragments of k16 step ks: A (rows g, g + 8; columns 2c, 2c + 8) and B
        auto load = [&](unsigned int (&a)[4], unsigned int (&b)[2], int ks) {
            const int k = 16 * ks;
            a[0] = pk_ld_pair(a_lo + k);
            a[1] = pk_ld_pair(a_hi + k);
            a[2] = pk_ld_pair(a_lo + k + 8);
            a[3] = pk_ld_pair(a_hi + k + 8);
            b[0] = pk_ld_pair(b_row + k);
            b[1] = pk_ld_pair(b_row + k + 8);
        };
        auto step = [&](float (&d)[4], int ks) {
            unsigned int a[4], b[2];
            load(a, b, ks);
            pk_mma16816<TS>(d, a, b);
        };
        // Two chains (even and odd steps from ks0). The steps held in registers first; any
        // past PK_MMAC_KR from the R slice, PK_MMAC_UNROLL steps' fragments loaded before
        // their mma.sync (that unrolling alone did not shorten a step: the fragment loads
        // were bound by shared-memory bandwidth, not latency; `kernels/persistent-mmac-bench-
        // T100-...-20261129T084857.json`)
        int ks = (PK_TIMING & 2) ? ks1 : ks0;
        if (!(PK_TIMING & 2)) {   // the steps held in registers (PK_MMAC_KR is even)
#pragma unroll
            for (int u = 0; u < PK_MMAC_KR; u += 2) {
                const int k = 16 * (ks0 + u);
                if (ks0 + u < ks1) {
                    const unsigned int b[2] = {pk_ld_pair(b_row + k), pk_ld_pair(b_row + k + 8)};
                    pk_mma16816<TS>(d0, ar[u], b);
                }
                if (ks0 + u + 1 < ks1) {
                    const unsigned int b[2] = {pk_ld_pair(b_row + k + 16),
                                               pk_ld_pair(b_row + k + 24)};
                    pk_mma16816<TS>(d1, ar[u + 1], b);
                }
            }
            ks = min(ks1, ks0 + PK_MMAC_KR);
        }
        // the rest from the R slice in shared memory (ks - ks0 is even here)
        for (; ks + PK_MMAC_UNROLL <= ks1; ks += PK_MMAC_UNROLL) {
            unsigned int a[PK_MMAC_UNROLL][4], b[PK_MMAC_UNROLL][2];
#pragma unroll
            for (int u = 0; u < PK_MMAC_UNROLL; ++u) load(a[u], b[u], ks + u);
#pragma unroll
            for (int u = 0; u < PK_MMAC_UNROLL; u += 2) {
                pk_mma16816<TS>(d0, a[u], b[u]);
                pk_mma16816<TS>(d1, a[u + 1], b[u + 1]);
            }
        }
        for (; ks + 1 < ks1; ks += 2) {   // the last few (ks - ks0 is even here)
            step(d0, ks);
            step(d1, ks + 1);
        }
        if (ks < ks1) step(d0, ks);
        // D: d0, d1 (row g, batches 2c, 2c+1), d2, d3 (row g + 8)
        red_mine[0] = d0[0] + d1[0];
        red_mine[1] = d0[1] + d1[1];
        red_mine[64] = d0[2] + d1[2];
        red_mine[65] = d0[3] + d1[3];
        __syncthreads();   // every part's sums are in red

        float keep_h[PK_CPT] = {}, keep_c[PK_CPT] = {}, keep_a[4][PK_CPT] = {};
        TS* const hnext = hs + ((t + 1) & 1) * PK_MMAC_BG * g.SRH;
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            if (!cell_live[i] || no_update) continue;
            const int b = cell_b[i], j = cell_j[i], jj = j - j0;
            float s[G], xb[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float* const p = red + (q * U + jj) * 8 + b;
                float v = p[0];
                for (int k = 1; k < g.KPARTS; ++k) v += p[k * g.MT * 16 * 8];
                xb[q] = xg[q][i] + bwv[q][i];
                const float brq = brv[q][i];
                // ((gx + bw) + gh) + br, the fused kernels' order (GRU's n gate: gh_n + br_n)
                s[q] = (CELL == CELL_GRU && q == 2) ? v + brq : (xb[q] + v) + brq;
            }
            const float hv = pk_cell_update<G, CELL, TS>(s, xb, carry[i], keep_c[i],
                                                         keep_a[0][i], keep_a[1][i],
                                                         keep_a[2][i], keep_a[3][i]);
            keep_h[i] = hv;
            // h_{t+1}[b, j], rounded to TS, into every block's next buffer
            const pk_saddr a = pk_smem_addr(reinterpret_cast<const float*>(hnext + b * g.SRH + j));
            const unsigned short bits = from_f<TS>(hv).bits;
#pragma unroll
            for (int r = 0; r < ((PK_TIMING & 1) ? 0 : CN); ++r)
                pk_st_cluster_b16(a, (unsigned int)r, bits);
        }
        // After every step, the last too: h_{t+1} is in every buffer before any block reads
        // it, every block has read buffer t & 1 and red before they are rewritten, and no
        // block exits while another may still push into it. The global stores and step t+1's
        // gx loads go between the arrive and the wait (persistent_layer.cuh: why).
        if (!(PK_TIMING & 4)) pk_cluster_arrive();
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
            pk_stcg(h + (row + S) * ldh + j, keep_h[i]);   // h_{t+1}[b, j], rounded to TS
        }
        if (PK_TIMING & 4) __syncthreads();   // timing only: red is rewritten next step
        else pk_cluster_wait();
    }
    if (PK_TIMING & 4) pk_cluster_sync();   // timing only: no exit before the pushes
}

// Clusters of PK_CLUSTER (8, the portable maximum) blocks
template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1)
lstm_persistent_mmac_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<4, CELL_LSTM, TS, PK_CLUSTER>(
        rows, cols, h, ldh, c, ldc, act, ldact, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1)
gru_persistent_mmac_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<3, CELL_GRU, TS, PK_CLUSTER>(
        rows, cols, h, ldh, nullptr, 0, act, ldact, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1)
rnn_tanh_persistent_mmac_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_TANH, TS, PK_CLUSTER>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1)
rnn_relu_persistent_mmac_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_RELU, TS, PK_CLUSTER>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}

// Clusters of 16 blocks (non-portable: the launch opts in, rnnrt/kernels/library.py)
template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAC_CLUSTER16, 1, 1)
lstm_persistent_mmac16_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<4, CELL_LSTM, TS, PK_MMAC_CLUSTER16>(
        rows, cols, h, ldh, c, ldc, act, ldact, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAC_CLUSTER16, 1, 1)
gru_persistent_mmac16_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<3, CELL_GRU, TS, PK_MMAC_CLUSTER16>(
        rows, cols, h, ldh, nullptr, 0, act, ldact, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAC_CLUSTER16, 1, 1)
rnn_tanh_persistent_mmac16_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_TANH, TS, PK_MMAC_CLUSTER16>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAC_CLUSTER16, 1, 1)
rnn_relu_persistent_mmac16_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core cluster kernel: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_RELU, TS, PK_MMAC_CLUSTER16>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}
