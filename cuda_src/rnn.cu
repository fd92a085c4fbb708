/*
 * rnn.cu: the fused pointwise part of one plain-RNN step (one launch per cell step): forward,
 * both bias adds and the activation in one pass; backward, the sum of the two incoming
 * gradients times the activation's derivative. No activations are saved: the backward gets
 * the derivative from h itself (1 - h^2 for tanh, h > 0 for relu).
 *
 * Calling convention (every kernel in cuda_src/; rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows, int cols, outs..., ins...), each view a (float* p, int ld) pair,
 *   row-major: element (r, c) at p[r*ld + c]; ld = 0 broadcasts one row (the biases).
 *   fp32 only. Each thread reads its element of every input before writing its output, so
 *   the output may alias an input exactly (same pointer, same ld), e.g. h over gx, or dg
 *   over dh_above.
 *   Launch: a 1-D grid-stride loop over B*H, 256 threads a block.
 *
 * Kernels (two variants of one step, differing in the activation only; fp32):
 *   kernel rnn_tanh_fwd(rows = B, cols = H)   h = tanh(((gx + bw) + gh) + br)
 *     out h  [B, H]   new hidden state
 *     in  gx [B, H]   W x_t (from the input GEMM)
 *     in  gh [B, H]   R h_{t-1} (from the recurrent GEMM)
 *     in  bw [B, H]   b_ih, usually ld 0 (one row broadcast)
 *     in  br [B, H]   b_hh, usually ld 0
 *   kernel rnn_relu_fwd(rows = B, cols = H)   h = max(((gx + bw) + gh) + br, 0); NaN stays NaN
 *     out h  [B, H]
 *     in  gx [B, H]
 *     in  gh [B, H]
 *     in  bw [B, H]
 *     in  br [B, H]
 *   kernel rnn_tanh_bwd(rows = B, cols = H)   dg = (dh_above + dh_rec) * (1 - h*h)
 *     out dg       [B, H]   gradient of the pre-activation: of both gx + bw and gh + br
 *     in  dh_above [B, H]   gradient of h_t from above (dy_t, or the next layer's dx)
 *     in  dh_rec   [B, H]   gradient of h_t from step t+1 (dg_{t+1} R; dh_n at t = T-1)
 *     in  h        [B, H]   h_t, this step's output
 *   kernel rnn_relu_bwd(rows = B, cols = H)   dh = dh_above + dh_rec;  dg = h > 0 ? dh : 0
 *       (torch's convention: 0 where h == 0; 0 where h <= 0 even if dh is NaN or Inf;
 *       a NaN in dh propagates where h > 0)
 *     out dg       [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]
 *     in  h        [B, H]
 */

// Calls f(r, c) for every element of a [rows, cols] problem, grid-stride. 64-bit indices:
// rows*ld reaches past 2^31 for views over [T*B, G*H] buffers.
// (Each .cu file is compiled on its own by NVRTC with no includes, so this helper is copied
// into every file that needs it; a test checks the copies are identical.)
template <class F>
__device__ __forceinline__ void for_each_element(int rows, int cols, F f) {
    const long long n = (long long)rows * cols;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long r = i / cols;
        f(r, i - r * cols);
    }
}

extern "C" __global__ void rnn_tanh_fwd(int rows, int cols, float* h, int ldh,
                                        const float* gx, int ldgx, const float* gh, int ldgh,
                                        const float* bw, int ldbw, const float* br, int ldbr) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        const float pre = ((gx[b * ldgx + j] + bw[b * ldbw + j]) + gh[b * ldgh + j])
                          + br[b * ldbr + j];
        h[b * ldh + j] = tanhf(pre);
    });
}

extern "C" __global__ void rnn_relu_fwd(int rows, int cols, float* h, int ldh,
                                        const float* gx, int ldgx, const float* gh, int ldgh,
                                        const float* bw, int ldbw, const float* br, int ldbr) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        const float pre = ((gx[b * ldgx + j] + bw[b * ldbw + j]) + gh[b * ldgh + j])
                          + br[b * ldbr + j];
        h[b * ldh + j] = pre < 0.f ? 0.f : pre;  // not fmaxf: fmaxf(NaN, 0) is 0
    });
}

extern "C" __global__ void rnn_tanh_bwd(int rows, int cols, float* dg, int lddg,
                                        const float* dh_above, int lddh_above,
                                        const float* dh_rec, int lddh_rec,
                                        const float* h, int ldh) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        const float dh = dh_above[b * lddh_above + j] + dh_rec[b * lddh_rec + j];
        const float y = h[b * ldh + j];
        dg[b * lddg + j] = dh * (1.0f - y * y);
    });
}

extern "C" __global__ void rnn_relu_bwd(int rows, int cols, float* dg, int lddg,
                                        const float* dh_above, int lddh_above,
                                        const float* dh_rec, int lddh_rec,
                                        const float* h, int ldh) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        const float dh = dh_above[b * lddh_above + j] + dh_rec[b * lddh_rec + j];
        const float y = h[b * ldh + j];
        dg[b * lddg + j] = y > 0.f ? dh : 0.f;  // not dh * (y > 0): NaN * 0 is NaN
    });
}
