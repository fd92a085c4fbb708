/*
 * lstm.cu: the fused pointwise part of one LSTM step (one launch per cell step): bias adds,
 * the four gate activations, the cell update and the output, in one pass over memory.
 *
 * Calling convention (every kernel in cuda_src/; rnnrt/kernels.py builds the arguments):
 *   kernel(int rows, int cols, outs..., ins...), each view a (float* p, int ld) pair,
 *   row-major: element (r, c) at p[r*ld + c]; ld = 0 broadcasts one row (the biases).
 *   fp32 only. Gate blocks are stacked in torch order i, f, g, o: gate q of hidden unit j is
 *   column q*H + j. Each thread reads everything of its (b, j) before writing anything, so
 *   an output may alias an input exactly (same pointer, same ld), e.g. c over c_prev.
 *   Launch: a 1-D grid-stride loop over B*H, 256 threads a block.
 *
 * Kernels (one variant, fp32):
 *   kernel lstm_fwd(rows = B, cols = H)
 *       pre_q = ((gx + bw) + gh) + br            (in that order, per gate q)
 *       i, f, g, o = sigma(pre_0), sigma(pre_1), tanh(pre_2), sigma(pre_3)
 *       c = f * c_prev + i * g;  h = o * tanh(c)
 *     out h      [B, H]    new hidden state
 *     out c      [B, H]    new cell state
 *     out act    [B, 4H]   i, f, g, o after activation, kept for the backward pass
 *     in  gx     [B, 4H]   W x_t (from the input GEMM)
 *     in  gh     [B, 4H]   R h_{t-1} (from the recurrent GEMM)
 *     in  bw     [B, 4H]   b_ih, usually ld 0 (one row broadcast)
 *     in  br     [B, 4H]   b_hh, usually ld 0
 *     in  c_prev [B, H]    previous cell state
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

// sigma(x) from exp of a non-positive number only: no overflow for large |x|, no inf/inf.
__device__ __forceinline__ float sigmoidf(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

extern "C" __global__ void lstm_fwd(int rows, int cols,
                                    float* h, int ldh, float* c, int ldc, float* act, int ldact,
                                    const float* gx, int ldgx, const float* gh, int ldgh,
                                    const float* bw, int ldbw, const float* br, int ldbr,
                                    const float* c_prev, int ldc_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        // ((gx + bw) + gh) + br at column k: the order every twin and the naive rung follow
        auto pre = [&](long long k) {
            return ((gx[b * ldgx + k] + bw[b * ldbw + k]) + gh[b * ldgh + k]) + br[b * ldbr + k];
        };
        const float pre_i = pre(j), pre_f = pre(cols + j);
        const float pre_g = pre(2 * (long long)cols + j), pre_o = pre(3 * (long long)cols + j);
        const float cp = c_prev[b * ldc_prev + j];
        // All reads are done: from here on only writes (outputs may alias inputs).
        const float i = sigmoidf(pre_i), f = sigmoidf(pre_f);
        const float g = tanhf(pre_g), o = sigmoidf(pre_o);
        const float cn = f * cp + i * g;
        c[b * ldc + j] = cn;
        h[b * ldh + j] = o * tanhf(cn);
        float* a = act + b * ldact + j;
        a[0] = i;
        a[cols] = f;
        a[2 * (long long)cols] = g;
        a[3 * (long long)cols] = o;
    });
}
