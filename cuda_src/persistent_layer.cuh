/*
 * persistent_layer.cuh: the body of the per-layer persistent kernels, persistent_fwd<G, CELL,
 * CL, TS, TF32, MMA> and its helpers (register tiles, the grid barrier and its exit, the
 * partial sums, the cell updates, pk_cell_update; the tensor-core product phase in
 * persistent_mma.cuh). #included by persistent.cu, persistent_mma.cu and persistent_regs.cu, whose
 * headers document the kernels, their arguments and variants; rnnrt's loader inlines it. No
 * kernels of its own.
 *   PK_TM, PK_TB, PK_CPT, PK_LR_MAX   register tile and pointwise geometry
 *   PK_CLUSTER                        blocks a cluster of the cluster kernels
 */
#ifndef RNNRT_PERSISTENT_LAYER_CUH
#define RNNRT_PERSISTENT_LAYER_CUH

#include "persistent_common.cuh"

#define PK_TM 4                // register tile: rows of the R slice a lane accumulates
#define PK_TB 8                // register tile: batches a lane accumulates
#define PK_CPT 2               // pointwise: most (b, j) cells one thread updates
#define PK_LR_MAX 16           // most row groups of a warp's lanes (LR x LB <= 32 in any case)
#define PK_CLUSTER 8           // blocks a cluster of the cluster kernels (the portable maximum)

// The four saved gate values of one (b, j) for the backward pass: act columns j, H + j,
// 2H + j, 3H + j (LSTM i, f, g, o; GRU r, z, n, hn), a pointing at column j.
__device__ __forceinline__ void store_gates(float* a, int H, float v0, float v1, float v2,
                                            float v3) {
    a[0] = v0;
    a[H] = v1;
    a[2 * (long long)H] = v2;
    a[3 * (long long)H] = v3;
}

// One (b, j) cell's update from its gate sums: s[q] = ((gx + bw) + gh) + br (GRU's n gate:
// gh_n + br_n), xb[q] = gx + bw. Returns h_{t+1}; updates the carried state (LSTM c_t, GRU
// h_t), sets c_{t+1} (LSTM: cn) and the saved gates a0..a3 (LSTM i, f, g, o; GRU r, z, n,
// hn). The fused kernels' arithmetic (lstm_fwd, gru_fwd, rnn_*_fwd); every persistent
// forward kernel of a layer calls it. TS: the storage of h; GRU carries h_{t+1} as stored
// (rounded to TS), the value gru_fwd reads back the next step.
template <int G, int CELL, class TS = float>
__device__ __forceinline__ float pk_cell_update(const float (&s)[G], const float (&xb)[G],
                                                float& carry, float& cn_out, float& a0,
                                                float& a1, float& a2, float& a3) {
    if constexpr (CELL == CELL_LSTM) {
        const float ig = sigmoidf(s[0]), fg = sigmoidf(s[1]);
        const float gg = tanhf(s[2]), og = sigmoidf(s[3]);
        const float cn = fg * carry + ig * gg;
        carry = cn;
        cn_out = cn;
        a0 = ig, a1 = fg, a2 = gg, a3 = og;
        return og * tanhf(cn);
    } else if constexpr (CELL == CELL_GRU) {
        const float r = sigmoidf(s[0]), z = sigmoidf(s[1]);
        const float hn = s[2];                      // gh_n + br_n
        const float n = tanhf(xb[2] + r * hn);      // gx_n + bw_n + r * hn
        const float hv = n + z * (carry - n);
        carry = pk_stored<TS>(hv);
        a0 = r, a1 = z, a2 = n, a3 = hn;
        return hv;
    } else if constexpr (CELL == CELL_RNN_TANH) {
        return tanhf(s[0]);
    } else {
        const float v = s[0];
        return v < 0.f ? 0.f : v;   // NaN stays NaN, as rnn_relu_fwd
    }
}

// Row stride (floats) of a shared-memory array whose rows hold n floats: n rounded up to
// float4s, made an odd number of float4s, so that the same column of 8 consecutive rows
// (a quarter warp's 16-byte reads) falls in 8 different groups of 4 banks. Used for the R
// slice (n = H) and for the h tile (n = k_tile, a multiple of 4: 4 * ((k_tile/4) | 1)).
__device__ __forceinline__ int pk_stride_r(int H) { return 4 * (((H + 3) / 4) | 1); }

// Every block waits here until all gridDim.x blocks have arrived `target / gridDim.x` times.
__device__ __forceinline__ void grid_barrier(unsigned int* sync, unsigned int target) {
    __syncthreads();   // the whole block's writes of this step are issued
    if (threadIdx.x == 0) {
        pk_fence_acq_rel();   // ... and visible GPU-wide before the arrival counts (release)
        atomicAdd(sync, 1u);
        const long long start = clock64();
        while (ld_relaxed_gpu(sync) < target) {
            if (clock64() - start > PK_SPIN_LIMIT) __trap();   // not co-resident: fail, not hang
        }
        pk_fence_acq_rel();   // acquire: every arrival's writes before this block's reads
    }
    __syncthreads();   // no thread reads the next step's h before thread 0 saw all arrivals
}

// The last block out resets the counters for the next launch (docs/kernels.md, the barrier
// contract).
__device__ __forceinline__ void grid_exit(unsigned int* sync) {
    if (threadIdx.x == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        atomicExch(sync, 0u);
        atomicExch(sync + 1, 0u);
    }
}

__device__ __forceinline__ int pk_pow2ceil(int x) {
    int p = 1;
    while (p < x) p <<= 1;
    return p;
}

// The decomposition of one block (docs/kernels.md; rnnrt/kernels/persistent.py's
// geometry() computes the same numbers for the host).
struct PkGeom {
    int M;            // rows of the R slice: G * U
    int LR, LB, LK;   // lanes of a warp: row groups x batch groups x k-groups (product 32)
    int NW, NKG;      // warps; k-groups = NW * LK
    int RT, BT;       // output tiles (rows x batches) a lane loops over
    int CPW;          // float4 chunks of a tile each warp owns
    int SR, SH, BP;   // row strides (floats): R slice, h tile, partial sums
};

__device__ __forceinline__ PkGeom pk_geometry(int G, int U, int B, int H, int KT, int nt) {
    PkGeom g;
    g.M = G * U;
    g.LR = min(PK_LR_MAX, pk_pow2ceil((g.M + PK_TM - 1) / PK_TM));
    g.LB = min(32 / g.LR, pk_pow2ceil((B + PK_TB - 1) / PK_TB));
    g.LK = 32 / (g.LR * g.LB);
    g.NW = nt / 32;
    g.NKG = g.NW * g.LK;
    g.RT = (g.M + PK_TM * g.LR - 1) / (PK_TM * g.LR);
    g.BT = (B + PK_TB * g.LB - 1) / (PK_TB * g.LB);
    g.CPW = (KT / 4 + g.NW - 1) / g.NW;
    g.SR = pk_stride_r(H);
    g.SH = pk_stride_r(KT);
    g.BP = 32 * ((B - g.LB + 31) / 32) + g.LB;
    return g;
}

#include "persistent_mma.cuh"

// The decomposition of the tensor-core grid kernel (MMA: persistent_mma.cuh): every warp is
// one k-group (NKG = NW; LR = LB = LK = 1) that owns the same CPW chunks of every h tile as
// the FMA path; RT x BT are its m16 x n8 tiles of the partial sums; the strides are
// pk_mma_stride's (8-byte fragment loads without bank conflicts). rnnrt/kernels/mma.py's
// mma_geometry computes the same numbers for the host.
template <bool MMA>
__device__ __forceinline__ PkGeom pk_geom(int G, int U, int B, int H, int KT, int nt) {
    if constexpr (!MMA) {
        return pk_geometry(G, U, B, H, KT, nt);
    } else {
        PkGeom g;
        g.M = G * U;
        g.LR = g.LB = g.LK = 1;
        g.NW = nt / 32;
        g.NKG = g.NW;
        g.RT = (g.M + 15) / 16;
        g.BT = (B + 7) / 8;
        g.CPW = (KT / 4 + g.NW - 1) / g.NW;
        g.SR = pk_mma_stride(H);
        g.SH = pk_mma_stride(KT);
        g.BP = pk_mma_stride(B);
        return g;
    }
}

// One warp stages chunks [ca, cb) (float4 columns k0 + 4*cc) of rows [0, B) of h_t into the
// h tile. 16-byte cp.async where every row of h_t starts 16-byte aligned and has whole
// float4s (vec); else 4-byte loads (zeros past H) stored at once. A warp's consecutive lanes
// take consecutive chunks of one row.
// Typed instantiations (PkRaw false) take the 4-byte path: each element converted to float
// and rounded as the product reads it (pk_operand); vec is false for them.
template <class TS, bool TF32>
__device__ __forceinline__ void pk_stage4(float* dst, const TS* src, int k, int H) {
#pragma unroll
    for (int u = 0; u < 4; ++u) dst[u] = (k + u < H) ? pk_operand<TS, TF32>(pk_ldcg(src + u)) : 0.f;
}

template <class TS, bool TF32>
__device__ __forceinline__ void pk_stage(float* hs, int SH, const TS* ht, long long ldh,
                                         int B, int H, int k0, int ca, int cb, bool vec,
                                         int lane) {
    if (PK_TIMING & 1) return;
    const int n = cb - ca;
    if (n <= 0) return;
    // word e = lane + 32*it is (b, cc) = (e / n, ca + e % n); one division here, then the
    // lane's next word is 32 words on: dq rows and dr chunks further, wrapping at n. The
    // addresses step with it (the first profiles of v3 spent ~50, then ~36 instructions a
    // 16-byte copy on dividing and 64-bit address arithmetic in the loop).
    int b = lane / n, cc = lane - b * n;
    const int dq = 32 / n, dr = 32 - dq * n;
    const TS* src = ht + b * ldh + k0 + 4 * (ca + cc);
    float* dst = hs + b * SH + 4 * (ca + cc);
    const long long s_step = dq * ldh + 4 * dr, s_wrap = ldh - 4 * n;
    const int d_step = dq * SH + 4 * dr, d_wrap = SH - 4 * n;
    int k = k0 + 4 * (ca + cc);   // the column of src (only the 4-byte path needs it)
    while (b < B) {
        if constexpr (PkRaw<TS, TF32>::v) {
            if (vec) pk_cp_async16(dst, src);
            else pk_stage4<TS, TF32>(dst, src, k, H);
        } else {
            pk_stage4<TS, TF32>(dst, src, k, H);
        }
        b += dq;
        cc += dr;
        src += s_step;
        dst += d_step;
        k += 4 * dr;
        if (cc >= n) {
            cc -= n;
            ++b;
            src += s_wrap;
            dst += d_wrap;
            k -= 4 * n;
        }
    }
}

// acc[i][jb] += R rows . h batches over one float4 chunk (rv: PK_TM rows, hv: PK_TB batches)
__device__ __forceinline__ void pk_fma_chunk(float (&acc)[PK_TM][PK_TB], const float4 (&rv)[PK_TM],
                                             const float4 (&hv)[PK_TB]) {
#pragma unroll
    for (int i = 0; i < PK_TM; ++i)
#pragma unroll
        for (int jb = 0; jb < PK_TB; ++jb) {
            acc[i][jb] = fmaf(rv[i].x, hv[jb].x, acc[i][jb]);
            acc[i][jb] = fmaf(rv[i].y, hv[jb].y, acc[i][jb]);
            acc[i][jb] = fmaf(rv[i].z, hv[jb].z, acc[i][jb]);
            acc[i][jb] = fmaf(rv[i].w, hv[jb].w, acc[i][jb]);
        }
}

// acc += chunks c0 + lk, c0 + lk + LK, ... < c1 of one output tile; ra / ha: the tile's 12
// shared addresses at chunk c0 + lk, advanced past the last chunk read. The next chunk's 12
// loads are issued before the current chunk's 128 FMAs (the first profile of v3 showed every
// chunk's FMAs waiting on their own loads: with 2 warps a scheduler nothing else hid it).
__device__ __forceinline__ void pk_fma_range(float (&acc)[PK_TM][PK_TB], pk_saddr (&ra)[PK_TM],
                                             pk_saddr (&ha)[PK_TB], int c0, int c1, int lk,
                                             int LK) {
    if (PK_TIMING & 2) return;
    int cc = c0 + lk;
    if (cc >= c1) return;
    const unsigned int step = 16u * LK;
    float4 rv[PK_TM], hv[PK_TB];
#pragma unroll
    for (int i = 0; i < PK_TM; ++i) { rv[i] = pk_lds128(ra[i]); ra[i] += step; }
#pragma unroll
    for (int i = 0; i < PK_TB; ++i) { hv[i] = pk_lds128(ha[i]); ha[i] += step; }
    for (cc += LK; cc < c1; cc += LK) {
        float4 rn[PK_TM], hn[PK_TB];
#pragma unroll
        for (int i = 0; i < PK_TM; ++i) { rn[i] = pk_lds128(ra[i]); ra[i] += step; }
#pragma unroll
        for (int i = 0; i < PK_TB; ++i) { hn[i] = pk_lds128(ha[i]); ha[i] += step; }
        pk_fma_chunk(acc, rv, hv);
#pragma unroll
        for (int i = 0; i < PK_TM; ++i) rv[i] = rn[i];
#pragma unroll
        for (int i = 0; i < PK_TB; ++i) hv[i] = hn[i];
    }
    pk_fma_chunk(acc, rv, hv);
}

// The 12 shared addresses of lane (lr, lb)'s rows and batches in output tile (r0, b0) at
// float4 chunk c of the h tile at column k0: 32-bit, stepped by pk_fma_range (the first
// profile of v3 spent ~1,200 address instructions a step on 64-bit pointers). Rows / batches
// past the block's are read clamped (never stored).
__device__ __forceinline__ void pk_addresses(const PkGeom& g, const float* Rs, const float* hs,
                                             int B, int k0, int c, int r0, int b0,
                                             pk_saddr (&ra)[PK_TM], pk_saddr (&ha)[PK_TB]) {
#pragma unroll
    for (int i = 0; i < PK_TM; ++i)
        ra[i] = pk_smem_addr(Rs + min(r0 + g.LR * i, g.M - 1) * g.SR + k0 + 4 * c);
#pragma unroll
    for (int i = 0; i < PK_TB; ++i)
        ha[i] = pk_smem_addr(hs + min(b0 + g.LB * i, B - 1) * g.SH + 4 * c);
}

// acc += lane group lk's chunks c0 + lk, c0 + lk + LK, ... < c1 of the h tile at column k0.
__device__ __forceinline__ void pk_fma_span(float (&acc)[PK_TM][PK_TB], const PkGeom& g,
                                            const float* Rs, const float* hs, int B, int k0,
                                            int c0, int c1, int r0, int b0, int lk) {
    pk_saddr ra[PK_TM], ha[PK_TB];
    pk_addresses(g, Rs, hs, B, k0, c0 + lk, r0, b0, ra, ha);
    pk_fma_range(acc, ra, ha, c0, c1, lk, g.LK);
}

// The lane's register tile added into its k-group's partial sums red[kg][r][b] (stored when
// `first`: the step's first write), rows < M and batches < B only: one writer an element.
__device__ __forceinline__ void pk_flush(const float (&acc)[PK_TM][PK_TB], const PkGeom& g,
                                         float* red, int B, int r0, int b0, int kg,
                                         bool first) {
#pragma unroll
    for (int i = 0; i < PK_TM; ++i) {
        const int r = r0 + g.LR * i;
#pragma unroll
        for (int jb = 0; jb < PK_TB; ++jb) {
            const int b = b0 + g.LB * jb;
            if (r < g.M && b < B) {
                float* const p = red + ((long long)kg * g.M + r) * g.BP + b;
                *p = first ? acc[i][jb] : *p + acc[i][jb];
            }
        }
    }
}

// CL = 0: the grid kernel (h_t staged from L2, the flag grid barrier); CL = PK_CLUSTER: the
// cluster kernel (docs/kernels.md: h_t pushed into every block's shared memory, the cluster
// barrier; cluster n owns batches [n*BC, n*BC + BC), BC = ceil(B / clusters)).
// TS, TF32: the storage of h and of the product's operands (persistent_common.cuh); <float,
// false> is the fp32 kernel. h is stored rounded to TS, and what the product reads of h
// and R is rounded as the rungs' GEMMs read it (pk_operand); all else is fp32.
// MMA: the product on tensor cores (persistent_mma.cuh; grid kernel, TS bf16 / fp16 only):
// each warp one k-group, mma.sync over its chunks of every h tile into the same partial
// sums red[kg][r][b]; staging, barrier, pointwise phase and stores are the FMA path's.
template <int G, int CELL, int CL, class TS = float, bool TF32 = false, bool MMA = false>
__device__ __forceinline__ void persistent_fwd(
        int Bfull, int H, TS* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, const float* gx, long long ldgx, const float* w,
        long long ldw, const float* bw, long long ldbw, const float* br, long long ldbr,
        int T, int U, int KT) {
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    if (U < 1 || Bfull < 1 || H < 1 || KT < 4 || KT % 4 != 0 || nt % 32 != 0) __trap();
    // This block's hidden-unit slice (rank) and batch slice [b_off, b_off + B) of Bfull; BG
    // (the batch the shared-memory layout is sized for) is the same in every block.
    const int S = Bfull;   // rows of a step in every time-major array
    int rank = blockIdx.x, ranks = gridDim.x, BG = Bfull, b_off = 0, B = Bfull;
    if (CL) {
        rank = (int)pk_cluster_rank();
        ranks = CL;
        BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();
        b_off = (int)pk_cluster_id() * BG;
        B = min(BG, Bfull - b_off);
        if (B < 1 || KT < H) __trap();   // an empty cluster; the cluster kernel's one tile
    }
    static_assert(!MMA || (CL == 0 && !TF32), "the mma product: grid kernel, bf16 / fp16");
    const PkGeom g = pk_geom<MMA>(G, U, BG, H, KT, nt);
    const long long need = 4LL * ((long long)g.M * g.SR + (CL ? 2LL : 1LL) * BG * g.SH
                                  + (long long)g.NKG * g.M * g.BP);
    if ((long long)ranks * U < H || (long long)U * BG > (long long)PK_CPT * nt ||
        (long long)dynamic_smem_bytes() < need)
        __trap();
    h += b_off * ldh;   // row b of step t of every array is now row t*S + b
    if (c) c += b_off * ldc;
    if (act) act += b_off * ldact;
    gx += b_off * ldgx;
    bw += b_off * ldbw;
    br += b_off * ldbr;
    const int j0 = rank * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns
    float* const Rs = smem;                           // [M][SR]
    float* const hs = Rs + g.M * g.SR;                // [B][SH] (cluster kernel: [2][BG][SH])
    float* const red = hs + (CL ? 2 : 1) * BG * g.SH;   // [NKG][M][BP]
    const int lr = lane % g.LR, lb = (lane / g.LR) % g.LB, lk = lane / (g.LR * g.LB);
    const int kg = MMA ? warp : warp * g.LK + lk;
    // 16-byte staging where every row of h_t starts 16-byte aligned and has whole float4s
    // (H, ldh multiples of 4, h 16-byte aligned; the same for every block)
    const bool vec = PkRaw<TS, TF32>::v && H % 4 == 0 && ldh % 4 == 0 &&
                     (reinterpret_cast<unsigned long long>(h) & 15ull) == 0;

    // Pointwise cells of this thread: e = tid + i*nt, jj = e % U, b = e / U (live: jj < Ub,
    // b < B): a warp's stores cover 32/U rows of U consecutive units each (b fastest, the
    // first version, made each store touch 32 rows). gx of step t+1 is loaded at the end of
    // step t, before the barrier (streamed, ld.cs); the biases once (read-only, ld.nc);
    // c_t (LSTM) and h_t (GRU) of the cells are the thread's own writes of the step before:
    // registers.
    float xg[G][PK_CPT], bwv[G][PK_CPT], brv[G][PK_CPT], carry[PK_CPT];
    // (b, j) of each cell, once: the division by the runtime U, recomputed every step, was
    // ~150 of ~2,400 instructions a warp-step (profile of the cluster kernel, LSTM H 128)
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
    auto cell_of = [&](int i, int& b, int& j) {
        b = cell_b[i];
        j = cell_j[i];
        return cell_live[i];
    };
    auto prefetch = [&](int t) {
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            int b, j;
            const bool live = cell_of(i, b, j);
            const float* const x = gx + ((long long)t * S + b) * ldgx + j;
#pragma unroll
            for (int q = 0; q < G; ++q) xg[q][i] = live ? __ldcs(x + q * (long long)H) : 0.f;
        }
    };
    // The biases of the cells, once: they do not change from step to step
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        int b, j;
        const bool live = cell_of(i, b, j);
        const float* const y = bw + b * ldbw + j;
        const float* const z = br + b * ldbr + j;
#pragma unroll
        for (int q = 0; q < G; ++q) {
            bwv[q][i] = live ? __ldg(y + q * (long long)H) : 0.f;
            brv[q][i] = live ? __ldg(z + q * (long long)H) : 0.f;
        }
    }
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        int b, j;
        const bool live = cell_of(i, b, j);
        carry[i] = 0.f;
        if constexpr (CELL == CELL_LSTM) {
            if (live) carry[i] = c[b * ldc + j];
        } else if constexpr (CELL == CELL_GRU) {
            if (live) carry[i] = to_f(h[b * ldh + j]);
        }
    }
    prefetch(0);   // step 0's: in flight during the copy of R

    // R slice, once: row q*U + ju holds R[q*H + j0 + ju, :], zeros past H and past Ub.
    for (int e = tid; e < g.M * g.SR; e += nt) {
        const int row = e / g.SR, k = e - row * g.SR;
        const int q = row / U, ju = row - q * U;
        Rs[e] = (ju < Ub && k < H) ? pk_operand<TS, TF32>(w[((long long)q * H + j0 + ju) * ldw + k])
                                   : 0.f;
    }
    if (CL) {
        // h_0 of the cluster's batches into buffer 0; zeros in both buffers' columns past H
        // (the last float4 chunk reads them; the pushes below write columns < H only)
        for (int e = tid; e < 2 * BG * g.SH; e += nt) {
            const int buf = e / (BG * g.SH), r = e - buf * BG * g.SH;
            const int b = r / g.SH, k = r - b * g.SH;
            if (k >= H) hs[e] = 0.f;
            else if (buf == 0 && b < B) hs[e] = pk_operand<TS, TF32>(to_f(h[b * ldh + k]));
        }
        pk_cluster_sync();   // every block of the cluster runs before any block pushes to it
    } else {
        __syncthreads();   // the R slice is read by every warp
    }

    for (int t = 0; t < T; ++t) {
        const TS* const ht = h + (long long)t * S * ldh;   // h_t: rows t*S .. t*S+B-1
        float* const hcur = CL ? hs + (t & 1) * BG * g.SH : hs;   // the h tile of step t
        // This warp's columns of the h tile were last read by this warp (before the
        // __syncwarp that ended its previous tile), so it stages at once.
        // Warp w's chunks of the h tile at column k0: [ca, cb), in halves [ca, cm), [cm, cb).
        auto range = [&](int k0, int& ca, int& cm, int& cb) {
            const int CH = min(KT / 4, (H - k0 + 3) / 4);   // float4 chunks of this tile
            ca = min(CH, warp * g.CPW);
            cb = min(CH, ca + g.CPW);
            cm = ca + (cb - ca + 1) / 2;
        };
        int ca, cm, cb;
        range(0, ca, cm, cb);
        if (!CL) {
            pk_stage<TS, TF32>(hs, g.SH, ht, ldh, B, H, 0, ca, cm, vec, lane);
            pk_cp_commit();
            pk_stage<TS, TF32>(hs, g.SH, ht, ldh, B, H, 0, cm, cb, vec, lane);
            pk_cp_commit();
        }
        // The halves are a ping-pong across the h tiles: each half of tile k+1 is staged as
        // soon as the same half of tile k is multiplied, so the L2 reads of one overlap the
        // FMAs of the other (the next tile's halves lie within this warp's same columns:
        // [na, nm) in [ca, cm), [nm, nb) after it). Every half commits one cp.async group
        // (empty past the last tile), so waiting for all but the newest group is always
        // "this half has landed". With one output tile (the common case: G*U <= 32 rows,
        // B <= 64) the sums stay in registers over all h tiles and are written once; with
        // several, each half's sums of each output tile are added into red. The cluster
        // kernel has all of h_t in its buffer already (one tile, nothing to stage or wait
        // for) and multiplies the same halves in the same order.
        // The mma path (MMA): one group of register tiles (M <= 16 PK_MMA_MT rows, B <= 8
        // PK_MMA_NT batches) is kept over all h tiles, like one output tile here.
        const bool one_tile = MMA ? g.RT <= PK_MMA_MT && g.BT <= PK_MMA_NT
                                  : g.RT * g.BT == 1;
        float acc1[PK_TM][PK_TB];
#pragma unroll
        for (int i = 0; i < PK_TM; ++i)
#pragma unroll
            for (int jb = 0; jb < PK_TB; ++jb) acc1[i][jb] = 0.f;
        float macc[PK_MMA_MT][PK_MMA_NT][4];
        if constexpr (MMA) pk_mma_zero(macc);
        // Output tile (rt, bt) of this lane over chunks [c0, c1) and then [c2, c3) of the h
        // tile at column k0, added into (first: stored as) its k-group's partial sums.
        auto tile_sums = [&](int rt, int bt, int k0, int c0, int c1, int c2, int c3,
                             bool first) {
            const int r0 = rt * PK_TM * g.LR + lr, b0 = bt * PK_TB * g.LB + lb;
            float acc[PK_TM][PK_TB];
#pragma unroll
            for (int i = 0; i < PK_TM; ++i)
#pragma unroll
                for (int jb = 0; jb < PK_TB; ++jb) acc[i][jb] = 0.f;
            pk_fma_span(acc, g, Rs, hcur, B, k0, c0, c1, r0, b0, lk);
            if (c2 < c3) pk_fma_span(acc, g, Rs, hcur, B, k0, c2, c3, r0, b0, lk);
            pk_flush(acc, g, red, B, r0, b0, kg, first);
        };
        auto half = [&](int k0, int c0, int c1, bool first) {
            if (!CL) {
                pk_cp_wait<1>();   // this half has landed (this lane's part of it) ...
                __syncwarp();      // ... and every lane's
            }
            if constexpr (MMA) {
                if (one_tile) {
                    pk_mma_span<TS>(macc, g, Rs, hcur, B, H, k0, c0, c1, 0, 0, lane);
                } else {   // each group of tiles: this half's sums added into red
                    pk_mma_groups<TS>(g, Rs, hcur, B, H, k0, c0, c1, red, kg, lane, first);
                }
            } else if (one_tile) {
                pk_fma_span(acc1, g, Rs, hcur, B, k0, c0, c1, lr, lb, lk);
            } else {
                for (int rt = 0; rt < g.RT; ++rt)
                    for (int bt = 0; bt < g.BT; ++bt) tile_sums(rt, bt, k0, c0, c1, c1, c1, first);
            }
            if (!CL) __syncwarp();   // the half is read: the next tile's may land there
        };
        if (CL && !one_tile) {
            // The cluster kernel's one tile is all there: each output tile takes both halves
            // into registers (same chunks, same order) and is stored once, instead of the
            // grid kernel's read-add-write of the partial sums a half (its first profile at
            // LSTM H 128: ~1 us a step of serialised shared-memory read-add-writes).
            for (int rt = 0; rt < g.RT; ++rt)
                for (int bt = 0; bt < g.BT; ++bt) tile_sums(rt, bt, 0, ca, cm, cm, cb, true);
        }
        for (int k0 = 0; k0 < H && !(CL && !one_tile); k0 += KT) {
            const int kn = k0 + KT;
            int na = 0, nm = 0, nb = 0;
            if (kn < H) range(kn, na, nm, nb);
            half(k0, ca, cm, k0 == 0);
            if (!CL) {
                pk_stage<TS, TF32>(hs, g.SH, ht, ldh, B, H, kn, na, nm, vec, lane);
                pk_cp_commit();
            }
            half(k0, cm, cb, false);
            if (!CL) {
                pk_stage<TS, TF32>(hs, g.SH, ht, ldh, B, H, kn, nm, nb, vec, lane);
                pk_cp_commit();
            }
            ca = na;
            cm = nm;
            cb = nb;
        }
        if constexpr (MMA) {
            if (one_tile) pk_mma_flush(macc, g, red, B, 0, 0, kg, lane, true);
        } else if (one_tile) {
            pk_flush(acc1, g, red, B, lr, lb, kg, true);
        }
        __syncthreads();   // every k-group's partial sums are in red

        // This step's outputs of cell i to global memory: h_{t+1}, c_{t+1} (LSTM) and the saved
        // gates (act). Nothing in the launch reads them back (the grid kernel reads h_{t+1}
        // from global memory after its barrier; the cluster kernel from its shared buffers),
        // so the cluster kernel issues them after its barrier's arrive: its release then waits
        // only for the pushes into the cluster's shared memory, not for these L2 round trips.
        float keep_h[PK_CPT] = {}, keep_c[PK_CPT] = {}, keep_a[4][PK_CPT] = {};
        auto store_cell = [&](int i) {
            int b, j;
            if ((PK_TIMING & 8) || !cell_of(i, b, j)) return;
            const long long row = (long long)t * S + b;   // step t, batch b
            if constexpr (CELL == CELL_LSTM) c[(row + S) * ldc + j] = keep_c[i];
            if constexpr (CELL == CELL_LSTM || CELL == CELL_GRU)
                store_gates(act + row * ldact + j, H, keep_a[0][i], keep_a[1][i], keep_a[2][i],
                            keep_a[3][i]);
            pk_stcg(h + (row + S) * ldh + j, keep_h[i]);   // h_{t+1}[b, j], rounded to TS
        };
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            int b, j;
            if ((PK_TIMING & 8) || !cell_of(i, b, j)) continue;
            const int jj = j - j0;
            float s[G], xb[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float* const p = red + (q * U + jj) * g.BP + b;   // 32-bit offsets:
                const int kstride = g.M * g.BP;   // the partial sums are in shared memory
                float v = p[0];
                for (int k = 1; k < g.NKG; ++k) v += p[k * kstride];
                // gx + bw here, not at the top of the step: the loads of gx (issued before
                // the previous barrier) then have the FMA phase to land in
                xb[q] = xg[q][i] + bwv[q][i];
                const float brq = brv[q][i];
                // ((gx + bw) + gh) + br, the fused kernels' order (GRU's n gate: gh_n + br_n;
                // r * (gh_n + br_n) is added to gx_n + bw_n below)
                s[q] = (CELL == CELL_GRU && q == 2) ? v + brq : (xb[q] + v) + brq;
            }
            const float hv = pk_cell_update<G, CELL, TS>(s, xb, carry[i], keep_c[i],
                                                         keep_a[0][i], keep_a[1][i],
                                                         keep_a[2][i], keep_a[3][i]);
            keep_h[i] = hv;
            if (!CL) store_cell(i);
            if (CL && !(PK_TIMING & 1)) {   // h_{t+1}[b, j] into every block's next buffer
                const pk_saddr a = pk_smem_addr(hs + ((t + 1) & 1) * BG * g.SH + b * g.SH + j);
                const float hop = pk_operand<TS, TF32>(hv);   // as staged from h_{t+1}
#pragma unroll
                for (int r = 0; r < CL; ++r) pk_st_cluster(a, (unsigned int)r, hop);
            }
        }
        if (CL) {
            // After every step, the last too: h_{t+1} is in every buffer before any block
            // reads it, every block has read buffer t & 1 (and red) before it is rewritten,
            // and no block exits while another may still push into its shared memory. The
            // global stores (see store_cell) and the loads of step t+1's gx go between the
            // arrive and the wait: the arrive's release is a MEMBAR.ALL.GPU in SASS, which
            // waits for every memory access the thread has in flight (the profile: ~8% of
            // a step's samples there while gx was loaded before it).
            if (PK_TIMING & 4) {   // timing only: no cluster barrier a step
                if (t + 1 < T) prefetch(t + 1);
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i) store_cell(i);
                __syncthreads();
            } else {
                pk_cluster_arrive();
                if (t + 1 < T) prefetch(t + 1);
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i) store_cell(i);
                pk_cluster_wait();
            }
        } else if (t + 1 < T) {
            prefetch(t + 1);   // step t+1's gx and biases: in flight across the barrier
            if (!(PK_TIMING & 4)) grid_barrier(sync, (unsigned int)(t + 1) * gridDim.x);
            else __syncthreads();   // red is rewritten next step: the block must be past it
        }
    }
    if (CL && (PK_TIMING & 4)) pk_cluster_sync();   // timing only: no exit before the pushes
    if (!CL) grid_exit(sync);
}

#endif  // RNNRT_PERSISTENT_LAYER_CUH
