#include "jax_ffi_tensor.h"

#include <cstring>
#include <string>

#if KF_JAX_FFI_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kf::jax_ffi {

namespace {

// The DLPack dtype of the XLA element types the C API takes; false for any other.
bool dl_dtype(ffi::DataType type, DLDataType* out) {
  switch (type) {
    case ffi::DataType::BF16: *out = DLDataType{kDLBfloat, 16, 1}; return true;
    case ffi::DataType::F16: *out = DLDataType{kDLFloat, 16, 1}; return true;
    case ffi::DataType::F32: *out = DLDataType{kDLFloat, 32, 1}; return true;
    case ffi::DataType::S32: *out = DLDataType{kDLInt, 32, 1}; return true;
    case ffi::DataType::S64: *out = DLDataType{kDLInt, 64, 1}; return true;
    case ffi::DataType::U8: *out = DLDataType{kDLUInt, 8, 1}; return true;
    default: return false;
  }
}

ffi::Error invalid(const char* name, const std::string& what) {
  return ffi::Error::InvalidArgument(std::string(name) + ": " + what);
}

}  // namespace

bool valid_format(int32_t kv_format) { return kv_format >= 0 && kv_format <= 3; }

ffi::Error View::wrap(const ffi::AnyBuffer& buffer, Place place, const char* name) {
  const auto dims = buffer.dimensions();
  if (dims.size() > size_t(kMaxRank))
    return invalid(name, "expected at most " + std::to_string(kMaxRank) + " dimensions, got " +
                             std::to_string(dims.size()));
  if (!dl_dtype(buffer.element_type(), &dl.dtype))
    return invalid(name, "element type " + std::to_string(int(buffer.element_type())) +
                             " is none of bfloat16, float16, float32, int32, int64, uint8");
  for (size_t i = 0; i < dims.size(); ++i) shape_[i] = dims[i];
  dl.data = buffer.untyped_data();
  dl.device = place.device;
  dl.ndim = int(dims.size());
  dl.shape = shape_;
  dl.strides = nullptr;
  dl.byte_offset = 0;
  return ffi::Error::Success();
}

ffi::Error View::wrap_aligned_bytes(const ffi::AnyBuffer& buffer, Place place, const char* name) {
  if (auto e = wrap(buffer, place, name); e.failure()) return e;
  if (dl.ndim != 1 || buffer.element_type() != ffi::DataType::U8 ||
      shape_[0] < int64_t(kWorkspaceAlign))
    return invalid(name, "expected uint8 [n] with n >= 256 (the workspace plus alignment slack)");
  const auto address = reinterpret_cast<uintptr_t>(dl.data);
  const uintptr_t pad = (kWorkspaceAlign - address % kWorkspaceAlign) % kWorkspaceAlign;
  dl.data = reinterpret_cast<void*>(address + pad);
  shape_[0] -= int64_t(pad);
  return ffi::Error::Success();
}

ffi::Error View::wrap_int64_pairs(const ffi::AnyBuffer& buffer, Place place, const char* name) {
  if (auto e = wrap(buffer, place, name); e.failure()) return e;
  if (dl.ndim != 2 || buffer.element_type() != ffi::DataType::S32 || shape_[1] != 2)
    return invalid(name, "expected int32 [n, 2] (int64 values as word pairs)");
  dl.ndim = 1;
  dl.dtype = DLDataType{kDLInt, 64, 1};
  return ffi::Error::Success();
}

bool copy_bytes(void* dst, const void* src, size_t bytes, Place place) {
  if (place.stream == nullptr) {
    std::memcpy(dst, src, bytes);
    return true;
  }
#if KF_JAX_FFI_CUDA
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                         static_cast<cudaStream_t>(place.stream)) == cudaSuccess;
#else
  return false;
#endif
}

bool zero_bytes(void* dst, size_t bytes, Place place) {
  if (place.stream == nullptr) {
    std::memset(dst, 0, bytes);
    return true;
  }
#if KF_JAX_FFI_CUDA
  return cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(place.stream)) == cudaSuccess;
#else
  return false;
#endif
}

bool stream_capturing(Place place) {
#if KF_JAX_FFI_CUDA
  if (place.device.device_type != kDLCUDA) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(static_cast<cudaStream_t>(place.stream), &status) == cudaSuccess &&
         status == cudaStreamCaptureStatusActive;
#else
  (void)place;
  return false;
#endif
}

}  // namespace kf::jax_ffi
