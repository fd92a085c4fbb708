/*
 * regs_common.cuh: what the register-resident cluster kernels share (persistent_regs.cu, the
 * forward; persistent_regs_bwd.cu, the backward): the columns the 32 lanes of a warp cover
 * (RG_K, 4 a lane), compile-time powers of two, and the warp butterfly reduce-scatter that
 * turns each lane's partial sums over its columns into complete sums over all of them. No
 * kernels; rnnrt's loader (rnnrt/kernels/sources.py) inlines it where it is included. Design:
 * docs/kernels.md ("The register-resident cluster kernels", "The register-resident cluster
 * backward").
 */
#ifndef RNNRT_REGS_COMMON_CUH
#define RNNRT_REGS_COMMON_CUH

#define RG_K 128            // columns of h the 32 lanes of a warp cover (4 each): H <= RG_K

__host__ __device__ constexpr int rg_pow2(int x) { return x <= 1 ? 1 : 2 * rg_pow2((x + 1) / 2); }
__host__ __device__ constexpr int rg_log2(int x) { return x <= 1 ? 0 : 1 + rg_log2(x / 2); }

// Butterfly reduce-scatter over the warp of the first N values of v (N a power of two): at
// the stage with lane mask MASK (16, 8, ...) a lane keeps the half of its values its MASK
// bit selects, sends the other half to lane ^ MASK and adds what comes back; when one value
// is left, the remaining masks add whole values. The lane ends with the complete warp sum
// of value lane >> (5 - log2 N); every value's sum is the same tree over the lanes
// (emulate_regs.lane_tree).
template <int N, int MASK>
__device__ __forceinline__ float rg_reduce_scatter(float (&v)[32], int lane) {
    if constexpr (N == 1) {
        float s = v[0];
#pragma unroll
        for (int m = MASK; m >= 1; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        return s;
    } else {
        constexpr int half = N / 2;
        const bool up = (lane & MASK) != 0;
#pragma unroll
        for (int i = 0; i < half; ++i) {
            const float send = up ? v[i] : v[i + half];
            const float keep = up ? v[i + half] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);
        }
        return rg_reduce_scatter<half, MASK / 2>(v, lane);
    }
}

#endif  // RNNRT_REGS_COMMON_CUH
