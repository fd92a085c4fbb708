/*
 * persistent_bwd_pair.cu: the per-layer persistent backward GRID kernels in CLUSTER PAIRS
 * (fp32, sm_90+): one launch runs one layer's recurrent chain over all T steps, last first,
 * as the grid kernels of persistent_bwd.cu (the same arguments, outputs, grid barrier and
 * co-residency rule), but each block stages and multiplies only HALF of the gate rows of
 * dg_{t+1}. Why: the grid kernel stages all of dg_{t+1} [B, G*H] (256 KB at LSTM H 512 B 32)
 * from L2 into every block every step for U ~ 4 units, the bound the stack backward had
 * (persistent_stack_bwd_pair.cu). Here the two blocks of a cluster (ranks c = 0, 1) own 2U
 * units together; block c multiplies columns [c*KH, c*KH + KC) of dg_{t+1} (KH = 4 *
 * ceil(G*H / 8)) by the R^T rows of all 2U units (the same FMAs a block, half the staging),
 * sends the other block the half sums of the other's U units through distributed shared
 * memory (U x B floats), and after the cluster barrier each cell adds half 0 + half 1 (a
 * fixed order: the same bits every run). Body: persistent_bwd<G, CELL, 0, float, false,
 * false, PAIR = true> (persistent_bwd.cuh). Design: docs/kernels.md ("The persistent
 * backward grid kernel in cluster pairs"); host side (fit, NumPy twin):
 * rnnrt/kernels/persistent_bwd.py (PairBwdFit), emulate_bwd.py.
 *
 * Variants: one kernel a cell (fp32 only: no typed instantiations). Compile-time:
 *   PK_SPIN_LIMIT (persistent_common.cuh).
 *
 * Calling convention: exactly the grid kernel's of its cell (persistent_bwd.cu's header):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile); the grid is whole clusters of 2 (__cluster_dims__), 2 * ceil(H / 2U)
 *   blocks, all resident at once; units_per_block U: block x owns units [x*U, x*U + U);
 *   k_tile KT: columns of a block's half of dg a tile, a positive multiple of 4.
 *
 * Kernels:
 *   kernel lstm_persistent_pair_bwd(rows = B, cols = H)   lstm_persistent_bwd's arithmetic
 *     out dgx    [T*B, 4H]     gradient of the gate pre-activations i, f, g, o, every step
 *     out dh0    [B, H]        gradient of h0
 *     out dc0    [B, H]        gradient of c0
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  dhin   [T*B, H]      gradient of h_{t+1} from above
 *     in  dh_n   [B, H]        gradient of h_T
 *     in  dc_n   [B, H]        gradient of c_T
 *     in  act    [T*B, 4H]     the forward's i, f, g, o after activation
 *     in  c      [(T+1)*B, H]  the forward's cell states, c[0] = c0
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     int T                    steps (>= 1)
 *     int units_per_block      U
 *     int k_tile               KT
 *   kernel gru_persistent_pair_bwd(rows = B, cols = H)   gru_persistent_bwd's arithmetic
 *     out dgx    [T*B, 3H]     gradient of W x_t + b_ih, blocks r, z, n
 *     out dgh    [T*B, 3H]     gradient of R h_{t-1} + b_hh (what multiplies R)
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  act    [T*B, 4H]     r, z, n, hn
 *     in  h      [(T+1)*B, H]  the forward's hidden states, h[0] = h0
 *     in  w_hh   [3H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_pair_bwd(rows = B, cols = H)   dg = dh * (1 - h_{t+1}^2)
 *     out dgx    [T*B, H]
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  h      [(T+1)*B, H]
 *     in  w_hh   [H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_pair_bwd(rows = B, cols = H)   dg = h_{t+1} > 0 ? dh : 0
 *     out dgx    [T*B, H]
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  h      [(T+1)*B, H]
 *     in  w_hh   [H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *
 * Resources (sm_90): __launch_bounds__(PK_MAX_THREADS = 256, 1); rnnrt.kernels.
 *   persistent_bwd.NVCC_REGS holds the registers the fit assumes. Dynamic shared memory, floats:
 *   2U x SR(KH) (R^T rows of the pair's units, the block's half) + B x SH(KT) (dg tile) +
 *   NKG x 2U x BP (partial sums) + U x B (the other block's half sums), e.g. LSTM B 64 H 512
 *   on 132 SMs, U 4 (128 blocks, 64 pairs): 8 x 1028 + 64 x 516 + 16 x 8 x 72 + 256 floats =
 *   32,896 + 132,096 + 36,864 + 1,024 = 202,880 bytes (k_tile 512: 2 tiles a step).
 */
// the kernels' body, persistent_bwd<G, CELL, 0, float, false, false, true>
#include "persistent_bwd.cuh"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(2, 1, 1) lstm_persistent_pair_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, float* dc0, int lddc0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* dc_n, int lddc_n, const float* act, int ldact, const float* c,
        int ldc, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<4, CELL_LSTM, 0, float, false, false, true>(
        rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, dc0, lddc0, sync, dhin, lddhin, dh_n,
        lddh_n, dc_n, lddc_n, act, ldact, c, ldc, w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(2, 1, 1) gru_persistent_pair_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dgh, int lddgh, float* dh0, int lddh0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* act, int ldact, const float* h, int ldh, const float* w_hh,
        int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<3, CELL_GRU, 0, float, false, false, true>(
        rows, cols, dgx, lddgx, dgh, lddgh, dh0, lddh0, nullptr, 0, sync, dhin, lddhin, dh_n,
        lddh_n, nullptr, 0, act, ldact, h, ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(2, 1, 1) rnn_tanh_persistent_pair_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_TANH, 0, float, false, false, true>(
        rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr, 0, sync, dhin, lddhin, dh_n,
        lddh_n, nullptr, 0, nullptr, 0, h, ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(2, 1, 1) rnn_relu_persistent_pair_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_RELU, 0, float, false, false, true>(
        rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr, 0, sync, dhin, lddhin, dh_n,
        lddh_n, nullptr, 0, nullptr, 0, h, ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}
#endif
