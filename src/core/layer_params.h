// The fused decode layer (docs/spec.md section 3) as plain structs: the dimensions, one layer's
// weights, the static buffers of a step, and the workspace layout. Filled by src/capi after
// validation; read by the CPU backend (src/cpu/layer.cpp) and the CUDA graph builder
// (src/cuda/layer/). No DLPack, no framework.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/mla_shape.h"
#include "core/params.h"

namespace kf {

struct LayerDims {
  int hidden;        // model width
  int heads;         // query heads on this device
  int q_lora;        // 0: no query compression
  int kv_lora;       // 512 = kLatentDim
  int nope;          // 128
  int rope;          // 64 = kRopeDim
  int v;             // 128
  float eps;         // RMSNorm epsilon
  float softmax_scale;
  KvFormat kv_format;
  int page_size, page_shift;
  int max_batch, max_pages_per_seq, max_position;

  int q_head() const { return nope + rope; }        // 192: one head of the query projection
  int q_out() const { return heads * q_head(); }    // rows of w_q / w_q_b
  int kv_a_out() const { return kv_lora + rope; }   // 576: rows of w_kv_a
  int kv_b_out() const { return heads * (nope + v); }
  int o_in() const { return heads * v; }            // columns of w_o
};

// Weights are bf16, [out, in] row-major with the given row stride (elements); the cache as in
// MlaDecodeParams (16-bit: elements, 8-bit: bytes).
struct LayerWeights {
  const uint16_t* w_q;       // q_lora == 0
  const uint16_t* w_q_a;     // q_lora > 0
  const uint16_t* q_a_norm;  // q_lora > 0
  const uint16_t* w_q_b;     // q_lora > 0
  const uint16_t* w_kv_a;
  const uint16_t* kv_a_norm;
  const uint16_t* w_kv_b;
  const uint16_t* w_o;
  int64_t w_q_stride, w_q_a_stride, w_q_b_stride, w_kv_a_stride, w_kv_b_stride, w_o_stride;
  void* kv_cache;
  int num_pages;
  int64_t kv_page_stride, kv_token_stride;
};

// The static buffers of a step (row b < batch is request b).
struct LayerIo {
  const uint16_t* hidden;  // bf16 [max_batch, hidden], row stride hidden_stride
  uint16_t* output;        // bf16 [max_batch, hidden], row stride output_stride
  int64_t hidden_stride, output_stride;
  const int32_t* positions;      // [max_batch]
  const int32_t* cache_seqlens;  // [max_batch]
  const int32_t* block_table;    // [max_batch, max_pages_per_seq]
  int64_t block_table_stride;
  const float* cos_sin;          // [max_position, 2, rope / 2], compact
  int32_t* error_buffer;         // nullable
};

struct LayerGraphParams {
  LayerDims dims;
  int num_layers;
  const LayerWeights* layers;  // [num_layers], host memory, copied by the builder
  LayerIo io;
  int batch;
  int num_workers;   // decode workers (resolved: >= 1)
  void* workspace;   // layer_workspace_bytes(dims, batch, num_workers) bytes, 256-byte aligned
  size_t workspace_bytes;
};

// Where a layer's attention step reads and writes (the CPU layer's own arrays, or the graph's
// workspace and static buffers).
struct LayerAttentionBuffers {
  const void* q_attn;  // bf16 [batch, heads, 576]: [q_lat | q_pe]
  void* o_lat;         // bf16 [batch, heads, 512]
  float* lse;          // [batch, heads]
  float* o_accum;      // the decode's split partials
  float* lse_accum;
  const int32_t* cache_seqlens;  // [batch]
  const int32_t* metadata;       // the step's schedule
};

// The decode's parameters for a layer's attention step (s_q 1, bf16 q and out): one definition
// for the CPU layer and the CUDA graph, so both attend over the same view of the cache.
inline MlaDecodeParams layer_attention_params(const LayerGraphParams& p, const LayerWeights& w,
                                              const LayerAttentionBuffers& b) {
  const LayerDims& d = p.dims;
  MlaDecodeParams a{};
  a.dtype = DType::kBF16;
  a.kv_format = d.kv_format;
  a.batch = p.batch;
  a.s_q = 1;
  a.h_q = d.heads;
  a.num_rows = d.heads;
  a.page_size = d.page_size;
  a.page_shift = d.page_shift;
  a.num_pages = w.num_pages;
  a.max_pages_per_seq = d.max_pages_per_seq;
  a.softmax_scale = d.softmax_scale;
  a.q = b.q_attn;
  a.q_batch_stride = int64_t(d.heads) * kHeadDim;
  a.q_seq_stride = a.q_batch_stride;
  a.q_head_stride = kHeadDim;
  a.kv = w.kv_cache;
  a.kv_page_stride = w.kv_page_stride;
  a.kv_token_stride = w.kv_token_stride;
  a.block_table = p.io.block_table;
  a.block_table_batch_stride = p.io.block_table_stride;
  a.cache_seqlens = b.cache_seqlens;
  a.metadata = b.metadata;
  a.num_workers = p.num_workers;
  a.out = b.o_lat;
  a.o_batch_stride = int64_t(d.heads) * kLatentDim;
  a.o_seq_stride = a.o_batch_stride;
  a.o_head_stride = kLatentDim;
  a.lse = b.lse;
  a.o_accum = b.o_accum;
  a.lse_accum = b.lse_accum;
  a.error_buffer = p.io.error_buffer;
  a.combine_early_dependents = true;  // the output absorption's GEMM follows the combine
  return a;
}

}  // namespace kf
