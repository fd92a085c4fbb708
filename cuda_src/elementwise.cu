/*
 * elementwise.cu: the "naive" rung, one kernel per elementary operation, so a cell step
 * costs one launch (and one round trip through memory) per + - * and activation.
 *
 * Calling convention (every kernel in cuda_src/; rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows, int cols, outs..., ins...), each view a (float* p, int ld) pair,
 *   row-major: element (r, c) at p[r*ld + c]; ld = 0 broadcasts one row.
 *   Each element is read completely before it is written, so an output may alias an input
 *   exactly (same pointer, same ld): in place is safe. Partial overlaps are not.
 *   Launch: a 1-D grid-stride loop over rows*cols, 256 threads a block (each thread walks its
 *   elements as (row, column): pointwise_common.cuh's element_walk; ew_copy loads 4 of them
 *   before it stores any, and 4 elements an access where the views are aligned to it).
 *
 * Element types: each kernel K below has two entry points over one templated loop:
 * `extern "C"` K with every pointer float* (the fp32 plans' kernel, unchanged) and its typed
 * twin, the template K_t<T_1, ..., T_n>, one type per pointer argument in call order, each
 * float, bf16 or fp16 (storage.cuh): the buffer its view lies in (rnnrt/kernels/library.py
 * instantiates the combination a plan's views have). The math is fp32 in both: a load
 * converts to float (to_f), a store rounds to the output's type (from_f); K_t<float, ...>
 * compiles to K's code (a test compares their PTX).
 *
 * Kernels (one variant each, and its typed twin):
 *   kernel ew_add(rows, cols)      out = a + b
 *     out out [rows, cols]
 *     in  a   [rows, cols]
 *     in  b   [rows, cols]
 *   kernel ew_sub(rows, cols)      out = a - b
 *     out out [rows, cols]
 *     in  a   [rows, cols]
 *     in  b   [rows, cols]
 *   kernel ew_mul(rows, cols)      out = a * b
 *     out out [rows, cols]
 *     in  a   [rows, cols]
 *     in  b   [rows, cols]
 *   kernel ew_sigmoid(rows, cols)  out = 1 / (1 + exp(-a)), computed without overflow
 *     out out [rows, cols]
 *     in  a   [rows, cols]
 *   kernel ew_tanh(rows, cols)     out = tanh(a)
 *     out out [rows, cols]
 *     in  a   [rows, cols]
 *   kernel ew_relu(rows, cols)     out = max(a, 0); NaN stays NaN, as in torch
 *     out out [rows, cols]
 *     in  a   [rows, cols]
 *   kernel ew_dsigmoid(rows, cols) out = dy * (y*(1-y)), y the sigmoid's output
 *     out out [rows, cols]
 *     in  dy  [rows, cols]
 *     in  y   [rows, cols]
 *   kernel ew_dtanh(rows, cols)    out = dy * (1 - y*y), y the tanh's output
 *     out out [rows, cols]
 *     in  dy  [rows, cols]
 *     in  y   [rows, cols]
 *   kernel ew_drelu(rows, cols)    out = y > 0 ? dy : 0, y the relu's output (torch's
 *                                  convention: 0 where y == 0, and where y <= 0 even if dy
 *                                  is NaN or Inf)
 *     out out [rows, cols]
 *     in  dy  [rows, cols]
 *     in  y   [rows, cols]
 *   kernel ew_copy(rows, cols)     out = a (variable-length plans: final states of the
 *                                  sequences that end at a step, and their gradients)
 *     out out [rows, cols]
 *     in  a   [rows, cols]
 *   kernel ew_select(rows, cols)   out = mask[r] != 0 ? a : b, a row mask (the naive rung's
 *                                  frozen rows of variable-length plans); the side not
 *                                  taken is not read, so a NaN there does not pass
 *     out out  [rows, cols]
 *     in  mask [rows, 1]
 *     in  a    [rows, cols]
 *     in  b    [rows, cols]
 *   kernel ew_sum_splits(rows, cols)  out = base + parts[0] + ... + parts[splits - 1], in
 *                                  that order (the split-K recurrent backward GEMM's partial
 *                                  products, rnnrt/plan/backward.py: the same bits every run);
 *                                  base may be out itself (a GRU's direct part of dh_{t-1},
 *                                  already there) or the first partial
 *     out out   [rows, cols]
 *     in  base  [rows, cols]
 *     in  parts [splits*rows, cols]  part s is rows s*rows .. (s+1)*rows - 1
 *     int splits                     >= 1
 */

// for_each_element, for_each_element_batched, sigmoidf; bf16, fp16, to_f, from_f (storage.cuh)
#include "pointwise_common.cuh"

// Each kernel's loop is written once, below, as a template over the element types: K (all
// float) and its twin K_t call the same one (fp32 math: loads widen through to_f, the store
// rounds through from_f, both the identity for float). The operations of ew_unary and
// ew_binary are types, not captured values: what a kernel's lambda captures, and in which
// order, shapes its PTX, and the fp32 kernels' PTX is kept as it was.
struct op_add { __device__ float operator()(float a, float b) const { return a + b; } };
struct op_sub { __device__ float operator()(float a, float b) const { return a - b; } };
struct op_mul { __device__ float operator()(float a, float b) const { return a * b; } };
struct op_sigmoid { __device__ float operator()(float a) const { return sigmoidf(a); } };
struct op_tanh { __device__ float operator()(float a) const { return tanhf(a); } };

// out = op(a), elementwise.
template <class OP, class TOUT, class TA>
__device__ __forceinline__ void ew_unary(int rows, int cols, TOUT* out, int ldout, const TA* a,
                                         int lda) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        out[r * ldout + c] = from_f<TOUT>(OP()(to_f(a[r * lda + c])));
    });
}

// out = op(a, b), elementwise.
template <class OP, class TOUT, class TA, class TB>
__device__ __forceinline__ void ew_binary(int rows, int cols, TOUT* out, int ldout, const TA* a,
                                          int lda, const TB* b, int ldb) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        out[r * ldout + c] = from_f<TOUT>(OP()(to_f(a[r * lda + c]), to_f(b[r * ldb + c])));
    });
}

// The loops of the kernels that read an input before storing (their fp32 kernels' PTX follows
// the order a lambda first names its pointers, so these keep their own loop, written once).
template <class TOUT, class TA>
__device__ __forceinline__ void ew_relu_rows(int rows, int cols, TOUT* out, int ldout,
                                             const TA* a, int lda) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        const float x = to_f(a[r * lda + c]);
        out[r * ldout + c] = from_f<TOUT>(x < 0.f ? 0.f : x);  // not fmaxf: fmaxf(NaN, 0) is 0
    });
}

template <class TOUT, class TDY, class TY>
__device__ __forceinline__ void ew_dsigmoid_rows(int rows, int cols, TOUT* out, int ldout,
                                                 const TDY* dy, int lddy, const TY* y, int ldy) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        const float s = to_f(y[r * ldy + c]);
        out[r * ldout + c] = from_f<TOUT>(to_f(dy[r * lddy + c]) * (s * (1.0f - s)));
    });
}

template <class TOUT, class TDY, class TY>
__device__ __forceinline__ void ew_dtanh_rows(int rows, int cols, TOUT* out, int ldout,
                                              const TDY* dy, int lddy, const TY* y, int ldy) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        const float t = to_f(y[r * ldy + c]);
        out[r * ldout + c] = from_f<TOUT>(to_f(dy[r * lddy + c]) * (1.0f - t * t));
    });
}

template <class TOUT, class TDY, class TY>
__device__ __forceinline__ void ew_drelu_rows(int rows, int cols, TOUT* out, int ldout,
                                              const TDY* dy, int lddy, const TY* y, int ldy) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        const float g = to_f(dy[r * lddy + c]);
        // not dy * (y > 0): NaN * 0 is NaN
        out[r * ldout + c] = from_f<TOUT>(to_f(y[r * ldy + c]) > 0.f ? g : 0.f);
    });
}

// ew_copy's loop: COPY_BATCH elements a thread loaded, then stored (for_each_element_batched:
// the copy has no arithmetic to hide a load's latency behind; the 16-bit weight copies at the
// start of each pass are its largest launches), four at a time (quad: one 16-byte fp32 or
// 8-byte 16-bit access) where every row's start is aligned to a quad: cols and both lds
// multiples of 4, both pointers aligned (a uniform test, once a launch); else one at a time.
#ifndef COPY_BATCH   // (experiments/scripts/pointwise_bench.py times other batches)
#define COPY_BATCH 4
#endif

// 4 consecutive elements of T, one aligned access
template <class T>
struct alignas(4 * sizeof(T)) quad {
    T e[4];
};

template <class TOUT, class TA>
__device__ __forceinline__ void ew_copy_rows(int rows, int cols, TOUT* out, int ldout,
                                             const TA* a, int lda) {
    const bool by4 = cols % 4 == 0 && lda % 4 == 0 && ldout % 4 == 0 &&
                     reinterpret_cast<unsigned long long>(a) % sizeof(quad<TA>) == 0 &&
                     reinterpret_cast<unsigned long long>(out) % sizeof(quad<TOUT>) == 0;
    if (by4) {
        const quad<TA>* a4 = reinterpret_cast<const quad<TA>*>(a);
        quad<TOUT>* out4 = reinterpret_cast<quad<TOUT>*>(out);
        const int lda4 = lda / 4, ldout4 = ldout / 4;
        for_each_element_batched<COPY_BATCH>(
            rows, cols / 4, [=](long long r, long long c) { return a4[r * lda4 + c]; },
            [=](long long r, long long c, quad<TA> v) {
                quad<TOUT> w;
#pragma unroll
                for (int q = 0; q < 4; ++q) w.e[q] = from_f<TOUT>(to_f(v.e[q]));
                out4[r * ldout4 + c] = w;
            });
        return;
    }
    for_each_element_batched<COPY_BATCH>(
        rows, cols, [=](long long r, long long c) { return to_f(a[r * lda + c]); },
        [=](long long r, long long c, float v) { out[r * ldout + c] = from_f<TOUT>(v); });
}

// ew_select's loop: the side not taken is not read.
template <class TOUT, class TMASK, class TA, class TB>
__device__ __forceinline__ void ew_select_rows(int rows, int cols, TOUT* out, int ldout,
                                               const TMASK* mask, int ldmask, const TA* a,
                                               int lda, const TB* b, int ldb) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        out[r * ldout + c] = from_f<TOUT>(to_f(mask[r * ldmask]) != 0.f ? to_f(a[r * lda + c])
                                                                        : to_f(b[r * ldb + c]));
    });
}

// ew_sum_splits's loop: base first, then the parts in order (an exact alias of base and
// out is safe: each element is read before it is written, by the same thread).
template <class TOUT, class TBASE, class TPARTS>
__device__ __forceinline__ void ew_sum_splits_rows(int rows, int cols, TOUT* out, int ldout,
                                                   const TBASE* base, int ldbase,
                                                   const TPARTS* parts, int ldparts,
                                                   int splits) {
    for_each_element(rows, cols, [=](long long r, long long c) {
        float acc = to_f(base[r * ldbase + c]);
        for (int s = 0; s < splits; ++s) {
            acc += to_f(parts[(s * (long long)rows + r) * ldparts + c]);
        }
        out[r * ldout + c] = from_f<TOUT>(acc);
    });
}

extern "C" __global__ void ew_add(int rows, int cols, float* out, int ldout,
                                  const float* a, int lda, const float* b, int ldb) {
    ew_binary<op_add>(rows, cols, out, ldout, a, lda, b, ldb);
}

extern "C" __global__ void ew_sub(int rows, int cols, float* out, int ldout,
                                  const float* a, int lda, const float* b, int ldb) {
    ew_binary<op_sub>(rows, cols, out, ldout, a, lda, b, ldb);
}

extern "C" __global__ void ew_mul(int rows, int cols, float* out, int ldout,
                                  const float* a, int lda, const float* b, int ldb) {
    ew_binary<op_mul>(rows, cols, out, ldout, a, lda, b, ldb);
}

extern "C" __global__ void ew_sigmoid(int rows, int cols, float* out, int ldout,
                                      const float* a, int lda) {
    ew_unary<op_sigmoid>(rows, cols, out, ldout, a, lda);
}

extern "C" __global__ void ew_tanh(int rows, int cols, float* out, int ldout,
                                   const float* a, int lda) {
    ew_unary<op_tanh>(rows, cols, out, ldout, a, lda);
}

extern "C" __global__ void ew_relu(int rows, int cols, float* out, int ldout,
                                   const float* a, int lda) {
    ew_relu_rows(rows, cols, out, ldout, a, lda);
}

extern "C" __global__ void ew_dsigmoid(int rows, int cols, float* out, int ldout,
                                       const float* dy, int lddy, const float* y, int ldy) {
    ew_dsigmoid_rows(rows, cols, out, ldout, dy, lddy, y, ldy);
}

extern "C" __global__ void ew_dtanh(int rows, int cols, float* out, int ldout,
                                    const float* dy, int lddy, const float* y, int ldy) {
    ew_dtanh_rows(rows, cols, out, ldout, dy, lddy, y, ldy);
}

extern "C" __global__ void ew_drelu(int rows, int cols, float* out, int ldout,
                                    const float* dy, int lddy, const float* y, int ldy) {
    ew_drelu_rows(rows, cols, out, ldout, dy, lddy, y, ldy);
}

extern "C" __global__ void ew_copy(int rows, int cols, float* out, int ldout,
                                   const float* a, int lda) {
    ew_copy_rows(rows, cols, out, ldout, a, lda);
}

extern "C" __global__ void ew_select(int rows, int cols, float* out, int ldout,
                                     const float* mask, int ldmask, const float* a, int lda,
                                     const float* b, int ldb) {
    ew_select_rows(rows, cols, out, ldout, mask, ldmask, a, lda, b, ldb);
}

extern "C" __global__ void ew_sum_splits(int rows, int cols, float* out, int ldout,
                                         const float* base, int ldbase, const float* parts,
                                         int ldparts, int splits) {
    ew_sum_splits_rows(rows, cols, out, ldout, base, ldbase, parts, ldparts, splits);
}

// --- the typed twins (see the header): the same operations through the same loops

template <class TOUT, class TA, class TB>
__global__ void ew_add_t(int rows, int cols, TOUT* out, int ldout, const TA* a, int lda,
                         const TB* b, int ldb) {
    ew_binary<op_add>(rows, cols, out, ldout, a, lda, b, ldb);
}

template <class TOUT, class TA, class TB>
__global__ void ew_sub_t(int rows, int cols, TOUT* out, int ldout, const TA* a, int lda,
                         const TB* b, int ldb) {
    ew_binary<op_sub>(rows, cols, out, ldout, a, lda, b, ldb);
}

template <class TOUT, class TA, class TB>
__global__ void ew_mul_t(int rows, int cols, TOUT* out, int ldout, const TA* a, int lda,
                         const TB* b, int ldb) {
    ew_binary<op_mul>(rows, cols, out, ldout, a, lda, b, ldb);
}

template <class TOUT, class TA>
__global__ void ew_sigmoid_t(int rows, int cols, TOUT* out, int ldout, const TA* a, int lda) {
    ew_unary<op_sigmoid>(rows, cols, out, ldout, a, lda);
}

template <class TOUT, class TA>
__global__ void ew_tanh_t(int rows, int cols, TOUT* out, int ldout, const TA* a, int lda) {
    ew_unary<op_tanh>(rows, cols, out, ldout, a, lda);
}

template <class TOUT, class TA>
__global__ void ew_relu_t(int rows, int cols, TOUT* out, int ldout, const TA* a, int lda) {
    ew_relu_rows(rows, cols, out, ldout, a, lda);
}

template <class TOUT, class TDY, class TY>
__global__ void ew_dsigmoid_t(int rows, int cols, TOUT* out, int ldout, const TDY* dy, int lddy,
                              const TY* y, int ldy) {
    ew_dsigmoid_rows(rows, cols, out, ldout, dy, lddy, y, ldy);
}

template <class TOUT, class TDY, class TY>
__global__ void ew_dtanh_t(int rows, int cols, TOUT* out, int ldout, const TDY* dy, int lddy,
                           const TY* y, int ldy) {
    ew_dtanh_rows(rows, cols, out, ldout, dy, lddy, y, ldy);
}

template <class TOUT, class TDY, class TY>
__global__ void ew_drelu_t(int rows, int cols, TOUT* out, int ldout, const TDY* dy, int lddy,
                           const TY* y, int ldy) {
    ew_drelu_rows(rows, cols, out, ldout, dy, lddy, y, ldy);
}

template <class TOUT, class TA>
__global__ void ew_copy_t(int rows, int cols, TOUT* out, int ldout, const TA* a, int lda) {
    ew_copy_rows(rows, cols, out, ldout, a, lda);
}

template <class TOUT, class TMASK, class TA, class TB>
__global__ void ew_select_t(int rows, int cols, TOUT* out, int ldout, const TMASK* mask,
                            int ldmask, const TA* a, int lda, const TB* b, int ldb) {
    ew_select_rows(rows, cols, out, ldout, mask, ldmask, a, lda, b, ldb);
}

template <class TOUT, class TBASE, class TPARTS>
__global__ void ew_sum_splits_t(int rows, int cols, TOUT* out, int ldout, const TBASE* base,
                                int ldbase, const TPARTS* parts, int ldparts, int splits) {
    ew_sum_splits_rows(rows, cols, out, ldout, base, ldbase, parts, ldparts, splits);
}
