// The tensor maps through which the sm_90a decode kernels copy a paged cache: host code.
#pragma once

#include <cuda.h>

#include "core/params.h"

namespace kf::cuda {

// The cache of p as a 3-D tensor [num_pages][page_size][576] (strides: kv_page_stride and
// kv_token_stride elements), boxes of 64 dims x min(page_size, 64) rows x 1 page with the
// 128-byte swizzle, zeros outside the tensor. False when the driver has no tensor maps or refuses
// this cache's geometry (the caller then runs the portable kernel).
bool encode_kv_tensor_map(const MlaDecodeParams& p, CUtensorMap* map);

// The maps of an 8-bit cache (core/kv_format8.h), one per section of a page, each over
// [pages][page rows][section row], boxes of min(page_size, 64) rows:
struct Kv8TensorMaps {
  CUtensorMap latent;  // uint8 [num_pages][page_size][512], boxes of 128 codes, 128-byte swizzle
  CUtensorMap rope;    // uint8 [num_pages][page_size][128] (64 bf16), 128-byte swizzle
  CUtensorMap scale;   // fp32 [num_pages][page_size], no swizzle
};

// Fill maps for the 8-bit cache of validated params p; false where the driver has no tensor maps
// or refuses the geometry (the caller then runs the portable kernel).
bool encode_kv8_tensor_maps(const MlaDecodeParams& p, Kv8TensorMaps* maps);

}  // namespace kf::cuda
