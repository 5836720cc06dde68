// The fused decode layer on the CPU backend: the math of docs/spec.md section 3 in fp32 from the
// same bf16 weights and inputs as the GPU graph, the reference the GPU layer is checked against.
#pragma once

#include <vector>

#include "core/layer_params.h"

namespace kf::cpu {

// One decoding step of every layer in order: the guards of the step's static buffers, then per
// layer the projections, RMSNorm and RoPE, the cache write (cache_append's code), the absorbed
// attention (mla_decode's code) and the output projection.
void decode_layers(const LayerGraphParams& p);

// The CPU backend's "graph": the validated params with its own copy of the per-layer weights,
// run by launch() each time (nothing is captured; the caller's buffers are read at launch).
class LayerGraph {
 public:
  explicit LayerGraph(const LayerGraphParams& p) : params_(p), layers_(p.layers, p.layers + p.num_layers) {
    params_.layers = layers_.data();
  }
  LayerGraph(const LayerGraph&) = delete;
  LayerGraph& operator=(const LayerGraph&) = delete;

  void launch() const { decode_layers(params_); }

 private:
  LayerGraphParams params_;
  std::vector<LayerWeights> layers_;
};

}  // namespace kf::cpu
