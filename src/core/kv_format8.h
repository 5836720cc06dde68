// The byte map of one page of an 8-bit KV cache (KF_KV_FP8_E4M3, KF_KV_INT8): the one place it is
// defined. A page of page_size tokens (a multiple of 16) is page_size * 644 bytes in three
// sections, so every section and every token's latent and rope part start 16-byte aligned and a
// kernel reads a tile of tokens with 16-byte loads:
//
//   [0,             ps * 512)   latents: token t at t * 512, 512 x (e4m3 | int8)
//   [ps * 512,      ps * 640)   rope:    token t at ps * 512 + t * 128, 64 x bf16 (unquantized)
//   [ps * 640,      ps * 644)   scales:  token t at ps * 640 + t * 4, fp32, latent = q * scale
//
// Pages themselves may lie anywhere (the page stride is the caller's), 16-byte aligned.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/mla_shape.h"

namespace kf {

constexpr int kKv8LatentBytes = kLatentDim;  // per token
constexpr int kKv8RopeBytes = kRopeDim * 2;  // per token, bf16
constexpr int kKv8ScaleBytes = 4;            // per token, fp32
constexpr int kKv8PageMultiple = 16;         // page sizes of 8-bit caches

KF_HD inline int64_t kv8_page_bytes(int page_size) {
  return int64_t(page_size) * kBytesPerToken8bit;
}
KF_HD inline int64_t kv8_latent_offset(int /*page_size*/, int t) {
  return int64_t(t) * kKv8LatentBytes;
}
KF_HD inline int64_t kv8_rope_offset(int page_size, int t) {
  return int64_t(page_size) * kKv8LatentBytes + int64_t(t) * kKv8RopeBytes;
}
KF_HD inline int64_t kv8_scale_offset(int page_size, int t) {
  return int64_t(page_size) * (kKv8LatentBytes + kKv8RopeBytes) + int64_t(t) * kKv8ScaleBytes;
}

}  // namespace kf
