/*
 * persistent.cu: persistent recurrent kernels, v3 (forward, fp32). ONE launch runs ALL T
 * steps of ONE layer's recurrence: R stays in shared memory for the whole sequence, every
 * block works on every step, and the blocks meet at a barrier between steps instead of
 * ending a kernel. W x is not done here: gx = W x_t for all t comes from one cuBLAS GEMM
 * before the launch. Two kernels a cell, one template (persistent_fwd<G, CELL, CL>):
 *   the grid kernels `*_persistent_fwd`: one block per SM over the whole GPU, h_t staged
 *     from L2 every step, a flag barrier in global memory (any H whose R slice fits);
 *   the cluster kernels `*_persistent_cluster_fwd` (sm_90+): thread-block clusters of
 *     PK_CLUSTER = 8 blocks, each cluster holding all of R and running its own slice of the
 *     batch; each block pushes its units of h_{t+1} straight into every block's shared memory
 *     (distributed shared memory) and the cluster meets at the hardware cluster barrier: no
 *     L2 round trip and no global barrier a step (small H: R / 8 must fit one block).
 *
 * The cluster kernel, LSTM H 128 B 32 (NOTES.md, sessions 4-5): 6.5-7.0 us a step first,
 * 4.1 with each output tile stored once, 3.3-3.6 (H200) with lanes of up to 16 row groups,
 * the cells' indices and biases hoisted out of the step loop, gx + bw added in the pointwise
 * and the step's global stores and gx loads moved between the cluster barrier's arrive
 * and wait (its release is a MEMBAR.ALL.GPU that waited for them).
 * History, LSTM H 512 B 64 on the lent H100 (experiments/persistent_bench.py): v1 44 us a
 * step (latency bound: h_t in 8 serial tile round trips); v2 11.7 us (all of h_t in one
 * tile, 16-byte staging loads, pointwise inputs prefetched). v2's phases, timed by leaving
 * each out (PK_TIMING below): FMAs 4.5 us (each thread 4 gates x 4 batches: 8 shared loads
 * of 16 bytes per 64 FMAs, half of them 2-way conflicted), the pointwise tail 3.4 us (64
 * of 512 threads summed 7 partial sums and ran 20 transcendentals each, one after another),
 * the barrier 2 us, the staging 1.7 us (a block-wide load phase before any FMA).
 * v3: (1) each warp is a split-K slice of a small GEMM, R_slice [G*U, H] x h_t^T [H, B]:
 * a lane accumulates a PK_TM x PK_TB register tile (4 rows x 8 batches: 12 shared loads of
 * 16 bytes per 128 FMAs, broadcast-friendly and conflict-free); (2) each warp stages only
 * the columns of h_t it multiplies, with cp.async (16 bytes, L2, no registers) in two halves,
 * multiplying the first while the second is in flight, synchronising with __syncwarp only;
 * (3) the pointwise update is spread over every thread of the block, one (b, j) cell each
 * (up to PK_CPT), summing the warps' partial tiles from shared memory.
 *
 * Calling convention (rnnrt/kernels.py builds the arguments; registry entries have
 * persistent=True):
 *   kernel(int rows = B, int cols = H, outs..., ins..., int T, int units_per_block,
 *          int k_tile)
 *   each view a (pointer, int ld) pair, row-major: element (r, c) at p[r*ld + c]; ld = 0
 *   broadcasts one row (the biases). The pointers are float*, except the barrier counters
 *   `sync` (unsigned int*). Gate q of hidden unit j is column q*H + j (torch order: LSTM
 *   i, f, g, o; GRU r, z, n). Time-major sequences are one view of T*B (or (T+1)*B) rows:
 *   step t, batch b is row t*B + b. No output may overlap an input (h[0] and c[0] are read
 *   from the outputs' own slot 0, which the kernel never writes).
 *
 * Kernels (one variant each, fp32; per step t = 0..T-1, for every (b, j)):
 *   kernel lstm_persistent_fwd(rows = B, cols = H)
 *       gh_q = sum_k R[q*H + j, k] h_t[b, k];  pre_q = ((gx + bw) + gh) + br   (per gate q)
 *       i, f, g, o = sigma(pre_0), sigma(pre_1), tanh(pre_2), sigma(pre_3)
 *       c_{t+1} = f * c_t + i * g;  h_{t+1} = o * tanh(c_{t+1})   (lstm_fwd's arithmetic)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out c      [T+1, B, H]   c[0] = c0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    i, f, g, o after activation, for the backward pass
 *     out sync   [1, 2]        barrier counters (unsigned int): zero on entry, zero on exit
 *     in  gx     [T, B, 4H]    W x_t without bias (the input GEMM)
 *     in  w_hh   [4H, H]       R = weight_hh, row-major
 *     in  bw     [B, 4H]       b_ih, usually ld 0 (the zeros buffer without bias)
 *     in  br     [B, 4H]       b_hh, usually ld 0
 *     int T                    steps (>= 1)
 *     int units_per_block      U: block x owns hidden units [x*U, min(H, x*U + U))
 *     int k_tile               KT: columns of h_t a tile, a positive multiple of 4
 *   kernel gru_persistent_fwd(rows = B, cols = H)
 *       r = sigma(((gx_r + bw_r) + gh_r) + br_r);  z likewise;  hn = gh_n + br_n
 *       n = tanh((gx_n + bw_n) + r * hn);  h_{t+1} = n + z * (h_t - n)   (gru_fwd's)
 *     out h      [T+1, B, H]   h[0] = h0 is read; slots 1..T are written
 *     out act    [T, B, 4H]    r, z, n, hn (columns 0, H, 2H, 3H)
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_fwd(rows = B, cols = H)   h_{t+1} = tanh(((gx + bw) + gh) + br)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_fwd(rows = B, cols = H)   h_{t+1} = max(((gx+bw)+gh)+br, 0)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   The cluster kernels: the same arithmetic and arguments as the grid kernel of their cell
 *   (sync is not touched; units_per_block U >= ceil(H / PK_CLUSTER); k_tile >= H: one tile).
 *   kernel lstm_persistent_cluster_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out c      [T+1, B, H]
 *     out act    [T, B, 4H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, 4H]
 *     in  w_hh   [4H, H]
 *     in  bw     [B, 4H]
 *     in  br     [B, 4H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel gru_persistent_cluster_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out act    [T, B, 4H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, 3H]
 *     in  w_hh   [3H, H]
 *     in  bw     [B, 3H]
 *     in  br     [B, 3H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_tanh_persistent_cluster_fwd(rows = B, cols = H)
 *     out h      [T+1, B, H]
 *     out sync   [1, 2]
 *     in  gx     [T, B, H]
 *     in  w_hh   [H, H]
 *     in  bw     [B, H]
 *     in  br     [B, H]
 *     int T
 *     int units_per_block
 *     int k_tile
 *   kernel rnn_relu_persistent_cluster_fwd(rows = B, cols = H)
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
 *   The stack kernel: every layer of an LSTM stack in one launch, W.x inside (see "Stack
 *   kernel" below; views of all L layers at once: layer l's rows of h and c are
 *   l*(T+1)*B + s*B + b, of act l*T*B + t*B + b; input size = hidden):
 *   kernel lstm_persistent_stack_fwd(rows = B, cols = H)
 *       pre = (sum_k W_l[r, k] in_t[b, k] + sum_k R_l[r, k] h_t[b, k]) + b_ih + b_hh, then
 *       lstm_fwd's arithmetic; in_t = x_t for layer 0, layer l-1's h_{t+1} above it
 *     out h      [L*(T+1)*B, H]  slot 0 of every layer (h0) is read; slots 1..T written
 *     out c      [L*(T+1)*B, H]  likewise (c0)
 *     out act    [L*T*B, 4H]     i, f, g, o of every layer and step
 *     out sync   [1, 2L]         word 2l: layer l's progress (blocks x steps done); word 1:
 *                                blocks gone; word 3: blocks past the prologue. Zero on
 *                                entry, zero on exit (so L >= 2)
 *     out wt     [L*H, 4H]       scratch: each layer's W^T (the prologue writes it)
 *     out ht     [(L+1)*(T+1)*H, 64]  scratch, ld 64: the k-major inputs, slot m*(T+1) + s
 *                                of H rows (row k: batches 0..B-1): m = 0 x_{s-1}^T, m = l+1
 *                                layer l's h_s^T (slot 0 = h0^T from the prologue)
 *     in  x      [T*B, H]        the input sequence
 *     in  w_ih   [L, 4*H*H]      row l: layer l's weight_ih [4H, H], row-major (ld: the
 *                                distance between layers in the flat parameters)
 *     in  w_hh   [L, 4*H*H]      row l: layer l's weight_hh
 *     in  bw     [L, 4H]         b_ih of each layer (ld 0: one row for all)
 *     in  br     [L, 4H]         b_hh
 *     int T                      steps (>= 1)
 *     int L                      layers
 *     int units_per_block        U: G*U = PS_M rows a block (16 for LSTM)
 * Decomposition (rnnrt/persistent.py computes it for the host and emulates it in NumPy):
 *   grid = ceil(H / U) blocks, one per SM; block x owns units j in [x*U, x*U + U) and ALL G
 *   gate rows q*H + j of them, so the pointwise update is local to the block. Before the
 *   first step it copies those M = G*U rows of R into shared memory (row q*U + ju holds
 *   R[q*H + x*U + ju, :], padded to SR floats, zeros past H and past the block's units).
 *   Block of NT threads = NW warps (NT a multiple of 32, at most PK_MAX_THREADS).
 *   Lanes of a warp: LR row groups x LB batch groups x LK k-groups (LR*LB*LK = 32):
 *     LR = min(PK_LR_MAX, pow2ceil(ceil(M / PK_TM))), LB = min(32 / LR,
 *     pow2ceil(ceil(B / PK_TB))),
 *     LK = 32 / (LR * LB); lane = (lk * LB + lb) * LR + lr. Lane (lr, lb, lk) of warp w is
 *     k-group kg = w * LK + lk (NKG = NW * LK k-groups); in output tile (rt, bt) (RT =
 *     ceil(M / (PK_TM*LR)) x BT = ceil(B / (PK_TB*LB)) tiles) it owns rows
 *     rt*PK_TM*LR + lr + LR*i (i < PK_TM) and batches bt*PK_TB*LB + lb + LB*i (i < PK_TB).
 *   Each step h_t goes through shared memory in tiles of KT = k_tile columns (ceil(H / KT)
 *   tiles; one where it fits). A tile has CH = ceil(min(KT, H - k0) / 4) float4 chunks;
 *   warp w owns chunks [w*CPW, (w+1)*CPW) of every tile (CPW = ceil(KT / 4 / NW), clipped
 *   to CH; the same columns every tile, so no warp ever writes columns another warp reads)
 *   and stages them itself, in two cp.async groups (the first ceil(n/2) chunks, then the
 *   rest); lane group lk multiplies chunks lk, lk + LK, ... of each half. The halves are a
 *   ping-pong across the h tiles: each half of tile k+1 is staged as soon as the same half
 *   of tile k is multiplied. With one output tile (RT = BT = 1) the lane keeps its sums in
 *   registers over all tiles and writes them once a step into its k-group's partial sums
 *   red[kg][r][b]; with several it adds each half's sums of each output tile into red
 *   (stored on the step's first half, added after). Each partial element has one writer.
 *   Pointwise (after one __syncthreads): thread tid updates cells e = tid + i*NT, i < CPT =
 *   ceil(U*B / NT) <= PK_CPT, jj = e % U, b = e / U (cells of units past H: none); its gate
 *   sums are red[0] + red[1] + ... + red[NKG-1] in that order, then ((gx + bw) + gh) + br
 *   as the fused per-step kernels. It loads its cells' biases once, step t+1's gx before
 *   the barrier that ends step t (the latency hides under it and the next FMA phase: gx is
 *   first used in the pointwise) and keeps c_t (LSTM) / h_t (GRU) of its cells in
 *   registers.
 *   Dynamic shared memory, in floats: M*SR (R slice) + B*SH (h tile, SH = 4*((KT/4) | 1):
 *   an odd number of float4s, so one column of 8 consecutive rows falls in 8 different
 *   groups of 4 banks) + NKG*M*BP (partial sums, BP = 32*ceil((B - LB) / 32) + LB: BP = LB
 *   mod 32, so a warp's LR x LB partial stores hit 32 different banks).
 *
 * Cluster kernels (the same decomposition inside a block, with these differences):
 *   the grid is NC clusters of PK_CLUSTER blocks (NC = gridDim.x / PK_CLUSTER, fixed by
 *   __cluster_dims__); cluster n owns batches [n*BG, n*BG + BG), BG = ceil(B / NC) (the
 *   last may have fewer; none may be empty), and its block of rank r owns units
 *   [r*U, r*U + U) of those batches, with all G gate rows: each cluster holds all of R.
 *   The layout is sized for BG batches; the h tile is two buffers [2][BG][SH] of all of h_t
 *   (k_tile >= H). Before the first step each block copies its R rows and h_0 of its
 *   batches into buffer 0 (zeros in the columns past H of both buffers), then the cluster
 *   barrier. Step t multiplies buffer t & 1 in the same halves and order as the grid kernel
 *   (nothing to stage or wait for); the pointwise writes h_{t+1}[b, j] to global memory and
 *   to buffer (t+1) & 1 of every block of the cluster (mapa + st.shared::cluster), then
 *   every thread of the cluster meets at barrier.cluster.arrive.release /
 *   wait.acquire (after every step, the last too); the step's global stores (h, c, act:
 *   nothing in the launch reads them) and the loads of step t+1's gx are issued between
 *   the arrive and the wait, so the release waits only for the pushes. Why one barrier a
 *   step is enough: a
 *   block pushes into buffer (t+1) & 1 only after the barrier that ended step t-1, which
 *   every block passed after it finished reading that buffer (at step t-1); the barrier
 *   after step t makes every push visible before step t+1 reads it, orders the partial
 *   sums (red) as __syncthreads would, and keeps every block alive until no block can
 *   push to it any more. No deadlock: a cluster is scheduled whole (its blocks are
 *   co-resident by construction) and clusters never wait for each other.
 *
 * Barrier contract of the grid kernels (flag-based, no cooperative launch, so it can be
 * captured in a graph):
 *   sync[0] counts arrivals, sync[1] departures. Between step t and t+1 every block does
 *   __syncthreads(); thread 0: fence.acq_rel.gpu; atomicAdd(&sync[0], 1); spin until a relaxed
 *   load of sync[0] >= (t+1)*gridDim.x; fence.acq_rel.gpu; then __syncthreads(). The fence (cumulative through
 *   the first __syncthreads) publishes the block's h_{t+1} before its arrival counts; the
 *   fence after the spin and the second __syncthreads order every later read of h_{t+1} after all
 *   arrivals. There is no barrier after the last step. On exit thread 0 adds 1 to sync[1];
 *   the block that sees gridDim.x - 1 (the last out) resets both counters to 0: by then every
 *   block has passed its last spin, so no block can read the reset, and the next kernel on
 *   the stream (or the next graph replay) starts from zero.
 *   Why it cannot deadlock: a block spins only until all gridDim.x blocks have arrived at the
 *   same barrier, and every block that runs reaches it (no early exits, uniform loop bounds).
 *   That needs every block of the grid to be RUNNING at once: a block that is not yet
 *   resident waits for an SM that a spinning block never gives back. So the host must
 *   guarantee co-residency: gridDim.x <= SMs x (max active blocks per SM of this kernel at
 *   this block size and dynamic shared memory; the fit uses one block per SM and checks its
 *   shared memory, threads and registers; the occupancy API confirms it on the device), and
 *   must never run two persistent kernels concurrently (two grids that each hold part of the
 *   GPU and wait for the rest deadlock; one sync buffer also serves one launch at a time).
 *   Other kernels running beside it only delay it (their blocks finish and free their SMs).
 *   A spin that lasts PK_SPIN_LIMIT clock cycles (~8.6 s at 2 GHz) traps, so a broken
 *   co-residency guarantee fails the launch instead of hanging the GPU. A launch whose
 *   geometry disagrees with its arguments (fewer units than H, threads not whole warps, more than PK_CPT cells a thread,
 *   k_tile not a positive multiple of 4, less dynamic shared memory than the layout needs
 *   for its k_tile) traps at once. After a failed launch the host must zero sync again.
 *
 * Stack kernel (lstm_persistent_stack_fwd; rnnrt/stack.py fits it):
 *   the grid is L groups of NB = H / U blocks (one block a SM, all resident: the fit
 *   checks L*NB <= SMs); block x is layer l = x / NB, rank x % NB, owning units
 *   [rank*U, rank*U + U) with all 4 gate rows (row q*U + ju of the block is gate row
 *   q*H + rank*U + ju). A step is a GEMM of the block's [W_l | R_l] rows (PS_M x 2H) by
 *   [in_t ; h_t] (2H x B) in 2*H/PS_KT tiles of PS_KT k rows, every operand k-major (a k's
 *   64 gate rows, a k's 64 batches contiguous): tiles 0..NK-1 stream W^T's rows and the
 *   input's through PS_NS shared stages (cp.async), tiles NK.. stream h_t^T's and multiply
 *   the R slice, which the block copied into shared memory once, k-major.
 *   Prologue: every block transposes a share of W (all layers, into wt), x (all steps) and
 *   h0 (all layers, into ht) through 32 x 33 shared tiles, then counts on sync[3]; every
 *   block waits for all gridDim.x arrivals before its first step. Each step's pointwise
 *   stores h_{t+1}^T into ht beside h_{t+1}: the next reads of it are k-major.
 *   Lanes: warp w is k-group w (8 of them), taking k rows w*PS_KPW .. + PS_KPW of every
 *   tile, and copying exactly those rows itself: no block barrier in the K loop, a lane's
 *   cp.async wait and __syncwarp show a tile to its warp, and a warp refills a stage only
 *   after it read its own rows of it (warps run up to PS_NS - 1 tiles apart). Lane
 *   (lr = lane & 3, lb = lane >> 2) accumulates rows 16g + 4lr + e (g, e < 4) by batches
 *   32h + 4lb + f (h < 2, f < 4): per k 6 float4 loads (4 of A^T, 2 of X^T), 128 FMAs,
 *   the next k's loaded first. After the K loop the stages become the partial sums
 *   red[m][b][row] (m < 4, row stride PS_RP = 68): warps 4..7 store theirs, warps 0..3 add
 *   theirs in place; thread tid updates cells e = tid + 256i: jj = e % U, b the (e / U)-th
 *   of 0, 4, 1, 5, ... (conflict-free reads, coalesced h stores), sums the 4 partials in
 *   order, adds b_ih then b_hh (kept in shared memory), keeps c_t in registers; the
 *   activations use the approximate exp and division (PS_FAST_CELL; ~1e-6 relative).
 *   Waits: layer l's step t reads layer l-1's h_{t+1}^T (tiles < NK; for layer 0 x_t^T)
 *   and its own layer's h_t^T (tiles >= NK). After its step t every block: stores h^T,
 *   __syncthreads; thread 0: fence.acq_rel.gpu; atomicAdd(&sync[2l], 1) (release), then
 *   the block stores c, the gates and h (streaming: nothing in the launch reads them).
 *   Lane 0 of every warp waits (relaxed poll, then one ld.acquire.gpu: a fence there would
 *   also wait for the warp's copies in flight; the __syncwarp after it shows the wait to
 *   the warp) for sync[2(l-1)] >= (t+1)*NB before the step's first tile is issued and
 *   for sync[2l] >= t*NB before tile NK is (PS_NS - 1 tiles earlier, under the W half's
 *   FMAs; at the step's top when that is in the prologue). Outputs are never overwritten
 *   (every step has its own slots), so a layer may run any number of steps ahead of the
 *   layer above it. Deadlock-free: layer 0 waits only for its own blocks; if layers < l
 *   finish every step, layer l does (all blocks resident, uniform loops, no early exit;
 *   the prologue's count is unconditional). On exit thread 0 adds 1 to sync[1]; the last
 *   block out (gridDim.x - 1 before it) zeroes every layer's word, sync[1] and sync[3]:
 *   every block has passed its last wait.
 *   History, LSTM H 512 B 64 four layers (experiments/stack_bench.py, H100 unless said):
 *   v1 5.54 ms (each LDS.128 is 4 shared wavefronts: the 8 x 8 lane tile held the shared
 *   pipe as busy as the FMA pipe; the pointwise ~8 us a step); v2 4.17 ms (cells
 *   jj-fastest, biases in shared memory, U compile-time; profile: 23.3 K instructions a
 *   warp a step, 6.7 K of them not FFMAs, ~2.5 K the cp.async address arithmetic); v3
 *   (session 7, operands k-major, 16 x 8 lane tile, 8 k-groups) 4.00 ms (H200), 64-row
 *   tiles in 3 stages 3.45 (H200: 20.8 K instructions a warp a step), h^T published
 *   before the other stores 3.37 (H200), per-warp pipeline without block barriers 3.28
 *   (H200), acquire load for the fence 3.26 (H200), fast cell math 3.14 (precise 3.25 in
 *   the same process; 32-row tiles in 6 / 5 stages: 3.68 / 3.49 against 3.21).
 *
 * Resources (sm_90, nvcc 13.0 --resource-usage; the grid and the cluster kernels alike;
 *   rnnrt.persistent.NVCC_REGS holds the larger of nvcc's and NVRTC's count):
 *   __launch_bounds__(PK_MAX_THREADS = 256, 1), so a thread may have up to 255 registers
 *   (256 x 255 < one SM's 64 K). Registers: see NVCC_REGS. No static shared memory.
 *   Dynamic shared memory by the layout above, e.g. LSTM B 64 H 512 on 132 SMs, 256
 *   threads (U 4, M 16, lanes 4 x 8 x 1, NKG 8, k_tile 512, one tile): 33,024 (R) +
 *   132,096 (h tile) + 36,864 (partials) = 201,984 bytes.
 *   The stack kernel: 253-255 registers (nvcc / NVRTC; rnnrt.stack.PS_REGS = 255, no
 *   spills: tests hold both), dynamic shared memory H*64*4 (R) + PS_NS * 32 KB (stages) +
 *   512 (biases): 229,888 bytes at H 512.
 */

// Timing variants, for experiments/persistent_bench.py --variants only (they compute wrong
// results on purpose; rnnrt never defines PK_TIMING): a bit mask of the phases to leave out,
// to split a step's time between them.  1: staging h_t from L2 (cluster kernels: the pushes
// of h_{t+1} into the cluster's blocks);  2: the FMAs;  4: the grid barrier (blocks run
// free; the exit still resets the counters; cluster kernels: the per-step cluster barrier,
// a __syncthreads instead, and one cluster barrier before exit);  8: the pointwise update
// (no gate sums, no activations, no stores).
#ifndef PK_TIMING
#define PK_TIMING 0
#endif

#define PK_TM 4                // register tile: rows of the R slice a lane accumulates
#define PK_TB 8                // register tile: batches a lane accumulates
#define PK_CPT 2               // pointwise: most (b, j) cells one thread updates
#define PK_LR_MAX 16           // most row groups of a warp's lanes (LR x LB <= 32 in any case)
#define PK_MAX_THREADS 256     // __launch_bounds__ and the fit's cap on threads a block
#define PK_CLUSTER 8           // blocks a cluster of the cluster kernels (the portable maximum)
#ifndef PK_SPIN_LIMIT
#define PK_SPIN_LIMIT (1LL << 34)   // clock cycles one barrier may spin before it traps
#endif

#define CELL_LSTM 0
#define CELL_GRU 1
#define CELL_RNN_TANH 2
#define CELL_RNN_RELU 3

// sigma(x) from exp of a non-positive number only: no overflow for large |x|, no inf/inf.
__device__ __forceinline__ float sigmoidf(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

// The four saved gate values of one (b, j) for the backward pass: act columns j, H + j,
// 2H + j, 3H + j (LSTM i, f, g, o; GRU r, z, n, hn), a pointing at column j.
__device__ __forceinline__ void store_gates(float* a, int H, float v0, float v1, float v2,
                                            float v3) {
    a[0] = v0;
    a[H] = v1;
    a[2 * (long long)H] = v2;
    a[3 * (long long)H] = v3;
}

// Row stride (floats) of a shared-memory array whose rows hold n floats: n rounded up to
// float4s, made an odd number of float4s, so that the same column of 8 consecutive rows
// (a quarter warp's 16-byte reads) falls in 8 different groups of 4 banks. Used for the R
// slice (n = H) and for the h tile (n = k_tile, a multiple of 4: 4 * ((k_tile/4) | 1)).
__device__ __forceinline__ int pk_stride_r(int H) { return 4 * (((H + 3) / 4) | 1); }

// The hardware primitives. tests/persistent_host_sim.cpp defines PK_HOST_SIM and its own
// versions of them (and of __syncthreads, __syncwarp, the atomics, the cache-hinted loads,
// ...) to run this file's kernels on CPU threads, one per CUDA thread, all blocks at once.
#ifndef PK_HOST_SIM
__device__ __forceinline__ unsigned int dynamic_smem_bytes() {
    unsigned int v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

__device__ __forceinline__ float* dynamic_smem() {
    extern __shared__ float4 smem4[];   // float4: 16-byte aligned
    return reinterpret_cast<float*>(smem4);
}

// 16 bytes from global (through L2, not L1: other blocks wrote them during this launch) to
// shared memory, asynchronously: no registers, any number in flight. dst and src 16-byte
// aligned. Completion: pk_cp_commit() closes a group, pk_cp_wait<N>() waits until at most
// N of this thread's groups are pending; then __syncwarp() shows the data to the warp.
__device__ __forceinline__ void pk_cp_async16(float* dst, const float* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(static_cast<unsigned int>(__cvta_generic_to_shared(dst))), "l"(src)
                 : "memory");
}
// The 32-bit shared-memory address of p, and a 16-byte shared load from one.
typedef unsigned int pk_saddr;
__device__ __forceinline__ pk_saddr pk_smem_addr(const float* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ float4 pk_lds128(pk_saddr a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}

// The grid barrier's ordering: a gpu-scope acq_rel fence (not __threadfence's fence.sc,
// MEMBAR.SC in SASS), and the spin's plain relaxed load (an ld.acquire polls with an L1
// invalidation, CCTL.IVALL, every time round; one fence after the spin orders what follows).
__device__ __forceinline__ void pk_fence_acq_rel() {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
// An acquire load (the stack kernel's waits end with one instead of a fence: a fence would
// also wait for the warp's cp.async copies in flight).
__device__ __forceinline__ unsigned int ld_acquire_gpu(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned int ld_relaxed_gpu(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Thread-block clusters (sm_90): this block's rank in its cluster, the cluster's index in
// the grid and the number of clusters; the cluster barrier (every thread of every block of
// the cluster; release / acquire: shared-memory writes to any block of the cluster before
// it are seen by every thread after it); and a 4-byte store into block `rank`'s shared
// memory at the address that `local` is in this block's (mapa: the same offset there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900   // no clusters: the grid kernels only
__device__ __forceinline__ unsigned int pk_cluster_rank() { __trap(); return 0; }
__device__ __forceinline__ unsigned int pk_cluster_id() { __trap(); return 0; }
__device__ __forceinline__ unsigned int pk_clusters() { __trap(); return 1; }
__device__ __forceinline__ void pk_cluster_sync() { __trap(); }
__device__ __forceinline__ void pk_cluster_arrive() { __trap(); }
__device__ __forceinline__ void pk_cluster_wait() { __trap(); }
__device__ __forceinline__ void pk_st_cluster(pk_saddr, unsigned int, float) { __trap(); }
#else
__device__ __forceinline__ unsigned int pk_cluster_rank() {
    unsigned int v;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(v));
    return v;
}
__device__ __forceinline__ unsigned int pk_cluster_id() {
    unsigned int v;
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ unsigned int pk_clusters() {
    unsigned int v;
    asm("mov.u32 %0, %%nclusterid.x;" : "=r"(v));
    return v;
}
__device__ __forceinline__ void pk_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The same barrier in two halves: work between them overlaps the wait for the others (it
// must not touch what the barrier orders: the cluster's shared buffers).
__device__ __forceinline__ void pk_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void pk_cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void pk_st_cluster(pk_saddr local, unsigned int rank, float v) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
}
#endif

// Fetch the 128-byte line at p into L2 (a hint: no registers, nothing waits for it).
__device__ __forceinline__ void pk_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
__device__ __forceinline__ void pk_cp_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void pk_cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
#endif

// Every block waits here until all gridDim.x blocks have arrived `target / gridDim.x` times.
__device__ __forceinline__ void grid_barrier(unsigned int* sync, unsigned int target) {
    __syncthreads();   // the whole block's writes of this step are issued
    if (threadIdx.x == 0) {
        pk_fence_acq_rel();   // ... and visible GPU-wide before the arrival counts (release)
        atomicAdd(sync, 1u);
        const long long start = clock64();
        while (ld_relaxed_gpu(sync) < target) {
            if (clock64() - start > PK_SPIN_LIMIT) __trap();   // not co-resident: fail, not hang
        }
        pk_fence_acq_rel();   // acquire: every arrival's writes before this block's reads
    }
    __syncthreads();   // no thread reads the next step's h before thread 0 saw all arrivals
}

// The last block out resets the counters for the next launch (see the header).
__device__ __forceinline__ void grid_exit(unsigned int* sync) {
    if (threadIdx.x == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        atomicExch(sync, 0u);
        atomicExch(sync + 1, 0u);
    }
}

__device__ __forceinline__ int pk_pow2ceil(int x) {
    int p = 1;
    while (p < x) p <<= 1;
    return p;
}

// The decomposition of one block (the header's Decomposition; rnnrt/persistent.py's
// geometry() computes the same numbers for the host).
struct PkGeom {
    int M;            // rows of the R slice: G * U
    int LR, LB, LK;   // lanes of a warp: row groups x batch groups x k-groups (product 32)
    int NW, NKG;      // warps; k-groups = NW * LK
    int RT, BT;       // output tiles (rows x batches) a lane loops over
    int CPW;          // float4 chunks of a tile each warp owns
    int SR, SH, BP;   // row strides (floats): R slice, h tile, partial sums
};

__device__ __forceinline__ PkGeom pk_geometry(int G, int U, int B, int H, int KT, int nt) {
    PkGeom g;
    g.M = G * U;
    g.LR = min(PK_LR_MAX, pk_pow2ceil((g.M + PK_TM - 1) / PK_TM));
    g.LB = min(32 / g.LR, pk_pow2ceil((B + PK_TB - 1) / PK_TB));
    g.LK = 32 / (g.LR * g.LB);
    g.NW = nt / 32;
    g.NKG = g.NW * g.LK;
    g.RT = (g.M + PK_TM * g.LR - 1) / (PK_TM * g.LR);
    g.BT = (B + PK_TB * g.LB - 1) / (PK_TB * g.LB);
    g.CPW = (KT / 4 + g.NW - 1) / g.NW;
    g.SR = pk_stride_r(H);
    g.SH = pk_stride_r(KT);
    g.BP = 32 * ((B - g.LB + 31) / 32) + g.LB;
    return g;
}

// One warp stages chunks [ca, cb) (float4 columns k0 + 4*cc) of rows [0, B) of h_t into the
// h tile. 16-byte cp.async where every row of h_t starts 16-byte aligned and has whole
// float4s (vec); else 4-byte loads (zeros past H) stored at once. A warp's consecutive lanes
// take consecutive chunks of one row.
__device__ __forceinline__ void pk_stage(float* hs, int SH, const float* ht, long long ldh,
                                         int B, int H, int k0, int ca, int cb, bool vec,
                                         int lane) {
    if (PK_TIMING & 1) return;
    const int n = cb - ca;
    if (n <= 0) return;
    // word e = lane + 32*it is (b, cc) = (e / n, ca + e % n); one division here, then the
    // lane's next word is 32 words on: dq rows and dr chunks further, wrapping at n. The
    // addresses step with it (the first profiles of v3 spent ~50, then ~36 instructions a
    // 16-byte copy on dividing and 64-bit address arithmetic in the loop).
    int b = lane / n, cc = lane - b * n;
    const int dq = 32 / n, dr = 32 - dq * n;
    const float* src = ht + b * ldh + k0 + 4 * (ca + cc);
    float* dst = hs + b * SH + 4 * (ca + cc);
    const long long s_step = dq * ldh + 4 * dr, s_wrap = ldh - 4 * n;
    const int d_step = dq * SH + 4 * dr, d_wrap = SH - 4 * n;
    int k = k0 + 4 * (ca + cc);   // the column of src (only the 4-byte path needs it)
    while (b < B) {
        if (vec) {
            pk_cp_async16(dst, src);
        } else {
#pragma unroll
            for (int u = 0; u < 4; ++u) dst[u] = (k + u < H) ? __ldcg(src + u) : 0.f;
        }
        b += dq;
        cc += dr;
        src += s_step;
        dst += d_step;
        k += 4 * dr;
        if (cc >= n) {
            cc -= n;
            ++b;
            src += s_wrap;
            dst += d_wrap;
            k -= 4 * n;
        }
    }
}

// acc[i][jb] += R rows . h batches over one float4 chunk (rv: PK_TM rows, hv: PK_TB batches)
__device__ __forceinline__ void pk_fma_chunk(float (&acc)[PK_TM][PK_TB], const float4 (&rv)[PK_TM],
                                             const float4 (&hv)[PK_TB]) {
#pragma unroll
    for (int i = 0; i < PK_TM; ++i)
#pragma unroll
        for (int jb = 0; jb < PK_TB; ++jb) {
            acc[i][jb] = fmaf(rv[i].x, hv[jb].x, acc[i][jb]);
            acc[i][jb] = fmaf(rv[i].y, hv[jb].y, acc[i][jb]);
            acc[i][jb] = fmaf(rv[i].z, hv[jb].z, acc[i][jb]);
            acc[i][jb] = fmaf(rv[i].w, hv[jb].w, acc[i][jb]);
        }
}

// acc += chunks c0 + lk, c0 + lk + LK, ... < c1 of one output tile; ra / ha: the tile's 12
// shared addresses at chunk c0 + lk, advanced past the last chunk read. The next chunk's 12
// loads are issued before the current chunk's 128 FMAs (the first profile of v3 showed every
// chunk's FMAs waiting on their own loads: with 2 warps a scheduler nothing else hid it).
__device__ __forceinline__ void pk_fma_range(float (&acc)[PK_TM][PK_TB], pk_saddr (&ra)[PK_TM],
                                             pk_saddr (&ha)[PK_TB], int c0, int c1, int lk,
                                             int LK) {
    if (PK_TIMING & 2) return;
    int cc = c0 + lk;
    if (cc >= c1) return;
    const unsigned int step = 16u * LK;
    float4 rv[PK_TM], hv[PK_TB];
#pragma unroll
    for (int i = 0; i < PK_TM; ++i) { rv[i] = pk_lds128(ra[i]); ra[i] += step; }
#pragma unroll
    for (int i = 0; i < PK_TB; ++i) { hv[i] = pk_lds128(ha[i]); ha[i] += step; }
    for (cc += LK; cc < c1; cc += LK) {
        float4 rn[PK_TM], hn[PK_TB];
#pragma unroll
        for (int i = 0; i < PK_TM; ++i) { rn[i] = pk_lds128(ra[i]); ra[i] += step; }
#pragma unroll
        for (int i = 0; i < PK_TB; ++i) { hn[i] = pk_lds128(ha[i]); ha[i] += step; }
        pk_fma_chunk(acc, rv, hv);
#pragma unroll
        for (int i = 0; i < PK_TM; ++i) rv[i] = rn[i];
#pragma unroll
        for (int i = 0; i < PK_TB; ++i) hv[i] = hn[i];
    }
    pk_fma_chunk(acc, rv, hv);
}

// The 12 shared addresses of lane (lr, lb)'s rows and batches in output tile (r0, b0) at
// float4 chunk c of the h tile at column k0: 32-bit, stepped by pk_fma_range (the first
// profile of v3 spent ~1,200 address instructions a step on 64-bit pointers). Rows / batches
// past the block's are read clamped (never stored).
__device__ __forceinline__ void pk_addresses(const PkGeom& g, const float* Rs, const float* hs,
                                             int B, int k0, int c, int r0, int b0,
                                             pk_saddr (&ra)[PK_TM], pk_saddr (&ha)[PK_TB]) {
#pragma unroll
    for (int i = 0; i < PK_TM; ++i)
        ra[i] = pk_smem_addr(Rs + min(r0 + g.LR * i, g.M - 1) * g.SR + k0 + 4 * c);
#pragma unroll
    for (int i = 0; i < PK_TB; ++i)
        ha[i] = pk_smem_addr(hs + min(b0 + g.LB * i, B - 1) * g.SH + 4 * c);
}

// acc += lane group lk's chunks c0 + lk, c0 + lk + LK, ... < c1 of the h tile at column k0.
__device__ __forceinline__ void pk_fma_span(float (&acc)[PK_TM][PK_TB], const PkGeom& g,
                                            const float* Rs, const float* hs, int B, int k0,
                                            int c0, int c1, int r0, int b0, int lk) {
    pk_saddr ra[PK_TM], ha[PK_TB];
    pk_addresses(g, Rs, hs, B, k0, c0 + lk, r0, b0, ra, ha);
    pk_fma_range(acc, ra, ha, c0, c1, lk, g.LK);
}

// The lane's register tile added into its k-group's partial sums red[kg][r][b] (stored when
// `first`: the step's first write), rows < M and batches < B only: one writer an element.
__device__ __forceinline__ void pk_flush(const float (&acc)[PK_TM][PK_TB], const PkGeom& g,
                                         float* red, int B, int r0, int b0, int kg,
                                         bool first) {
#pragma unroll
    for (int i = 0; i < PK_TM; ++i) {
        const int r = r0 + g.LR * i;
#pragma unroll
        for (int jb = 0; jb < PK_TB; ++jb) {
            const int b = b0 + g.LB * jb;
            if (r < g.M && b < B) {
                float* const p = red + ((long long)kg * g.M + r) * g.BP + b;
                *p = first ? acc[i][jb] : *p + acc[i][jb];
            }
        }
    }
}

// CL = 0: the grid kernel (h_t staged from L2, the flag grid barrier); CL = PK_CLUSTER: the
// cluster kernel (see the header: h_t pushed into every block's shared memory, the cluster
// barrier; cluster n owns batches [n*BC, n*BC + BC), BC = ceil(B / clusters)).
template <int G, int CELL, int CL>
__device__ __forceinline__ void persistent_fwd(
        int Bfull, int H, float* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, const float* gx, long long ldgx, const float* w,
        long long ldw, const float* bw, long long ldbw, const float* br, long long ldbr,
        int T, int U, int KT) {
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    if (U < 1 || Bfull < 1 || H < 1 || KT < 4 || KT % 4 != 0 || nt % 32 != 0) __trap();
    // This block's hidden-unit slice (rank) and batch slice [b_off, b_off + B) of Bfull; BG
    // (the batch the shared-memory layout is sized for) is the same in every block.
    const int S = Bfull;   // rows of a step in every time-major array
    int rank = blockIdx.x, ranks = gridDim.x, BG = Bfull, b_off = 0, B = Bfull;
    if (CL) {
        rank = (int)pk_cluster_rank();
        ranks = CL;
        BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();
        b_off = (int)pk_cluster_id() * BG;
        B = min(BG, Bfull - b_off);
        if (B < 1 || KT < H) __trap();   // an empty cluster; the cluster kernel's one tile
    }
    const PkGeom g = pk_geometry(G, U, BG, H, KT, nt);
    const long long need = 4LL * ((long long)g.M * g.SR + (CL ? 2LL : 1LL) * BG * g.SH
                                  + (long long)g.NKG * g.M * g.BP);
    if ((long long)ranks * U < H || (long long)U * BG > (long long)PK_CPT * nt ||
        (long long)dynamic_smem_bytes() < need)
        __trap();
    h += b_off * ldh;   // row b of step t of every array is now row t*S + b
    if (c) c += b_off * ldc;
    if (act) act += b_off * ldact;
    gx += b_off * ldgx;
    bw += b_off * ldbw;
    br += b_off * ldbr;
    const int j0 = rank * U;
    const int Ub = max(0, min(U, H - j0));   // units this block owns
    float* const Rs = smem;                           // [M][SR]
    float* const hs = Rs + g.M * g.SR;                // [B][SH] (cluster kernel: [2][BG][SH])
    float* const red = hs + (CL ? 2 : 1) * BG * g.SH;   // [NKG][M][BP]
    const int lr = lane % g.LR, lb = (lane / g.LR) % g.LB, lk = lane / (g.LR * g.LB);
    const int kg = warp * g.LK + lk;
    // 16-byte staging where every row of h_t starts 16-byte aligned and has whole float4s
    // (H, ldh multiples of 4, h 16-byte aligned; the same for every block)
    const bool vec = H % 4 == 0 && ldh % 4 == 0 &&
                     (reinterpret_cast<unsigned long long>(h) & 15ull) == 0;

    // Pointwise cells of this thread: e = tid + i*nt, jj = e % U, b = e / U (live: jj < Ub,
    // b < B): a warp's stores cover 32/U rows of U consecutive units each (b fastest, the
    // first version, made each store touch 32 rows). gx of step t+1 is loaded at the end of
    // step t, before the barrier (streamed, ld.cs); the biases once (read-only, ld.nc);
    // c_t (LSTM) and h_t (GRU) of the cells are the thread's own writes of the step before:
    // registers.
    float xg[G][PK_CPT], bwv[G][PK_CPT], brv[G][PK_CPT], carry[PK_CPT];
    // (b, j) of each cell, once: the division by the runtime U, recomputed every step, was
    // ~150 of ~2,400 instructions a warp-step (profile of the cluster kernel, LSTM H 128)
    int cell_b[PK_CPT], cell_j[PK_CPT];
    bool cell_live[PK_CPT];
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        const int e = tid + i * nt;
        const int jj = e % U;
        cell_b[i] = e / U;
        cell_j[i] = j0 + jj;
        cell_live[i] = cell_b[i] < B && jj < Ub;
    }
    auto cell_of = [&](int i, int& b, int& j) {
        b = cell_b[i];
        j = cell_j[i];
        return cell_live[i];
    };
    auto prefetch = [&](int t) {
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            int b, j;
            const bool live = cell_of(i, b, j);
            const float* const x = gx + ((long long)t * S + b) * ldgx + j;
#pragma unroll
            for (int q = 0; q < G; ++q) xg[q][i] = live ? __ldcs(x + q * (long long)H) : 0.f;
        }
    };
    // The biases of the cells, once: they do not change from step to step
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        int b, j;
        const bool live = cell_of(i, b, j);
        const float* const y = bw + b * ldbw + j;
        const float* const z = br + b * ldbr + j;
#pragma unroll
        for (int q = 0; q < G; ++q) {
            bwv[q][i] = live ? __ldg(y + q * (long long)H) : 0.f;
            brv[q][i] = live ? __ldg(z + q * (long long)H) : 0.f;
        }
    }
#pragma unroll
    for (int i = 0; i < PK_CPT; ++i) {
        int b, j;
        const bool live = cell_of(i, b, j);
        carry[i] = 0.f;
        if constexpr (CELL == CELL_LSTM) {
            if (live) carry[i] = c[b * ldc + j];
        } else if constexpr (CELL == CELL_GRU) {
            if (live) carry[i] = h[b * ldh + j];
        }
    }
    prefetch(0);   // step 0's: in flight during the copy of R

    // R slice, once: row q*U + ju holds R[q*H + j0 + ju, :], zeros past H and past Ub.
    for (int e = tid; e < g.M * g.SR; e += nt) {
        const int row = e / g.SR, k = e - row * g.SR;
        const int q = row / U, ju = row - q * U;
        Rs[e] = (ju < Ub && k < H) ? w[((long long)q * H + j0 + ju) * ldw + k] : 0.f;
    }
    if (CL) {
        // h_0 of the cluster's batches into buffer 0; zeros in both buffers' columns past H
        // (the last float4 chunk reads them; the pushes below write columns < H only)
        for (int e = tid; e < 2 * BG * g.SH; e += nt) {
            const int buf = e / (BG * g.SH), r = e - buf * BG * g.SH;
            const int b = r / g.SH, k = r - b * g.SH;
            if (k >= H) hs[e] = 0.f;
            else if (buf == 0 && b < B) hs[e] = h[b * ldh + k];
        }
        pk_cluster_sync();   // every block of the cluster runs before any block pushes to it
    } else {
        __syncthreads();   // the R slice is read by every warp
    }

    for (int t = 0; t < T; ++t) {
        const float* const ht = h + (long long)t * S * ldh;   // h_t: rows t*S .. t*S+B-1
        float* const hcur = CL ? hs + (t & 1) * BG * g.SH : hs;   // the h tile of step t
        // This warp's columns of the h tile were last read by this warp (before the
        // __syncwarp that ended its previous tile), so it stages at once.
        // Warp w's chunks of the h tile at column k0: [ca, cb), in halves [ca, cm), [cm, cb).
        auto range = [&](int k0, int& ca, int& cm, int& cb) {
            const int CH = min(KT / 4, (H - k0 + 3) / 4);   // float4 chunks of this tile
            ca = min(CH, warp * g.CPW);
            cb = min(CH, ca + g.CPW);
            cm = ca + (cb - ca + 1) / 2;
        };
        int ca, cm, cb;
        range(0, ca, cm, cb);
        if (!CL) {
            pk_stage(hs, g.SH, ht, ldh, B, H, 0, ca, cm, vec, lane);
            pk_cp_commit();
            pk_stage(hs, g.SH, ht, ldh, B, H, 0, cm, cb, vec, lane);
            pk_cp_commit();
        }
        // The halves are a ping-pong across the h tiles: each half of tile k+1 is staged as
        // soon as the same half of tile k is multiplied, so the L2 reads of one overlap the
        // FMAs of the other (the next tile's halves lie within this warp's same columns:
        // [na, nm) in [ca, cm), [nm, nb) after it). Every half commits one cp.async group
        // (empty past the last tile), so waiting for all but the newest group is always
        // "this half has landed". With one output tile (the common case: G*U <= 32 rows,
        // B <= 64) the sums stay in registers over all h tiles and are written once; with
        // several, each half's sums of each output tile are added into red. The cluster
        // kernel has all of h_t in its buffer already (one tile, nothing to stage or wait
        // for) and multiplies the same halves in the same order.
        const bool one_tile = g.RT * g.BT == 1;
        float acc1[PK_TM][PK_TB];
#pragma unroll
        for (int i = 0; i < PK_TM; ++i)
#pragma unroll
            for (int jb = 0; jb < PK_TB; ++jb) acc1[i][jb] = 0.f;
        // Output tile (rt, bt) of this lane over chunks [c0, c1) and then [c2, c3) of the h
        // tile at column k0, added into (first: stored as) its k-group's partial sums.
        auto tile_sums = [&](int rt, int bt, int k0, int c0, int c1, int c2, int c3,
                             bool first) {
            const int r0 = rt * PK_TM * g.LR + lr, b0 = bt * PK_TB * g.LB + lb;
            float acc[PK_TM][PK_TB];
#pragma unroll
            for (int i = 0; i < PK_TM; ++i)
#pragma unroll
                for (int jb = 0; jb < PK_TB; ++jb) acc[i][jb] = 0.f;
            pk_fma_span(acc, g, Rs, hcur, B, k0, c0, c1, r0, b0, lk);
            if (c2 < c3) pk_fma_span(acc, g, Rs, hcur, B, k0, c2, c3, r0, b0, lk);
            pk_flush(acc, g, red, B, r0, b0, kg, first);
        };
        auto half = [&](int k0, int c0, int c1, bool first) {
            if (!CL) {
                pk_cp_wait<1>();   // this half has landed (this lane's part of it) ...
                __syncwarp();      // ... and every lane's
            }
            if (one_tile) {
                pk_fma_span(acc1, g, Rs, hcur, B, k0, c0, c1, lr, lb, lk);
            } else {
                for (int rt = 0; rt < g.RT; ++rt)
                    for (int bt = 0; bt < g.BT; ++bt) tile_sums(rt, bt, k0, c0, c1, c1, c1, first);
            }
            if (!CL) __syncwarp();   // the half is read: the next tile's may land there
        };
        if (CL && !one_tile) {
            // The cluster kernel's one tile is all there: each output tile takes both halves
            // into registers (same chunks, same order) and is stored once, instead of the
            // grid kernel's read-add-write of the partial sums a half (its first profile at
            // LSTM H 128: ~1 us a step of serialised shared-memory read-add-writes).
            for (int rt = 0; rt < g.RT; ++rt)
                for (int bt = 0; bt < g.BT; ++bt) tile_sums(rt, bt, 0, ca, cm, cm, cb, true);
        }
        for (int k0 = 0; k0 < H && !(CL && !one_tile); k0 += KT) {
            const int kn = k0 + KT;
            int na = 0, nm = 0, nb = 0;
            if (kn < H) range(kn, na, nm, nb);
            half(k0, ca, cm, k0 == 0);
            if (!CL) {
                pk_stage(hs, g.SH, ht, ldh, B, H, kn, na, nm, vec, lane);
                pk_cp_commit();
            }
            half(k0, cm, cb, false);
            if (!CL) {
                pk_stage(hs, g.SH, ht, ldh, B, H, kn, nm, nb, vec, lane);
                pk_cp_commit();
            }
            ca = na;
            cm = nm;
            cb = nb;
        }
        if (one_tile) pk_flush(acc1, g, red, B, lr, lb, kg, true);
        __syncthreads();   // every k-group's partial sums are in red

        // This step's outputs of cell i to global memory: h_{t+1}, c_{t+1} (LSTM) and the saved
        // gates (act). Nothing in the launch reads them back (the grid kernel reads h_{t+1}
        // from global memory after its barrier; the cluster kernel from its shared buffers),
        // so the cluster kernel issues them after its barrier's arrive: its release then waits
        // only for the pushes into the cluster's shared memory, not for these L2 round trips.
        float keep_h[PK_CPT] = {}, keep_c[PK_CPT] = {}, keep_a[4][PK_CPT] = {};
        auto store_cell = [&](int i) {
            int b, j;
            if ((PK_TIMING & 8) || !cell_of(i, b, j)) return;
            const long long row = (long long)t * S + b;   // step t, batch b
            if constexpr (CELL == CELL_LSTM) c[(row + S) * ldc + j] = keep_c[i];
            if constexpr (CELL == CELL_LSTM || CELL == CELL_GRU)
                store_gates(act + row * ldact + j, H, keep_a[0][i], keep_a[1][i], keep_a[2][i],
                            keep_a[3][i]);
            __stcg(h + (row + S) * ldh + j, keep_h[i]);   // h_{t+1}[b, j]
        };
#pragma unroll
        for (int i = 0; i < PK_CPT; ++i) {
            int b, j;
            if ((PK_TIMING & 8) || !cell_of(i, b, j)) continue;
            const int jj = j - j0;
            float s[G], xb[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float* const p = red + (q * U + jj) * g.BP + b;   // 32-bit offsets:
                const int kstride = g.M * g.BP;   // the partial sums are in shared memory
                float v = p[0];
                for (int k = 1; k < g.NKG; ++k) v += p[k * kstride];
                // gx + bw here, not at the top of the step: the loads of gx (issued before
                // the previous barrier) then have the FMA phase to land in
                xb[q] = xg[q][i] + bwv[q][i];
                const float brq = brv[q][i];
                // ((gx + bw) + gh) + br, the fused kernels' order (GRU's n gate: gh_n + br_n;
                // r * (gh_n + br_n) is added to gx_n + bw_n below)
                s[q] = (CELL == CELL_GRU && q == 2) ? v + brq : (xb[q] + v) + brq;
            }
            float hv;
            if constexpr (CELL == CELL_LSTM) {
                const float ig = sigmoidf(s[0]), fg = sigmoidf(s[1]);
                const float gg = tanhf(s[2]), og = sigmoidf(s[3]);
                const float cn = fg * carry[i] + ig * gg;
                carry[i] = cn;
                keep_c[i] = cn;
                hv = og * tanhf(cn);
                keep_a[0][i] = ig, keep_a[1][i] = fg, keep_a[2][i] = gg, keep_a[3][i] = og;
            } else if constexpr (CELL == CELL_GRU) {
                const float r = sigmoidf(s[0]), z = sigmoidf(s[1]);
                const float hn = s[2];                      // gh_n + br_n
                const float n = tanhf(xb[2] + r * hn);      // gx_n + bw_n + r * hn
                hv = n + z * (carry[i] - n);
                carry[i] = hv;
                keep_a[0][i] = r, keep_a[1][i] = z, keep_a[2][i] = n, keep_a[3][i] = hn;
            } else if constexpr (CELL == CELL_RNN_TANH) {
                hv = tanhf(s[0]);
            } else {
                const float v = s[0];
                hv = v < 0.f ? 0.f : v;   // NaN stays NaN, as rnn_relu_fwd
            }
            keep_h[i] = hv;
            if (!CL) store_cell(i);
            if (CL && !(PK_TIMING & 1)) {   // h_{t+1}[b, j] into every block's next buffer
                const pk_saddr a = pk_smem_addr(hs + ((t + 1) & 1) * BG * g.SH + b * g.SH + j);
#pragma unroll
                for (int r = 0; r < CL; ++r) pk_st_cluster(a, (unsigned int)r, hv);
            }
        }
        if (CL) {
            // After every step, the last too: h_{t+1} is in every buffer before any block
            // reads it, every block has read buffer t & 1 (and red) before it is rewritten,
            // and no block exits while another may still push into its shared memory. The
            // global stores (see store_cell) and the loads of step t+1's gx go between the
            // arrive and the wait: the arrive's release is a MEMBAR.ALL.GPU in SASS, which
            // waits for every memory access the thread has in flight (the profile: ~8% of
            // a step's samples there while gx was loaded before it).
            if (PK_TIMING & 4) {   // timing only: no cluster barrier a step
                if (t + 1 < T) prefetch(t + 1);
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i) store_cell(i);
                __syncthreads();
            } else {
                pk_cluster_arrive();
                if (t + 1 < T) prefetch(t + 1);
#pragma unroll
                for (int i = 0; i < PK_CPT; ++i) store_cell(i);
                pk_cluster_wait();
            }
        } else if (t + 1 < T) {
            prefetch(t + 1);   // step t+1's gx and biases: in flight across the barrier
            if (!(PK_TIMING & 4)) grid_barrier(sync, (unsigned int)(t + 1) * gridDim.x);
            else __syncthreads();   // red is rewritten next step: the block must be past it
        }
    }
    if (CL && (PK_TIMING & 4)) pk_cluster_sync();   // timing only: no exit before the pushes
    if (!CL) grid_exit(sync);
}

// The grid kernels.
extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM, 0>(rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx,
                                    w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                    k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) gru_persistent_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU, 0>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx,
                                   ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                   k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_tanh_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH, 0>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) rnn_relu_persistent_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU, 0>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}

// The cluster kernels: clusters of PK_CLUSTER blocks, fixed at compile time, so a plain
// launch of a grid that is a multiple of PK_CLUSTER runs them (sm_90 and later).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) lstm_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, const float* gx, int ldgx, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T,
        int units_per_block, int k_tile) {
    persistent_fwd<4, CELL_LSTM, PK_CLUSTER>(rows, cols, h, ldh, c, ldc, act, ldact, sync, gx, ldgx,
                                    w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                    k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) gru_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, float* act, int ldact, unsigned int* sync,
        int ldsync, const float* gx, int ldgx, const float* w_hh, int ldw_hh, const float* bw,
        int ldbw, const float* br, int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<3, CELL_GRU, PK_CLUSTER>(rows, cols, h, ldh, nullptr, 0, act, ldact, sync, gx,
                                   ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T, units_per_block,
                                   k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_tanh_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_TANH, PK_CLUSTER>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) __cluster_dims__(PK_CLUSTER, 1, 1) rnn_relu_persistent_cluster_fwd(
        int rows, int cols, float* h, int ldh, unsigned int* sync, int ldsync, const float* gx,
        int ldgx, const float* w_hh, int ldw_hh, const float* bw, int ldbw, const float* br,
        int ldbr, int T, int units_per_block, int k_tile) {
    persistent_fwd<1, CELL_RNN_RELU, PK_CLUSTER>(rows, cols, h, ldh, nullptr, 0, nullptr, 0, sync,
                                        gx, ldgx, w_hh, ldw_hh, bw, ldbw, br, ldbr, T,
                                        units_per_block, k_tile);
}
#endif

// ------------------------------------------------------------------------------------------
// The stack kernel: ALL L layers of an LSTM stack in ONE launch, along the wavefront (see
// the header's "Stack kernel"). Block x is layer l = x / NB, rank x % NB (NB = H / U blocks
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
#define PS_KT 64                   //  rnnrt.stack mirrors the defaults, a test holds them)
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
// Steps the layer below must be done with before a layer's step t starts: t + 1 is what
// the data needs; more only delays the layer (experiments: stack_bench.py --define).
#ifndef PK_SLACK
#define PK_SLACK 1
#endif
// The stack kernel's cell activations from the hardware's approximate exp and division
// (ex2.approx, rcp.approx: ~1e-6 relative, far inside the fp32 tolerance the tests assert);
// 0: the precise sigmoidf / tanhf of the other kernels (experiments: --define PS_FAST_CELL=0)
#ifndef PS_FAST_CELL
#define PS_FAST_CELL 1
#endif
__device__ __forceinline__ float ps_sigmoid(float x) {
    if (PS_FAST_CELL) return __fdividef(1.f, 1.f + __expf(-x));   // exp -> inf: 1/inf = 0
    return sigmoidf(x);
}
__device__ __forceinline__ float ps_tanh(float x) {
    if (PS_FAST_CELL) return 2.f * ps_sigmoid(2.f * x) - 1.f;
    return tanhf(x);
}

// Timeline of the stack kernel, for experiments only (rnnrt never defines PK_TRACE): thread
// 0 of each of the first PS_TRACE_BLOCKS blocks notes %globaltimer (ns) at PS_TRACE_POINTS
// points of its first PS_TRACE_STEPS steps into pk_trace[block][step][point]
// (stack_bench.py --trace reads it):
// 0 step top, 1 past the top waits, 2 before the own wait, 3 past it, 4 past the K loop,
// 5 after the count.
#define PS_TRACE_BLOCKS 160
#define PS_TRACE_STEPS 128
#define PS_TRACE_POINTS 6
#ifdef PK_TRACE
__device__ unsigned long long pk_trace[PS_TRACE_BLOCKS * PS_TRACE_STEPS * PS_TRACE_POINTS];
#define PS_NOTE(t, point)                                                                     \
    do {                                                                                      \
        if (threadIdx.x == 0 && (t) < PS_TRACE_STEPS && blockIdx.x < PS_TRACE_BLOCKS) {      \
            unsigned long long ns;                                                            \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));                            \
            pk_trace[(blockIdx.x * PS_TRACE_STEPS + (t)) * PS_TRACE_POINTS + (point)] = ns;   \
        }                                                                                     \
    } while (0)
#else
#define PS_NOTE(t, point) ((void)0)
#endif

// Wait until *p >= target (lane 0 of a warp; the __syncwarp after it shows the wait to the
// warp). The acquire side of the progress counters: a relaxed poll, then one acquire load
// (not a fence: fence.acq_rel would wait for the warp's cp.async copies in flight; the
// profile of the first per-warp version: the waits cost 3.3 us a step, 0.75 us seen).
__device__ __forceinline__ void ps_wait(const unsigned int* p, unsigned int target) {
    if (PK_TIMING & 4) return;
    const long long start = clock64();
    while (ld_relaxed_gpu(p) < target) {
        if (clock64() - start > PK_SPIN_LIMIT) __trap();   // not co-resident: fail, not hang
    }
    if (ld_acquire_gpu(p) < target) __trap();   // counters only grow during a launch
}

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

// acc += A^T[k]^T X^T[k] over the warp's PS_KPW k rows of one staged tile. a and x are the
// shared addresses of the lane's first float4 at the warp's first k row: the lane's rows are
// 16g + 4lr + e (float4 g < 4 of a 64-float row), its batches 32h + 4lb + f (float4 h < 2).
// The next k's six float4s are loaded before this k's 128 FMAs.
__device__ __forceinline__ void ps_tile_fma(float (&acc)[PS_TM][PS_TB], pk_saddr a,
                                            pk_saddr x) {
    if (PK_TIMING & 2) return;
    float4 av[4], xv[2], an[4], xn[2];
#pragma unroll
    for (int g = 0; g < 4; ++g) av[g] = pk_lds128(a + 64u * g);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) xv[hh] = pk_lds128(x + 128u * hh);
#pragma unroll
    for (int kk = 0; kk < PS_KPW; ++kk) {
        if (kk + 1 < PS_KPW) {
            const pk_saddr row = 4u * PS_M * (kk + 1);
#pragma unroll
            for (int g = 0; g < 4; ++g) an[g] = pk_lds128(a + row + 64u * g);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) xn[hh] = pk_lds128(x + row + 128u * hh);
        }
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const float ar[4] = {av[g].x, av[g].y, av[g].z, av[g].w};
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const float xr[4] = {xv[hh].x, xv[hh].y, xv[hh].z, xv[hh].w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
#pragma unroll
                    for (int f = 0; f < 4; ++f)
                        acc[4 * g + e][4 * hh + f] = fmaf(ar[e], xr[f], acc[4 * g + e][4 * hh + f]);
            }
        }
        if (kk + 1 < PS_KPW) {
#pragma unroll
            for (int g = 0; g < 4; ++g) av[g] = an[g];
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
template <int G, int CELL>
__device__ __forceinline__ void persistent_stack_fwd(
        int B, int H, float* h, long long ldh, float* c, long long ldc, float* act,
        long long ldact, unsigned int* sync, float* wt, long long ldwt, float* ht,
        long long ldht, const float* x, long long ldx, const float* wih, long long ldwih,
        const float* whh, long long ldwhh, const float* bw, long long ldbw, const float* br,
        long long ldbr, int T, int L, int u_arg) {
    static_assert(CELL == CELL_LSTM, "the stack kernel is built for LSTM only");
    // U is fixed by the tile (the argument must agree): divisions by it are shifts, and the
    // cells' indices are recomputed each step instead of held in registers (NVRTC spilled)
    constexpr int U = PS_M / G;
    float* const smem = dynamic_smem();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int NB = H / U;                 // blocks a layer
    const int NK = H / PS_KT;             // tiles of one K half (input size = hidden)
    const int nbc = (B + 3) / 4;          // float4s of an ht row that hold batches
    const long long need = 4LL * ((long long)H * PS_M + PS_NS * PS_STAGE + 2 * PS_M);
    auto aligned = [](const void* p) {
        return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
    };
    if (blockDim.x != PK_MAX_THREADS || u_arg != U || H % PS_KT != 0 || H % U != 0 ||
        B < 1 || B > PS_BMAX || L < 2 || (long long)gridDim.x != (long long)L * NB ||
        (long long)dynamic_smem_bytes() < need || ldwt < 4LL * H || ldwt % 4 ||
        ldht != PS_BMAX || !aligned(wt) || !aligned(ht))
        __trap();
    const int l = blockIdx.x / NB, j0 = (blockIdx.x % NB) * U;
    const long long S1 = (long long)(T + 1) * B;       // rows of one layer's h and c
    const long long HS = (long long)H * PS_BMAX;       // floats of one ht slot
    unsigned int* const mine = sync + 2 * l;                   // this layer's progress
    const unsigned int* const lower = l ? sync + 2 * (l - 1) : nullptr;
    unsigned int* const ready = sync + 3;              // prologue arrivals (L >= 2: word 3)

    float* const Rs = smem;                        // [H][PS_M]: R slice, k-major
    float* const st = Rs + H * PS_M;               // [PS_NS][PS_STAGE] stages
    float* const red = st;                         // [4][PS_BMAX][PS_RP], after the K loop
    float* const bias = st + PS_NS * PS_STAGE;     // [2][PS_M]: b_ih, b_hh of the block's rows

    // Prologue, every block a share (32 x 32 tiles through the stages): W^T of every layer,
    // x_t^T into ht slot t+1 of m = 0, h0^T into slot 0 of m = l+1. Then one arrival on
    // `ready`; every block waits for all of them before its first step (all resident).
    {
        const int tw = (4 * H / 32) * (H / 32), tb = ((B + 31) / 32) * (H / 32);
        const int jobs = L * tw + T * tb + L * tb;
        for (int n = blockIdx.x; n < jobs; n += gridDim.x) {
            if (n < L * tw) {
                const int m = n / tw, r = n % tw, r0 = 32 * (r / (H / 32));
                ps_transpose_tile(wih + m * ldwih, H, wt + (long long)m * H * ldwt, ldwt,
                                  4 * H, H, r0, 32 * (r % (H / 32)), st);
                continue;
            }
            const int k = n - L * tw, s = k / tb, r = k % tb;
            const int r0 = 32 * (r / (H / 32)), c0 = 32 * (r % (H / 32));
            if (s < T)
                ps_transpose_tile(x + (long long)s * B * ldx, ldx, ht + (s + 1) * HS, ldht, B,
                                  H, r0, c0, st);
            else
                ps_transpose_tile(h + (s - T) * S1 * ldh, ldh,
                                  ht + (long long)(s - T + 1) * (T + 1) * HS, ldht, B, H, r0,
                                  c0, st);
        }
        __syncthreads();
        if (tid == 0) {
            pk_fence_acq_rel();   // the block's transposes visible GPU-wide (release)
            atomicAdd(ready, 1u);
        }
    }
    h += l * S1 * ldh;                             // this layer's h: row s*B + b
    c += l * S1 * ldc;
    act += (long long)l * T * B * ldact;
    const float* const wtl = wt + (long long)l * H * ldwt;
    whh += l * ldwhh;
    bw += l * ldbw;
    br += l * ldbr;
    const float* const below = ht + (long long)l * (T + 1) * HS;   // slot t+1: input at t
    float* const own = ht + (long long)(l + 1) * (T + 1) * HS;     // slot t: h_t^T

    // The R slice, once, k-major: Rs[k][q*U + ju] = R[q*H + j0 + ju, k] (lanes take
    // consecutive rows: conflict-free stores)
    for (int e = tid; e < H / 4 * PS_M; e += PK_MAX_THREADS) {
        const int row = e % PS_M, k = 4 * (e / PS_M), q = row / U, ju = row - q * U;
        const float4 v = *reinterpret_cast<const float4*>(whh + (long long)(q * H + j0 + ju) * H + k);
        Rs[k * PS_M + row] = v.x;
        Rs[(k + 1) * PS_M + row] = v.y;
        Rs[(k + 2) * PS_M + row] = v.z;
        Rs[(k + 3) * PS_M + row] = v.w;
    }

    // Pointwise cells of this thread: e = tid + i*PK_MAX_THREADS, jj = e % U, r = e / U,
    // b = the r-th of 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, ... (a warp's two batches are 4 apart:
    // its partial-sum reads hit 32 different banks), live while b < B. jj fastest: a warp's
    // h stores are two runs of 16 consecutive floats. c_t in registers (each cell is this
    // thread's every step); the biases of the block's rows in shared memory.
    auto cell_of = [&](int i, int& b, int& jj) {   // live while b < B
        const int e = tid + i * PK_MAX_THREADS, r = e / U, k = r & 7;
        jj = e - r * U;
        b = (r & ~7) + (k >> 1) + 4 * (k & 1);
    };
    float carry[PS_CPT];
#pragma unroll
    for (int i = 0; i < PS_CPT; ++i) {
        int b, jj;
        cell_of(i, b, jj);
        carry[i] = b < B ? c[(long long)b * ldc + j0 + jj] : 0.f;
    }
    for (int e = tid; e < 2 * PS_M; e += PK_MAX_THREADS) {
        const int row = e % PS_M, q = row / U, ju = row - q * U;
        bias[e] = __ldg((e < PS_M ? bw : br) + q * H + j0 + ju);
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

    const int lr = lane & 3, lb = lane >> 2;
    const pk_saddr a_lane = 16u * lr + 4u * PS_M * (PS_KPW * warp);
    const pk_saddr x_lane = 16u * lb + 4u * PS_M * (PS_KPW * warp) + 4u * PS_KT * PS_M;
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
            ps_tile_fma(acc, a + a_lane, s + x_lane);
        }
        PS_NOTE(t, 4);
        pk_cp_wait<0>();
        __syncthreads();   // every tile is read: the stages become the partial sums
        // Eight k-groups into four partial sums: warps 4..7 store, warps 0..3 add theirs.
        // red[m][b][row], row stride PS_RP: a quarter warp's 16-byte accesses (lr 0..3, two
        // batches 4 apart: 4 * PS_RP = 16 mod 32 banks) fill 32 banks.
        for (int pass = 0; pass < 2; ++pass) {
            if ((warp >= 4) == (pass == 0)) {
                float* const r0 = red + (warp & 3) * PS_BMAX * PS_RP + 4 * lr;
#pragma unroll
                for (int g = 0; g < 4; ++g)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                        for (int f = 0; f < 4; ++f) {
                            float4* const p = reinterpret_cast<float4*>(
                                r0 + (32 * hh + 4 * lb + f) * PS_RP + 16 * g);
                            float4 v = make_float4(acc[4 * g][4 * hh + f],
                                                   acc[4 * g + 1][4 * hh + f],
                                                   acc[4 * g + 2][4 * hh + f],
                                                   acc[4 * g + 3][4 * hh + f]);
                            if (pass == 1) {
                                const float4 o = *p;
                                v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
                            }
                            *p = v;
                        }
            }
            __syncthreads();
        }

        // The pointwise update of this thread's cells: gate sums over the 4 partial sums in
        // order, then (sum + b_ih) + b_hh, then lstm_fwd's arithmetic. Only h^T is read by
        // other blocks in this launch: it is stored and published first, the rest (c, the
        // gates, h) after the count (the publishing fence waits for no more than it must).
        float* const hT = own + (t + 1) * HS;   // h_{t+1}^T
        float gate[PS_CPT][G], hnew[PS_CPT];
#pragma unroll
        for (int i = 0; i < PS_CPT; ++i) {
            int b, jj;
            cell_of(i, b, jj);
            if ((PK_TIMING & 8) || b >= B) continue;
            float s[G];
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const float* const p = red + b * PS_RP + q * U + jj;
                float v = p[0];
#pragma unroll
                for (int k = 1; k < 4; ++k) v += p[k * PS_BMAX * PS_RP];
                s[q] = (v + bias[q * U + jj]) + bias[PS_M + q * U + jj];
            }
            gate[i][0] = ps_sigmoid(s[0]), gate[i][1] = ps_sigmoid(s[1]);
            gate[i][2] = ps_tanh(s[2]), gate[i][3] = ps_sigmoid(s[3]);
            carry[i] = gate[i][1] * carry[i] + gate[i][0] * gate[i][2];
            hnew[i] = gate[i][3] * ps_tanh(carry[i]);
            __stcg(hT + (j0 + jj) * PS_BMAX + b, hnew[i]);   // h_{t+1}^T[j, b]
        }
        __syncthreads();   // the block's h_{t+1}^T is issued (and red is read)
        if (tid == 0) {
            pk_fence_acq_rel();   // ... and visible GPU-wide before this block counts (release)
            atomicAdd(mine, 1u);
        }
        PS_NOTE(t, 5);
#pragma unroll
        for (int i = 0; i < PS_CPT; ++i) {
            int b, jj;
            cell_of(i, b, jj);
            if ((PK_TIMING & 8) || b >= B) continue;
            const int j = j0 + jj;
            const long long row = (long long)t * B + b;   // step t, batch b
            // streaming stores: nothing in this launch reads these (L2 keeps W^T and ht)
            __stcs(c + (row + B) * ldc + j, carry[i]);
            float* const a = act + row * ldact + j;
            __stcs(a, gate[i][0]);
            __stcs(a + H, gate[i][1]);
            __stcs(a + 2 * H, gate[i][2]);
            __stcs(a + 3 * H, gate[i][3]);
            __stcs(h + (row + B) * ldh + j, hnew[i]);     // h_{t+1}[b, j]
        }
    }
    // The last block out zeroes every layer's counters and the prologue's for the next
    // launch: by then every block has passed its last wait (see the header).
    if (tid == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        for (int k = 0; k < L; ++k) atomicExch(sync + 2 * k, 0u);
        atomicExch(sync + 1, 0u);
        atomicExch(ready, 0u);
    }
}

extern "C" __global__ void __launch_bounds__(PK_MAX_THREADS, 1) lstm_persistent_stack_fwd(
        int rows, int cols, float* h, int ldh, float* c, int ldc, float* act, int ldact,
        unsigned int* sync, int ldsync, float* wt, int ldwt, float* ht, int ldht,
        const float* x, int ldx, const float* w_ih, int ldw_ih, const float* w_hh,
        int ldw_hh, const float* bw, int ldbw, const float* br, int ldbr, int T, int L,
        int units_per_block) {
    persistent_stack_fwd<4, CELL_LSTM>(rows, cols, h, ldh, c, ldc, act, ldact, sync, wt, ldwt,
                                       ht, ldht, x, ldx, w_ih, ldw_ih, w_hh, ldw_hh, bw, ldbw,
                                       br, ldbr, T, L, units_per_block);
}
