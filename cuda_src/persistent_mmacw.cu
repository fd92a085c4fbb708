/*
 * persistent_mmacw.cu: the tensor-core cluster kernels' wide form (forward; bf16 and fp16
 * storage, fp32 math, sm_90+), for a batch past what clusters of one n8 tile hold at once.
 * Clusters of one n8 tile (persistent_mmac.cu) take ceil(B / 8) clusters of 8 blocks, and one
 * block an SM (255 registers a thread): past ~15 of them the launch runs in waves, each
 * adding the whole sequence's steps (H200, float16, LSTM H 128: B 8 0.19 ms, B 128 0.36,
 * B 256 0.54). Here a cluster updates up to 8 PK_MMAC_WNT batches (PK_MMAC_WNT n8 tiles), so
 * fewer clusters hold the batch. The cut (block rank r of a cluster of 8 owns the hidden units
 * [r*U, r*U + U) with all G gate rows), the pushes of h_{t+1} into every block's shared
 * memory and the cluster barrier are persistent_mmac.cu's; the tiles, their accumulators and
 * the PK_MMAG_KR k16 steps' A fragments held in registers are the grid form's
 * (persistent_mmac.cuh mmac_fwd with CN = 8, NTC = PK_MMAC_WNT). Host side:
 * rnnrt/kernels/mmac.py (the fit's wide clusters, their twin).
 *
 * Variants: mmac_fwd<G, CELL, TS, PK_CLUSTER, PK_MMAC_WNT>; typed instantiations only,
 *   `K_t<TS, false>` for each kernel K below, TS bf16 or fp16 (typed.py: MMA_FILES). No
 *   `extern "C"` kernels. Compile-time: PK_TIMING (persistent_common.cuh; timing variants,
 *   wrong results on purpose, experiments/scripts/mmac_bench.py only): 1 no pushes of
 *   h_{t+1}, 2 no mma.sync, 4 no cluster barrier a step, 8 no pointwise update; right
 *   results: 16, 32 (persistent_mmac.cu's A/Bs).
 *
 * Calling convention: persistent_mmac.cu's (registry entries persistent=True; sync is not
 *   touched), h a TS*; units_per_block U with 8 U >= H; k_tile KT >= H; blockDim.x =
 *   32 * MT * KPARTS, MT = ceil(G*U / 16); gridDim.x = 8 * clusters, ceil(B / clusters) <=
 *   8 PK_MMAC_WNT.
 *
 * Kernels (one variant each a storage type; per step t = 0..T-1, for every (b, j): the
 *   persistent kernels' arithmetic, gh summed over k by mma.sync: each k-part's steps in
 *   order over two chains (even, odd) added at the end, the parts in order):
 *   kernel lstm_persistent_mmacw_fwd(rows = B, cols = H)
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
 *   kernel gru_persistent_mmacw_fwd(rows = B, cols = H)
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
 *   kernel rnn_tanh_persistent_mmacw_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): not used by this kernel
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block rank r owns hidden units [r*U, min(H, r*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel rnn_relu_persistent_mmacw_fwd(rows = B, cols = H)
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
 * Shared memory (mmac.py mmac_layout computes the same): the R slice [MT*16][KP + 8] TS, two
 * h buffers [8 NT][KP + 8] TS (NT = ceil(BG / 8), BG = ceil(B / clusters); KP = H rounded up
 * to 16), partial sums [KPARTS][MT*16][RS] floats (RS: mmac_geom's).
 * Resources (nvcc 13.0, sm_90a, no spills): __launch_bounds__(PK_MMAC_MAX_THREADS = 256, 1);
 *   rnnrt.kernels.mmac.NVCC_REGS.
 */
#include "persistent_mmac.cuh"

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1)
__cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_mmacw_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<4, CELL_LSTM, TS, PK_CLUSTER, PK_MMAC_WNT>(
        rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1)
__cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_mmacw_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<3, CELL_GRU, TS, PK_CLUSTER, PK_MMAC_WNT>(
        rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1)
__cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_mmacw_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_TANH, TS, PK_CLUSTER, PK_MMAC_WNT>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1)
__cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_mmacw_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_RELU, TS, PK_CLUSTER, PK_MMAC_WNT>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}
