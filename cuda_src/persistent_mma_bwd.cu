/*
 * persistent_mma_bwd.cu: the tensor-core per-layer BACKWARD grid kernels (bf16 and fp16
 * storage, fp32 math): persistent_bwd.cu's grid kernels (one launch runs one layer's
 * recurrent chain over all T steps, last first; the R^T slice in shared memory, dg_{t+1}
 * staged from L2 each step, the flag grid barrier between steps, the pointwise backward of
 * cell_bwd.cuh) with the product dh_rec_{t}[b, j] = sum_r dg_{t+1}[b, r] R[r, j] on tensor
 * cores: mma.sync m16n8k16 with bf16 / fp16 operands and fp32 accumulation, A = the block's
 * R^T slice [U][G*H], B = dg_{t+1}^T (persistent_mma.cuh: the forward tensor-core kernel's
 * fragment layout and product). Design: docs/kernels.md ("The tensor-core backward grid
 * kernel"); host side: rnnrt/kernels/mma_bwd.py (fit, geometry, the NumPy twin through
 * emulate_bwd.py's machinery).
 *
 * Variants: one template persistent_bwd<G, CELL, 0, TS, false, true> (persistent_bwd.cuh);
 *   typed instantiations only, `K_t<TS, false>` for each kernel K below, TS bf16 or fp16
 *   (rnnrt/kernels/typed.py persistent_expression; there is no fp32 or tf32 kernel: the
 *   fit declines those keys). No `extern "C"` kernels: nothing to leave out under
 *   -DRNNRT_TYPED_ONLY. Compile-time: PK_TIMING, PK_SPIN_LIMIT, PK_MMA_MT, PK_MMA_NT.
 *
 * Calling convention: persistent_bwd.cu's grid kernels' (registry entries have
 *   persistent=True), dgx, dgh and the GRU / RNN state h TS*; units_per_block U, k_tile KT a
 *   positive multiple of 4 (the fit takes KT so that each warp's half of its chunks of a tile
 *   is whole k16 steps; any KT is correct).
 *
 * Kernels (one variant each a storage type; per step t = T-1..0, for every (b, j): the grid
 *   kernels' arithmetic, dh_rec summed over the G*H gate rows by mma.sync, k16 steps in the
 *   warp's chunk order, the warps' partial sums in warp order):
 *   kernel lstm_persistent_mma_bwd(rows = B, cols = H)
 *     out dgx    [T*B, 4H]     TS; gradient of the gate pre-activations i, f, g, o, every step
 *     out dh0    [B, H]        gradient of h0
 *     out dc0    [B, H]        gradient of c0
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  dhin   [T*B, H]      gradient of h_{t+1} from above (dy_t, or the next layer's dx)
 *     in  dh_n   [B, H]        gradient of h_T (the last step's dh_rec)
 *     in  dc_n   [B, H]        gradient of c_T
 *     in  act    [T*B, 4H]     the forward's i, f, g, o after activation
 *     in  c      [(T+1)*B, H]  the forward's cell states, c[0] = c0
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of dg_t a tile, a positive multiple of 4
 *   kernel gru_persistent_mma_bwd(rows = B, cols = H)
 *     out dgx    [T*B, 3H]     TS; gradient of W x_t + b_ih, blocks r, z, n
 *     out dgh    [T*B, 3H]     TS; gradient of R h_{t-1} + b_hh (what multiplies R)
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  act    [T*B, 4H]     r, z, n, hn
 *     in  h      [(T+1)*B, H]  TS; the forward's hidden states, h[0] = h0
 *     in  w_hh   [3H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_mma_bwd(rows = B, cols = H)   dg = dh * (1 - h_{t+1}^2)
 *     out dgx    [T*B, H]      TS
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  h      [(T+1)*B, H]  TS
 *     in  w_hh   [H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_mma_bwd(rows = B, cols = H)   dg = h_{t+1} > 0 ? dh : 0
 *     out dgx    [T*B, H]      TS
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  h      [(T+1)*B, H]  TS
 *     in  w_hh   [H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *
 * Resources (sm_90a, nvcc 13.0 --resource-usage, no spills): __launch_bounds__(
 *   PK_MAX_THREADS = 256, 1); rnnrt.kernels.mma_bwd.NVCC_REGS holds the counts the fit
 *   assumes. Dynamic shared memory by the layout (mma_bwd.py mma_bwd_geometry): R^T slice
 *   [U][pk_mma_stride(G*H)] + dg tile [B][pk_mma_stride(KT)] + partial sums
 *   [warps][U][pk_mma_stride(B)] floats.
 */
#include "persistent_bwd.cuh"

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_mma_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, float* dc0, int lddc0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* dc_n, int lddc_n, const float* act, int ldact, const float* c,
        int ldc, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<4, CELL_LSTM, 0, TS, TF32, true>(rows, cols, dgx, lddgx, nullptr, 0, dh0,
        lddh0, dc0, lddc0, sync, dhin, lddhin, dh_n, lddh_n, dc_n, lddc_n, act, ldact, c, ldc,
        w_hh, ldw_hh, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_mma_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, TS* dgh, int lddgh, float* dh0, int lddh0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* act, int ldact, const TS* h, int ldh, const float* w_hh,
        int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<3, CELL_GRU, 0, TS, TF32, true>(rows, cols, dgx, lddgx, dgh, lddgh, dh0,
        lddh0, nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, act, ldact, h, ldh,
        w_hh, ldw_hh, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_mma_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const TS* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_TANH, 0, TS, TF32, true>(rows, cols, dgx, lddgx, nullptr, 0,
        dh0, lddh0, nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0, h,
        ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_mma_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const TS* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_RELU, 0, TS, TF32, true>(rows, cols, dgx, lddgx, nullptr, 0,
        dh0, lddh0, nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0, h,
        ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}
