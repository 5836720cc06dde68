// The fused decode layer as one CUDA graph: every launch of a step is captured once on a private
// stream and instantiated; a launch replays it on the caller's stream. The step:
//   the scheduler metadata (cache_seqlens are the same for every layer), then per layer l:
//   1. [q_proj | kv_proj] = x [W_q; W_kv_a]^T                   (one grouped skinny GEMM)
//      (q_lora > 0: [q_a | kv_proj] = x [W_q_a; W_kv_a]^T, q_a normalized in place,
//       q_proj = q_a W_q_b^T: two more launches)
//   2. q_attn[:, h, 0:512] = q_nope W_UK[h] and the prologue     (one launch)
//   3. the attention on q_attn -> o_lat (launch_mla_decode: decode, then combine)
//   4. o_heads[:, h*v : (h+1)*v] = o_lat[:, h] W_UV[h]^T         (a skinny GEMM over the heads)
//   5. y = o_heads W_o^T into act[l % 2], or io.output for the last layer
// Six kernels per layer (eight with q_lora), each a programmatic dependent of the one before
// (cuda/common/pdl.cuh): a GEMM requests its weights before waiting for its input.
// All intermediates live in the caller's workspace (core/layer_workspace.h).
#include "cuda/layer/layer_graph.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <new>
#include <vector>

#include "core/layer_workspace.h"
#include "core/params.h"
#include "core/scheduler.h"
#include "cuda/common/device_flag.h"
#include "cuda/common/switches.h"
#include "cuda/common/timeline.cuh"
#include "cuda/launch.h"
#include "cuda/layer/layer_kernels.h"

namespace kf::cuda {

struct LayerGraph {
  cudaGraphExec_t exec = nullptr;
  int kernel_nodes = 0;
};

namespace {

// The workspace's buffers as typed pointers.
struct LayerBuffers {
  int32_t* metadata;
  float* o_accum;
  float* lse_accum;
  uint16_t* q_proj;
  uint16_t* q_a;
  uint16_t* kv_proj;
  uint16_t* q_attn;
  uint16_t* o_lat;
  float* lse;
  uint16_t* o_heads;
  uint16_t* act[2];
  float* gemm_scratch;
  int32_t* gemm_counters;
};

LayerBuffers layer_buffers(void* workspace, const LayerWorkspace& w) {
  uint8_t* base = static_cast<uint8_t*>(workspace);
  auto at = [base](size_t offset) { return base + offset; };
  LayerBuffers b;
  b.metadata = reinterpret_cast<int32_t*>(at(w.metadata));
  b.o_accum = reinterpret_cast<float*>(at(w.o_accum));
  b.lse_accum = reinterpret_cast<float*>(at(w.lse_accum));
  b.q_proj = reinterpret_cast<uint16_t*>(at(w.q_proj));
  b.q_a = reinterpret_cast<uint16_t*>(at(w.q_a));
  b.kv_proj = reinterpret_cast<uint16_t*>(at(w.kv_proj));
  b.q_attn = reinterpret_cast<uint16_t*>(at(w.q_attn));
  b.o_lat = reinterpret_cast<uint16_t*>(at(w.o_lat));
  b.lse = reinterpret_cast<float*>(at(w.lse));
  b.o_heads = reinterpret_cast<uint16_t*>(at(w.o_heads));
  b.act[0] = reinterpret_cast<uint16_t*>(at(w.act[0]));
  b.act[1] = reinterpret_cast<uint16_t*>(at(w.act[1]));
  b.gemm_scratch = reinterpret_cast<float*>(at(w.gemm_scratch));
  b.gemm_counters = reinterpret_cast<int32_t*>(at(w.gemm_counters));
  return b;
}

// A bf16 row-major activation: the input or output of a layer.
struct Rows {
  uint16_t* ptr;
  int64_t stride;
};

// y[m][n] = sum_k x[m][k] w[n][k], one z.
GemmJob linear_job(const uint16_t* w, int64_t ldw, int n_cols, const uint16_t* x, int64_t ldx,
                   uint16_t* y, int64_t ldy) {
  GemmJob j{};
  j.w = w;
  j.ldw = ldw;
  j.x = x;
  j.ldx = ldx;
  j.y = y;
  j.ldy = ldy;
  j.n_cols = n_cols;
  j.num_z = 1;
  return j;
}

// tl_kernel: the launch's id in the timeline build's stamps (cuda/common/timeline.cuh).
GemmLaunch gemm_launch(const LayerBuffers& buf, int m, int k, GemmJob a, int tl_kernel) {
  GemmLaunch g{};
  g.job[0] = a;
  g.num_jobs = 1;
  g.m = m;
  g.k = k;
  g.scratch = buf.gemm_scratch;
  g.counters = buf.gemm_counters;
  g.timeline = switch_timeline_buffer();
  g.timeline_kernel = tl_kernel;
  return g;
}

// Step 1: the query and kv projections (and the compressed query's norm and up-projection).
cudaError_t record_projections(const LayerGraphParams& p, const LayerWeights& w,
                               const LayerBuffers& buf, Rows x, cudaStream_t s) {
  const LayerDims& d = p.dims;
  const int m = p.batch;
  const bool lora = d.q_lora > 0;
  GemmLaunch g = gemm_launch(
      buf, m, d.hidden,
      lora ? linear_job(w.w_q_a, w.w_q_a_stride, d.q_lora, x.ptr, x.stride, buf.q_a, d.q_lora)
           : linear_job(w.w_q, w.w_q_stride, d.q_out(), x.ptr, x.stride, buf.q_proj, d.q_out()),
      kTlGemmProj);
  g.job[1] = linear_job(w.w_kv_a, w.w_kv_a_stride, d.kv_a_out(), x.ptr, x.stride, buf.kv_proj,
                        d.kv_a_out());
  g.num_jobs = 2;
  cudaError_t err = launch_skinny_gemm(g, WeightLayout::kNK, s);
  if (err != cudaSuccess || !lora) return err;
  err = launch_rmsnorm_rows(buf.q_a, d.q_lora, m, d.q_lora, w.q_a_norm, d.eps, s);
  if (err != cudaSuccess) return err;
  return launch_skinny_gemm(gemm_launch(buf, m, d.q_lora,
                                        linear_job(w.w_q_b, w.w_q_b_stride, d.q_out(), buf.q_a,
                                                   d.q_lora, buf.q_proj, d.q_out()),
                                        kTlGemmQb),
                            WeightLayout::kNK, s);
}

// Step 2: the query absorption over the heads (W_UK[h] = w_kv_b rows h (nope + v) ..
// h (nope + v) + nope - 1, stored [k = nope][n = 512]) and the prologue.
cudaError_t record_q_absorb_prologue(const LayerGraphParams& p, const LayerWeights& w,
                                     const LayerBuffers& buf, cudaStream_t s) {
  const LayerDims& d = p.dims;
  GemmJob uk{};
  uk.w = w.w_kv_b;
  uk.ldw = w.w_kv_b_stride;
  uk.w_z = int64_t(d.nope + d.v) * w.w_kv_b_stride;
  uk.x = buf.q_proj;  // q_nope of head h: columns h q_head .. h q_head + nope - 1
  uk.ldx = d.q_out();
  uk.x_z = d.q_head();
  uk.y = buf.q_attn;
  uk.ldy = int64_t(d.heads) * kHeadDim;
  uk.y_z = kHeadDim;
  uk.n_cols = d.kv_lora;
  uk.num_z = d.heads;
  const GemmLaunch absorb = gemm_launch(buf, p.batch, d.nope, uk, kTlQAbsorb);

  PrologueParams pro{};
  pro.batch = p.batch;
  pro.heads = d.heads;
  pro.nope = d.nope;
  pro.eps = d.eps;
  pro.q_proj = buf.q_proj;
  pro.kv_proj = buf.kv_proj;
  pro.kv_a_norm = w.kv_a_norm;
  pro.q_attn = buf.q_attn;
  pro.positions = p.io.positions;
  pro.cache_seqlens = p.io.cache_seqlens;
  pro.block_table = p.io.block_table;
  pro.block_table_stride = p.io.block_table_stride;
  pro.cos_sin = p.io.cos_sin;
  pro.max_position = d.max_position;
  pro.kv_format = d.kv_format;
  pro.cache = w.kv_cache;
  pro.page_stride = w.kv_page_stride;
  pro.token_stride = w.kv_token_stride;
  pro.num_pages = w.num_pages;
  pro.page_size = d.page_size;
  pro.page_shift = d.page_shift;
  pro.max_pages_per_seq = d.max_pages_per_seq;
  pro.error_buffer = p.io.error_buffer;
  return launch_q_absorb_prologue(absorb, pro, s);
}

// Step 3: the attention over the layer's cache, q_attn -> o_lat.
cudaError_t record_attention(const LayerGraphParams& p, const LayerWeights& w,
                             const LayerBuffers& buf, cudaStream_t s) {
  const MlaDecodeParams a = layer_attention_params(
      p, w, {buf.q_attn, buf.o_lat, buf.lse, buf.o_accum, buf.lse_accum, p.io.cache_seqlens,
             buf.metadata});
  return launch_mla_decode(a, s);
}

// Steps 4 and 5: o_heads = per head o_lat W_UV[h]^T (W_UV[h] = w_kv_b rows h (nope + v) + nope
// .. h (nope + v) + nope + v - 1, stored [n = v][k = 512]), then y = o_heads W_o^T.
cudaError_t record_output(const LayerGraphParams& p, const LayerWeights& w,
                          const LayerBuffers& buf, Rows y, cudaStream_t s) {
  const LayerDims& d = p.dims;
  GemmJob uv{};
  uv.w = w.w_kv_b + int64_t(d.nope) * w.w_kv_b_stride;
  uv.ldw = w.w_kv_b_stride;
  uv.w_z = int64_t(d.nope + d.v) * w.w_kv_b_stride;
  uv.x = buf.o_lat;
  uv.ldx = int64_t(d.heads) * kLatentDim;
  uv.x_z = kLatentDim;
  uv.y = buf.o_heads;
  uv.ldy = d.o_in();
  uv.y_z = d.v;
  uv.n_cols = d.v;
  uv.num_z = d.heads;
  cudaError_t err =
      launch_skinny_gemm(gemm_launch(buf, p.batch, d.kv_lora, uv, kTlGemmUv), WeightLayout::kNK, s);
  if (err != cudaSuccess) return err;
  return launch_skinny_gemm(
      gemm_launch(buf, p.batch, d.o_in(),
                  linear_job(w.w_o, w.w_o_stride, d.hidden, buf.o_heads, d.o_in(), y.ptr, y.stride),
                  kTlGemmO),
      WeightLayout::kNK, s);
}

cudaError_t record_layer(const LayerGraphParams& p, int l, const LayerBuffers& buf,
                         cudaStream_t s) {
  const LayerWeights& w = p.layers[l];
  const int64_t hidden = p.dims.hidden;
  const Rows x = l == 0 ? Rows{const_cast<uint16_t*>(p.io.hidden), p.io.hidden_stride}
                        : Rows{buf.act[(l - 1) % 2], hidden};
  const Rows y = l == p.num_layers - 1 ? Rows{p.io.output, p.io.output_stride}
                                       : Rows{buf.act[l % 2], hidden};
  cudaError_t err = record_projections(p, w, buf, x, s);
  if (err == cudaSuccess) err = record_q_absorb_prologue(p, w, buf, s);
  if (err == cudaSuccess) err = record_attention(p, w, buf, s);
  if (err == cudaSuccess) err = record_output(p, w, buf, y, s);
  return err;
}

// The whole step: metadata once, then every layer.
cudaError_t record_step(const LayerGraphParams& p, const LayerBuffers& buf, cudaStream_t s) {
  MlaMetadataParams m{};
  m.cache_seqlens = p.io.cache_seqlens;
  m.batch = p.batch;
  m.h_q = p.dims.heads;
  m.s_q = 1;
  m.num_workers = p.num_workers;
  m.fixed_cost = sched_fixed_cost(p.dims.kv_format);
  m.metadata = buf.metadata;
  m.error_buffer = p.io.error_buffer;
  cudaError_t err = mla_metadata_spread(current_device(), m.h_q, p.dims.kv_format, &m.spread);
  if (err == cudaSuccess) err = launch_mla_metadata(m, s);
  for (int l = 0; l < p.num_layers && err == cudaSuccess; ++l) err = record_layer(p, l, buf, s);
  return err;
}

// The dimensions the kernels are written for (src/capi checks the same with named errors).
bool dims_supported(const LayerGraphParams& p) {
  const LayerDims& d = p.dims;
  const bool fmt = d.kv_format == KvFormat::kBF16 || d.kv_format == KvFormat::kFP8E4M3 ||
                   d.kv_format == KvFormat::kINT8;
  return fmt && d.kv_lora == kLatentDim && d.rope == kRopeDim && d.heads >= 1 &&
         d.heads <= kMaxHeads && d.nope >= kLayerGemmTileK && d.nope % kLayerGemmTileK == 0 &&
         d.v >= 1 && d.hidden % kLayerGemmTileK == 0 && d.q_lora % kLayerGemmTileK == 0 &&
         d.o_in() % kLayerGemmTileK == 0 && p.batch >= 1 && p.batch <= kGemmMaxM &&
         p.batch <= d.max_batch && p.num_layers >= 1 && p.layers != nullptr &&
         p.num_workers >= 1 && p.workspace != nullptr &&
         reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0 &&
         p.workspace_bytes >= layer_workspace_layout(d, p.batch, p.num_workers).total;
}

int count_kernel_nodes(cudaGraph_t graph, cudaError_t* err) {
  size_t n = 0;
  *err = cudaGraphGetNodes(graph, nullptr, &n);
  if (*err != cudaSuccess) return 0;
  std::vector<cudaGraphNode_t> nodes(n);
  *err = cudaGraphGetNodes(graph, nodes.data(), &n);
  int kernels = 0;
  for (size_t i = 0; i < n && *err == cudaSuccess; ++i) {
    cudaGraphNodeType type;
    *err = cudaGraphNodeGetType(nodes[i], &type);
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

// Capture the step on `s` into an executable graph.
cudaError_t capture_step(const LayerGraphParams& p, const LayerBuffers& buf, cudaStream_t s,
                         LayerGraph* out) {
  cudaError_t err = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return err;
  const cudaError_t recorded = record_step(p, buf, s);
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(s, &graph);
  if (recorded != cudaSuccess) err = recorded;
  if (err == cudaSuccess) out->kernel_nodes = count_kernel_nodes(graph, &err);
  if (err == cudaSuccess) err = cudaGraphInstantiate(&out->exec, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return err;
}

}  // namespace

cudaError_t layer_graph_create(const LayerGraphParams& p, LayerGraph** graph) {
  *graph = nullptr;
  if (!dims_supported(p)) return cudaErrorInvalidValue;
  // The decode's kernel family is resolved (and its code loaded) before the capture.
  int workers = 0;
  cudaError_t err =
      mla_default_num_workers(current_device(), p.dims.heads, p.dims.kv_format, 0, &workers);
  if (err != cudaSuccess) return err;
  const LayerWorkspace ws = layer_workspace_layout(p.dims, p.batch, p.num_workers);
  const LayerBuffers buf = layer_buffers(p.workspace, ws);
  cudaStream_t s = nullptr;
  err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) return err;
  // The split-K arrival counters start at zero; each launch leaves them at zero.
  err = cudaMemsetAsync(buf.gemm_counters, 0, size_t(kLayerGemmBlocks / 2) * sizeof(int32_t), s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  LayerGraph* g = new (std::nothrow) LayerGraph;
  if (g == nullptr && err == cudaSuccess) err = cudaErrorMemoryAllocation;
  if (err == cudaSuccess) err = capture_step(p, buf, s, g);
  cudaStreamDestroy(s);
  if (err != cudaSuccess) {
    cudaGetLastError();  // a failed launch's error is reported here, not left for the next call
    layer_graph_destroy(g);
    return err;
  }
  *graph = g;
  return cudaSuccess;
}

cudaError_t layer_graph_launch(LayerGraph* graph, cudaStream_t stream) {
  return cudaGraphLaunch(graph->exec, stream);
}

int layer_graph_kernel_nodes(const LayerGraph* graph) { return graph->kernel_nodes; }

void layer_graph_destroy(LayerGraph* graph) {
  if (graph == nullptr) return;
  if (graph->exec != nullptr) cudaGraphExecDestroy(graph->exec);
  delete graph;
}

}  // namespace kf::cuda
