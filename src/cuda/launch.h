// Entry points of the CUDA backend, called by src/capi after validation. Each launches on the
// given stream, allocates nothing and never synchronizes the host (graph-safe).
#pragma once

#include <cuda_runtime_api.h>

#include "core/params.h"

namespace kf::cuda {

// Query-row tiles (thread blocks along the row axis) the decode kernel uses for num_rows rows;
// the default worker count is the SM count divided by this.
int mla_row_tiles(int num_rows);

cudaError_t launch_mla_metadata(const MlaMetadataParams& p, cudaStream_t stream);
// Decode (the pieces) then combine (split requests), on one stream.
cudaError_t launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream);
cudaError_t launch_cache_append(const CacheAppendParams& p, cudaStream_t stream);

}  // namespace kf::cuda
