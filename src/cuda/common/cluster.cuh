// Thread-block clusters (sm_90+): a launch whose blocks come in groups that the hardware
// schedules together on one GPC, with each other's shared memory addressable (distributed
// shared memory) and a cluster-wide barrier. Host side: whether the device has them (a launch
// in clusters is pdl.cuh's launch_dependent with a cluster size). Device side
// (sm_90 code only): the barrier's two halves and a 16-byte load from another block's shared
// memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

inline bool device_has_clusters() { return device_is_sm90_or_newer(); }

}  // namespace kf::cuda
