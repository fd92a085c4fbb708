/*
 * pointwise_common.cuh: what the pointwise kernel files share (elementwise.cu, lstm.cu,
 * gru.cu, rnn.cu #include it; rnnrt's loader, rnnrt/kernels/sources.py, inlines it). No
 * kernels.
 *   for_each_element   the grid-stride loop over a [rows, cols] problem every kernel runs
 *   sigmoidf           the sigmoid of the naive and the fused kernels
 * and includes storage.cuh (bf16, fp16, to_f, from_f: the typed twins' element types).
 * persistent_common.cuh keeps its own sigmoidf (the forward persistent kernels' code stays
 * as measured); a test holds the two identical.
 */
#ifndef RNNRT_POINTWISE_COMMON_CUH
#define RNNRT_POINTWISE_COMMON_CUH

#include "storage.cuh"

// Calls f(r, c) for every element of a [rows, cols] problem, grid-stride. 64-bit indices:
// rows*ld reaches past 2^31 for views over [T*B, G*H] buffers.
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

#endif  // RNNRT_POINTWISE_COMMON_CUH
