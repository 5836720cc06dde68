#include "capi/layer_validate.h"

#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>

#include "capi/error.h"
#include "capi/mla_validate.h"
#include "capi/scalar_check.h"
#include "capi/tensor_check.h"
#include "core/layer_workspace.h"

namespace kf::capi {
namespace {

constexpr int kMaxHidden = 16384;
constexpr int kDimMultiple = 64;  // hidden_size and q_lora_rank: whole GEMM tiles
constexpr int kMaxQLora = 4096;
constexpr int kMaxLayers = 4096;
constexpr int kRowAlign = 16;      // bytes: weight and activation rows are read 16 bytes at a time
constexpr int kRowAlignElems = 8;  // the same in bf16 elements
constexpr int kWorkspaceAlign = 256;

// The fixed parts of the head geometry: the cache row is [512 latent | 64 rope] and the kernels
// are built for DeepSeek's 128-wide heads.
struct FixedDim {
  const char* field;
  int value, want;
  const char* why;
};

// A check whose messages name its tensor `from` ("kv_cache"), re-issued under the caller's name.
kf_status renamed(kf_status s, const char* from, const std::string& to) {
  if (s == KF_SUCCESS) return s;
  std::string m = last_error();
  const size_t n = std::strlen(from);
  if (m.compare(0, n, from) == 0) m = to + m.substr(n);
  return fail(s, "%s", m.c_str());
}

std::string dims_string(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (const int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

// The whole shape at once, with its meaning: "expected shape [4096, 512] ([...]), got [...]".
kf_status check_shape(const DLTensor* t, const std::string& name,
                      std::initializer_list<int64_t> want, const char* layout) {
  bool same = t->ndim == int(want.size());
  int axis = 0;
  for (const int64_t d : want) same = same && t->shape[axis++] == d;
  if (same) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected shape %s (%s), got %s", name.c_str(),
              dims_string(want).c_str(), layout, shape_string(t).c_str());
}

// A bf16 weight (a matrix [out, in] or a norm vector [n]) on io.hidden's device, rows contiguous
// and 16-byte aligned.
kf_status check_weight(const DLTensor* t, const std::string& name, const DLTensor* hidden,
                       std::initializer_list<int64_t> shape, const char* layout) {
  const char* n = name.c_str();
  KF_CHECK(check_present(t, n));
  KF_CHECK(check_same_device(hidden, "io.hidden", t, n));
  KF_CHECK(check_dtype(t, n, kDtBF16));
  KF_CHECK(check_shape(t, name, shape, layout));
  KF_CHECK(check_last_contiguous(t, n));
  if (t->ndim == 2) KF_CHECK(check_stride_multiple(t, n, 0, kRowAlignElems, "16-byte aligned rows"));
  return check_alignment(t, n, kRowAlign);
}

// The query weights present exactly as config.q_lora_rank says.
kf_status check_query_presence(const kf_layer_weights& w, int l, int q_lora) {
  const std::pair<const DLTensor*, const char*> lora[] = {
      {w.w_q_a, "w_q_a"}, {w.q_a_norm, "q_a_norm"}, {w.w_q_b, "w_q_b"}};
  if (q_lora == 0) {
    if (w.w_q == nullptr)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "layers[%d].w_q: expected a tensor (config.q_lora_rank = 0: the query is "
                  "x w_q^T), got NULL",
                  l);
    for (const auto& [t, field] : lora)
      if (t != nullptr)
        return fail(KF_ERROR_INVALID_ARGUMENT,
                    "layers[%d].%s: expected NULL when config.q_lora_rank = 0 (the query is "
                    "x w_q^T), got a tensor",
                    l, field);
    return KF_SUCCESS;
  }
  if (w.w_q != nullptr)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "layers[%d].w_q: expected NULL when config.q_lora_rank = %d (the query goes "
                "through w_q_a, q_a_norm and w_q_b), got a tensor",
                l, q_lora);
  for (const auto& [t, field] : lora)
    if (t == nullptr)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "layers[%d].%s: expected a tensor (config.q_lora_rank = %d), got NULL", l, field,
                  q_lora);
  return KF_SUCCESS;
}

std::string layer_field(int l, const char* field) {
  return "layers[" + std::to_string(l) + "]." + field;
}

// Layer l's weights and cache, into *out.
kf_status check_layer(const kf_layer_weights& w, int l, const LayerDims& d,
                      const DLTensor* hidden, LayerWeights* out) {
  KF_CHECK(check_query_presence(w, l, d.q_lora));
  const auto name = [l](const char* field) { return layer_field(l, field); };
  if (d.q_lora == 0) {
    KF_CHECK(check_weight(w.w_q, name("w_q"), hidden, {d.q_out(), d.hidden},
                          "[num_heads * (qk_nope_head_dim + qk_rope_head_dim), hidden_size]"));
  } else {
    KF_CHECK(check_weight(w.w_q_a, name("w_q_a"), hidden, {d.q_lora, d.hidden},
                          "[q_lora_rank, hidden_size]"));
    KF_CHECK(check_weight(w.q_a_norm, name("q_a_norm"), hidden, {d.q_lora}, "[q_lora_rank]"));
    KF_CHECK(check_weight(w.w_q_b, name("w_q_b"), hidden, {d.q_out(), d.q_lora},
                          "[num_heads * (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank]"));
  }
  KF_CHECK(check_weight(w.w_kv_a, name("w_kv_a"), hidden, {d.kv_a_out(), d.hidden},
                        "[kv_lora_rank + qk_rope_head_dim, hidden_size]"));
  KF_CHECK(check_weight(w.kv_a_norm, name("kv_a_norm"), hidden, {d.kv_lora}, "[kv_lora_rank]"));
  KF_CHECK(check_weight(w.w_kv_b, name("w_kv_b"), hidden, {d.kv_b_out(), d.kv_lora},
                        "[num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]"));
  KF_CHECK(check_weight(w.w_o, name("w_o"), hidden, {d.hidden, d.o_in()},
                        "[hidden_size, num_heads * v_head_dim]"));

  const std::string cache_name = name("kv_cache");
  const char* cn = cache_name.c_str();
  KF_CHECK(check_present(w.kv_cache, cn));
  KF_CHECK(check_same_device(hidden, "io.hidden", w.kv_cache, cn));
  CacheGeometry g;
  const kf_kv_format format = kf_kv_format(int(d.kv_format));
  KF_CHECK(renamed(check_cache(w.kv_cache, format, kDtBF16, &g), "kv_cache", cache_name));
  if (g.page_size != d.page_size)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "%s: expected page_size %d (config.page_size) in shape[1], got %d (shape %s)", cn,
                d.page_size, g.page_size, shape_string(w.kv_cache).c_str());
  KF_CHECK(check_no_overlap(w.kv_cache, cn));

  const auto ptr = [](const DLTensor* t) {
    return t ? reinterpret_cast<const uint16_t*>(data_address(t)) : nullptr;
  };
  const auto row_stride = [](const DLTensor* t) { return t ? stride_of(t, 0) : int64_t(0); };
  *out = LayerWeights{};
  out->w_q = ptr(w.w_q);
  out->w_q_a = ptr(w.w_q_a);
  out->q_a_norm = ptr(w.q_a_norm);
  out->w_q_b = ptr(w.w_q_b);
  out->w_kv_a = ptr(w.w_kv_a);
  out->kv_a_norm = ptr(w.kv_a_norm);
  out->w_kv_b = ptr(w.w_kv_b);
  out->w_o = ptr(w.w_o);
  out->w_q_stride = row_stride(w.w_q);
  out->w_q_a_stride = row_stride(w.w_q_a);
  out->w_q_b_stride = row_stride(w.w_q_b);
  out->w_kv_a_stride = row_stride(w.w_kv_a);
  out->w_kv_b_stride = row_stride(w.w_kv_b);
  out->w_o_stride = row_stride(w.w_o);
  out->kv_cache = reinterpret_cast<void*>(data_address(w.kv_cache));
  out->num_pages = g.num_pages;
  out->kv_page_stride = g.page_stride;
  out->kv_token_stride = g.token_stride;
  return KF_SUCCESS;
}

// bf16 [max_batch, hidden_size] with 16-byte aligned rows (io.hidden, io.output).
kf_status check_activation(const DLTensor* t, const char* name, const LayerDims& d) {
  KF_CHECK(check_dtype(t, name, kDtBF16));
  KF_CHECK(check_shape(t, name, {d.max_batch, d.hidden}, "[config.max_batch, config.hidden_size]"));
  KF_CHECK(check_last_contiguous(t, name));
  KF_CHECK(check_stride_multiple(t, name, 0, kRowAlignElems, "16-byte aligned rows"));
  return check_alignment(t, name, kRowAlign);
}

// int32 [max_batch], compact (io.positions, io.cache_seqlens).
kf_status check_request_vector(const DLTensor* t, const char* name, const LayerDims& d) {
  KF_CHECK(check_dtype(t, name, kDtI32));
  KF_CHECK(check_shape(t, name, {d.max_batch}, "[config.max_batch]"));
  KF_CHECK(check_compact(t, name));
  return check_alignment(t, name, 4);
}

struct IoTensor {
  const DLTensor* t;
  const char* name;
};

kf_status check_io(const kf_layer_io& io, const LayerDims& d, LayerIo* out) {
  const IoTensor required[] = {{io.output, "io.output"},       {io.positions, "io.positions"},
                               {io.cache_seqlens, "io.cache_seqlens"},
                               {io.block_table, "io.block_table"}, {io.cos_sin, "io.cos_sin"}};
  for (const auto& [t, name] : required) {
    KF_CHECK(check_present(t, name));
    KF_CHECK(check_same_device(io.hidden, "io.hidden", t, name));
  }
  if (io.error_buffer) {
    KF_CHECK(check_present(io.error_buffer, "io.error_buffer"));
    KF_CHECK(check_same_device(io.hidden, "io.hidden", io.error_buffer, "io.error_buffer"));
    KF_CHECK(renamed(check_error_buffer(io.error_buffer), "error_buffer", "io.error_buffer"));
  }
  KF_CHECK(check_activation(io.hidden, "io.hidden", d));
  KF_CHECK(check_activation(io.output, "io.output", d));
  KF_CHECK(check_no_overlap(io.output, "io.output"));
  KF_CHECK(check_request_vector(io.positions, "io.positions", d));
  KF_CHECK(check_request_vector(io.cache_seqlens, "io.cache_seqlens", d));

  const DLTensor* bt = io.block_table;
  KF_CHECK(check_dtype(bt, "io.block_table", kDtI32));
  KF_CHECK(check_shape(bt, "io.block_table", {d.max_batch, d.max_pages_per_seq},
                       "[config.max_batch, config.max_pages_per_seq]"));
  KF_CHECK(check_last_contiguous(bt, "io.block_table"));
  KF_CHECK(check_alignment(bt, "io.block_table", 4));

  const DLTensor* cs = io.cos_sin;
  KF_CHECK(check_dtype(cs, "io.cos_sin", kDtF32));
  KF_CHECK(check_shape(cs, "io.cos_sin", {d.max_position, 2, d.rope / 2},
                       "[config.max_position, 2 (cos, sin), qk_rope_head_dim / 2]"));
  KF_CHECK(check_compact(cs, "io.cos_sin"));
  KF_CHECK(check_alignment(cs, "io.cos_sin", kRowAlign));

  *out = LayerIo{};
  out->hidden = reinterpret_cast<const uint16_t*>(data_address(io.hidden));
  out->output = reinterpret_cast<uint16_t*>(data_address(io.output));
  out->hidden_stride = stride_of(io.hidden, 0);
  out->output_stride = stride_of(io.output, 0);
  out->positions = reinterpret_cast<const int32_t*>(data_address(io.positions));
  out->cache_seqlens = reinterpret_cast<const int32_t*>(data_address(io.cache_seqlens));
  out->block_table = reinterpret_cast<const int32_t*>(data_address(bt));
  out->block_table_stride = stride_of(bt, 0);
  out->cos_sin = reinterpret_cast<const float*>(data_address(cs));
  out->error_buffer =
      io.error_buffer ? reinterpret_cast<int32_t*>(data_address(io.error_buffer)) : nullptr;
  return KF_SUCCESS;
}

kf_status check_workspace(const DLTensor* ws, const DLTensor* hidden, size_t need, int batch,
                          int num_workers, const Device& dev) {
  if (ws) {
    KF_CHECK(check_present(ws, "workspace"));
    KF_CHECK(check_same_device(hidden, "io.hidden", ws, "workspace"));
    KF_CHECK(check_dtype(ws, "workspace", kDtU8));
  }
  const int64_t have = ws ? bytes_of(ws) : 0;
  if (have < int64_t(need))
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "workspace: expected at least %zu bytes (kf_layer_workspace_size(config, "
                "batch=%d, num_workers=%d, device_id=%d)), got %s%" PRId64 " bytes",
                need, batch, num_workers, dev.cuda ? dev.id : -1, ws ? "" : "NULL, ", have);
  if (ws && have > 0) {
    KF_CHECK(check_compact(ws, "workspace"));
    KF_CHECK(check_alignment(ws, "workspace", kWorkspaceAlign));
  }
  return KF_SUCCESS;
}

int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

}  // namespace

kf_status validate_layer_config(const kf_layer_config* c, LayerDims* d) {
  if (c == nullptr)
    return fail(KF_ERROR_INVALID_ARGUMENT, "config: expected a pointer to a kf_layer_config, got NULL");
  const FixedDim fixed[] = {
      {"kv_lora_rank", c->kv_lora_rank, kLatentDim, "the cache row's latent"},
      {"qk_rope_head_dim", c->qk_rope_head_dim, kRopeDim, "the cache row's rope part"},
      {"qk_nope_head_dim", c->qk_nope_head_dim, 128, "DeepSeek's head geometry"},
      {"v_head_dim", c->v_head_dim, 128, "DeepSeek's head geometry"}};
  for (const FixedDim& f : fixed)
    if (f.value != f.want)
      return fail(KF_ERROR_UNSUPPORTED, "config.%s: only %d is supported (%s), got %d", f.field,
                  f.want, f.why, f.value);
  if (c->hidden_size < kDimMultiple || c->hidden_size > kMaxHidden ||
      c->hidden_size % kDimMultiple != 0)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "config.hidden_size: expected a multiple of %d in %d..%d, got %d", kDimMultiple,
                kDimMultiple, kMaxHidden, c->hidden_size);
  KF_CHECK(check_h_q(c->num_heads, "config.num_heads"));
  if (c->q_lora_rank < 0 || c->q_lora_rank > kMaxQLora || c->q_lora_rank % kDimMultiple != 0)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "config.q_lora_rank: expected 0 (no query compression) or a multiple of %d in "
                "%d..%d, got %d",
                kDimMultiple, kDimMultiple, kMaxQLora, c->q_lora_rank);
  const std::pair<float, const char*> positive[] = {{c->rms_norm_eps, "config.rms_norm_eps"},
                                                    {c->softmax_scale, "config.softmax_scale"}};
  for (const auto& [v, name] : positive)
    if (!(std::isfinite(v) && v > 0.f))
      return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a finite value > 0, got %g", name,
                  double(v));
  KF_CHECK(renamed(check_kv_format(c->kv_format), "kv_format", "config.kv_format"));
  if (c->kv_format == KF_KV_FP16)
    return fail(KF_ERROR_UNSUPPORTED,
                "config.kv_format: KF_KV_FP16 is not supported by the layer (its attention query "
                "rows are bf16); expected KF_KV_BF16, KF_KV_FP8_E4M3 or KF_KV_INT8");
  KF_CHECK(check_page_size(c->kv_format, c->page_size, "config.page_size"));
  KF_CHECK(check_range(c->max_batch, 1, KF_LAYER_MAX_BATCH, "config.max_batch"));
  if (c->max_pages_per_seq < 1 || int64_t(c->max_pages_per_seq) * c->page_size > INT32_MAX)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "config.max_pages_per_seq: expected 1..%d (max_pages_per_seq * page_size "
                "<= 2^31 - 1), got %d",
                INT32_MAX / c->page_size, c->max_pages_per_seq);
  KF_CHECK(check_range(c->max_position, 1, INT32_MAX, "config.max_position"));

  *d = LayerDims{};
  d->hidden = c->hidden_size;
  d->heads = c->num_heads;
  d->q_lora = c->q_lora_rank;
  d->kv_lora = c->kv_lora_rank;
  d->nope = c->qk_nope_head_dim;
  d->rope = c->qk_rope_head_dim;
  d->v = c->v_head_dim;
  d->eps = c->rms_norm_eps;
  d->softmax_scale = c->softmax_scale;
  d->kv_format = KvFormat(int(c->kv_format));
  d->page_size = c->page_size;
  d->page_shift = log2_exact(c->page_size);
  d->max_batch = c->max_batch;
  d->max_pages_per_seq = c->max_pages_per_seq;
  d->max_position = c->max_position;
  return KF_SUCCESS;
}

kf_status check_layer_batch(const LayerDims& d, int batch) {
  if (batch >= 1 && batch <= d.max_batch) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "batch: expected 1..%d (config.max_batch), got %d",
              d.max_batch, batch);
}

kf_status check_layer_num_workers(int num_workers) {
  if (num_workers >= 0 && num_workers <= kMaxWorkers) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "num_workers: expected 0 (the device default) or 1..%" PRId64 ", got %d",
              kMaxWorkers, num_workers);
}

kf_status resolve_layer_workers(const Device& dev, const LayerDims& d, int num_workers,
                                int* resolved) {
  if (num_workers > 0) {
    *resolved = num_workers;
    return KF_SUCCESS;
  }
  // One query row per head (s_q = 1): the decode default for this head count and format. Not the
  // count for the batch (kf_mla_default_num_workers_for_batch): the sm_90a 8-bit kernel that it
  // selects for large FP8 batches made the V2-Lite layer slower on the H200 (b = 64: 91.0 ->
  // 96.7 us per layer; docs/optimization/layer.md, layer-kv8-default), though level with the
  // portable kernel as a plain decode. A caller may still pass that count as num_workers.
  return kf_mla_default_num_workers_for_format(dev.cuda ? dev.id : -1, d.heads, 1,
                                               kf_kv_format(int(d.kv_format)), resolved);
}

size_t layer_workspace_bytes(const Device& dev, const LayerDims& d, int batch, int num_workers) {
  return dev.cuda ? layer_workspace_layout(d, batch, num_workers).total : 0;
}

kf_status validate_layer_graph_call(const LayerGraphArgs& a, Device* dev, LayerGraphParams* p,
                                    std::vector<LayerWeights>* weights) {
  LayerDims d;
  KF_CHECK(validate_layer_config(a.config, &d));
  KF_CHECK(check_range(a.num_layers, 1, kMaxLayers, "num_layers"));
  if (a.layers == nullptr)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "layers: expected an array of num_layers (%d) kf_layer_weights, got NULL",
                a.num_layers);
  if (a.io == nullptr)
    return fail(KF_ERROR_INVALID_ARGUMENT, "io: expected a pointer to a kf_layer_io, got NULL");
  KF_CHECK(check_layer_batch(d, a.batch));
  KF_CHECK(check_layer_num_workers(a.num_workers));

  const DLTensor* hidden = a.io->hidden;
  KF_CHECK(check_present(hidden, "io.hidden"));
  KF_CHECK(resolve_device(hidden, "io.hidden", dev));
  LayerIo io;
  KF_CHECK(check_io(*a.io, d, &io));
  weights->assign(size_t(a.num_layers), LayerWeights{});
  for (int l = 0; l < a.num_layers; ++l)
    KF_CHECK(check_layer(a.layers[l], l, d, hidden, &(*weights)[size_t(l)]));

  KF_CHECK(check_backend(*dev));
  int workers = 0;
  KF_CHECK(resolve_layer_workers(*dev, d, a.num_workers, &workers));
  const size_t need = layer_workspace_bytes(*dev, d, a.batch, workers);
  KF_CHECK(check_workspace(a.workspace, hidden, need, a.batch, workers, *dev));

  *p = LayerGraphParams{};
  p->dims = d;
  p->num_layers = a.num_layers;
  p->layers = weights->data();
  p->io = io;
  p->batch = a.batch;
  p->num_workers = workers;
  p->workspace = need > 0 ? reinterpret_cast<void*>(data_address(a.workspace)) : nullptr;
  p->workspace_bytes = need;
  return KF_SUCCESS;
}

}  // namespace kf::capi
