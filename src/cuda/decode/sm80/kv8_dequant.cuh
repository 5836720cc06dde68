// 8-bit KV tiles (core/kv_format8.h byte map) read straight into mma fragments: the decode
// kernel's warps load the 8-bit bytes from the cp.async ring and convert them in registers, so
// an 8-bit tile costs its own 644 bytes per token of shared-memory traffic and no staging pass.
//
// Values: e4m3 -> fp16 (as the value times 2^-8, three integer operations per pair) and int8 ->
// fp16 are exact, so the fragments hold the stored codes exactly (kv8_code_unit: 2^-8 for e4m3),
// and the latent mma runs in fp16 for either q dtype. The per-token scale goes to the scores and to P instead:
//   s_t = scale_t * 2^-e_row * (q16 . k_q,t) + q_pe . k_pe,t   (fp32)
//   O  += sum_t (p_t * scale_t / S_tile) v_q,t, O kept in units of S_tile
// (S_tile: the power of two at or above the tile's largest scale, so dividing by it is exact)
// q16 = q * 2^e_row in fp16, exact: e_row puts the largest |q| of the warp's 128 dims of the row
// in [2^14, 2^15), inside fp16's range whatever q's dtype. P' = p_t * scale_t / S_tile <= 1 (S_tile >=
// the tile's largest scale) is rounded to fp16 (2^-11 relative, 8x finer than a bf16 P), the O
// accumulator's rescale factor becomes alpha * S_prev / S_tile, and the epilogue multiplies by
// the last S_tile.
//
// Fragment layouts (warp d owns latent dims [128 d, 128 d + 128), thread = (g, t) = (lane / 4,
// lane % 4)); a tile's 512 latent bytes of token j hold 16-byte chunk c at (c ^ (j & 7)) * 16:
//   QK: a dot product does not care about the order of its k index, so k-step j of thread t
//       takes the 4 consecutive dims 128 d + 32 t + 4 j .. + 3 (mma k = 2t, 2t+1, 2t+8, 2t+9):
//       one 4-byte word gives both B registers, and the thread's q is 32 consecutive dims.
//   PV: no second read or conversion: the QK B fragment of an 8x8 block (thread (g, t): token g,
//       two dims) transposed (movmatrix, sm_75+) is the P V B fragment (tokens 2t, 2t+1, one
//       dim), so output fragment f = 2 j + h has column g = dim 128 d + 32 (g / 2) + 4 j + 2 h +
//       (g % 2), and a thread's accumulator o[f][e] (+2: row + 8) holds dim 128 d + 32 t + 2 f + e.
// The QK reads hit 8 distinct 16-byte bank groups per quarter-warp under the chunk swizzle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/mla_shape.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/decode/sm80/mla_decode_traits.h"  // KvFmt

namespace kf::cuda {

// The smallest power of two >= x, for finite x > 0 (2^-126 for subnormal x).
__device__ __forceinline__ float pow2_at_least(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t e = u & 0x7f800000u;
  return __uint_as_float((u & 0x007fffffu) != 0u ? e + 0x00800000u : e);
}
// 1 / x for a power of two x in [2^-126, 2^127], exactly (the exponent field negated).
__device__ __forceinline__ float pow2_inverse(float x) {
  return __uint_as_float(0x7f000000u - __float_as_uint(x));
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

// Four e4m3 bytes -> fp16 pairs of the values times 2^-8, exact (subnormals included): each byte
// to the high byte of a 16-bit half, the 7 magnitude bits shifted right by one under the sign.
// Three integer operations per pair and no conversion unit; the 2^8 goes into the scales.
__device__ __forceinline__ void e4m3x4_to_f16_2m8(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t x0 = __byte_perm(w, 0u, 0x1404), x1 = __byte_perm(w, 0u, 0x3424);
  lo = (x0 & 0x80008000u) | ((x0 >> 1) & 0x3f803f80u);
  hi = (x1 & 0x80008000u) | ((x1 >> 1) & 0x3f803f80u);
}

// The decode kernel's conversion of an 8-bit format: fp16 codes times kv8_code_unit<kFmt>().
// e4m3 on sm_89+: the hardware cvt (the bit trick takes about 3.5x its integer instructions, in
// a loop bound by them); on sm_80/86, which have no e4m3 cvt, the bit trick.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define KF_E4M3_HW_CVT 0
#else
#define KF_E4M3_HW_CVT 1
#endif
template <int kFmt>
__device__ __forceinline__ constexpr float kv8_code_unit() {
  return kFmt == kKvFmtE4M3 && !KF_E4M3_HW_CVT ? 1.f / 256.f : 1.f;
}
template <int kFmt>
__device__ __forceinline__ void kv8x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (kFmt == kKvFmtE4M3) {
    if constexpr (KF_E4M3_HW_CVT)
      e4m3x4_to_f16(w, lo, hi);
    else
      e4m3x4_to_f16_2m8(w, lo, hi);
  } else {
    int8x4_to_f16(w, lo, hi);
  }
}

// A pair of 16-bit values of type T -> two floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (std::is_same<T, __half>::value) {
    __half2 h;
    memcpy(&h, &v, 4);
    return __half22float2(h);
  } else {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  }
}

// The exponent k of the power of two that scales a q row into fp16's range for the 8-bit path:
// mx * 2^k in [2^14, 2^15) for the row's largest |q| mx, k = 14 - floor(log2 mx), clamped so 2^k
// and 2^-k are normal floats. A zero (or non-finite) row keeps k = 0.
__device__ __forceinline__ int kv8_q_exponent(float mx) {
  const int e = int((__float_as_uint(mx) >> 23) & 0xff) - 127;
  const int k = (mx > 0.f && mx <= 3.4e38f) ? 14 - e : 0;
  return k < -120 ? -120 : (k > 120 ? 120 : k);
}

// q fragments of one row half (hf) of one 16-row fragment for the 8-bit path: the 32 dims
// 128 d + 32 t .. of the row as fp16 A-fragment registers qf[j][hf] (dims 4j, 4j+1) and
// qf[j][2 + hf] (4j+2, 4j+3), scaled by 2^e (see above); returns 2^-e (1 for a zero row).
// All four lanes of a quad call it together (the maximum is shared over the quad).
template <typename T>
__device__ __forceinline__ float kv8_q_fragments(const T* row_dims, bool valid,
                                                 uint32_t (&qf)[8][4], int hf) {
  float2 v[16];
  float mx = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t w = valid ? __ldg(reinterpret_cast<const uint32_t*>(row_dims) + i) : 0u;
    v[i] = unpack2<T>(w);
    mx = fmaxf(mx, fmaxf(fabsf(v[i].x), fabsf(v[i].y)));
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const int k = kv8_q_exponent(mx);
  const float up = __uint_as_float(uint32_t(127 + k) << 23);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    qf[j][hf] = pack2<__half>(v[2 * j].x * up, v[2 * j].y * up);
    qf[j][2 + hf] = pack2<__half>(v[2 * j + 1].x * up, v[2 * j + 1].y * up);
  }
  return __uint_as_float(uint32_t(127 - k) << 23);
}

// Latent partial scores of this warp for the tile's kNFrags * 8 tokens:
// s[nf] += q16 . k_q over dims [128 d, 128 d + 128) (unscaled codes; see the layout above). The
// converted B registers stay in kb[nf][j][0/1] (dims 4j, 4j+1 and 4j+2, 4j+3 of the thread's 32,
// token g of fragment nf): P V reuses them (kv8_pv_from_k), so every code is converted once.
template <int kFmt, int kNFrags>
__device__ __forceinline__ void kv8_qk_latent_keep(float (&s)[kNFrags][4], const uint32_t (&qf)[8][4],
                                                   const uint8_t* lat, int d, int lane,
                                                   uint32_t (&kb)[kNFrags][8][2]) {
  const int g = lane >> 2, t = lane & 3;
  const int c0 = ((8 * d + 2 * t) ^ g) << 4;
  const uint8_t* p0 = lat + g * kLatentDim + c0;
  const uint8_t* p1 = lat + g * kLatentDim + (c0 ^ 16);
#pragma unroll
  for (int nf = 0; nf < kNFrags; ++nf) {
    const uint4 x0 = *reinterpret_cast<const uint4*>(p0 + nf * 8 * kLatentDim);
    const uint4 x1 = *reinterpret_cast<const uint4*>(p1 + nf * 8 * kLatentDim);
    const uint32_t w[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      kv8x4_to_f16<kFmt>(w[j], kb[nf][j][0], kb[nf][j][1]);
      mma_16816<__half>(s[nf], qf[j], kb[nf][j][0], kb[nf][j][1]);
    }
  }
}

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

// O += P' V for tokens 16 kt .. + 15 from the QK B registers: the B fragment of an 8x8 block
// in QK (thread (g, t): token g, two dims) transposed is the P.V B fragment (tokens 2t, 2t+1,
// one dim). Output fragment f = 2 j + h, column g = dim 32 (g / 2) + 4 j + 2 h + (g % 2) of
// the warp's 128: a thread's o[f][e (+2)] is dim 32 t + 2 f + e of its row.
template <int kNFrags>
__device__ __forceinline__ void kv8_pv_from_k(float (&o)[16][4], const uint32_t (&pa)[4],
                                              const uint32_t (&kb)[kNFrags][8][2], int kt) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      mma_16816<__half>(o[2 * j + h], pa, movmatrix_trans(kb[2 * kt][j][h]),
                        movmatrix_trans(kb[2 * kt + 1][j][h]));
}

}  // namespace kf::cuda
