// The split scheduler on the GPU: one block loads cache_seqlens (clamped to >= 0; negative values
// are reported) into shared memory, one thread runs kf::build_schedule (the same code the CPU
// backend runs, so both write the same metadata bytes) into a shared-memory copy of the
// metadata, and the block copies it out. Graph-safe: no host synchronization.
// Why shared memory: build_schedule's walk is sequential and reads back what it wrote
// (split counts, worker starts); on global memory every step paid a round trip (44-56 us for
// b <= 128 measured on the H200, 2026-11-30). Budget: 4 B per request for the lengths plus the
// metadata itself, within the 48 KiB a block gets without opt-in; larger batches fall back to
// running on global memory (correct, slower).
#include "core/scheduler.h"
#include "cuda/common/device_error.cuh"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

constexpr int kMetaThreads = 256;
constexpr size_t kMetaSmemBytes = 48 * 1024;

__global__ void __launch_bounds__(kMetaThreads)
    mla_metadata_kernel(const __grid_constant__ MlaMetadataParams p, bool in_smem) {
  extern __shared__ int32_t smem[];
  int32_t* seqlens_s = smem;
  int32_t* meta_s = smem + p.batch;
  for (int r = threadIdx.x; r < p.batch; r += blockDim.x) {
    int32_t len = p.cache_seqlens[r];
    if (len < 0) {
      report_device_error(p.error_buffer, kDevErrSeqlenRange, r, len);
      len = 0;
    }
    if (in_smem) seqlens_s[r] = len;
  }
  __syncthreads();
  if (!in_smem) {
    if (threadIdx.x == 0)  // build_schedule treats a negative length as 0 too
      build_schedule(p.cache_seqlens, p.batch, p.h_q, p.s_q, p.num_workers, p.metadata);
    return;
  }
  if (threadIdx.x == 0) build_schedule(seqlens_s, p.batch, p.h_q, p.s_q, p.num_workers, meta_s);
  __syncthreads();
  const int n = int(metadata_size(p.batch, p.num_workers));
  for (int i = threadIdx.x; i < n; i += blockDim.x) p.metadata[i] = meta_s[i];
}

}  // namespace

cudaError_t launch_mla_metadata(const MlaMetadataParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.num_workers < 1 || p.metadata == nullptr) return cudaErrorInvalidValue;
  const size_t need = (size_t(p.batch) + size_t(metadata_size(p.batch, p.num_workers))) * 4;
  const bool in_smem = need <= kMetaSmemBytes;
  mla_metadata_kernel<<<1, kMetaThreads, in_smem ? need : 0, stream>>>(p, in_smem);
  return cudaGetLastError();
}

}  // namespace kf::cuda
