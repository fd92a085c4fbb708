/*
 * transpose.cu: out = in^T for row-major fp32 views, through a shared-memory tile so that
 * both the reads of `in` and the writes of `out` are coalesced along rows.
 *
 * Calling convention: kernel(int rows, int cols, outs..., ins...), each view a
 * (float* p, int ld) pair, element (r, c) at p[r*ld + c]; ld = 0 broadcasts one row of
 * `in`. rows and cols are the INPUT's. `out` must not overlap `in` (no in-place transpose).
 * Launch: block (32, 8); grid (column tiles, row tiles), each capped, the kernel loops over
 * any tiles beyond the grid. The block must be (TILE, TILE_ROWS) = (32, 8): one thread per
 * tile column, each thread TILE / TILE_ROWS = 4 rows of a tile, a count fixed at compile time
 * so that its 4 loads are issued together (a loop over blockDim.y made one load, waited for,
 * at a time); another block shape traps.
 *
 * Element types: `extern "C"` transpose takes float pointers (the fp32 plans' kernel); its
 * typed twin, the template transpose_t<TOUT, TIN> (each float, bf16 or fp16: storage.cuh),
 * reads through to_f and rounds on the store (from_f), the tile fp32 (a low-precision plan's
 * pre-transposed weights: the fp32 master transposed into a 16-bit copy).
 *
 * Kernels (one variant, and its typed twin):
 *   kernel transpose(rows, cols)   out[c, r] = in[r, c] for r < rows, c < cols
 *     out out [cols, rows]
 *     in  in  [rows, cols]
 */

// bf16, fp16, to_f, from_f
#include "storage.cuh"

#define TILE 32
#define TILE_ROWS 8   // blockDim.y (rnnrt/kernels/registry.py launches (TILE, TILE_ROWS))

// The tiled transpose of both kernels (TOUT, TIN: the element types), through `tile`, the
// kernel's shared [TILE][TILE + 1] floats (+1 column: the column-wise reads below then fall
// in 32 different banks, not one).
template <class TOUT, class TIN>
__device__ __forceinline__ void transpose_tiles(int rows, int cols, TOUT* __restrict__ out,
                                                int ldout, const TIN* __restrict__ in,
                                                int ldin, float (*tile)[TILE + 1]) {
    const int tiles_r = (rows + TILE - 1) / TILE;
    const int tiles_c = (cols + TILE - 1) / TILE;
    const int tx = threadIdx.x;
    if (blockDim.x != TILE || blockDim.y != TILE_ROWS) __trap();
    for (int tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {
        for (int tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
            const long long r0 = (long long)tr * TILE, c0 = (long long)tc * TILE;
            // Read: a warp takes one row of the tile, consecutive addresses of `in`; a thread's
            // TILE / TILE_ROWS loads all issued before the first lands (a value outside the
            // problem is a 0 the write below never reads)
            float v[TILE / TILE_ROWS];
#pragma unroll
            for (int m = 0; m < TILE / TILE_ROWS; ++m) {
                const int k = threadIdx.y + m * TILE_ROWS;
                v[m] = (r0 + k < rows && c0 + tx < cols) ? to_f(in[(r0 + k) * ldin + c0 + tx])
                                                         : 0.f;
            }
#pragma unroll
            for (int m = 0; m < TILE / TILE_ROWS; ++m) tile[threadIdx.y + m * TILE_ROWS][tx] = v[m];
            __syncthreads();
            // Write: a warp takes one row of `out` (a column of the tile), consecutive addresses.
#pragma unroll
            for (int m = 0; m < TILE / TILE_ROWS; ++m) {
                const int k = threadIdx.y + m * TILE_ROWS;
                if (c0 + k < cols && r0 + tx < rows) {
                    const float w = tile[tx][k];
                    out[(c0 + k) * ldout + r0 + tx] = from_f<TOUT>(w);
                }
            }
            __syncthreads();  // the next tile overwrites `tile`
        }
    }
}

extern "C" __global__ void transpose(int rows, int cols, float* __restrict__ out, int ldout,
                                     const float* __restrict__ in, int ldin) {
    __shared__ float tile[TILE][TILE + 1];
    transpose_tiles(rows, cols, out, ldout, in, ldin, tile);
}

template <class TOUT, class TIN>
__global__ void transpose_t(int rows, int cols, TOUT* __restrict__ out, int ldout,
                            const TIN* __restrict__ in, int ldin) {
    __shared__ float tile[TILE][TILE + 1];
    transpose_tiles(rows, cols, out, ldout, in, ldin, tile);
}
