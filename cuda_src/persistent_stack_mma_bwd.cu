/*
 * persistent_stack_mma_bwd.cu: the tensor-core stack BACKWARD (bf16 and fp16 storage, fp32
 * math, sm_90 cluster pairs): the recurrent chain of ALL L layers of an LSTM stack's backward
 * in ONE persistent launch along the reverse wavefront, as persistent_stack_bwd_pair.cu (the
 * same cut, waits and counters), with the product on tensor cores: mma.sync m16n8k16 on bf16
 * / fp16 operands, fp32 accumulation, by the tensor-core stack forward's fragment machinery
 * (persistent_stack_mma.cuh). Block c (cluster rank) of the pair owning units P = [32p, 32p +
 * 32) of layer l keeps A = [R_l | W_l][K_c, P]^T (64 rows: R's 32 columns, then W's; k rows
 * K_c = [2Hc, 2Hc + 2H), the i, f gates for c = 0, g, o for c = 1) in shared memory in the
 * storage type (rounded once, in the prologue), and each step t multiplies it by its k rows
 * of dg_t, staged as they lie in dgx (row-major [B, 4H] in the storage type: no transposed
 * scratch); the two half sums meet through distributed shared memory. R's rows are the
 * gradient into h_t at the pair's units (the next step's dh_rec), W's the gradient into the
 * layer below's h_{t+1} (its dh_above, or dx for layer 0). The pointwise backward is the fp32
 * stack backward's (persistent_stack_bwd.cuh), dg_t rounded to the storage type as it is
 * stored. Design: docs/kernels.md ("The tensor-core stack backward"); host side (fit, NumPy
 * twin): rnnrt/kernels/stack_mma_bwd.py.
 *
 * Variants: one template, lstm_persistent_stack_mma_bwd_t<TS, false>, TS bf16 or fp16
 *   (rnnrt/kernels/typed.py persistent_expression; the `false` is the typed persistent
 *   kernels' TF32 flag, unused). No `extern "C"` kernels. Compile-time knobs (experiments
 *   only; rnnrt.kernels.stack_mma_bwd mirrors the defaults, a test holds them): SMB_NS
 *   (pipeline stages), PK_TIMING, PK_SPIN_LIMIT, PK_TRACE.
 *
 * Why the same math as the rungs: dg is stored rounded to TS (the typed backward's
 * convention: dgx is what the dW GEMMs read) and the product reads those stored values; R and
 * W are rounded to TS as loaded (the rungs' copies' values): exact in the tensor core's input
 * type, their products exact in fp32, accumulated in fp32. Only the order of the sum over k
 * differs (within a k16 step the hardware's; across steps the kernel's: below).
 *
 * Calling convention: the stack backward's (rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int L, int units_per_block,
 *          int groups),
 *   each view a (pointer, int ld) pair, row-major; `sync` is unsigned int*; dgx is TS*. The
 *   grid is groups * L * H/16 blocks of 256 threads, whole clusters of 2 (__cluster_dims__):
 *   B = 64 * groups runs as whole batch groups side by side, as the fp32 stack backward's.
 *
 * Kernels (one variant each a storage type; layer l's rows of dgx, dhin and act are l*T*B +
 *   t*B + b, of c l*(T+1)*B + s*B + b, of dh0, dc0, dh_n, dc_n l*B + b; input size = hidden):
 *   kernel lstm_persistent_stack_mma_bwd(rows = B, cols = H)
 *       per layer from the top, steps T-1 .. 0: lstm_bwd's arithmetic on dh = dh_above +
 *       dh_rec (dh_rec of step T-1: dh_n), dg_t rounded to TS; then dh_rec of step t-1 =
 *       dg_t R_l and the gradient into the input of step t = dg_t W_l, each summed by
 *       mma.sync in the kernel's order: block c sums its k rows K_c, k-group kg of 4 the
 *       k16 steps 4n + kg of them (its four partial sums added (p0 + p2) + (p1 + p3)); the
 *       owning block's half + the other's
 *     out dgx    [L*T*B, 4H]     TS: every layer's and step's gate gradients (the dW GEMMs
 *                                after the launch read them; the product stages them)
 *     out dhin   [L*T*B, H]      the gradient from above into each layer's h_{t+1}: layer
 *                                L-1's rows are read (dy), the others written
 *     out dx     [T*B, H]        the gradient into the input sequence (layer 0's dg W)
 *     out dh0    [L*B, H]        the gradient into h0 of every layer
 *     out dc0    [L*B, H]        the gradient into c0 of every layer
 *     out sync   [groups, 2L]    row g (batch group g): word 2l layer l's dg progress
 *                                (blocks x steps done), word 2l+1 (l >= 1) its dx progress;
 *                                row 0 word 1: blocks gone. Zero on entry, zero on exit
 *     in  dh_n   [L*B, H]        the gradient into the last h of every layer
 *     in  dc_n   [L*B, H]        the gradient into the last c of every layer
 *     in  act    [L*T*B, 4H]     the forward's gates i, f, g, o (fp32)
 *     in  c      [L*(T+1)*B, H]  the forward's c (slot 0 = c0; fp32)
 *     in  w_ih   [L, 4*H*H]      fp32; row l: layer l's weight_ih [4H, H], row-major (ld: the
 *                                distance between layers in the flat parameters)
 *     in  w_hh   [L, 4*H*H]      fp32; row l: layer l's weight_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        16 (the pointwise's units a block)
 *     int groups                 batch groups: 1 (B <= 64) or B / 64
 *
 * Resources (sm_90a, nvcc 13.0 --resource-usage; rnnrt.kernels.stack_mma_bwd.SMB_REGS is the
 *   bound the fit assumes): __launch_bounds__(PK_MAX_THREADS = 256, 1), 193 registers (bf16
 *   and fp16), no spills, no stack frame; dynamic shared memory 64 * (2H + 16) * 2 (the A
 *   rows) + SMB_NS * 64 * 80 * 2 (stages; the partial sums, 34,816 bytes, reuse them) +
 *   8,192 (the pair's sums): 192,512 bytes at H 512, 225,280 at H 640.
 */
#include "persistent_common.cuh"
#include "persistent_stack.cuh"
// SB_U, SB_CPT, sb_cell_of, sb_cells_init, sb_load_step, sb_cells_bwd, sb_finish:
#include "persistent_stack_bwd.cuh"
// PSM_BMAX, PSM_KT, PSM_SX, PSM_RP, psm_k16, psm_flush (mma_sync.cuh with them):
#include "persistent_stack_mma.cuh"

// The block's cut. Block x is layer l = x / NB, rank x % NB (NB = H / 16, even), cluster
// rank c = rank & 1, pair p = rank >> 1; its pointwise owns units j0 = 16 rank .. + 16 (the
// fp32 stack backward's), its product the pair's 64 rows A = [R_l | W_l][K_c, P]^T over its
// 2H k rows. Warps as the forward tensor-core stack kernel's: warp w = batch half nh = w & 1,
// k-group kg = w >> 1 (of each staged tile of PSM_KT k rows, the 16 at 16kg), 4 m16 x 4 n8
// register tiles a lane.
#define SMB_PU 32                  // units of a pair (its product's columns of R, of W)
#define SMB_M (2 * SMB_PU)         // product rows: R's 32 columns, then W's
#ifndef SMB_NS
#define SMB_NS 5                   // pipeline stages (tiles in flight: SMB_NS - 1)
#endif
#define SMB_RECV (PSM_BMAX * SMB_PU)   // the pair's sums a block receives: [64][32] floats
#define SMB_STAGE_BYTES (PSM_BMAX * PSM_SX * 2)
#define SMB_RED_BYTES (2 * PSM_BMAX * PSM_RP * 4)
#define SMB_BUF_BYTES (SMB_NS * SMB_STAGE_BYTES > SMB_RED_BYTES ? SMB_NS * SMB_STAGE_BYTES \
                                                                : SMB_RED_BYTES)
static_assert(SMB_NS >= 2, "a tile in flight while one is multiplied");
static_assert(SMB_M == 64 && SB_U * 2 == SMB_PU, "psm_k16's 64 rows: a pair's R and W columns");

// One block of the pair. Views as the header's.
template <class TS>
__device__ __forceinline__ void persistent_stack_mma_bwd(
        int B, int H, TS* dgx, long long lddgx, float* dhin, long long lddhin, float* dx,
        long long lddx, float* dh0, long long lddh0, float* dc0, long long lddc0,
        unsigned int* sync, const float* dhn, long long lddhn, const float* dcn,
        long long lddcn, const float* act, long long ldact, const float* c, long long ldc,
        const float* wih, long long ldwih, const float* whh, long long ldwhh, int T, int L,
        int u_arg, long long ldsync, int groups) {
    constexpr int U = SB_U;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nh = warp & 1, kg = warp >> 1;
    const int NB = H / U;                   // blocks a layer
    // Batch groups, as the fp32 stack backward's (whole ones: B = 64 groups, B the row
    // stride): blocks [g*L*NB, (g+1)*L*NB) (whole pairs) run batches [64g, 64g + 64) with
    // their own row g of the counters.
    const int NBL = max(L * NB, 1);         // blocks a group (L checked below)
    const int grp = blockIdx.x / NBL, bx = blockIdx.x - grp * NBL;
    const int KH = 2 * H;                   // the block's k rows: half of the 4H gate rows
    const int NT = KH / PSM_KT;             // tiles a step
    const int SA = KH + 16;                 // row stride (elements) of the A rows
    const long long need = 2LL * SMB_M * SA + SMB_BUF_BYTES + 4LL * SMB_RECV;
    auto aligned = [](const void* p) {
        return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
    };
    const unsigned int cr = pk_cluster_rank();
    // 16-byte staging copies: every row of dgx 16-byte aligned (ld a multiple of 8); 16-byte
    // weight loads: every layer's W and R rows 16-byte aligned
    if (blockDim.x != PK_MAX_THREADS || u_arg != U || H % PSM_KT != 0 || NB % 2 != 0 ||
        B < 1 || groups < 1 || (groups == 1 ? B > PSM_BMAX : B != groups * PSM_BMAX) ||
        ldsync < 2LL * L || L < 1 || T < 1 || (long long)gridDim.x != (long long)groups * NBL ||
        cr != (blockIdx.x & 1u) || (long long)dynamic_smem_bytes() < need || lddgx % 8 ||
        !aligned(dgx) || ldwih % 4 || ldwhh % 4 || !aligned(wih) || !aligned(whh))
        __trap();
    const int l = bx / NB, rank = bx % NB;
    const int j0 = rank * U;                // the pointwise's units (rank 2p + c)
    const int p0 = (rank >> 1) * SMB_PU;    // the pair's units: the product's columns
    const int k0 = (int)cr * KH;            // the block's first k row
    // layer l's counters and views, as the fp32 kernels' (written out again: a shared helper
    // in persistent_stack_bwd.cuh changed their PTX and registers, 254 -> 235)
    unsigned int* const dg_done = sync + grp * ldsync + 2 * l;
    unsigned int* const dx_done = dg_done + 1;
    const unsigned int* const above = l + 1 < L ? dg_done + 3 : nullptr;   // 2(l+1) + 1
    const long long TB = (long long)T * B, bg0 = (long long)grp * PSM_BMAX;
    act += (l * TB + bg0) * ldact;
    c += (l * (TB + B) + bg0) * ldc;
    dgx += (l * TB + bg0) * lddgx;
    const float* const dh_above = dhin + (l * TB + bg0) * lddhin;   // layer L-1's: dy (read)
    float* const down = l ? dhin + ((l - 1) * TB + bg0) * lddhin : dx + bg0 * lddx;
    const long long lddown = l ? lddhin : lddx;
    dhn += bg0 * lddhn;
    dcn += bg0 * lddcn;
    dh0 += bg0 * lddh0;
    dc0 += bg0 * lddc0;
    wih += l * ldwih + (long long)k0 * H + p0;
    whh += l * ldwhh + (long long)k0 * H + p0;

    unsigned short* const As = reinterpret_cast<unsigned short*>(dynamic_smem());
    unsigned short* const st = As + SMB_M * SA;              // [SMB_NS][PSM_BMAX][PSM_SX]
    float* const red = reinterpret_cast<float*>(st);         // [2][PSM_BMAX][PSM_RP], after
    float* const recv = reinterpret_cast<float*>(st + SMB_BUF_BYTES / 2);   // [64][32]

    // The A rows, once, rounded to TS (the rungs' copies' values): As[r][k] = R[k0 + k, p0 +
    // r] for r < 32, W[k0 + k, p0 + r - 32] above (float4 loads along a k row's 32 columns)
    for (int e = tid; e < KH * (SMB_M / 4); e += PK_MAX_THREADS) {
        const int k = e / (SMB_M / 4), q = e % (SMB_M / 4), r = 4 * q;
        const float* const src = (r < SMB_PU ? whh + r : wih + (r - SMB_PU)) + (long long)k * H;
        const float4 v = *reinterpret_cast<const float4*>(src);
        unsigned short* const d = As + r * SA + k;
        d[0] = from_f<TS>(v.x).bits;
        d[SA] = from_f<TS>(v.y).bits;
        d[2 * SA] = from_f<TS>(v.z).bits;
        d[3 * SA] = from_f<TS>(v.w).bits;
    }
    float dhrec[SB_CPT], dcar[SB_CPT];
    sb_cells_init(l, B, j0, dhn, lddhn, dcn, lddcn, dhrec, dcar);

    // The copies of this lane: each warp stages exactly the part of each tile that it
    // multiplies (batch row 32nh + lane of dg_t, its 16 k rows: two 16-byte chunks), so a
    // tile needs no block barrier (the forward's scheme). One cp.async group a tile (empty
    // past the last).
    const int b_copy = 32 * nh + lane;
    const bool copies = b_copy < B;
    unsigned short* const dst_lane = st + b_copy * PSM_SX + 16 * kg;
    auto issue = [&](int n, const TS* dg) {
        if (n < NT && copies && !(PK_TIMING & 1)) {
            unsigned short* const d = dst_lane + (n % SMB_NS) * (PSM_BMAX * PSM_SX);
            const TS* const s = dg + b_copy * lddgx + k0 + n * PSM_KT + 16 * kg;
            pk_cp_async16(reinterpret_cast<float*>(d), reinterpret_cast<const float*>(s));
            pk_cp_async16(reinterpret_cast<float*>(d + 8), reinterpret_cast<const float*>(s + 8));
        }
        pk_cp_commit();
    };
    __syncthreads();   // the A rows are in shared memory

    const int b0 = 32 * nh;   // the warp's first batch
    const unsigned int peer = cr ^ 1u;
    // Timeline (PK_TRACE): 0 step top, 1 past the wait for the layer above, 2 after the dg
    // count, 3 past the own wait, 4 past the K loop, 5 after the dx count.
    for (int s = 0; s < T; ++s) {
        const int t = T - 1 - s;
        const unsigned int done = (unsigned int)(s + 1) * NB;   // counts after step t
        TS* const dg_rows = dgx + (long long)t * B * lddgx;      // dg_t's rows
        // --- the pointwise backward of step t (the forward's values loaded before the wait
        // for the layer above's dg_t W), dg_t rounded to TS into dgx, published
        PS_NOTE(s, 0);
        float gates[SB_CPT][4], cn[SB_CPT], cp[SB_CPT];
        sb_load_step(t, B, H, j0, act, ldact, c, ldc, gates, cn, cp);
        if (tid == 0 && above) ps_wait(above, done);
        // ... for every thread; and every thread's last reads of red and recv (the last
        // step's sums) are done before the stages are staged into again
        __syncthreads();
        PS_NOTE(s, 1);
        sb_cells_bwd(t, B, H, j0, dh_above, lddhin, gates, cn, cp, dhrec, dcar,
                     [&](long long row, int, int jj) {
                         TS* const g_out = dgx + row * lddgx + j0 + jj;
                         return [=](int q, float v) { pk_stcg(g_out + q * H, v); };   // rounded
                     });
        ps_publish(dg_done);   // the block's dg_t, visible GPU-wide, counted
        PS_NOTE(s, 2);

        // --- the product: every block of the layer's dg_t, this block's k rows (each warp
        // waits for itself: it stages and reads only its own part)
        if (lane == 0) ps_wait(dg_done, done);
        __syncwarp();
        PS_NOTE(s, 3);
        for (int n = 0; n < SMB_NS - 1; ++n) issue(n, dg_rows);
        float acc[4][4][4];
        psm_zero(acc);
        for (int n = 0; n < NT; ++n) {
            pk_cp_wait<SMB_NS - 2>();   // tile n landed (this lane's part) ...
            __syncwarp();               // ... the warp's; the warp has read its part of n-1
            issue(n + SMB_NS - 1, dg_rows);
            if (b0 < B)
                psm_k16<TS>(acc, As, SA, n * PSM_KT + 16 * kg,
                            st + (n % SMB_NS) * (PSM_BMAX * PSM_SX), 16 * kg, b0, B, lane);
        }
        PS_NOTE(s, 4);
        pk_cp_wait<0>();
        __syncthreads();   // every tile is read: the stages become the partial sums
        psm_flush(acc, red, kg, b0, B, lane);   // red[m] = p_m + p_{m+2}
        // The other block's units: R's rows 16(1-c) + jj and W's 32 + 16(1-c) + jj, each
        // red[0] + red[1], into its recv[b][16h + jj] (h 0: R, 1: W; a warp one batch's 32
        // consecutive values). Its recv was last read before its dg_t count, which this
        // block waited for.
        const int other = 16 * (int)peer;
        for (int e = tid; e < PSM_BMAX * SMB_PU; e += PK_MAX_THREADS) {
            const int b = e >> 5, hj = e & 31;
            if (b >= B) continue;
            const float* const q = red + b * PSM_RP + SMB_PU * (hj >> 4) + other + (hj & 15);
            pk_st_cluster(pk_smem_addr(recv + e), peer, q[0] + q[PSM_BMAX * PSM_RP]);
        }
        // release / acquire: the sends landed in the other's recv (and every thread of this
        // block is past its reads of red for the sends)
        pk_cluster_sync();
        // This block's units: its own half (red[0] + red[1]) plus the other block's half (a
        // fixed order: the same bits every run)
#pragma unroll
        for (int i = 0; i < SB_CPT; ++i) {
            int b, jj;
            sb_cell_of(tid, i, b, jj);
            if ((PK_TIMING & 8) || b >= B) continue;
            const float* const q = red + b * PSM_RP + 16 * (int)cr + jj;
            const float vr = q[0] + q[PSM_BMAX * PSM_RP];
            const float vw = q[SMB_PU] + q[SMB_PU + PSM_BMAX * PSM_RP];
            const float* const o = recv + b * SMB_PU + jj;
            dhrec[i] = vr + o[0];
            __stcg(down + ((long long)t * B + b) * lddown + j0 + jj, vw + o[16]);
        }
        if (l) ps_publish(dx_done);   // the block's dg_t W, for the layer below
        PS_NOTE(s, 5);
    }
    sb_finish(l, L, B, j0, dh0, lddh0, dc0, lddc0, sync, dhrec, dcar, groups, ldsync);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(2, 1, 1)
lstm_persistent_stack_mma_bwd_t(
        int rows, int cols, TS* dgx, int lddgx, float* dhin, int lddhin, float* dx, int lddx,
        float* dh0, int lddh0, float* dc0, int lddc0, unsigned int* sync, int ldsync,
        const float* dh_n, int lddh_n, const float* dc_n, int lddc_n, const float* act,
        int ldact, const float* c, int ldc, const float* w_ih, int ldw_ih, const float* w_hh,
        int ldw_hh, int T, int L, int units_per_block, int groups) {
    static_assert(!TF32, "the tensor-core stack backward has no tf32 instantiation");
    persistent_stack_mma_bwd<TS>(rows, cols, dgx, lddgx, dhin, lddhin, dx, lddx, dh0, lddh0,
                                 dc0, lddc0, sync, dh_n, lddh_n, dc_n, lddc_n, act, ldact, c,
                                 ldc, w_ih, ldw_ih, w_hh, ldw_hh, T, L, units_per_block, ldsync,
                                 groups);
}
