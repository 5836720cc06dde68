// The decode and combine kernels trust the metadata only when its header names the same batch,
// h_q, s_q and worker count as the call; otherwise they write empty rows and report.
#pragma once

#include "core/params.h"
#include "core/scheduler.h"

namespace kf::cuda {

__device__ __forceinline__ bool metadata_matches(const MlaDecodeParams& p) {
  const int32_t* m = p.metadata;
  return m[kMetaMagicIdx] == kMetaMagic && m[kMetaVersionIdx] == kMetaVersion &&
         m[kMetaBatchIdx] == p.batch && m[kMetaHqIdx] == p.h_q && m[kMetaSqIdx] == p.s_q &&
         m[kMetaWorkersIdx] == p.num_workers;
}

}  // namespace kf::cuda
