// One 576-value cache row [latent 512 | rope 64] stored into token `offset` of an 8-bit page
// (core/kv_format8.h byte map) by one warp, quantize-on-write: the bytes kf_cache_append writes.
// Shared by the append and conversion kernels (cache_append.cu) and the fused layer's prologue
// (cuda/layer/), so every writer of an 8-bit cache produces the same bytes for the same row.
//   Lane l holds latent values 16 l .. 16 l + 15 in fp32 and takes their amax with core/quant.h's
//   latent_amax_step (a NaN counts as +Inf); the warp reduces the lanes' maxima with fmaxf (exact,
//   order-free: the CPU loop's value); each lane quantizes its 16 values with core/quant.h (the
//   CPU's code: zero codes and a NaN scale for a non-finite latent, docs/spec.md section 6) and
//   stores them as one 16-byte write; lanes 0..7 store the
//   rope (8 bf16 values each, one 16-byte write), lane 0 the scale.
#pragma once

#include <cstdint>

#include "core/kv_format8.h"
#include "core/mla_shape.h"
#include "core/quant.h"

namespace kf::cuda {

// page_base: the page's first byte (16-byte aligned); rope: lane l < 8's rope values 8 l ..
// 8 l + 7 as bf16 (ignored on lanes 8..31). Every lane of the warp must call it.
__device__ __forceinline__ void store_row8_warp(const float (&x)[16], uint4 rope, bool e4m3,
                                                int page_size, uint8_t* __restrict__ page_base,
                                                int offset, int lane) {
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < 16; ++k) amax = latent_amax_step(amax, x[k]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  uint32_t q[4] = {0u, 0u, 0u, 0u};
  const float scale = latent_scale(amax, e4m3);
  if (latent_has_codes(amax)) {  // as quantize_latent: zero codes otherwise
    const float inv = (e4m3 ? kQmaxE4M3 : kQmaxInt8) / amax;
#pragma unroll
    for (int k = 0; k < 16; ++k)
      q[k / 4] |= uint32_t(quantize_code(x[k] * inv, e4m3)) << (8 * (k % 4));
  }
  *reinterpret_cast<uint4*>(page_base + kv8_latent_offset(page_size, offset) + 16 * lane) =
      make_uint4(q[0], q[1], q[2], q[3]);
  if (lane < 8)
    *reinterpret_cast<uint4*>(page_base + kv8_rope_offset(page_size, offset) + 16 * lane) = rope;
  if (lane == 0) *reinterpret_cast<float*>(page_base + kv8_scale_offset(page_size, offset)) = scale;
}

}  // namespace kf::cuda
