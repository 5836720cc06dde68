// Which instantiation of the portable (sm80) family's decode kernel runs a call: one choice,
// made here, that its launch, its row-tile count and the default worker count all read. Host code
// with no CUDA dependency, so the CPU tests check the rule (cpp_tests/test_decode_config.cpp).
#pragma once

#include "core/mla_shape.h"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

// A (traits, cache format) pair that src/cuda/decode/sm80/ instantiates.
enum class DecodeConfig {
  k16Rows16,    // MlaTraitsM16, 16-bit cache: <= 16 rows (h_q 16, memory-bound)
  k16Rows32,    // MlaTraitsM32: 17..32 rows; more rows where two such blocks fit an SM
  k16Rows64,    // MlaTraitsM64: > 32 rows where one 32-row block fills an SM (sm_80/86/89)
  kE4M3Rows16,  // MlaTraits8M16, FP8 e4m3 cache: every row count, 16 rows per tile
  kInt8Rows16,  // MlaTraits8M16, INT8 cache
};

// 16-bit caches, more than 32 rows: 32-row tiles (4 warps) where two such blocks fit an SM, else
// 64-row tiles (8 warps, one block per SM, row group 1's P V deferred a tile). Two 32-row blocks
// fit on sm_90 (228 KB of shared memory per SM), not on sm_80 (164 KB) or sm_86/89 (100 KB), so
// GeForce Ampere keeps the 64-row design. Where they fit, two independent blocks per SM are the
// faster choice: the second one hides the first one's per-tile latency (loads, the softmax's
// reductions), where one 8-warp block runs its two row groups through each tile together.
// 8-bit caches: 16-row tiles for every row count (more rows, more row tiles). A tile of two row
// groups would dequantize each KV tile once per group anyway, and its 8 warps (at about 240
// registers) fit once per SM; 16-row blocks fit twice and run independently.
// two_32_row_blocks_fit() is called only when the answer matters (16-bit, more than 32 rows):
// on a GPU it is an occupancy query.
template <class TwoFit>
DecodeConfig decode_config(int num_rows, KvFormat kv_format, TwoFit&& two_32_row_blocks_fit) {
  if (kv_format == KvFormat::kFP8E4M3) return DecodeConfig::kE4M3Rows16;
  if (kv_format == KvFormat::kINT8) return DecodeConfig::kInt8Rows16;
  if (num_rows <= MlaTraitsM16::kBlockM) return DecodeConfig::k16Rows16;
  if (num_rows <= MlaTraitsM32::kBlockM || two_32_row_blocks_fit())
    return DecodeConfig::k16Rows32;
  return DecodeConfig::k16Rows64;
}

// The configuration's traits and cache format as types, for the templates.
template <class Tr, int kFmt_>
struct DecodeInstance {
  using Traits = Tr;
  static constexpr int kFmt = kFmt_;
};

// f(DecodeInstance<traits, format>{}) for configuration c: the one map from a configuration to
// what src/cuda/decode/sm80/ instantiates.
template <class F>
auto with_instance(DecodeConfig c, F&& f) {
  switch (c) {
    case DecodeConfig::k16Rows16: return f(DecodeInstance<MlaTraitsM16, kKvFmt16>{});
    case DecodeConfig::k16Rows32: return f(DecodeInstance<MlaTraitsM32, kKvFmt16>{});
    case DecodeConfig::k16Rows64: return f(DecodeInstance<MlaTraitsM64, kKvFmt16>{});
    case DecodeConfig::kE4M3Rows16: return f(DecodeInstance<MlaTraits8M16, kKvFmtE4M3>{});
    default: return f(DecodeInstance<MlaTraits8M16, kKvFmtInt8>{});
  }
}

// Query rows one block of the configuration holds.
inline int decode_config_rows(DecodeConfig c) {
  return with_instance(c, [](auto in) { return decltype(in)::Traits::kBlockM; });
}

// Blocks along the row axis for num_rows rows.
inline int decode_config_row_tiles(DecodeConfig c, int num_rows) {
  return ceil_div(num_rows, decode_config_rows(c));
}

}  // namespace kf::cuda
