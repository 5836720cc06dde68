// MLA decode, bf16 q, 8-bit caches (e4m3 and int8), MlaTraits8M16 (see mla_decode_traits.h).
#include "cuda/decode/sm80/mla_decode_kernel.cuh"
#include "cuda/decode/sm80/mla_decode_sm80.h"

namespace kf::cuda {
template cudaError_t run_mla_decode_sm80<MlaTraits8M16, __nv_bfloat16, kKvFmtE4M3>(const MlaDecodeParams&, cudaStream_t);
template cudaError_t run_mla_decode_sm80<MlaTraits8M16, __nv_bfloat16, kKvFmtInt8>(const MlaDecodeParams&, cudaStream_t);
template int mla_decode_sm80_blocks_per_sm<MlaTraits8M16, __nv_bfloat16, kKvFmtE4M3>(int);
template int mla_decode_sm80_blocks_per_sm<MlaTraits8M16, __nv_bfloat16, kKvFmtInt8>(int);
}  // namespace kf::cuda
