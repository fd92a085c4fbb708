/*
 * persistent_stack_bwd.cuh: what the stack backward kernels share (#included by
 * persistent_stack_bwd.cu, the one-block-a-16-units kernel, persistent_stack_bwd_pair.cu,
 * the cluster-pair kernel, and persistent_stack_mma_bwd.cu, the tensor-core one: its cells,
 * loads, cell loop and finish; rnnrt's loader inlines it). No kernels.
 *   SB_U, SB_BMAX, SB_TP, SB_CPT  units a block's pointwise owns, most batches (the width
 *                             of a dg^T row), the dg^T tile's row stride, cells a thread
 *   sb_cell_of                 the pointwise cells of a thread (the forward stack kernel's map)
 *   sb_cells_init              dh_rec and dc of the thread's cells from dh_n, dc_n
 *   sb_load_step               the forward's values (gates, c_t, c_{t-1}) of a step's cells
 *   sb_cells_bwd               a step's pointwise backward of the thread's cells, each gate
 *                              gradient to a store the caller makes (the tensor-core kernel)
 *   sb_pointwise               a step's pointwise backward of the block's cells, its dg_t into
 *                              dgx and (transposed, k-major) into the layer's dg^T slot, and
 *                              the count that publishes it (the PK_TRACE points 0..2)
 *   sb_finish                  dh0, dc0, and the last block out zeroes the counters
 *   sb_publish_tile            a step's dg_t tile into the layer's dg^T slot, counted
 *   sb_gru_r4                  GRU: the R operand of a product row (zeros for dn's rows)
 *   sb_finish_cell             sb_finish for LSTM or GRU (no dc0: dh0 twice)
 *   sb_pointwise_cell          sb_pointwise or sb_pointwise_gru, by the cell
 *   sb_pointwise_gru           sb_pointwise's GRU form (the fp32 kernels' GRU instances):
 *                              dg_t's 4 row groups dr, dz, dn (W side), dhn (R side), dgx and
 *                              dgh apart, dh z carried
 * The kernels own the same units per block (J = [rank*16, rank*16 + 16) of layer l = block /
 * NB); the fp32 two publish dg_t the same way (sb_pointwise: a k-major dg^T scratch), the
 * tensor-core one rounded to the storage type in dgx's rows (which its product stages as
 * they lie); they differ in the product that follows (which k rows and units of [R | W] a
 * block multiplies). Design: docs/kernels.md ("The stack backward", "The tensor-core stack
 * backward").
 */
#ifndef RNNRT_PERSISTENT_STACK_BWD_CUH
#define RNNRT_PERSISTENT_STACK_BWD_CUH
#include "persistent_common.cuh"
#include "cell_bwd.cuh"

#define SB_U 16                    // units of a block's pointwise
#define SB_BMAX 64                 // most batches (and the width of a dgt row)
#define SB_TP 68                   // stride of a gate row of the dg^T tile (see the pointwise)
#define SB_CPT 4                   // pointwise cells a thread: U * B / PK_MAX_THREADS at most

// A 16-byte store through L2 (other blocks read it during this launch).
__device__ __forceinline__ void sb_stcg4(float* p, float4 v) {
    __stcg(reinterpret_cast<float4*>(p), v);
}

// Pointwise cells of thread tid, as the forward's: e = tid + i*PK_MAX_THREADS, jj = e % U,
// r = e / U, b = the r-th of 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, ... (a warp's two batches are 4
// apart: the partial-sum reads hit 32 different banks), live while b < B.
__device__ __forceinline__ void sb_cell_of(int tid, int i, int& b, int& jj) {
    const int e = tid + i * PK_MAX_THREADS, r = e / SB_U, k = r & 7;
    jj = e - r * SB_U;
    b = (r & ~7) + (k >> 1) + 4 * (k & 1);
}

// The carried dh_rec (the R half of the last product: these cells are the block's own units)
// and dc of the thread's cells, from the inputs dh_n and dc_n of layer l.
__device__ __forceinline__ void sb_cells_init(int l, int B, int j0, const float* dhn,
                                              long long lddhn, const float* dcn,
                                              long long lddcn, float (&dhrec)[SB_CPT],
                                              float (&dcar)[SB_CPT]) {
#pragma unroll
    for (int i = 0; i < SB_CPT; ++i) {
        int b, jj;
        sb_cell_of(threadIdx.x, i, b, jj);
        const long long row = (long long)l * B + b;
        dhrec[i] = b < B ? dhn[row * lddhn + j0 + jj] : 0.f;
        dcar[i] = b < B ? dcn[row * lddcn + j0 + jj] : 0.f;
    }
}

// The forward's values of step t for the thread's cells (sb_cell_of): the gates i, f, g, o,
// c_t and c_{t-1}, streamed (nothing else reads them). Dead cells (b >= B) are left as they are.
__device__ __forceinline__ void sb_load_step(int t, int B, int H, int j0, const float* act,
                                             long long ldact, const float* c, long long ldc,
                                             float (&gates)[SB_CPT][4], float (&cn)[SB_CPT],
                                             float (&cp)[SB_CPT]) {
#pragma unroll
    for (int i = 0; i < SB_CPT; ++i) {
        int b, jj;
        sb_cell_of(threadIdx.x, i, b, jj);
        if (b >= B) continue;
        const long long row = (long long)t * B + b;
#pragma unroll
        for (int q = 0; q < 4; ++q) gates[i][q] = __ldcs(act + row * ldact + q * H + j0 + jj);
        cn[i] = __ldcs(c + (row + B) * ldc + j0 + jj);
        cp[i] = __ldcs(c + row * ldc + j0 + jj);
    }
}

// The pointwise backward of step t of the thread's live cells: dh = dh_above (the layer
// above's dg W, or dy: read through L2) + dh_rec, lstm_bwd's arithmetic, dc carried; each
// gate gradient to out(row, b, jj)(q, v) as it is computed (cell_bwd.cuh's order; row = t*B
// + b: out makes the cell's store, its addresses computed once a cell). The tensor-core
// stack backward's (persistent_stack_mma_bwd.cu); sb_pointwise keeps the same loop inline
// (this helper in its stead changed the fp32 kernels' PTX, at 254 registers of 255).
template <class Out>
__device__ __forceinline__ void sb_cells_bwd(int t, int B, int H, int j0, const float* dh_above,
                                             long long lddhin, const float (&gates)[SB_CPT][4],
                                             const float (&cn)[SB_CPT], const float (&cp)[SB_CPT],
                                             const float (&dhrec)[SB_CPT],
                                             float (&dcar)[SB_CPT], Out out) {
#pragma unroll
    for (int i = 0; i < SB_CPT; ++i) {
        int b, jj;
        sb_cell_of(threadIdx.x, i, b, jj);
        if ((PK_TIMING & 8) || b >= B) continue;
        const long long row = (long long)t * B + b;
        const float dh = __ldcg(dh_above + row * lddhin + j0 + jj) + dhrec[i];
        dcar[i] = lstm_bwd_point(dh, dcar[i], gates[i][0], gates[i][1], gates[i][2],
                                 gates[i][3], cn[i], cp[i], out(row, b, jj));
    }
}

// The block's dg_t tile ([4U][SB_TP], written) into this layer's dgt slot t & 1, 16 bytes a
// copy: gate row q*U + jj is dg^T row q*H + j0 + jj (its first nbc float4s), then counted on
// dg_done. Slot t & 1 was last read by every block of the layer at step t+2's product, before
// each counted step t+1 (which this block waited for before its product of step t+1).
// Returns the slot.
__device__ __forceinline__ float* sb_publish_tile(int t, int B, int H, int j0,
                                                  const float* tile, float* dgt,
                                                  unsigned int* dg_done) {
    constexpr int U = SB_U;
    const int tid = threadIdx.x;
    const int nbc = (B + 3) / 4;          // float4s of a dgt row that hold batches
    float* const dgs = dgt + (long long)(t & 1) * 4 * H * SB_BMAX;
    for (int e = tid; e < 4 * U * (SB_BMAX / 4); e += PK_MAX_THREADS) {
        const int rr = e / (SB_BMAX / 4), cc = e % (SB_BMAX / 4);
        if (cc >= nbc) continue;
        const int q = rr / U, jj = rr % U;
        sb_stcg4(dgs + (long long)(q * H + j0 + jj) * SB_BMAX + 4 * cc,
                 *reinterpret_cast<const float4*>(tile + rr * SB_TP + 4 * cc));
    }
    __syncthreads();   // the block's dg_t^T is issued (and the tile read)
    if (tid == 0) {
        pk_fence_acq_rel();   // ... and visible GPU-wide before this block counts (release)
        atomicAdd(dg_done, 1u);
    }
    return dgs;
}

// The pointwise backward of step t (the s-th step: t = T-1-s) of the block's cells, then its
// dg_t published: into dgx (row-major, streaming: only the dW GEMMs after the launch read
// it), through the shared tile [4U][SB_TP] into the layer's dg^T slot t & 1 (k-major
// [4H][64]: row q*H + j = batches), counted on dg_done. The forward's values are loaded
// before the wait for the layer above's dg_t W (above: its dx counter, or null for the top
// layer; done: the count that step t reaches). `tile` aliases the caller's stages: the
// first __syncthreads orders the caller's last reads of them before its writes. Returns the
// slot.
__device__ __forceinline__ float* sb_pointwise(
        int s, int t, int B, int H, int j0, const float* act, long long ldact, const float* c,
        long long ldc, const float* dh_above, long long lddhin, float* dgx, long long lddgx,
        float* tile, float* dgt, const unsigned int* above, unsigned int* dg_done,
        unsigned int done, float (&dhrec)[SB_CPT], float (&dcar)[SB_CPT]) {
    constexpr int U = SB_U;
    const int tid = threadIdx.x;
    PS_NOTE(s, 0);
    float gates[SB_CPT][4], cn[SB_CPT], cp[SB_CPT];
    sb_load_step(t, B, H, j0, act, ldact, c, ldc, gates, cn, cp);
    if (tid == 0 && above) ps_wait(above, done);
    __syncthreads();   // ... for every thread (and the last step's partial sums are read)
    PS_NOTE(s, 1);
#pragma unroll
    for (int i = 0; i < SB_CPT; ++i) {
        int b, jj;
        sb_cell_of(tid, i, b, jj);
        if ((PK_TIMING & 8) || b >= B) continue;
        const long long row = (long long)t * B + b;
        const float dh = __ldcg(dh_above + row * lddhin + j0 + jj) + dhrec[i];
        float* const g_out = dgx + row * lddgx + j0 + jj;
        float* const t_out = tile + jj * SB_TP + b;
        // the gate gradients: into dgx and the block's dg^T tile, row q*U + jj (a warp's 16
        // units x 2 batches: 4-way bank conflicts at most, 16 stores a thread a step)
        dcar[i] = lstm_bwd_point(dh, dcar[i], gates[i][0], gates[i][1], gates[i][2],
                                 gates[i][3], cn[i], cp[i], [&](int q, float v) {
                                     __stcs(g_out + q * H, v);
                                     t_out[q * U * SB_TP] = v;
                                 });
    }
    __syncthreads();   // the tile is written
    float* const dgs = sb_publish_tile(t, B, H, j0, tile, dgt, dg_done);
    PS_NOTE(s, 2);
    return dgs;
}

// After the last step: dh0 = the last dh_rec, dc0 = the last dc of layer l's cells; the last
// block out zeroes every counter for the next launch (by then every block has passed its
// last wait). Counters: 2k layer k's dg, 2k+1 (k >= 1) its dx, in row g (ldsync apart) of
// each of `groups` batch groups; row 0 word 1 blocks gone.
__device__ __forceinline__ void sb_finish(int l, int L, int B, int j0, float* dh0,
                                          long long lddh0, float* dc0, long long lddc0,
                                          unsigned int* sync, const float (&dhrec)[SB_CPT],
                                          const float (&dcar)[SB_CPT], int groups = 1,
                                          long long ldsync = 0) {
#pragma unroll
    for (int i = 0; i < SB_CPT; ++i) {
        int b, jj;
        sb_cell_of(threadIdx.x, i, b, jj);
        if (b >= B) continue;
        const long long row = (long long)l * B + b;
        dh0[row * lddh0 + j0 + jj] = dhrec[i];
        dc0[row * lddc0 + j0 + jj] = dcar[i];
    }
    if (threadIdx.x == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        for (int g = 0; g < groups; ++g) {
            unsigned int* const row = sync + g * ldsync;
            for (int k = 0; k < L; ++k) atomicExch(row + 2 * k, 0u);
            for (int k = 1; k < L; ++k) atomicExch(row + 2 * k + 1, 0u);
        }
        atomicExch(sync + 1, 0u);
    }
}
// GRU's R operand at product row kg (of K = 4H rows dr, dz, dn, dhn), column col: R's rows r,
// z for dr, dz, zeros for dn (n's W side: dn does not pass through R), R's n rows for dhn.
__device__ __forceinline__ float4 sb_gru_r4(const float* whh, int kg, int H, int col) {
    return kg >= 2 * H && kg < 3 * H ? make_float4(0.f, 0.f, 0.f, 0.f) :
        __ldg(reinterpret_cast<const float4*>(whh + (long long)(kg >= 3 * H ? kg - H : kg) * H +
                                              col));
}

// sb_finish for the cell: a GRU has no c, so no dc0 (its carry dcar was dh z, a step's term):
// dh0 is stored twice with the same values.
template <bool GRU>
__device__ __forceinline__ void sb_finish_cell(int l, int L, int B, int j0, float* dh0,
                                               long long lddh0, float* dc0, long long lddc0,
                                               unsigned int* sync, const float (&dhrec)[SB_CPT],
                                               float (&dcar)[SB_CPT], int groups = 1,
                                               long long ldsync = 0) {
    if (GRU) {
#pragma unroll
        for (int i = 0; i < SB_CPT; ++i) dcar[i] = dhrec[i];
        sb_finish(l, L, B, j0, dh0, lddh0, dh0, lddh0, sync, dhrec, dcar, groups, ldsync);
    } else {
        sb_finish(l, L, B, j0, dh0, lddh0, dc0, lddc0, sync, dhrec, dcar, groups, ldsync);
    }
}

// The pointwise backward of step t of the block's GRU cells (sb_pointwise's form): h_{t-1}
// from the forward's h (slot t of the layer: st), the gates r, z, n, hn from act; dh = dh_above
// + dh_rec; gru_bwd's arithmetic; dgx's row gets (dr, dz, dn) and dgh's (dr, dz, dhn) at q*H
// (streaming: only the dW GEMMs after the launch read them); the tile's 4 row groups (dr, dz,
// dn, dhn) at q*U + jj go to the layer's dg^T slot t & 1 as sb_pointwise's; `carry` gets dh z
// (the part of dh_{t-1} that does not pass through R: the caller adds it to the product's).
__device__ __forceinline__ float* sb_pointwise_gru(
        int s, int t, int B, int H, int j0, const float* act, long long ldact, const float* hs,
        long long ldh, const float* dh_above, long long lddhin, float* dgx, long long lddgx,
        float* dgh, long long lddgh, float* tile, float* dgt, const unsigned int* above,
        unsigned int* dg_done, unsigned int done, const float (&dhrec)[SB_CPT],
        float (&carry)[SB_CPT]) {
    constexpr int U = SB_U;
    const int tid = threadIdx.x;
    PS_NOTE(s, 0);
    float g[SB_CPT][4], hp[SB_CPT];
#pragma unroll
    for (int i = 0; i < SB_CPT; ++i) {
        int b, jj;
        sb_cell_of(tid, i, b, jj);
        if (b >= B) continue;
        const long long row = (long long)t * B + b;
#pragma unroll
        for (int q = 0; q < 4; ++q) g[i][q] = __ldcs(act + row * ldact + q * H + j0 + jj);
        hp[i] = __ldcs(hs + row * ldh + j0 + jj);
    }
    if (tid == 0 && above) ps_wait(above, done);
    __syncthreads();
    PS_NOTE(s, 1);
#pragma unroll
    for (int i = 0; i < SB_CPT; ++i) {
        int b, jj;
        sb_cell_of(tid, i, b, jj);
        if ((PK_TIMING & 8) || b >= B) continue;
        const long long row = (long long)t * B + b;
        const float dh = __ldcg(dh_above + row * lddhin + j0 + jj) + dhrec[i];
        const float r = g[i][0], z = g[i][1], n = g[i][2], hn = g[i][3];
        const float dhz = dh * z;
        const float dn = (dh - dhz) * (1.f - n * n);
        const float dz = (dh * (hp[i] - n)) * (z * (1.f - z));
        const float dhn = dn * r;
        const float dr = (dn * hn) * (r * (1.f - r));
        carry[i] = dhz;
        float* const gx = dgx + row * lddgx + j0 + jj;
        float* const gh = dgh + row * lddgh + j0 + jj;
        __stcs(gx, dr), __stcs(gx + H, dz), __stcs(gx + 2 * H, dn);
        __stcs(gh, dr), __stcs(gh + H, dz), __stcs(gh + 2 * H, dhn);
        float* const t_out = tile + jj * SB_TP + b;
        t_out[0] = dr;
        t_out[U * SB_TP] = dz;
        t_out[2 * U * SB_TP] = dn;
        t_out[3 * U * SB_TP] = dhn;
    }
    __syncthreads();   // the tile is written
    float* const dgs = sb_publish_tile(t, B, H, j0, tile, dgt, dg_done);
    PS_NOTE(s, 2);
    return dgs;
}


// The fp32 kernels' pointwise for the cell: sb_pointwise (LSTM; dgh unused) or
// sb_pointwise_gru (c is then the forward's h, dcar gets dh z). Returns the dg^T slot.
template <bool GRU>
__device__ __forceinline__ float* sb_pointwise_cell(
        int s, int t, int B, int H, int j0, const float* act, long long ldact, const float* c,
        long long ldc, const float* dh_above, long long lddhin, float* dgx, long long lddgx,
        float* dgh, long long lddgh, float* tile, float* dgt, const unsigned int* above,
        unsigned int* dg_done, unsigned int done, float (&dhrec)[SB_CPT],
        float (&dcar)[SB_CPT]) {
    if (GRU)
        return sb_pointwise_gru(s, t, B, H, j0, act, ldact, c, ldc, dh_above, lddhin, dgx,
                                lddgx, dgh, lddgh, tile, dgt, above, dg_done, done, dhrec, dcar);
    return sb_pointwise(s, t, B, H, j0, act, ldact, c, ldc, dh_above, lddhin, dgx, lddgx, tile,
                        dgt, above, dg_done, done, dhrec, dcar);
}

#endif
