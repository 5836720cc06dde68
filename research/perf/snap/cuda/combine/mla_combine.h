// Merge the split partials of every request with more than one piece (see mla_combine.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "core/params.h"

namespace kf::cuda {

cudaError_t launch_mla_combine(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace kf::cuda
