/*
 * rnn.cu: the fused pointwise part of one plain-RNN step (one launch per cell step): forward,
 * both bias adds and the activation in one pass; backward, the sum of the two incoming
 * gradients times the activation's derivative. No activations are saved: the backward gets
 * the derivative from h itself (1 - h^2 for tanh, h > 0 for relu).
 *
 * Calling convention (every kernel in cuda_src/; rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows, int cols, outs..., ins...), each view a (float* p, int ld) pair,
 *   row-major: element (r, c) at p[r*ld + c]; ld = 0 broadcasts one row (the biases).
 *   Each thread reads its element of every input before writing its output, so
 *   the output may alias an input exactly (same pointer, same ld), e.g. h over gx, or dg
 *   over dh_above.
 *   Launch: a 1-D grid-stride loop over B*H, 256 threads a block.
 *
 * Element types: each kernel K below has two entry points, `extern "C"` K with every pointer
 * float* (the fp32 plans' kernel) and its typed twin, the template K_t<T_1, ..., T_n>, one type
 * per pointer argument in call order, each float, bf16 or fp16 (storage.cuh): the buffer its view
 * lies in (in a 16-bit plan h, h_prev and dg are 16-bit, the rest fp32). Both are one loop over
 * the same templated element function (*_element below): the math is fp32, a load converts (to_f),
 * a store rounds to its output's type (from_f); K_t<float, ...> compiles to K's code (a test
 * compares PTX).
 *
 * Kernels (two variants of one step, differing in the activation only, each plain and,
 * below, masked; each with its typed twin):
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
 *   kernel rnn_tanh_bwd_split(rows = B, cols = H)   rnn_tanh_bwd with dh_rec summed from the
 *       split-K recurrent GEMM's partial products as ew_sum_splits sums them (dh_rec = base +
 *       parts[0] + ... + parts[splits - 1], in that order, fp32; pointwise_common.cuh
 *       SplitRec): the same bits as ew_sum_splits into fp32 dh_rec, then rnn_tanh_bwd
 *     out dg       [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]         the sum's base (the first partial product)
 *     in  parts    [splits*B, H]  the rest: part s is rows s*B .. (s+1)*B - 1
 *     in  h        [B, H]
 *     int splits                  >= 0
 *   kernel rnn_relu_bwd_split(rows = B, cols = H)   rnn_relu_bwd, dh_rec as rnn_tanh_bwd_split's
 *     out dg       [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]
 *     in  parts    [splits*B, H]
 *     in  h        [B, H]
 *     int splits                  >= 0
 *
 * Masked variants, for variable-length plans (rnnrt/plan/packing.py): a row whose sequence
 * has ended by this step (mask 0) is *frozen*: h_prev (forward) or dh_rec (backward) passes
 * through and nothing else of the row is read; rows with mask != 0 compute exactly as
 * above (the same code), with dh_prev = 0 in the backward.
 *   kernel rnn_tanh_fwd_mask(rows = B, cols = H)   rnn_tanh_fwd, or h = h_prev if frozen
 *     out h      [B, H]
 *     in  gx     [B, H]
 *     in  gh     [B, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     in  h_prev [B, H]    previous hidden state (passed through on frozen rows)
 *     in  mask   [B, 1]    1 where the row's sequence runs this step, 0 where it has ended
 *   kernel rnn_relu_fwd_mask(rows = B, cols = H)   rnn_relu_fwd, or h = h_prev if frozen
 *     out h      [B, H]
 *     in  gx     [B, H]
 *     in  gh     [B, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     in  h_prev [B, H]
 *     in  mask   [B, 1]
 *   kernel rnn_tanh_bwd_mask(rows = B, cols = H)   rnn_tanh_bwd and dh_prev = 0; frozen
 *       rows: dg = 0, dh_prev = dh_rec
 *     out dg       [B, H]
 *     out dh_prev  [B, H]    the direct part of the gradient of h_{t-1}: the caller adds
 *                            dg R (a GEMM with beta = 1) to make step t-1's dh_rec
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]
 *     in  h        [B, H]
 *     in  mask     [B, 1]
 *   kernel rnn_relu_bwd_mask(rows = B, cols = H)   rnn_relu_bwd and dh_prev = 0; frozen
 *       rows: dg = 0, dh_prev = dh_rec
 *     out dg       [B, H]
 *     out dh_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]
 *     in  h        [B, H]
 *     in  mask     [B, 1]
 *   kernel rnn_tanh_bwd_mask_split(rows = B, cols = H)   rnn_tanh_bwd_mask with dh_rec summed
 *       from the split-K recurrent GEMM's partial products of step t (part_rows <= B rows)
 *       (dh_rec = base + parts[0] + ... + parts[splits - 1] on rows < part_rows, base alone
 *       past them: ew_sum_splits's sum over step t's rows, fp32; pointwise_common.cuh)
 *     out dg       [B, H]
 *     out dh_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]                 the sum's base (the direct part, dh_n past step t)
 *     in  parts    [splits*part_rows, H]  part s is rows s*part_rows .. (s+1)*part_rows - 1
 *     in  h        [B, H]
 *     in  mask     [B, 1]
 *     int splits                          >= 0
 *     int part_rows                       0 .. B
 *   kernel rnn_relu_bwd_mask_split(rows = B, cols = H)   rnn_relu_bwd_mask, dh_rec as
 *       rnn_tanh_bwd_mask_split's
 *     out dg       [B, H]
 *     out dh_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]
 *     in  parts    [splits*part_rows, H]
 *     in  h        [B, H]
 *     in  mask     [B, 1]
 *     int splits                          >= 0
 *     int part_rows                       0 .. B
 */

// for_each_element, sigmoidf; bf16, fp16, to_f, from_f (storage.cuh); *_bwd_point: the
// backward's arithmetic (persistent_bwd.cu's too)
#include "pointwise_common.cuh"
#include "cell_bwd.cuh"

// One element (b, j) of rnn_{tanh,relu}_fwd (RELU picks the activation), shared by the plain
// and the masked kernels.
template <bool RELU, class TH, class TGX, class TGH, class TBW, class TBR>
__device__ __forceinline__ void rnn_fwd_element(
        long long b, long long j, TH* h, int ldh, const TGX* gx, int ldgx,
        const TGH* gh, int ldgh, const TBW* bw, int ldbw, const TBR* br, int ldbr) {
    const float pre = ((to_f(gx[b * ldgx + j]) + to_f(bw[b * ldbw + j]))
                       + to_f(gh[b * ldgh + j])) + to_f(br[b * ldbr + j]);
    if (RELU) {
        h[b * ldh + j] = from_f<TH>(pre < 0.f ? 0.f : pre);  // not fmaxf: fmaxf(NaN, 0) is 0
    } else {
        h[b * ldh + j] = from_f<TH>(tanhf(pre));
    }
}

// One element (b, j) of rnn_{tanh,relu}_bwd, shared by the plain, the masked and the split
// kernels (dh_rec: a pointer, or the split kernels' SplitRec; rec_at reads either).
template <bool RELU, class TDG, class TDHA, class TDHR, class TH>
__device__ __forceinline__ void rnn_bwd_element(
        long long b, long long j, TDG* dg, int lddg, const TDHA* dh_above, int lddh_above,
        TDHR dh_rec, int lddh_rec, const TH* h, int ldh) {
    const float dh = to_f(dh_above[b * lddh_above + j]) + rec_at(dh_rec, lddh_rec, b, j);
    const float y = to_f(h[b * ldh + j]);
    dg[b * lddg + j] = from_f<TDG>(rnn_bwd_point<RELU>(dh, y));
}

extern "C" __global__ void rnn_tanh_fwd(int rows, int cols, float* h, int ldh,
                                        const float* gx, int ldgx, const float* gh, int ldgh,
                                        const float* bw, int ldbw, const float* br, int ldbr) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_element<false>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr);
    });
}

extern "C" __global__ void rnn_relu_fwd(int rows, int cols, float* h, int ldh,
                                        const float* gx, int ldgx, const float* gh, int ldgh,
                                        const float* bw, int ldbw, const float* br, int ldbr) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_element<true>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr);
    });
}

extern "C" __global__ void rnn_tanh_bwd(int rows, int cols, float* dg, int lddg,
                                        const float* dh_above, int lddh_above,
                                        const float* dh_rec, int lddh_rec,
                                        const float* h, int ldh) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<false>(b, j, dg, lddg, dh_above, lddh_above, dh_rec, lddh_rec, h, ldh);
    });
}

extern "C" __global__ void rnn_relu_bwd(int rows, int cols, float* dg, int lddg,
                                        const float* dh_above, int lddh_above,
                                        const float* dh_rec, int lddh_rec,
                                        const float* h, int ldh) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<true>(b, j, dg, lddg, dh_above, lddh_above, dh_rec, lddh_rec, h, ldh);
    });
}

extern "C" __global__ void rnn_tanh_bwd_split(int rows, int cols, float* dg, int lddg,
                                              const float* dh_above, int lddh_above,
                                              const float* dh_rec, int lddh_rec,
                                              const float* parts, int ldparts,
                                              const float* h, int ldh, int splits) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<false>(b, j, dg, lddg, dh_above, lddh_above, rec, lddh_rec, h, ldh);
    });
}

extern "C" __global__ void rnn_relu_bwd_split(int rows, int cols, float* dg, int lddg,
                                              const float* dh_above, int lddh_above,
                                              const float* dh_rec, int lddh_rec,
                                              const float* parts, int ldparts,
                                              const float* h, int ldh, int splits) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<true>(b, j, dg, lddg, dh_above, lddh_above, rec, lddh_rec, h, ldh);
    });
}

// The masked kernels: a frozen row (mask 0) passes h_prev (forward) or dh_rec (backward)
// through and reads nothing else.
template <bool RELU, class TH, class TGX, class TGH, class TBW, class TBR, class THP,
          class TMASK>
__device__ __forceinline__ void rnn_fwd_mask_element(
        long long b, long long j, TH* h, int ldh, const TGX* gx, int ldgx,
        const TGH* gh, int ldgh, const TBW* bw, int ldbw, const TBR* br, int ldbr,
        const THP* h_prev, int ldh_prev, const TMASK* mask, int ldmask) {
    if (to_f(mask[b * ldmask]) != 0.f) {
        rnn_fwd_element<RELU>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr);
    } else {
        h[b * ldh + j] = from_f<TH>(to_f(h_prev[b * ldh_prev + j]));
    }
}

template <bool RELU, class TDG, class TDHP, class TDHA, class TDHR, class TH, class TMASK>
__device__ __forceinline__ void rnn_bwd_mask_element(
        long long b, long long j, TDG* dg, int lddg, TDHP* dh_prev, int lddh_prev,
        const TDHA* dh_above, int lddh_above, TDHR dh_rec, int lddh_rec,
        const TH* h, int ldh, const TMASK* mask, int ldmask) {
    if (to_f(mask[b * ldmask]) != 0.f) {
        rnn_bwd_element<RELU>(b, j, dg, lddg, dh_above, lddh_above, dh_rec, lddh_rec, h, ldh);
        dh_prev[b * lddh_prev + j] = from_f<TDHP>(0.f);
    } else {
        const float dhr = rec_at(dh_rec, lddh_rec, b, j);
        // All reads are done: from here on only writes (outputs may alias inputs).
        dg[b * lddg + j] = from_f<TDG>(0.f);
        dh_prev[b * lddh_prev + j] = from_f<TDHP>(dhr);
    }
}

extern "C" __global__ void rnn_tanh_fwd_mask(int rows, int cols, float* h, int ldh,
                                             const float* gx, int ldgx,
                                             const float* gh, int ldgh,
                                             const float* bw, int ldbw,
                                             const float* br, int ldbr,
                                             const float* h_prev, int ldh_prev,
                                             const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_mask_element<false>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr,
                                    h_prev, ldh_prev, mask, ldmask);
    });
}

extern "C" __global__ void rnn_relu_fwd_mask(int rows, int cols, float* h, int ldh,
                                             const float* gx, int ldgx,
                                             const float* gh, int ldgh,
                                             const float* bw, int ldbw,
                                             const float* br, int ldbr,
                                             const float* h_prev, int ldh_prev,
                                             const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_mask_element<true>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr,
                                   h_prev, ldh_prev, mask, ldmask);
    });
}

extern "C" __global__ void rnn_tanh_bwd_mask(int rows, int cols, float* dg, int lddg,
                                             float* dh_prev, int lddh_prev,
                                             const float* dh_above, int lddh_above,
                                             const float* dh_rec, int lddh_rec,
                                             const float* h, int ldh,
                                             const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<false>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                    dh_rec, lddh_rec, h, ldh, mask, ldmask);
    });
}

extern "C" __global__ void rnn_relu_bwd_mask(int rows, int cols, float* dg, int lddg,
                                             float* dh_prev, int lddh_prev,
                                             const float* dh_above, int lddh_above,
                                             const float* dh_rec, int lddh_rec,
                                             const float* h, int ldh,
                                             const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<true>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                   dh_rec, lddh_rec, h, ldh, mask, ldmask);
    });
}

extern "C" __global__ void rnn_tanh_bwd_mask_split(int rows, int cols, float* dg, int lddg,
                                                   float* dh_prev, int lddh_prev,
                                                   const float* dh_above, int lddh_above,
                                                   const float* dh_rec, int lddh_rec,
                                                   const float* parts, int ldparts,
                                                   const float* h, int ldh,
                                                   const float* mask, int ldmask, int splits,
                                                   int part_rows) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<false>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                    rec, lddh_rec, h, ldh, mask, ldmask);
    });
}

extern "C" __global__ void rnn_relu_bwd_mask_split(int rows, int cols, float* dg, int lddg,
                                                   float* dh_prev, int lddh_prev,
                                                   const float* dh_above, int lddh_above,
                                                   const float* dh_rec, int lddh_rec,
                                                   const float* parts, int ldparts,
                                                   const float* h, int ldh,
                                                   const float* mask, int ldmask, int splits,
                                                   int part_rows) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<true>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                    rec, lddh_rec, h, ldh, mask, ldmask);
    });
}

// --- the typed twins (see the header): the same element code, each pointer its own type

template <class TH, class TGX, class TGH, class TBW, class TBR>
__global__ void rnn_tanh_fwd_t(int rows, int cols, TH* h, int ldh, const TGX* gx, int ldgx,
                               const TGH* gh, int ldgh, const TBW* bw, int ldbw, const TBR* br,
                               int ldbr) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_element<false>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr);
    });
}

template <class TH, class TGX, class TGH, class TBW, class TBR>
__global__ void rnn_relu_fwd_t(int rows, int cols, TH* h, int ldh, const TGX* gx, int ldgx,
                               const TGH* gh, int ldgh, const TBW* bw, int ldbw, const TBR* br,
                               int ldbr) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_element<true>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr);
    });
}

template <class TDG, class TDHA, class TDHR, class TH>
__global__ void rnn_tanh_bwd_t(int rows, int cols, TDG* dg, int lddg, const TDHA* dh_above,
                               int lddh_above, const TDHR* dh_rec, int lddh_rec, const TH* h,
                               int ldh) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<false>(b, j, dg, lddg, dh_above, lddh_above, dh_rec, lddh_rec, h, ldh);
    });
}

template <class TDG, class TDHA, class TDHR, class TP, class TH>
__global__ void rnn_tanh_bwd_split_t(int rows, int cols, TDG* dg, int lddg,
                                     const TDHA* dh_above, int lddh_above, const TDHR* dh_rec,
                                     int lddh_rec, const TP* parts, int ldparts, const TH* h,
                                     int ldh, int splits) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<false>(b, j, dg, lddg, dh_above, lddh_above, rec, lddh_rec, h, ldh);
    });
}

template <class TDG, class TDHA, class TDHR, class TH>
__global__ void rnn_relu_bwd_t(int rows, int cols, TDG* dg, int lddg, const TDHA* dh_above,
                               int lddh_above, const TDHR* dh_rec, int lddh_rec, const TH* h,
                               int ldh) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<true>(b, j, dg, lddg, dh_above, lddh_above, dh_rec, lddh_rec, h, ldh);
    });
}

template <class TDG, class TDHA, class TDHR, class TP, class TH>
__global__ void rnn_relu_bwd_split_t(int rows, int cols, TDG* dg, int lddg,
                                     const TDHA* dh_above, int lddh_above, const TDHR* dh_rec,
                                     int lddh_rec, const TP* parts, int ldparts, const TH* h,
                                     int ldh, int splits) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_element<true>(b, j, dg, lddg, dh_above, lddh_above, rec, lddh_rec, h, ldh);
    });
}

template <class TH, class TGX, class TGH, class TBW, class TBR, class THP, class TMASK>
__global__ void rnn_tanh_fwd_mask_t(int rows, int cols, TH* h, int ldh, const TGX* gx,
                                    int ldgx, const TGH* gh, int ldgh, const TBW* bw, int ldbw,
                                    const TBR* br, int ldbr, const THP* h_prev, int ldh_prev,
                                    const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_mask_element<false>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr,
                                    h_prev, ldh_prev, mask, ldmask);
    });
}

template <class TH, class TGX, class TGH, class TBW, class TBR, class THP, class TMASK>
__global__ void rnn_relu_fwd_mask_t(int rows, int cols, TH* h, int ldh, const TGX* gx,
                                    int ldgx, const TGH* gh, int ldgh, const TBW* bw, int ldbw,
                                    const TBR* br, int ldbr, const THP* h_prev, int ldh_prev,
                                    const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_fwd_mask_element<true>(b, j, h, ldh, gx, ldgx, gh, ldgh, bw, ldbw, br, ldbr,
                                    h_prev, ldh_prev, mask, ldmask);
    });
}

template <class TDG, class TDHP, class TDHA, class TDHR, class TH, class TMASK>
__global__ void rnn_tanh_bwd_mask_t(int rows, int cols, TDG* dg, int lddg, TDHP* dh_prev,
                                    int lddh_prev, const TDHA* dh_above, int lddh_above,
                                    const TDHR* dh_rec, int lddh_rec, const TH* h, int ldh,
                                    const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<false>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                    dh_rec, lddh_rec, h, ldh, mask, ldmask);
    });
}

template <class TDG, class TDHP, class TDHA, class TDHR, class TH, class TMASK>
__global__ void rnn_relu_bwd_mask_t(int rows, int cols, TDG* dg, int lddg, TDHP* dh_prev,
                                    int lddh_prev, const TDHA* dh_above, int lddh_above,
                                    const TDHR* dh_rec, int lddh_rec, const TH* h, int ldh,
                                    const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<true>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                    dh_rec, lddh_rec, h, ldh, mask, ldmask);
    });
}

template <class TDG, class TDHP, class TDHA, class TDHR, class TP, class TH, class TMASK>
__global__ void rnn_tanh_bwd_mask_split_t(int rows, int cols, TDG* dg, int lddg,
                                          TDHP* dh_prev, int lddh_prev, const TDHA* dh_above,
                                          int lddh_above, const TDHR* dh_rec, int lddh_rec,
                                          const TP* parts, int ldparts, const TH* h, int ldh,
                                          const TMASK* mask, int ldmask, int splits,
                                          int part_rows) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<false>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                    rec, lddh_rec, h, ldh, mask, ldmask);
    });
}

template <class TDG, class TDHP, class TDHA, class TDHR, class TP, class TH, class TMASK>
__global__ void rnn_relu_bwd_mask_split_t(int rows, int cols, TDG* dg, int lddg,
                                          TDHP* dh_prev, int lddh_prev, const TDHA* dh_above,
                                          int lddh_above, const TDHR* dh_rec, int lddh_rec,
                                          const TP* parts, int ldparts, const TH* h, int ldh,
                                          const TMASK* mask, int ldmask, int splits,
                                          int part_rows) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        rnn_bwd_mask_element<true>(b, j, dg, lddg, dh_prev, lddh_prev, dh_above, lddh_above,
                                    rec, lddh_rec, h, ldh, mask, ldmask);
    });
}
