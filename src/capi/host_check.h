// Content checks for CPU tensors, which the host can read before running: a bad value is an
// INVALID_ARGUMENT naming the argument, the index and the value. (On a CUDA device the kernels
// mask such values and report them in the error buffer instead.)
#pragma once

#include "core/params.h"
#include "kernelflow/kernelflow.h"

namespace kf::capi {

kf_status check_metadata_seqlens_host(const MlaMetadataParams& p);  // cache_seqlens >= 0
// cache_seqlens in range, block_table entries in use inside the cache, metadata made by
// kf_mla_metadata_for_format for this batch, h_q, s_q, worker count and these lengths.
kf_status check_decode_contents_host(const MlaDecodeParams& p);
kf_status check_append_contents_host(const CacheAppendParams& p);  // slots inside the cache

}  // namespace kf::capi
