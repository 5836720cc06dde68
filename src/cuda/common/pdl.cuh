// Programmatic dependent launch (sm_90+): a kernel launched with the attribute may start while
// the kernel before it in the stream finishes; griddepcontrol.wait then holds it until that
// kernel has completed and its writes are visible, so stream order is kept. The decode kernel is
// launched this way and waits before its first global read, so what overlaps is its launch
// (block dispatch, nothing that reads) with the previous kernel's tail; the decode and combine
// kernels let their dependents launch only as their blocks finish (a dependent launched from
// the primary's first instruction would park waiting blocks on the SMs the primary still
// runs on). The combine is launched plainly: as a dependent of the decode it is slower.
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

// Programmatic dependent launch exists from sm_90 on. KF_DISABLE_PDL=1 in the environment turns
// it off (plain stream order; for A/B timings and for tools that do not follow it).
inline bool device_has_pdl() {
  if (switch_disable_pdl()) return false;
  const int dev = current_device();
  static DeviceFlag has_pdl;  // one attribute query per device, not one per launch
  return has_pdl.get(dev, [dev] {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  });
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
