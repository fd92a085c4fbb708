/*
 * persistent_stack.cu: the stack kernel (forward, fp32): ALL L layers of an LSTM or GRU stack in
 * ONE persistent launch, along the wavefront, with W.x inside the kernel. The SMs are cut into L
 * groups of H/16 blocks, one group a layer, all resident at once; each block keeps its 64 gate
 * rows of R in shared memory, streams its rows of W^T and the inputs k-major through
 * cp.async stages, and waits on per-layer progress counters (layer l's step t after layer
 * l-1's step t and its own step t-1). Design: docs/kernels.md ("The stack kernel"); the host
 * side (fit, NumPy twin): rnnrt/kernels/stack.py.
 *
 * Batch groups: B > 64 runs as `groups` = ceil(B / 64) stacks side by side in one launch
 * (blocks [g*L*NB, (g+1)*L*NB) batches [64g, 64g + 64), each group with its own progress
 * counters and k-major inputs; one W^T, one prologue), where they all fit on the SMs at once.
 *
 * Variants: two kernels (LSTM, GRU), each with two paths chosen at run time per group: more than 32
 * batches, the register tile over 64 batch lanes; at most 32, over 32 (a half-warp a k-group on
 * alternate k rows: half the FMAs). GRU runs the LSTM's tile of 4 row groups of U = 16 units: r, z,
 * n's W.x part and n's R.h part (n = tanh(W_n x + b_in + r (R_n h + b_hn)) keeps the two apart), so
 * the group of each half that the other half owns is zero (W's 4th group: zero columns the prologue
 * writes into wt; R's 3rd: zero rows of the shared R slice) and its tiles skip that group
 * (ps_tile_fma's SKIP: 96 FMAs a k, not 128), for the same tile, waits and pipeline as LSTM.
 * Compile-time knobs for experiments (experiments/scripts/stack_bench.py --define): PS_KT (k rows
 * a staged tile), PS_NS (stages), PK_SLACK (steps the layer below must be ahead), PS_FAST_CELL (1:
 * approximate exp / division in the cell, ~1e-6 relative; 0: the precise sigmoidf / tanhf; both in
 * persistent_stack.cuh, shared with the tensor-core stack kernel), PK_TRACE (a %globaltimer
 * timeline), PK_TIMING (persistent_common.cuh).
 *
 * Calling convention: as persistent.cu's (rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int L, int units_per_block,
 *          int groups),
 *   each view a (pointer, int ld) pair, row-major; `sync` is unsigned int*.
 *
 * Kernels:
 *   Views of all L layers at once: layer l's rows of h and c are
 *   l*(T+1)*B + s*B + b, of act l*T*B + t*B + b; input size = hidden):
 *   kernel lstm_persistent_stack_fwd(rows = B, cols = H)
 *       pre = (sum_k W_l[r, k] in_t[b, k] + sum_k R_l[r, k] h_t[b, k]) + b_ih + b_hh, then
 *       lstm_fwd's arithmetic; in_t = x_t for layer 0, layer l-1's h_{t+1} above it
 *     out h      [L*(T+1)*B, H]  slot 0 of every layer (h0) is read; slots 1..T written
 *     out c      [L*(T+1)*B, H]  likewise (c0)
 *     out act    [L*T*B, 4H]     i, f, g, o of every layer and step
 *     out sync   [groups, 2L]    word 2l of row g: layer l's progress in batch group g
 *                                (blocks x steps done); row 0 word 1: blocks gone, word 3:
 *                                blocks past the prologue. Zero on entry, zero on exit (so
 *                                L >= 2)
 *     out wt     [L*H, 4H]       scratch: each layer's W^T (the prologue writes it)
 *     out ht     [groups*(L+1)*(T+1)*H, 64]  scratch, ld 64: the k-major inputs of each
 *                                group, slot m*(T+1) + s of H rows (row k: the group's
 *                                batches): m = 0 x_{s-1}^T, m = l+1 layer l's h_s^T (slot 0 =
 *                                h0^T from the prologue)
 *     in  x      [T*B, H]        the input sequence
 *     in  w_ih   [L, 4*H*H]      row l: layer l's weight_ih [4H, H], row-major (ld: the
 *                                distance between layers in the flat parameters)
 *     in  w_hh   [L, 4*H*H]      row l: layer l's weight_hh
 *     in  bw     [L, 4H]         b_ih of each layer (ld 0: one row for all)
 *     in  br     [L, 4H]         b_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        U: G*U = PS_M rows a block (16)
 *     int groups                 batch groups: ceil(B / 64)
 *   kernel gru_persistent_stack_fwd(rows = B, cols = H)
 *       per row group (r, z, n's W part, n's R part) pre = the W.in sum (zero for n's R
 *       part) + the R.h sum (zero for n's W part) + its biases, then gru_fwd's arithmetic
 *     out h      [L*(T+1)*B, H]  slot 0 of every layer (h0) is read; slots 1..T written
 *     out act    [L*T*B, 4H]     r, z, n, hn = R_n h + b_hn of every layer and step
 *     out sync   [groups, 2L]    as lstm_persistent_stack_fwd's
 *     out wt     [L*H, 4H]       scratch: each layer's W^T in columns [0, 3H), zeros in
 *                                [3H, 4H) (the prologue writes both)
 *     out ht     [groups*(L+1)*(T+1)*H, 64]  scratch, ld 64: the k-major inputs, as above
 *     in  x      [T*B, H]        the input sequence
 *     in  w_ih   [L, 3*H*H]      row l: layer l's weight_ih [3H, H] (r, z, n), row-major
 *     in  w_hh   [L, 3*H*H]      row l: layer l's weight_hh
 *     in  bw     [L, 3H]         b_ih of each layer (ld 0: one row for all)
 *     in  br     [L, 3H]         b_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        U = 16
 *     int groups                 batch groups: ceil(B / 64)
 *
 * Resources (sm_90, nvcc 13.0): 253-255 registers (nvcc / NVRTC; rnnrt.kernels.stack.PS_REGS
 *   = 255, no spills: tests hold both) under __launch_bounds__(PK_MAX_THREADS = 256, 1);
 *   dynamic shared memory H*64*4 (R) + PS_NS * 32 KB (stages) + 512 (biases): 229,888
 *   bytes at H 512.
 */
#include "persistent_common.cuh"
#include "persistent_stack.cuh"

// The stack kernel: ALL L layers of an LSTM stack in ONE launch, along the wavefront (see
// docs/kernels.md, "The stack kernel"). Block x is layer l = x / NB, rank x % NB (NB = H / U blocks
// a layer); it owns units [rank*U, rank*U + U) of its layer with all G gate rows (M = G*U =
// PS_M rows) and each step computes [W_l | R_l] rows x [in_t ; h_t] for every batch: W.x
// inside the kernel, R.h from the R slice it keeps in shared memory. Every operand is held
// k-major (a k's 64 rows, a k's 64 batches contiguous), so a lane's step is an outer product
// per k from 6 float4 loads; the kernel writes the k-major copies itself: W^T (wt) and the
// inputs' transposes (ht) in a prologue, each step's h^T beside h.
#define PS_M 64                    // rows of a block: G*U (LSTM: 16 units x 4 gates)
#define PS_BMAX 64                 // most batches (and the width of an ht row)
#define PS_TM 16                   // register tile: rows a lane accumulates (4 float4s)
#define PS_TB 8                    // register tile: batches a lane accumulates (2 float4s)
#ifndef PS_KT                      // (overridable for experiments: stack_bench.py --define;
#define PS_KT 64                   //  rnnrt.kernels.stack mirrors the defaults; a test holds them)
#endif                             // k rows of a staged tile
#ifndef PS_NS
#define PS_NS 3                    // pipeline stages (tiles in flight: PS_NS - 1)
#endif
#define PS_KG (PK_MAX_THREADS / 32)   // k-groups (8): one a warp, each the block's 64 x 64
#define PS_KPW (PS_KT / PS_KG)     // k rows of a tile a warp takes (8)
#define PS_RP 68                   // stride of a batch's partial sums (see the flush)
#define PS_CPT 4                   // pointwise cells a thread: U * B / PK_MAX_THREADS at most
#define PS_STAGE (2 * PS_KT * PS_M)   // floats of one stage: A^T [KT][64], then X^T [KT][64]
#define PS_CH (PS_KT * (PS_M / 4) / PK_MAX_THREADS)   // float4s of a tile's A a thread copies
static_assert(PS_M == PS_BMAX, "A^T and X^T rows have one width (one cp.async mapping)");
static_assert(4 * PS_BMAX * PS_RP <= PS_NS * PS_STAGE, "the partial sums reuse the stages");
static_assert(PS_KT % PS_KG == 0 && PS_CH >= 1, "whole k rows a warp, whole chunks a thread");
// Timeline (PK_TRACE, PS_NOTE: persistent_common.cuh): 0 step top, 1 past the top waits,
// 2 before the own wait, 3 past it, 4 past the K loop, 5 after the count.
// out[cc, r] = in[r, cc] for r < rows, cc < cols over the 32 x 32 tile at (r0, c0), through
// the shared tile s (32 x 33: conflict-free both ways); every thread of the block calls it.
__device__ __forceinline__ void ps_transpose_tile(const float* in, long long ldi, float* out,
                                                  long long ldo, int rows, int cols, int r0,
                                                  int c0, float* s) {
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    for (int i = ty; i < 32; i += PK_MAX_THREADS / 32) {
        const int r = r0 + i, cc = c0 + tx;
        s[i * 33 + tx] = (r < rows && cc < cols) ? __ldg(in + r * ldi + cc) : 0.f;
    }
    __syncthreads();
    for (int i = ty; i < 32; i += PK_MAX_THREADS / 32) {
        const int cc = c0 + i, r = r0 + tx;
        if (cc < cols && r < rows) out[cc * ldo + r] = s[tx * 33 + i];
    }
    __syncthreads();   // s is free for the next tile
}

// acc += A^T[k]^T X^T[k] over the lane's k rows of one staged tile: with NH = 2 (B > 32)
// the warp's PS_KPW rows, with NH = 1 (B <= 32) its half-warp's, every second one (half-warp
// lk takes rows lk, lk + 2, ..: the 32 lanes cover 64 rows x 32 batches twice). a and x are
// the shared addresses of the lane's first float4 at its first k row: the lane's rows are
// 16g + 4lr + e (float4 g < 4 of a 64-float row), its batches 32h + 4lb + f (NH 2) or 16h +
// 4lb + f (NH 1) (float4 h < 2). The next k's six float4s are loaded before this k's 128
// FMAs. SKIP (0..3): row group SKIP's A rows are zero in this tile (GRU: n's R group in the
// input's tiles, n's W group in h's): neither loaded nor multiplied, a quarter of the FMAs
// (its sums keep what they hold: += 0 x in would have added nothing).
template <int NH, int SKIP = -1>
__device__ __forceinline__ void ps_tile_fma(float (&acc)[PS_TM][PS_TB], pk_saddr a,
                                            pk_saddr x) {
    if (PK_TIMING & 2) return;
    constexpr int rows = NH == 2 ? PS_KPW : PS_KPW / 2;   // k rows of the tile the lane takes
    constexpr unsigned int dk = (3 - NH) * 4u * PS_M;     // bytes to its next k row
    constexpr unsigned int xh = NH * 64u;                 // bytes to its second batch float4
    float4 av[4], xv[2], an[4], xn[2];
#pragma unroll
    for (int g = 0; g < 4; ++g)
        if (g != SKIP) av[g] = pk_lds128(a + 64u * g);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) xv[hh] = pk_lds128(x + xh * hh);
#pragma unroll
    for (int kk = 0; kk < rows; ++kk) {
        if (kk + 1 < rows) {
            const pk_saddr row = dk * (kk + 1);
#pragma unroll
            for (int g = 0; g < 4; ++g)
                if (g != SKIP) an[g] = pk_lds128(a + row + 64u * g);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) xn[hh] = pk_lds128(x + row + xh * hh);
        }
        ps_outer<SKIP>(acc, av, xv);
        if (kk + 1 < rows) {
#pragma unroll
            for (int g = 0; g < 4; ++g)
                if (g != SKIP) av[g] = an[g];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) xv[hh] = xn[hh];
        }
    }
}

// One layer-block of the stack. Views as the header's lstm_persistent_stack_fwd; layer l's
// rows: h and c at ((l*(T+1) + s)*B + b), act at ((l*T + t)*B + b), W / R / biases at row l;
// wt: layer l's W^T at rows [l*H, l*H + H) (ldwt >= 4H); ht: the k-major inputs, slot
// (m*(T+1) + s) of H rows of ldht floats (row k = batches): m = 0 the input x (slot t+1 =
// x_t^T), m = l+1 layer l's h (slot s = h_s^T).
template <int G, int CELL, int NH>
__device__ __forceinline__ void persistent_stack_fwd(
        int B, int H, float* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, long long ldsync, float* wt, long long ldwt,
        float* ht, long long ldht, const float* x, long long ldx, const float* wih,
        long long ldwih, const float* whh, long long ldwhh, const float* bw, long long ldbw,
        const float* br, long long ldbr, int T, int L, int u_arg, int groups) {
    static_assert(CELL == CELL_LSTM || CELL == CELL_GRU, "the stack kernel: LSTM and GRU");
    static_assert(G == 4, "four row groups of U units (GRU: r, z, n's W part, n's R part)");
    constexpr bool GRU = CELL == CELL_GRU;
    constexpr int GW = GRU ? 3 : 4;       // gate rows (of H) of W and R in the parameters
    // U is fixed by the tile (the argument must agree): divisions by it are shifts, and the
    // cells' indices are recomputed each step instead of held in registers (NVRTC spilled)
    constexpr int U = PS_M / G;
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int NB = H / U;                 // blocks a layer
    const int NK = H / PS_KT;             // tiles of one K half (input size = hidden)
    // Batch groups: blocks [g*L*NB, (g+1)*L*NB) run batches [64g, 64g + Bn) as a stack of
    // their own (their own progress counters, row g of sync, and k-major inputs, block g of
    // ht; one W^T for all), B the row stride of h, c, act and x. (Every block's pointers to
    // the group's counters and ht are derived ones, which it holds anyway: at the register
    // limit, a group offset kept live beside them spilled.)
    const int NBL = max(L * NB, 1);       // blocks a group (L checked below)
    const int grp = blockIdx.x / NBL, bx = blockIdx.x - grp * NBL;
    const int Bn = min(PS_BMAX, B - grp * PS_BMAX);   // this group's batches
    const int nbc = (Bn + 3) / 4;         // float4s of an ht row that hold batches
    const long long need = 4LL * ((long long)H * PS_M + PS_NS * PS_STAGE + 2 * PS_M);
    auto aligned = [](const void* p) {
        return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
    };
    if (blockDim.x != PK_MAX_THREADS || u_arg != U || H % PS_KT != 0 || H % U != 0 ||
        groups < 1 || B <= (groups - 1) * PS_BMAX || B > groups * PS_BMAX || L < 2 ||
        (long long)gridDim.x != (long long)groups * NBL ||
        (long long)dynamic_smem_bytes() < need || ldwt < 4LL * H || ldwt % 4 ||
        ldht != PS_BMAX || ldsync < 2LL * L || !aligned(wt) || !aligned(ht))
        __trap();
    const int l = bx / NB, j0 = (bx % NB) * U;
    const long long S1 = (long long)(T + 1) * B;       // rows of one layer's h and c
    const long long HS = (long long)H * PS_BMAX;       // floats of one ht slot
    const long long GS = (long long)(L + 1) * (T + 1) * HS;   // floats of a group's ht
    unsigned int* const mine = sync + grp * ldsync + 2 * l;      // this layer's progress
    const unsigned int* const lower = l ? mine - 2 : nullptr;
    unsigned int* const ready = sync + 3;   // prologue arrivals, every group's (row 0 word 3)

    float* const Rs = smem;                        // [H][PS_M]: R slice, k-major
    float* const st = Rs + H * PS_M;               // [PS_NS][PS_STAGE] stages
    float* const red = st;                         // [4][PS_BMAX][PS_RP], after the K loop
    float* const bias = st + PS_NS * PS_STAGE;     // [2][PS_M]: b_ih, b_hh of the block's rows

    // Prologue, every block of every group a share (32 x 32 tiles through the stages): W^T
    // of every layer, and for each group x_t^T into its ht slot t+1 of m = 0, h0^T into slot
    // 0 of m = l+1. Then one arrival on `ready`; every block waits for all of them before its
    // first step (all resident).
    {
        // (GRU: W's 3H rows, then zeros in wt's last H columns: n's R part has no W);
        // tb: a group's input tiles (group 0 the fullest; past a group's batches, none)
        const int tw = (GW * H / 32) * (H / 32);
        const int tb = ((min(B, PS_BMAX) + 31) / 32) * (H / 32), tg = (T + L) * tb;
        const int tz = GRU ? H * H / (4 * PK_MAX_THREADS) : 1;   // zero jobs a layer (GRU)
        const int jobs = L * tw + groups * tg + (GRU ? L * tz : 0);
        for (int n = blockIdx.x; n < jobs; n += gridDim.x) {
            if (n < L * tw) {
                const int m = n / tw, r = n % tw, r0 = 32 * (r / (H / 32));
                ps_transpose_tile(wih + m * ldwih, H, wt + (long long)m * H * ldwt, ldwt,
                                  GW * H, H, r0, 32 * (r % (H / 32)), st);
                continue;
            }
            if (GRU && n >= L * tw + groups * tg) {   // 4 zeros a thread of wt[:, 3H:4H)
                const int z = n - (L * tw + groups * tg), m = z / tz;
                const int e = 4 * ((z % tz) * PK_MAX_THREADS + tid), k = e / H, j = e % H;
                *reinterpret_cast<float4*>(wt + ((long long)m * H + k) * ldwt + 3 * H + j) =
                    make_float4(0.f, 0.f, 0.f, 0.f);
                continue;
            }
            const int g = (n - L * tw) / tg, k = n - L * tw - g * tg, s = k / tb, r = k % tb;
            const int r0 = 32 * (r / (H / 32)), c0 = 32 * (r % (H / 32));
            const int bg = min(PS_BMAX, B - g * PS_BMAX);   // group g's batches
            float* const hg = ht + g * GS;
            if (s < T)
                ps_transpose_tile(x + ((long long)s * B + g * PS_BMAX) * ldx, ldx,
                                  hg + (s + 1) * HS, ldht, bg, H, r0, c0, st);
            else
                ps_transpose_tile(h + ((s - T) * S1 + g * PS_BMAX) * ldh, ldh,
                                  hg + (long long)(s - T + 1) * (T + 1) * HS, ldht, bg, H, r0,
                                  c0, st);
        }
        __syncthreads();
        if (tid == 0) {
            pk_fence_acq_rel();   // the block's transposes visible GPU-wide (release)
            atomicAdd(ready, 1u);
        }
    }
    h += (l * S1 + grp * PS_BMAX) * ldh;           // this layer's h: row s*B + b
    if (!GRU) c += (l * S1 + grp * PS_BMAX) * ldc;
    act += ((long long)l * T * B + grp * PS_BMAX) * ldact;
    const float* const wtl = wt + (long long)l * H * ldwt;
    whh += l * ldwhh;
    bw += l * ldbw;
    br += l * ldbr;
    float* const own = ht + grp * GS + (long long)(l + 1) * (T + 1) * HS;   // slot t: h_t^T
    const float* const below = own - (T + 1) * HS;   // slot t+1: the input at step t

    // The R slice, once, k-major: Rs[k][q*U + ju] = R[q*H + j0 + ju, k] (lanes take
    // consecutive rows: conflict-free stores); GRU: row groups r, z, zeros (n's W part),
    // R's n rows (n's R part)
    for (int e = tid; e < H / 4 * PS_M; e += PK_MAX_THREADS) {
        const int row = e % PS_M, k = 4 * (e / PS_M), q = row / U, ju = row - q * U;
        const int qr = ps_group_gate<CELL>(q, true);   // (GRU &&: LSTM's build as before)
        const float4 v = GRU && qr < 0 ? make_float4(0.f, 0.f, 0.f, 0.f) :
            *reinterpret_cast<const float4*>(whh + (long long)(qr * H + j0 + ju) * H + k);
        Rs[k * PS_M + row] = v.x;
        Rs[(k + 1) * PS_M + row] = v.y;
        Rs[(k + 2) * PS_M + row] = v.z;
        Rs[(k + 3) * PS_M + row] = v.w;
    }

    // Pointwise cells of this thread: e = tid + i*PK_MAX_THREADS, jj = e % U, r = e / U,
    // b = the r-th of 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, ... (a warp's two batches are 4 apart:
    // its partial-sum reads hit 32 different banks), live while b < Bn. jj fastest: a warp's
    // h stores are two runs of 16 consecutive floats. c_t in registers (each cell is this
    // thread's every step; GRU: h_t); the biases of the block's rows in shared memory (GRU:
    // b_ih of r, z, n's W part; b_hh of r, z, n's R part; zero for the others).
    auto cell_of = [&](int i, int& b, int& jj) {   // live while b < Bn
        ps_cell_of<U>(tid + i * PK_MAX_THREADS, b, jj);
    };
    // live: bit i set while cell i's batch is one of the group's (b < Bn each step would do
    // as well: it did not change the registers or spills; the mask is the build the GPU
    // tests ran)
    float carry[PS_CPT];
    unsigned int live = 0;
#pragma unroll
    for (int i = 0; i < PS_CPT; ++i) {
        int b, jj;
        cell_of(i, b, jj);
        live |= b < Bn ? 1u << i : 0u;
        carry[i] = b >= Bn ? 0.f : GRU ? h[(long long)b * ldh + j0 + jj]
                                      : c[(long long)b * ldc + j0 + jj];
    }
    for (int e = tid; e < 2 * PS_M; e += PK_MAX_THREADS) {
        const int row = e % PS_M, q = row / U, ju = row - q * U;
        const bool ih = e < PS_M;
        const int qp = ps_group_gate<CELL>(q, !ih);   // b_ih on W's side, b_hh on R's
        bias[e] = GRU && qp < 0 ? 0.f : __ldg((ih ? bw : br) + qp * H + j0 + ju);
    }

    // The float4s this thread copies of each tile (the same for every tile but for k0).
    // Each warp copies only the PS_KPW k rows of a tile that it multiplies, so a tile needs
    // no block barrier: a lane's cp.async wait and a __syncwarp show the warp its rows, and
    // a warp overwrites a stage's rows only after it has read them itself. Chunk i of the
    // lane is k row kr = PS_KPW*warp + lane/16 + 2i, float4 q4 = lane % 16 of the 64-float
    // row; of A^T (W half) from wt's row k0 + kr, columns q*H + j0 + 4*(q4 % 4) (q = q4 / 4:
    // the block's 4 gate segments of U = 16), of X^T from the ht slot's row k0 + kr
    // (batches 4*q4, only float4s below nbc). Tile n < NK: W^T and the input's rows
    // [n*PS_KT, +PS_KT); n >= NK: h_t^T's (R is in Rs). One cp.async group a tile (empty
    // past the last), so "all but the newest PS_NS - 2 groups landed" is always "tile n
    // landed" for this thread.
    static_assert(PS_KPW * (PS_M / 4) == 32 * PS_CH, "a warp's rows are 32 lanes x PS_CH");
    const int kr0 = PS_KPW * warp + (lane >> 4), q4 = lane & 15;
    const int dst0 = kr0 * PS_M + 4 * q4;
    const float* const a_thr = wtl + kr0 * ldwt + (q4 >> 2) * H + j0 + 4 * (q4 & 3);
    const long long a_i = 2 * ldwt, a_tile = PS_KT * ldwt;
    const int x0 = kr0 * PS_BMAX + 4 * q4;
    const bool x_ok = q4 < nbc;
    const int NT = 2 * NK;
    auto issue = [&](int n, const float* in, const float* hp) {
        if (n < NT && !(PK_TIMING & 1)) {
            float* const s = st + (n % PS_NS) * PS_STAGE + dst0;
            const bool w_half = n < NK;
            const int tile = w_half ? n : n - NK;
            if (w_half) {
                const float* const a = a_thr + tile * a_tile;
#pragma unroll
                for (int i = 0; i < PS_CH; ++i)
                    pk_cp_async16(s + i * 2 * PS_M, a + i * a_i);
            }
            if (x_ok) {
                const float* const xs = (w_half ? in : hp) + tile * (PS_KT * PS_BMAX) + x0;
#pragma unroll
                for (int i = 0; i < PS_CH; ++i)
                    pk_cp_async16(s + PS_KT * PS_M + i * 2 * PS_M, xs + i * 2 * PS_BMAX);
            }
        }
        pk_cp_commit();
    };
    if (tid == 0) ps_wait(ready, gridDim.x);   // every block's transposes
    __syncthreads();   // ... for every thread; Rs is read by every warp

    // the lane: lr its rows, lb its batches, lk (NH 1) its half-warp's k rows
    const int lr = lane & 3, lb = NH == 2 ? lane >> 2 : (lane >> 2) & 3;
    const int lk = NH == 2 ? 0 : lane >> 4;
    const pk_saddr a_lane = 16u * lr + 4u * PS_M * (PS_KPW * warp + lk);
    const pk_saddr x_lane = 16u * lb + 4u * PS_M * (PS_KPW * warp + lk) + 4u * PS_KT * PS_M;
    const pk_saddr st_a = pk_smem_addr(st), rs_a = pk_smem_addr(Rs);
    for (int t = 0; t < T; ++t) {
        const float* const in = below + (t + 1) * HS;   // this step's input, k-major
        const float* const hp = own + t * HS;           // h_t^T of this layer
        // The W half needs layer l-1's step t; the R half this layer's step t-1 (every
        // block's h_t). The own wait sits just before the first R tile is issued (the W
        // half's tiles in flight hide it); both at the top when that tile is in the prologue.
        // Each warp waits for itself (lane 0 polls, the __syncwarp shows it to the warp):
        // a warp issues and reads only its own rows of the stages. The stages are free at
        // the top: the last step's partial sums were read before its final __syncthreads.
        const unsigned int own_n = (unsigned int)t * NB;
        const int own_at = NK - (PS_NS - 1);   // loop index that issues tile NK
        PS_NOTE(t, 0);
        if (lane == 0) {
            if (lower) ps_wait(lower, (unsigned int)min(t + PK_SLACK, T) * NB);
            if (t > 0 && own_at < 0) ps_wait(mine, own_n);
        }
        __syncwarp();
        PS_NOTE(t, 1);
        for (int n = 0; n < PS_NS - 1; ++n) issue(n, in, hp);
        // layer 0's input two steps ahead into L2 (x^T was written in the prologue, and
        // ~3 MB of outputs a step since may have pushed it out): a slot is 2H lines of 128
        // bytes, 2U = 32 of them this block's
        if (l == 0 && t + 2 < T && tid < 2 * U)
            pk_prefetch_l2(in + 2 * HS + 32 * ((blockIdx.x % NB) * 2 * U + tid));
        float acc[PS_TM][PS_TB];
#pragma unroll
        for (int i = 0; i < PS_TM; ++i)
#pragma unroll
            for (int jb = 0; jb < PS_TB; ++jb) acc[i][jb] = 0.f;
        for (int n = 0; n < NT; ++n) {
            pk_cp_wait<PS_NS - 2>();   // tile n landed (this lane's part) ...
            if (n == own_at) PS_NOTE(t, 2);
            if (lane == 0 && t > 0 && n == own_at) ps_wait(mine, own_n);
            __syncwarp();              // ... the warp's; the warp has read its rows of n-1
            if (n == own_at) PS_NOTE(t, 3);
            issue(n + PS_NS - 1, in, hp);
            const pk_saddr s = st_a + 4u * ((n % PS_NS) * PS_STAGE);
            const pk_saddr a = n < NK ? s : rs_a + 4u * ((n - NK) * PS_KT * PS_M);
            if (GRU && n < NK)    // the input's tiles: n's R group (3) has no W
                ps_tile_fma<NH, 3>(acc, a + a_lane, s + x_lane);
            else if (GRU)         // h's tiles: n's W group (2) has no R
                ps_tile_fma<NH, 2>(acc, a + a_lane, s + x_lane);
            else
                ps_tile_fma<NH>(acc, a + a_lane, s + x_lane);
        }
        PS_NOTE(t, 4);
        pk_cp_wait<0>();
        __syncthreads();   // every tile is read: the stages become the partial sums
        // The k-groups into four partial sums red[m][b][row], row stride PS_RP (a quarter
        // warp's 16-byte accesses, lr 0..3 and two batches 4 apart: 4 * PS_RP = 16 mod 32
        // banks, fill 32 banks): NH 2 eight (warps 4..7 store, warps 0..3 add theirs), NH 1
        // sixteen half-warp tiles in four passes.
        ps_flush<NH>(acc, red, warp, lk, lr, lb, PS_RP);

        // The pointwise update of this thread's cells: gate sums over the 4 partial sums in
        // order, then (sum + b_ih) + b_hh, then lstm_fwd's (gru_fwd's) arithmetic. Only h^T
        // is read by other blocks in this launch: it is stored and published first, the rest
        // (c, the gates, h) after the count (the publishing fence waits for no more than it
        // must).
        float* const hT = own + (t + 1) * HS;   // h_{t+1}^T
        float gate[PS_CPT][G], hnew[PS_CPT];
#pragma unroll
        for (int i = 0; i < PS_CPT; ++i) {
            int b, jj;
            cell_of(i, b, jj);
            if ((PK_TIMING & 8) || !(live >> i & 1u)) continue;
            float s[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float* const p = red + b * PS_RP + q * U + jj;
                float v = p[0];
#pragma unroll
                for (int k = 1; k < 4; ++k) v += p[k * PS_BMAX * PS_RP];
                s[q] = (v + bias[q * U + jj]) + bias[PS_M + q * U + jj];
            }
            hnew[i] = GRU ? ps_gru_cell(s, gate[i], carry[i])
                          : ps_lstm_cell(s, gate[i], carry[i]);
            __stcg(hT + (j0 + jj) * PS_BMAX + b, hnew[i]);   // h_{t+1}^T[j, b]
        }
        ps_publish(mine);   // the block's h_{t+1}^T
        PS_NOTE(t, 5);
#pragma unroll
        for (int i = 0; i < PS_CPT; ++i) {
            int b, jj;
            cell_of(i, b, jj);
            if ((PK_TIMING & 8) || !(live >> i & 1u)) continue;
            const int j = j0 + jj;
            const long long row = (long long)t * B + b;   // step t, batch b
            // streaming stores: nothing in this launch reads these (L2 keeps W^T and ht)
            if (GRU)
                ps_store_gates(act + row * ldact + j, H, gate[i]);
            else
                ps_store_state(c + (row + B) * ldc + j, act + row * ldact + j, H, carry[i],
                               gate[i]);
            __stcs(h + (row + B) * ldh + j, hnew[i]);     // h_{t+1}[b, j]
        }
    }
    // The last block out zeroes every layer's counters and the prologue's for the next
    // launch: by then every block has passed its last wait (docs/kernels.md).
    if (tid == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        for (int g = 0; g < groups; ++g)
            for (int k = 0; k < L; ++k) atomicExch(sync + g * ldsync + 2 * k, 0u);
        atomicExch(sync + 1, 0u);
        atomicExch(ready, 0u);
    }
}

// The batch path of this block's group: a group of at most PS_BMAX / 2 batches (B <= 32, or
// the last group of a larger batch) takes the 32-batch tile (half the FMAs).
__device__ __forceinline__ bool ps_half_group(int B, int H, int L, int U) {
    const int NBL = max(L * (H / max(U, 1)), 1);
    return B - (int)(blockIdx.x / NBL) * PS_BMAX <= PS_BMAX / 2;
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_stack_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, float* wt, int ldwt, float* ht, int ldht,
        const float* x, int ldx, const float* w_ih, int ldw_ih, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int L,
        int units_per_block, int groups) {
    if (ps_half_group(rows, cols, L, units_per_block)) {
        persistent_stack_fwd<4, CELL_LSTM, 1>(rows, cols, h, ldh, c, ldc, act, ldact, sync,
                                              ldsync, wt, ldwt, ht, ldht, x, ldx, w_ih, ldw_ih,
                                              w_hh, ldw_hh, bw, ldbw, br, ldbr, T, L,
                                              units_per_block, groups);
        return;
    }
    persistent_stack_fwd<4, CELL_LSTM, 2>(rows, cols, h, ldh, c, ldc, act, ldact, sync, ldsync,
                                          wt, ldwt, ht, ldht, x, ldx, w_ih, ldw_ih, w_hh, ldw_hh,
                                          bw, ldbw, br, ldbr, T, L, units_per_block, groups);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_stack_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, float* wt, int ldwt, float* ht, int ldht, const float* x, int ldx,
        const float* w_ih, int ldw_ih, const float* w_hh, int ldw_hh, const float* bw, int ldbw,
        const float* br, int ldbr, int T, int L, int units_per_block, int groups) {
    if (ps_half_group(rows, cols, L, units_per_block)) {   // as lstm_persistent_stack_fwd
        persistent_stack_fwd<4, CELL_GRU, 1>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync,
                                             ldsync, wt, ldwt, ht, ldht, x, ldx, w_ih, ldw_ih,
                                             w_hh, ldw_hh, bw, ldbw, br, ldbr, T, L,
                                             units_per_block, groups);
        return;
    }
    persistent_stack_fwd<4, CELL_GRU, 2>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync,
                                         ldsync, wt, ldwt, ht, ldht, x, ldx, w_ih, ldw_ih, w_hh,
                                         ldw_hh, bw, ldbw, br, ldbr, T, L, units_per_block,
                                         groups);
}
