/*
 * persistent_stack.cuh: what the two stack forward kernels share (persistent_stack.cu, fp32
 * FMAs; persistent_stack_mma.cu, tensor cores). #included by them; rnnrt's loader inlines it.
 * No kernels.
 *   PK_SLACK              steps the layer below must be ahead before a layer's step starts
 *   PS_FAST_CELL, ps_sigmoid, ps_tanh
 *                         the cell's activations (approximate exp / division by default)
 *   ps_cell_of<U>(e, b, jj)
 *                         pointwise cell e of a block (e = tid + i * PK_MAX_THREADS): unit
 *                         jj = e % U, batch b from r = e / U such that a warp's two rows of
 *                         cells are batches 4 apart (its partial-sum reads: 32 banks)
 */
#ifndef RNNRT_PERSISTENT_STACK_CUH
#define RNNRT_PERSISTENT_STACK_CUH

#include "persistent_common.cuh"

// Steps the layer below must be done with before a layer's step t starts: t + 1 is what
// the data needs; more only delays the layer (experiments: stack_bench.py --define).
#ifndef PK_SLACK
#define PK_SLACK 1
#endif
// The stack kernel's cell activations from the hardware's approximate exp and division
// (ex2.approx, rcp.approx: ~1e-6 relative, far inside the fp32 tolerance the tests assert);
// 0: the precise sigmoidf / tanhf of the other kernels (experiments: --define PS_FAST_CELL=0)
#ifndef PS_FAST_CELL
#define PS_FAST_CELL 1
#endif
__device__ __forceinline__ float ps_sigmoid(float x) {
    if (PS_FAST_CELL) return __fdividef(1.f, 1.f + __expf(-x));   // exp -> inf: 1/inf = 0
    return sigmoidf(x);
}
__device__ __forceinline__ float ps_tanh(float x) {
    if (PS_FAST_CELL) return 2.f * ps_sigmoid(2.f * x) - 1.f;
    return tanhf(x);
}

// Pointwise cell e of a block: jj = e % U (fastest: a warp's h stores are runs of U
// consecutive units), r = e / U, b = the r-th of 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, ... (a warp's
// two batches are 4 apart); live while b < B.
template <int U>
__device__ __forceinline__ void ps_cell_of(int e, int& b, int& jj) {
    const int r = e / U, k = r & 7;
    jj = e - r * U;
    b = (r & ~7) + (k >> 1) + 4 * (k & 1);
}

#endif  // RNNRT_PERSISTENT_STACK_CUH
