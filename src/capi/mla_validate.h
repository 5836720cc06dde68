// Argument validation of the MLA calls: every dtype, shape, stride, alignment and device rule of
// kernelflow.h, ending in a filled params struct. Nothing here reads tensor contents (see
// host_check.h for the CPU-side content checks).
#pragma once

#include "capi/dispatch.h"
#include "core/params.h"
#include "kernelflow/kernelflow.h"

namespace kf::capi {

struct DecodeArgs {
  const DLTensor* q;
  const DLTensor* kv_cache;
  kf_kv_format kv_format;
  const DLTensor* block_table;
  const DLTensor* cache_seqlens;
  const DLTensor* metadata;
  float softmax_scale;
  DLTensor* out;
  DLTensor* lse;
  DLTensor* workspace;
  DLTensor* error_buffer;
};

// Where a cache's tokens lie: kv_cache's geometry after check_cache.
struct CacheGeometry {
  int page_size, page_shift, num_pages;
  int64_t page_stride, token_stride;  // elements (16-bit) or bytes (8-bit)
};

// The rules of kernelflow.h for a kv_cache of format f whose 16-bit rows have dtype `operand`;
// messages name the tensor "kv_cache".
kf_status check_cache(const DLTensor* c, kf_kv_format f, DLDataType operand, CacheGeometry* g);
// An optional error buffer, int32[>= KF_ERROR_BUFFER_LEN]; messages name it "error_buffer".
kf_status check_error_buffer(const DLTensor* e);

kf_status validate_metadata_call(const DLTensor* cache_seqlens, int h_q, int s_q, int num_workers,
                                 kf_kv_format kv_format, DLTensor* metadata, Device* dev,
                                 MlaMetadataParams* p);
kf_status validate_decode_call(const DecodeArgs& a, Device* dev, MlaDecodeParams* p);
kf_status validate_append_call(const DLTensor* kv, DLTensor* kv_cache, kf_kv_format kv_format,
                               const DLTensor* slot_mapping, DLTensor* error_buffer, Device* dev,
                               CacheAppendParams* p);
kf_status validate_convert_call(const DLTensor* src_cache, DLTensor* dst_cache,
                                kf_kv_format dst_format, Device* dev, CacheConvertParams* p);

}  // namespace kf::capi
