// Per-token symmetric quantization of the 512 latent values for the 8-bit caches (docs/spec.md
// sections 2 and 6): amax = max |x|, stored q = x * (qmax / amax) rounded to nearest even and
// saturated to +-qmax, scale = amax / qmax (fp32); amax = 0 stores zero codes and scale 0; a
// latent holding a NaN or an Inf stores zero codes and scale NaN, so every value of the token
// decodes to NaN. Bit-exact host+device code, so the CPU backend and the GPU append kernel
// write the same bytes.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/half_convert.h"
#include "core/host_device.h"

namespace kf {

constexpr float kQmaxE4M3 = 448.f;
constexpr float kQmaxInt8 = 127.f;

// fp32 -> e4m3 (fn: no Inf, 0x7f/0xff are NaN), round to nearest even, saturating to +-448 as
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does; NaN stays NaN.
KF_HD inline uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t ax = u & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (ax >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (and Inf): the largest finite
  if (ax < 0x3c800000u) {                                // below 2^-6: subnormal, unit 2^-9
    const int e = int(ax >> 23);
    if (e < 117) return sign;  // below 2^-10 (2^-10 itself ties to even 0)
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const int shift = 141 - e;  // 21..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // 8 is the smallest normal
    return uint8_t(sign | q);
  }
  uint32_t r = ax + 0x7ffffu + ((ax >> 20) & 1u);  // RNE on the 20 dropped bits
  r -= 120u << 23;                                 // exponent bias 127 -> 7
  return uint8_t(sign | (r >> 20));                // below 448, so at most 0x7e
}

KF_HD inline float e4m3_to_float(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24;
  const uint32_t e = (v >> 3) & 0xfu;
  const uint32_t m = v & 0x7u;
  if (e == 15 && m == 7) return bits_float(sign | 0x7fc00000u);
  if (e == 0) {
    const float x = float(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -x : x;
  }
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

// fp32 -> int8 round to nearest even, saturating to +-127; NaN stores 0.
KF_HD inline int8_t float_to_int8_sat(float f) {
  if (!(f == f)) return 0;
  if (f >= 127.f) return 127;
  if (f <= -127.f) return -127;
  return int8_t(rintf(f));  // default rounding mode: nearest even
}

constexpr uint32_t kScaleNaNBits = 0x7fc00000u;  // the scale of a non-finite latent

// One step of a token's amax as quantize-on-write counts it: the largest |x|, a NaN counting as
// +Inf. A NaN or Inf anywhere makes amax +Inf, and fmaxf keeps +Inf against any operand, so
// the steps and a reduction of partial maxima (the GPU's warp shuffle) agree in any order.
KF_HD inline float latent_amax_step(float amax, float x) {
  const float a = fabsf(x);
  return fmaxf(amax, a == a ? a : INFINITY);
}
// Whether a token of this amax stores computed codes: not for an all-zero latent (amax 0) nor
// for one with a NaN or Inf (amax +Inf); both store 512 zero codes.
KF_HD inline bool latent_has_codes(float amax) { return amax > 0.f && amax < INFINITY; }
// The stored scale: amax / qmax (0 for an all-zero latent), or the quiet NaN kScaleNaNBits for a
// latent with a NaN or Inf (written as bits: host and device NAN macros differ in payload).
KF_HD inline float latent_scale(float amax, bool e4m3) {
  return amax < INFINITY ? amax / (e4m3 ? kQmaxE4M3 : kQmaxInt8) : bits_float(kScaleNaNBits);
}
// The stored code of y = x * (qmax / amax).
KF_HD inline uint8_t quantize_code(float y, bool e4m3) {
  return e4m3 ? float_to_e4m3(y) : uint8_t(float_to_int8_sat(y));
}

// Quantize one token's latent (512 values as fp32) into q_out (512 bytes) and return the scale.
KF_HD inline float quantize_latent(const float* x, bool e4m3, uint8_t* q_out) {
  float amax = 0.f;
  for (int i = 0; i < kLatentDim; ++i) amax = latent_amax_step(amax, x[i]);
  if (!latent_has_codes(amax)) {
    for (int i = 0; i < kLatentDim; ++i) q_out[i] = 0;
    return latent_scale(amax, e4m3);
  }
  const float inv = (e4m3 ? kQmaxE4M3 : kQmaxInt8) / amax;
  for (int i = 0; i < kLatentDim; ++i) q_out[i] = quantize_code(x[i] * inv, e4m3);
  return latent_scale(amax, e4m3);
}

KF_HD inline float dequant_latent_value(uint8_t v, bool e4m3, float scale) {
  return (e4m3 ? e4m3_to_float(v) : float(int8_t(v))) * scale;
}

}  // namespace kf
