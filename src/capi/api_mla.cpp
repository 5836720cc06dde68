// MLA entry points: validate (mla_validate.h), check CPU contents (host_check.h), then run the
// backend of the tensors' device (dispatch.h).
#include "capi/dispatch.h"
#include "capi/error.h"
#include "capi/host_check.h"
#include "capi/mla_validate.h"
#include "capi/nvtx.h"
#include "capi/scalar_check.h"

using namespace kf::capi;

namespace {

constexpr int kCpuDefaultWorkers = 4;  // enough pieces to exercise the split path on the CPU

// The default worker count for a call of `batch` requests (0: any batch).
kf_status default_num_workers(int device_id, int h_q, int s_q, kf_kv_format kv_format, int batch,
                              int* num_workers) {
  if (device_id < -1)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "device_id: expected -1 (CPU) or a CUDA device id >= 0, got %d", device_id);
  KF_CHECK(check_h_q(h_q, "h_q"));
  KF_CHECK(check_s_q(s_q, "s_q"));
  KF_CHECK(check_kv_format(kv_format));
  KF_CHECK(check_out_pointer(num_workers, "num_workers"));
  if (device_id == -1) {
    *num_workers = kCpuDefaultWorkers;
    return KF_SUCCESS;
  }
  return cuda_default_num_workers(device_id, h_q * s_q, kf::KvFormat(int(kv_format)), batch,
                                  num_workers);
}

}  // namespace

extern "C" {

KF_API kf_status kf_mla_default_num_workers_for_format(int device_id, int h_q, int s_q,
                                                       kf_kv_format kv_format, int* num_workers) {
  return guarded(
      [&] { return default_num_workers(device_id, h_q, s_q, kv_format, 0, num_workers); });
}

KF_API kf_status kf_mla_default_num_workers_for_batch(int device_id, int h_q, int s_q,
                                                      kf_kv_format kv_format, int batch,
                                                      int* num_workers) {
  return guarded([&] {
    KF_CHECK(check_batch(batch, "batch"));
    return default_num_workers(device_id, h_q, s_q, kv_format, batch, num_workers);
  });
}

KF_API kf_status kf_mla_metadata_size(int batch, int num_workers, size_t* num_elements) {
  return guarded([&] {
    KF_CHECK(check_batch(batch, "batch"));
    KF_CHECK(check_num_workers(num_workers, "num_workers"));
    KF_CHECK(check_out_pointer(num_elements, "num_elements"));
    *num_elements = size_t(kf::metadata_size(batch, num_workers));
    return KF_SUCCESS;
  });
}

KF_API kf_status kf_mla_workspace_size(int batch, int h_q, int s_q, int num_workers,
                                       size_t* bytes) {
  return guarded([&] {
    KF_CHECK(check_batch(batch, "batch"));
    KF_CHECK(check_h_q(h_q, "h_q"));
    KF_CHECK(check_s_q(s_q, "s_q"));
    KF_CHECK(check_num_workers(num_workers, "num_workers"));
    KF_CHECK(check_out_pointer(bytes, "bytes"));
    *bytes = size_t(kf::workspace_bytes(batch, h_q * s_q, num_workers));
    return KF_SUCCESS;
  });
}

KF_API kf_status kf_mla_metadata_for_format(const DLTensor* cache_seqlens, int h_q, int s_q,
                                            int num_workers, kf_kv_format kv_format,
                                            DLTensor* metadata, void* stream) {
  return guarded([&] {
    const NvtxRange range("kf_mla_metadata");
    Device dev;
    kf::MlaMetadataParams p;
    KF_CHECK(validate_metadata_call(cache_seqlens, h_q, s_q, num_workers, kv_format, metadata,
                                    &dev, &p));
    KF_CHECK(check_backend(dev));
    if (dev.cuda)
      KF_CHECK(cuda_metadata_spread(dev.id, h_q * s_q, kf::KvFormat(int(kv_format)), &p.spread));
    else
      KF_CHECK(check_metadata_seqlens_host(p));
    return run_metadata(dev, p, stream);
  });
}

KF_API kf_status kf_mla_decode(const DLTensor* q, const DLTensor* kv_cache, kf_kv_format kv_format,
                               const DLTensor* block_table, const DLTensor* cache_seqlens,
                               const DLTensor* metadata, float softmax_scale, DLTensor* out,
                               DLTensor* lse, DLTensor* workspace, DLTensor* error_buffer,
                               void* stream) {
  return guarded([&] {
    const NvtxRange range("kf_mla_decode");
    const DecodeArgs a{q,        kv_cache,      kv_format, block_table, cache_seqlens, metadata,
                       softmax_scale, out,      lse,       workspace,   error_buffer};
    Device dev;
    kf::MlaDecodeParams p{};
    KF_CHECK(validate_decode_call(a, &dev, &p));
    KF_CHECK(check_backend(dev));
    if (!dev.cuda) KF_CHECK(check_decode_contents_host(p));
    return run_decode(dev, p, stream);
  });
}

KF_API kf_status kf_cache_append(const DLTensor* kv, DLTensor* kv_cache, kf_kv_format kv_format,
                                 const DLTensor* slot_mapping, DLTensor* error_buffer,
                                 void* stream) {
  return guarded([&] {
    const NvtxRange range("kf_cache_append");
    Device dev;
    kf::CacheAppendParams p;
    KF_CHECK(validate_append_call(kv, kv_cache, kv_format, slot_mapping, error_buffer, &dev, &p));
    KF_CHECK(check_backend(dev));
    if (p.num_tokens == 0) return KF_SUCCESS;  // nothing to launch
    if (!dev.cuda) KF_CHECK(check_append_contents_host(p));
    return run_append(dev, p, stream);
  });
}

KF_API kf_status kf_cache_convert(const DLTensor* src_cache, DLTensor* dst_cache,
                                  kf_kv_format dst_format, void* stream) {
  return guarded([&] {
    const NvtxRange range("kf_cache_convert");
    Device dev;
    kf::CacheConvertParams p;
    KF_CHECK(validate_convert_call(src_cache, dst_cache, dst_format, &dev, &p));
    KF_CHECK(check_backend(dev));
    if (p.num_pages == 0) return KF_SUCCESS;
    return run_convert(dev, p, stream);
  });
}

}  // extern "C"
