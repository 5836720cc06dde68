// The instantiated sm_90a decode kernels (16-bit caches: bf16 and fp16), one per .cu file so a
// small machine builds them in parallel. Defined in mla_decode_sm90a.cuh.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "core/params.h"

namespace kf::cuda {

// Launch the decode of validated params (q dtype T, a cache in q's dtype) on `stream`, the cache
// read through kv_map (kv_tensor_map_sm90a.h).
template <typename T>
cudaError_t run_mla_decode_sm90a(const MlaDecodeParams& p, const CUtensorMap& kv_map,
                                 cudaStream_t stream);

extern template cudaError_t run_mla_decode_sm90a<__nv_bfloat16>(const MlaDecodeParams&,
                                                                const CUtensorMap&, cudaStream_t);
extern template cudaError_t run_mla_decode_sm90a<__half>(const MlaDecodeParams&,
                                                         const CUtensorMap&, cudaStream_t);

}  // namespace kf::cuda
