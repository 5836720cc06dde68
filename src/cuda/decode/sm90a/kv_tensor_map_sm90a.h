// The tensor map through which the sm_90a decode kernel copies a 16-bit paged cache: host code.
#pragma once

#include <cuda.h>

#include "core/params.h"

namespace kf::cuda {

// The cache of p as a 3-D tensor [num_pages][page_size][576] (strides: kv_page_stride and
// kv_token_stride elements), boxes of 64 dims x min(page_size, 64) rows x 1 page with the
// 128-byte swizzle, zeros outside the tensor. False when the driver has no tensor maps or refuses
// this cache's geometry (the caller then runs the portable kernel).
bool encode_kv_tensor_map(const MlaDecodeParams& p, CUtensorMap* map);

}  // namespace kf::cuda
