// The run-time switches of the CUDA backend: the one place the library reads its environment,
// each variable once per process (KF_KERNEL_FAMILY and KF_SM90A_KV8: at every call, see below). For tests, A/B timings and tools; docs/design.md ("Run-time
// switches") lists them. A flag is on when set to anything not starting with '0'.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace kf::cuda {

namespace detail {
inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}
}  // namespace detail

// KF_DISABLE_PDL: launch without programmatic dependent launch (plain stream order).
inline bool switch_disable_pdl() {
  static const bool on = detail::env_flag("KF_DISABLE_PDL");
  return on;
}

// KF_DECODE_64_ROW_TILES: the 64-row tiles of the GeForce Ampere design on every device.
inline bool switch_decode_64_row_tiles() {
  static const bool on = detail::env_flag("KF_DECODE_64_ROW_TILES");
  return on;
}

// KF_NVTX: NVTX ranges around the C API's entry points (src/capi/nvtx.h), for the profilers.
inline bool switch_nvtx() {
  static const bool on = detail::env_flag("KF_NVTX");
  return on;
}

// KF_TIMELINE_BUFFER: in the timeline build (KF_TIMELINE=1) the device address, in hexadecimal,
// of a zeroed buffer laid out as cuda/common/timeline.cuh says, which the decode, combine and
// fused-layer kernels write their per-block stamps to (python -m kernelflow.bench.timeline
// allocates it). Ignored, and null, in every other build.
inline uint64_t* switch_timeline_buffer() {
#if defined(KF_TIMELINE) && KF_TIMELINE
  static uint64_t* const buf = [] {
    const char* v = std::getenv("KF_TIMELINE_BUFFER");
    return v == nullptr ? nullptr
                        : reinterpret_cast<uint64_t*>(std::strtoull(v, nullptr, 16));
  }();
  return buf;
#else
  return nullptr;
#endif
}

// KF_SM90A_KV8=1: the sm_90a family runs FP8 and INT8 caches with bf16 q on its 8-bit kernel
// (mla_decode_sm90a_kv8.cuh) at every batch. Without it only large batches do
// (sm90a_kv8_kernel_runs in decode_config_sm90a.h): on the H200 that kernel is faster from about
// 64 requests of 4096 tokens at h_q 16 and slower below (docs/optimization/sm90a.md). Read at
// every call like KF_KERNEL_FAMILY, so a test process runs both; the scheduler metadata must be
// made under the same setting as the decode that reads it.
inline bool switch_sm90a_kv8() { return detail::env_flag("KF_SM90A_KV8"); }

// KF_KERNEL_FAMILY's value ("" when unset): "sm80" runs the portable family everywhere, "" or
// "auto" picks per device (cuda/family.h parses it). Unlike the other switches it is read at
// every CUDA call, not once per process: a test process runs both families by setting it between
// calls (os.environ in Python, setenv in C++; cuda/family.cu keeps one answer per device and
// value). Set it before starting threads that call the library: getenv does not synchronize
// with setenv.
inline std::string switch_kernel_family() {
  const char* v = std::getenv("KF_KERNEL_FAMILY");
  return std::string(v == nullptr ? "" : v);
}

}  // namespace kf::cuda
