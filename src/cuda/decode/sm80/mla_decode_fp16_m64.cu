// MLA decode, fp16 q/cache, MlaTraitsM64 (see mla_decode_traits.h).
#include "cuda/decode/sm80/mla_decode_kernel.cuh"
#include "cuda/decode/sm80/mla_decode_sm80.h"

namespace kf::cuda {
KF_DECODE_INSTANTIATE(MlaTraitsM64, __half, kKvFmt16)
}  // namespace kf::cuda
