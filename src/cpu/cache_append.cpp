// CPU cache append: row i of kv goes to slot_mapping[i] (page * page_size + offset; negative =
// skip). 16-bit caches copy the bits; 8-bit caches quantize the latent on write (core/quant.h,
// the same bytes as the GPU) into the sectioned page of core/kv_format8.h.
#include <cstring>

#include "core/kv_format8.h"
#include "core/quant.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_util.h"
#include "cpu/kv_rows.h"

namespace kf::cpu {
namespace {

void write_row_8bit(const CacheAppendParams& p, const uint16_t* src, int page, int offset) {
  float x[kLatentDim];
  load_row_16(src, p.dtype, kLatentDim, x);
  uint8_t* base = static_cast<uint8_t*>(p.cache) + int64_t(page) * p.cache_page_stride;
  const float scale = quantize_latent(x, p.kv_format == KvFormat::kFP8E4M3,
                                      base + kv8_latent_offset(p.page_size, offset));
  memcpy(base + kv8_scale_offset(p.page_size, offset), &scale, sizeof(scale));
  // The rope part stays bf16: from an fp16 kv it is converted (RNE), from bf16 copied.
  uint16_t rope[kRopeDim];
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t v = src[kLatentDim + i];
    rope[i] = p.dtype == DType::kBF16 ? v : float_to_bf16(half_to_float(v));
  }
  memcpy(base + kv8_rope_offset(p.page_size, offset), rope, sizeof(rope));
}

}  // namespace

void cache_append(const CacheAppendParams& p) {
  const int64_t num_slots = int64_t(p.num_pages) * p.page_size;
  for (int i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.slot_mapping[i];
    if (slot < 0) continue;
    if (slot >= num_slots) {
      report_device_error(p.error_buffer, KF_DEVERR_SLOT_RANGE, i, slot);
      continue;
    }
    const int page = int(slot >> p.page_shift);
    const int offset = int(slot & (p.page_size - 1));
    const uint16_t* src = static_cast<const uint16_t*>(p.kv) + int64_t(i) * p.kv_row_stride;
    if (is_8bit(p.kv_format)) {
      write_row_8bit(p, src, page, offset);
    } else {
      uint16_t* dst = static_cast<uint16_t*>(p.cache) + int64_t(page) * p.cache_page_stride +
                      int64_t(offset) * p.cache_token_stride;
      memcpy(dst, src, kHeadDim * sizeof(uint16_t));
    }
  }
}

}  // namespace kf::cpu
