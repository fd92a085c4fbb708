/*
 * gru.cu: the fused pointwise part of one GRU step (one launch per cell step), forward and
 * backward, torch's GRU: the reset gate multiplies (R_n h + b_hn), not h, so R h stays one
 * GEMM over all gates (and dgh one GEMM back).
 *
 * Calling convention (every kernel in cuda_src/; rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows, int cols, outs..., ins...), each view a (float* p, int ld) pair,
 *   row-major: element (r, c) at p[r*ld + c]; ld = 0 broadcasts one row (the biases).
 *   Gate blocks are stacked in torch order r, z, n: gate q of hidden unit j is
 *   column q*H + j. Each thread reads everything of its (b, j) before writing anything, so
 *   an output may alias an input exactly (same pointer, same ld), e.g. h over h_prev, or
 *   dh_prev over dh_rec in the backward.
 *   Launch: a 1-D grid-stride loop over B*H, 256 threads a block.
 *
 * Element types: each kernel K below has two entry points, `extern "C"` K with every pointer
 * float* (the fp32 plans' kernel) and its typed twin, the template K_t<T_1, ..., T_n>, one type
 * per pointer argument in call order, each float, bf16 or fp16 (storage.cuh): the buffer its view
 * lies in (in a 16-bit plan h, h_prev, dgx and dgh are 16-bit, the rest fp32). Both are one loop
 * over the same templated element function (*_element below): the math is fp32, a load converts
 * (to_f), a store rounds to its output's type (from_f); K_t<float, ...> compiles to K's code (a
 * test compares PTX).
 *
 * Kernels (each plain kernel and, below, its masked variant; the forward's also without act,
 * the _noact variants; each with its typed twin):
 *   kernel gru_fwd(rows = B, cols = H)
 *       r = sigma(((gx_r + bw_r) + gh_r) + br_r);  z = sigma(((gx_z + bw_z) + gh_z) + br_z)
 *       hn = gh_n + br_n;  n = tanh((gx_n + bw_n) + r * hn);  h = n + z * (h_prev - n)
 *     out h      [B, H]    new hidden state
 *     out act    [B, 4H]   r, z, n, hn (columns 0, H, 2H, 3H), kept for the backward pass
 *     in  gx     [B, 3H]   W x_t (from the input GEMM)
 *     in  gh     [B, 3H]   R h_{t-1} (from the recurrent GEMM)
 *     in  bw     [B, 3H]   b_ih, usually ld 0 (one row broadcast)
 *     in  br     [B, 3H]   b_hh, usually ld 0
 *     in  h_prev [B, H]    previous hidden state
 *   kernel gru_fwd_noact(rows = B, cols = H)   gru_fwd without act (an inference plan: nothing
 *       reads the gates there); h is gru_fwd's, the same code
 *     out h      [B, H]
 *     in  gx     [B, 3H]
 *     in  gh     [B, 3H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     in  h_prev [B, H]
 *   kernel gru_bwd(rows = B, cols = H)   one step of backprop through time, in this order:
 *       dh = dh_above + dh_rec;  dhz = dh * z;  dn = dh - dhz;  dn_p = dn * (1 - n*n)
 *       d = h_prev - n;  dz = dh * d;  dz_p = dz * (z*(1-z))
 *       dhn = dn_p * r;  dr = dn_p * hn;  dr_p = dr * (r*(1-r))
 *       dgx = [dr_p, dz_p, dn_p];  dgh = [dr_p, dz_p, dhn];  dh_prev = dhz
 *     (the naive rung's ew_* kernels issue the same operations one launch each; the
 *     subtraction dn = dh - dhz is kept out of an FMA so both round alike)
 *     out dgx      [B, 3H]   gradient of gx + bw (W x_t + b_ih), blocks r, z, n
 *     out dgh      [B, 3H]   gradient of gh + br (R h_{t-1} + b_hh), blocks r, z, n
 *     out dh_prev  [B, H]    the direct part of the gradient of h_{t-1}, z * dh: the caller
 *                            adds dgh R (a GEMM) to make step t-1's dh_rec
 *     in  dh_above [B, H]    gradient of h_t from above (dy_t, or the next layer's dx)
 *     in  dh_rec   [B, H]    gradient of h_t from step t+1 (dh_n at t = T-1)
 *     in  act      [B, 4H]   the forward's act: r, z, n, hn
 *     in  h_prev   [B, H]    h_{t-1}
 *   kernel gru_bwd_split(rows = B, cols = H)   gru_bwd with dh_rec summed from the split-K
 *       recurrent GEMM's partial products as ew_sum_splits sums them (dh_rec = base + parts[0]
 *       + ... + parts[splits - 1], in that order, fp32; pointwise_common.cuh SplitRec): the
 *       same bits as ew_sum_splits into fp32 dh_rec, then gru_bwd, in one launch
 *     out dgx      [B, 3H]
 *     out dgh      [B, 3H]
 *     out dh_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]         the sum's base (step t+1's direct part of dh_rec)
 *     in  parts    [splits*B, H]  the partial products: part s is rows s*B .. (s+1)*B - 1
 *     in  act      [B, 4H]
 *     in  h_prev   [B, H]
 *     int splits                  >= 0
 *
 * Masked variants, for variable-length plans (rnnrt/plan/packing.py): a row whose sequence
 * has ended by this step (mask 0) is *frozen*: its state passes through unchanged, so that
 * the row's last slot holds its final state; rows with mask != 0 compute exactly as above
 * (the same code).
 *   kernel gru_fwd_mask(rows = B, cols = H)   gru_fwd where mask != 0; frozen rows:
 *       h = h_prev, act = 0 (gx, gh and the biases are not read there)
 *     out h      [B, H]
 *     out act    [B, 4H]
 *     in  gx     [B, 3H]
 *     in  gh     [B, 3H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     in  h_prev [B, H]
 *     in  mask   [B, 1]    1 where the row's sequence runs this step, 0 where it has ended
 *   kernel gru_fwd_mask_noact(rows = B, cols = H)   gru_fwd_mask without act (inference)
 *     out h      [B, H]
 *     in  gx     [B, 3H]
 *     in  gh     [B, 3H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     in  h_prev [B, H]
 *     in  mask   [B, 1]
 *   kernel gru_bwd_mask(rows = B, cols = H)   gru_bwd where mask != 0; frozen rows pass the
 *       gradient through: dgx = dgh = 0, dh_prev = dh_rec (dh_above, act and h_prev are
 *       not read there: a frozen row has no output at this step)
 *     out dgx      [B, 3H]
 *     out dgh      [B, 3H]
 *     out dh_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]
 *     in  act      [B, 4H]
 *     in  h_prev   [B, H]
 *     in  mask     [B, 1]
 *   kernel gru_bwd_mask_split(rows = B, cols = H)   gru_bwd_mask with dh_rec summed from the
 *       split-K recurrent GEMM's partial products of step t, which has part_rows <= B rows
 *       (dh_rec = base + parts[0] + ... + parts[splits - 1] on rows < part_rows, base alone
 *       past them: ew_sum_splits's sum over step t's rows, fp32; pointwise_common.cuh)
 *     out dgx      [B, 3H]
 *     out dgh      [B, 3H]
 *     out dh_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]                 the sum's base (the direct part, dh_n past step t)
 *     in  parts    [splits*part_rows, H]  part s is rows s*part_rows .. (s+1)*part_rows - 1
 *     in  act      [B, 4H]
 *     in  h_prev   [B, H]
 *     in  mask     [B, 1]
 *     int splits                          >= 0
 *     int part_rows                       0 .. B
 */

// for_each_element, sigmoidf; bf16, fp16, to_f, from_f (storage.cuh); *_bwd_point: the
// backward's arithmetic (persistent_bwd.cu's too)
#include "pointwise_common.cuh"
#include "cell_bwd.cuh"

// One element (b, j) of gru_fwd, shared by the plain and the masked kernel: every input of
// the element is read before anything is written (outputs may alias inputs). SAVE: whether
// it stores the gates into act (false: the _noact kernels, act unused).
template <bool SAVE, class TH, class TACT, class TGX, class TGH, class TBW, class TBR, class THP>
__device__ __forceinline__ void gru_fwd_element(
        long long b, long long j, int cols, TH* h, int ldh, TACT* act, int ldact,
        const TGX* gx, int ldgx, const TGH* gh, int ldgh, const TBW* bw, int ldbw,
        const TBR* br, int ldbr, const THP* h_prev, int ldh_prev) {
    // ((gx + bw) + gh) + br at column k: the order every twin and the naive rung follow
    auto pre = [&](long long k) {
        return ((to_f(gx[b * ldgx + k]) + to_f(bw[b * ldbw + k])) + to_f(gh[b * ldgh + k]))
               + to_f(br[b * ldbr + k]);
    };
    const long long kn = 2 * (long long)cols + j;
    const float pre_r = pre(j), pre_z = pre(cols + j);
    const float xn = to_f(gx[b * ldgx + kn]) + to_f(bw[b * ldbw + kn]);
    const float hn = to_f(gh[b * ldgh + kn]) + to_f(br[b * ldbr + kn]);
    const float hp = to_f(h_prev[b * ldh_prev + j]);
    // All reads are done: from here on only writes (outputs may alias inputs).
    const float r = sigmoidf(pre_r), z = sigmoidf(pre_z);
    const float n = tanhf(xn + r * hn);
    h[b * ldh + j] = from_f<TH>(n + z * (hp - n));
    if (!SAVE) return;
    TACT* a = act + b * ldact + j;
    a[0] = from_f<TACT>(r);
    a[cols] = from_f<TACT>(z);
    a[2 * (long long)cols] = from_f<TACT>(n);
    a[3 * (long long)cols] = from_f<TACT>(hn);
}

// One element (b, j) of gru_bwd, shared by the plain, the masked and the split kernel
// (dh_rec: a pointer, or gru_bwd_split's SplitRec; rec_at reads either).
template <class TDGX, class TDGH, class TDHP, class TDHA, class TDHR, class TACT, class THP>
__device__ __forceinline__ void gru_bwd_element(
        long long b, long long j, int cols, TDGX* dgx, int lddgx, TDGH* dgh, int lddgh,
        TDHP* dh_prev, int lddh_prev, const TDHA* dh_above, int lddh_above,
        TDHR dh_rec, int lddh_rec, const TACT* act, int ldact, const THP* h_prev,
        int ldh_prev) {
    const TACT* a = act + b * ldact + j;
    const float r = to_f(a[0]), z = to_f(a[cols]);
    const float n = to_f(a[2 * (long long)cols]), hn = to_f(a[3 * (long long)cols]);
    const float dh = to_f(dh_above[b * lddh_above + j]) + rec_at(dh_rec, lddh_rec, b, j);
    const float hp = to_f(h_prev[b * ldh_prev + j]);
    // All reads are done: from here on only writes (outputs may alias inputs).
    float vx[3], vh[3], dhz;
    gru_bwd_point(dh, r, z, n, hn, hp, vx, vh, dhz);
    TDGX* gx = dgx + b * lddgx + j;
    gx[0] = from_f<TDGX>(vx[0]);
    gx[cols] = from_f<TDGX>(vx[1]);
    gx[2 * (long long)cols] = from_f<TDGX>(vx[2]);
    TDGH* gh = dgh + b * lddgh + j;
    gh[0] = from_f<TDGH>(vh[0]);
    gh[cols] = from_f<TDGH>(vh[1]);
    gh[2 * (long long)cols] = from_f<TDGH>(vh[2]);
    dh_prev[b * lddh_prev + j] = from_f<TDHP>(dhz);
}

// A frozen row (mask 0) of gru_fwd_mask: h = h_prev, act = 0 (where SAVE).
template <bool SAVE, class TH, class TACT, class THP>
__device__ __forceinline__ void gru_fwd_frozen_element(
        long long b, long long j, int cols, TH* h, int ldh, TACT* act, int ldact,
        const THP* h_prev, int ldh_prev) {
    const float hp = to_f(h_prev[b * ldh_prev + j]);
    // All reads are done: from here on only writes (outputs may alias inputs).
    h[b * ldh + j] = from_f<TH>(hp);
    if (!SAVE) return;
    TACT* a = act + b * ldact + j;
    a[0] = from_f<TACT>(0.f);
    a[cols] = from_f<TACT>(0.f);
    a[2 * (long long)cols] = from_f<TACT>(0.f);
    a[3 * (long long)cols] = from_f<TACT>(0.f);
}

// A frozen row (mask 0) of gru_bwd_mask: dgx = dgh = 0, dh_prev = dh_rec.
template <class TDGX, class TDGH, class TDHP, class TDHR>
__device__ __forceinline__ void gru_bwd_frozen_element(
        long long b, long long j, int cols, TDGX* dgx, int lddgx, TDGH* dgh, int lddgh,
        TDHP* dh_prev, int lddh_prev, TDHR dh_rec, int lddh_rec) {
    const float dhr = rec_at(dh_rec, lddh_rec, b, j);
    // All reads are done: from here on only writes (outputs may alias inputs).
    TDGX* gx = dgx + b * lddgx + j;
    gx[0] = from_f<TDGX>(0.f);
    gx[cols] = from_f<TDGX>(0.f);
    gx[2 * (long long)cols] = from_f<TDGX>(0.f);
    TDGH* gh = dgh + b * lddgh + j;
    gh[0] = from_f<TDGH>(0.f);
    gh[cols] = from_f<TDGH>(0.f);
    gh[2 * (long long)cols] = from_f<TDGH>(0.f);
    dh_prev[b * lddh_prev + j] = from_f<TDHP>(dhr);
}

// One element (b, j) of gru_fwd_mask: gru_fwd's where mask != 0, else the frozen row's.
// The pointers in the order the element code first reads them (mask first): the kernels'
// closures then keep them in that order, and the fp32 kernel's PTX is the one it had when this
// code stood in each kernel. SAVE: as gru_fwd_element's.
template <bool SAVE, class TH, class TACT, class TGX, class TGH, class TBW, class TBR,
          class THP, class TMASK>
__device__ __forceinline__ void gru_fwd_mask_element(
        long long b, long long j, const TMASK* mask, int ldmask, int cols, TH* h, int ldh,
        TACT* act, int ldact, const TGX* gx, int ldgx, const TGH* gh, int ldgh, const TBW* bw,
        int ldbw, const TBR* br, int ldbr, const THP* h_prev, int ldh_prev) {
    if (to_f(mask[b * ldmask]) != 0.f) {
        gru_fwd_element<SAVE>(b, j, cols, h, ldh, act, ldact, gx, ldgx, gh, ldgh, bw, ldbw, br,
                              ldbr, h_prev, ldh_prev);
        return;
    }
    gru_fwd_frozen_element<SAVE>(b, j, cols, h, ldh, act, ldact, h_prev, ldh_prev);
}

// One element (b, j) of gru_bwd_mask: gru_bwd's where mask != 0, else the frozen row's.
template <class TDGX, class TDGH, class TDHP, class TDHA, class TDHR, class TACT, class THP,
          class TMASK>
__device__ __forceinline__ void gru_bwd_mask_element(
        long long b, long long j, const TMASK* mask, int ldmask, int cols, TDGX* dgx, int lddgx,
        TDGH* dgh, int lddgh, TDHP* dh_prev, int lddh_prev, const TDHA* dh_above,
        int lddh_above, TDHR dh_rec, int lddh_rec, const TACT* act, int ldact,
        const THP* h_prev, int ldh_prev) {
    if (to_f(mask[b * ldmask]) != 0.f) {
        gru_bwd_element(b, j, cols, dgx, lddgx, dgh, lddgh, dh_prev, lddh_prev, dh_above,
                        lddh_above, dh_rec, lddh_rec, act, ldact, h_prev, ldh_prev);
        return;
    }
    gru_bwd_frozen_element(b, j, cols, dgx, lddgx, dgh, lddgh, dh_prev, lddh_prev, dh_rec,
                           lddh_rec);
}

extern "C" __global__ void gru_fwd(int rows, int cols, float* h, int ldh, float* act, int ldact,
                                   const float* gx, int ldgx, const float* gh, int ldgh,
                                   const float* bw, int ldbw, const float* br, int ldbr,
                                   const float* h_prev, int ldh_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_element<true>(b, j, cols, h, ldh, act, ldact, gx, ldgx, gh, ldgh, bw, ldbw, br,
                              ldbr, h_prev, ldh_prev);
    });
}

// act as a float* the element code never stores through (SAVE false): the _noact kernels
#define NO_ACT static_cast<float*>(nullptr), 0

extern "C" __global__ void gru_fwd_noact(int rows, int cols, float* h, int ldh,
                                         const float* gx, int ldgx, const float* gh, int ldgh,
                                         const float* bw, int ldbw, const float* br, int ldbr,
                                         const float* h_prev, int ldh_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_element<false>(b, j, cols, h, ldh, NO_ACT, gx, ldgx, gh, ldgh, bw, ldbw, br,
                               ldbr, h_prev, ldh_prev);
    });
}

extern "C" __global__ void gru_bwd(int rows, int cols, float* dgx, int lddgx, float* dgh, int lddgh,
                                   float* dh_prev, int lddh_prev,
                                   const float* dh_above, int lddh_above,
                                   const float* dh_rec, int lddh_rec,
                                   const float* act, int ldact,
                                   const float* h_prev, int ldh_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_element(b, j, cols, dgx, lddgx, dgh, lddgh, dh_prev, lddh_prev, dh_above,
                        lddh_above, dh_rec, lddh_rec, act, ldact, h_prev, ldh_prev);
    });
}

extern "C" __global__ void gru_bwd_split(int rows, int cols, float* dgx, int lddgx, float* dgh,
                                         int lddgh, float* dh_prev, int lddh_prev,
                                         const float* dh_above, int lddh_above,
                                         const float* dh_rec, int lddh_rec,
                                         const float* parts, int ldparts,
                                         const float* act, int ldact,
                                         const float* h_prev, int ldh_prev, int splits) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_element(b, j, cols, dgx, lddgx, dgh, lddgh, dh_prev, lddh_prev, dh_above,
                        lddh_above, rec, lddh_rec, act, ldact, h_prev, ldh_prev);
    });
}

extern "C" __global__ void gru_fwd_mask(int rows, int cols, float* h, int ldh,
                                        float* act, int ldact,
                                        const float* gx, int ldgx, const float* gh, int ldgh,
                                        const float* bw, int ldbw, const float* br, int ldbr,
                                        const float* h_prev, int ldh_prev,
                                        const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_mask_element<true>(b, j, mask, ldmask, cols, h, ldh, act, ldact, gx, ldgx, gh,
                                   ldgh, bw, ldbw, br, ldbr, h_prev, ldh_prev);
    });
}

extern "C" __global__ void gru_fwd_mask_noact(int rows, int cols, float* h, int ldh,
                                              const float* gx, int ldgx, const float* gh,
                                              int ldgh, const float* bw, int ldbw,
                                              const float* br, int ldbr, const float* h_prev,
                                              int ldh_prev, const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_mask_element<false>(b, j, mask, ldmask, cols, h, ldh, NO_ACT, gx, ldgx, gh,
                                    ldgh, bw, ldbw, br, ldbr, h_prev, ldh_prev);
    });
}

extern "C" __global__ void gru_bwd_mask(int rows, int cols, float* dgx, int lddgx,
                                        float* dgh, int lddgh, float* dh_prev, int lddh_prev,
                                        const float* dh_above, int lddh_above,
                                        const float* dh_rec, int lddh_rec,
                                        const float* act, int ldact,
                                        const float* h_prev, int ldh_prev,
                                        const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dgh, lddgh, dh_prev,
                             lddh_prev, dh_above, lddh_above, dh_rec, lddh_rec, act, ldact,
                             h_prev, ldh_prev);
    });
}

extern "C" __global__ void gru_bwd_mask_split(int rows, int cols, float* dgx, int lddgx,
                                              float* dgh, int lddgh, float* dh_prev,
                                              int lddh_prev, const float* dh_above,
                                              int lddh_above, const float* dh_rec, int lddh_rec,
                                              const float* parts, int ldparts,
                                              const float* act, int ldact,
                                              const float* h_prev, int ldh_prev,
                                              const float* mask, int ldmask, int splits,
                                              int part_rows) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dgh, lddgh, dh_prev,
                             lddh_prev, dh_above, lddh_above, rec, lddh_rec, act, ldact,
                             h_prev, ldh_prev);
    });
}

// --- the typed twins (see the header): the same element code, each pointer its own type

template <class TH, class TACT, class TGX, class TGH, class TBW, class TBR, class THP>
__global__ void gru_fwd_t(int rows, int cols, TH* h, int ldh, TACT* act, int ldact,
                          const TGX* gx, int ldgx, const TGH* gh, int ldgh, const TBW* bw,
                          int ldbw, const TBR* br, int ldbr, const THP* h_prev, int ldh_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_element<true>(b, j, cols, h, ldh, act, ldact, gx, ldgx, gh, ldgh, bw, ldbw, br,
                              ldbr, h_prev, ldh_prev);
    });
}

template <class TH, class TGX, class TGH, class TBW, class TBR, class THP>
__global__ void gru_fwd_noact_t(int rows, int cols, TH* h, int ldh, const TGX* gx, int ldgx,
                                const TGH* gh, int ldgh, const TBW* bw, int ldbw,
                                const TBR* br, int ldbr, const THP* h_prev, int ldh_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_element<false>(b, j, cols, h, ldh, NO_ACT, gx, ldgx, gh, ldgh, bw, ldbw, br,
                               ldbr, h_prev, ldh_prev);
    });
}

template <class TDGX, class TDGH, class TDHP, class TDHA, class TDHR, class TACT, class THP>
__global__ void gru_bwd_t(int rows, int cols, TDGX* dgx, int lddgx, TDGH* dgh, int lddgh,
                          TDHP* dh_prev, int lddh_prev, const TDHA* dh_above, int lddh_above,
                          const TDHR* dh_rec, int lddh_rec, const TACT* act, int ldact,
                          const THP* h_prev, int ldh_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_element(b, j, cols, dgx, lddgx, dgh, lddgh, dh_prev, lddh_prev, dh_above,
                        lddh_above, dh_rec, lddh_rec, act, ldact, h_prev, ldh_prev);
    });
}

template <class TDGX, class TDGH, class TDHP, class TDHA, class TDHR, class TP, class TACT,
          class THP>
__global__ void gru_bwd_split_t(int rows, int cols, TDGX* dgx, int lddgx, TDGH* dgh, int lddgh,
                                TDHP* dh_prev, int lddh_prev, const TDHA* dh_above,
                                int lddh_above, const TDHR* dh_rec, int lddh_rec,
                                const TP* parts, int ldparts, const TACT* act, int ldact,
                                const THP* h_prev, int ldh_prev, int splits) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_element(b, j, cols, dgx, lddgx, dgh, lddgh, dh_prev, lddh_prev, dh_above,
                        lddh_above, rec, lddh_rec, act, ldact, h_prev, ldh_prev);
    });
}

template <class TH, class TACT, class TGX, class TGH, class TBW, class TBR, class THP,
          class TMASK>
__global__ void gru_fwd_mask_t(int rows, int cols, TH* h, int ldh, TACT* act, int ldact,
                               const TGX* gx, int ldgx, const TGH* gh, int ldgh, const TBW* bw,
                               int ldbw, const TBR* br, int ldbr, const THP* h_prev,
                               int ldh_prev, const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_mask_element<true>(b, j, mask, ldmask, cols, h, ldh, act, ldact, gx, ldgx, gh,
                                   ldgh, bw, ldbw, br, ldbr, h_prev, ldh_prev);
    });
}

template <class TH, class TGX, class TGH, class TBW, class TBR, class THP, class TMASK>
__global__ void gru_fwd_mask_noact_t(int rows, int cols, TH* h, int ldh, const TGX* gx,
                                     int ldgx, const TGH* gh, int ldgh, const TBW* bw, int ldbw,
                                     const TBR* br, int ldbr, const THP* h_prev, int ldh_prev,
                                     const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_fwd_mask_element<false>(b, j, mask, ldmask, cols, h, ldh, NO_ACT, gx, ldgx, gh,
                                    ldgh, bw, ldbw, br, ldbr, h_prev, ldh_prev);
    });
}

template <class TDGX, class TDGH, class TDHP, class TDHA, class TDHR, class TACT, class THP,
          class TMASK>
__global__ void gru_bwd_mask_t(int rows, int cols, TDGX* dgx, int lddgx, TDGH* dgh, int lddgh,
                               TDHP* dh_prev, int lddh_prev, const TDHA* dh_above,
                               int lddh_above, const TDHR* dh_rec, int lddh_rec,
                               const TACT* act, int ldact, const THP* h_prev, int ldh_prev,
                               const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dgh, lddgh, dh_prev,
                             lddh_prev, dh_above, lddh_above, dh_rec, lddh_rec, act, ldact,
                             h_prev, ldh_prev);
    });
}

template <class TDGX, class TDGH, class TDHP, class TDHA, class TDHR, class TP, class TACT,
          class THP, class TMASK>
__global__ void gru_bwd_mask_split_t(int rows, int cols, TDGX* dgx, int lddgx, TDGH* dgh,
                                     int lddgh, TDHP* dh_prev, int lddh_prev,
                                     const TDHA* dh_above, int lddh_above, const TDHR* dh_rec,
                                     int lddh_rec, const TP* parts, int ldparts,
                                     const TACT* act, int ldact, const THP* h_prev,
                                     int ldh_prev, const TMASK* mask, int ldmask, int splits,
                                     int part_rows) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        gru_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dgh, lddgh, dh_prev,
                             lddh_prev, dh_above, lddh_above, rec, lddh_rec, act, ldact,
                             h_prev, ldh_prev);
    });
}
