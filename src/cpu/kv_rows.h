// Reading cache rows and query rows into fp32, for every cache format (the CPU side of what the
// kernels' tile loaders do). Page and slot arithmetic follows params.h.
#pragma once

#include <cstdint>

#include "core/half_convert.h"
#include "core/kv_format8.h"
#include "core/params.h"
#include "core/quant.h"

namespace kf::cpu {

inline void load_row_16(const uint16_t* src, DType t, int n, float* dst) {
  if (t == DType::kBF16) {
    for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  } else {
    for (int i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
  }
}

// Token `offset` of page `page` as 576 fp32 values (8-bit latents dequantized).
inline void load_kv_row(const MlaDecodeParams& p, int page, int offset, float* row) {
  if (!is_8bit(p.kv_format)) {
    const uint16_t* src = static_cast<const uint16_t*>(p.kv) + int64_t(page) * p.kv_page_stride +
                          int64_t(offset) * p.kv_token_stride;
    load_row_16(src, p.dtype, kHeadDim, row);
    return;
  }
  const uint8_t* base = static_cast<const uint8_t*>(p.kv) + int64_t(page) * p.kv_page_stride;
  const bool e4m3 = p.kv_format == KvFormat::kFP8E4M3;
  const uint8_t* lat = base + kv8_latent_offset(p.page_size, offset);
  float scale;
  memcpy(&scale, base + kv8_scale_offset(p.page_size, offset), sizeof(scale));
  for (int i = 0; i < kLatentDim; ++i) row[i] = dequant_latent_value(lat[i], e4m3, scale);
  const uint8_t* rope = base + kv8_rope_offset(p.page_size, offset);
  for (int i = 0; i < kRopeDim; ++i) {
    uint16_t h;
    memcpy(&h, rope + 2 * i, sizeof(h));
    row[kLatentDim + i] = bf16_to_float(h);
  }
}

}  // namespace kf::cpu
