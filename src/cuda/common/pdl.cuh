// Programmatic dependent launch (sm_90+): a kernel launched with the attribute may start while
// the kernel before it in the stream finishes; griddepcontrol.wait then holds it until that
// kernel has completed and its writes are visible, so stream order is kept. The decode and
// combine kernels wait before their first global read, and let their dependent launch once
// their own dependency is met: what overlaps is the launch latency between consecutive calls
// (and the combine's launch with the decode's tail), never a read of unfinished data.
// A kernel launched without the attribute, or before sm_90, behaves as in plain stream order.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

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

// Programmatic dependent launch exists from sm_90 on. KF_DISABLE_PDL=1 in the environment turns
// it off (plain stream order; for A/B timings and for tools that do not follow it).
inline bool device_has_pdl() {
  static const bool disabled = [] {
    const char* v = std::getenv("KF_DISABLE_PDL");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  if (disabled) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the stream's
// previous kernel where the device has it.
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = device_has_pdl() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace kf::cuda
