// Programmatic dependent launch (sm_90+): a kernel launched with the attribute may start while
// the kernel before it in the stream finishes; griddepcontrol.wait then holds it until that
// kernel has completed and its writes are visible, so stream order is kept. The decode kernel is
// launched this way and waits before its first global read, so what overlaps is its launch
// (block dispatch, nothing that reads) with the previous kernel's tail; the decode and combine
// kernels let their dependents launch only as their blocks finish (a dependent launched from
// the primary's first instruction would park waiting blocks on the SMs the primary still
// runs on). The combine is launched as a dependent of the decode where a request has many
// pieces and plainly otherwise (mla_combine.cu's launch says why). The fused layer's GEMMs are
// the exception: their dependents may launch once each block has
// requested its first weights (skinny_gemm.cuh), so the next GEMM's weights stream meanwhile
// (and they read their constant weights before they wait, so kf_linear, whose weight the
// previous kernel may have written, launches them in plain stream order);
// so may the layer's combine (MlaDecodeParams::combine_early_dependents), whose dependent is a
// GEMM.
// A kernel launched without the attribute, or before sm_90, behaves as in plain stream order.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/device_flag.h"
#include "cuda/common/switches.h"

namespace kf::cuda {

// Wait until the grids this one depends on have completed (a no-op without such a dependency).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Allow the next kernel in the stream (launched with the attribute) to start launching.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// Whether the calling thread's current device is compute capability 9.0 or newer (the first
// with programmatic dependent launch and thread-block clusters); one query per device.
inline bool device_is_sm90_or_newer() {
  const int dev = current_device();
  static DeviceFlag sm90;
  return sm90.get(dev, [dev] {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  });
}

// Programmatic dependent launch exists from sm_90 on. KF_DISABLE_PDL=1 in the environment turns
// it off (plain stream order; for A/B timings and for tools that do not follow it).
inline bool device_has_pdl() { return !switch_disable_pdl() && device_is_sm90_or_newer(); }

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the stream's
// previous kernel where `programmatic` (and the device has it), else in plain stream order; with
// cluster_x > 0 in thread-block clusters of cluster_x consecutive blocks along x (sm_90+, grid.x
// a multiple of it: cluster.cuh).
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, int cluster_x, bool programmatic, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(cluster_x);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (programmatic && device_has_pdl()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// As a programmatic dependent of the stream's previous kernel where the device has it.
template <typename... KArgs, typename... Args>
cudaError_t launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, int cluster_x, Args&&... args) {
  return launch_kernel(kernel, grid, block, smem, stream, cluster_x, true,
                       std::forward<Args>(args)...);
}

// The same without clusters.
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  return launch_dependent(kernel, grid, block, smem, stream, 0, std::forward<Args>(args)...);
}

}  // namespace kf::cuda
