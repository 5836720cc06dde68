// The decode and combine kernels trust the metadata only when its header names the same batch,
// h_q, s_q and worker count as the call; otherwise they write empty rows and report.
#pragma once

#include "core/params.h"
#include "core/scheduler.h"

namespace kf::cuda {

// All six words are loaded before any is compared (& rather than &&): with &&, each load would
// wait for the comparison before it, six dependent load-compare-exit steps, one L2 round trip
// each, at the start of every decode and combine block.
__device__ __forceinline__ bool metadata_matches(const MlaDecodeParams& p) {
  const int32_t* m = p.metadata;
  const int32_t magic = m[kMetaMagicIdx], version = m[kMetaVersionIdx], batch = m[kMetaBatchIdx];
  const int32_t h_q = m[kMetaHqIdx], s_q = m[kMetaSqIdx], workers = m[kMetaWorkersIdx];
  return (magic == kMetaMagic) & (version == kMetaVersion) & (batch == p.batch) &
         (h_q == p.h_q) & (s_q == p.s_q) & (workers == p.num_workers);
}

}  // namespace kf::cuda
