/*
 * persistent_mma.cu: the tensor-core per-layer grid kernels (forward; bf16 and fp16 storage,
 * fp32 math): persistent.cu's grid kernels (one launch runs all T steps of one layer, R in
 * shared memory, h_t staged from L2 each step, the flag grid barrier between steps) with the
 * product R_slice [G*U, H] x h_t^T [H, B] on tensor cores: mma.sync m16n8k16 with bf16 /
 * fp16 operands and fp32 accumulation (persistent_mma.cuh: fragment layout, why it is the
 * same math as the FMA path up to summation order). Design: docs/kernels.md ("The
 * tensor-core grid kernel"); host side: rnnrt/kernels/mma.py (fit, geometry), the NumPy
 * twin in emulate.py's machinery. Forward only: the backward keeps its FMA kernels.
 *
 * Variants: one template persistent_fwd<G, CELL, 0, TS, false, true> (persistent_layer.cuh);
 *   typed instantiations only, `K_t<TS, false>` for each kernel K below, TS bf16 or fp16
 *   (rnnrt/kernels/typed.py persistent_expression; there is no fp32 or tf32 kernel: the
 *   fit declines those keys). No `extern "C"` kernels: nothing to leave out under
 *   -DRNNRT_TYPED_ONLY. Compile-time: PK_TIMING, PK_SPIN_LIMIT, PK_MMA_MT, PK_MMA_NT.
 *
 * Calling convention: persistent.cu's grid kernels' (registry entries have persistent=True),
 *   h a TS*; units_per_block U, k_tile KT a positive multiple of 4 (the fit takes KT so that
 *   each warp's half of its chunks of a tile is whole k16 steps; any KT is correct).
 *
 * Kernels (one variant each a storage type; per step t = 0..T-1, for every (b, j): the grid
 *   kernels' arithmetic, gh summed over k by mma.sync, k16 steps in the warp's chunk order,
 *   the warps' partial sums in warp order):
 *   kernel lstm_persistent_mma_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    saved gates (LSTM i, f, g, o; GRU r, z, n, hn)
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of h_t a tile, a positive multiple of 4
 *   kernel gru_persistent_mma_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    saved gates (LSTM i, f, g, o; GRU r, z, n, hn)
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, 3H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [3H, H]       R = weight_hh, row-major
 *     in  bw     [B, 3H]       b_ih, usually ld 0
 *     in  br     [B, 3H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of h_t a tile, a positive multiple of 4
 *   kernel rnn_tanh_persistent_mma_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of h_t a tile, a positive multiple of 4
 *   kernel rnn_relu_persistent_mma_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of h_t a tile, a positive multiple of 4
 *
 * Resources (sm_90a, nvcc 13.0 --resource-usage, no spills; docs/kernels.md has the table):
 *   __launch_bounds__(PK_MAX_THREADS = 256, 1); rnnrt.kernels.mma.NVCC_REGS holds the counts
 *   the fit assumes. Dynamic shared memory by the layout (mma.py mma_geometry): R slice
 *   [G*U][pk_mma_stride(H)] + h tile [B][pk_mma_stride(KT)] + partial sums
 *   [warps][G*U][pk_mma_stride(B)] floats.
 */
#include "persistent_layer.cuh"

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_mma_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM, 0, TS, TF32, true>(rows, cols, h, ldh, c, ldc, act, ldact,
        sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_mma_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU, 0, TS, TF32, true>(rows, cols, h, ldh, nullptr, 0, act,
        ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_mma_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH, 0, TS, TF32, true>(rows, cols, h, ldh, nullptr, 0,
        nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
        k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_mma_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU, 0, TS, TF32, true>(rows, cols, h, ldh, nullptr, 0,
        nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
        k_tile);
}
