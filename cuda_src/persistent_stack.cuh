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
 *   ps_lstm_cell          one cell's step from its 4 pre-activations: gates, c, h
 *   ps_gru_cell           one GRU cell's step from its 4 row groups' sums: gates, h
 *   ps_publish            a block's step done: barrier, release fence, count
 *   ps_store_state        one cell's c and gates, streamed (nothing in the launch reads them)
 *   ps_store_gates        one cell's gates alone (GRU; ps_store_state's after c), streamed
 *   ps_group_gate<CELL>   the parameters' gate of a block's row group on W's or R's side
 *                         (-1: a GRU group that side has none)
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

// One LSTM cell's step from its pre-activations s (i, f, g, o): the gates into `gate`, c_t
// (carry) to c_{t+1}; returns h_{t+1} (lstm_fwd's arithmetic).
__device__ __forceinline__ float ps_lstm_cell(const float (&s)[4], float (&gate)[4],
                                              float& carry) {
    gate[0] = ps_sigmoid(s[0]), gate[1] = ps_sigmoid(s[1]);
    gate[2] = ps_tanh(s[2]), gate[3] = ps_sigmoid(s[3]);
    carry = gate[1] * carry + gate[0] * gate[2];
    return gate[3] * ps_tanh(carry);
}

// One GRU cell's step from its row groups' sums s (r, z, n's W part + b_in, n's R part +
// b_hn): the gates r, z, n, hn into `gate`, h_t (carry) to h_{t+1}, returned (gru_fwd's
// arithmetic: n = tanh(s2 + r hn), h = n + z (h_t - n)).
__device__ __forceinline__ float ps_gru_cell(const float (&s)[4], float (&gate)[4],
                                             float& carry) {
    gate[0] = ps_sigmoid(s[0]), gate[1] = ps_sigmoid(s[1]), gate[3] = s[3];
    gate[2] = ps_tanh(s[2] + gate[0] * s[3]);
    carry = gate[2] + gate[1] * (carry - gate[2]);
    return carry;
}

// A block's step is done once its h_{t+1} is issued: every thread's stores before the
// barrier, then thread 0 makes them visible GPU-wide before it counts (release) on `mine`.
__device__ __forceinline__ void ps_publish(unsigned int* mine) {
    __syncthreads();   // the block's h_{t+1} is issued (and the partial sums are read)
    if (threadIdx.x == 0) {
        pk_fence_acq_rel();   // ... and visible GPU-wide before this block counts (release)
        atomicAdd(mine, 1u);
    }
}

// One cell's c_{t+1} at cp and gates at a (i, f, g, o at a, a + H, a + 2H, a + 3H);
// streaming stores: nothing in the launch reads them.
__device__ __forceinline__ void ps_store_gates(float* a, int H, const float (&gate)[4]);
__device__ __forceinline__ void ps_store_state(float* cp, float* a, int H, float carry,
                                               const float (&gate)[4]) {
    __stcs(cp, carry);
    ps_store_gates(a, H, gate);
}

// The gate (of H rows) of W's (r_side false) or R's parameters that a block's row group q
// multiplies: LSTM q itself; GRU's groups r, z, n's W part, n's R part: W r, z, n, none; R r,
// z, none, n (-1: that side has no rows for the group: zeros).
template <int CELL>
__device__ __forceinline__ int ps_group_gate(int q, bool r_side) {
    if (CELL != CELL_GRU) return q;
    if (q < 2) return q;
    return r_side ? (q == 3 ? 2 : -1) : (q == 2 ? 2 : -1);
}

// One cell's 4 gates at a, a + H, a + 2H, a + 3H; streaming stores.
__device__ __forceinline__ void ps_store_gates(float* a, int H, const float (&gate)[4]) {
    __stcs(a, gate[0]);
    __stcs(a + H, gate[1]);
    __stcs(a + 2 * H, gate[2]);
    __stcs(a + 3 * H, gate[3]);
}

#endif  // RNNRT_PERSISTENT_STACK_CUH
