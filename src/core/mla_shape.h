// MLA decode geometry and the kinds of data the kernels are instantiated for.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace kf {

constexpr int kHeadDim = 576;    // q and cache row: latent + rope
constexpr int kLatentDim = 512;  // c, and the value dims
constexpr int kRopeDim = 64;     // k_pe
constexpr int kMaxHeads = 128;
constexpr int kMaxSq = 16;
constexpr int kBytesPerToken8bit = 644;  // 512 x 8-bit + 64 x bf16 + fp32 scale

enum class DType { kBF16, kFP16 };
enum class KvFormat { kBF16 = 0, kFP16 = 1, kFP8E4M3 = 2, kINT8 = 3 };

KF_HD inline bool is_8bit(KvFormat f) { return f == KvFormat::kFP8E4M3 || f == KvFormat::kINT8; }

KF_HD inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
KF_HD inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Causal rule (docs/spec.md section 1): query i (0-based) of the s_q new tokens sees positions
// 0 .. seqlen - s_q + i, i.e. the first seqlen - s_q + i + 1 positions, clamped to [0, seqlen].
KF_HD inline int visible_len(int seqlen, int s_q, int i) {
  int n = seqlen - s_q + i + 1;
  return n < 0 ? 0 : (n > seqlen ? seqlen : n);
}

}  // namespace kf
