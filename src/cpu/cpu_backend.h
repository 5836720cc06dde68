// The CPU reference backend: fp32 math on the same formats and the same split schedule as the
// GPU, so it is the executable spec the kernels are checked against.
#pragma once

#include "core/params.h"

namespace kf::cpu {

void mla_metadata(const MlaMetadataParams& p);
// Decode every piece of the schedule, then merge the pieces of split requests in piece order.
void mla_decode(const MlaDecodeParams& p);
void cache_append(const CacheAppendParams& p);
// Every slot of a 16-bit cache quantized into the 8-bit cache of the same geometry.
void cache_convert(const CacheConvertParams& p);
// y = x W^T: each output the fp32 sum over k in order, rounded to bf16 once.
void linear(const LinearParams& p);

}  // namespace kf::cpu
