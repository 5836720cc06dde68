// Entry points of the CUDA backend, called by src/capi after validation. Each launches on the
// given stream, allocates nothing and never synchronizes the host (graph-safe).
#pragma once

#include <cuda_runtime_api.h>

#include "core/params.h"
#include "cuda/family.h"

namespace kf::cuda {

// The CUDA architectures this build holds code for (parsed from what CMake passed).
const BuildArchs& build_archs();
// The kernel family `device` runs, which must be the current device (the runtime answers for
// that one): pick_family's choice, made once per device and confirmed by asking the runtime for
// a portable kernel's attributes, so a device without code fails here, before any launch:
// cudaErrorNoKernelImageForDevice when the build has no code for it, the driver's error when
// it cannot compile the PTX, cudaErrorInvalidValue for an unknown KF_KERNEL_FAMILY.
cudaError_t device_family(int device, KernelFamily* family);

// The default worker count on `device` (the current device): SMs x decode blocks resident per
// SM (2 on sm_90, 1 on sm_80/86/89) divided by the query-row tiles a call of num_rows rows of a
// kv_format cache runs in; at least 1: one wave of blocks. `batch` is the call's batch where the
// caller knows it (the sm_90a family runs its 8-bit kernel, one block per SM, for large batches),
// else 0. On failure the error of the query (*num_workers untouched).
cudaError_t mla_default_num_workers(int device, int num_rows, KvFormat kv_format, int batch,
                                    int* num_workers);

// Whether metadata for a decode of num_rows rows over a kv_format cache on `device` may put half
// the workers on the even ones at small batch (MlaMetadataParams::spread): the decode family's
// choice for the kernel that will run the call.
cudaError_t mla_metadata_spread(int device, int num_rows, KvFormat kv_format, bool* spread);

cudaError_t launch_mla_metadata(const MlaMetadataParams& p, cudaStream_t stream);
// Decode (the pieces) then combine (split requests), on one stream.
cudaError_t launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream);
cudaError_t launch_cache_append(const CacheAppendParams& p, cudaStream_t stream);
// Every slot of a 16-bit cache quantized into an 8-bit cache (the append's bytes).
cudaError_t launch_cache_convert(const CacheConvertParams& p, cudaStream_t stream);
// y = x W^T by the fused layer's skinny GEMM (src/cuda/layer/skinny_gemm.cu).
cudaError_t launch_linear(const LinearParams& p, cudaStream_t stream);

}  // namespace kf::cuda
