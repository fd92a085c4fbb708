/*
 * persistent_solo.cu: the block-persistent ("solo") kernels (forward) for small hidden
 * sizes (H <= SO_MAX_H = 128). ONE launch runs ALL T steps of ONE layer; EACH BLOCK holds ALL
 * of R in its shared memory and runs its own slice of the batch for every step, with no
 * communication between blocks: no grid barrier, no cluster, no co-residency requirement (any
 * number of blocks is correct; one wave is fastest). A step is the block's own product, a
 * warp-shuffle sum over k, the gate sums into shared memory, a __syncthreads, the cell updates
 * (one thread a cell, whole warps) and a second __syncthreads (h_t double-buffered in shared
 * memory). cuDNN's RNN_blockPersist_fp_* kernels work this way (~0.95 us a step at
 * GRU H 128 B 128 on the H100). Design and budget: docs/kernels.md ("The block-persistent
 * kernels"); host side: rnnrt/kernels/solo.py (fit, lane map, NumPy cut).
 *
 * Variants: one template solo_fwd<G, CELL, BB, UPT, TS, TF32> per cell, dispatched at run time on BB
 *   (the block's batches rounded up to a power of two: 1, 2, 4; LSTM 1) (solo_dispatch); two
 *   entry points a cell: `*_persistent_solo_fwd` (UPT 1: thread 8j + s is k-split s of unit
 *   j, R read from shared memory every step) and `*_persistent_solo_rr_fwd` (UPT 2, GRU and the
 *   RNNs: half the threads, thread 8j + s k-split s of units j and j + H/2, the first
 *   SO_RR_CHUNKS (at 2 batches SO_RR_CHUNKS_BB2) chunks of its rows held in registers for the
 *   whole launch, BB <= 2). Both sum every gate in the same FMA chains and the same 8-lane
 *   tree: the same bits. Each entry point K has its typed instantiation K_t<TS, TF32> (bottom
 *   of the file; TS the storage of h: float, bf16, fp16; TF32: operands TF32-rounded; the rule
 *   of persistent.cu's typed kernels: R and h rounded as the rungs' GEMMs read them, h stored
 *   rounded to TS, all else fp32). Compile-time: SO_* below.
 *
 * Calling convention: exactly the cluster kernels' (persistent.cu's header; registry entries
 *   have persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile)
 *   each view a (pointer, ld) pair; sync is not touched; units_per_block must be H (a block
 *   owns every unit); k_tile must be 4 * ceil(H / 4) (the row stride of R and h on chip);
 *   block x runs batches [x*BG, min(B, x*BG + BG)), BG = ceil(B / gridDim.x) (none empty);
 *   threads >= SO_KS * H / UPT, whole warps, <= SO_MAX_THREADS (_rr: SO_RR_THREADS).
 *
 * Kernels (fp32 shown: the typed ones take h as a TS*; per step t = 0..T-1, for every (b, j):
 *   the other persistent kernels' arithmetic (pk_cell_update), ((gx + bw) + gh) + br, GRU's n gate
 *   tanh((gx_n + bw_n) + r * (gh_n + br_n)); only the order of gh's sum over k is this
 *   kernel's own: each lane's FMA chain over its chunks, then a tree over 8 lanes):
 *   kernel lstm_persistent_solo_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    i, f, g, o after activation, for the backward pass
 *     out sync   [1, 2]        not used
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      H
 *     int k_tile               4 * ceil(H / 4)
 *   kernel gru_persistent_solo_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out act    [T, B, 4H]    r, z, n, hn (columns 0, H, 2H, 3H)
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_solo_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_solo_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *
 *   (the _rr kernels: the same arguments and results as the cell's *_persistent_solo_fwd)
 *   kernel gru_persistent_solo_rr_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out act    [T, B, 4H]    r, z, n, hn (columns 0, H, 2H, 3H)
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_solo_rr_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_solo_rr_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *
 * Resources: __launch_bounds__(SO_MAX_THREADS = 1024, 1): at most 64 registers a thread
 *   (rnnrt.kernels.solo.NVCC_REGS: nvcc 13.0's counts, no spills); the _rr kernels
 *   __launch_bounds__(SO_RR_THREADS = 512, 1), 128 (NVCC_REGS_RR), no spills (their bodies
 *   called, not inlined: inlined, GRU's spilt 20 bytes). Dynamic shared memory,
 *   in floats: G*H*SR (R) + 2*BGP*SR (the h buffers; SR = 4*ceil(H/4), BGP = BG rounded up
 *   to BB), e.g. GRU H 128, 2 batches a block: 196,608 + 2,048 bytes.
 */
#include "persistent_layer.cuh"

#define SO_KS 8              // k-splits: lanes 8u .. 8u+7 of a warp share unit u's G rows
#define SO_NCH 4             // most float4 chunks of a row one lane multiplies (chunks s + 8i)
#define SO_MAX_H 128         // SO_KS * SO_NCH * 4 columns; SO_KS * H threads <= 1024
#define SO_BB_MAX 4          // most batches a block (LSTM: SO_BB_MAX_LSTM): 8 spill at 64
#define SO_BB_MAX_LSTM 1     // registers (the FMA chains, their loads, the prefetched gx: LSTM 2 spilt 32 B)
#define SO_MAX_THREADS 1024  // __launch_bounds__; the fit takes 32 * ceil(SO_KS * H / 32)
#define SO_BB_MAX_RR 2       // most batches a block of the _rr kernels (part of R in registers)
#define SO_RR_THREADS 512    // their __launch_bounds__: 128 registers a thread
#ifndef SO_RR_CHUNKS
#define SO_RR_CHUNKS 3       // chunks of a row the _rr kernels hold in registers (of SO_NCH)
#endif                       // at 1 batch a block; at 2 (more FMA chains): SO_RR_CHUNKS_BB2
#define SO_RR_CHUNKS_BB2 1   // (2 spilt 8 bytes at GRU)

__host__ __device__ constexpr int so_log2(int x) { return x <= 1 ? 0 : 1 + so_log2(x / 2); }
// The most batches a block of G gates takes (BB = pow2(BG) <= it).
__host__ __device__ constexpr int so_bb_max(int G, int UPT) {
    return UPT == 2 ? SO_BB_MAX_RR : G == 4 ? SO_BB_MAX_LSTM : SO_BB_MAX;
}

// Sum the partials of the 8 k-split lanes (lane bits 2..0) of N = NB x G values (value
// bb*G + q: batch bb, gate q). While several batches are left, the stage with lane mask MASK
// (4, 2, 1) is a reduce-scatter in whole batches: a lane keeps the half of the batches its
// MASK bit selects, sends the other half to lane ^ MASK and adds what comes back; once one
// batch is left, the remaining masks add its G values whole. The lane ends with the G gate
// sums of batch (lane & 7) >> (3 - log2 NB) in v[0..G-1]; every sum is the same tree over the
// 8 lanes, ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)) (addition commutes, so both
// lanes of a pair hold the same bits) (solo.lane_tree).
template <int G, int NB, int MASK, int N>
__device__ __forceinline__ void so_reduce(float (&v)[N], int lane) {
    if constexpr (MASK >= 1) {
        if constexpr (NB == 1) {
#pragma unroll
            for (int q = 0; q < G; ++q) v[q] += __shfl_xor_sync(0xffffffffu, v[q], MASK);
            so_reduce<G, 1, MASK / 2>(v, lane);
        } else {
            constexpr int half = NB / 2 * G;
            const bool up = (lane & MASK) != 0;
#pragma unroll
            for (int i = 0; i < half; ++i) {
                const float send = up ? v[i] : v[i + half];
                const float keep = up ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);
            }
            so_reduce<G, NB / 2, MASK / 2>(v, lane);
        }
    }
}

// The body: a block of batches [b_off, b_off + B) of Bfull (the layout sized for BG). Thread
// tid is k-split s = tid % 8 of unit j = tid / 8 (lanes 8u .. 8u+7 of a warp: one unit):
// it multiplies the G rows q*H + j of R over the float4 chunks s, s + 8, ... (< CH) of the
// row, for the block's BB = pow2(BG) <= 4 batches (one FMA chain a (batch, gate)), then
// so_reduce leaves the lanes s with s % (8 / BB) == 0 the sums of batch s >> (3 - log2 BB)
// (rows past B: padding, dropped), which they write to shared memory; after a __syncthreads
// thread bb*H + j updates cell (bb, j).
// Why this cut: a quarter warp's 16-byte loads are one row's 8 consecutive chunks (R) or one
// batch's (h, the same 8 for the warp's 4 units): 128 contiguous bytes, no bank conflict and
// no padding; the k-split sum stays in the warp (3 shuffle stages). The first version ran the
// cell update in the lane that held the sums (one lane in 8 / BB of every warp, as the regs
// kernel's gather does, one barrier a step): 3.0 us a step at GRU H 128 B 128, ncu 400
// instructions a warp-step, a third of them the cell update issued by every warp for its 4
// live lanes; the cell updates in whole warps cost a second barrier and save those issues.
// R is read from shared memory once a step: the step's floor is M*H*4 bytes / 128 B a clock
// (GRU H 128: 1,536 clocks, ~0.78 us), past which BG's FMAs (M*H*BG / 128 a clock) take over
// at BG = 4.
template <int G, int CELL, int BB, int UPT, class TS, bool TF32>
__device__ __forceinline__ void solo_fwd(int Bfull, int H, TS* h, long long ldh, float* c,
                                         long long ldc, float* act, long long ldact,
                                         const float* gx, long long ldgx, const float* w,
                                         long long ldw, const float* bw, long long ldbw,
                                         const float* br, long long ldbr, int T, int B,
                                         int BG) {
    // UPT 2 (R in registers): the lane's sums are UPT x BB "batches" of the reduce, unit
    // u's batch bb the (u*BB + bb)-th; every sum is still so_reduce's one tree over the 8
    // lanes (the same bits as UPT 1)
    constexpr int NV = UPT * BB;
    constexpr int LB = so_log2(NV);
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
    const int s = tid & (SO_KS - 1), j = tid / SO_KS;   // k-split and (first) unit of the thread
    const int S = Bfull;                                // rows of a step in every array
    const int CH = (H + 3) / 4, SR = 4 * CH, M = G * H;
    const int HU = H / UPT;               // unit u of the thread: j + u*HU
    const int BGP = BB;                   // rows of an h buffer (BG <= BB: one pass a step)
    float* const Rs = smem;               // [M][SR]: row q*H + j is R[q*H + j, :]
    float* const hs = Rs + M * SR;        // [2][BGP][SR]: h_t in buffer t & 1
    float* const gs = hs + 2 * BGP * SR;  // [BB][M]: the gate sums of a step, batch-major
    const bool unit_live = j < HU;
    const int cv = s >> (3 - LB);         // the (unit, batch) whose sums this lane ends with
    const int cu = cv / BB, cbb = cv - cu * BB;
    const bool sum_lane = unit_live && (s & ((SO_KS >> LB) - 1)) == 0 && cbb < B;

    // The cell thread: thread tid updates cell (b, jc) = (tid / H, tid % H), B*H <= SO_KS*H
    // <= threads, so the cell updates fill whole warps (the first ceil(B*H / 32)) instead of
    // 1 lane in 8 / BB of every warp: the first profile (GRU H 128 B 128, 400 instructions a
    // warp-step, issue slots 45% busy) spent a third of every warp's step issuing the cell
    // update for its 4 live lanes. gx of step t+1 is loaded before the barrier that ends step
    // t (streamed); c_t (LSTM) / h_t (GRU) carried in a register; the biases read at each
    // update (__ldg: L1 hits after the first step; 64 registers a thread at 1024 threads leave
    // no room to keep G x 2 of them).
    const int b = tid / H, jc = tid - b * H;
    const bool lv = b < B;
    float xg[G], carry = 0.f;
    auto prefetch = [&](int t) {
        const float* const x = gx + ((long long)t * S + b) * ldgx + jc;
#pragma unroll
        for (int q = 0; q < G; ++q) xg[q] = lv ? __ldcs(x + q * (long long)H) : 0.f;
    };
    if constexpr (CELL == CELL_LSTM) {
        if (lv) carry = c[b * ldc + jc];
    } else if constexpr (CELL == CELL_GRU) {
        if (lv) carry = to_f(h[b * ldh + jc]);
    }
    prefetch(0);   // in flight during the copy of R

    // R once, zeros in the columns past H (the last chunk reads them): 16-byte loads where
    // every row starts 16-byte aligned and H is whole float4s (one division a float4, not a
    // float: the prologue was the top stall of the first profile at 20 steps); h_0 of the
    // block's batches into buffer 0, zeros everywhere else (columns past H, rows past B: a
    // pass's padded batches are multiplied and their sums dropped)
    if (H % 4 == 0 && ldw % 4 == 0 && (reinterpret_cast<unsigned long long>(w) & 15ull) == 0) {
        for (int e = tid; e < M * CH; e += nt) {
            const int row = e / CH, c4 = e - row * CH;
            float4 v = __ldg(reinterpret_cast<const float4*>(w + (long long)row * ldw) + c4);
            if constexpr (!PkRaw<TS, TF32>::v) {   // R as the rungs' GEMMs read it
                v.x = pk_operand<TS, TF32>(v.x), v.y = pk_operand<TS, TF32>(v.y);
                v.z = pk_operand<TS, TF32>(v.z), v.w = pk_operand<TS, TF32>(v.w);
            }
            *reinterpret_cast<float4*>(Rs + row * SR + 4 * c4) = v;
        }
    } else {
        for (int e = tid; e < M * SR; e += nt) {
            const int row = e / SR, k = e - row * SR;
            Rs[e] = k < H ? pk_operand<TS, TF32>(__ldg(w + (long long)row * ldw + k)) : 0.f;
        }
    }
    for (int e = tid; e < 2 * BGP * SR; e += nt) {
        const int buf = e / (BGP * SR), r = e - buf * BGP * SR;
        const int row = r / SR, k = r - row * SR;
        hs[e] = (buf == 0 && row < B && k < H) ? pk_operand<TS, TF32>(to_f(h[row * ldh + k]))
                                               : 0.f;
    }
    __syncthreads();
    // UPT 2: the thread's first SO_RR_CHUNKS chunks of its rows (unit u's row q, chunks s +
    // 8i) also in registers, once: a step reads only the rest of R from shared memory (UPT 1
    // reads all of R every step: the step's floor, M*H*4 bytes / 128 B a clock). Not all of
    // it: 2 units x G x 4 chunks is 96 floats at GRU H 128, and 128 registers then spilt
    // (nvcc 13.0: 4 chunks spilt 68 bytes at 1 batch a block, 3 none; at 2 batches 2 spilt 8).
    constexpr int NR = UPT == 2 ? (BB == 1 ? SO_RR_CHUNKS : SO_RR_CHUNKS_BB2) : 0;
    float4 rr[UPT * G * (NR > 0 ? NR : 1)];
#pragma unroll
    for (int u = 0; u < UPT; ++u)
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int i = 0; i < NR; ++i) {
                // only the chunks the loop reads: past the row (small H) or past the units
                // (the last warp's idle lanes) the address can leave the shared allocation
                const int k4 = 4 * (s + SO_KS * i);
                rr[(u * G + q) * NR + i] =
                    unit_live && k4 < SR
                        ? pk_lds128(pk_smem_addr(Rs + (q * H + j + u * HU) * SR + k4))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
            }

    for (int t = 0; t < T; ++t) {
        const float* const hcur = hs + (t & 1) * BGP * SR;
        float* const hnext = hs + ((t + 1) & 1) * BGP * SR;
        float acc[NV * G];
#pragma unroll
        for (int v = 0; v < NV * G; ++v) acc[v] = 0.f;
        if (UPT == 2 && unit_live) {
            // every chunk unrolled (R's registers need compile-time indices); the same FMA
            // chain a (unit, batch, gate) as UPT 1's, chunk by chunk
#pragma unroll
            for (int i = 0; i < SO_NCH; ++i) {
                const int k4 = 4 * (s + SO_KS * i);
                if (k4 >= SR) break;
#pragma unroll
                for (int bb = 0; bb < BB; ++bb) {
                    const float4 hv = pk_lds128(pk_smem_addr(hcur + bb * SR + k4));
#pragma unroll
                    for (int u = 0; u < UPT; ++u)
#pragma unroll
                        for (int q = 0; q < G; ++q) {
                            const float4 r = i < NR ? rr[(u * G + q) * NR + i] :
                                pk_lds128(pk_smem_addr(Rs + (q * H + j + u * HU) * SR + k4));
                            float a = acc[(u * BB + bb) * G + q];
                            a = fmaf(r.x, hv.x, a);
                            a = fmaf(r.y, hv.y, a);
                            a = fmaf(r.z, hv.z, a);
                            a = fmaf(r.w, hv.w, a);
                            acc[(u * BB + bb) * G + q] = a;
                        }
                }
            }
        } else if (unit_live) {
            // not unrolled: the 4 chunks' loads hoisted together cost ~G*16 registers more
            // than 64 allow; 32 warps hide a chunk's load latency instead
#pragma unroll 1
            for (int i = 0; i < SO_NCH; ++i) {
                const int k4 = 4 * (s + SO_KS * i);   // this chunk's first column
                if (k4 >= SR) break;
                float4 r[G];
#pragma unroll
                for (int q = 0; q < G; ++q)
                    r[q] = pk_lds128(pk_smem_addr(Rs + (q * H + j) * SR + k4));
#pragma unroll
                for (int bb = 0; bb < BB; ++bb) {
                    const float4 hv = pk_lds128(pk_smem_addr(hcur + bb * SR + k4));
#pragma unroll
                    for (int q = 0; q < G; ++q) {
                        float a = acc[bb * G + q];
                        a = fmaf(r[q].x, hv.x, a);
                        a = fmaf(r[q].y, hv.y, a);
                        a = fmaf(r[q].z, hv.z, a);
                        a = fmaf(r[q].w, hv.w, a);
                        acc[bb * G + q] = a;
                    }
                }
            }
        }
        so_reduce<G, NV, 4>(acc, lane);   // every lane of the warp takes part
        if (sum_lane) {
#pragma unroll
            for (int q = 0; q < G; ++q) gs[cbb * M + q * H + j + cu * HU] = acc[q];
        }
        __syncthreads();   // the step's gate sums are in gs
        if (lv) {
            float sg[G], xb[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                // ((gx + bw) + gh) + br, the fused kernels' order (GRU's n gate: gh_n + br_n)
                const long long k = jc + q * (long long)H;
                const float gh = gs[b * M + q * H + jc];
                xb[q] = xg[q] + __ldg(bw + b * ldbw + k);
                const float brq = __ldg(br + b * ldbr + k);
                sg[q] = (CELL == CELL_GRU && q == 2) ? gh + brq : (xb[q] + gh) + brq;
            }
            float cn = 0.f, a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
            const float hv = pk_cell_update<G, CELL, TS>(sg, xb, carry, cn, a0, a1, a2, a3);
            // h_{t+1}[b, jc] as the product reads it: read after the barrier
            hnext[b * SR + jc] = pk_operand<TS, TF32>(hv);
            // the step's global stores: nothing in the launch reads them back
            const long long row = (long long)t * S + b;   // step t, batch b
            if constexpr (CELL == CELL_LSTM) c[(row + S) * ldc + jc] = cn;
            if constexpr (CELL == CELL_LSTM || CELL == CELL_GRU)
                store_gates(act + row * ldact + jc, H, a0, a1, a2, a3);
            pk_stcg(h + (row + S) * ldh + jc, hv);   // rounded to TS
        }
        // step t+1's gx before the barrier: its latency overlaps the other warps' work
        if (t + 1 < T) prefetch(t + 1);
        // Two barriers a step: the one above (gate sums written -> read) and this one: step
        // t+1 reads h buffer (t+1) & 1, complete after it, and writes buffer t & 1 (at its
        // cell updates, after its first barrier), which every thread finished reading before
        // that; gs is rewritten only after the next step's product, past this barrier.
        __syncthreads();
    }
}

// UPT 2's bodies as functions of their own (not inlined): with both in the entry point the
// register allocator spilt 20 bytes of GRU's at 128 registers; apart, neither spills.
template <int G, int CELL, int BB, class TS, bool TF32>
__device__ __noinline__ void solo_fwd_rr(int Bfull, int H, TS* h, long long ldh, float* c,
                                         long long ldc, float* act, long long ldact,
                                         const float* gx, long long ldgx, const float* w,
                                         long long ldw, const float* bw, long long ldbw,
                                         const float* br, long long ldbr, int T, int B,
                                         int BG) {
    solo_fwd<G, CELL, BB, 2, TS, TF32>(Bfull, H, h, ldh, c, ldc, act, ldact, gx, ldgx, w, ldw,
                                       bw, ldbw, br, ldbr, T, B, BG);
}

// The launch's geometry checked against its arguments, then the body of its BB.
template <int G, int CELL, int UPT, class TS = float, bool TF32 = false>
__device__ __forceinline__ void solo_dispatch(int Bfull, int H, TS* h, long long ldh,
                                              float* c, long long ldc, float* act,
                                              long long ldact, const float* gx,
                                              long long ldgx, const float* w, long long ldw,
                                              const float* bw, long long ldbw,
                                              const float* br, long long ldbr, int T, int U,
                                              int KT) {
    const int nt = blockDim.x;
    if (Bfull < 1 || H < 1 || H > SO_MAX_H || U != H || KT != 4 * ((H + 3) / 4) ||
        nt % 32 != 0 || H % UPT != 0 || nt < SO_KS * H / UPT)
        __trap();
    const int BG = (Bfull + (int)gridDim.x - 1) / (int)gridDim.x;
    const int b_off = (int)blockIdx.x * BG;
    const int B = min(BG, Bfull - b_off);
    const int BB = pk_pow2ceil(BG);
    // R stays in shared memory at UPT 2 too (the chunks not held in registers)
    const long long need = 4LL * ((long long)G * H * KT + 2LL * BB * KT + (long long)BB * G * H);
    if (B < 1 || BB > so_bb_max(G, UPT) || (long long)dynamic_smem_bytes() < need) __trap();
    h += b_off * ldh;   // row b of step t of every array is now row t*S + b
    if (c) c += b_off * ldc;
    if (act) act += b_off * ldact;
    gx += b_off * ldgx;
    bw += b_off * ldbw;
    br += b_off * ldbr;
#define SO_BODY(bb)                                                                         \
    if constexpr (bb <= so_bb_max(G, UPT)) {                                                \
        if (BB == bb) {                                                                     \
            if constexpr (UPT == 2)                                                         \
                solo_fwd_rr<G, CELL, bb, TS, TF32>(Bfull, H, h, ldh, c, ldc, act, ldact, gx, \
                                                   ldgx, w, ldw, bw, ldbw, br, ldbr, T, B, BG); \
            else                                                                            \
                solo_fwd<G, CELL, bb, 1, TS, TF32>(Bfull, H, h, ldh, c, ldc, act, ldact, gx, \
                                                   ldgx, w, ldw, bw, ldbw, br, ldbr, T, B, BG); \
            return;                                                                         \
        }                                                                                   \
    }
    SO_BODY(1) SO_BODY(2) SO_BODY(4)
#undef SO_BODY
    __trap();   // no body for this BB: the fit never asks for one
}

// The fp32 kernels (extern "C"), left out of a module compiled for the typed instantiations
// only (-DRNNRT_TYPED_ONLY: rnnrt/kernels/library.py get_persistent, as persistent.cu's).
#ifndef RNNRT_TYPED_ONLY
extern "C" __global__ void __launch_bounds__(SO_MAX_THREADS, 1) lstm_persistent_solo_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    solo_dispatch<4, CELL_LSTM, 1>(rows, cols, h, ldh, c, ldc, act, ldact, gx, ldgx, w_hh,
                                   ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(SO_MAX_THREADS, 1) gru_persistent_solo_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<3, CELL_GRU, 1>(rows, cols, h, ldh, nullptr, 0, act, ldact, gx, ldgx, w_hh,
                                  ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(SO_MAX_THREADS, 1) rnn_tanh_persistent_solo_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_TANH, 1>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx,
                                       w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                       k_tile);
}

extern "C" __global__ void __launch_bounds__(SO_MAX_THREADS, 1) rnn_relu_persistent_solo_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_RELU, 1>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx,
                                       w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                       k_tile);
}

// The same entry points with R in registers (UPT 2: two units a thread, 512 threads at most,
// 128 registers a thread).
extern "C" __global__ void __launch_bounds__(SO_RR_THREADS, 1) gru_persistent_solo_rr_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<3, CELL_GRU, 2>(rows, cols, h, ldh, nullptr, 0, act, ldact, gx, ldgx, w_hh,
                                  ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(SO_RR_THREADS, 1) rnn_tanh_persistent_solo_rr_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_TANH, 2>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx,
                                       w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                       k_tile);
}

extern "C" __global__ void __launch_bounds__(SO_RR_THREADS, 1) rnn_relu_persistent_solo_rr_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_RELU, 2>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, gx, ldgx,
                                       w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                       k_tile);
}
#endif  // RNNRT_TYPED_ONLY

// The typed instantiations (NVRTC name expressions, rnnrt/kernels/typed.py
// persistent_expression): `K_t<TS, TF32>` for each kernel K above, TS the element type of h
// (float, bf16, fp16), TF32 whether the product reads its operands TF32-rounded; the same
// arguments as K with h a TS*. K_t<float, false> compiles to K's PTX (a test holds it).

template <class TS, bool TF32>
__global__ void __launch_bounds__(SO_MAX_THREADS, 1) lstm_persistent_solo_fwd_t(
        int rows, int cols, TS* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh, int
        ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int
        units_per_block, int k_tile) {
    solo_dispatch<4, CELL_LSTM, 1, TS, TF32>(rows, cols, h, ldh, c, ldc, act, ldact, gx,
        ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(SO_MAX_THREADS, 1) gru_persistent_solo_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<3, CELL_GRU, 1, TS, TF32>(rows, cols, h, ldh, nullptr, 0, act, ldact, gx,
        ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(SO_MAX_THREADS, 1) rnn_tanh_persistent_solo_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_TANH, 1, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr, 0,
        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(SO_MAX_THREADS, 1) rnn_relu_persistent_solo_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_RELU, 1, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr, 0,
        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(SO_RR_THREADS, 1) gru_persistent_solo_rr_fwd_t(
        int rows, int cols, TS* h, int ldh, float* act, int ldact, unsigned int* sync, int
        ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<3, CELL_GRU, 2, TS, TF32>(rows, cols, h, ldh, nullptr, 0, act, ldact, gx,
        ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(SO_RR_THREADS, 1) rnn_tanh_persistent_solo_rr_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_TANH, 2, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr, 0,
        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}

template <class TS, bool TF32>
__global__ void __launch_bounds__(SO_RR_THREADS, 1) rnn_relu_persistent_solo_rr_fwd_t(
        int rows, int cols, TS* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    solo_dispatch<1, CELL_RNN_RELU, 2, TS, TF32>(rows, cols, h, ldh, nullptr, 0, nullptr, 0,
        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block, k_tile);
}
