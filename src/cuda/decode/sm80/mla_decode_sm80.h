// The instantiated configurations of the portable family's decode kernel (a few per .cu file, so
// a small machine builds them in parallel and a change to one rebuilds only its file).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "core/params.h"
#include "cuda/decode/sm80/kv8_dequant.cuh"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

// kFmt: kKvFmt16 (the cache in q's dtype), kKvFmtE4M3 or kKvFmtInt8 (8-bit traits).
template <class Tr, typename T, int kFmt = kKvFmt16>
cudaError_t run_mla_decode_sm80(const MlaDecodeParams& p, cudaStream_t stream);
template <class Tr, typename T, int kFmt = kKvFmt16>
int mla_decode_sm80_blocks_per_sm(int device);

#define KF_DECODE_EXTERN(Tr, T, F)                                                            \
  extern template cudaError_t run_mla_decode_sm80<Tr, T, F>(const MlaDecodeParams&, cudaStream_t); \
  extern template int mla_decode_sm80_blocks_per_sm<Tr, T, F>(int);
#define KF_DECODE_EXTERN_DTYPES(Tr, F)   \
  KF_DECODE_EXTERN(Tr, __nv_bfloat16, F) \
  KF_DECODE_EXTERN(Tr, __half, F)
KF_DECODE_EXTERN_DTYPES(MlaTraitsM16, kKvFmt16)
KF_DECODE_EXTERN_DTYPES(MlaTraitsM32, kKvFmt16)
KF_DECODE_EXTERN_DTYPES(MlaTraitsM64, kKvFmt16)
KF_DECODE_EXTERN_DTYPES(MlaTraits8M16, kKvFmtE4M3)
KF_DECODE_EXTERN_DTYPES(MlaTraits8M16, kKvFmtInt8)
#undef KF_DECODE_EXTERN_DTYPES
#undef KF_DECODE_EXTERN

}  // namespace kf::cuda
