// Dequantization of an 8-bit KV tile (core/kv_format8.h byte map) from the cp.async ring into the
// 16-bit staging tile that the decode kernel's ldmatrix/mma path reads (same row layout and
// swizzle as a 16-bit tile: 1152-byte rows, 16-byte chunk c of token j at c ^ (j & 7)).
//
// Values: e4m3 -> fp16 and int8 -> fp16 are exact (cvt.rn.f16x2.e4m3x2 on sm_89+, bit tricks on
// sm_80/86), and fp16 -> bf16 of such values is exact too, so the staging tile holds the stored
// values unscaled and exact. The per-token scale goes to the scores and to P instead:
//   s_t = scale_t * (q_lat . k_q,t) + q_pe . k_pe,t   (fp32, before the rope k-step)
//   O  += sum_t (p_t * scale_t) v_q,t
// Rounding x * scale to 16 bits in the staging tile instead would cost ~2e-5 cosine distance
// (bf16) or ~1e-3 in lse (fp16) against the CPU backend, over the budget. P * scale_t rounded to
// 16 bits is where the error goes:
//   - bf16 q: P = hi + lo, two bf16 values (the PV mma runs twice): one bf16 P alone is 3x worse
//     than the 16-bit path (there the dominant token's p = 1 is exact, here p * scale_t is not),
//     ~5e-6..1e-5 worst row against the CPU backend;
//   - fp16 q: P = p * scale_t / S_tile (S_tile the tile's largest scale, so P <= 1 and stays out
//     of fp16's subnormal range), and the O accumulator is kept in units of S_tile: its rescale
//     factor becomes alpha * S_prev / S_tile, and the epilogue multiplies by the last S_tile.
// The rope part is bf16 in the cache: copied for bf16 q, rounded to fp16 for fp16 q.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/mla_shape.h"
#include "cuda/common/mma_sm80.cuh"

namespace kf::cuda {

enum KvFmt { kKvFmt16 = 0, kKvFmtE4M3 = 1, kKvFmtInt8 = 2 };

// How an 8-bit format's scale reaches P (see above).
template <typename T, int kFmt>
constexpr bool kv8_p_split() {
  return kFmt != kKvFmt16 && std::is_same<T, __nv_bfloat16>::value;
}
template <typename T, int kFmt>
constexpr bool kv8_p_norm() {
  return kFmt != kKvFmt16 && std::is_same<T, __half>::value;
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hsub2_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Four e4m3 bytes (dims 0..3, byte 0 = dim 0) -> fp16 pairs (dims 0,1) and (dims 2,3), exact.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
      " cvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  // Each byte to the high byte of a 16-bit half: s eeee mmm 00000000. Shifting the 7 magnitude
  // bits right by one makes an fp16 with exponent field e and mantissa mmm0000000, i.e. the
  // e4m3 value times 2^-8 (subnormals included: both formats' subnormals scale the same way);
  // one exact multiply by 256 fixes the bias. (0x7f, e4m3's NaN, becomes 480: the quantizer
  // writes it only for a NaN input.)
  const uint32_t x0 = __byte_perm(w, 0u, 0x1404), x1 = __byte_perm(w, 0u, 0x3424);
  lo = hmul2_u32((x0 & 0x80008000u) | ((x0 >> 1) & 0x3f803f80u), 0x5c005c00u);
  hi = hmul2_u32((x1 & 0x80008000u) | ((x1 >> 1) & 0x3f803f80u), 0x5c005c00u);
#endif
}

// Four int8 bytes -> fp16 pairs, exact: 0x64XX is the fp16 1024 + XX, so with the sign bit
// flipped (XX = x + 128) one subtraction of 1152 leaves x.
__device__ __forceinline__ void int8x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = w ^ 0x80808080u;
  lo = hsub2_u32(__byte_perm(u, 0x64646464u, 0x4140), 0x64806480u);
  hi = hsub2_u32(__byte_perm(u, 0x64646464u, 0x4342), 0x64806480u);
}

// An fp16 pair of exact values -> the staging type (exact).
template <typename T>
__device__ __forceinline__ uint32_t f16x2_to_stage(uint32_t h) {
  if constexpr (std::is_same<T, __half>::value) {
    return h;
  } else {
    __half2 hv;
    memcpy(&hv, &h, 4);
    const float2 f = __half22float2(hv);
    return pack2<T>(f.x, f.y);
  }
}

// A bf16 pair (the cache's rope) -> the staging type.
template <typename T>
__device__ __forceinline__ uint32_t bf16x2_to_stage(uint32_t v) {
  if constexpr (std::is_same<T, __half>::value) {
    return pack2<T>(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    return v;
  }
}

// Dequantize ring tile `ring` (kBlockN tokens, 8-bit layout) into staging tile `stage` (16-bit
// layout), the tile's scales into `stage_scale` and their maximum into *stage_smax. All
// threads of the block take part; the caller orders it with barriers (the ring tile has landed
// for every thread's cp.async, nobody reads the staging tile).
template <class Tr, typename T, int kFmt>
__device__ __forceinline__ void dequant_tile(const uint8_t* __restrict__ ring,
                                             uint8_t* __restrict__ stage,
                                             float* __restrict__ stage_scale,
                                             float* __restrict__ stage_smax, int tid) {
  constexpr int kRowBytes = kHeadDim * 2;
  const float* scales = reinterpret_cast<const float*>(ring + Tr::kKv8ScaleOff);
#pragma unroll
  for (int i = tid; i < Tr::kBlockN * (kLatentDim / 16); i += Tr::kNumThreads) {
    const int tok = i / (kLatentDim / 16), c8 = i % (kLatentDim / 16);
    const uint4 w = *reinterpret_cast<const uint4*>(ring + tok * kLatentDim + c8 * 16);
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    uint32_t h[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (kFmt == kKvFmtE4M3)
        e4m3x4_to_f16(ws[k], h[2 * k], h[2 * k + 1]);
      else
        int8x4_to_f16(ws[k], h[2 * k], h[2 * k + 1]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = f16x2_to_stage<T>(h[k]);
    // 16 values = staging chunks 2 c8 and 2 c8 + 1. Threads c8 % 8 >= 4 store the odd chunk
    // first, so each store of a quarter-warp covers 8 distinct bank groups.
    const bool odd_first = (c8 >> 2) & 1;
    const uint4 a = make_uint4(h[0], h[1], h[2], h[3]), b = make_uint4(h[4], h[5], h[6], h[7]);
    uint8_t* row = stage + tok * kRowBytes;
    const int sw = tok & 7;
    *reinterpret_cast<uint4*>(row + (((2 * c8 + odd_first) ^ sw) << 4)) = odd_first ? b : a;
    *reinterpret_cast<uint4*>(row + (((2 * c8 + !odd_first) ^ sw) << 4)) = odd_first ? a : b;
  }
#pragma unroll
  for (int i = tid; i < Tr::kBlockN * (kRopeDim * 2 / 16); i += Tr::kNumThreads) {
    const int tok = i / 8, c = i % 8;
    uint4 v = *reinterpret_cast<const uint4*>(ring + Tr::kKv8RopeOff + tok * 128 + c * 16);
    v.x = bf16x2_to_stage<T>(v.x), v.y = bf16x2_to_stage<T>(v.y);
    v.z = bf16x2_to_stage<T>(v.z), v.w = bf16x2_to_stage<T>(v.w);
    *reinterpret_cast<uint4*>(stage + tok * kRowBytes + (((kLatentDim / 8 + c) ^ (tok & 7)) << 4)) = v;
  }
  static_assert(Tr::kBlockN <= 32, "one warp stages the scales");
  if (tid < 32) {  // warp 0, whole: scales (zero for tokens not loaded) and their maximum
    float v = tid < Tr::kBlockN ? scales[tid] : 0.f;
    if (tid < Tr::kBlockN) stage_scale[tid] = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (tid == 0) *stage_smax = v;
  }
}

}  // namespace kf::cuda
