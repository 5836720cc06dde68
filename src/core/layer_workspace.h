// Where the fused layer's intermediate buffers lie in the caller's workspace: one layout that the
// size query (src/capi) and the CUDA graph builder (src/cuda/layer/) both read. Every buffer
// starts 256-byte aligned. The CPU backend keeps its fp32 intermediates to itself and needs none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/layer_params.h"
#include "core/scheduler.h"

namespace kf {

struct LayerWorkspace {
  // Byte offsets from the workspace start.
  size_t metadata;      // int32 [mla metadata size for (batch, num_workers)]
  size_t o_accum;       // fp32 split partials of the decode, [max_pieces, heads, 512]
  size_t lse_accum;     // fp32 [max_pieces, heads]
  size_t q_proj;        // bf16 [batch, q_out] (x W_q^T, or qa W_q_b^T)
  size_t q_a;           // bf16 [batch, q_lora] (x W_q_a^T, normalized in place); q_lora > 0
  size_t kv_proj;       // bf16 [batch, 576] (x W_kv_a^T)
  size_t q_attn;        // bf16 [batch, heads, 576]: [q_lat | q_pe], the decode's q
  size_t o_lat;         // bf16 [batch, heads, 512]: the decode's out
  size_t lse;           // fp32 [batch, heads]
  size_t o_heads;       // bf16 [batch, heads * v]: W_UV o_lat per head
  size_t act[2];        // bf16 [batch, hidden]: outputs of the layers before the last
  size_t gemm_scratch;  // fp32 split-K partials of the GEMMs
  size_t total;
};

// fp32 elements of GEMM split-K scratch the graph builder may use (src/cuda/layer/ decides how
// it splits within this).
inline size_t layer_gemm_scratch_floats(const LayerDims& d, int batch) {
  (void)d;
  return size_t(batch) * 64 * 1024;
}

inline LayerWorkspace layer_workspace_layout(const LayerDims& d, int batch, int num_workers) {
  LayerWorkspace w{};
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += (bytes + 255) / 256 * 256;
    return start;
  };
  const int64_t pieces = max_pieces(batch, num_workers);
  w.metadata = take(size_t(metadata_size(batch, num_workers)) * sizeof(int32_t));
  w.o_accum = take(size_t(pieces) * d.heads * kLatentDim * sizeof(float));
  w.lse_accum = take(size_t(pieces) * d.heads * sizeof(float));
  w.q_proj = take(size_t(batch) * d.q_out() * 2);
  w.q_a = take(size_t(batch) * d.q_lora * 2);
  w.kv_proj = take(size_t(batch) * d.kv_a_out() * 2);
  w.q_attn = take(size_t(batch) * d.heads * kHeadDim * 2);
  w.o_lat = take(size_t(batch) * d.heads * kLatentDim * 2);
  w.lse = take(size_t(batch) * d.heads * sizeof(float));
  w.o_heads = take(size_t(batch) * d.o_in() * 2);
  w.act[0] = take(size_t(batch) * d.hidden * 2);
  w.act[1] = take(size_t(batch) * d.hidden * 2);
  w.gemm_scratch = take(layer_gemm_scratch_floats(d, batch) * sizeof(float));
  w.total = at;
  return w;
}

}  // namespace kf
