#include "capi/scalar_check.h"

#include <cinttypes>

#include "capi/error.h"
#include "core/kv_format8.h"

namespace kf::capi {

const char* kv_format_name(kf_kv_format f) {
  switch (f) {
    case KF_KV_BF16: return "KF_KV_BF16";
    case KF_KV_FP16: return "KF_KV_FP16";
    case KF_KV_FP8_E4M3: return "KF_KV_FP8_E4M3";
    case KF_KV_INT8: return "KF_KV_INT8";
  }
  return "unknown";
}

kf_status check_kv_format(kf_kv_format f) {
  if (f == KF_KV_BF16 || f == KF_KV_FP16 || f == KF_KV_FP8_E4M3 || f == KF_KV_INT8)
    return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "kv_format: expected KF_KV_BF16, KF_KV_FP16, KF_KV_FP8_E4M3 or KF_KV_INT8 (0..3), got %d",
              int(f));
}

kf_status check_range(int64_t v, int64_t lo, int64_t hi, const char* name) {
  if (v >= lo && v <= hi) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected %" PRId64 "..%" PRId64 ", got %" PRId64,
              name, lo, hi, v);
}

kf_status check_h_q(int64_t h_q, const char* name) {
  return check_range(h_q, 1, KF_MLA_MAX_HEADS, name);
}
kf_status check_s_q(int64_t s_q, const char* name) { return check_range(s_q, 1, KF_MLA_MAX_SQ, name); }
kf_status check_batch(int64_t batch, const char* name) { return check_range(batch, 1, kMaxBatch, name); }
kf_status check_num_workers(int64_t num_workers, const char* name) {
  return check_range(num_workers, 1, kMaxWorkers, name);
}

kf_status check_page_size(kf_kv_format f, int64_t page_size, const char* name) {
  const bool pow2 = page_size >= 1 && page_size <= 256 && (page_size & (page_size - 1)) == 0;
  if (!pow2)
    return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a power of two in 1..256, got %" PRId64,
                name, page_size);
  if ((f == KF_KV_FP8_E4M3 || f == KF_KV_INT8) && page_size % kKv8PageMultiple != 0)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "%s: expected a multiple of %d for %s (16..256), got %" PRId64, name,
                kKv8PageMultiple, kv_format_name(f), page_size);
  return KF_SUCCESS;
}

kf_status check_out_pointer(const void* p, const char* name) {
  if (p) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a pointer to the result, got NULL", name);
}

}  // namespace kf::capi
