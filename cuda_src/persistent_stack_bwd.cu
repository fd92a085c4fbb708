/*
 * persistent_stack_bwd.cu: the stack kernel's backward twin (fp32): the recurrent chain of ALL L
 * layers of an LSTM stack's backward in ONE persistent launch, along the REVERSE wavefront,
 * with dx = dg.W inside the kernel. The SMs are cut into L groups of H/16 blocks as the forward
 * (persistent_stack.cu); block (l, rank) owns units J = [rank*16, rank*16 + 16) of layer l and
 * each step t (T-1 down to 0) runs the pointwise backward of its cells, then the product of
 * dg_t (all 4H gate rows, every batch) with [R_l[:, J] | W_l[:, J]]: R's half is the gradient
 * into its own units of h_t (kept in registers: the next step's dh_rec), W's half the gradient
 * into the layer below's h_{t+1} at the same units (dh_above of block (l-1, rank)), or dx for
 * layer 0. R[:, J] stays in shared memory, W[:, J] and dg_t^T stream through cp.async stages.
 * Design: docs/kernels.md ("The stack backward"); the host side (fit, NumPy twin):
 * rnnrt/kernels/stack_bwd.py.
 *
 * Batch groups, as the forward's: B = 64 * groups (whole groups only, so every cell of a group
 * is live and B is the row stride) runs as `groups` stacks side by side in the launch, each
 * with its own row of counters and block of dgt (the cluster-pair kernels likewise).
 *
 * Variants: two kernels, LSTM and GRU (one template). GRU's K = 4H product rows are dr, dz, dn
 * (n's W side) and dhn (n's R side): R's rows r, z, zeros, n and W's r, z, n, zeros (the last
 * quarter's W tiles are neither copied nor multiplied); dh_{t-1} = the R product + dh z (the
 * carried term in LSTM's dc's place); dgx and dgh written apart. Compile-time knobs for experiments (stack_bwd_bench.py
 * --define): SB_KT (k rows a staged tile: a multiple of 64; 128 with SB_NS 2 fits a block at
 * H 512), SB_NS (stages), PK_TIMING (persistent_common.cuh).
 *
 * Calling convention: as persistent.cu's (rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int L, int units_per_block,
 *          int groups),
 *   each view a (pointer, int ld) pair, row-major; `sync` is unsigned int*.
 *
 * Kernels:
 *   Views of all L layers at once: layer l's rows of dgx, dhin and act are l*T*B + t*B + b,
 *   of c l*(T+1)*B + s*B + b, of dh0, dc0, dh_n, dc_n l*B + b; input size = hidden:
 *   kernel lstm_persistent_stack_bwd(rows = B, cols = H)
 *       per layer from the top, steps T-1 .. 0: lstm_bwd's arithmetic on dh = dh_above +
 *       dh_rec (dh_rec of step T-1: dh_n), then dh_rec of step t-1 = dg_t R_l and the
 *       gradient into the input of step t = dg_t W_l (both sums over the 4H gate rows)
 *     out dgx    [L*T*B, 4H]     every layer's and step's gate gradients (for the dW GEMMs)
 *     out dhin   [L*T*B, H]      the gradient from above into each layer's h_{t+1}: layer
 *                                L-1's rows are read (dy), the others written (dg W of the
 *                                layer above)
 *     out dx     [T*B, H]        the gradient into the input sequence (layer 0's dg W)
 *     out dh0    [L*B, H]        the gradient into h0 of every layer
 *     out dc0    [L*B, H]        the gradient into c0 of every layer
 *     out sync   [groups, 2L]    row g (batch group g): word 2l layer l's dg progress
 *                                (blocks x steps done), word 2l+1 (l >= 1) its dx progress;
 *                                row 0 word 1: blocks gone. Zero on entry, zero on exit
 *     out dgt    [groups*8*L*H, 64]  scratch, ld 64: dg_t^T k-major, two slots a layer
 *                                and batch group (slot (g*L + l)*2 + (t & 1) of 4H rows, row
 *                                k: the group's batches)
 *     in  dh_n   [L*B, H]        the gradient into the last h of every layer
 *     in  dc_n   [L*B, H]        the gradient into the last c of every layer
 *     in  act    [L*T*B, 4H]     the forward's gates i, f, g, o
 *     in  c      [L*(T+1)*B, H]  the forward's c (slot 0 = c0)
 *     in  w_ih   [L, 4*H*H]      row l: layer l's weight_ih [4H, H], row-major (ld: the
 *                                distance between layers in the flat parameters)
 *     in  w_hh   [L, 4*H*H]      row l: layer l's weight_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        U = 16
 *     int groups                 batch groups: 1 (B <= 64) or B / 64 (whole groups)
 *   kernel gru_persistent_stack_bwd(rows = B, cols = H)
 *       per layer from the top, steps T-1 .. 0: gru_bwd's arithmetic on dh = dh_above +
 *       dh_rec, then dh_rec of step t-1 = [dr dz dn dhn] [R_r; R_z; 0; R_n] + dh z and the
 *       gradient into the input of step t = [dr dz dn dhn] [W_r; W_z; W_n; 0]
 *     out dgx    [L*T*B, 3H]     every layer's and step's W-side gate gradients dr, dz, dn
 *     out dgh    [L*T*B, 3H]     the R side's: dr, dz, dhn (for the dW_hh GEMMs)
 *     out dhin   [L*T*B, H]      as lstm_persistent_stack_bwd's
 *     out dx     [T*B, H]        the gradient into the input sequence
 *     out dh0    [L*B, H]        the gradient into h0 of every layer
 *     out sync   [groups, 2L]    as lstm_persistent_stack_bwd's
 *     out dgt    [groups*8*L*H, 64]  scratch: [dr dz dn dhn]^T k-major, two slots a layer
 *                                and batch group
 *     in  dh_n   [L*B, H]        the gradient into the last h of every layer
 *     in  act    [L*T*B, 4H]     the forward's r, z, n, hn
 *     in  h      [L*(T+1)*B, H]  the forward's h (slot 0 = h0)
 *     in  w_ih   [L, 3*H*H]      row l: layer l's weight_ih [3H, H]
 *     in  w_hh   [L, 3*H*H]      row l: layer l's weight_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        U = 16
 *     int groups                 as lstm_persistent_stack_bwd's
 *
 * Resources (sm_90, nvcc 13.0): 237 registers (LSTM; GRU 225), no spills (rnnrt.kernels.stack_bwd.SB_REGS = 255,
 *   the fit's: tests hold nvcc's and NVRTC's builds to it) under
 *   __launch_bounds__(PK_MAX_THREADS = 256, 1);
 *   dynamic shared memory 4H*16*4 (R slice) + SB_NS * 20,544 (stages): 192,704 bytes at H 512.
 */
// SB_U, SB_BMAX, SB_TP, SB_CPT, the pointwise, the finish:
#include "persistent_stack_bwd.cuh"

// Block x is layer l = x / NB, rank x % NB (NB = H / SB_U blocks a layer), as the forward.
// Its product each step is [R_l[:, J] | W_l[:, J]]^T (SB_M = 32 rows) x dg_t^T (4H x B):
// every operand k-major (a k's 16 units of R, of W, a k's 64 batches contiguous), so a lane's
// step is an outer product per k from 6 float4 loads (16 rows x 8 batches, 128 FMAs: the
// forward's tile; a warp's two half-warps take alternate k rows).
#define SB_M (2 * SB_U)            // product rows: R's 16 columns, then W's
#define SB_TM 16                   // register tile: rows a lane accumulates (4 float4s)
#define SB_TB 8                    // register tile: batches a lane accumulates (2 float4s)
#ifndef SB_KT                      // (overridable for experiments; rnnrt.kernels.stack_bwd
#define SB_KT 64                   //  mirrors the defaults; a test holds them)
#endif                             // k rows of a staged tile
#ifndef SB_NS
#define SB_NS 3                    // pipeline stages (tiles in flight: SB_NS - 1)
#endif
#define SB_KG (PK_MAX_THREADS / 32)   // k-groups (8): one a warp, each the block's 32 x 64
#define SB_KPW (SB_KT / SB_KG)     // k rows of a tile a warp takes (8: 4 a half-warp)
// One stage: 4 floats of padding (a quarter warp's R and W loads of one k row then hit
// different banks), W's part [SB_KT][16], dg^T's [SB_KT][64], padding to a multiple of 16
// floats (every stage at 0 or 16 mod 32 banks, so the 4-float shift holds in each)
#define SB_WOFF 4                  // the W part's offset in a stage
#define SB_XOFF (SB_WOFF + SB_KT * SB_U)   // the dg^T part's
#define SB_STAGE ((SB_XOFF + SB_KT * SB_BMAX + 15) / 16 * 16)
#define SB_RP 36                   // stride of a batch's partial sums (see the flush)
static_assert(4 * SB_BMAX * SB_RP <= SB_NS * SB_STAGE, "the partial sums reuse the stages");
static_assert(4 * SB_U * SB_TP <= SB_NS * SB_STAGE, "the dg^T tile reuses the stages");
static_assert(SB_KPW % 8 == 0 && SB_KT % SB_KG == 0, "a warp's rows: 32 lanes x SB_KPW / 8 W "
              "float4s, x SB_KPW / 2 dg float4s; SB_KPW / 2 a half-warp");
#define SB_CW (SB_KPW / 8)         // W float4s a lane copies of a tile
#define SB_CX (SB_KPW / 2)         // dg^T float4s a lane copies of a tile
static_assert(SB_STAGE % 16 == 0 && SB_XOFF % 4 == 0, "16-byte rows, stages at 0 / 16 banks");

// acc += A^T[k]^T X^T[k] over the half-warp's SB_KPW / 2 k rows of one staged tile (rows
// lk, lk + 2, ... of the warp's: lk = lane / 16). a and x are the shared addresses of the
// lane's first float4 at its first k row: of R's slice (lr = 0) or the stage's W part (lr =
// 1), and of the stage's dg^T part; the lane's rows are 16lr + 4g + e (its 16 columns of R
// or of W: float4 g < 4), its batches 32h + 4lb + f (float4 h < 2). The next k's six
// float4s are loaded before this k's 128 FMAs.
__device__ __forceinline__ void sb_tile_fma(float (&acc)[SB_TM][SB_TB], pk_saddr a,
                                            pk_saddr x) {
    if (PK_TIMING & 2) return;
    constexpr unsigned int da = 2u * 4u * SB_U, dx = 2u * 4u * SB_BMAX;   // two k rows
    float4 av[4], xv[2], an[4], xn[2];
#pragma unroll
    for (int g = 0; g < 4; ++g) av[g] = pk_lds128(a + 16u * g);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) xv[hh] = pk_lds128(x + 128u * hh);
#pragma unroll
    for (int kk = 0; kk < SB_KPW / 2; ++kk) {
        if (kk + 1 < SB_KPW / 2) {
#pragma unroll
            for (int g = 0; g < 4; ++g) an[g] = pk_lds128(a + da * (kk + 1) + 16u * g);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) xn[hh] = pk_lds128(x + dx * (kk + 1) + 128u * hh);
        }
        ps_outer(acc, av, xv);
        if (kk + 1 < SB_KPW / 2) {
#pragma unroll
            for (int g = 0; g < 4; ++g) av[g] = an[g];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) xv[hh] = xn[hh];
        }
    }
}

// One layer-block of the stack's backward. Views as the header's lstm_persistent_stack_bwd;
// GRU (CELL_GRU): dgh beside dgx, c is the forward's h (slot t: h_{t-1} of step t), no dc0 or
// dcn (dc0 aliases dh0, dcn is unread), the product's K = 4H rows dr, dz, dn, dhn against R's
// rows (r, z, zeros, n) and W's (r, z, n, zeros: the last quarter's tiles are not copied or
// multiplied), dh_{t-1} = the R product + dh z.
template <int CELL>
__device__ __forceinline__ void persistent_stack_bwd(
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
    const int K = 4 * H;                  // the product's depth: the gate rows
    const int NT = K / SB_KT;             // tiles a step
    const int NW = GRU ? 3 * H / SB_KT : NT;   // tiles with W rows (GRU: dhn's have none)
    const int nbc = (B + 3) / 4;          // float4s of a dgt row that hold batches
    // Batch groups (the forward's): blocks [g*L*NB, (g+1)*L*NB) run batches [64g, 64g + 64)
    // with their own row g of the counters and block of dgt. Every group is full (B = 64
    // groups), so B is the row stride here and the helpers' b < B holds for every cell.
    const int NBL = max(L * NB, 1);       // blocks a group (L checked below)
    const int grp = blockIdx.x / NBL, bx = blockIdx.x - grp * NBL;
    const long long need = 4LL * ((long long)K * U + SB_NS * SB_STAGE);
    auto aligned = [](const void* p) {
        return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
    };
    if (blockDim.x != PK_MAX_THREADS || u_arg != U || K % SB_KT != 0 || H % U != 0 || B < 1 ||
        (GRU && (3 * H) % SB_KT != 0) ||
        groups < 1 || (groups == 1 ? B > SB_BMAX : B != groups * SB_BMAX) ||
        ldsync < 2LL * L || L < 1 || T < 1 || (long long)gridDim.x != (long long)groups * NBL ||
        (long long)dynamic_smem_bytes() < need || ldgt != SB_BMAX || !aligned(dgt) ||
        !aligned(wih) || !aligned(whh) || ldwih % 4 || ldwhh % 4)
        __trap();
    const int l = bx / NB, j0 = (bx % NB) * U;
    unsigned int* const dg_done = sync + grp * ldsync + 2 * l;   // this layer's dg_t published
    unsigned int* const dx_done = dg_done + 1;             // ... its dg_t W (l >= 1)
    const unsigned int* const above = l + 1 < L ? dg_done + 3 : nullptr;   // 2(l+1) + 1
    const long long TB = (long long)T * B, b0 = (long long)grp * SB_BMAX;
    act += (l * TB + b0) * ldact;
    c += (l * (TB + B) + b0) * ldc;
    dgx += (l * TB + b0) * lddgx;
    if (GRU) dgh += (l * TB + b0) * lddgh;
    const float* const dh_above = dhin + (l * TB + b0) * lddhin;   // layer L-1's: dy (read)
    // where dg_t W goes: the layer below's dh_above, or dx
    float* const down = l ? dhin + ((l - 1) * TB + b0) * lddhin : dx + b0 * lddx;
    const long long lddown = l ? lddhin : lddx;
    dgt += ((long long)grp * L + l) * 2 * K * ldgt;
    dhn += b0 * lddhn;
    if (!GRU) dcn += b0 * lddcn;
    dh0 += b0 * lddh0;
    if (!GRU) dc0 += b0 * lddc0;
    wih += l * ldwih;
    whh += l * ldwhh;

    float* const Rs = smem;                        // [4H][U]: R[:, J], k-major
    float* const st = Rs + K * U;                  // [SB_NS][SB_STAGE] stages
    float* const red = st;                         // [4][SB_BMAX][SB_RP], after the K loop
    float* const tile = st;                        // [4U][SB_TP]: dg_t^T of the block's rows

    // The R slice, once: Rs[k][ju] = R[k, j0 + ju] (a row of R's 16 columns is 4 float4s);
    // GRU: rows dr, dz as R's, zeros for dn (n's W side), R's n rows for dhn
    for (int e = tid; e < K * (U / 4); e += PK_MAX_THREADS) {
        const int k = e / (U / 4), q = e % (U / 4);
        *reinterpret_cast<float4*>(Rs + k * U + 4 * q) =
            GRU ? sb_gru_r4(whh, k, H, j0 + 4 * q)
                : __ldg(reinterpret_cast<const float4*>(whh + (long long)k * H + j0 + 4 * q));
    }

    // Carried in registers: dh_rec (the R half of the last product: the block's own units)
    // and dc of the thread's cells (sb_cell_of).
    float dhrec[SB_CPT], dcar[SB_CPT];
    sb_cells_init(l, B, j0, dhn, lddhn, GRU ? dhn : dcn, GRU ? lddhn : lddcn, dhrec, dcar);

    // The float4s this thread copies of each tile: each warp copies only the SB_KPW k rows of
    // a tile it multiplies (no block barrier in the K loop, as the forward). W part: k rows
    // krw + 8i (i < SB_CW), float4 lane % 4 of the 16 columns at j0; dg^T part: k rows
    // kr0 + 2i (i < SB_CX), float4 q4 = lane % 16 (batches 4*q4, only float4s below nbc).
    // One cp.async group a tile (empty past the last).
    const int krw = SB_KPW * warp + (lane >> 2), qw = lane & 3;
    const float* const w_thr = wih + (long long)krw * H + j0 + 4 * qw;
    const int dst_w = SB_WOFF + krw * U + 4 * qw;
    const int kr0 = SB_KPW * warp + (lane >> 4), q4 = lane & 15;
    const int dst_x = SB_XOFF + kr0 * SB_BMAX + 4 * q4;
    const bool x_ok = q4 < nbc;
    auto issue = [&](int n, const float* dg) {
        if (n < NT && !(PK_TIMING & 1)) {
            float* const s = st + (n % SB_NS) * SB_STAGE;
            if (!GRU || n < NW) {
#pragma unroll
                for (int i = 0; i < SB_CW; ++i)
                    pk_cp_async16(s + dst_w + i * 8 * U,
                                  w_thr + ((long long)n * SB_KT + 8 * i) * H);
            }
            if (x_ok) {
                const float* const xs = dg + (long long)(n * SB_KT + kr0) * SB_BMAX + 4 * q4;
#pragma unroll
                for (int i = 0; i < SB_CX; ++i)
                    pk_cp_async16(s + dst_x + i * 2 * SB_BMAX, xs + i * 2 * SB_BMAX);
            }
        }
        pk_cp_commit();
    };
    __syncthreads();   // Rs is read by every warp

    // The lane: lk = lane / 16 its k rows (lk, lk + 2, .. of the warp's), lr = lane % 2 its
    // 16 rows (R's columns or W's), lb = lane / 2 % 8 its batches (a quarter warp: lr 0, 1
    // and lb 0..3 of one k row: 2 A float4s in different banks, 4 contiguous dg^T float4s)
    const int lk = lane >> 4, lr = lane & 1, lb = (lane >> 1) & 7;
    const int k_lane = SB_KPW * warp + lk;   // the lane's first k row of a tile
    const pk_saddr r_lane = pk_smem_addr(Rs) + 4u * U * k_lane;
    const pk_saddr w_lane = 4u * (SB_WOFF + U * k_lane);
    const pk_saddr x_lane = 16u * lb + 4u * (SB_XOFF + SB_BMAX * k_lane);
    const pk_saddr st_a = pk_smem_addr(st);
    // Timeline (PK_TRACE, PS_NOTE: persistent_common.cuh), at the s-th step: 0 step top, 1
    // past the wait for the layer above, 2 after the dg count, 3 past the own wait, 4 past
    // the K loop, 5 after the dx count (the sums and dx stored).
    for (int s = 0; s < T; ++s) {
        const int t = T - 1 - s;
        const unsigned int done = (unsigned int)(s + 1) * NB;   // counts after step t
        // --- the pointwise backward of step t, dg_t published
        const float* const dgs =
            sb_pointwise_cell<GRU>(s, t, B, H, j0, act, ldact, c, ldc, dh_above, lddhin, dgx,
                                   lddgx, dgh, lddgh, tile, dgt, above, dg_done, done, dhrec,
                                   dcar);

        // --- the product of step t: [R | W][:, J]^T dg_t^T, every block of the layer's
        // dg_t (each warp waits for itself: it issues and reads only its own rows)
        if (lane == 0) ps_wait(dg_done, done);
        __syncwarp();
        PS_NOTE(s, 3);
        for (int n = 0; n < SB_NS - 1; ++n) issue(n, dgs);
        float acc[SB_TM][SB_TB];
#pragma unroll
        for (int i = 0; i < SB_TM; ++i)
#pragma unroll
            for (int jb = 0; jb < SB_TB; ++jb) acc[i][jb] = 0.f;
        for (int n = 0; n < NT; ++n) {
            pk_cp_wait<SB_NS - 2>();   // tile n landed (this lane's part) ...
            __syncwarp();              // ... the warp's; the warp has read its rows of n-1
            issue(n + SB_NS - 1, dgs);
            const pk_saddr sa = st_a + 4u * ((n % SB_NS) * SB_STAGE);
            if (!GRU || !lr || n < NW)   // (GRU: no W rows for dhn's tiles)
                sb_tile_fma(acc, lr ? sa + w_lane : r_lane + 4u * (n * SB_KT * U), sa + x_lane);
        }
        PS_NOTE(s, 4);
        pk_cp_wait<0>();
        __syncthreads();   // every tile is read: the stages become the partial sums
        // Sixteen half-warp partial sums into four, in four passes: (warps 4..7, lk = 1)
        // store theirs, then (4..7, lk = 0), (0..3, 1), (0..3, 0) add theirs in place.
        // red[m][b][row], row stride SB_RP: a quarter warp's 16-byte accesses (lr 0, 1, lb
        // 0..3: batches 4 apart, 4 * SB_RP = 16 mod 32 banks) meet two at a bank at most.
        for (int pass = 0; pass < 4; ++pass) {
            if ((warp >= 4) == (pass < 2) && lk == 1 - (pass & 1)) {
                float* const r0 = red + (warp & 3) * SB_BMAX * SB_RP + 16 * lr;
#pragma unroll
                for (int g = 0; g < 4; ++g)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                        for (int f = 0; f < 4; ++f) {
                            float4* const p = reinterpret_cast<float4*>(
                                r0 + (32 * hh + 4 * lb + f) * SB_RP + 4 * g);
                            float4 v = make_float4(acc[4 * g][4 * hh + f],
                                                   acc[4 * g + 1][4 * hh + f],
                                                   acc[4 * g + 2][4 * hh + f],
                                                   acc[4 * g + 3][4 * hh + f]);
                            if (pass > 0) {
                                const float4 o = *p;
                                v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
                            }
                            *p = v;
                        }
            }
            __syncthreads();
        }
        // Each cell's sums over the 4 partials in order: R's row jj is the next step's
        // dh_rec (this block's own units), W's row U + jj the gradient into the input of
        // step t at unit j0 + jj (the layer below's dh_above, or dx).
#pragma unroll
        for (int i = 0; i < SB_CPT; ++i) {
            int b, jj;
            sb_cell_of(tid, i, b, jj);
            if ((PK_TIMING & 8) || b >= B) continue;
            const float* const p = red + b * SB_RP + jj;
            float vr = p[0], vw = p[U];
#pragma unroll
            for (int k = 1; k < 4; ++k) {
                vr += p[k * SB_BMAX * SB_RP];
                vw += p[k * SB_BMAX * SB_RP + U];
            }
            dhrec[i] = GRU ? vr + dcar[i] : vr;   // GRU: + dh z, this step's carry
            __stcg(down + ((long long)t * B + b) * lddown + j0 + jj, vw);
        }
        if (l) {   // the layer below waits for this
            __syncthreads();   // the block's dg_t W is issued (and red is read)
            if (tid == 0) {
                pk_fence_acq_rel();
                atomicAdd(dx_done, 1u);
            }
        }
        PS_NOTE(s, 5);
        // (layer 0: the next step's first __syncthreads orders red's reads before the tile)
    }
    sb_finish_cell<GRU>(l, L, B, j0, dh0, lddh0, dc0, lddc0, sync, dhrec, dcar, groups, ldsync);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_stack_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dhin, int lddhin, float* dx, int lddx,
        float* dh0, int lddh0, float* dc0, int lddc0, unsigned int* sync, int ldsync,
        float* dgt, int ldgt, const float* dh_n, int lddh_n, const float* dc_n, int lddc_n,
        const float* act, int ldact, const float* c, int ldc, const float* w_ih, int ldw_ih,
        const float* w_hh, int ldw_hh, int T, int L, int units_per_block, int groups) {
    persistent_stack_bwd<CELL_LSTM>(rows, cols, dgx, lddgx, nullptr, 0, dhin, lddhin, dx, lddx,
                                    dh0, lddh0, dc0, lddc0, sync, dgt, ldgt, dh_n, lddh_n, dc_n,
                                    lddc_n, act, ldact, c, ldc, w_ih, ldw_ih, w_hh, ldw_hh, T, L,
                                    units_per_block, ldsync, groups);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_stack_bwd(
        int rows, int cols, float* dgx, int lddgx, float* dgh, int lddgh, float* dhin,
        int lddhin, float* dx, int lddx, float* dh0, int lddh0, unsigned int* sync, int ldsync,
        float* dgt, int ldgt, const float* dh_n, int lddh_n, const float* act, int ldact,
        const float* h, int ldh, const float* w_ih, int ldw_ih, const float* w_hh, int ldw_hh,
        int T, int L, int units_per_block, int groups) {
    persistent_stack_bwd<CELL_GRU>(rows, cols, dgx, lddgx, dgh, lddgh, dhin, lddhin, dx, lddx,
                                   dh0, lddh0, nullptr, 0, sync, dgt, ldgt, dh_n, lddh_n,
                                   nullptr, 0, act, ldact, h, ldh, w_ih, ldw_ih, w_hh, ldw_hh, T,
                                   L, units_per_block, ldsync, groups);
}
