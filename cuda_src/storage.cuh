/*
 * storage.cuh: the element types a pointwise kernel's pointer may have, and their two
 * conversions (rnnrt/precision.py's rule: kernel math is fp32; a load converts to float, a
 * store into a 16-bit buffer rounds to nearest, ties to even). No kernels. #included by
 * pointwise_common.cuh and transpose.cu; rnnrt's loader (rnnrt/kernels/sources.py) inlines it.
 *   bf16, fp16   16-bit storage (bfloat16, IEEE half) as their bits
 *   to_f(v)      a stored value as float, exact (identity for float)
 *   from_f<T>(v) v rounded to T (identity for float); a store is `p[i] = from_f<T>(v)`, an
 *                assignment (not a call taking the destination), so that C++17 sequences the
 *                value before the address as in a plain fp32 store: the fp32 instantiations
 *                then compile to the fp32 kernels' PTX exactly
 * Why not cuda_bf16.h / cuda_fp16.h: CuPy compiles with NVRTC, which has no include path to
 * them on a wheel-only install (sources.py inlines only cuda_src's own headers), so the
 * types and conversions are the PTX instructions those headers use: cvt.rn.bf16.f32 and
 * cvt.rn.f16.f32 round to nearest even (overflow to Inf, NaN stays NaN); a bfloat16 is
 * float32's top 16 bits, so widening it is a shift. sm_80+ (bf16 cvt); fp32-only
 * instantiations use none of it.
 *   round_tf32(v) v rounded to TF32 (10-bit mantissa; to nearest, ties to even, NaN kept):
 *                what a tf32 GEMM reads of an fp32 operand (precision.round_to_tf32); the
 *                persistent kernels' tf32 instantiations round their product operands with
 *                it (integer arithmetic: cvt.rn.tf32.f32 is sm_90+ only, cvt.rna rounds
 *                ties away)
 * Host path (PK_HOST_SIM: tests/kernels/persistent_host_sim.cpp compiles the persistent
 * kernels with g++): the same conversions in C++ (bf16 by its bits, fp16 by _Float16).
 */
#ifndef RNNRT_STORAGE_CUH
#define RNNRT_STORAGE_CUH

struct bf16 { unsigned short bits; };   // bfloat16 storage
struct fp16 { unsigned short bits; };   // IEEE binary16 storage

#ifdef PK_HOST_SIM   // (the sim includes <cstring>)
inline float sim_bits_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned int sim_float_bits(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
// f's low n mantissa bits rounded off (to nearest, ties to even), as float bits; NaN kept
inline unsigned int sim_drop_bits(float f, int n) {
    const unsigned int u = sim_float_bits(f);
    if (f != f) return u;
    return (u + ((1u << (n - 1)) - 1u) + ((u >> n) & 1u)) & ~((1u << n) - 1u);
}
inline float to_f(float v) { return v; }
inline float to_f(bf16 v) { return sim_bits_float(static_cast<unsigned int>(v.bits) << 16); }
inline float to_f(fp16 v) {
    _Float16 x;
    std::memcpy(&x, &v.bits, 2);
    return static_cast<float>(x);
}
template <class T> inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline bf16 from_f<bf16>(float v) {
    bf16 d;
    d.bits = static_cast<unsigned short>(sim_drop_bits(v, 16) >> 16);
    return d;
}
template <> inline fp16 from_f<fp16>(float v) {
    const _Float16 x = static_cast<_Float16>(v);   // to nearest even (the default mode)
    fp16 d;
    std::memcpy(&d.bits, &x, 2);
    return d;
}
inline float round_tf32(float v) { return sim_bits_float(sim_drop_bits(v, 13)); }
#else

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) {
    return __uint_as_float(static_cast<unsigned int>(v.bits) << 16);
}
__device__ __forceinline__ float to_f(fp16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) {
    bf16 d;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d.bits) : "f"(v));
    return d;
}
template <> __device__ __forceinline__ fp16 from_f<fp16>(float v) {
    fp16 d;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(d.bits) : "f"(v));
    return d;
}
__device__ __forceinline__ float round_tf32(float v) {
    if (v != v) return v;   // NaN stays NaN (its payload's low bits too)
    const unsigned int u = __float_as_uint(v);
    return __uint_as_float((u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u);
}
#endif

#endif  // RNNRT_STORAGE_CUH
