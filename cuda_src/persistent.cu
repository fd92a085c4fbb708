/*
 * persistent.cu: the per-layer persistent recurrent kernels (forward; fp32, and typed: tf32,
 * bf16, fp16 storage with fp32 math). ONE launch runs
 * ALL T steps of ONE layer's recurrence (or one input chunk of them): R stays in shared
 * memory for the whole sequence, every block works on every step, and the blocks meet at a
 * barrier between steps instead of ending a kernel. gx = W x_t for all t comes from one
 * cuBLAS GEMM before the launch. Design (decomposition, barrier contract): docs/kernels.md;
 * the host side (fit, NumPy emulation): rnnrt/kernels/persistent.py, emulate.py.
 *
 * Variants: one template persistent_fwd<G, CELL, CL, TS, TF32>, two kernels a cell, each
 * with a typed instantiation K_t<TS, TF32> (bottom of the file; TS the storage of h: float,
 * bf16, fp16; TF32: operands TF32-rounded; rnnrt/precision.py's rule, see persistent_fwd):
 *   grid kernels `*_persistent_fwd` (CL = 0): one block per SM over the whole GPU, h_t staged
 *     from L2 every step, a flag barrier in global memory between steps (any H whose R
 *     slice fits one SM);
 *   cluster kernels `*_persistent_cluster_fwd` (CL = PK_CLUSTER, sm_90+): clusters of 8
 *     blocks, each cluster holding all of R and running its own slice of the batch; each
 *     block pushes its units of h_{t+1} into every block's shared memory (distributed shared
 *     memory) and the cluster meets at the hardware cluster barrier (small H: R / 8 must fit
 *     one block).
 *   Compile-time: PK_TIMING (persistent_common.cuh), PK_SPIN_LIMIT.
 *
 * Calling convention (rnnrt/kernels/registry.py builds the arguments; registry entries have
 * persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile)
 *   each view a (pointer, int ld) pair, row-major: element (r, c) at p[r*ld + c]; ld = 0
 *   broadcasts one row (the biases). The pointers are float*, except the barrier counters
 *   `sync` (unsigned int*). Gate q of hidden unit j is column q*H + j (torch order: LSTM
 *   i, f, g, o; GRU r, z, n). Time-major sequences are one view of T*B (or (T+1)*B) rows:
 *   step t, batch b is row t*B + b. No output may overlap an input (h[0] and c[0] are read
 *   from the outputs' own slot 0, which the kernel never writes).
 *
 * Kernels (one variant each, fp32; per step t = 0..T-1, for every (b, j)):
 *   kernel lstm_persistent_fwd(rows = B, cols = H)
 *       gh_q = sum_k R[q*H + j, k] h_t[b, k];  pre_q = ((gx + bw) + gh) + br   (per gate q)
 *       i, f, g, o = sigma(pre_0), sigma(pre_1), tanh(pre_2), sigma(pre_3)
 *       c_{t+1} = f * c_t + i * g;  h_{t+1} = o * tanh(c_{t+1})   (lstm_fwd's arithmetic)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    i, f, g, o after activation, for the backward pass
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0 (the zeros buffer without bias)
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of h_t a tile, a positive multiple of 4
 *   kernel gru_persistent_fwd(rows = B, cols = H)
 *       r = sigma(((gx_r + bw_r) + gh_r) + br_r);  z likewise;  hn = gh_n + br_n
 *       n = tanh((gx_n + bw_n) + r * hn);  h_{t+1} = n + z * (h_t - n)   (gru_fwd's)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    r, z, n, hn (columns 0, H, 2H, 3H)
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_fwd(rows = B, cols = H)   h_{t+1} = tanh(((gx + bw) + gh) + br)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_fwd(rows = B, cols = H)   h_{t+1} = max(((gx+bw)+gh)+br, 0)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   The cluster kernels: the same arithmetic and arguments as the grid kernel of their cell
 *   (sync is not touched; units_per_block U >= ceil(H / PK_CLUSTER); k_tile >= H: one tile).
 *   kernel lstm_persistent_cluster_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out c      [T+1, B, H]
 *     out act    [T, B, 4H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, 4H]
 *     in  w_hh   [4H, H]
 *     in  bw     [B, 4H]
 *     in  br     [B, 4H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel gru_persistent_cluster_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out act    [T, B, 4H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_cluster_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_cluster_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *
 *
 * Resources (sm_90, nvcc 13.0 --resource-usage; the grid and the cluster kernels alike;
 *   rnnrt.kernels.persistent.NVCC_REGS holds the larger of nvcc's and NVRTC's count):
 *   __launch_bounds__(PK_MAX_THREADS = 256, 1), so a thread may have up to 255 registers
 *   (256 x 255 < one SM's 64 K). Registers: see NVCC_REGS. No static shared memory.
 *   Dynamic shared memory by the layout (docs/kernels.md), e.g. LSTM B 64 H 512 on 132 SMs, 256
 *   threads (U 4, M 16, lanes 4 x 8 x 1, NKG 8, k_tile 512, one tile): 33,024 (R) +
 *   132,096 (h tile) + 36,864 (partials) = 201,984 bytes.
 */
#include "persistent_layer.cuh"

// The fp32 kernels (extern "C"), left out of a module compiled for the typed instantiations
// only (-DRNNRT_TYPED_ONLY: rnnrt/kernels/library.py get_persistent compiles one module a
// (file, precision) with every kernel's instantiation and none of these).
#ifndef RNNRT_TYPED_ONLY
// The grid kernels.
extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM, 0>(rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx,
                                    w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                    k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU, 0>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx,
                                   ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                   k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH, 0>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU, 0>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}

// The cluster kernels: clusters of PK_CLUSTER blocks, fixed at compile time, so a plain
// launch of a grid that is a multiple of PK_CLUSTER runs them (sm_90 and later).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM, PK_CLUSTER>(rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx,
                                    w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                    k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU, PK_CLUSTER>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx,
                                   ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                   k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH, PK_CLUSTER>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU, PK_CLUSTER>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}
#endif
#endif  // RNNRT_TYPED_ONLY

// The typed instantiations (NVRTC name expressions, rnnrt/kernels/typed.py
// persistent_expression): `K_t<TS, TF32>` for each kernel K above, TS the element type of h
// (float, bf16, fp16), TF32 whether the product reads its operands TF32-rounded; the same
// arguments as K with h a TS*. K_t<float, false> compiles to K's PTX (a test holds it).
template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM, 0, TS, TF32>(rows, cols, h, ldh, c, ldc, act, ldact, sync,
        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU, 0, TS, TF32>(rows, cols, h, ldh, nullptr, 0, act, ldact,
        sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH, 0, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr,
        0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU, 0, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr,
        0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_cluster_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM, PK_CLUSTER, TS, TF32>(rows, cols, h, ldh, c, ldc, act,
        ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
        k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_cluster_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU, PK_CLUSTER, TS, TF32>(rows, cols, h, ldh, nullptr, 0, act,
        ldact, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
        k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_cluster_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH, PK_CLUSTER, TS, TF32>(rows, cols, h, ldh, nullptr, 0,
        nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
        k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_cluster_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float*
        gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const
        float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU, PK_CLUSTER, TS, TF32>(rows, cols, h, ldh, nullptr, 0,
        nullptr, 0, sync, gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
        k_tile);
}
#endif
