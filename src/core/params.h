// Plain parameter structs, one per kernel family, as FlashAttention and FlashInfer do: pointers,
// strides in elements (int64) and scalars. Filled by src/capi after validation; read by the CPU
// backend and the CUDA launchers. Nothing here knows about DLPack or any framework.
#pragma once

#include <cstdint>

#include "core/mla_shape.h"
#include "core/scheduler.h"

namespace kf {

// Query row i of a request is (s, h) = (i / h_q, i % h_q): rows are ordered as q's memory is.
struct MlaDecodeParams {
  DType dtype;        // of q, out (and of a 16-bit cache)
  KvFormat kv_format;
  int batch, s_q, h_q;
  int num_rows;       // s_q * h_q
  int page_size;      // power of two
  int page_shift;     // log2(page_size)
  int num_pages;      // pages in kv_cache: the bounds guard for block_table values
  int max_pages_per_seq;
  float softmax_scale;

  const void* q;  // [b, s_q, h_q, 576]
  int64_t q_batch_stride, q_seq_stride, q_head_stride;

  // 16-bit: elements of the dtype, a row is 576 contiguous values.
  // 8-bit: bytes; a page is compact (page_stride >= page_size * 644), token_stride unused.
  const void* kv;
  int64_t kv_page_stride, kv_token_stride;

  const int32_t* block_table;  // [b, max_pages_per_seq]
  int64_t block_table_batch_stride;
  const int32_t* cache_seqlens;  // [b]
  const int32_t* metadata;       // see core/scheduler.h
  int num_workers;

  void* out;  // [b, s_q, h_q, 512]
  int64_t o_batch_stride, o_seq_stride, o_head_stride;
  float* lse;  // [b, h_q, s_q], compact

  // Split partials, [max_pieces, num_rows, 512] and [max_pieces, num_rows] fp32 (workspace).
  float* o_accum;
  float* lse_accum;

  int32_t* error_buffer;  // nullable, int32[4], see kernelflow.h

  // The combine lets the stream's next kernel launch at its first instruction (programmatic
  // dependent launch) instead of after its stores: for a next kernel that streams inputs the
  // combine does not write before it waits (the fused layer's output absorption, a GEMM that
  // requests its weights first), and the combine is launched as a programmatic dependent of the
  // decode. False for plain calls: a next decode parked early is slower.
  bool combine_early_dependents;

  // The timeline build's stamp buffer (cuda/common/timeline.cuh); null in every other build.
  uint64_t* timeline;
};

struct MlaMetadataParams {
  const int32_t* cache_seqlens;  // [batch]
  int batch, h_q, s_q, num_workers;
  int fixed_cost;  // the scheduler's per-piece cost in tiles: sched_fixed_cost(cache format)
  // Whether the schedule may put half the workers on the even ones at small batch (core/
  // scheduler.h): the CUDA decode family's choice for the call (mla_metadata_spread), never on
  // the CPU backend. Recorded in the header.
  bool spread;
  int32_t* metadata;
  int32_t* error_buffer;  // nullable
};

struct CacheAppendParams {
  DType dtype;  // of kv (and of a 16-bit cache)
  KvFormat kv_format;
  int num_tokens;
  int page_size, page_shift, num_pages;
  const void* kv;  // [n, 576]
  int64_t kv_row_stride;
  void* cache;
  int64_t cache_page_stride, cache_token_stride;  // as in MlaDecodeParams
  const int64_t* slot_mapping;  // [n], negative = skip
  int32_t* error_buffer;        // nullable
};

// Bulk conversion of a whole 16-bit cache into an 8-bit one, page for page, slot for slot (the
// same quantization as the append).
struct CacheConvertParams {
  DType src_dtype;
  KvFormat dst_format;  // 8-bit
  int page_size, page_shift, num_pages;
  const void* src;  // 16-bit cache, strides in elements
  int64_t src_page_stride, src_token_stride;
  void* dst;  // 8-bit cache, page stride in bytes
  int64_t dst_page_stride;
};

// y[m, n] = x[m, k] W[n, k]^T (kf_linear): bf16 in and out, fp32 accumulation; strides are
// the row strides in elements. scratch and counters: the workspace (core/layer_workspace.h,
// linear_workspace_layout), null when its size is 0.
struct LinearParams {
  int m, n, k;
  const uint16_t* x;
  int64_t ldx;
  const uint16_t* w;
  int64_t ldw;
  uint16_t* y;
  int64_t ldy;
  float* scratch;
  int32_t* counters;
};

// Workspace layout: o_accum then lse_accum, each 256-byte aligned. Sized for the most pieces a
// batch can be split into, so one allocation serves every step of a captured graph.
inline int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }
inline int64_t workspace_o_accum_bytes(int batch, int num_rows, int num_workers) {
  return align256(max_pieces(batch, num_workers) * num_rows * kLatentDim * int64_t(sizeof(float)));
}
inline int64_t workspace_lse_accum_bytes(int batch, int num_rows, int num_workers) {
  return align256(max_pieces(batch, num_workers) * num_rows * int64_t(sizeof(float)));
}
inline int64_t workspace_bytes(int batch, int num_rows, int num_workers) {
  if (num_workers == 1) return 0;  // one worker never splits a request
  return workspace_o_accum_bytes(batch, num_rows, num_workers) +
         workspace_lse_accum_bytes(batch, num_rows, num_workers);
}

}  // namespace kf
