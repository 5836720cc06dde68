// Library-level entry points: status strings, the last error, version and build information,
// the device count and the cache-format sizes.
#include <string>

#include "capi/dispatch.h"
#include "capi/error.h"
#include "capi/scalar_check.h"
#include "core/mla_shape.h"

#define KF_STR2(x) #x
#define KF_STR(x) KF_STR2(x)
#define KF_VERSION_STRING \
  KF_STR(KF_VERSION_MAJOR) "." KF_STR(KF_VERSION_MINOR) "." KF_STR(KF_VERSION_PATCH)

#ifndef KF_CUDA_ARCHS_STRING
#define KF_CUDA_ARCHS_STRING "cpu-only"
#endif

using namespace kf::capi;

extern "C" {

KF_API const char* kf_status_string(kf_status status) {
  switch (status) {
    case KF_SUCCESS: return "KF_SUCCESS: no error";
    case KF_ERROR_INVALID_ARGUMENT: return "KF_ERROR_INVALID_ARGUMENT: a tensor or scalar does not fit the call";
    case KF_ERROR_UNSUPPORTED: return "KF_ERROR_UNSUPPORTED: not built or not implemented for this device";
    case KF_ERROR_CUDA: return "KF_ERROR_CUDA: the CUDA runtime reported an error";
    case KF_ERROR_INTERNAL: return "KF_ERROR_INTERNAL: a bug in kernelflow, please report it";
  }
  return "unknown kf_status";
}

KF_API const char* kf_last_error(void) { return last_error(); }

KF_API const char* kf_version(void) { return KF_VERSION_STRING; }

KF_API const char* kf_build_info(void) {
  // Built once (thread-safe static init); the CUDA runtime version is the one linked in.
  static const std::string info = [] {
    std::string archs = KF_CUDA_ARCHS_STRING;
    std::string s = "kernelflow " KF_VERSION_STRING "; ";
    s += archs == "cpu-only" ? archs : "cuda archs " + archs;
    s += "; " + cuda_runtime_description();
    return s;
  }();
  return info.c_str();
}

KF_API int kf_cuda_device_count(void) { return cuda_device_count(); }

KF_API kf_status kf_cache_bytes_per_token(kf_kv_format format, size_t* bytes) {
  return guarded([&] {
    KF_CHECK(check_kv_format(format));
    KF_CHECK(check_out_pointer(bytes, "bytes"));
    const bool q8 = format == KF_KV_FP8_E4M3 || format == KF_KV_INT8;
    *bytes = q8 ? size_t(kf::kBytesPerToken8bit) : size_t(kf::kHeadDim) * 2;
    return KF_SUCCESS;
  });
}

KF_API kf_status kf_cache_bytes_per_page(kf_kv_format format, int page_size, size_t* bytes) {
  return guarded([&] {
    KF_CHECK(check_kv_format(format));
    KF_CHECK(check_page_size(format, page_size, "page_size"));
    KF_CHECK(check_out_pointer(bytes, "bytes"));
    size_t per_token = 0;
    KF_CHECK(kf_cache_bytes_per_token(format, &per_token));
    *bytes = per_token * size_t(page_size);
    return KF_SUCCESS;
  });
}

}  // extern "C"
