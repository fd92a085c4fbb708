/*
 * pointwise_common.cuh: what the pointwise kernel files share (elementwise.cu, lstm.cu,
 * gru.cu, rnn.cu #include it; rnnrt's loader, rnnrt/kernels/sources.py, inlines it). No
 * kernels.
 *   element_walk       a thread's grid-stride walk over a [rows, cols] problem as (row,
 *                      column): two divisions a thread, then additions
 *   for_each_element   the grid-stride loop over a [rows, cols] problem every kernel runs
 *   for_each_element_batched   the same walk, a batch of elements loaded before any is
 *                      stored (ew_copy: one load and one store an element)
 *   sigmoidf           the sigmoid of the naive and the fused kernels
 *   SplitRec, rec_at   the fused backward kernels' dh_rec: one array, or (the *_bwd_split
 *                      kernels) the split-K recurrent GEMM's partial products summed in order
 * and includes storage.cuh (bf16, fp16, to_f, from_f: the typed twins' element types).
 * persistent_common.cuh keeps its own sigmoidf (the forward persistent kernels' code stays
 * as measured); a test holds the two identical.
 */
#ifndef RNNRT_POINTWISE_COMMON_CUH
#define RNNRT_POINTWISE_COMMON_CUH

#include "storage.cuh"

// A thread's walk of the grid-stride loop over a [rows, cols] problem in row-major order: the
// flat elements i = blockIdx.x * blockDim.x + threadIdx.x + k * (gridDim.x * blockDim.x),
// k = 0, 1, ..., exactly those of a loop over i, as (row r, column c). Why not i / cols: a
// 64-bit division is a long software sequence on the GPU, and one an element held the weight
// copies (ew_copy_t<bf16, float>) to ~0.45 TB/s on the H100. Here the start and the stride
// are divided once a thread (the stride only where a thread has a second element: a grid
// that covers the problem, e.g. a step kernel's B*H, divides once); a step adds the stride's
// row and column parts with one carry.
// Rows 64-bit (r * ld passes 2^31 in views over [T*B, G*H] buffers; r + dr cannot wrap);
// columns 32-bit unsigned: c, dc < cols <= 2^31 - 1, so c + dc < 2^32 cannot wrap.
struct element_walk {
    long long r, dr;        // the row, and the stride's whole rows
    unsigned c, dc, cols;   // the column, and the stride's columns past them
    __device__ __forceinline__ element_walk(int rows, int ncols) : cols((unsigned)ncols) {
        const unsigned long long i =
            (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
        const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
        r = (long long)(i / cols);
        c = (unsigned)(i - (unsigned long long)r * cols);
        if ((unsigned long long)rows * cols > stride) {
            dr = (long long)(stride / cols);
            dc = (unsigned)(stride - (unsigned long long)dr * cols);
        } else {   // no thread has a second element: one step ends every walk
            dr = rows;
            dc = 0;
        }
    }
    __device__ __forceinline__ void next() {
        r += dr;
        c += dc;
        if (c >= cols) {
            c -= cols;
            ++r;
        }
    }
};

// Calls f(r, c) for every element of a [rows, cols] problem, grid-stride (element_walk: the
// same elements a thread as a loop over the flat index, in the same order). 64-bit indices:
// rows*ld reaches past 2^31 for views over [T*B, G*H] buffers.
template <class F>
__device__ __forceinline__ void for_each_element(int rows, int cols, F f) {
    for (element_walk w(rows, cols); w.r < rows; w.next()) {
        f(w.r, (long long)w.c);
    }
}

// for_each_element for a kernel whose element is one load and one store: a thread's next U
// elements (each its grid stride after the one before, so a warp's accesses stay coalesced)
// are all loaded (load(r, c) -> a value, e.g. a float) before any is stored (store(r, c, v)),
// U loads in flight a thread instead of one load's latency waited out per element. The U
// elements are distinct, so an output that aliases its input exactly is still read before it
// is written.
template <int U, class LOAD, class STORE>
__device__ __forceinline__ void for_each_element_batched(int rows, int cols, LOAD load,
                                                         STORE store) {
    using V = decltype(load(0LL, 0LL));
    element_walk w(rows, cols);
    while (w.r < rows) {
        long long r[U];
        unsigned c[U];
        V v[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            r[k] = w.r;
            c[k] = w.c;
            v[k] = V{};
            w.next();
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            if (r[k] < rows) v[k] = load(r[k], (long long)c[k]);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            if (r[k] < rows) store(r[k], (long long)c[k], v[k]);
        }
    }
}

// sigma(x) from exp of a non-positive number only: no overflow for large |x|, no inf/inf.
__device__ __forceinline__ float sigmoidf(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

// dh_rec of a backward step kernel (lstm.cu, gru.cu, rnn.cu), element (r, c): read from one
// array (rec_at(p, ld, r, c) = p[r*ld + c]), or, in the *_bwd_split / *_bwd_mask_split
// kernels, summed from the split-K recurrent GEMM's partial products as ew_sum_splits sums
// them: base, then parts[0], ..., parts[splits - 1] in that order, in fp32 (part s is rows
// s*prows .. (s+1)*prows - 1 of parts; rows r >= prows have no parts: base alone, as
// ew_sum_splits over the first prows rows leaves the rest -- a variable-length plan's step
// t-1 has more rows than step t's product). The sum is what ew_sum_splits writes into the
// plans' fp32 dh_rec buffer and the plain kernel reads back: the same bits, one launch a
// step fewer on the backward's chain.
template <class TB, class TP>
struct SplitRec {
    const TB* base;     // [rows, cols], row stride: the kernel's ld of dh_rec
    const TP* parts;    // [splits*prows, cols]
    int ldparts;
    int prows;          // rows of a part (the kernel's rows, or fewer)
    int splits;
};

template <class T>
__device__ __forceinline__ float rec_at(const T* p, int ld, long long r, long long c) {
    return to_f(p[r * ld + c]);
}

template <class TB, class TP>
__device__ __forceinline__ float rec_at(const SplitRec<TB, TP>& s, int ldbase, long long r,
                                        long long c) {
    float acc = to_f(s.base[r * ldbase + c]);
    if (r < s.prows) {
        for (int k = 0; k < s.splits; ++k) {
            acc += to_f(s.parts[(k * (long long)s.prows + r) * s.ldparts + c]);
        }
    }
    return acc;
}

#endif  // RNNRT_POINTWISE_COMMON_CUH
