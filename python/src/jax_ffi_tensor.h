// XLA FFI buffers as DLTensors for the C API (kernelflow._jax_ffi). XLA gives a custom call
// compact row-major buffers, so a view's strides are NULL (compact, in DLPack's terms); the
// shape is copied into the view, which must outlive the C call that reads it.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace kf::jax_ffi {

namespace ffi = xla::ffi;

// Where a handler runs: the device of every buffer, and the CUDA stream (nullptr on the CPU).
struct Place {
  DLDevice device;
  void* stream;
};

// The C API's cache formats are 0..3 (kf_kv_format).
bool valid_format(int32_t kv_format);

// dst[0 .. bytes) = src[0 .. bytes) where the handler runs: memcpy on the CPU, an asynchronous
// device-to-device copy on the handler's stream on a GPU (false: the copy failed, or the module
// was built without CUDA).
bool copy_bytes(void* dst, const void* src, size_t bytes, Place place);

// dst[0, bytes) = 0, on the place's stream (memset on the CPU). False if the runtime refused.
bool zero_bytes(void* dst, size_t bytes, Place place);

// Whether the handler's stream is recording a CUDA graph (XLA's command buffers record a
// compatible custom call by capturing its stream); false on the CPU and without CUDA.
bool stream_capturing(Place place);

class View {
 public:
  static constexpr int kMaxRank = 4;
  // The largest alignment the C API asks of a workspace (kf_mla_workspace_size's rule).
  static constexpr uintptr_t kWorkspaceAlign = 256;

  DLTensor dl{};

  // The buffer as it is; `name` (the Python argument) is used in errors.
  ffi::Error wrap(const ffi::AnyBuffer& buffer, Place place, const char* name);
  // uint8 [n] holding kWorkspaceAlign - 1 spare bytes: the view starts at its first
  // kWorkspaceAlign-aligned byte and keeps the rest.
  ffi::Error wrap_aligned_bytes(const ffi::AnyBuffer& buffer, Place place, const char* name);
  // int32 [n, 2] holding n little-endian int64 values (low word first): viewed as int64 [n].
  // JAX without jax_enable_x64 has no int64 arrays; python/kernelflow/jax.py widens there.
  ffi::Error wrap_int64_pairs(const ffi::AnyBuffer& buffer, Place place, const char* name);

 private:
  int64_t shape_[kMaxRank] = {};
};

}  // namespace kf::jax_ffi
