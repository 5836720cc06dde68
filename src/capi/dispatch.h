// Picking the backend from the tensors' device and running the CPU or CUDA entry points; the
// only file of src/capi that calls the CUDA runtime.
#pragma once

#include <string>

#include "core/params.h"
#include "kernelflow/kernelflow.h"

namespace kf::capi {

struct Device {
  bool cuda = false;
  int id = 0;
};

// The device of a call, from its first tensor: kDLCPU or kDLCUDA, anything else is unsupported.
kf_status resolve_device(const DLTensor* t, const char* name, Device* dev);

// CUDA tensors in a build without CUDA, a missing device, or one below sm_80: a status and a
// message. Called before any host-side work on a CUDA call.
kf_status check_backend(const Device& dev);

// The operations, on the CPU backend or on the tensors' CUDA device. A CUDA call first makes the
// device current and checks its kernel family (src/cuda/family.h): a device this build has no
// usable code for gets KF_ERROR_UNSUPPORTED naming its architecture and the rebuild that adds
// it, an unknown KF_KERNEL_FAMILY KF_ERROR_INVALID_ARGUMENT; no launch is tried.
kf_status run_metadata(const Device& dev, const MlaMetadataParams& p, void* stream);
kf_status run_decode(const Device& dev, const MlaDecodeParams& p, void* stream);
kf_status run_append(const Device& dev, const CacheAppendParams& p, void* stream);
kf_status run_convert(const Device& dev, const CacheConvertParams& p, void* stream);

int cuda_device_count();  // 0 without a driver or GPU, or without CUDA in the build
kf_status cuda_default_num_workers(int device_id, int num_rows, kf::KvFormat kv_format,
                                   int* num_workers);
std::string cuda_runtime_description();  // "cuda runtime 13.0" or "no CUDA runtime"

}  // namespace kf::capi
