/*
 * lstm.cu: the fused pointwise part of one LSTM step (one launch per cell step): forward, the
 * bias adds, the four gate activations, the cell update and the output; backward, the
 * gradients of the four gate pre-activations and of the previous cell state; each in one
 * pass over memory.
 *
 * Calling convention (every kernel in cuda_src/; rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows, int cols, outs..., ins...), each view a (float* p, int ld) pair,
 *   row-major: element (r, c) at p[r*ld + c]; ld = 0 broadcasts one row (the biases).
 *   Gate blocks are stacked in torch order i, f, g, o: gate q of hidden unit j is
 *   column q*H + j. Each thread reads everything of its (b, j) before writing anything, so
 *   an output may alias an input exactly (same pointer, same ld), e.g. c over c_prev, or
 *   dgx over act and dc_prev over dc_next in the backward.
 *   Launch: a 1-D grid-stride loop over B*H, 256 threads a block.
 *
 * Element types: each kernel K below has two entry points, `extern "C"` K with every pointer
 * float* (the fp32 plans' kernel) and its typed twin, the template K_t<T_1, ..., T_n>, one type
 * per pointer argument in call order, each float, bf16 or fp16 (storage.cuh): the buffer its view
 * lies in (in a 16-bit plan h, h_prev and dgx are 16-bit, the rest fp32). Both are one loop over
 * the same templated element function (*_element below): the math is fp32, a load converts (to_f),
 * a store rounds to its output's type (from_f); K_t<float, ...> compiles to K's code (a test
 * compares PTX).
 *
 * Kernels (each plain kernel and, below, its masked variant; the forward's also without act,
 * the _noact variants; each with its typed twin):
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
 *   kernel lstm_fwd_noact(rows = B, cols = H)   lstm_fwd without act (an inference plan: nothing
 *       reads the gates there, and their store was a third of the step's traffic); h and c
 *       are lstm_fwd's, the same code
 *     out h      [B, H]
 *     out c      [B, H]
 *     in  gx     [B, 4H]
 *     in  gh     [B, 4H]
 *     in  bw     [B, 4H]
 *     in  br     [B, 4H]
 *     in  c_prev [B, H]
 *   kernel lstm_bwd(rows = B, cols = H)   one step of backprop through time, in this order:
 *       dh = dh_above + dh_rec;  tc = tanh(c);  dho = dh * o;  t = dho * (1 - tc*tc)
 *       dcc = dc_next + t;  do = dh * tc;  di = dcc * g;  df = dcc * c_prev;  dg = dcc * i
 *       dgx = [di * (i*(1-i)), df * (f*(1-f)), dg * (1 - g*g), do * (o*(1-o))]
 *       dc_prev = dcc * f
 *     (the naive rung's ew_* kernels issue the same operations one launch each; the add
 *     dcc = dc_next + t is kept out of an FMA so both round alike)
 *     out dgx      [B, 4H]   gradient of the gate pre-activations i, f, g, o: the gradient of
 *                            both gx (W x_t + b_ih) and gh (R h_{t-1} + b_hh)
 *     out dc_prev  [B, H]    gradient of c_{t-1} (dc_next of step t-1)
 *     in  dh_above [B, H]    gradient of h_t from above (dy_t, or the next layer's dx)
 *     in  dh_rec   [B, H]    gradient of h_t from step t+1 (dgx_{t+1} R; dh_n at t = T-1)
 *     in  dc_next  [B, H]    gradient of c_t from step t+1 (dc_n at t = T-1)
 *     in  act      [B, 4H]   the forward's act: i, f, g, o after activation
 *     in  c        [B, H]    c_t, the cell state this step produced
 *     in  c_prev   [B, H]    c_{t-1}, the cell state it started from
 *   kernel lstm_bwd_split(rows = B, cols = H)   lstm_bwd with dh_rec summed from the split-K
 *       recurrent GEMM's partial products as ew_sum_splits sums them (dh_rec = base + parts[0]
 *       + ... + parts[splits - 1], in that order, fp32; pointwise_common.cuh SplitRec): the
 *       same bits as ew_sum_splits into fp32 dh_rec, then lstm_bwd, in one launch
 *     out dgx      [B, 4H]
 *     out dc_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]         the sum's base (the first partial product)
 *     in  parts    [splits*B, H]  the rest: part s is rows s*B .. (s+1)*B - 1
 *     in  dc_next  [B, H]
 *     in  act      [B, 4H]
 *     in  c        [B, H]
 *     in  c_prev   [B, H]
 *     int splits                  >= 0
 *
 * Masked variants, for variable-length plans (rnnrt/plan/packing.py): a row whose sequence
 * has ended by this step (mask 0) is *frozen*: its state passes through unchanged, so that
 * the row's last slot holds its final state; rows with mask != 0 compute exactly as above
 * (the same code).
 *   kernel lstm_fwd_mask(rows = B, cols = H)   lstm_fwd where mask != 0; frozen rows:
 *       h = h_prev, c = c_prev, act = 0 (gx, gh and the biases are not read there)
 *     out h      [B, H]
 *     out c      [B, H]
 *     out act    [B, 4H]
 *     in  gx     [B, 4H]
 *     in  gh     [B, 4H]
 *     in  bw     [B, 4H]
 *     in  br     [B, 4H]
 *     in  c_prev [B, H]
 *     in  h_prev [B, H]    previous hidden state (passed through on frozen rows)
 *     in  mask   [B, 1]    1 where the row's sequence runs this step, 0 where it has ended
 *   kernel lstm_fwd_mask_noact(rows = B, cols = H)   lstm_fwd_mask without act (inference)
 *     out h      [B, H]
 *     out c      [B, H]
 *     in  gx     [B, 4H]
 *     in  gh     [B, 4H]
 *     in  bw     [B, 4H]
 *     in  br     [B, 4H]
 *     in  c_prev [B, H]
 *     in  h_prev [B, H]
 *     in  mask   [B, 1]
 *   kernel lstm_bwd_mask(rows = B, cols = H)   lstm_bwd where mask != 0, and dh_prev = 0
 *       there; frozen rows pass the gradients through: dgx = 0, dc_prev = dc_next,
 *       dh_prev = dh_rec (dh_above, act, c and c_prev are not read there: a frozen row
 *       has no output at this step)
 *     out dgx      [B, 4H]
 *     out dc_prev  [B, H]
 *     out dh_prev  [B, H]    the direct part of the gradient of h_{t-1}: the caller adds
 *                            dgx R (a GEMM with beta = 1) to make step t-1's dh_rec
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]
 *     in  dc_next  [B, H]
 *     in  act      [B, 4H]
 *     in  c        [B, H]
 *     in  c_prev   [B, H]
 *     in  mask     [B, 1]
 *   kernel lstm_bwd_mask_split(rows = B, cols = H)   lstm_bwd_mask with dh_rec summed from the
 *       split-K recurrent GEMM's partial products of step t, which has part_rows <= B rows
 *       (dh_rec = base + parts[0] + ... + parts[splits - 1] on rows < part_rows, base alone
 *       past them: ew_sum_splits's sum over step t's rows, fp32; pointwise_common.cuh)
 *     out dgx      [B, 4H]
 *     out dc_prev  [B, H]
 *     out dh_prev  [B, H]
 *     in  dh_above [B, H]
 *     in  dh_rec   [B, H]                 the sum's base (the direct part, dh_n past step t)
 *     in  parts    [splits*part_rows, H]  part s is rows s*part_rows .. (s+1)*part_rows - 1
 *     in  dc_next  [B, H]
 *     in  act      [B, 4H]
 *     in  c        [B, H]
 *     in  c_prev   [B, H]
 *     in  mask     [B, 1]
 *     int splits                          >= 0
 *     int part_rows                       0 .. B
 */

// for_each_element, sigmoidf; bf16, fp16, to_f, from_f (storage.cuh); *_bwd_point: the
// backward's arithmetic (persistent_bwd.cu's too)
#include "pointwise_common.cuh"
#include "cell_bwd.cuh"

// One element (b, j) of lstm_fwd, shared by the plain and the masked kernel: every input of
// the element is read before anything is written (outputs may alias inputs). SAVE: whether
// it stores the gates into act (false: the _noact kernels, act unused).
template <bool SAVE, class TH, class TC, class TACT, class TGX, class TGH, class TBW, class TBR, class TCP>
__device__ __forceinline__ void lstm_fwd_element(
        long long b, long long j, int cols, TH* h, int ldh, TC* c, int ldc, TACT* act,
        int ldact, const TGX* gx, int ldgx, const TGH* gh, int ldgh, const TBW* bw,
        int ldbw, const TBR* br, int ldbr, const TCP* c_prev, int ldc_prev) {
    // ((gx + bw) + gh) + br at column k: the order every twin and the naive rung follow
    auto pre = [&](long long k) {
        return ((to_f(gx[b * ldgx + k]) + to_f(bw[b * ldbw + k])) + to_f(gh[b * ldgh + k]))
               + to_f(br[b * ldbr + k]);
    };
    const float pre_i = pre(j), pre_f = pre(cols + j);
    const float pre_g = pre(2 * (long long)cols + j), pre_o = pre(3 * (long long)cols + j);
    const float cp = to_f(c_prev[b * ldc_prev + j]);
    // All reads are done: from here on only writes (outputs may alias inputs).
    const float i = sigmoidf(pre_i), f = sigmoidf(pre_f);
    const float g = tanhf(pre_g), o = sigmoidf(pre_o);
    const float cn = f * cp + i * g;
    c[b * ldc + j] = from_f<TC>(cn);
    h[b * ldh + j] = from_f<TH>(o * tanhf(cn));
    if (!SAVE) return;
    TACT* a = act + b * ldact + j;
    a[0] = from_f<TACT>(i);
    a[cols] = from_f<TACT>(f);
    a[2 * (long long)cols] = from_f<TACT>(g);
    a[3 * (long long)cols] = from_f<TACT>(o);
}

// One element (b, j) of lstm_bwd, shared by the plain, the masked and the split kernel
// (dh_rec: a pointer, or lstm_bwd_split's SplitRec; rec_at reads either).
template <class TDGX, class TDCP, class TDHA, class TDHR, class TDCN, class TACT, class TC,
          class TCP>
__device__ __forceinline__ void lstm_bwd_element(
        long long b, long long j, int cols, TDGX* dgx, int lddgx, TDCP* dc_prev,
        int lddc_prev, const TDHA* dh_above, int lddh_above, TDHR dh_rec,
        int lddh_rec, const TDCN* dc_next, int lddc_next, const TACT* act, int ldact,
        const TC* c, int ldc, const TCP* c_prev, int ldc_prev) {
    const TACT* a = act + b * ldact + j;
    const float i = to_f(a[0]), f = to_f(a[cols]);
    const float g = to_f(a[2 * (long long)cols]), o = to_f(a[3 * (long long)cols]);
    const float dh = to_f(dh_above[b * lddh_above + j]) + rec_at(dh_rec, lddh_rec, b, j);
    const float dcn = to_f(dc_next[b * lddc_next + j]);
    const float cn = to_f(c[b * ldc + j]), cp = to_f(c_prev[b * ldc_prev + j]);
    // All reads are done: from here on only writes (outputs may alias inputs).
    const float dcp = lstm_bwd_point(dh, dcn, i, f, g, o, cn, cp, [&](int q, float v) {
        dgx[b * lddgx + j + q * (long long)cols] = from_f<TDGX>(v);
    });
    dc_prev[b * lddc_prev + j] = from_f<TDCP>(dcp);
}

// A frozen row (mask 0) of lstm_fwd_mask: h = h_prev, c = c_prev, act = 0 (where SAVE).
template <bool SAVE, class TH, class TC, class TACT, class TCP, class THP>
__device__ __forceinline__ void lstm_fwd_frozen_element(
        long long b, long long j, int cols, TH* h, int ldh, TC* c, int ldc, TACT* act,
        int ldact, const TCP* c_prev, int ldc_prev, const THP* h_prev, int ldh_prev) {
    const float hp = to_f(h_prev[b * ldh_prev + j]), cp = to_f(c_prev[b * ldc_prev + j]);
    // All reads are done: from here on only writes (outputs may alias inputs).
    h[b * ldh + j] = from_f<TH>(hp);
    c[b * ldc + j] = from_f<TC>(cp);
    if (!SAVE) return;
    TACT* a = act + b * ldact + j;
    a[0] = from_f<TACT>(0.f);
    a[cols] = from_f<TACT>(0.f);
    a[2 * (long long)cols] = from_f<TACT>(0.f);
    a[3 * (long long)cols] = from_f<TACT>(0.f);
}

// A frozen row (mask 0) of lstm_bwd_mask: dgx = 0, dc_prev = dc_next, dh_prev = dh_rec.
template <class TDGX, class TDCP, class TDHP, class TDHR, class TDCN>
__device__ __forceinline__ void lstm_bwd_frozen_element(
        long long b, long long j, int cols, TDGX* dgx, int lddgx, TDCP* dc_prev, int lddc_prev,
        TDHP* dh_prev, int lddh_prev, TDHR dh_rec, int lddh_rec, const TDCN* dc_next,
        int lddc_next) {
    const float dhr = rec_at(dh_rec, lddh_rec, b, j), dcn = to_f(dc_next[b * lddc_next + j]);
    // All reads are done: from here on only writes (outputs may alias inputs).
    TDGX* d = dgx + b * lddgx + j;
    d[0] = from_f<TDGX>(0.f);
    d[cols] = from_f<TDGX>(0.f);
    d[2 * (long long)cols] = from_f<TDGX>(0.f);
    d[3 * (long long)cols] = from_f<TDGX>(0.f);
    dc_prev[b * lddc_prev + j] = from_f<TDCP>(dcn);
    dh_prev[b * lddh_prev + j] = from_f<TDHP>(dhr);
}

// One element (b, j) of lstm_fwd_mask: lstm_fwd's where mask != 0, else the frozen row's.
// The pointers in the order the element code first reads them (mask first): the kernels'
// closures then keep them in that order, and the fp32 kernel's PTX is the one it had when this
// code stood in each kernel. SAVE: as lstm_fwd_element's.
template <bool SAVE, class TH, class TC, class TACT, class TGX, class TGH, class TBW, class TBR,
          class TCP, class THP, class TMASK>
__device__ __forceinline__ void lstm_fwd_mask_element(
        long long b, long long j, const TMASK* mask, int ldmask, int cols, TH* h, int ldh,
        TC* c, int ldc, TACT* act, int ldact, const TGX* gx, int ldgx, const TGH* gh, int ldgh,
        const TBW* bw, int ldbw, const TBR* br, int ldbr, const TCP* c_prev, int ldc_prev,
        const THP* h_prev, int ldh_prev) {
    if (to_f(mask[b * ldmask]) != 0.f) {
        lstm_fwd_element<SAVE>(b, j, cols, h, ldh, c, ldc, act, ldact, gx, ldgx, gh, ldgh, bw,
                               ldbw, br, ldbr, c_prev, ldc_prev);
        return;
    }
    lstm_fwd_frozen_element<SAVE>(b, j, cols, h, ldh, c, ldc, act, ldact, c_prev, ldc_prev, h_prev,
                            ldh_prev);
}

// One element (b, j) of lstm_bwd_mask: lstm_bwd's and dh_prev = 0 where mask != 0, else the
// frozen row's.
template <class TDGX, class TDCP, class TDHP, class TDHA, class TDHR, class TDCN, class TACT,
          class TC, class TCP, class TMASK>
__device__ __forceinline__ void lstm_bwd_mask_element(
        long long b, long long j, const TMASK* mask, int ldmask, int cols, TDGX* dgx, int lddgx,
        TDCP* dc_prev, int lddc_prev, const TDHA* dh_above, int lddh_above, TDHR dh_rec,
        int lddh_rec, const TDCN* dc_next, int lddc_next, const TACT* act, int ldact,
        const TC* c, int ldc, const TCP* c_prev, int ldc_prev, TDHP* dh_prev, int lddh_prev) {
    if (to_f(mask[b * ldmask]) != 0.f) {
        lstm_bwd_element(b, j, cols, dgx, lddgx, dc_prev, lddc_prev, dh_above, lddh_above,
                         dh_rec, lddh_rec, dc_next, lddc_next, act, ldact, c, ldc, c_prev,
                         ldc_prev);
        dh_prev[b * lddh_prev + j] = from_f<TDHP>(0.f);
        return;
    }
    lstm_bwd_frozen_element(b, j, cols, dgx, lddgx, dc_prev, lddc_prev, dh_prev, lddh_prev,
                            dh_rec, lddh_rec, dc_next, lddc_next);
}

extern "C" __global__ void lstm_fwd(int rows, int cols,
                                    float* h, int ldh, float* c, int ldc, float* act, int ldact,
                                    const float* gx, int ldgx, const float* gh, int ldgh,
                                    const float* bw, int ldbw, const float* br, int ldbr,
                                    const float* c_prev, int ldc_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_element<true>(b, j, cols, h, ldh, c, ldc, act, ldact, gx, ldgx, gh, ldgh, bw,
                               ldbw, br, ldbr, c_prev, ldc_prev);
    });
}

// act as a float* the element code never stores through (SAVE false): the _noact kernels
#define NO_ACT static_cast<float*>(nullptr), 0

extern "C" __global__ void lstm_fwd_noact(int rows, int cols, float* h, int ldh, float* c,
                                          int ldc, const float* gx, int ldgx, const float* gh,
                                          int ldgh, const float* bw, int ldbw, const float* br,
                                          int ldbr, const float* c_prev, int ldc_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_element<false>(b, j, cols, h, ldh, c, ldc, NO_ACT, gx, ldgx, gh, ldgh, bw,
                                ldbw, br, ldbr, c_prev, ldc_prev);
    });
}

extern "C" __global__ void lstm_bwd(int rows, int cols, float* dgx, int lddgx,
                                    float* dc_prev, int lddc_prev,
                                    const float* dh_above, int lddh_above,
                                    const float* dh_rec, int lddh_rec,
                                    const float* dc_next, int lddc_next,
                                    const float* act, int ldact, const float* c, int ldc,
                                    const float* c_prev, int ldc_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_element(b, j, cols, dgx, lddgx, dc_prev, lddc_prev, dh_above, lddh_above,
                         dh_rec, lddh_rec, dc_next, lddc_next, act, ldact, c, ldc, c_prev,
                         ldc_prev);
    });
}

extern "C" __global__ void lstm_bwd_split(int rows, int cols, float* dgx, int lddgx,
                                          float* dc_prev, int lddc_prev,
                                          const float* dh_above, int lddh_above,
                                          const float* dh_rec, int lddh_rec,
                                          const float* parts, int ldparts,
                                          const float* dc_next, int lddc_next,
                                          const float* act, int ldact, const float* c, int ldc,
                                          const float* c_prev, int ldc_prev, int splits) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_element(b, j, cols, dgx, lddgx, dc_prev, lddc_prev, dh_above, lddh_above,
                         rec, lddh_rec, dc_next, lddc_next, act, ldact, c, ldc, c_prev,
                         ldc_prev);
    });
}

extern "C" __global__ void lstm_fwd_mask(int rows, int cols,
                                         float* h, int ldh, float* c, int ldc,
                                         float* act, int ldact,
                                         const float* gx, int ldgx, const float* gh, int ldgh,
                                         const float* bw, int ldbw, const float* br, int ldbr,
                                         const float* c_prev, int ldc_prev,
                                         const float* h_prev, int ldh_prev,
                                         const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_mask_element<true>(b, j, mask, ldmask, cols, h, ldh, c, ldc, act, ldact, gx,
                                    ldgx, gh, ldgh, bw, ldbw, br, ldbr, c_prev, ldc_prev, h_prev,
                                    ldh_prev);
    });
}

extern "C" __global__ void lstm_fwd_mask_noact(int rows, int cols, float* h, int ldh,
                                               float* c, int ldc, const float* gx, int ldgx,
                                               const float* gh, int ldgh, const float* bw,
                                               int ldbw, const float* br, int ldbr,
                                               const float* c_prev, int ldc_prev,
                                               const float* h_prev, int ldh_prev,
                                               const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_mask_element<false>(b, j, mask, ldmask, cols, h, ldh, c, ldc, NO_ACT, gx, ldgx,
                                     gh, ldgh, bw, ldbw, br, ldbr, c_prev, ldc_prev, h_prev,
                                     ldh_prev);
    });
}

extern "C" __global__ void lstm_bwd_mask(int rows, int cols, float* dgx, int lddgx,
                                         float* dc_prev, int lddc_prev,
                                         float* dh_prev, int lddh_prev,
                                         const float* dh_above, int lddh_above,
                                         const float* dh_rec, int lddh_rec,
                                         const float* dc_next, int lddc_next,
                                         const float* act, int ldact, const float* c, int ldc,
                                         const float* c_prev, int ldc_prev,
                                         const float* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dc_prev, lddc_prev,
                              dh_above, lddh_above, dh_rec, lddh_rec, dc_next, lddc_next, act,
                              ldact, c, ldc, c_prev, ldc_prev, dh_prev, lddh_prev);
    });
}

extern "C" __global__ void lstm_bwd_mask_split(int rows, int cols, float* dgx, int lddgx,
                                               float* dc_prev, int lddc_prev,
                                               float* dh_prev, int lddh_prev,
                                               const float* dh_above, int lddh_above,
                                               const float* dh_rec, int lddh_rec,
                                               const float* parts, int ldparts,
                                               const float* dc_next, int lddc_next,
                                               const float* act, int ldact,
                                               const float* c, int ldc,
                                               const float* c_prev, int ldc_prev,
                                               const float* mask, int ldmask, int splits,
                                               int part_rows) {
    const SplitRec<float, float> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dc_prev, lddc_prev,
                              dh_above, lddh_above, rec, lddh_rec, dc_next, lddc_next, act,
                              ldact, c, ldc, c_prev, ldc_prev, dh_prev, lddh_prev);
    });
}

// --- the typed twins (see the header): the same element code, each pointer its own type

template <class TH, class TC, class TACT, class TGX, class TGH, class TBW, class TBR, class TCP>
__global__ void lstm_fwd_t(int rows, int cols, TH* h, int ldh, TC* c, int ldc, TACT* act,
                           int ldact, const TGX* gx, int ldgx, const TGH* gh, int ldgh,
                           const TBW* bw, int ldbw, const TBR* br, int ldbr, const TCP* c_prev,
                           int ldc_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_element<true>(b, j, cols, h, ldh, c, ldc, act, ldact, gx, ldgx, gh, ldgh, bw,
                               ldbw, br, ldbr, c_prev, ldc_prev);
    });
}

template <class TH, class TC, class TGX, class TGH, class TBW, class TBR, class TCP>
__global__ void lstm_fwd_noact_t(int rows, int cols, TH* h, int ldh, TC* c, int ldc,
                                 const TGX* gx, int ldgx, const TGH* gh, int ldgh,
                                 const TBW* bw, int ldbw, const TBR* br, int ldbr,
                                 const TCP* c_prev, int ldc_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_element<false>(b, j, cols, h, ldh, c, ldc, NO_ACT, gx, ldgx, gh, ldgh, bw,
                                ldbw, br, ldbr, c_prev, ldc_prev);
    });
}

template <class TDGX, class TDCP, class TDHA, class TDHR, class TDCN, class TACT, class TC,
          class TCP>
__global__ void lstm_bwd_t(int rows, int cols, TDGX* dgx, int lddgx, TDCP* dc_prev,
                           int lddc_prev, const TDHA* dh_above, int lddh_above,
                           const TDHR* dh_rec, int lddh_rec, const TDCN* dc_next, int lddc_next,
                           const TACT* act, int ldact, const TC* c, int ldc, const TCP* c_prev,
                           int ldc_prev) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_element(b, j, cols, dgx, lddgx, dc_prev, lddc_prev, dh_above, lddh_above,
                         dh_rec, lddh_rec, dc_next, lddc_next, act, ldact, c, ldc, c_prev,
                         ldc_prev);
    });
}

template <class TDGX, class TDCP, class TDHA, class TDHR, class TP, class TDCN, class TACT,
          class TC, class TCP>
__global__ void lstm_bwd_split_t(int rows, int cols, TDGX* dgx, int lddgx, TDCP* dc_prev,
                                 int lddc_prev, const TDHA* dh_above, int lddh_above,
                                 const TDHR* dh_rec, int lddh_rec, const TP* parts, int ldparts,
                                 const TDCN* dc_next, int lddc_next, const TACT* act, int ldact,
                                 const TC* c, int ldc, const TCP* c_prev, int ldc_prev,
                                 int splits) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_element(b, j, cols, dgx, lddgx, dc_prev, lddc_prev, dh_above, lddh_above,
                         rec, lddh_rec, dc_next, lddc_next, act, ldact, c, ldc, c_prev,
                         ldc_prev);
    });
}

template <class TH, class TC, class TACT, class TGX, class TGH, class TBW, class TBR, class TCP,
          class THP, class TMASK>
__global__ void lstm_fwd_mask_t(int rows, int cols, TH* h, int ldh, TC* c, int ldc, TACT* act,
                                int ldact, const TGX* gx, int ldgx, const TGH* gh, int ldgh,
                                const TBW* bw, int ldbw, const TBR* br, int ldbr,
                                const TCP* c_prev, int ldc_prev, const THP* h_prev,
                                int ldh_prev, const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_mask_element<true>(b, j, mask, ldmask, cols, h, ldh, c, ldc, act, ldact, gx,
                                    ldgx, gh, ldgh, bw, ldbw, br, ldbr, c_prev, ldc_prev, h_prev,
                                    ldh_prev);
    });
}

template <class TH, class TC, class TGX, class TGH, class TBW, class TBR, class TCP, class THP,
          class TMASK>
__global__ void lstm_fwd_mask_noact_t(int rows, int cols, TH* h, int ldh, TC* c, int ldc,
                                      const TGX* gx, int ldgx, const TGH* gh, int ldgh,
                                      const TBW* bw, int ldbw, const TBR* br, int ldbr,
                                      const TCP* c_prev, int ldc_prev, const THP* h_prev,
                                      int ldh_prev, const TMASK* mask, int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_fwd_mask_element<false>(b, j, mask, ldmask, cols, h, ldh, c, ldc, NO_ACT, gx, ldgx,
                                     gh, ldgh, bw, ldbw, br, ldbr, c_prev, ldc_prev, h_prev,
                                     ldh_prev);
    });
}

template <class TDGX, class TDCP, class TDHP, class TDHA, class TDHR, class TDCN, class TACT,
          class TC, class TCP, class TMASK>
__global__ void lstm_bwd_mask_t(int rows, int cols, TDGX* dgx, int lddgx, TDCP* dc_prev,
                                int lddc_prev, TDHP* dh_prev, int lddh_prev,
                                const TDHA* dh_above, int lddh_above, const TDHR* dh_rec,
                                int lddh_rec, const TDCN* dc_next, int lddc_next,
                                const TACT* act, int ldact, const TC* c, int ldc,
                                const TCP* c_prev, int ldc_prev, const TMASK* mask,
                                int ldmask) {
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dc_prev, lddc_prev,
                              dh_above, lddh_above, dh_rec, lddh_rec, dc_next, lddc_next, act,
                              ldact, c, ldc, c_prev, ldc_prev, dh_prev, lddh_prev);
    });
}

template <class TDGX, class TDCP, class TDHP, class TDHA, class TDHR, class TP, class TDCN,
          class TACT, class TC, class TCP, class TMASK>
__global__ void lstm_bwd_mask_split_t(int rows, int cols, TDGX* dgx, int lddgx, TDCP* dc_prev,
                                      int lddc_prev, TDHP* dh_prev, int lddh_prev,
                                      const TDHA* dh_above, int lddh_above,
                                      const TDHR* dh_rec, int lddh_rec, const TP* parts,
                                      int ldparts, const TDCN* dc_next, int lddc_next,
                                      const TACT* act, int ldact, const TC* c, int ldc,
                                      const TCP* c_prev, int ldc_prev, const TMASK* mask,
                                      int ldmask, int splits, int part_rows) {
    const SplitRec<TDHR, TP> rec{dh_rec, parts, ldparts, part_rows, splits};
    for_each_element(rows, cols, [=](long long b, long long j) {
        lstm_bwd_mask_element(b, j, mask, ldmask, cols, dgx, lddgx, dc_prev, lddc_prev,
                              dh_above, lddh_above, rec, lddh_rec, dc_next, lddc_next, act,
                              ldact, c, ldc, c_prev, ldc_prev, dh_prev, lddh_prev);
    });
}
