// Where the fused layer's intermediate buffers lie in the caller's workspace: one layout that the
// size query (src/capi) and the CUDA graph builder (src/cuda/layer/) both read. Every buffer
// starts 256-byte aligned. The CPU backend keeps its fp32 intermediates to itself and needs none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/layer_params.h"
#include "core/scheduler.h"

namespace kf {

// The skinny GEMMs of the layer (src/cuda/layer/skinny_gemm.cuh) compute output tiles of
// kLayerGemmTileN columns, stream K in stages of kLayerGemmTileK, and split K across blocks
// when the tiles alone would not give kLayerGemmBlocks blocks (two per SM on a 132-SM H200):
// each split writes fp32 partials to gemm_scratch, and the last block of a tile to arrive (a
// per-tile counter in gemm_counters) adds them in split order. The split depends only on the
// shapes, so the size query and the graph builder agree on every device. (On sm_90 the
// stand-alone GEMM launches add their splits within thread-block clusters instead, at most 8
// per tile, and leave scratch and counters untouched: src/cuda/layer/skinny_gemm.cuh.)
constexpr int kLayerGemmTileN = 64;
constexpr int kLayerGemmTileK = 64;
constexpr int kLayerGemmBlocks = 264;
constexpr int kGemmMaxM = 128;  // rows of X (the batch)
// W[n][k] GEMMs of at most kGemmNarrowMaxM rows and kGemmNarrowMaxK k run the narrow kernel
// (src/cuda/layer/skinny_gemm_narrow.cuh): 16 columns per block over all of K, no split. A block
// streams its column slab at the rate its few stages in flight allow, so a long K (V3's hidden
// 7168 and W_o's 16384) takes the wide kernel, whose split-K keeps every block's share short.
// Every narrow block also reads all of X (M x K) from L2: at 32 rows that costs less than the
// wide kernel's split sums, at 64 rows (256 KB per block at K 2048) more
// (docs/optimization/layer.md, step layer-gemm-narrow-32).
constexpr int kGemmNarrowMaxM = 32;
constexpr int kGemmNarrowMaxK = 2048;

// Whether a GEMM of a W[n][k] weight over m rows runs the narrow kernel (the launch plan and the
// stand-alone GEMM's workspace size both ask).
inline bool gemm_runs_narrow(int m, int k) { return m <= kGemmNarrowMaxM && k <= kGemmNarrowMaxK; }

// Splits of K for a launch of `tiles` output tiles over k (a multiple of kLayerGemmTileK) for
// m rows: floor(kLayerGemmBlocks / tiles), at least two stages of K per split, and at most
// k / (2 m) so that the fp32 partials (splits x m x 4 bytes per column) move no more bytes than
// the bf16 weights (k x 2 bytes per column); at least 1. A launch that splits (> 1) has at most
// kLayerGemmBlocks / 2 tiles and tiles * splits <= kLayerGemmBlocks.
inline int layer_gemm_splits(int64_t tiles, int k, int m) {
  int64_t s = tiles > 0 ? kLayerGemmBlocks / tiles : 1;
  const int64_t stages = k / kLayerGemmTileK, traffic = m > 0 ? k / (2 * int64_t(m)) : stages;
  if (s > stages / 2) s = stages / 2;  // a split of one stage is not worth adding up
  if (s > traffic) s = traffic;
  return s < 1 ? 1 : int(s);
}

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
  size_t gemm_scratch;  // fp32 split-K partials of the GEMMs: [tile][split][batch][64]
  size_t gemm_counters; // int32 [kLayerGemmBlocks / 2]: arrivals per tile, zero between launches
  size_t total;
};

// fp32 elements of GEMM split-K scratch: a splitting launch has tiles * splits <=
// kLayerGemmBlocks blocks, each writing batch x kLayerGemmTileN partials.
inline size_t layer_gemm_scratch_floats(const LayerDims& d, int batch) {
  (void)d;
  return size_t(kLayerGemmBlocks) * kLayerGemmTileN * size_t(batch);
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
  w.gemm_counters = take(size_t(kLayerGemmBlocks / 2) * sizeof(int32_t));
  w.total = at;
  return w;
}

// The stand-alone GEMM (kf_linear, y[m, n] = x[m, k] W[n, k]^T): the wide kernel's split-K
// partials and arrival counters in the caller's workspace, needed only where the launch splits K
// (the narrow kernel never does). Device-independent: on sm_90 the splits are added within
// thread-block clusters and the workspace goes unused, but the size is the same everywhere.
struct LinearWorkspace {
  size_t scratch;   // fp32 [kLayerGemmBlocks][kLayerGemmTileN][m]
  size_t counters;  // int32 [kLayerGemmBlocks / 2], zero between launches
  size_t total;     // 0: no workspace
};

inline LinearWorkspace linear_workspace_layout(int m, int n, int k) {
  LinearWorkspace w{};  // scratch at offset 0
  const int64_t tiles = (int64_t(n) + kLayerGemmTileN - 1) / kLayerGemmTileN;
  if (gemm_runs_narrow(m, k) || m < 1 || k < kLayerGemmTileK ||
      layer_gemm_splits(tiles, k, m) == 1)
    return w;
  const size_t scratch = size_t(kLayerGemmBlocks) * kLayerGemmTileN * size_t(m) * sizeof(float);
  w.counters = (scratch + 255) / 256 * 256;
  w.total = w.counters + size_t(kLayerGemmBlocks / 2) * sizeof(int32_t);
  return w;
}

}  // namespace kf
