#include "capi/dispatch.h"

#include "capi/error.h"
#include "capi/tensor_check.h"
#include "cpu/cpu_backend.h"
#include "cpu/layer.h"

#if KF_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/common/switches.h"
#include "cuda/launch.h"
#include "cuda/layer/layer_graph.h"
#endif

namespace kf::capi {

kf_status resolve_device(const DLTensor* t, const char* name, Device* dev) {
  if (t->device.device_type == kDLCPU) {
    *dev = Device{false, 0};
    return KF_SUCCESS;
  }
  if (t->device.device_type == kDLCUDA) {
    if (t->device.device_id < 0)
      return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a CUDA device id >= 0, got %d", name,
                  t->device.device_id);
    *dev = Device{true, t->device.device_id};
    return KF_SUCCESS;
  }
  return fail(KF_ERROR_UNSUPPORTED, "%s: expected a cpu or cuda tensor, got device %s", name,
              device_string(t->device).c_str());
}

#if KF_WITH_CUDA

namespace {

// The runtime's answers for a device this build has no usable code for: no image for its
// architecture, or PTX the driver cannot compile.
bool is_image_error(cudaError_t e) {
  return e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
         e == cudaErrorUnsupportedPtxVersion || e == cudaErrorInvalidPtx ||
         e == cudaErrorJitCompilerNotFound || e == cudaErrorJitCompilationDisabled;
}

kf_status image_fail(cudaError_t e, const char* what, int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return fail(KF_ERROR_UNSUPPORTED, "%s: cuda:%d: no usable kernel image in this build (%s)",
                what, device, cudaGetErrorName(e));
  }
  const std::string why =
      kf::cuda::image_error_message(major, minor, kf::cuda::build_archs(), cudaGetErrorName(e));
  return fail(KF_ERROR_UNSUPPORTED, "%s: cuda:%d: %s", what, device, why.c_str());
}

kf_status cuda_fail(cudaError_t e, const char* what, int device) {
  cudaGetLastError();  // a sticky launch error would otherwise fail the next call too
  if (is_image_error(e)) return image_fail(e, what, device);
  // A launcher without a kernel for this configuration says so with cudaErrorNotSupported.
  return fail(e == cudaErrorNotSupported ? KF_ERROR_UNSUPPORTED : KF_ERROR_CUDA,
              "%s: CUDA error %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

// Makes the tensors' device current for a launch and restores the caller's afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (prev_ >= 0 && status_ == cudaSuccess) cudaSetDevice(prev_);
  }
  cudaError_t status() const { return status_; }

 private:
  int prev_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// The device's kernel family runs (src/cuda/family.h): checked with the device current, before
// the first launch of every CUDA call; the answer is kept per device.
kf_status check_family(const Device& dev, const char* what) {
  const std::string& request = kf::cuda::switch_kernel_family();
  if (!kf::cuda::parse_family_request(request))
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "KF_KERNEL_FAMILY=%s in the environment: expected sm80 (the portable kernels on "
                "every device), sm90a (the Hopper kernels on sm_90), or auto, or unset",
                request.c_str());
  kf::cuda::KernelFamily family;
  const cudaError_t e = kf::cuda::device_family(dev.id, &family);
  if (e != cudaSuccess) return cuda_fail(e, what, dev.id);
  return KF_SUCCESS;
}

// Runs `cuda_call` (returning a cudaError_t) with the tensors' device current, once its kernel
// family is known to run there.
template <typename CudaCall>
kf_status on_device(const Device& dev, const char* what, CudaCall&& cuda_call) {
  DeviceGuard guard(dev.id);
  if (guard.status() != cudaSuccess) return cuda_fail(guard.status(), what, dev.id);
  KF_CHECK(check_family(dev, what));
  const cudaError_t e = cuda_call();
  return e == cudaSuccess ? KF_SUCCESS : cuda_fail(e, what, dev.id);
}

}  // namespace

kf_status check_backend(const Device& dev) {
  if (!dev.cuda) return KF_SUCCESS;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(KF_ERROR_CUDA, "cuda:%d: no usable CUDA device: %s", dev.id, cudaGetErrorString(e));
  }
  if (dev.id >= count)
    return fail(KF_ERROR_INVALID_ARGUMENT, "cuda:%d: expected a device id below %d (visible devices)",
                dev.id, count);
  int major = 0, minor = 0;
  cudaError_t a = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev.id);
  if (a == cudaSuccess) a = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev.id);
  if (a != cudaSuccess) return cuda_fail(a, "compute capability query", dev.id);
  if (major < 8)
    return fail(KF_ERROR_UNSUPPORTED, "cuda:%d is sm_%d%d: the kernels need sm_80 or newer", dev.id,
                major, minor);
  return KF_SUCCESS;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

kf_status cuda_default_num_workers(int device_id, int num_rows, kf::KvFormat kv_format, int batch,
                                   int* num_workers) {
  const Device dev{true, device_id};
  KF_CHECK(check_backend(dev));
  // The backend knows how many decode blocks fit on an SM and how many row tiles it uses.
  return on_device(dev, "default worker count", [&] {
    return kf::cuda::mla_default_num_workers(device_id, num_rows, kv_format, batch, num_workers);
  });
}

kf_status cuda_metadata_spread(int device_id, int num_rows, kf::KvFormat kv_format,
                               bool* spread) {
  const Device dev{true, device_id};
  KF_CHECK(check_backend(dev));
  return on_device(dev, "metadata placement", [&] {
    return kf::cuda::mla_metadata_spread(device_id, num_rows, kv_format, spread);
  });
}

std::string cuda_runtime_description() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return "cuda runtime unknown";
  }
  return "cuda runtime " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

#else  // CPU-only build

kf_status check_backend(const Device& dev) {
  if (!dev.cuda) return KF_SUCCESS;
  return fail(KF_ERROR_UNSUPPORTED, "cuda:%d: tensors on a CUDA device, but kernelflow was built without CUDA",
              dev.id);
}

int cuda_device_count() { return 0; }

kf_status cuda_default_num_workers(int device_id, int, kf::KvFormat, int, int*) {
  return check_backend(Device{true, device_id});
}

kf_status cuda_metadata_spread(int device_id, int, kf::KvFormat, bool*) {
  return check_backend(Device{true, device_id});
}

std::string cuda_runtime_description() { return "no CUDA runtime"; }

#endif

namespace {

// One operation on the tensors' device: the CPU backend, or the CUDA launcher `cuda_launch`
// (made by KF_CUDA_LAUNCHER; in a build without CUDA, a CUDA device fails check_backend).
template <typename P, typename CudaLaunch>
kf_status run_op(const Device& dev, const char* what, void (*cpu_fn)(const P&), const P& p,
                 [[maybe_unused]] CudaLaunch&& cuda_launch) {
  if (!dev.cuda) {
    cpu_fn(p);
    return KF_SUCCESS;
  }
#if KF_WITH_CUDA
  return on_device(dev, what, cuda_launch);
#else
  (void)what;
  return check_backend(dev);
#endif
}

}  // namespace

#if KF_WITH_CUDA
#define KF_CUDA_LAUNCHER(fn) [&] { return kf::cuda::fn(p, static_cast<cudaStream_t>(stream)); }
#else
#define KF_CUDA_LAUNCHER(fn) [] { return 0; }
#endif

kf_status run_metadata(const Device& dev, const MlaMetadataParams& p,
                       [[maybe_unused]] void* stream) {
  return run_op(dev, "mla_metadata", cpu::mla_metadata, p, KF_CUDA_LAUNCHER(launch_mla_metadata));
}
kf_status run_decode(const Device& dev, const MlaDecodeParams& p,
                     [[maybe_unused]] void* stream) {
  return run_op(dev, "mla_decode", cpu::mla_decode, p, KF_CUDA_LAUNCHER(launch_mla_decode));
}
kf_status run_append(const Device& dev, const CacheAppendParams& p,
                     [[maybe_unused]] void* stream) {
  return run_op(dev, "cache_append", cpu::cache_append, p, KF_CUDA_LAUNCHER(launch_cache_append));
}
kf_status run_convert(const Device& dev, const CacheConvertParams& p,
                      [[maybe_unused]] void* stream) {
  return run_op(dev, "cache_convert", cpu::cache_convert, p,
                KF_CUDA_LAUNCHER(launch_cache_convert));
}
kf_status run_linear(const Device& dev, const LinearParams& p, [[maybe_unused]] void* stream) {
  return run_op(dev, "linear", cpu::linear, p, KF_CUDA_LAUNCHER(launch_linear));
}
#undef KF_CUDA_LAUNCHER

kf_status run_layer_graph_create(const Device& dev, const LayerGraphParams& p, kf_layer_graph* g) {
  if (!dev.cuda) {
    g->cpu = new cpu::LayerGraph(p);
    return KF_SUCCESS;
  }
#if KF_WITH_CUDA
  return on_device(dev, "layer_graph_create",
                   [&] { return kf::cuda::layer_graph_create(p, &g->cuda); });
#else
  return check_backend(dev);
#endif
}

kf_status run_layer_graph_launch(kf_layer_graph* g, [[maybe_unused]] void* stream) {
  if (!g->dev.cuda) {
    g->cpu->launch();
    return KF_SUCCESS;
  }
#if KF_WITH_CUDA
  return on_device(g->dev, "layer_graph_launch", [&] {
    return kf::cuda::layer_graph_launch(g->cuda, static_cast<cudaStream_t>(stream));
  });
#else
  return check_backend(g->dev);
#endif
}

int layer_graph_kernel_nodes(const kf_layer_graph* g) {
#if KF_WITH_CUDA
  if (g->cuda) return kf::cuda::layer_graph_kernel_nodes(g->cuda);
#endif
  (void)g;
  return 0;
}

void run_layer_graph_destroy(kf_layer_graph* g) {
  delete g->cpu;
  g->cpu = nullptr;
#if KF_WITH_CUDA
  if (g->cuda) {
    DeviceGuard guard(g->dev.id);  // the graph's memory belongs to its device
    kf::cuda::layer_graph_destroy(g->cuda);
    g->cuda = nullptr;
  }
#endif
}

}  // namespace kf::capi
