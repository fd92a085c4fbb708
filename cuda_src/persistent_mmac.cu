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
 * kernel"); host side rnnrt/kernels/mmac.py (fit, geometry, twin). The body is
 * persistent_mmac.cuh's mmac_fwd, which the grid form (persistent_mmag.cu) shares.
 *
 * Variants: one template mmac_fwd<G, CELL, TS, CN>, CN = PK_CLUSTER (8) or 16 (the *_mmac16_*
 *   kernels: a non-portable cluster size, the launch opts in to it); typed instantiations
 *   only, `K_t<TS, false>` for each kernel K below, TS bf16 or fp16 (typed.py: MMA_FILES). No
 *   `extern "C"` kernels. Compile-time: PK_TIMING (persistent_common.cuh; timing variants,
 *   wrong results on purpose, experiments/scripts/mmac_bench.py only): 1 no pushes of
 *   h_{t+1}, 2 no mma.sync, 4 no cluster barrier a step (a __syncthreads, one cluster
 *   barrier before exit), 8 no pointwise update (no sums, pushes or stores); right results:
 *   16 the held-register loop's branch, 32 the partial sums' rows unpadded (A/Bs).
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
 * partial sums [KPARTS][MT*16][8 + PK_MMAC_RS_PAD1] floats.
 * Resources (nvcc 13.0, sm_90a, no spills): __launch_bounds__(PK_MMAC_MAX_THREADS = 256, 1),
 *   206-241 registers (128 of them the PK_MMAC_KR steps' A fragments);
 *   rnnrt.kernels.mmac.NVCC_REGS.
 */
#include "persistent_mmac.cuh"

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
        rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
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
        rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
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
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
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
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
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
        rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
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
        rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
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
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
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
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
        units_per_block, k_tile);
}
