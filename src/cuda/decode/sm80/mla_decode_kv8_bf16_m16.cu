// MLA decode, bf16 q, 8-bit caches (e4m3 and int8), MlaTraits8M16 (see mla_decode_traits.h).
#include "cuda/decode/sm80/mla_decode_kernel.cuh"
#include "cuda/decode/sm80/mla_decode_sm80.h"

namespace kf::cuda {
KF_DECODE_INSTANTIATE(MlaTraits8M16, __nv_bfloat16, kKvFmtE4M3)
KF_DECODE_INSTANTIATE(MlaTraits8M16, __nv_bfloat16, kKvFmtInt8)
}  // namespace kf::cuda
