// Thread-block clusters (sm_90+): a launch whose blocks come in groups that the hardware
// schedules together on one GPC, with each other's shared memory addressable (distributed
// shared memory) and a cluster-wide barrier. Host side: whether the device has them, and a
// launch with a 1-D cluster size that is also a programmatic dependent (pdl.cuh).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/device_flag.h"
#include "cuda/common/pdl.cuh"

namespace kf::cuda {

// Portable cluster sizes go up to 8 blocks without the non-portable opt-in.
constexpr int kMaxPortableClusterBlocks = 8;

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
