// The fused decode layer's entry points: validate (layer_validate.h), then build, launch or
// destroy the graph on the tensors' device (dispatch.h). A graph holds no tensor: the caller's
// weights, caches, static buffers and workspace must outlive it.
#include <memory>
#include <vector>

#include "capi/dispatch.h"
#include "capi/error.h"
#include "capi/layer_validate.h"
#include "capi/nvtx.h"
#include "capi/scalar_check.h"

using namespace kf::capi;

namespace {

kf_status check_graph(const kf_layer_graph* graph) {
  if (graph) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "graph: expected a graph made by kf_layer_graph_create, got NULL");
}

}  // namespace

extern "C" {

KF_API kf_status kf_layer_workspace_size(const kf_layer_config* config, int batch, int num_workers,
                                         int device_id, size_t* bytes) {
  return guarded([&] {
    kf::LayerDims dims;
    KF_CHECK(validate_layer_config(config, &dims));
    KF_CHECK(check_layer_batch(dims, batch));
    KF_CHECK(check_layer_num_workers(num_workers));
    if (device_id < -1)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "device_id: expected -1 (CPU) or a CUDA device id >= 0, got %d", device_id);
    KF_CHECK(check_out_pointer(bytes, "bytes"));
    const Device dev{device_id >= 0, device_id >= 0 ? device_id : 0};
    int workers = 0;
    if (dev.cuda) KF_CHECK(resolve_layer_workers(dev, dims, num_workers, &workers));
    *bytes = layer_workspace_bytes(dev, dims, batch, workers);
    return KF_SUCCESS;
  });
}

KF_API kf_status kf_layer_graph_create(const kf_layer_config* config,
                                       const kf_layer_weights* layers, int num_layers,
                                       const kf_layer_io* io, int batch, int num_workers,
                                       DLTensor* workspace, kf_layer_graph** graph) {
  return guarded([&] {
    const NvtxRange range("kf_layer_graph_create");
    KF_CHECK(check_out_pointer(graph, "graph"));
    const LayerGraphArgs args{config, layers, num_layers, io, batch, num_workers, workspace};
    Device dev;
    kf::LayerGraphParams params;
    std::vector<kf::LayerWeights> weights;
    KF_CHECK(validate_layer_graph_call(args, &dev, &params, &weights));
    auto g = std::make_unique<kf_layer_graph>();
    g->dev = dev;
    KF_CHECK(run_layer_graph_create(dev, params, g.get()));
    *graph = g.release();
    return KF_SUCCESS;
  });
}

KF_API kf_status kf_layer_graph_launch(kf_layer_graph* graph, void* stream) {
  return guarded([&] {
    const NvtxRange range("kf_layer_graph_launch");
    KF_CHECK(check_graph(graph));
    return run_layer_graph_launch(graph, stream);
  });
}

KF_API kf_status kf_layer_graph_kernel_nodes(const kf_layer_graph* graph, int* nodes) {
  return guarded([&] {
    KF_CHECK(check_graph(graph));
    KF_CHECK(check_out_pointer(nodes, "nodes"));
    *nodes = layer_graph_kernel_nodes(graph);
    return KF_SUCCESS;
  });
}

KF_API void kf_layer_graph_destroy(kf_layer_graph* graph) {
  if (graph == nullptr) return;
  run_layer_graph_destroy(graph);
  delete graph;
}

}  // extern "C"
