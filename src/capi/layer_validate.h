// Argument validation of the fused decode layer (kernelflow.h, "the fused decode layer"): every
// config field, every tensor of every layer, the static buffers and the workspace, ending in a
// filled LayerGraphParams. Messages name an argument as a C caller spells it: "config.num_heads",
// "layers[3].w_kv_b", "io.positions", "workspace". Nothing here reads tensor contents: the values
// that change between replays are guarded by the backends (the error buffer).
#pragma once

#include <vector>

#include "capi/dispatch.h"
#include "core/layer_params.h"
#include "kernelflow/kernelflow.h"

namespace kf::capi {

// The dimensions of a config, every field checked (KF_ERROR_UNSUPPORTED for head geometries
// other than DeepSeek's and for the fp16 cache, whose query rows the bf16 layer cannot make).
kf_status validate_layer_config(const kf_layer_config* config, LayerDims* dims);
kf_status check_layer_batch(const LayerDims& dims, int batch);
kf_status check_layer_num_workers(int num_workers);  // 0 (the device default) or 1..kMaxWorkers
// num_workers, or the device's default decode worker count for the config's heads and format.
kf_status resolve_layer_workers(const Device& dev, const LayerDims& dims, int num_workers,
                                int* resolved);
// Workspace bytes a graph needs on `dev`: the shared layout's total on a CUDA device, 0 on the
// CPU backend (which keeps its fp32 intermediates to itself).
size_t layer_workspace_bytes(const Device& dev, const LayerDims& dims, int batch,
                             int num_workers);

struct LayerGraphArgs {
  const kf_layer_config* config;
  const kf_layer_weights* layers;
  int num_layers;
  const kf_layer_io* io;
  int batch;
  int num_workers;
  DLTensor* workspace;
};

// Everything kf_layer_graph_create is given. On success *p is complete, with p->layers pointing
// into *weights (one entry per layer) and p->num_workers resolved.
kf_status validate_layer_graph_call(const LayerGraphArgs& a, Device* dev, LayerGraphParams* p,
                                    std::vector<LayerWeights>* weights);

}  // namespace kf::capi
