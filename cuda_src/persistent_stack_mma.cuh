/*
 * persistent_stack_mma.cuh: the product the two tensor-core stack kernels share (#included by
 * persistent_stack_mma.cu, the forward, and persistent_stack_mma_bwd.cu, the backward in
 * cluster pairs; rnnrt's loader inlines it). No kernels.
 *   PSM_BMAX, PSM_KT, PSM_SX, PSM_RP   most batches, columns of a staged tile, its batch rows'
 *                              stride (16-bit elements), a batch's partial-sum stride (floats)
 *   psm_lds64                  a lane's 8-byte fragment load (two packed pairs)
 *   psm_zero, psm_k16<TS>      a warp's acc[4][4][4] zeroed; += 64 rows of A x its 32
 *                              batches of a staged tile over 16 columns: 16 mma.sync m16n8k16
 *   psm_flush                  the four k-groups' register tiles into two partial sums
 *                              red[m] = p_m + p_{m+2} (two passes, a __syncthreads each)
 * The cut both kernels use: 64 product rows a block (A: [64][SA] 16-bit, k contiguous),
 * 8 warps, warp w = batch half nh = w & 1 (batches 32nh ..) and k-group kg = w >> 1 (of each
 * tile of PSM_KT columns, the 16 at 16kg); the staged operand: [PSM_BMAX][PSM_SX] 16-bit,
 * one row a batch, k contiguous (an h row forward, a dg row backward: as they lie in memory).
 * Design: docs/kernels.md ("The tensor-core stack kernel", "The tensor-core stack backward").
 */
#ifndef RNNRT_PERSISTENT_STACK_MMA_CUH
#define RNNRT_PERSISTENT_STACK_MMA_CUH

#include "mma_sync.cuh"

#define PSM_BMAX 64                // most batches
#define PSM_KT 64                  // columns of a staged tile: one k16 step a k-group
#define PSM_SX (PSM_KT + 16)       // row stride (elements) of a staged tile's batch rows
#define PSM_RP 68                  // row stride (floats) of a batch's partial sums
// Row strides of 16-bit rows read by 8-byte fragment loads: = 16 mod 64 elements (32 bytes
// mod 128), so a half warp's loads (4 rows g x 4 lanes c, 32 bytes a row) cover the 32 banks
// once; the A rows: 2H + 16 (H a multiple of 64), the tile: PSM_SX.
static_assert(PSM_SX % 64 == 16, "conflict-free fragment loads of a tile");

// 8 bytes of shared memory at p (8-byte aligned) as two 32-bit registers: the lane's columns
// k .. k+3 of one row, i.e. two packed pairs (k, k+1) and (k+2, k+3).
struct psm_pair { unsigned int lo, hi; };
__device__ __forceinline__ psm_pair psm_lds64(const unsigned short* p) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    return {v.x, v.y};
}

// acc[mt][nt] += A rows 16mt .. 16mt+15 (all 64) x stage batches b0 + 8nt .. +7 over the 16
// columns at ka of A and kx of the stage. Fragment k order: a lane's pairs (4c, 4c+1) and
// (4c+2, 4c+3) of the 16 columns stand in the PTX layout's slots (2c, 2c+1) and (2c+8,
// 2c+9), for A and B alike: one bijection of the 16 columns onto the 16 slots, so the mma
// sums the same 16 products, and each lane's fragment is ONE 8-byte load a row (the
// layout's a0/a2, a1/a3, b0/b1 pairs). n8 tiles at or past B are skipped (warp-uniform).
template <class TS>
__device__ __forceinline__ void psm_k16(float (&acc)[4][4][4], const unsigned short* As,
                                        int sa, int ka, const unsigned short* xs, int kx,
                                        int b0, int B, int lane) {
    if (PK_TIMING & 2) return;
    const int g = lane >> 2, c4 = 4 * (lane & 3);
    unsigned int bf[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        const psm_pair v = psm_lds64(xs + (b0 + 8 * nt + g) * PSM_SX + kx + c4);
        bf[nt][0] = v.lo;
        bf[nt][1] = v.hi;
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
        const psm_pair r0 = psm_lds64(As + (16 * mt + g) * sa + ka + c4);
        const psm_pair r8 = psm_lds64(As + (16 * mt + g + 8) * sa + ka + c4);
        const unsigned int a[4] = {r0.lo, r8.lo, r0.hi, r8.hi};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
            if (b0 + 8 * nt < B) pk_mma16816<TS>(acc[mt][nt], a, bf[nt]);
    }
}

__device__ __forceinline__ void psm_zero(float (&acc)[4][4][4]) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
}

// Four k-groups into two partial sums: k-groups 2, 3 store, 0, 1 add theirs (red[m] = p_m +
// p_{m+2}). red[m][b][row], row stride PSM_RP: a warp's stores of one register (rows g,
// batches 2c: offsets 136c + g) hit 32 different banks. Every thread of the block calls it
// (two __syncthreads); red's batches past B in a live n8 tile are written, never read.
__device__ __forceinline__ void psm_flush(const float (&acc)[4][4][4], float* red, int kg,
                                          int b0, int B, int lane) {
    for (int pass = 0; pass < 2; ++pass) {
        if ((kg >= 2) == (pass == 0) && b0 < B) {
            float* const r0 = red + (kg & 1) * PSM_BMAX * PSM_RP;
            const int g = lane >> 2, c2 = 2 * (lane & 3);
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    if (b0 + 8 * nt >= B) continue;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int row = 16 * mt + g + 8 * (i >> 1);
                        const int b = b0 + 8 * nt + c2 + (i & 1);
                        float* const p = r0 + b * PSM_RP + row;
                        *p = pass == 0 ? acc[mt][nt][i] : *p + acc[mt][nt][i];
                    }
                }
        }
        __syncthreads();
    }
}

#endif  // RNNRT_PERSISTENT_STACK_MMA_CUH
