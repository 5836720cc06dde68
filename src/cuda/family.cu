// The device side of the family rule (src/cuda/family.h): this build's architectures, and the
// family each device runs, confirmed by the runtime before any launch.
#include <atomic>

#include "cuda/common/switches.h"
#include "cuda/launch.h"

#ifndef KF_CUDA_ARCHS_STRING
#error "CMakeLists.txt defines KF_CUDA_ARCHS_STRING for every source of the library"
#endif

namespace kf::cuda {
namespace {

// An empty kernel compiled with the flags of every kernel outside an sm90a/ folder: asking for
// its attributes fails with cudaErrorNoKernelImageForDevice on a device the build has no code
// for, and with the driver's error where the PTX does not compile for the device.
__global__ void portable_family_probe() {}

constexpr int kMaxDevices = 64;
constexpr int kRequests = 3;  // FamilyRequest values
// Per device and request: 0 not asked yet, else 1 + the family.
std::atomic<signed char> g_known[kMaxDevices][kRequests] = {};

cudaError_t find_family(int device, FamilyRequest request, KernelFamily* family) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  const std::optional<KernelFamily> f = pick_family(major, minor, build_archs(), request);
  if (!f) return cudaErrorNoKernelImageForDevice;
  // Every entry point also runs portable kernels (metadata, combine, cache writes), and sm_90a
  // SASS always runs on the 9.0 device pick_family gives it to: the portable probe answers.
  cudaFuncAttributes attr;
  err = cudaFuncGetAttributes(&attr, portable_family_probe);
  if (err != cudaSuccess) return err;
  *family = *f;
  return cudaSuccess;
}

}  // namespace

const BuildArchs& build_archs() {
  static const BuildArchs archs = parse_build_archs(KF_CUDA_ARCHS_STRING);
  return archs;
}

cudaError_t device_family(int device, KernelFamily* family) {
  const std::optional<FamilyRequest> request = parse_family_request(switch_kernel_family());
  if (!request) return cudaErrorInvalidValue;
  const int ri = static_cast<int>(*request);
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const signed char k = g_known[device][ri].load(std::memory_order_relaxed);
    if (k != 0) {
      *family = KernelFamily(k - 1);
      return cudaSuccess;
    }
  }
  const cudaError_t err = find_family(device, *request, family);
  if (err == cudaSuccess && cached)
    g_known[device][ri].store(static_cast<signed char>(1 + int(*family)), std::memory_order_relaxed);
  return err;
}

}  // namespace kf::cuda
