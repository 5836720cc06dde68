// The fused decode layer through the C API on CPU tensors: a small two-layer step (with and
// without query compression) against a float64 version of docs/spec.md section 3 written here,
// a bad position flagged in the error buffer, and every validation error of kf_layer_graph_create
// and kf_layer_workspace_size naming its argument with nothing written.
#include <functional>
#include <map>

#include "test_util.h"

using namespace kft;

namespace {

constexpr int kHidden = 64, kHeads = 2, kNope = 128, kRope = 64, kV = 128, kLatent = 512;
constexpr int kQk = kNope + kRope, kRow = 576;
constexpr int kPage = 16, kMaxBatch = 2, kMaxPages = 3, kNumPages = 5, kMaxPosition = 64;
constexpr int kLayers = 2;
constexpr float kEps = 1e-6f, kScale = 0.135234f;
constexpr int32_t kUnused = 0x7fffffff;  // block table entries past a request's pages: never read

using Tensors = std::map<std::string, HostTensor>;
using Rows = std::vector<std::vector<double>>;  // cache rows [len][576]

// Random bf16 values N(0, std^2) (or mean 1 for norm weights), stored and kept as doubles.
HostTensor random_bf16(std::mt19937_64& rng, std::vector<int64_t> shape, double mean, double std,
                       std::vector<double>* values) {
  HostTensor t(kBF16, shape);
  std::normal_distribution<double> normal(mean, std);
  values->resize(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.ptr<uint16_t>()[i] = to_bf16(float(normal(rng)));
    (*values)[size_t(i)] = from_bf16(t.ptr<uint16_t>()[i]);
  }
  return t;
}

// A valid call: two layers of bf16 weights, bf16 caches with scattered pages (NaN where no
// request has a row), requests of 20 and 5 cached positions appending one token each.
struct LayerCall {
  kf_layer_config config{};
  std::vector<Tensors> layers;  // by kf_layer_weights field name; absent = NULL
  std::vector<std::map<std::string, std::vector<double>>> w;  // the weights' values
  Tensors io;                   // by kf_layer_io field name
  std::vector<std::vector<Rows>> cache_rows;  // [layer][request]
  std::vector<int> seqlens{21, 6};
  std::vector<std::vector<int32_t>> table{{3, 0, kUnused}, {4, kUnused, kUnused}};
  std::vector<double> hidden;   // [batch, hidden]
  std::vector<double> cos_sin;  // [max_position, 2, 32]
  int batch = 2, num_layers = kLayers, num_workers = 0;
  bool workspace = false;
  HostTensor ws;

  explicit LayerCall(int q_lora, std::mt19937_64& rng) {
    config = kf_layer_config{kHidden, kHeads, q_lora, kLatent, kNope, kRope, kV, kEps, kScale,
                             KF_KV_BF16, kPage, kMaxBatch, kMaxPages, kMaxPosition};
    layers.resize(kLayers);
    w.resize(kLayers);
    cache_rows.resize(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      auto linear = [&](const char* name, int64_t out, int64_t in) {
        layers[l][name] = random_bf16(rng, {out, in}, 0.0, 1.0 / std::sqrt(double(in)), &w[l][name]);
      };
      auto norm = [&](const char* name, int64_t n) {
        layers[l][name] = random_bf16(rng, {n}, 1.0, 0.1, &w[l][name]);
      };
      if (q_lora == 0) {
        linear("w_q", kHeads * kQk, kHidden);
      } else {
        linear("w_q_a", q_lora, kHidden);
        norm("q_a_norm", q_lora);
        linear("w_q_b", kHeads * kQk, q_lora);
      }
      linear("w_kv_a", kRow, kHidden);
      norm("kv_a_norm", kLatent);
      linear("w_kv_b", kHeads * (kNope + kV), kLatent);
      linear("w_o", kHidden, kHeads * kV);

      HostTensor cache(kBF16, {kNumPages, kPage, kRow});
      cache.fill<uint16_t>(nan_16(true));
      std::normal_distribution<float> normal;
      cache_rows[l].resize(2);
      for (int r = 0; r < 2; ++r)
        for (int t = 0; t < seqlens[r] - 1; ++t) {
          uint16_t* row = cache.ptr<uint16_t>() + (int64_t(table[r][t / kPage]) * kPage + t % kPage) * kRow;
          std::vector<double> values(kRow);
          for (int d = 0; d < kRow; ++d) {
            row[d] = to_bf16(normal(rng));
            values[d] = from_bf16(row[d]);
          }
          cache_rows[l][r].push_back(values);
        }
      layers[l]["kv_cache"] = std::move(cache);
    }

    io["hidden"] = random_bf16(rng, {kMaxBatch, kHidden}, 0.0, 1.0, &hidden);
    io["output"] = HostTensor(kBF16, {kMaxBatch, kHidden});
    io["output"].fill<uint16_t>(nan_16(true));
    io["positions"] = HostTensor(kI32, {kMaxBatch});
    io["cache_seqlens"] = HostTensor(kI32, {kMaxBatch});
    io["block_table"] = HostTensor(kI32, {kMaxBatch, kMaxPages});
    for (int r = 0; r < 2; ++r) {
      io["cache_seqlens"].ptr<int32_t>()[r] = seqlens[r];
      io["positions"].ptr<int32_t>()[r] = seqlens[r] - 1;
      for (int j = 0; j < kMaxPages; ++j) io["block_table"].ptr<int32_t>()[r * kMaxPages + j] = table[r][j];
    }
    io["cos_sin"] = HostTensor(kF32, {kMaxPosition, 2, kRope / 2});
    cos_sin.resize(size_t(kMaxPosition) * kRope);
    for (int pos = 0; pos < kMaxPosition; ++pos)
      for (int i = 0; i < kRope / 2; ++i) {
        const double angle = pos * std::pow(10000.0, -2.0 * i / kRope);
        float* row = io["cos_sin"].ptr<float>() + pos * kRope;
        row[i] = float(std::cos(angle));
        row[kRope / 2 + i] = float(std::sin(angle));
        cos_sin[size_t(pos) * kRope + i] = row[i];
        cos_sin[size_t(pos) * kRope + kRope / 2 + i] = row[kRope / 2 + i];
      }
    io["error_buffer"] = HostTensor(kI32, {KF_ERROR_BUFFER_LEN});
    int32_t* eb = io["error_buffer"].ptr<int32_t>();
    eb[0] = 0, eb[1] = -1, eb[2] = 0, eb[3] = 0;
  }

  static const DLTensor* find(Tensors& m, const char* name) {
    auto it = m.find(name);
    return it == m.end() ? nullptr : it->second.dl();
  }

  kf_status create(kf_layer_graph** graph, const kf_layer_config* cfg = nullptr) {
    std::vector<kf_layer_weights> ws_(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      Tensors& t = layers[l];
      ws_[l] = kf_layer_weights{find(t, "w_q"),    find(t, "w_q_a"),     find(t, "q_a_norm"),
                                find(t, "w_q_b"),  find(t, "w_kv_a"),    find(t, "kv_a_norm"),
                                find(t, "w_kv_b"), find(t, "w_o"),
                                const_cast<DLTensor*>(find(t, "kv_cache"))};
    }
    const kf_layer_io io_{find(io, "hidden"),        const_cast<DLTensor*>(find(io, "output")),
                          find(io, "positions"),     find(io, "cache_seqlens"),
                          find(io, "block_table"),   find(io, "cos_sin"),
                          const_cast<DLTensor*>(find(io, "error_buffer"))};
    return kf_layer_graph_create(cfg ? cfg : &config, ws_.data(), num_layers, &io_, batch,
                                 num_workers, workspace ? ws.dl() : nullptr, graph);
  }

  std::vector<std::vector<uint8_t>> snapshot() {
    std::vector<std::vector<uint8_t>> s{io["output"].snapshot(), io["error_buffer"].snapshot()};
    for (Tensors& t : layers) s.push_back(t["kv_cache"].snapshot());
    return s;
  }
};

// ---- the float64 layer ------------------------------------------------------------------------

std::vector<double> matvec(const std::vector<double>& w, int out, int in, const double* x) {
  std::vector<double> y(size_t(out), 0.0);
  for (int n = 0; n < out; ++n)
    for (int k = 0; k < in; ++k) y[n] += w[size_t(n) * in + k] * x[k];
  return y;
}

void rms_norm(double* v, int n, const std::vector<double>& weight) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += v[i] * v[i];
  const double inv = 1.0 / std::sqrt(ss / n + double(kEps));
  for (int i = 0; i < n; ++i) v[i] *= inv * weight[i];
}

void rope(double* x, const double* cs) {
  for (int i = 0; i < kRope / 2; ++i) {
    const double c = cs[i], s = cs[kRope / 2 + i], x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

// docs/spec.md section 3 for request r: appends the new row (rounded to bf16, as the bf16 cache
// stores it) to `rows` and returns the layer's output rounded to bf16.
std::vector<double> reference_layer(const LayerCall& c, int l, int r, const std::vector<double>& x,
                                    Rows& rows) {
  const auto& w = c.w[size_t(l)];
  const int q_lora = c.config.q_lora_rank;
  std::vector<double> q;
  if (q_lora == 0) {
    q = matvec(w.at("w_q"), kHeads * kQk, kHidden, x.data());
  } else {
    std::vector<double> qa = matvec(w.at("w_q_a"), q_lora, kHidden, x.data());
    rms_norm(qa.data(), q_lora, w.at("q_a_norm"));
    q = matvec(w.at("w_q_b"), kHeads * kQk, q_lora, qa.data());
  }
  const double* cs = &c.cos_sin[size_t(c.seqlens[r] - 1) * kRope];
  std::vector<double> kv = matvec(w.at("w_kv_a"), kRow, kHidden, x.data());
  rms_norm(kv.data(), kLatent, w.at("kv_a_norm"));
  rope(kv.data() + kLatent, cs);
  for (double& v : kv) v = from_bf16(to_bf16(float(v)));
  rows.push_back(kv);

  const std::vector<double>& wkvb = w.at("w_kv_b");
  std::vector<double> o(size_t(kHeads) * kV, 0.0);
  for (int h = 0; h < kHeads; ++h) {
    double* qh = &q[size_t(h) * kQk];
    rope(qh + kNope, cs);
    std::vector<double> qa(kRow, 0.0);  // [q_lat | q_pe]
    for (int i = 0; i < kNope; ++i)
      for (int j = 0; j < kLatent; ++j) qa[j] += qh[i] * wkvb[(size_t(h) * (kNope + kV) + i) * kLatent + j];
    for (int i = 0; i < kRope; ++i) qa[kLatent + i] = qh[kNope + i];
    std::vector<double> score(rows.size());
    double mx = -INFINITY, sum = 0;
    for (size_t t = 0; t < rows.size(); ++t) {
      double dot = 0;
      for (int d = 0; d < kRow; ++d) dot += qa[d] * rows[t][d];
      score[t] = double(kScale) * dot;
      mx = std::max(mx, score[t]);
    }
    std::vector<double> o_lat(kLatent, 0.0);
    for (size_t t = 0; t < rows.size(); ++t) {
      const double p = std::exp(score[t] - mx);
      sum += p;
      for (int j = 0; j < kLatent; ++j) o_lat[j] += p * rows[t][j];
    }
    for (int i = 0; i < kV; ++i)
      for (int j = 0; j < kLatent; ++j)
        o[size_t(h) * kV + i] += wkvb[(size_t(h) * (kNope + kV) + kNope + i) * kLatent + j] * o_lat[j] / sum;
  }
  std::vector<double> y = matvec(w.at("w_o"), kHidden, kHeads * kV, o.data());
  for (double& v : y) v = from_bf16(to_bf16(float(v)));  // a layer's output is bf16
  return y;
}

class CpuLayer : public ::testing::TestWithParam<int> {};  // q_lora_rank

TEST_P(CpuLayer, MatchesFloat64Layer) {
  auto rng = test_rng(uint64_t(GetParam()));
  LayerCall c(GetParam(), rng);
  kf_layer_graph* graph = nullptr;
  ASSERT_EQ(c.create(&graph), KF_SUCCESS) << kf_last_error();
  int nodes = -1;
  ASSERT_EQ(kf_layer_graph_kernel_nodes(graph, &nodes), KF_SUCCESS);
  EXPECT_EQ(nodes, 0);
  ASSERT_EQ(kf_layer_graph_launch(graph, nullptr), KF_SUCCESS) << kf_last_error();

  for (int r = 0; r < c.batch; ++r) {
    std::vector<double> x(c.hidden.begin() + r * kHidden, c.hidden.begin() + (r + 1) * kHidden);
    for (int l = 0; l < kLayers; ++l) {
      x = reference_layer(c, l, r, x, c.cache_rows[size_t(l)][size_t(r)]);
      // The new row in the library's cache, at position seqlen - 1 of the request's pages.
      const int t = c.seqlens[r] - 1;
      const uint16_t* row = c.layers[size_t(l)]["kv_cache"].ptr<uint16_t>() +
                            (int64_t(c.table[r][t / kPage]) * kPage + t % kPage) * kRow;
      std::vector<double> got(kRow);
      for (int d = 0; d < kRow; ++d) got[d] = from_bf16(row[d]);
      EXPECT_LT(cosine_distance(got, c.cache_rows[size_t(l)][size_t(r)].back().data(), kRow), 1e-4)
          << "layer " << l << " request " << r;
    }
    std::vector<double> out(kHidden);
    for (int i = 0; i < kHidden; ++i) out[i] = from_bf16(c.io["output"].ptr<uint16_t>()[r * kHidden + i]);
    EXPECT_LT(cosine_distance(out, x.data(), kHidden), 1e-4) << "request " << r;
  }
  const int32_t* eb = c.io["error_buffer"].ptr<int32_t>();
  EXPECT_EQ(eb[0], 0);
  EXPECT_EQ(eb[1], -1);
  kf_layer_graph_destroy(graph);
}

INSTANTIATE_TEST_SUITE_P(QLora, CpuLayer, ::testing::Values(0, 64));

TEST(CpuLayerGuards, BadPositionIsFlaggedAndClamped) {
  auto rng = test_rng();
  LayerCall c(0, rng);
  kf_layer_graph* graph = nullptr;
  ASSERT_EQ(c.create(&graph), KF_SUCCESS) << kf_last_error();
  c.io["positions"].ptr<int32_t>()[1] = kMaxPosition + 3;  // between creation and launch
  ASSERT_EQ(kf_layer_graph_launch(graph, nullptr), KF_SUCCESS) << kf_last_error();
  const int32_t* eb = c.io["error_buffer"].ptr<int32_t>();
  EXPECT_EQ(eb[0], KF_DEVERR_SEQLEN_RANGE);
  EXPECT_EQ(eb[1], 1);
  EXPECT_EQ(eb[2], kMaxPosition + 3);
  for (int i = 0; i < kMaxBatch * kHidden; ++i)
    ASSERT_TRUE(std::isfinite(from_bf16(c.io["output"].ptr<uint16_t>()[i]))) << i;
  kf_layer_graph_destroy(graph);
}

TEST(CpuLayerSize, WorkspaceSizes) {
  auto rng = test_rng();
  LayerCall c(0, rng);
  size_t bytes = 1;
  ASSERT_EQ(kf_layer_workspace_size(&c.config, 2, 0, -1, &bytes), KF_SUCCESS) << kf_last_error();
  EXPECT_EQ(bytes, 0u);  // the CPU backend keeps its intermediates to itself
  ASSERT_EQ(kf_layer_workspace_size(&c.config, 2, 8, 0, &bytes), KF_SUCCESS) << kf_last_error();
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(bytes % 256, 0u);
  EXPECT_EQ(kf_layer_workspace_size(&c.config, 3, 8, 0, &bytes), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("batch: expected 1..2 (config.max_batch), got 3"),
            std::string::npos) << kf_last_error();
  EXPECT_EQ(kf_layer_workspace_size(&c.config, 1, 8, -2, &bytes), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("device_id: expected -1"), std::string::npos);
  EXPECT_EQ(kf_layer_workspace_size(&c.config, 1, 8, -1, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("bytes: expected a pointer"), std::string::npos);
}

TEST(CpuLayerHandle, NullGraph) {
  EXPECT_EQ(kf_layer_graph_launch(nullptr, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("graph: expected a graph made by kf_layer_graph_create"),
            std::string::npos);
  int nodes = 0;
  EXPECT_EQ(kf_layer_graph_kernel_nodes(nullptr, &nodes), KF_ERROR_INVALID_ARGUMENT);
  kf_layer_graph_destroy(nullptr);  // a no-op
}

// ---- validation: one broken thing per case ---------------------------------------------------

struct LayerErrorCase {
  const char* name;
  std::function<void(LayerCall&)> breaks;
  kf_status status;
  const char* message;  // a substring of kf_last_error()
};

std::ostream& operator<<(std::ostream& os, const LayerErrorCase& c) { return os << c.name; }

HostTensor bf16_tensor(std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  return HostTensor(kBF16, std::move(shape), std::move(strides));
}

const LayerErrorCase kLayerErrors[] = {
    {"config_heads", [](LayerCall& c) { c.config.num_heads = 0; }, KF_ERROR_INVALID_ARGUMENT,
     "config.num_heads: expected 1..128, got 0"},
    {"config_kv_lora", [](LayerCall& c) { c.config.kv_lora_rank = 256; }, KF_ERROR_UNSUPPORTED,
     "config.kv_lora_rank: only 512 is supported"},
    {"config_nope", [](LayerCall& c) { c.config.qk_nope_head_dim = 64; }, KF_ERROR_UNSUPPORTED,
     "config.qk_nope_head_dim: only 128 is supported"},
    {"config_hidden", [](LayerCall& c) { c.config.hidden_size = 100; }, KF_ERROR_INVALID_ARGUMENT,
     "config.hidden_size: expected a multiple of 64 in 64..16384, got 100"},
    {"config_q_lora", [](LayerCall& c) { c.config.q_lora_rank = 4160; }, KF_ERROR_INVALID_ARGUMENT,
     "config.q_lora_rank: expected 0 (no query compression) or a multiple of 64"},
    {"config_fp16", [](LayerCall& c) { c.config.kv_format = KF_KV_FP16; }, KF_ERROR_UNSUPPORTED,
     "config.kv_format: KF_KV_FP16 is not supported by the layer"},
    {"config_format", [](LayerCall& c) { c.config.kv_format = kf_kv_format(9); },
     KF_ERROR_INVALID_ARGUMENT, "config.kv_format: expected KF_KV_BF16"},
    {"config_page", [](LayerCall& c) { c.config.page_size = 24; }, KF_ERROR_INVALID_ARGUMENT,
     "config.page_size: expected a power of two"},
    {"config_scale", [](LayerCall& c) { c.config.softmax_scale = INFINITY; },
     KF_ERROR_INVALID_ARGUMENT, "config.softmax_scale: expected a finite value > 0"},
    {"config_eps", [](LayerCall& c) { c.config.rms_norm_eps = -1e-6f; }, KF_ERROR_INVALID_ARGUMENT,
     "config.rms_norm_eps: expected a finite value > 0"},
    {"config_max_batch", [](LayerCall& c) { c.config.max_batch = 129; }, KF_ERROR_INVALID_ARGUMENT,
     "config.max_batch: expected 1..128, got 129"},
    {"config_max_pages", [](LayerCall& c) { c.config.max_pages_per_seq = 0; },
     KF_ERROR_INVALID_ARGUMENT, "config.max_pages_per_seq: expected 1.."},
    {"batch_above_max", [](LayerCall& c) { c.batch = 3; }, KF_ERROR_INVALID_ARGUMENT,
     "batch: expected 1..2 (config.max_batch), got 3"},
    {"num_layers", [](LayerCall& c) { c.num_layers = 0; }, KF_ERROR_INVALID_ARGUMENT,
     "num_layers: expected 1..4096, got 0"},
    {"num_workers", [](LayerCall& c) { c.num_workers = -1; }, KF_ERROR_INVALID_ARGUMENT,
     "num_workers: expected 0 (the device default) or 1..65536, got -1"},
    {"w_kv_b_shape", [](LayerCall& c) { c.layers[1]["w_kv_b"] = bf16_tensor({512, 256}); },
     KF_ERROR_INVALID_ARGUMENT,
     "layers[1].w_kv_b: expected shape [512, 512] ([num_heads * (qk_nope_head_dim + v_head_dim), "
     "kv_lora_rank]), got [512, 256]"},
    {"w_o_missing", [](LayerCall& c) { c.layers[0].erase("w_o"); }, KF_ERROR_INVALID_ARGUMENT,
     "layers[0].w_o: expected a tensor, got NULL"},
    {"w_q_missing", [](LayerCall& c) { c.layers[1].erase("w_q"); }, KF_ERROR_INVALID_ARGUMENT,
     "layers[1].w_q: expected a tensor (config.q_lora_rank = 0"},
    {"q_lora_weights_given", [](LayerCall& c) { c.layers[0]["w_q_b"] = bf16_tensor({384, 64}); },
     KF_ERROR_INVALID_ARGUMENT, "layers[0].w_q_b: expected NULL when config.q_lora_rank = 0"},
    {"q_lora_config", [](LayerCall& c) { c.config.q_lora_rank = 64; }, KF_ERROR_INVALID_ARGUMENT,
     "layers[0].w_q: expected NULL when config.q_lora_rank = 64"},
    {"w_kv_a_dtype", [](LayerCall& c) { c.layers[0]["w_kv_a"] = HostTensor(kF16, {576, 64}); },
     KF_ERROR_INVALID_ARGUMENT, "layers[0].w_kv_a: expected dtype bfloat16, got float16"},
    {"w_o_strided", [](LayerCall& c) { c.layers[1]["w_o"] = bf16_tensor({64, 256}, {512, 2}); },
     KF_ERROR_INVALID_ARGUMENT, "layers[1].w_o: expected the last dimension contiguous"},
    {"norm_shape", [](LayerCall& c) { c.layers[0]["kv_a_norm"] = bf16_tensor({576}); },
     KF_ERROR_INVALID_ARGUMENT, "layers[0].kv_a_norm: expected shape [512] ([kv_lora_rank])"},
    {"cache_format",
     [](LayerCall& c) { c.layers[1]["kv_cache"] = HostTensor(kU8, {kNumPages, kPage, 644}); },
     KF_ERROR_INVALID_ARGUMENT,
     "layers[1].kv_cache: expected dtype bfloat16 for kv_format KF_KV_BF16, got uint8"},
    {"cache_page_size", [](LayerCall& c) { c.layers[0]["kv_cache"] = bf16_tensor({4, 32, 576}); },
     KF_ERROR_INVALID_ARGUMENT, "layers[0].kv_cache: expected page_size 16 (config.page_size)"},
    {"cache_8bit_for_bf16_layer", [](LayerCall& c) { c.config.kv_format = KF_KV_INT8; },
     KF_ERROR_INVALID_ARGUMENT,
     "layers[0].kv_cache: expected dtype uint8 for kv_format KF_KV_INT8, got bfloat16"},
    {"positions_dtype", [](LayerCall& c) { c.io["positions"] = HostTensor(kI64, {kMaxBatch}); },
     KF_ERROR_INVALID_ARGUMENT, "io.positions: expected dtype int32, got int64"},
    {"seqlens_shape", [](LayerCall& c) { c.io["cache_seqlens"] = HostTensor(kI32, {3}); },
     KF_ERROR_INVALID_ARGUMENT, "io.cache_seqlens: expected shape [2] ([config.max_batch]), got [3]"},
    {"table_shape", [](LayerCall& c) { c.io["block_table"] = HostTensor(kI32, {2, 4}); },
     KF_ERROR_INVALID_ARGUMENT, "io.block_table: expected shape [2, 3]"},
    {"cos_sin_shape", [](LayerCall& c) { c.io["cos_sin"] = HostTensor(kF32, {64, 64}); },
     KF_ERROR_INVALID_ARGUMENT, "io.cos_sin: expected shape [64, 2, 32]"},
    {"hidden_missing", [](LayerCall& c) { c.io.erase("hidden"); }, KF_ERROR_INVALID_ARGUMENT,
     "io.hidden: expected a tensor, got NULL"},
    {"output_dtype", [](LayerCall& c) { c.io["output"] = HostTensor(kF32, {kMaxBatch, kHidden}); },
     KF_ERROR_INVALID_ARGUMENT, "io.output: expected dtype bfloat16, got float32"},
    {"table_device", [](LayerCall& c) { c.io["block_table"].dl()->device = DLDevice{kDLCUDA, 0}; },
     KF_ERROR_INVALID_ARGUMENT,
     "io.block_table: expected device cpu (the device of io.hidden), got cuda:0"},
    {"weight_device", [](LayerCall& c) { c.layers[1]["w_kv_a"].dl()->device = DLDevice{kDLCUDA, 0}; },
     KF_ERROR_INVALID_ARGUMENT, "layers[1].w_kv_a: expected device cpu (the device of io.hidden)"},
    {"error_buffer_short", [](LayerCall& c) { c.io["error_buffer"] = HostTensor(kI32, {2}); },
     KF_ERROR_INVALID_ARGUMENT, "io.error_buffer: expected shape[0] (length) in 4.."},
    {"workspace_dtype",
     [](LayerCall& c) {
       c.workspace = true;
       c.ws = HostTensor(kF32, {64});
     },
     KF_ERROR_INVALID_ARGUMENT, "workspace: expected dtype uint8, got float32"},
};

class LayerErrors : public ::testing::TestWithParam<LayerErrorCase> {};

TEST_P(LayerErrors, NamesTheArgumentAndWritesNothing) {
  auto rng = test_rng();
  LayerCall c(0, rng);
  kf_layer_graph* graph = nullptr;
  ASSERT_EQ(c.create(&graph), KF_SUCCESS) << "the unbroken call must succeed: " << kf_last_error();
  kf_layer_graph_destroy(graph);

  GetParam().breaks(c);
  const auto before = c.snapshot();
  kf_layer_graph* untouched = reinterpret_cast<kf_layer_graph*>(uintptr_t(0x1234));
  EXPECT_EQ(c.create(&untouched), GetParam().status) << kf_last_error();
  EXPECT_NE(std::string(kf_last_error()).find(GetParam().message), std::string::npos)
      << "message: " << kf_last_error() << "\nexpected to contain: " << GetParam().message;
  EXPECT_EQ(untouched, reinterpret_cast<kf_layer_graph*>(uintptr_t(0x1234)));
  EXPECT_TRUE(before == c.snapshot()) << "a failed call wrote into a tensor";
}

INSTANTIATE_TEST_SUITE_P(Layer, LayerErrors, ::testing::ValuesIn(kLayerErrors),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(LayerErrorPointers, NullArguments) {
  auto rng = test_rng();
  LayerCall c(0, rng);
  EXPECT_EQ(c.create(nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("graph: expected a pointer"), std::string::npos);
  kf_layer_graph* graph = nullptr;
  EXPECT_EQ(kf_layer_graph_create(nullptr, nullptr, 1, nullptr, 1, 0, nullptr, &graph),
            KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("config: expected a pointer"), std::string::npos);
  EXPECT_EQ(kf_layer_graph_create(&c.config, nullptr, 1, nullptr, 1, 0, nullptr, &graph),
            KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("layers: expected an array"), std::string::npos);
  EXPECT_EQ(graph, nullptr);
}

}  // namespace
