// Thread-block clusters (sm_90+): a launch whose blocks come in groups that the hardware
// schedules together on one GPC, with each other's shared memory addressable (distributed
// shared memory) and a cluster-wide barrier. Host side: whether the device has them, and a
// launch with a 1-D cluster size that is also a programmatic dependent (pdl.cuh). Device side
// (sm_90 code only): the barrier's two halves and a 16-byte load from another block's shared
// memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda/common/device_flag.h"
#include "cuda/common/pdl.cuh"

namespace kf::cuda {

// Portable cluster sizes go up to 8 blocks without the non-portable opt-in.
constexpr int kMaxPortableClusterBlocks = 8;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Arrive at the cluster barrier making this thread's earlier writes (shared memory included)
// visible to the blocks that wait on it; ptxas puts a GPU-scope fence before it, which waits
// for the thread's outstanding global stores too.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
// Arrive without ordering memory: for a barrier that only keeps blocks alive (a block must not
// exit while another still reads its shared memory), after whose loads have returned.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The 16 bytes at `local` (this block's shared memory) in the block of cluster rank `rank`.
__device__ __forceinline__ float4 ld_cluster_f32x4(const void* local, int rank) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(local));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(a), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
#endif

inline bool device_has_clusters() {
  const int dev = current_device();
  static DeviceFlag has_clusters;
  return has_clusters.get(dev, [dev] {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  });
}

// kernel<<<grid, block, smem, stream>>>(args...) in clusters of cluster_x consecutive blocks
// along x (grid.x a multiple of it), a programmatic dependent of the stream's previous kernel
// where launch_pdl would make it one.
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, int cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster_x);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = device_has_pdl() ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace kf::cuda
