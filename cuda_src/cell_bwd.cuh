/*
 * cell_bwd.cuh: the cells' pointwise backward arithmetic for one (b, j) cell of one step,
 * values in and values out: no memory access of its own. No kernels. #included by lstm.cu,
 * gru.cu, rnn.cu (their *_bwd_element: load, call, store) and persistent_bwd.cu (its
 * pointwise phase), so the fused per-step kernels and the persistent backward run the same
 * operations in the same order by construction; rnnrt's loader (rnnrt/kernels/sources.py)
 * inlines it where it is included.
 *   lstm_bwd_point         lstm_bwd's arithmetic: dgx of the four gates (to a callback), dc_prev
 *   gru_bwd_point          gru_bwd's arithmetic: dgx, dgh of the three gates, dh * z
 *   rnn_bwd_point<RELU>    rnn_tanh_bwd's (RELU false) or rnn_relu_bwd's dg
 * The order of arithmetic and the two non-contracted operations (__fadd_rn, __fsub_rn) are
 * the naive rung's (the ew_* kernels of elementwise.cu issue the same operations, one launch
 * each), so every rung rounds alike. Moving them here left the PTX of lstm.cu, gru.cu,
 * rnn.cu and persistent_bwd.cu as it was (nvcc 13.0 and NVRTC, sm_90; lstm.cu's up to
 * where one address is computed, its cubin byte for byte). It defines no sigmoidf (the
 * fused files and persistent_common.cuh each have theirs; the backward needs none).
 */
#ifndef RNNRT_CELL_BWD_CUH
#define RNNRT_CELL_BWD_CUH

// LSTM, one cell: dh = dh_above + dh_rec (summed by the caller), dcn the gradient of c_t
// from step t+1; i, f, g, o the forward's activations, cn = c_t, cp = c_{t-1}. Hands the
// gradient of gate q's pre-activation (q = 0..3: i, f, g, o) to put(q, value) as soon as it
// is computed, in that order, and returns dc_prev, the gradient of c_{t-1}. A callback, not
// an output array: lstm_bwd stores each gradient there and then, and with an array the
// compiler moved all the arithmetic ahead of the stores (the same operations, other code).
template <class Put>
__device__ __forceinline__ float lstm_bwd_point(float dh, float dcn, float i, float f, float g,
                                                float o, float cn, float cp, Put put) {
    const float tc = tanhf(cn);
    const float dho = dh * o;
    const float t = dho * (1.0f - tc * tc);
    const float dcc = __fadd_rn(dcn, t);  // never contracted into an FMA, as in ew_add
    const float do_ = dh * tc;
    const float di = dcc * g, df = dcc * cp, dg = dcc * i;
    put(0, di * (i * (1.0f - i)));
    put(1, df * (f * (1.0f - f)));
    put(2, dg * (1.0f - g * g));
    put(3, do_ * (o * (1.0f - o)));
    return dcc * f;
}

// GRU, one cell: dh = dh_above + dh_rec (summed by the caller); r, z, n, hn the forward's
// act, hp = h_{t-1}. -> gx: the gradients of gx + bw (W x_t + b_ih; r, z, n); gh: of gh + br
// (R h_{t-1} + b_hh, what multiplies R); dhz = dh * z, the direct part of the gradient of
// h_{t-1}.
__device__ __forceinline__ void gru_bwd_point(float dh, float r, float z, float n, float hn,
                                              float hp, float (&gx)[3], float (&gh)[3],
                                              float& dhz) {
    dhz = dh * z;
    const float dn = __fsub_rn(dh, dhz);  // never contracted into an FMA, as in ew_sub
    const float dn_p = dn * (1.0f - n * n);
    const float d = hp - n;
    const float dz = dh * d;
    const float dz_p = dz * (z * (1.0f - z));
    const float dhn = dn_p * r;
    const float dr = dn_p * hn;
    const float dr_p = dr * (r * (1.0f - r));
    gx[0] = dr_p;
    gx[1] = dz_p;
    gx[2] = dn_p;
    gh[0] = dr_p;
    gh[1] = dz_p;
    gh[2] = dhn;
}

// RNN, one cell: dh = dh_above + dh_rec (summed by the caller), y = h_t. -> dg, the gradient
// of the pre-activation.
template <bool RELU>
__device__ __forceinline__ float rnn_bwd_point(float dh, float y) {
    if (RELU) return y > 0.f ? dh : 0.f;  // not dh * (y > 0): NaN * 0 is NaN
    return dh * (1.0f - y * y);
}

#endif  // RNNRT_CELL_BWD_CUH
