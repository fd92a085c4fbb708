/*
 * persistent_bwd.cu: the per-layer persistent BACKWARD kernels (backpropagation through time;
 * fp32, and typed: tf32, bf16, fp16 storage with fp32 math). ONE launch runs the recurrent
 * chain of ONE layer over ALL T steps, last step first:
 * R^T stays in shared memory for the whole sequence, every block works on every step, and
 * the blocks meet at the grid barrier of the forward grid kernels (persistent_layer.cuh)
 * between steps. What is not recurrent is left to large GEMMs after the launch (the
 * gradients of W, R and the biases, and the gradient into the layer's input, each one GEMM
 * over all T steps): the kernel writes the gate gradients of every step for them. Design and
 * barrier contract: docs/kernels.md ("The persistent backward kernels"); the host side (fit,
 * NumPy emulation): rnnrt/kernels/persistent_bwd.py, emulate_bwd.py.
 *
 * Variants: one template persistent_bwd<G, CELL, CL, TS, TF32> (persistent_bwd.cuh, shared
 *   with the tensor-core grid kernels of persistent_mma_bwd.cu), two kernels a cell, each
 * with a typed instantiation K_t<TS, TF32> (bottom of the file; TS the storage of dg and h:
 * float, bf16, fp16; TF32: operands TF32-rounded; rnnrt/precision.py's rule):
 *   grid kernels `*_persistent_bwd` (CL = 0): one block per SM over the whole GPU, dg_t
 *     staged from L2 every step, the flag barrier in global memory;
 *   cluster kernels `*_persistent_cluster_bwd` (CL = PK_CLUSTER, sm_90+): clusters of 8
 *     blocks, each cluster holding all of R^T and running its own slice of the batch; each
 *     block pushes its cells' dg_t into every block's shared memory (distributed shared
 *     memory) and the cluster meets at the hardware cluster barrier (small H: R / 8 must
 *     fit one block; no grid-wide co-residency needed).
 *   Compile-time: PK_SPIN_LIMIT (persistent_common.cuh).
 *
 * The chain, per step t = T-1 .. 0 for every (b, j) (dh_rec of step T-1 is dh_n):
 *   pointwise: the fused backward kernels' arithmetic (lstm_bwd, gru_bwd, rnn_*_bwd: the
 *     same functions of cell_bwd.cuh) on dh_above = dhin[t] and dh_rec -> dg_t (and dc_{t-1}
 *     for LSTM, the direct part dh_t * z_t for GRU), written for every t;
 *   product: dh_rec of step t-1 = sum_r dg_t[b, r] R[r, j] (+ the GRU's direct part, added
 *     after the sum, as the beta = 1 GEMM of the per-step schedule adds it), r over all G*H
 *     gate rows; dg_t is what multiplies R: dgx (LSTM, RNN) or dgh (GRU).
 *   After step 0 the product once more: dh0 = dh_rec of step -1.
 *
 * Calling convention (rnnrt/kernels/registry.py builds the arguments; registry entries have
 *   persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile)
 *   each view a (pointer, int ld) pair, row-major: element (r, c) at p[r*ld + c]. Gate q of
 *   hidden unit j is column q*H + j (torch order). Time-major sequences are one view of T*B
 *   (or (T+1)*B) rows: step t, batch b is row t*B + b. No output may overlap an input.
 *
 * Kernels (one variant each, fp32):
 *   kernel lstm_persistent_bwd(rows = B, cols = H)   lstm_bwd's arithmetic a step
 *     out dgx    [T*B, 4H]     gradient of the gate pre-activations i, f, g, o, every step
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
 *   kernel gru_persistent_bwd(rows = B, cols = H)   gru_bwd's arithmetic a step
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
 *   kernel rnn_tanh_persistent_bwd(rows = B, cols = H)   dg = dh * (1 - h_{t+1}^2)
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
 *   kernel rnn_relu_persistent_bwd(rows = B, cols = H)   dg = h_{t+1} > 0 ? dh : 0
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
 *   The cluster kernels: the same arithmetic and arguments as the grid kernel of their cell
 *   (sync is not touched; units_per_block U >= ceil(H / PK_CLUSTER); k_tile >= G*H: one tile).
 *   kernel lstm_persistent_cluster_bwd(rows = B, cols = H)
 *     out dgx    [T*B, 4H]
 *     out dh0    [B, H]
 *     out dc0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  dc_n   [B, H]
 *     in  act    [T*B, 4H]
 *     in  c      [(T+1)*B, H]
 *     in  w_hh   [4H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel gru_persistent_cluster_bwd(rows = B, cols = H)
 *     out dgx    [T*B, 3H]
 *     out dgh    [T*B, 3H]
 *     out dh0    [B, H]
 *     out sync   [1, 2]
 *     in  dhin   [T*B, H]
 *     in  dh_n   [B, H]
 *     in  act    [T*B, 4H]
 *     in  h      [(T+1)*B, H]
 *     in  w_hh   [3H, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_cluster_bwd(rows = B, cols = H)
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
 *   kernel rnn_relu_persistent_cluster_bwd(rows = B, cols = H)
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
 * Resources (sm_90, nvcc 13.0 --resource-usage): __launch_bounds__(PK_MAX_THREADS = 256, 1);
 *   rnnrt.kernels.persistent_bwd.NVCC_REGS holds the registers the fit assumes (a test holds
 *   nvcc and NVRTC to it, no spills). Dynamic shared memory by the layout (docs/kernels.md),
 *   e.g. LSTM B 64 H 512 on 132 SMs: U 4, R^T slice 4 x 2052 floats, k_tile 512 (4 tiles a
 *   step), partial sums 32 k-groups x 4 x 72: 32,832 + 132,096 + 36,864 = 201,792 bytes.
 */
// the kernels' body, persistent_bwd<G, CELL, CL, TS, TF32, MMA = false> (it #includes
// cell_bwd.cuh, the pointwise backward: the fused kernels' arithmetic)
#include "persistent_bwd.cuh"

// The fp32 kernels (extern "C"), left out of a module compiled for the typed instantiations
// only (-DRNNRT_TYPED_ONLY: rnnrt/kernels/library.py get_persistent compiles one module a
// (file, precision) with every kernel's instantiation and none of these).
#ifndef RNNRT_TYPED_ONLY
extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, float* dc0, int lddc0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* dc_n, int lddc_n, const float* act, int ldact, const float* c,
        int ldc, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<4, CELL_LSTM, 0>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, dc0, lddc0,
                                 sync, dhin, lddhin, dh_n, lddh_n, dc_n, lddc_n, act, ldact, c,
                                 ldc, w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dgh, int lddgh, float* dh0, int lddh0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* act, int ldact, const float* h, int ldh, const float* w_hh,
        int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<3, CELL_GRU, 0>(rows, cols, dgx, lddgx, dgh, lddgh, dh0, lddh0, nullptr, 0,
                                sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, act, ldact, h, ldh,
                                w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_TANH, 0>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr, 0,
                                     sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0, h,
                                     ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_RELU, 0>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr, 0,
                                     sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0, h,
                                     ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

// The cluster kernels: clusters of PK_CLUSTER blocks, fixed at compile time (sm_90 and later).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_cluster_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, float* dc0, int lddc0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* dc_n, int lddc_n, const float* act, int ldact, const float* c,
        int ldc, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<4, CELL_LSTM, PK_CLUSTER>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, dc0,
                                             lddc0, sync, dhin, lddhin, dh_n, lddh_n, dc_n,
                                             lddc_n, act, ldact, c, ldc, w_hh, ldw_hh, T,
                                             units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_cluster_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dgh, int lddgh, float* dh0, int lddh0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* act, int ldact, const float* h, int ldh, const float* w_hh,
        int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<3, CELL_GRU, PK_CLUSTER>(rows, cols, dgx, lddgx, dgh, lddgh, dh0, lddh0,
                                            nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n,
                                            nullptr, 0, act, ldact, h, ldh, w_hh, ldw_hh, T,
                                            units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_cluster_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_TANH, PK_CLUSTER>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0,
                                                 nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n,
                                                 nullptr, 0, nullptr, 0, h, ldh, w_hh, ldw_hh,
                                                 T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_cluster_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const float* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_RELU, PK_CLUSTER>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0,
                                                 nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n,
                                                 nullptr, 0, nullptr, 0, h, ldh, w_hh, ldw_hh,
                                                 T, units_per_block, k_tile);
}
#endif
#endif  // RNNRT_TYPED_ONLY

// The typed instantiations (NVRTC name expressions, rnnrt/kernels/typed.py
// persistent_expression): `K_t<TS, TF32>` for each kernel K above, TS the element type of dg
// (dgx, dgh) and of the forward's h (float, bf16, fp16), TF32 whether the product reads its
// operands TF32-rounded; the same arguments as K with those pointers TS. K_t<float, false>
// compiles to K's PTX (a test holds it).
template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, float* dc0, int lddc0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* dc_n, int lddc_n, const float* act, int ldact, const float* c,
        int ldc, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<4, CELL_LSTM, 0, TS, TF32>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, dc0, lddc0,
                                 sync, dhin, lddhin, dh_n, lddh_n, dc_n, lddc_n, act, ldact, c,
                                 ldc, w_hh, ldw_hh, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, TS* dgh, int lddgh, float* dh0, int lddh0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* act, int ldact, const TS* h, int ldh, const float* w_hh,
        int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<3, CELL_GRU, 0, TS, TF32>(rows, cols, dgx, lddgx, dgh, lddgh, dh0, lddh0, nullptr, 0,
                                sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, act, ldact, h, ldh,
                                w_hh, ldw_hh, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const TS* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_TANH, 0, TS, TF32>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr, 0,
                                     sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0, h,
                                     ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const TS* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_RELU, 0, TS, TF32>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, nullptr, 0,
                                     sync, dhin, lddhin, dh_n, lddh_n, nullptr, 0, nullptr, 0, h,
                                     ldh, w_hh, ldw_hh, T, units_per_block, k_tile);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_cluster_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, float* dc0, int lddc0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* dc_n, int lddc_n, const float* act, int ldact, const float* c,
        int ldc, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<4, CELL_LSTM, PK_CLUSTER, TS, TF32>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0, dc0,
                                             lddc0, sync, dhin, lddhin, dh_n, lddh_n, dc_n,
                                             lddc_n, act, ldact, c, ldc, w_hh, ldw_hh, T,
                                             units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_cluster_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, TS* dgh, int lddgh, float* dh0, int lddh0,
        unsigned int* sync, int ldsync, const float* dhin, int lddhin, const float* dh_n,
        int lddh_n, const float* act, int ldact, const TS* h, int ldh, const float* w_hh,
        int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<3, CELL_GRU, PK_CLUSTER, TS, TF32>(rows, cols, dgx, lddgx, dgh, lddgh, dh0, lddh0,
                                            nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n,
                                            nullptr, 0, act, ldact, h, ldh, w_hh, ldw_hh, T,
                                            units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_cluster_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const TS* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_TANH, PK_CLUSTER, TS, TF32>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0,
                                                 nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n,
                                                 nullptr, 0, nullptr, 0, h, ldh, w_hh, ldw_hh,
                                                 T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_cluster_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dh0, int lddh0, unsigned int* sync,
        int ldsync, const float* dhin, int lddhin, const float* dh_n, int lddh_n, const TS* h,
        int ldh, const float* w_hh, int ldw_hh, int T, int units_per_block, int k_tile) {
    persistent_bwd<1, CELL_RNN_RELU, PK_CLUSTER, TS, TF32>(rows, cols, dgx, lddgx, nullptr, 0, dh0, lddh0,
                                                 nullptr, 0, sync, dhin, lddhin, dh_n, lddh_n,
                                                 nullptr, 0, nullptr, 0, h, ldh, w_hh, ldw_hh,
                                                 T, units_per_block, k_tile);
}
#endif
