// Which calls the sm_90a decode family runs with its own kernels, and their row tiles:
// host code with no CUDA dependency, so the CPU tests check the rule
// (cpp_tests/test_decode_config.cpp). decode_family_sm90a.cu runs the portable kernels for the
// rest, and gives their row tiles and blocks per SM for those calls.
#pragma once

#include "core/mla_shape.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_kv8_traits.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"

namespace kf::cuda {

// Up to this many query rows (s_q * h_q) the portable kernels run the call: at 16 rows (h_q 16,
// s_q 1) the decode is bound by the cache read, where the portable M16 kernel reads at the
// device's ceiling and a 64-row wgmma tile would compute four times the rows. From 17 rows the
// wgmma kernel is as fast or faster: at 32 rows (h_q 32; h_q 16 with s_q 2) on the H200 equal
// within 1% at b 1 to 64 with s_k 4096, 4% faster at b 128, 1-13% faster with s_k 16384
// (docs/optimization/sm90a.md, sm90a-rows-16).
constexpr int kSm90aPortableMaxRows = 16;

// 16-bit caches with more than kSm90aPortableMaxRows query rows.
inline bool sm90a_kernel_runs(int num_rows, KvFormat kv_format) {
  return !is_8bit(kv_format) && num_rows > kSm90aPortableMaxRows;
}

// The calls whose schedule may put half the workers on the even ones at small batch
// (MlaMetadataParams::spread): the wgmma kernel's, one block per SM with a two-tile step; at
// h_q 128 b 1, h_q 64 b 2 and h_q 32 b 2 (s_k 4096) on the H200 7-9% faster
// (docs/optimization/decode.md, sched-spread-half).
inline bool sm90a_spread_small_batch(int num_rows, KvFormat kv_format) {
  return sm90a_kernel_runs(num_rows, kv_format);
}

// Blocks along the row axis of the sm_90a kernel for num_rows rows.
inline int sm90a_row_tiles(int num_rows) { return ceil_div(num_rows, MlaSm90aTraits::kBlockM); }

inline int sm90a_kv8_row_tiles(int num_rows) {
  return ceil_div(num_rows, MlaSm90aKv8Traits::kBlockM);
}

// 8-bit caches (FP8 e4m3, INT8) run the sm_90a 8-bit kernel in 16-row tiles, one block per SM,
// when q is bf16 (its rope product multiplies q_pe by the cache's bf16 rope part; with fp16 q the
// portable 8-bit kernel runs the call, decode_family_sm90a.cu): at every batch with kv8_switch
// (KF_SM90A_KV8, cuda/common/switches.h); without it for calls of at most kSm90aKv8MaxRows rows
// whose batch x 16-row tiles reaches kSm90aKv8MinTilesFp8 (FP8) or kSm90aKv8MinTilesInt8 (INT8),
// where on the H200 it was as fast as the portable 8-bit kernel or faster at s_k 4096 and 16384
// (FP8 h_q 16 b 128: 1.13x; h_q 32 and 64 from b 64: 1.07-1.13x) and below which it was slower
// (b 1: 0.8x; docs/optimization/sm90a.md, sm90a-kv8-sweep). `batch` is the call's batch where
// known (a batch-aware default worker count, the decode), else 0 (never without the switch).
constexpr int kSm90aKv8MaxRows = 64;
constexpr int kSm90aKv8MinTilesFp8 = 64;
constexpr int kSm90aKv8MinTilesInt8 = 128;
inline bool sm90a_kv8_kernel_runs(KvFormat kv_format, bool kv8_switch, int num_rows, int batch) {
  if (!is_8bit(kv_format)) return false;
  if (kv8_switch) return true;
  if (batch <= 0 || num_rows > kSm90aKv8MaxRows) return false;
  const int64_t tiles = int64_t(batch) * sm90a_kv8_row_tiles(num_rows);
  return tiles >= (kv_format == KvFormat::kINT8 ? kSm90aKv8MinTilesInt8 : kSm90aKv8MinTilesFp8);
}

}  // namespace kf::cuda
