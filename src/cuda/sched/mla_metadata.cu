// The split scheduler on the GPU: one block loads cache_seqlens (clamped to >= 0; negative values
// are reported) into shared memory, then one thread runs kf::build_schedule, the same code the CPU
// backend runs, so both write the same metadata bytes. Graph-safe: no host synchronization.
// Shared memory: 4 B per request up to 12288 requests (48 KiB, no opt-in); larger batches read
// cache_seqlens from global memory (build_schedule treats a negative length as 0 anyway).
#include "core/scheduler.h"
#include "cuda/common/device_error.cuh"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

constexpr int kMetaThreads = 256;
constexpr int kMetaSmemRequests = 48 * 1024 / 4;

__global__ void __launch_bounds__(kMetaThreads)
    mla_metadata_kernel(const __grid_constant__ MlaMetadataParams p, bool in_smem) {
  extern __shared__ int32_t seqlens_s[];
  for (int r = threadIdx.x; r < p.batch; r += blockDim.x) {
    int32_t len = p.cache_seqlens[r];
    if (len < 0) {
      report_device_error(p.error_buffer, kDevErrSeqlenRange, r, len);
      len = 0;
    }
    if (in_smem) seqlens_s[r] = len;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    build_schedule(in_smem ? seqlens_s : p.cache_seqlens, p.batch, p.h_q, p.s_q, p.num_workers,
                   p.metadata);
}

}  // namespace

cudaError_t launch_mla_metadata(const MlaMetadataParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.num_workers < 1 || p.metadata == nullptr) return cudaErrorInvalidValue;
  const bool in_smem = p.batch <= kMetaSmemRequests;
  const size_t smem = in_smem ? size_t(p.batch) * sizeof(int32_t) : 0;
  mla_metadata_kernel<<<1, kMetaThreads, smem, stream>>>(p, in_smem);
  return cudaGetLastError();
}

}  // namespace kf::cuda
