// Entry points of the CUDA backend, called by src/capi after validation. Each launches on the
// given stream, allocates nothing and never synchronizes the host (graph-safe).
#pragma once

#include <cuda_runtime_api.h>

#include "core/params.h"

namespace kf::cuda {

// Query-row tiles (thread blocks along the row axis) the decode kernel uses on `device` for
// num_rows rows of a cache in kv_format. 16-bit: one tile up to 32 rows; more rows in 32-row
// tiles where two of those blocks fit an SM (sm_90), else in 64-row tiles. 8-bit: 16 per tile.
int mla_row_tiles(int device, int num_rows, KvFormat kv_format = KvFormat::kBF16);
// The default worker count on `device`: SMs x decode blocks resident per SM (2 on sm_90, 1 on
// sm_80/86/89), divided by mla_row_tiles; at least 1: one wave of blocks. The error of the SM
// count query if it fails (*num_workers untouched).
cudaError_t mla_default_num_workers(int device, int num_rows, KvFormat kv_format,
                                    int* num_workers);

cudaError_t launch_mla_metadata(const MlaMetadataParams& p, cudaStream_t stream);
// Decode (the pieces) then combine (split requests), on one stream.
cudaError_t launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream);
cudaError_t launch_cache_append(const CacheAppendParams& p, cudaStream_t stream);
// Every slot of a 16-bit cache quantized into an 8-bit cache (the append's bytes).
cudaError_t launch_cache_convert(const CacheConvertParams& p, cudaStream_t stream);

}  // namespace kf::cuda
