// Which calls the sm_90a decode family runs with its own kernel, and that kernel's row tiles:
// host code with no CUDA dependency, so the CPU tests check the rule
// (cpp_tests/test_decode_config.cpp). decode_family_sm90a.cu runs the portable kernels for the
// rest, and gives their row tiles and blocks per SM for those calls.
#pragma once

#include "core/mla_shape.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"

namespace kf::cuda {

// Up to this many query rows (s_q * h_q) the portable kernels run the call: at 16 rows (h_q 16,
// s_q 1) the decode is bound by the cache read, where the portable M16 kernel reads at the
// device's ceiling and a 64-row wgmma tile would compute four times the rows; at 32 rows the
// portable kernel took 0.88-0.97x the wgmma kernel's time on the H200 at every batch
// (docs/optimization/sm90a.md).
constexpr int kSm90aPortableMaxRows = 32;

// 16-bit caches with more than kSm90aPortableMaxRows query rows; 8-bit caches have no sm_90a
// kernel yet.
inline bool sm90a_kernel_runs(int num_rows, KvFormat kv_format) {
  return !is_8bit(kv_format) && num_rows > kSm90aPortableMaxRows;
}

// Blocks along the row axis of the sm_90a kernel for num_rows rows.
inline int sm90a_row_tiles(int num_rows) { return ceil_div(num_rows, MlaSm90aTraits::kBlockM); }

}  // namespace kf::cuda
