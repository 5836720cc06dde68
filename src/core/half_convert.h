// bf16 / fp16 <-> fp32 by bit manipulation, round-to-nearest-even, NaN kept NaN. Host+device, so
// the CPU backend and the kernels' scalar paths produce the same bits (the hardware cvt.rn
// instructions round the same way).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"
#include "core/mla_shape.h"

namespace kf {

KF_HD inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
KF_HD inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

KF_HD inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

KF_HD inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  // Rounding a NaN payload could carry into the exponent and make it Inf: return a quiet NaN.
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

KF_HD inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = float(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

KF_HD inline uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (ax < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    const int e = int(ax >> 23);
    if (e < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to even 0)
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const int shift = 126 - e;  // 14..24: result unit is 2^-24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // may become the smallest normal
    return uint16_t(sign | q);
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);  // RNE on the 13 dropped bits
  r -= 112u << 23;                               // exponent bias 127 -> 15
  return uint16_t(sign | (r >> 13));
}

// 16-bit storage of a DType (bf16 or fp16) to and from fp32.
KF_HD inline float load_16(uint16_t h, DType t) {
  return t == DType::kBF16 ? bf16_to_float(h) : half_to_float(h);
}
KF_HD inline uint16_t store_16(float f, DType t) {
  return t == DType::kBF16 ? float_to_bf16(f) : float_to_half(f);
}

}  // namespace kf
