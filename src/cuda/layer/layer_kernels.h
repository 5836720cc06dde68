// The kernels of the fused decode layer (docs/spec.md section 3) and their launchers, called by
// the graph builder (layer_graph.cu) and the GPU tests. Plain structs of pointers, strides in
// elements and sizes; every launch is a programmatic dependent of the stream's previous kernel
// (cuda/common/pdl.cuh) and reads what that kernel wrote only after waiting for it. Launchers
// return cudaErrorInvalidValue for a shape or alignment the kernels do not handle.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/layer_workspace.h"
#include "core/mla_shape.h"

namespace kf::cuda {

// kGemmMaxM, kGemmNarrowMaxM and kGemmNarrowMaxK: core/layer_workspace.h (the workspace size
// queries read them too).
constexpr int kGemmNarrowTileN = 16;

// How a GEMM's weight is stored: W[n][k] (a torch.nn.Linear weight: y = x W^T) or W[k][n]
// (y = x W, the query absorption's W_UK).
enum class WeightLayout { kNK, kKN };

// One GEMM of a launch, repeated over z < num_z (the heads of an absorption):
//   Y_z[m][n] = sum_k X_z[m][k] W_z(n, k)  for m < M, n < n_cols, k < K,
// W_z = w + z * w_z, X_z = x + z * x_z, Y_z = y + z * y_z (elements); ldw, ldx, ldy are the row
// strides. bf16 in and out, fp32 accumulation. W, X: 16-byte aligned rows (pointers, strides).
struct GemmJob {
  const uint16_t* w;
  int64_t ldw, w_z;
  const uint16_t* x;
  int64_t ldx, x_z;
  uint16_t* y;
  int64_t ldy, y_z;
  int n_cols;
  int num_z;
  // Filled by plan_gemm: output tiles (of kLayerGemmTileN columns, or kGemmNarrowTileN for
  // the narrow kernel) per z, and in all.
  int tiles_n, tiles;
};

// A launch of one or two jobs over the same M and K (two weights read against one X as one
// grid: [W_q; W_kv_a] x), split over K as layer_gemm_splits says.
struct GemmLaunch {
  GemmJob job[2];
  int num_jobs;
  int m, k;
  float* scratch;     // split partials: layer_gemm_scratch_floats(dims, m) floats
  int32_t* counters;  // kLayerGemmBlocks / 2 ints, zero before the first launch (kept zero)
  // Add the splits through scratch and counters even where the device has clusters (the
  // stand-alone wide launch adds them within a cluster there): for the tests of that path.
  bool global_reduce;
  // Launch in plain stream order instead of as a programmatic dependent: the kernels request
  // their first weight stages before they wait for the previous kernel, which is right for the
  // layer's constant weights but not where the previous kernel may have written the weight
  // (kf_linear, a stand-alone call in a caller's stream).
  bool stream_order;
  // Filled by plan_gemm.
  int tiles, splits;
  bool narrow;  // the narrow kernel (then splits == 1)
  // The timeline build's stamp buffer and this launch's kernel id in it (cuda/common/
  // timeline.cuh; null and unused in every other build).
  uint64_t* timeline;
  int timeline_kernel;
};

// Fills the tile counts and the split; false for what the kernels do not handle (M outside
// [1, kGemmMaxM], K not a multiple of kLayerGemmTileK, misaligned W or X rows, a kKN weight
// whose n_cols is not a multiple of 8, an empty job). A kNK launch of at most kGemmNarrowMaxM
// rows and kGemmNarrowMaxK k is planned for the narrow kernel.
bool plan_gemm(GemmLaunch& g, WeightLayout layout);

cudaError_t launch_skinny_gemm(const GemmLaunch& g, WeightLayout layout, cudaStream_t stream);

// The prologue of one step for request b < batch (docs/spec.md section 3 steps 2-4):
// c = rmsnorm(kv_proj[b, :512]) * kv_a_norm, k_pe = rope(kv_proj[b, 512:576]), the cache row
// [c | k_pe] written at position cache_seqlens[b] - 1 (16-bit: bf16 values; 8-bit: quantized,
// the bytes of kf_cache_append on the bf16 row), and each head's q_pe = rope(q_proj[b, h, nope:])
// into q_attn[b, h, 512:576]. Positions outside [0, max_position) are flagged
// (KF_DEVERR_SEQLEN_RANGE) and clamped; lengths outside [1, max_pages_per_seq * page_size]
// (KF_DEVERR_SEQLEN_RANGE) and pages outside [0, num_pages) (KF_DEVERR_PAGE_RANGE) are flagged
// and the row is not written.
struct PrologueParams {
  int batch, heads, nope;  // q_proj rows: heads x (nope + 64)
  float eps;
  const uint16_t* q_proj;  // [batch, heads * (nope + 64)]
  const uint16_t* kv_proj; // [batch, 576]
  const uint16_t* kv_a_norm;  // [512]
  uint16_t* q_attn;           // [batch, heads, 576]
  const int32_t* positions;      // [batch]
  const int32_t* cache_seqlens;  // [batch]
  const int32_t* block_table;    // [batch, block_table_stride]
  int64_t block_table_stride;
  const float* cos_sin;  // [max_position, 2, 32]
  int max_position;
  KvFormat kv_format;  // kBF16, kFP8E4M3 or kINT8
  void* cache;         // 16-bit: elements, 8-bit: bytes (strides likewise), 16-byte aligned rows
  int64_t page_stride, token_stride;
  int num_pages, page_size, page_shift, max_pages_per_seq;
  int32_t* error_buffer;  // nullable
};

// One launch: the query absorption q_attn[b, h, 0:512] = q_nope[b, h] W_UK[h] (a kKN GEMM
// over the heads, `absorb`) and the prologue (extra blocks, one per request).
cudaError_t launch_q_absorb_prologue(const GemmLaunch& absorb, const PrologueParams& p,
                                     cudaStream_t stream);

// In place: x[b, :] = bf16(rmsnorm(x[b, :]) * weight) for b < rows (the compressed query q_a).
cudaError_t launch_rmsnorm_rows(uint16_t* x, int64_t ldx, int rows, int cols,
                                const uint16_t* weight, float eps, cudaStream_t stream);

}  // namespace kf::cuda
