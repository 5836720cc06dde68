// Picking the backend from the tensors' device and running the CPU or CUDA entry points; the
// only file of src/capi that calls the CUDA runtime.
#pragma once

#include <string>

#include "core/layer_params.h"
#include "core/params.h"
#include "kernelflow/kernelflow.h"

namespace kf::cpu {
class LayerGraph;
}
namespace kf::cuda {
struct LayerGraph;
}

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
kf_status run_linear(const Device& dev, const LinearParams& p, void* stream);

// The fused decode layer's graph (the kf_layer_graph below) on its device: built from validated
// params (the CPU backend keeps a copy of them and runs the layers in fp32 at each launch; a CUDA
// device captures every launch once into a graph), launched on `stream` (ignored by the CPU),
// and destroyed. On failure create leaves the graph's backend object null.
kf_status run_layer_graph_create(const Device& dev, const LayerGraphParams& p, kf_layer_graph* g);
kf_status run_layer_graph_launch(kf_layer_graph* g, void* stream);
int layer_graph_kernel_nodes(const kf_layer_graph* g);  // 0 on the CPU backend
void run_layer_graph_destroy(kf_layer_graph* g);

int cuda_device_count();  // 0 without a driver or GPU, or without CUDA in the build
// batch: the call's batch where known (kf_mla_default_num_workers_for_batch), else 0.
kf_status cuda_default_num_workers(int device_id, int num_rows, kf::KvFormat kv_format, int batch,
                                   int* num_workers);
// Whether the device's decode family asks metadata for num_rows rows of a kv_format cache to put
// half the workers on the even ones at small batch (MlaMetadataParams::spread).
kf_status cuda_metadata_spread(int device_id, int num_rows, kf::KvFormat kv_format,
                               bool* spread);
std::string cuda_runtime_description();  // "cuda runtime 13.0" or "no CUDA runtime"

}  // namespace kf::capi

// The opaque handle of kernelflow.h: the device the graph was built for and its backend's object
// (exactly one of cpu and cuda is set once creation succeeds).
struct kf_layer_graph {
  kf::capi::Device dev;
  kf::cpu::LayerGraph* cpu = nullptr;
  kf::cuda::LayerGraph* cuda = nullptr;
};
