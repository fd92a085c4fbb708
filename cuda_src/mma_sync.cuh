/*
 * mma_sync.cuh: the tensor-core primitives the mma kernels share (persistent_mma.cuh: the
 * per-layer tensor-core grid kernels, forward and backward; persistent_stack_mma.cu: the
 * tensor-core stack kernel). #included by them; rnnrt's loader inlines it. No kernels.
 *   pk_pack2<TS>(lo, hi)     two fp32 values (already representable in TS) as one bf16x2 /
 *                            f16x2 register, lo in the low half
 *   pk_mma16816<TS>(d, a, b) one mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += A B,
 *                            fp32 accumulation (fragment layout: persistent_mma.cuh's header)
 *   pk_ld_pair(p)            two TS values p[0], p[1] (4-byte aligned) as one packed
 *                            register, p[0] in the low half: a fragment register read from
 *                            operands stored in TS (the tensor-core cluster kernel's R slice)
 * tests/kernels/persistent_host_sim.cpp defines PK_HOST_SIM and emulates them (the mma
 * through the warp's exchange buffer: a wrong fragment layout gives wrong sums).
 */
#ifndef RNNRT_MMA_SYNC_CUH
#define RNNRT_MMA_SYNC_CUH

#include "storage.cuh"

#ifndef PK_HOST_SIM
// lo, hi (fp32, already representable in TS) as one bf16x2 / f16x2 register, lo in the low
// half: cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a in the upper half, b in the lower.
template <class TS> __device__ __forceinline__ unsigned int pk_pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned int pk_pack2<bf16>(float lo, float hi) {
    unsigned int d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
template <> __device__ __forceinline__ unsigned int pk_pack2<fp16>(float lo, float hi) {
    unsigned int d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <class TS> __device__ __forceinline__ unsigned int pk_ld_pair(const TS* p) {
    return *reinterpret_cast<const unsigned int*>(p);   // little-endian: p[0] is the low half
}

// d += A (16 x 16) B (16 x 8), fp32 accumulation, one warp (every lane, converged).
template <class TS> __device__ __forceinline__ void pk_mma16816(float (&d)[4],
                                                                 const unsigned int (&a)[4],
                                                                 const unsigned int (&b)[2]);
template <> __device__ __forceinline__ void pk_mma16816<bf16>(float (&d)[4],
                                                              const unsigned int (&a)[4],
                                                              const unsigned int (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void pk_mma16816<fp16>(float (&d)[4],
                                                              const unsigned int (&a)[4],
                                                              const unsigned int (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

#endif  // RNNRT_MMA_SYNC_CUH
