// CPU cache append and bulk conversion: row i of kv goes to slot_mapping[i] (page * page_size +
// offset; negative = skip). 16-bit caches copy the bits; 8-bit caches quantize the latent on
// write (core/quant.h, the same bytes as the GPU) into the sectioned page of core/kv_format8.h.
#include <cstring>

#include "core/kv_format8.h"
#include "core/quant.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_util.h"
#include "cpu/kv_rows.h"

namespace kf::cpu {
namespace {

// One 576-value row (bf16/fp16) into token `offset` of the 8-bit page at `page_base`.
void write_row_8bit(const uint16_t* src, DType dtype, KvFormat format, int page_size,
                    uint8_t* page_base, int offset) {
  float x[kLatentDim];
  load_row_16(src, dtype, kLatentDim, x);
  const float scale = quantize_latent(x, format == KvFormat::kFP8E4M3,
                                      page_base + kv8_latent_offset(page_size, offset));
  memcpy(page_base + kv8_scale_offset(page_size, offset), &scale, sizeof(scale));
  // The rope part stays bf16: from an fp16 kv it is converted (RNE), from bf16 copied.
  uint16_t rope[kRopeDim];
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t v = src[kLatentDim + i];
    rope[i] = dtype == DType::kBF16 ? v : float_to_bf16(half_to_float(v));
  }
  memcpy(page_base + kv8_rope_offset(page_size, offset), rope, sizeof(rope));
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
      write_row_8bit(src, p.dtype, p.kv_format, p.page_size,
                     static_cast<uint8_t*>(p.cache) + int64_t(page) * p.cache_page_stride, offset);
    } else {
      uint16_t* dst = static_cast<uint16_t*>(p.cache) + int64_t(page) * p.cache_page_stride +
                      int64_t(offset) * p.cache_token_stride;
      memcpy(dst, src, kHeadDim * sizeof(uint16_t));
    }
  }
}

void cache_convert(const CacheConvertParams& p) {
  // Pages are independent: a fixed split over threads writes the same bytes whatever the count.
  run_threads(p.num_pages, [&](int t, int nt) {
    for (int page = t; page < p.num_pages; page += nt) {
      const uint16_t* src = static_cast<const uint16_t*>(p.src) + int64_t(page) * p.src_page_stride;
      uint8_t* dst = static_cast<uint8_t*>(p.dst) + int64_t(page) * p.dst_page_stride;
      for (int j = 0; j < p.page_size; ++j)
        write_row_8bit(src + int64_t(j) * p.src_token_stride, p.src_dtype, p.dst_format,
                       p.page_size, dst, j);
    }
  });
}

}  // namespace kf::cpu
