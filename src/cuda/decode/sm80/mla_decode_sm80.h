// The instantiated configurations of the portable decode kernel (one .cu file each, so a small
// machine builds them in parallel and a change rebuilds one family).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "core/params.h"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

template <class Tr, typename T>
cudaError_t run_mla_decode_sm80(const MlaDecodeParams& p, cudaStream_t stream);
template <class Tr, typename T>
int mla_decode_sm80_blocks_per_sm(int device);

extern template cudaError_t run_mla_decode_sm80<MlaTraitsM16, __nv_bfloat16>(const MlaDecodeParams&, cudaStream_t);
extern template cudaError_t run_mla_decode_sm80<MlaTraitsM32, __nv_bfloat16>(const MlaDecodeParams&, cudaStream_t);
extern template cudaError_t run_mla_decode_sm80<MlaTraitsM64, __nv_bfloat16>(const MlaDecodeParams&, cudaStream_t);
extern template cudaError_t run_mla_decode_sm80<MlaTraitsM16, __half>(const MlaDecodeParams&, cudaStream_t);
extern template cudaError_t run_mla_decode_sm80<MlaTraitsM32, __half>(const MlaDecodeParams&, cudaStream_t);
extern template cudaError_t run_mla_decode_sm80<MlaTraitsM64, __half>(const MlaDecodeParams&, cudaStream_t);

extern template int mla_decode_sm80_blocks_per_sm<MlaTraitsM16, __nv_bfloat16>(int);
extern template int mla_decode_sm80_blocks_per_sm<MlaTraitsM16, __half>(int);
extern template int mla_decode_sm80_blocks_per_sm<MlaTraitsM32, __nv_bfloat16>(int);
extern template int mla_decode_sm80_blocks_per_sm<MlaTraitsM32, __half>(int);
extern template int mla_decode_sm80_blocks_per_sm<MlaTraitsM64, __nv_bfloat16>(int);
extern template int mla_decode_sm80_blocks_per_sm<MlaTraitsM64, __half>(int);

}  // namespace kf::cuda
