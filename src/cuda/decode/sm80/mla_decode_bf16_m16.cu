// MLA decode, bf16 q/cache, MlaTraitsM16 (see mla_decode_traits.h).
#include "cuda/decode/sm80/mla_decode_kernel.cuh"
#include "cuda/decode/sm80/mla_decode_sm80.h"

namespace kf::cuda {
template cudaError_t run_mla_decode_sm80<MlaTraitsM16, __nv_bfloat16, kKvFmt16>(const MlaDecodeParams&, cudaStream_t);
template int mla_decode_sm80_blocks_per_sm<MlaTraitsM16, __nv_bfloat16, kKvFmt16>(int);
}  // namespace kf::cuda
