/*
 * persistent_mma.cuh: the tensor-core product phase of the per-layer grid kernel
 * (persistent_fwd<G, CELL, 0, TS, false, true>: the `*_persistent_mma_fwd_t<TS>` kernels of
 * persistent_mma.cu, TS bf16 or fp16). #included by persistent_layer.cuh (before
 * persistent_fwd, which calls it); rnnrt's loader inlines it. No kernels.
 *   PK_MMA_MT, PK_MMA_NT     m16 x n8 tiles of the partial sums a warp holds at once
 *   pk_mma_stride            row strides of the R slice, h tile and partial sums
 *   pk_pack2, pk_mma16816    (mma_sync.cuh, included here: shared with the tensor-core
 *                            stack kernel, persistent_stack_mma.cu)
 *   pk_mma_span, pk_mma_flush, pk_mma_groups
 *                            a warp's partial sums over one half of its chunks of an h tile;
 *                            its register tiles added into red[kg = warp][r][b]; both for
 *                            each group of register tiles where one group does not cover
 *                            M x B. The backward grid kernel (persistent_bwd.cuh, MMA) calls
 *                            them with its own operands: A = the R^T slice, B = dg_t^T.
 *
 * Why it is the same math as the FMA path: the R slice and the h tile hold the operands
 * already rounded as the rungs' GEMMs read them (pk_operand: bf16 / fp16 values as fp32),
 * so their conversion to bf16x2 / f16x2 is exact, and a product of two of them is exact in
 * fp32; the tensor core accumulates in fp32. Only the order of the sum over k differs (within
 * a k16 step the hardware's; across steps the warp's order), which the tests allow for.
 *
 * Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type";
 * g = lane >> 2, c = lane & 3; the lower k of a pair in the register's low half):
 *   A (R slice rows, row-major):  a0 (row g,   k 2c, 2c+1)   a1 (row g+8, k 2c, 2c+1)
 *                                 a2 (row g,   k 2c+8, +9)   a3 (row g+8, k 2c+8, +9)
 *   B (h_t^T, "col": h rows):     b0 (k 2c, 2c+1, batch g)   b1 (k 2c+8, 2c+9, batch g)
 *   D (fp32 partial sums):        d0, d1 (row g, batch 2c, 2c+1)  d2, d3 (row g+8, same)
 * Rows past M, batches past B and columns past the half (or past H) read as zeros: never
 * garbage times zero (the shared memory past the staged chunks is whatever was there).
 */
#ifndef RNNRT_PERSISTENT_MMA_CUH
#define RNNRT_PERSISTENT_MMA_CUH

// A warp's register tiles: PK_MMA_MT m16 tiles of rows x PK_MMA_NT n8 tiles of batches, 4
// fp32 each: 64 accumulators a lane (the FMA path's two register tiles are 64 too). Where
// M x B needs more (MT > PK_MMA_MT or NT > PK_MMA_NT), the warp loops over groups of tiles
// and adds each half's sums into red, as the FMA path does with several output tiles.
#define PK_MMA_MT 2
#define PK_MMA_NT 8

// Row stride (floats) of an array of n-float rows read by fragment loads: n rounded up to
// 32, plus 8, so that 8-byte loads of 4 consecutive rows (a half warp: rows g = 0..3, words
// 2c, 2c+1) cover the 32 banks once (row stride = 8 mod 32), and the row starts stay 8-byte
// aligned. The R slice (n = H), the h tile (n = k_tile) and the partial sums (n = B).
__device__ __forceinline__ int pk_mma_stride(int n) { return 32 * ((n + 31) / 32) + 8; }

#include "mma_sync.cuh"

// The pair of row p at columns k, k+1 (p 8-byte aligned) as one packed register; columns
// >= kend and a dead row read as zero (the loads are predicated, not the values masked:
// what lies past the staged chunks may be NaN).
template <class TS>
__device__ __forceinline__ unsigned int pk_mma_pair(const float* p, bool live, int k, int kend) {
    float lo = 0.f, hi = 0.f;
    if (live && k + 1 < kend) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        lo = v.x;
        hi = v.y;
    } else if (live && k < kend) {
        lo = p[0];
    }
    return pk_pack2<TS>(lo, hi);
}

// acc[mt][nt] += R rows (mt0 + mt)*16 .. +15 times h batches (nt0 + nt)*8 .. +7 over the h
// tile's columns [4*c0, min(4*c1, H - k0)) (this warp's chunks [c0, c1) of the tile at column
// k0), one k16 step after the other; the last step's columns past the half read as zeros.
// Rs: the R slice [M][SR] (column k0 + k of the tile is Rs column k0 + k); hs: the h tile
// [B][SH]. Tiles past M or B are skipped (their accumulators stay as they are).
template <class TS>
__device__ __forceinline__ void pk_mma_span(float (&acc)[PK_MMA_MT][PK_MMA_NT][4],
                                            const PkGeom& g, const float* Rs, const float* hs,
                                            int B, int H, int k0, int c0, int c1, int mt0,
                                            int nt0, int lane) {
    if (PK_TIMING & 2) return;
    const int gr = lane >> 2, tc = lane & 3;
    const int kend = min(4 * c1, H - k0);
    // this lane's rows and batches: (live, clamped) once, outside the k loop
    const float* rrow[PK_MMA_MT][2];
    bool rlive[PK_MMA_MT][2];
#pragma unroll
    for (int mt = 0; mt < PK_MMA_MT; ++mt)
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
            const int r = (mt0 + mt) * 16 + gr + 8 * h8;
            rlive[mt][h8] = r < g.M;
            rrow[mt][h8] = Rs + min(r, g.M - 1) * g.SR + k0;
        }
    const float* hrow[PK_MMA_NT];
    bool hlive[PK_MMA_NT];
#pragma unroll
    for (int nt = 0; nt < PK_MMA_NT; ++nt) {
        const int b = (nt0 + nt) * 8 + gr;
        hlive[nt] = b < B;
        hrow[nt] = hs + min(b, B - 1) * g.SH;
    }
    for (int kk = 4 * c0; kk < kend; kk += 16) {
        const int ka = kk + 2 * tc, kb = ka + 8;
        unsigned int a[PK_MMA_MT][4], b[PK_MMA_NT][2];
#pragma unroll
        for (int mt = 0; mt < PK_MMA_MT; ++mt) {
            a[mt][0] = pk_mma_pair<TS>(rrow[mt][0] + ka, rlive[mt][0], ka, kend);
            a[mt][1] = pk_mma_pair<TS>(rrow[mt][1] + ka, rlive[mt][1], ka, kend);
            a[mt][2] = pk_mma_pair<TS>(rrow[mt][0] + kb, rlive[mt][0], kb, kend);
            a[mt][3] = pk_mma_pair<TS>(rrow[mt][1] + kb, rlive[mt][1], kb, kend);
        }
#pragma unroll
        for (int nt = 0; nt < PK_MMA_NT; ++nt) {
            b[nt][0] = pk_mma_pair<TS>(hrow[nt] + ka, hlive[nt], ka, kend);
            b[nt][1] = pk_mma_pair<TS>(hrow[nt] + kb, hlive[nt], kb, kend);
        }
        // warp-uniform conditions: every lane of the warp takes each mma or none does
#pragma unroll
        for (int mt = 0; mt < PK_MMA_MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < PK_MMA_NT; ++nt)
                if ((mt0 + mt) * 16 < g.M && (nt0 + nt) * 8 < B) pk_mma16816<TS>(acc[mt][nt], a[mt], b[nt]);
    }
}

// The warp's register tiles (group mt0, nt0) added into its k-group's partial sums
// red[kg][r][b] (stored when `first`: the step's first write), rows < M and batches < B
// only: one writer an element (each (r, b) of the group is one lane's d_i).
__device__ __forceinline__ void pk_mma_flush(const float (&acc)[PK_MMA_MT][PK_MMA_NT][4],
                                             const PkGeom& g, float* red, int B, int mt0,
                                             int nt0, int kg, int lane, bool first) {
    const int gr = lane >> 2, tc = lane & 3;
#pragma unroll
    for (int mt = 0; mt < PK_MMA_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < PK_MMA_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = (mt0 + mt) * 16 + gr + 8 * (i >> 1);
                const int b = (nt0 + nt) * 8 + 2 * tc + (i & 1);
                if (r < g.M && b < B) {
                    float* const p = red + ((long long)kg * g.M + r) * g.BP + b;
                    *p = first ? acc[mt][nt][i] : *p + acc[mt][nt][i];
                }
            }
}

__device__ __forceinline__ void pk_mma_zero(float (&acc)[PK_MMA_MT][PK_MMA_NT][4]) {
#pragma unroll
    for (int mt = 0; mt < PK_MMA_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < PK_MMA_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
}

// A warp's sums over chunks [c0, c1) of the tile at column k0 where M x B needs more than
// one group of register tiles (MT > PK_MMA_MT or NT > PK_MMA_NT): group by group, each
// group's sums added into red (stored when `first`), as the FMA path does with several
// output tiles. The forward and the backward grid kernels' "not one group" branch.
template <class TS>
__device__ __forceinline__ void pk_mma_groups(const PkGeom& g, const float* Rs, const float* hs,
                                              int B, int H, int k0, int c0, int c1, float* red,
                                              int kg, int lane, bool first) {
    for (int mt0 = 0; mt0 < g.RT; mt0 += PK_MMA_MT)
        for (int nt0 = 0; nt0 < g.BT; nt0 += PK_MMA_NT) {
            float acc[PK_MMA_MT][PK_MMA_NT][4];
            pk_mma_zero(acc);
            pk_mma_span<TS>(acc, g, Rs, hs, B, H, k0, c0, c1, mt0, nt0, lane);
            pk_mma_flush(acc, g, red, B, mt0, nt0, kg, lane, first);
        }
}

#endif  // RNNRT_PERSISTENT_MMA_CUH
