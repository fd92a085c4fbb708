/*
 * persistent_stack_mma.cu: the tensor-core stack kernel (forward; bf16 and fp16 storage, fp32
 * math): ALL L layers of an LSTM stack in ONE persistent launch along the wavefront, as
 * persistent_stack.cu, with the product [W_l | R_l] rows x [in_t ; h_t] on tensor cores:
 * mma.sync m16n8k16 with bf16 / fp16 operands and fp32 accumulation (mma_sync.cuh). Each
 * block keeps its 64 gate rows of BOTH W_l and R_l in shared memory (rounded to the storage
 * type once, in the prologue), so a step streams only its inputs: the layer below's h_{t+1}
 * (x_t for layer 0) and its own h_t, [B, H] each in the storage type, as they lie in the h
 * output (no transposed copies, no scratch). Design: docs/kernels.md ("The tensor-core
 * stack kernel"); host side (fit, NumPy twin): rnnrt/kernels/stack_mma.py.
 *
 * Variants: one template, lstm_persistent_stack_mma_fwd_t<TS, false>, TS bf16 or fp16
 *   (rnnrt/kernels/typed.py persistent_expression; no fp32 or tf32 kernel: the fit declines
 *   those keys; the `false` is the TF32 flag of the typed persistent kernels, unused). No
 *   `extern "C"` kernels. Compile-time knobs (experiments only; rnnrt.kernels.stack_mma
 *   mirrors the defaults, a test holds them): PSM_NS (pipeline stages), PK_SLACK,
 *   PS_FAST_CELL (persistent_stack.cuh), PK_TIMING, PK_SPIN_LIMIT.
 *
 * Why the same math as the rungs: W, R (rounded as they are loaded), x and every h (rounded
 * when stored) are values of the storage type, exact in the tensor core's input type; their
 * products are exact in fp32 and the tensor core accumulates in fp32. Only the order of the
 * sum over k differs (within a k16 step the hardware's; across steps the kernel's: below),
 * which the tests allow for.
 *
 * Batch groups, as the fp32 stack kernel's: B = 64 * groups (whole groups: every cell of a
 * group is live, B the row stride) runs as `groups` stacks side by side in the launch, each
 * with its own row of progress counters.
 *
 * Calling convention: the stack kernel's (rnnrt/kernels/registry.py builds the arguments):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int L, int units_per_block,
 *          int groups),
 *   each view a (pointer, int ld) pair, row-major; `sync` is unsigned int*; h and x are TS*.
 *
 * Kernels (one variant each a storage type; layer l's rows of h and c are
 *   l*(T+1)*B + s*B + b, of act l*T*B + t*B + b; input size = hidden):
 *   kernel lstm_persistent_stack_mma_fwd(rows = B, cols = H)
 *       pre = (sum_k [W_l | R_l][r, k] [in_t ; h_t][k, b]) + b_ih) + b_hh, the sum by
 *       mma.sync in the kernel's order (k-group kg of 4 sums the k16 steps 4n + kg of the 2H
 *       columns; the four partial sums added (p0 + p2) + (p1 + p3)), then lstm_fwd's
 *       arithmetic; in_t = x_t for layer 0, layer l-1's h_{t+1} above it
 *     out h      [L*(T+1)*B, H]  TS; slot 0 of every layer (h0) is read; slots 1..T written
 *     out c      [L*(T+1)*B, H]  likewise (c0), fp32
 *     out act    [L*T*B, 4H]     i, f, g, o of every layer and step, fp32
 *     out sync   [groups, 2L]    word 2l of row g: layer l's progress in batch group g
 *                                (blocks x steps done); row 0 word 1: blocks gone. Zero on
 *                                entry, zero on exit
 *     in  x      [T*B, H]        TS: the input sequence
 *     in  w_ih   [L, 4*H*H]      fp32; row l: layer l's weight_ih [4H, H], row-major (ld:
 *                                the distance between layers in the flat parameters)
 *     in  w_hh   [L, 4*H*H]      fp32; row l: layer l's weight_hh
 *     in  bw     [L, 4H]         b_ih of each layer (ld 0: one row for all)
 *     in  br     [L, 4H]         b_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        U: G*U = PSM_M rows a block (16 for LSTM)
 *     int groups                 batch groups: 1 (B <= 64) or B / 64
 *
 * Resources (sm_90, nvcc 13.0 -Xptxas -v; rnnrt.kernels.stack_mma.PSM_REGS is the bound the
 *   fit assumes): __launch_bounds__(PK_MAX_THREADS = 256, 1), no spills; dynamic shared
 *   memory 64 * (2H + 16) * 2 (the W | R rows) + PSM_NS * 64 * 80 * 2 (stages; the partial
 *   sums, 34,816 bytes, reuse them) + 512 (biases): 195,072 bytes at H 512.
 */
#include "persistent_common.cuh"
#include "persistent_stack.cuh"
// PSM_BMAX, PSM_KT, PSM_SX, PSM_RP, psm_k16, psm_flush (mma_sync.cuh with them):
#include "persistent_stack_mma.cuh"

// The block's cut. Block x is layer l = x / NB, rank x % NB (NB = H / U); it owns units
// [rank*U, rank*U + U) of its layer with all 4 gate rows (M = 64 rows: row q*U + ju is gate
// row q*H + j0 + ju) and each step computes those rows of [W_l | R_l] [in_t ; h_t] for every
// batch. Warp w is batch half nh = w & 1 (batches 32nh .. 32nh + 31) and k-group kg = w >> 1:
// of each staged tile of PSM_KT = 64 columns it takes the 16 columns [16kg, 16kg + 16), all
// 64 rows: 4 m16 x 4 n8 register tiles, 64 fp32 accumulators a lane.
#define PSM_M 64                   // rows of a block: G*U (LSTM: 16 units x 4 gates)
#ifndef PSM_NS
#define PSM_NS 6                   // pipeline stages (tiles in flight: PSM_NS - 1)
#endif
#define PSM_CPT 4                  // pointwise cells a thread: U * B / PK_MAX_THREADS at most
// Bytes of the stages, which the partial sums [2][PSM_BMAX][PSM_RP] (fp32) reuse after the K
// loop: the larger of the two (the stages, but for the fewest stages a test builds)
#define PSM_STAGE_BYTES (PSM_BMAX * PSM_SX * 2)
#define PSM_RED_BYTES (2 * PSM_BMAX * PSM_RP * 4)
#define PSM_BUF_BYTES (PSM_NS * PSM_STAGE_BYTES > PSM_RED_BYTES ? PSM_NS * PSM_STAGE_BYTES \
                                                                : PSM_RED_BYTES)
static_assert(PSM_NS >= 2, "a tile in flight while one is multiplied");

// One layer-block of the stack. Views as the header's; layer l's rows: h and c at
// ((l*(T+1) + s)*B + b), act at ((l*T + t)*B + b), W / R / biases at row l.
template <class TS>
__device__ __forceinline__ void persistent_stack_mma_fwd(
        int B, int H, TS* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, const TS* x, long long ldx, const float* wih,
        long long ldwih, const float* whh, long long ldwhh, const float* bw, long long ldbw,
        const float* br, long long ldbr, int T, int L, int u_arg, long long ldsync, int groups) {
    constexpr int G = 4, U = PSM_M / G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nh = warp & 1, kg = warp >> 1;
    const int NB = H / U;                   // blocks a layer
    const int NK = H / PSM_KT;              // tiles of one K half (input size = hidden)
    const int NT = 2 * NK;
    // Batch groups, as the fp32 stack kernel's (whole ones here: B = 64 groups, so every
    // cell of a group is live and B is the row stride): blocks [g*L*NB, (g+1)*L*NB) run
    // batches [64g, 64g + 64) with their own row g of the progress counters.
    const int NBL = max(L * NB, 1);         // blocks a group (L checked below)
    const int grp = blockIdx.x / NBL, bx = blockIdx.x - grp * NBL;
    const int SA = 2 * H + 16;              // row stride (elements) of the W | R rows
    const long long need = 2LL * PSM_M * SA + PSM_BUF_BYTES + 4 * 2 * PSM_M;
    auto aligned = [](const void* p) {
        return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
    };
    // 16-byte staging copies: every row of x and h 16-byte aligned (ld a multiple of 8);
    // 16-byte weight loads: every layer's W and R rows 16-byte aligned
    if (blockDim.x != PK_MAX_THREADS || u_arg != U || H % PSM_KT != 0 || B < 1 || groups < 1 ||
        (groups == 1 ? B > PSM_BMAX : B != groups * PSM_BMAX) || ldsync < 2LL * L || L < 1 ||
        (long long)gridDim.x != (long long)groups * NBL ||
        (long long)dynamic_smem_bytes() < need || ldh % 8 || ldx % 8 || !aligned(h) ||
        !aligned(x) || ldwih % 4 || ldwhh % 4 || !aligned(wih) || !aligned(whh))
        __trap();
    const int l = bx / NB, j0 = (bx % NB) * U;
    const long long S1 = (long long)(T + 1) * B;   // rows of one layer's h and c
    unsigned int* const mine = sync + grp * ldsync + 2 * l;   // this layer's progress
    const unsigned int* const lower = l ? mine - 2 : nullptr;
    {   // this group's batches
        const long long bg0 = (long long)grp * PSM_BMAX;
        h += bg0 * ldh;
        c += bg0 * ldc;
        act += bg0 * ldact;
        x += bg0 * ldx;
    }

    unsigned short* const As = reinterpret_cast<unsigned short*>(dynamic_smem());
    unsigned short* const st = As + PSM_M * SA;              // [PSM_NS][PSM_BMAX][PSM_SX]
    float* const red = reinterpret_cast<float*>(st);         // [2][PSM_BMAX][PSM_RP], after
    float* const bias = reinterpret_cast<float*>(st + PSM_BUF_BYTES / 2);   // [2][M]

    const TS* const below = l ? h + (l - 1) * S1 * ldh : x;   // in_t: slot t+1 above layer 0
    const long long ldin = l ? ldh : ldx;
    const long long in_off = l ? B : 0;            // rows before in_0 (h slot 0 is h0)
    h += l * S1 * ldh;                             // this layer's h: row s*B + b
    c += l * S1 * ldc;
    act += (long long)l * T * B * ldact;
    wih += l * ldwih;
    whh += l * ldwhh;
    bw += l * ldbw;
    br += l * ldbr;

    // The W | R rows, once, rounded to TS (the rungs' copies' values): As[q*U + ju][k] =
    // W[q*H + j0 + ju, k] for k < H, R[..., k - H] above (float4 loads along k)
    for (int e = tid; e < PSM_M * (2 * H / 4); e += PK_MAX_THREADS) {
        const int row = e / (2 * H / 4), k = 4 * (e % (2 * H / 4));
        const int q = row / U, ju = row - q * U;
        const float* const src = k < H ? wih + (long long)(q * H + j0 + ju) * H + k
                                       : whh + (long long)(q * H + j0 + ju) * H + (k - H);
        const float4 v = *reinterpret_cast<const float4*>(src);
        unsigned short* const d = As + row * SA + k;
        d[0] = from_f<TS>(v.x).bits;
        d[1] = from_f<TS>(v.y).bits;
        d[2] = from_f<TS>(v.z).bits;
        d[3] = from_f<TS>(v.w).bits;
    }
    for (int e = tid; e < 2 * PSM_M; e += PK_MAX_THREADS) {
        const int row = e % PSM_M, q = row / U, ju = row - q * U;
        bias[e] = __ldg((e < PSM_M ? bw : br) + q * H + j0 + ju);
    }
    // Pointwise cells of this thread (ps_cell_of: jj fastest, a warp's two batches 4 apart);
    // c_t in registers (each cell is this thread's every step)
    auto cell_of = [&](int i, int& b, int& jj) {
        ps_cell_of<U>(tid + i * PK_MAX_THREADS, b, jj);
    };
    float carry[PSM_CPT];
#pragma unroll
    for (int i = 0; i < PSM_CPT; ++i) {
        int b, jj;
        cell_of(i, b, jj);
        carry[i] = b < B ? c[(long long)b * ldc + j0 + jj] : 0.f;
    }

    // The copies of this lane: each warp stages exactly the part of each tile that it
    // multiplies (batch rows 32nh + lane, its 16 columns: two 16-byte chunks), so a tile
    // needs no block barrier: a lane's cp.async wait and a __syncwarp show the warp its
    // part, and a warp overwrites a stage's part only after it has read it itself. Tile
    // n < NK: the input's columns [n*KT, n*KT + KT); n >= NK: h_t's. One cp.async group a
    // tile (empty past the last), so "all but the newest PSM_NS - 2 groups landed" is
    // always "tile n landed" for this lane.
    const int b_copy = 32 * nh + lane;
    const bool copies = b_copy < B;
    unsigned short* const dst_lane = st + b_copy * PSM_SX + 16 * kg;
    auto issue = [&](int n, const TS* in, const TS* hp) {
        if (n < NT && copies && !(PK_TIMING & 1)) {
            unsigned short* const d = dst_lane + (n % PSM_NS) * (PSM_BMAX * PSM_SX);
            const TS* const s = n < NK ? in + b_copy * ldin + n * PSM_KT + 16 * kg
                                       : hp + b_copy * ldh + (n - NK) * PSM_KT + 16 * kg;
            pk_cp_async16(reinterpret_cast<float*>(d), reinterpret_cast<const float*>(s));
            pk_cp_async16(reinterpret_cast<float*>(d + 8), reinterpret_cast<const float*>(s + 8));
        }
        pk_cp_commit();
    };
    __syncthreads();   // the W | R rows and the biases are in shared memory

    const int b0 = 32 * nh;   // the warp's first batch
    for (int t = 0; t < T; ++t) {
        const TS* const in = below + (in_off + (long long)t * B) * ldin;   // this step's input
        const TS* const hp = h + (long long)t * B * ldh;                   // h_t of this layer
        // The input half needs layer l-1's step t; the h half this layer's step t-1 (every
        // block's h_t). The own wait sits just before the first h tile is issued (the input
        // half's tiles in flight hide it); both at the top when that tile is in the prologue.
        // Each warp waits for itself (lane 0 polls, the __syncwarp shows it to the warp).
        // The stages are free at the top: the last step's partial sums were read before its
        // final __syncthreads.
        const unsigned int own_n = (unsigned int)t * NB;
        const int own_at = NK - (PSM_NS - 1);   // loop index that issues tile NK
        if (lane == 0) {
            if (lower) ps_wait(lower, (unsigned int)min(t + PK_SLACK, T) * NB);
            if (t > 0 && own_at < 0) ps_wait(mine, own_n);
        }
        __syncwarp();
        for (int n = 0; n < PSM_NS - 1; ++n) issue(n, in, hp);
        float acc[4][4][4];
        psm_zero(acc);
        for (int n = 0; n < NT; ++n) {
            pk_cp_wait<PSM_NS - 2>();   // tile n landed (this lane's part) ...
            if (lane == 0 && t > 0 && n == own_at) ps_wait(mine, own_n);
            __syncwarp();               // ... the warp's; the warp has read its part of n-1
            issue(n + PSM_NS - 1, in, hp);
            if (b0 < B)
                psm_k16<TS>(acc, As, SA, n * PSM_KT + 16 * kg,
                            st + (n % PSM_NS) * (PSM_BMAX * PSM_SX), 16 * kg, b0, B, lane);
        }
        pk_cp_wait<0>();
        __syncthreads();   // every tile is read: the stages become the partial sums
        // Four k-groups into two partial sums red[m] = p_m + p_{m+2}
        psm_flush(acc, red, kg, b0, B, lane);

        // The pointwise update of this thread's cells: gate sums red[0] + red[1], then
        // (sum + b_ih) + b_hh, then lstm_fwd's arithmetic. Only h is read by other blocks in
        // this launch: it is stored (rounded to TS) and published first, the rest (c, the
        // gates) after the count.
        TS* const hn = h + (long long)(t + 1) * B * ldh;   // h_{t+1}
        float gate[PSM_CPT][G];
#pragma unroll
        for (int i = 0; i < PSM_CPT; ++i) {
            int b, jj;
            cell_of(i, b, jj);
            if ((PK_TIMING & 8) || b >= B) continue;
            float s[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float* const p = red + b * PSM_RP + q * U + jj;
                s[q] = ((p[0] + p[PSM_BMAX * PSM_RP]) + bias[q * U + jj]) +
                       bias[PSM_M + q * U + jj];
            }
            pk_stcg(hn + b * ldh + j0 + jj, ps_lstm_cell(s, gate[i], carry[i]));
        }
        ps_publish(mine);   // the block's h_{t+1}
#pragma unroll
        for (int i = 0; i < PSM_CPT; ++i) {
            int b, jj;
            cell_of(i, b, jj);
            if ((PK_TIMING & 8) || b >= B) continue;
            const long long row = (long long)t * B + b;   // step t, batch b
            const int j = j0 + jj;
            ps_store_state(c + (row + B) * ldc + j, act + row * ldact + j, H, carry[i],
                           gate[i]);
        }
    }
    // The last block out zeroes every layer's counter for the next launch: by then every
    // block has passed its last wait.
    if (tid == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        for (int g = 0; g < groups; ++g)
            for (int k = 0; k < L; ++k) atomicExch(sync + g * ldsync + 2 * k, 0u);
        atomicExch(sync + 1, 0u);
    }
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_stack_mma_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const TS* x, int ldx, const float* w_ih, int ldw_ih,
        const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr,
        int T, int L, int units_per_block, int groups) {
    static_assert(!TF32, "the tensor-core stack kernel has no tf32 instantiation");
    persistent_stack_mma_fwd<TS>(rows, cols, h, ldh, c, ldc, act, ldact, sync, x, ldx, w_ih,
                                 ldw_ih, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, L,
                                 units_per_block, ldsync, groups);
}
