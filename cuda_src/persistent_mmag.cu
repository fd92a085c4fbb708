/*
 * persistent_mmag.cu: the tensor-core cluster kernels' grid form (forward; bf16 and fp16
 * storage, fp32 math, sm_90+), for a layer whose R no cluster holds (LSTM H 1024: 8 MiB of
 * fp16 against 16 blocks' ~3.6 MiB of shared memory). One launch runs all T steps of one
 * layer on one block an SM, all resident: block x owns the hidden units [x*U, x*U + U) with
 * all G gate rows, and every block updates all B <= 8 PK_MMAG_NT batches (PK_MMAG_NT n8
 * tiles). The product, the R slice and its A fragments held in registers, the parts' sums
 * and the cells are the cluster kernels' (persistent_mmac.cuh mmac_fwd with CN = 0); the
 * exchange is the grid kernels': h_{t+1} (rounded to TS) to global memory, the flag grid
 * barrier on `sync` (persistent_layer.cuh's counter, its arrival a fence and an atomic by
 * thread 0, its wait a spin on acquire loads: pk_spin_acquire), h_t staged from L2 into
 * shared memory at the top of each step. The grid runs in clusters of PK_MMAG_CLUSTER (2)
 * blocks that share that copy: where h's rows are 16-byte aligned, each block copies half
 * the rows once by bulk copies multicast into both blocks (mmag_stage_mc: the pair reads h_t
 * out of L2 once, not twice) and waits on its mbarrier; else each block stages all of h_t
 * itself by 2-byte L2 loads (mmag_stage). Why (H200, 128 blocks, h_t staging alone with the
 * step's reads, stores and barrier, `kernels/staging-bench-nvidia-h200-20261129T174119.json`):
 * B 32 5.66 us a step by 16-byte cp.async copies, 5.29 by bulk copies, 4.20 multicast in
 * pairs, 5.30 in clusters of 4; B 8 3.03 / 2.87 / 2.32 / 2.44. Why not the tensor-core grid
 * kernel (persistent_mma.cu): it keeps R as fp32 in shared memory and converts its
 * fragments every step, and stages h_t in k tiles; at LSTM H 1024 B 8 its step took 14.9 us
 * (`kernels/persistent-mma-bench-T100-nvidia-h200-20261129T102006.json`). Host side:
 * rnnrt/kernels/mmac.py (the fit's grid form, its twin).
 *
 * Variants: mmac_fwd<G, CELL, TS, 0>; typed instantiations only, `K_t<TS, false>` for
 *   each kernel K below, TS bf16 or fp16 (typed.py: MMA_FILES). No `extern "C"` kernels.
 *   Compile-time: PK_TIMING (persistent_common.cuh; timing variants, wrong results on
 *   purpose, experiments/scripts/mmac_bench.py only): 1 no staging of h_t, 2 no mma.sync,
 *   4 no grid barrier a step, 8 no pointwise update (no sums or stores); right results: 16,
 *   32 (persistent_mmac.cu's A/Bs), 64 (the grid barrier's wait as ps_wait: its A/B).
 *   __cluster_dims__(PK_MMAG_CLUSTER): every kernel runs in clusters of 2.
 *
 * Calling convention: persistent.cu's grid kernels' (registry entries persistent=True), h a
 *   TS*; units_per_block U with gridDim.x * U >= H, gridDim.x a multiple of PK_MMAG_CLUSTER
 *   (blocks past H own no units), every block resident at once (the fit: gridDim.x <= SMs,
 *   one block an SM); k_tile KT >= H (all of h_t is staged at once); blockDim.x = 32 * MT *
 *   KPARTS, MT = ceil(G*U / 16); B <= 8 PK_MMAG_NT.
 *
 * Kernels (one variant each a storage type; per step t = 0..T-1, for every (b, j): the
 *   persistent kernels' arithmetic, gh summed over k by mma.sync: each k-part's steps in
 *   order over two chains (even, odd) added at the end, the parts in order):
 *   kernel lstm_persistent_mmacg_fwd(rows = B, cols = H)
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
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel gru_persistent_mmacg_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    saved gates (LSTM i, f, g, o; GRU r, z, n, hn)
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, 3H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [3H, H]       R = weight_hh, row-major
 *     in  bw     [B, 3H]       b_ih, usually ld 0
 *     in  br     [B, 3H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel rnn_tanh_persistent_mmacg_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *   kernel rnn_relu_persistent_mmacg_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   TS; h[0] = h0 is read; slots 1..T are written
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [H, H]       R = weight_hh, row-major
 *     in  bw     [B, H]       b_ih, usually ld 0
 *     in  br     [B, H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: >= H (the kernel's one tile)
 *
 * Shared memory (mmac.py mmac_layout computes the same): the R slice [MT*16][KP + 8] TS, one
 * h buffer [8 NT][KP + 8] TS (NT = ceil(B / 8); KP = H rounded up to 16), partial sums
 * [KPARTS][MT*16][RS] floats (RS: mmac_geom's), 16 bytes (the staging's mbarrier).
 * Resources (nvcc 13.0, sm_90a, no spills): __launch_bounds__(PK_MMAC_MAX_THREADS = 256, 1);
 *   rnnrt.kernels.mmac.NVCC_REGS.
 */
#include "persistent_mmac.cuh"

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAG_CLUSTER, 1, 1)
lstm_persistent_mmacg_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<4, CELL_LSTM, TS, 0>(
        rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAG_CLUSTER, 1, 1)
gru_persistent_mmacg_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<3, CELL_GRU, TS, 0>(
        rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAG_CLUSTER, 1, 1)
rnn_tanh_persistent_mmacg_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_TANH, TS, 0>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MMAC_MAX_THREADS, 1) __cluster_dims__(PK_MMAG_CLUSTER, 1, 1)
rnn_relu_persistent_mmacg_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    static_assert(!TF32, "the tensor-core kernels: bf16 / fp16 operands");
    mmac_fwd<1, CELL_RNN_RELU, TS, 0>(
        rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br,
        ldbr, T, units_per_block, k_tile);
}
