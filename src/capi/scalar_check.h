// Range checks of the scalar arguments, shared by the size queries and the calls that take
// tensors (where the value comes from a shape and `name` says which).
#pragma once

#include <cstdint>

#include "kernelflow/kernelflow.h"

namespace kf::capi {

// Bounds that keep every index of the metadata and the workspace in int32 / int64 range.
constexpr int64_t kMaxBatch = int64_t(1) << 20;
constexpr int64_t kMaxWorkers = int64_t(1) << 16;

// v in lo..hi: "<name>: expected lo..hi, got v".
kf_status check_range(int64_t v, int64_t lo, int64_t hi, const char* name);
const char* kv_format_name(kf_kv_format f);  // "KF_KV_BF16", ... or "unknown"
kf_status check_kv_format(kf_kv_format f);
kf_status check_h_q(int64_t h_q, const char* name);
kf_status check_s_q(int64_t s_q, const char* name);
kf_status check_batch(int64_t batch, const char* name);
kf_status check_num_workers(int64_t num_workers, const char* name);
// A power of two 1..256; for 8-bit formats also a multiple of 16.
kf_status check_page_size(kf_kv_format f, int64_t page_size, const char* name);
kf_status check_out_pointer(const void* p, const char* name);

}  // namespace kf::capi
