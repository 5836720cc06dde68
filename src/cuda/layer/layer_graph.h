// The fused decode layer on a CUDA device: the graph of L layers, built by capturing every
// launch once (src/cuda/layer/layer_graph.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "core/layer_params.h"

namespace kf::cuda {

struct LayerGraph;

// Builds the graph on the current device (p validated by src/capi); *graph is null on failure.
cudaError_t layer_graph_create(const LayerGraphParams& p, LayerGraph** graph);
cudaError_t layer_graph_launch(LayerGraph* graph, cudaStream_t stream);
int layer_graph_kernel_nodes(const LayerGraph* graph);
void layer_graph_destroy(LayerGraph* graph);

}  // namespace kf::cuda
