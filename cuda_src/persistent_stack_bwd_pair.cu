/*
 * persistent_stack_bwd_pair.cu: the stack backward in CLUSTER PAIRS (fp32, sm_90): the
 * recurrent chain of ALL L layers of an LSTM stack's backward in ONE persistent launch along
 * the reverse wavefront, as persistent_stack_bwd.cu, but each product split over the k rows
 * (the gate rows) between the two blocks of a thread-block cluster, so a block reads half of
 * dg_t per step. Why: that kernel stages all of dg_t^T (4H x 64 floats, 512 KB at H 512) into
 * every block every step, and it is bound by that: on the H100 its step took as long without
 * its FMAs (PK_TIMING 2) as with them. Here block c (cluster rank) of the pair owning units
 * P = [32p, 32p + 32) multiplies k rows [2Hc, 2Hc + 2H) (the i and f gates for c = 0, g and o
 * for c = 1) of dg_t by [R_l[:, P] | W_l[:, P]] (64 rows), 256 KB of dg^T a step; the two
 * partial sums meet through distributed shared memory (each block sends the other the 32 rows
 * of its units, 8 KB) and the cluster barrier. The pointwise and dg_t's publication are the
 * other kernel's (persistent_stack_bwd.cuh): block c's pointwise owns units 32p + 16c .. + 16,
 * the units of rank 2p + c there. Design: docs/kernels.md ("The stack backward in cluster
 * pairs"); host side (fit, NumPy twin): rnnrt/kernels/stack_bwd.py.
 *
 * Variants: two kernels, LSTM and GRU (one template, as persistent_stack_bwd.cu's: GRU's
 * K = 4H product rows dr, dz, dn, dhn, so block 0 of a pair takes dr, dz and block 1 dn, dhn;
 * R's rows r, z, zeros, n, W's r, z, n and, for dhn's tiles, zeros stored in the stage instead
 * of a copy; dh_{t-1} = the R product + dh z; dgx and dgh apart), each with two paths chosen
 * at run time: B > 32, the register tile over 64 batch lanes (NH 2); B <= 32, over 32 (NH 1:
 * a half-warp a k-group, half the FMAs and half the dg^T staged). Compile-time knobs for experiments (stack_bwd_bench.py
 * --define): SP_NS (stages), SP_BULK (1: each warp's rows of dg^T in a tile by one bulk copy
 * of the TMA engine, completing on a barrier of its own, instead of 4 cp.async a lane; its
 * 24 barriers take 192 bytes more shared memory), SP_WPRE (1: the first tiles' W parts, which
 * do not depend on dg_t, copied before the wait for it), SP_DXW (1: warp 7 makes the dx
 * count, its fence beside thread 0's wait for the layer above), PK_TIMING
 * (persistent_common.cuh), PK_TRACE. Rnnrt builds every knob at 0.
 *
 * Calling convention: exactly lstm_ and gru_persistent_stack_bwd's (persistent_stack_bwd.cu's
 *   header: the same views and scalars, batch groups included, grid groups * L * H/16 blocks
 *   of 256 threads); the grid is whole clusters of 2 (__cluster_dims__), H / 16 even (GRU: H
 *   a multiple of SP_KT, so dhn's rows start a tile; a group's blocks are whole pairs).
 *
 * Kernels:
 *   Views of all L layers at once, as lstm_persistent_stack_bwd's:
 *   kernel lstm_persistent_stack_bwd_pair(rows = B, cols = H)
 *       lstm_persistent_stack_bwd's arithmetic; the sums over the 4H gate rows in another
 *       order (each block's half in its warps' order, then the owning block's half + the
 *       other's)
 *     out dgx    [L*T*B, 4H]     every layer's and step's gate gradients
 *     out dhin   [L*T*B, H]      layer L-1's rows read (dy), the others written
 *     out dx     [T*B, H]        the gradient into the input sequence
 *     out dh0    [L*B, H]        the gradient into h0 of every layer
 *     out dc0    [L*B, H]        the gradient into c0 of every layer
 *     out sync   [groups, 2L]    progress counters (as lstm_persistent_stack_bwd's)
 *     out dgt    [groups*8*L*H, 64]  scratch: dg_t^T k-major, two slots a layer and group
 *     in  dh_n   [L*B, H]        the gradient into the last h of every layer
 *     in  dc_n   [L*B, H]        the gradient into the last c of every layer
 *     in  act    [L*T*B, 4H]     the forward's gates i, f, g, o
 *     in  c      [L*(T+1)*B, H]  the forward's c (slot 0 = c0)
 *     in  w_ih   [L, 4*H*H]      row l: layer l's weight_ih [4H, H]
 *     in  w_hh   [L, 4*H*H]      row l: layer l's weight_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        16 (the pointwise's units a block)
 *     int groups                 batch groups: 1 (B <= 64) or B / 64 (whole groups)
 *   kernel gru_persistent_stack_bwd_pair(rows = B, cols = H)
 *       gru_persistent_stack_bwd's arithmetic, the sums in this kernel's order
 *     out dgx    [L*T*B, 3H]     every layer's and step's W-side gate gradients dr, dz, dn
 *     out dgh    [L*T*B, 3H]     the R side's: dr, dz, dhn
 *     out dhin   [L*T*B, H]      layer L-1's rows read (dy), the others written
 *     out dx     [T*B, H]        the gradient into the input sequence
 *     out dh0    [L*B, H]        the gradient into h0 of every layer
 *     out sync   [groups, 2L]    progress counters (as lstm_persistent_stack_bwd's)
 *     out dgt    [groups*8*L*H, 64]  scratch: [dr dz dn dhn]^T k-major, two slots a layer
 *                                and group
 *     in  dh_n   [L*B, H]        the gradient into the last h of every layer
 *     in  act    [L*T*B, 4H]     the forward's r, z, n, hn
 *     in  h      [L*(T+1)*B, H]  the forward's h (slot 0 = h0)
 *     in  w_ih   [L, 3*H*H]      row l: layer l's weight_ih [3H, H]
 *     in  w_hh   [L, 3*H*H]      row l: layer l's weight_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        16
 *     int groups                 as lstm_persistent_stack_bwd_pair's
 *
 * Resources (sm_90, nvcc 13.0): LSTM 255 registers, GRU 245, no spills, under
 *   __launch_bounds__(PK_MAX_THREADS = 256, 1); dynamic shared memory 2H*32*4 (R slice) +
 *   SP_NS * 24,576 (stages) + 8,192 (the pair's partial sums): 212,992 bytes at H 512.
 */
// SB_U, SB_BMAX, SB_TP, SB_CPT, the pointwise, the finish:
#include "persistent_stack_bwd.cuh"

// Block x is layer l = x / NB, rank x % NB (NB = H / 16, even), cluster rank c = rank & 1,
// pair p = rank >> 1. Its product each step: k rows K_c = [2Hc, 2Hc + 2H) of dg_t^T (64
// batches) times A = [R_l[K_c, P] | W_l[K_c, P]]: a k row of A is 64 floats (R's 32
// columns, then W's), so a lane's step is the forward stack kernel's outer product per k
// (16 rows x 8 batches, 6 float4 loads, 128 FMAs), a warp a k-group over whole k rows.
#define SP_PU 32                   // units of a pair (its product's columns of R, of W)
#define SP_M (2 * SP_PU)           // product rows: R's 32 columns, then W's
#define SP_TM 16                   // register tile: rows a lane accumulates (4 float4s)
#define SP_TB 8                    // register tile: batches a lane accumulates (2 float4s)
#define SP_KT 64                   // k rows of a staged tile
#ifndef SP_NS
#define SP_NS 3                    // pipeline stages (tiles in flight: SP_NS - 1)
#endif
#define SP_KG (PK_MAX_THREADS / 32)   // k-groups (8): one a warp, each the block's 64 x 64
#define SP_KPW (SP_KT / SP_KG)     // k rows of a tile a warp takes (8)
// One stage: W's part [SP_KT][32], then dg^T's [SP_KT][64]. A quarter warp's 16-byte loads
// of one k row take 4 consecutive float4s of one part (lr 0..3) and 2 of dg^T's (lb 0, 1):
// no padding needed.
#define SP_XOFF (SP_KT * SP_PU)    // the dg^T part's offset in a stage
#define SP_STAGE (SP_XOFF + SP_KT * SB_BMAX)
#define SP_RP 68                   // stride of a batch's partial sums (the forward's flush)
#define SP_RECV (SB_BMAX * SP_PU)  // the pair's partial sums a block receives: [64][32]
#ifndef SP_BULK
#define SP_BULK 0                  // the dg^T part by bulk copies (see the header)
#endif
#define SP_BARS (SP_BULK ? 2 * SP_NS * SP_KG : 0)   // floats of the bulk copies' mbarriers
#ifndef SP_WPRE
#define SP_WPRE 0                  // 1: the first tiles' W parts issued before the wait for dg_t
#endif
#ifndef SP_DXW
#define SP_DXW 0                   // 1: the dx count by warp 7 (its fence beside thread 0's wait)
#endif
#define SP_CW 2                    // W float4s a lane copies of a tile (8 rows x 8 a warp)
#define SP_CX 4                    // dg^T float4s a lane copies of a tile (8 rows x 16)
static_assert(4 * SB_BMAX * SP_RP <= SP_NS * SP_STAGE, "the partial sums reuse the stages");
static_assert(4 * SB_U * SB_TP <= SP_NS * SP_STAGE, "the dg^T tile reuses the stages");
static_assert(SP_KPW * (SP_PU / 4) == 32 * SP_CW && SP_KPW * (SB_BMAX / 4) == 32 * SP_CX,
              "a warp copies its SP_KPW rows of both parts, whole float4s a lane");

// acc += A^T[k]^T X^T[k] over the lane's k rows of one tile: with NH = 2 (batches 33..64)
// the warp's SP_KPW rows, with NH = 1 (B <= 32) its half-warp's, every second one (half-warp
// lk takes rows lk, lk + 2, ..: the warp's 32 lanes cover 64 rows x 32 batches twice). ar,
// aw: the shared addresses of the lane's first R float4 (the R slice) and first W float4
// (the stage) at its first k row, x its first dg^T float4 there; the lane's rows are 16g +
// 4lr + e (g 0, 1: R's columns 16g + 4lr + e; g 2, 3: W's 16(g-2) + 4lr + e), its batches
// 32h + 4lb + f (NH 2) or 16h + 4lb + f (NH 1). The next k's six float4s are loaded before
// this k's 128 FMAs.
template <int NH>
__device__ __forceinline__ void sp_tile_fma(float (&acc)[SP_TM][SP_TB], pk_saddr ar,
                                            pk_saddr aw, pk_saddr x) {
    if (PK_TIMING & 2) return;
    constexpr int rows = NH == 2 ? SP_KPW : SP_KPW / 2;   // k rows of the tile the lane takes
    constexpr unsigned int da = (3 - NH) * 4u * SP_PU;    // bytes to its next A row
    constexpr unsigned int dx = (3 - NH) * 4u * SB_BMAX;  // ... and dg^T row
    constexpr unsigned int xh = NH * 64u;                 // bytes to its second batch float4
    float4 av[4], xv[2], an[4], xn[2];
    av[0] = pk_lds128(ar), av[1] = pk_lds128(ar + 64u);
    av[2] = pk_lds128(aw), av[3] = pk_lds128(aw + 64u);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) xv[hh] = pk_lds128(x + xh * hh);
#pragma unroll
    for (int kk = 0; kk < rows; ++kk) {
        if (kk + 1 < rows) {
            an[0] = pk_lds128(ar + da * (kk + 1)), an[1] = pk_lds128(ar + da * (kk + 1) + 64u);
            an[2] = pk_lds128(aw + da * (kk + 1)), an[3] = pk_lds128(aw + da * (kk + 1) + 64u);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) xn[hh] = pk_lds128(x + dx * (kk + 1) + xh * hh);
        }
        ps_outer(acc, av, xv);
        if (kk + 1 < rows) {
#pragma unroll
            for (int g = 0; g < 4; ++g) av[g] = an[g];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) xv[hh] = xn[hh];
        }
    }
}

// One block of the pair kernel (NH: the batch halves its tile spans, 1 where B <= 32).
// Views as lstm_persistent_stack_bwd's; GRU (CELL_GRU) as persistent_stack_bwd.cu's template
// takes them: dgh beside dgx, c the forward's h, no dc0 or dcn.
template <int CELL, int NH>
__device__ __forceinline__ void persistent_stack_bwd_pair(
        int B, int H, float* dgx, long long lddgx, float* dgh, long long lddgh, float* dhin,
        long long lddhin, float* dx, long long lddx, float* dh0, long long lddh0, float* dc0,
        long long lddc0, unsigned int* sync, float* dgt, long long ldgt, const float* dhn,
        long long lddhn, const float* dcn, long long lddcn, const float* act, long long ldact,
        const float* c, long long ldc, const float* wih, long long ldwih, const float* whh,
        long long ldwhh, int T, int L, int u_arg, long long ldsync, int groups) {
    static_assert(CELL == CELL_LSTM || CELL == CELL_GRU, "the stack backward: LSTM and GRU");
    constexpr bool GRU = CELL == CELL_GRU;
    constexpr int U = SB_U;
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int NB = H / U;                 // blocks a layer
    // Batch groups, as persistent_stack_bwd.cu's (whole ones: B = 64 groups, B the row
    // stride): blocks [g*L*NB, (g+1)*L*NB) (whole pairs: NB is even) run batches [64g,
    // 64g + 64) with their own row g of the counters and block of dgt.
    const int NBL = max(L * NB, 1);       // blocks a group (L checked below)
    const int grp = blockIdx.x / NBL, bx = blockIdx.x - grp * NBL;
    const int KH = 2 * H;                 // the block's k rows: half of the 4H gate rows
    const int NT = KH / SP_KT;            // tiles a step
    const int nbc = (B + 3) / 4;          // float4s of a dgt row that hold batches
    const long long need = 4LL * ((long long)KH * SP_PU + SP_NS * SP_STAGE + SP_RECV + SP_BARS);
    auto aligned = [](const void* p) {
        return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
    };
    const unsigned int cr = pk_cluster_rank();
    if (blockDim.x != PK_MAX_THREADS || u_arg != U || KH % SP_KT != 0 || NB % 2 != 0 ||
        H % U != 0 || B < 1 || groups < 1 || (groups == 1 ? B > SB_BMAX : B != groups * SB_BMAX) ||
        ldsync < 2LL * L || L < 1 || T < 1 || (GRU && H % SP_KT != 0) ||
        (long long)gridDim.x != (long long)groups * NBL || cr != (blockIdx.x & 1u) ||
        (long long)dynamic_smem_bytes() < need || ldgt != SB_BMAX || !aligned(dgt) ||
        !aligned(wih) || !aligned(whh) || ldwih % 4 || ldwhh % 4)
        __trap();
    const int l = bx / NB, rank = bx % NB;
    const int j0 = rank * U;              // the pointwise's units (rank 2p + c)
    const int p0 = (rank >> 1) * SP_PU;   // the pair's units: the product's columns
    const int k0 = (int)cr * KH;          // the block's first k row
    unsigned int* const dg_done = sync + grp * ldsync + 2 * l;
    unsigned int* const dx_done = dg_done + 1;
    const unsigned int* const above = l + 1 < L ? dg_done + 3 : nullptr;   // 2(l+1) + 1
    const long long TB = (long long)T * B, b0 = (long long)grp * SB_BMAX;
    act += (l * TB + b0) * ldact;
    c += (l * (TB + B) + b0) * ldc;
    dgx += (l * TB + b0) * lddgx;
    if (GRU) dgh += (l * TB + b0) * lddgh;
    const float* const dh_above = dhin + (l * TB + b0) * lddhin;   // layer L-1's: dy (read)
    float* const down = l ? dhin + ((l - 1) * TB + b0) * lddhin : dx + b0 * lddx;
    const long long lddown = l ? lddhin : lddx;
    dgt += ((long long)grp * L + l) * 2 * 4 * H * ldgt;
    dhn += b0 * lddhn;
    if (!GRU) dcn += b0 * lddcn;
    dh0 += b0 * lddh0;
    if (!GRU) dc0 += b0 * lddc0;
    wih += l * ldwih + (long long)k0 * H + p0;
    whh += l * ldwhh + (long long)(GRU ? 0 : k0) * H + p0;   // GRU: R's rows mapped below
    // GRU: the block's tiles from NWT on are dhn's (product rows 3H ..), which have no W rows
    const int NWT = GRU ? (3 * H - k0) / SP_KT : NT;

    float* const Rs = smem;                        // [2H][32]: R[K_c, P], k-major
    float* const st = Rs + KH * SP_PU;             // [SP_NS][SP_STAGE] stages
    float* const recv = st + SP_NS * SP_STAGE;     // [64][32]: the other block's sums
    // SP_BULK: warp w's barrier of stage s at bars + 8 * (s * SP_KG + w) bytes
    const pk_saddr bars = pk_smem_addr(recv + SP_RECV);
    float* const red = st;                         // [4][SB_BMAX][SP_RP], after the K loop
    float* const tile = st;                        // [4U][SB_TP]: the pointwise's dg^T tile

    // The R slice, once: Rs[k][ju] = R[k0 + k, p0 + ju] (a row's 32 columns: 8 float4s);
    // GRU: product rows dr, dz as R's, zeros for dn (n's W side), R's n rows for dhn
    for (int e = tid; e < KH * (SP_PU / 4); e += PK_MAX_THREADS) {
        const int k = e / (SP_PU / 4), q = e % (SP_PU / 4);
        *reinterpret_cast<float4*>(Rs + k * SP_PU + 4 * q) =
            GRU ? sb_gru_r4(whh, k0 + k, H, 4 * q)
                : __ldg(reinterpret_cast<const float4*>(whh + (long long)k * H + 4 * q));
    }
    float dhrec[SB_CPT], dcar[SB_CPT];
    sb_cells_init(l, B, j0, dhn, lddhn, GRU ? dhn : dcn, GRU ? lddhn : lddcn, dhrec, dcar);

    // The float4s this thread copies of each tile (a warp copies only the SP_KPW k rows it
    // multiplies: no block barrier in the K loop). W part: k rows krw + 4i (i < 2), float4
    // qw = lane % 8 of the pair's 32 columns; dg^T part: k rows kr0 + 2i (i < 4), float4 q4
    // = lane % 16 (batches 4*q4, only float4s below nbc). One cp.async group a tile.
    const int krw = SP_KPW * warp + (lane >> 3), qw = lane & 7;
    const float* const w_thr = wih + (long long)krw * H + 4 * qw;
    const int dst_w = krw * SP_PU + 4 * qw;
    // dg^T: NH 2 rows kr0 + 2i (i < 4), float4 q4 = lane % 16; NH 1 (32 batches) rows kr0 +
    // 4i (i < 2), float4 q4 = lane % 8
    const int kr0 = SP_KPW * warp + (NH == 2 ? lane >> 4 : lane >> 3);
    const int q4 = NH == 2 ? lane & 15 : lane & 7;
    const int dst_x = SP_XOFF + kr0 * SB_BMAX + 4 * q4;
    const bool x_ok = q4 < nbc;
    const pk_saddr bar_w = bars + 8u * warp;   // + 8 * SP_KG * stage
    // parts: 1 the W part, 2 the dg^T part, 3 both (one cp.async group, committed either way)
    auto issue = [&](int n, const float* dg, int parts) {
        if (n < NT && !(PK_TIMING & 1)) {
            float* const s = st + (n % SP_NS) * SP_STAGE;
            if ((parts & 1) && GRU && n >= NWT) {   // dhn's rows: no W, zeros
#pragma unroll
                for (int i = 0; i < SP_CW; ++i)   // (read by this warp only, after __syncwarp)
                    *reinterpret_cast<float4*>(s + dst_w + i * 4 * SP_PU) =
                        make_float4(0.f, 0.f, 0.f, 0.f);
            } else if (parts & 1) {
#pragma unroll
                for (int i = 0; i < SP_CW; ++i)
                    pk_cp_async16(s + dst_w + i * 4 * SP_PU,
                                  w_thr + ((long long)n * SP_KT + 4 * i) * H);
            }
            if (parts & 2) {   // the dg^T part
                if (SP_BULK) {   // the warp's SP_KPW rows of dg^T: contiguous in both
                    if (lane == 0) {
                        const pk_saddr bar = bar_w + 8u * SP_KG * (n % SP_NS);
                        pk_mbar_expect(bar, 4u * SP_KPW * SB_BMAX);
                        pk_bulk_g2s(pk_smem_addr(s + SP_XOFF + SP_KPW * warp * SB_BMAX),
                                    dg + (long long)(k0 + n * SP_KT + SP_KPW * warp) * SB_BMAX,
                                    4u * SP_KPW * SB_BMAX, bar);
                    }
                } else if (x_ok) {
                    const float* const xs =
                        dg + (long long)(k0 + n * SP_KT + kr0) * SB_BMAX + 4 * q4;
#pragma unroll
                    for (int i = 0; i < SP_CX / (3 - NH); ++i)
                        pk_cp_async16(s + dst_x + i * (6 - 2 * NH) * SB_BMAX,
                                      xs + i * (6 - 2 * NH) * SB_BMAX);
                }
            }
        }
        pk_cp_commit();
    };
    unsigned int phase = 0;   // SP_BULK: bit s, the parity of stage s's next wait
    if (SP_BULK && lane == 0) {
        for (int n = 0; n < SP_NS; ++n) pk_mbar_init(bar_w + 8u * SP_KG * n, 1);
        pk_mbar_init_fence();
    }
    __syncthreads();   // Rs is read by every warp

    // the lane: lr its rows, lb its batches, lk (NH 1) its half-warp's k rows
    const int lr = lane & 3, lb = NH == 2 ? lane >> 2 : (lane >> 2) & 3;
    const int lk = NH == 2 ? 0 : lane >> 4, k_lane = SP_KPW * warp + lk;
    const pk_saddr r_lane = pk_smem_addr(Rs) + 4u * (SP_PU * k_lane + 4 * lr);
    const pk_saddr w_lane = 4u * (SP_PU * k_lane + 4 * lr);
    const pk_saddr x_lane = 4u * (SP_XOFF + SB_BMAX * k_lane + 4 * lb);
    const pk_saddr st_a = pk_smem_addr(st);
    const unsigned int peer = cr ^ 1u;
    // Timeline (PK_TRACE): 0 step top, 1 past the wait for the layer above, 2 after the dg
    // count, 3 past the own wait, 4 past the K loop, 5 after the dx count.
    for (int s = 0; s < T; ++s) {
        const int t = T - 1 - s;
        const unsigned int done = (unsigned int)(s + 1) * NB;
        // --- the pointwise backward of step t, dg_t published (the tile aliases the
        // stages and red: the last step's cluster barrier ordered their reads before it)
        const float* const dgs =
            sb_pointwise_cell<GRU>(s, t, B, H, j0, act, ldact, c, ldc, dh_above, lddhin, dgx,
                                   lddgx, dgh, lddgh, tile, dgt, above, dg_done, done, dhrec,
                                   dcar);
        // --- the product: every block of the layer's dg_t, this block's k rows. SP_WPRE: the
        // W parts of the first tiles (no dependence on dg_t) in one group before the wait (the
        // pointwise's last __syncthreads ordered every read of the stages before)
        if (SP_WPRE) {
            for (int n = 0; n < SP_NS - 1; ++n) issue(n, dgs, 1);
        }
        if (lane == 0) {
            ps_wait(dg_done, done);
            // the stages' last generic accesses (the tile, red) before the bulk copies
            if (SP_BULK) pk_fence_async_smem();
        }
        __syncwarp();
        PS_NOTE(s, 3);
        for (int n = 0; n < SP_NS - 1; ++n) issue(n, dgs, SP_WPRE ? 2 : 3);
        float acc[SP_TM][SP_TB];
#pragma unroll
        for (int i = 0; i < SP_TM; ++i)
#pragma unroll
            for (int jb = 0; jb < SP_TB; ++jb) acc[i][jb] = 0.f;
        for (int n = 0; n < NT; ++n) {
            pk_cp_wait<SP_NS - 2>();   // tile n landed (this lane's part) ...
            if (SP_BULK && !(PK_TIMING & 1)) {   // ... and the warp's dg^T rows
                const int sn = n % SP_NS;
                pk_mbar_wait(bar_w + 8u * SP_KG * sn, (phase >> sn) & 1u);
                phase ^= 1u << sn;
            }
            __syncwarp();              // ... the warp's; the warp has read its rows of n-1
            issue(n + SP_NS - 1, dgs, 3);
            const pk_saddr sa = st_a + 4u * ((n % SP_NS) * SP_STAGE);
            sp_tile_fma<NH>(acc, r_lane + 4u * (n * SP_KT * SP_PU), sa + w_lane, sa + x_lane);
        }
        PS_NOTE(s, 4);
        pk_cp_wait<0>();
        __syncthreads();   // every tile is read: the stages become the partial sums
        // The k-groups into four partial sums red[m][b][row], row stride SP_RP: NH 2 eight
        // (the forward stack kernel's flush: warps 4..7 store, 0..3 add), NH 1 sixteen.
        ps_flush<NH>(acc, red, warp, lk, lr, lb, SP_RP);
        // The other block's units: R's rows 16(1-c) + jj and W's 32 + 16(1-c) + jj, each
        // summed over the four in order, into its recv[b][16h + jj] (h 0: R, 1: W; a warp
        // one batch's 32 consecutive values). Its recv was last read before its dg_t count,
        // which this block waited for.
        const int other = 16 * (int)peer;
        for (int e = tid; e < SB_BMAX * SP_PU; e += PK_MAX_THREADS) {
            const int b = e >> 5, hj = e & 31;
            if (b >= B) continue;
            const float* const q = red + b * SP_RP + 32 * (hj >> 4) + other + (hj & 15);
            float v = q[0];
#pragma unroll
            for (int k = 1; k < 4; ++k) v += q[k * SB_BMAX * SP_RP];
            pk_st_cluster(pk_smem_addr(recv + e), peer, v);
        }
        // release / acquire: the sends landed in the other's recv (and every thread of this
        // block is past its reads of red for the sends)
        pk_cluster_sync();
        // This block's units: its own half's sums over the four in order, plus the other
        // block's half (a fixed order: the same bits every run). red is read until the next
        // step's first __syncthreads, before the pointwise's tile overwrites it.
#pragma unroll
        for (int i = 0; i < SB_CPT; ++i) {
            int b, jj;
            sb_cell_of(tid, i, b, jj);
            if ((PK_TIMING & 8) || b >= B) continue;
            const float* const q = red + b * SP_RP + 16 * (int)cr + jj;
            float vr = q[0], vw = q[32];
#pragma unroll
            for (int k = 1; k < 4; ++k) {
                vr += q[k * SB_BMAX * SP_RP];
                vw += q[k * SB_BMAX * SP_RP + 32];
            }
            const float* const o = recv + b * SP_PU + jj;
            dhrec[i] = GRU ? (vr + o[0]) + dcar[i] : vr + o[0];   // GRU: + dh z, the carry
            __stcg(down + ((long long)t * B + b) * lddown + j0 + jj, vw + o[16]);
        }
        if (l) {   // the layer below waits for this
            __syncthreads();   // the block's dg_t W is issued
            if (tid == (SP_DXW ? PK_MAX_THREADS - 32 : 0)) {
                pk_fence_acq_rel();
                atomicAdd(dx_done, 1u);
            }
        }
        PS_NOTE(s, 5);
    }
    sb_finish_cell<GRU>(l, L, B, j0, dh0, lddh0, dc0, lddc0, sync, dhrec, dcar, groups, ldsync);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(2, 1, 1)
lstm_persistent_stack_bwd_pair(
        int rows, int cols, float* dgx, int lddgx, float* dhin, int lddhin, float* dx, int lddx,
        float* dh0, int lddh0, float* dc0, int lddc0, unsigned int* sync, int ldsync,
        float* dgt, int ldgt, const float* dh_n, int lddh_n, const float* dc_n, int lddc_n,
        const float* act, int ldact, const float* c, int ldc, const float* w_ih, int ldw_ih,
        const float* w_hh, int ldw_hh, int T, int L, int units_per_block, int groups) {
    if (rows <= SB_BMAX / 2) {   // half the batch lanes: a tile of 32 batches, half the work
        persistent_stack_bwd_pair<CELL_LSTM, 1>(
            rows, cols, dgx, lddgx, nullptr, 0, dhin, lddhin, dx, lddx, dh0, lddh0, dc0, lddc0,
            sync, dgt, ldgt, dh_n, lddh_n, dc_n, lddc_n, act, ldact, c, ldc, w_ih, ldw_ih, w_hh,
            ldw_hh, T, L, units_per_block, ldsync, groups);
        return;
    }
    persistent_stack_bwd_pair<CELL_LSTM, 2>(
        rows, cols, dgx, lddgx, nullptr, 0, dhin, lddhin, dx, lddx, dh0, lddh0, dc0, lddc0, sync,
        dgt, ldgt, dh_n, lddh_n, dc_n, lddc_n, act, ldact, c, ldc, w_ih, ldw_ih, w_hh, ldw_hh,
        T, L, units_per_block, ldsync, groups);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(2, 1, 1)
gru_persistent_stack_bwd_pair(
        int rows, int cols, float* dgx, int lddgx, float* dgh, int lddgh, float* dhin,
        int lddhin, float* dx, int lddx, float* dh0, int lddh0, unsigned int* sync, int ldsync,
        float* dgt, int ldgt, const float* dh_n, int lddh_n, const float* act, int ldact,
        const float* h, int ldh, const float* w_ih, int ldw_ih, const float* w_hh, int ldw_hh,
        int T, int L, int units_per_block, int groups) {
    if (rows <= SB_BMAX / 2) {
        persistent_stack_bwd_pair<CELL_GRU, 1>(
            rows, cols, dgx, lddgx, dgh, lddgh, dhin, lddhin, dx, lddx, dh0, lddh0, nullptr, 0,
            sync, dgt, ldgt, dh_n, lddh_n, nullptr, 0, act, ldact, h, ldh, w_ih, ldw_ih, w_hh,
            ldw_hh, T, L, units_per_block, ldsync, groups);
        return;
    }
    persistent_stack_bwd_pair<CELL_GRU, 2>(
        rows, cols, dgx, lddgx, dgh, lddgh, dhin, lddhin, dx, lddx, dh0, lddh0, nullptr, 0, sync,
        dgt, ldgt, dh_n, lddh_n, nullptr, 0, act, ldact, h, ldh, w_ih, ldw_ih, w_hh, ldw_hh, T,
        L, units_per_block, ldsync, groups);
}
