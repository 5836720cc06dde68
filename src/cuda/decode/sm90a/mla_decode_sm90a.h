// The instantiated sm_90a decode kernels, one per .cu file so a small machine builds them in
// parallel: 16-bit caches (bf16 and fp16; pages of 64 rows or more, and smaller pages), defined in
// mla_decode_sm90a.cuh, and 8-bit caches with bf16 q (e4m3, int8), in mla_decode_sm90a_kv8.cuh.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "core/params.h"
#include "cuda/decode/sm80/mla_decode_traits.h"  // KvFmt
#include "cuda/decode/sm90a/kv_tensor_map_sm90a.h"

namespace kf::cuda {

// Launch the decode of validated params (q dtype T, a cache in q's dtype) on `stream`, the cache
// read through kv_map (kv_tensor_map_sm90a.h). kSmallPages: the cache's pages have fewer than 64
// rows (the caller picks the instantiation from p.page_size).
template <typename T, bool kSmallPages>
cudaError_t run_mla_decode_sm90a(const MlaDecodeParams& p, const CUtensorMap& kv_map,
                                 cudaStream_t stream);

#define KF_DECODE_SM90A_EXTERN(T, kSmallPages)                                                \
  extern template cudaError_t run_mla_decode_sm90a<T, kSmallPages>(const MlaDecodeParams&, \
                                                                   const CUtensorMap&,     \
                                                                   cudaStream_t);
KF_DECODE_SM90A_EXTERN(__nv_bfloat16, false)
KF_DECODE_SM90A_EXTERN(__nv_bfloat16, true)
KF_DECODE_SM90A_EXTERN(__half, false)
KF_DECODE_SM90A_EXTERN(__half, true)
#undef KF_DECODE_SM90A_EXTERN

// Launch the decode of validated params (bf16 q, an 8-bit cache of format kFmt: kKvFmtE4M3 or
// kKvFmtInt8) on `stream`, the cache read through maps.
template <int kFmt>
cudaError_t run_mla_decode_sm90a_kv8(const MlaDecodeParams& p, const Kv8TensorMaps& maps,
                                     cudaStream_t stream);
extern template cudaError_t run_mla_decode_sm90a_kv8<kKvFmtE4M3>(const MlaDecodeParams&,
                                                                 const Kv8TensorMaps&, cudaStream_t);
extern template cudaError_t run_mla_decode_sm90a_kv8<kKvFmtInt8>(const MlaDecodeParams&,
                                                                 const Kv8TensorMaps&, cudaStream_t);

}  // namespace kf::cuda
