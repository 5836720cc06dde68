// kernelflow._C: one Python function per C API entry point. Arguments are converted to
// DLTensors, the GIL is released around the call, and a failed status becomes the Python
// exception that fits it, carrying kf_last_error() (kernelflow/_errors.py rewords its C names
// in Python terms). Everything else (defaults, range checks, allocation in the caller's
// framework, streams) lives in python/kernelflow/*.py.
#include <kernelflow/kernelflow.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensor.h"

namespace nb = nanobind;
using kf::py::as_input;
using kf::py::as_output;
using kf::py::Tensor;

namespace {

void check(kf_status status, const char* what) {
  if (status == KF_SUCCESS) return;
  std::string msg = kf_last_error();
  if (msg.empty()) msg = std::string(what) + ": " + kf_status_string(status);
  PyObject* type;
  switch (status) {
    case KF_ERROR_INVALID_ARGUMENT: type = PyExc_ValueError; break;
    case KF_ERROR_UNSUPPORTED: type = PyExc_NotImplementedError; break;
    default: type = PyExc_RuntimeError; break;  // KF_ERROR_CUDA, KF_ERROR_INTERNAL
  }
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}

// A C API call made with the GIL released (it may launch work, compute on the CPU backend or
// query the CUDA driver), then checked as check() does.
template <class Call>
void check_unlocked(const char* what, Call&& call) {
  kf_status st;
  {
    nb::gil_scoped_release unlocked;
    st = call();
  }
  check(st, what);
}

kf_kv_format as_format(int kv_format) {
  if (kv_format < KF_KV_BF16 || kv_format > KF_KV_INT8)
    throw nb::value_error(("kv_format: expected 0..3 (bf16, fp16, fp8_e4m3, int8), got " +
                           std::to_string(kv_format)).c_str());
  return static_cast<kf_kv_format>(kv_format);
}

void* as_stream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

size_t cache_bytes_per_token(int kv_format) {
  size_t bytes = 0;
  check(kf_cache_bytes_per_token(as_format(kv_format), &bytes), "kf_cache_bytes_per_token");
  return bytes;
}

size_t cache_bytes_per_page(int kv_format, int page_size) {
  size_t bytes = 0;
  check(kf_cache_bytes_per_page(as_format(kv_format), page_size, &bytes), "kf_cache_bytes_per_page");
  return bytes;
}

// batch 0: for any batch (kf_mla_default_num_workers_for_format), else for that batch.
int default_num_workers(int device_id, int h_q, int s_q, int kv_format, int batch) {
  int n = 0;
  const kf_kv_format fmt = as_format(kv_format);
  if (batch == 0)
    check_unlocked("kf_mla_default_num_workers_for_format", [&] {
      return kf_mla_default_num_workers_for_format(device_id, h_q, s_q, fmt, &n);
    });
  else
    check_unlocked("kf_mla_default_num_workers_for_batch", [&] {
      return kf_mla_default_num_workers_for_batch(device_id, h_q, s_q, fmt, batch, &n);
    });
  return n;
}

size_t metadata_size(int batch, int num_workers) {
  size_t n = 0;
  check(kf_mla_metadata_size(batch, num_workers, &n), "kf_mla_metadata_size");
  return n;
}

size_t workspace_size(int batch, int h_q, int s_q, int num_workers) {
  size_t bytes = 0;
  check(kf_mla_workspace_size(batch, h_q, s_q, num_workers, &bytes), "kf_mla_workspace_size");
  return bytes;
}

void mla_metadata(nb::handle cache_seqlens, int h_q, int s_q, int num_workers, int kv_format,
                  nb::handle metadata, uintptr_t stream) {
  const kf_kv_format fmt = as_format(kv_format);
  Tensor seqlens = as_input(cache_seqlens, "cache_seqlens");
  Tensor meta = as_output(metadata, "metadata");
  check_unlocked("kf_mla_metadata_for_format", [&] {
    return kf_mla_metadata_for_format(seqlens.in(), h_q, s_q, num_workers, fmt, meta.out(),
                                      as_stream(stream));
  });
}

void mla_decode(nb::handle q, nb::handle kv_cache, int kv_format, nb::handle block_table,
                nb::handle cache_seqlens, nb::handle metadata, float softmax_scale,
                nb::handle out, nb::handle lse, nb::handle workspace, nb::handle error_buffer,
                uintptr_t stream) {
  const kf_kv_format fmt = as_format(kv_format);
  Tensor q_t = as_input(q, "q");
  Tensor kv_t = as_input(kv_cache, "kv_cache");
  Tensor bt_t = as_input(block_table, "block_table");
  Tensor sl_t = as_input(cache_seqlens, "cache_seqlens");
  Tensor md_t = as_input(metadata, "metadata");
  Tensor out_t = as_output(out, "out");
  Tensor lse_t = as_output(lse, "lse");
  Tensor ws_t = as_output(workspace, "workspace", /*optional=*/true);
  Tensor eb_t = as_output(error_buffer, "error_buffer", /*optional=*/true);
  check_unlocked("kf_mla_decode", [&] {
    return kf_mla_decode(q_t.in(), kv_t.in(), fmt, bt_t.in(), sl_t.in(), md_t.in(), softmax_scale,
                         out_t.out(), lse_t.out(), ws_t.out(), eb_t.out(), as_stream(stream));
  });
}

void cache_append(nb::handle kv, nb::handle kv_cache, int kv_format, nb::handle slot_mapping,
                  nb::handle error_buffer, uintptr_t stream) {
  const kf_kv_format fmt = as_format(kv_format);
  Tensor kv_t = as_input(kv, "kv");
  Tensor cache_t = as_output(kv_cache, "kv_cache");
  Tensor slots_t = as_input(slot_mapping, "slot_mapping");
  Tensor eb_t = as_output(error_buffer, "error_buffer", /*optional=*/true);
  check_unlocked("kf_cache_append", [&] {
    return kf_cache_append(kv_t.in(), cache_t.out(), fmt, slots_t.in(), eb_t.out(),
                           as_stream(stream));
  });
}

void cache_convert(nb::handle src, nb::handle dst, int kv_format, uintptr_t stream) {
  const kf_kv_format fmt = as_format(kv_format);
  Tensor src_t = as_input(src, "src");
  Tensor dst_t = as_output(dst, "dst");
  check_unlocked("kf_cache_convert",
                 [&] { return kf_cache_convert(src_t.in(), dst_t.out(), fmt, as_stream(stream)); });
}

size_t linear_workspace_size(int m, int n, int k) {
  size_t bytes = 0;
  check(kf_linear_workspace_size(m, n, k, &bytes), "kf_linear_workspace_size");
  return bytes;
}

void linear(nb::handle x, nb::handle weight, nb::handle out, nb::handle workspace,
            uintptr_t stream) {
  Tensor x_t = as_input(x, "x");
  Tensor w_t = as_input(weight, "weight");
  Tensor out_t = as_output(out, "out");
  Tensor ws_t = as_output(workspace, "workspace", /*optional=*/true);
  check_unlocked("kf_linear", [&] {
    return kf_linear(x_t.in(), w_t.in(), out_t.out(), ws_t.out(), as_stream(stream));
  });
}

int cuda_device_count() {
  nb::gil_scoped_release unlocked;  // the first call initializes the CUDA driver
  return kf_cuda_device_count();
}

// ---- the fused decode layer ---------------------------------------------------------------

// kf_layer_config from a dict with its field names (kernelflow.LayerConfig, kv_format as its
// code); the library checks every value.
kf_layer_config layer_config(const nb::dict& c) {
  const auto i = [&](const char* key) { return nb::cast<int>(c[key]); };
  const auto f = [&](const char* key) { return nb::cast<float>(c[key]); };
  kf_layer_config cfg{};
  cfg.hidden_size = i("hidden_size");
  cfg.num_heads = i("num_heads");
  cfg.q_lora_rank = i("q_lora_rank");
  cfg.kv_lora_rank = i("kv_lora_rank");
  cfg.qk_nope_head_dim = i("qk_nope_head_dim");
  cfg.qk_rope_head_dim = i("qk_rope_head_dim");
  cfg.v_head_dim = i("v_head_dim");
  cfg.rms_norm_eps = f("rms_norm_eps");
  cfg.softmax_scale = f("softmax_scale");
  cfg.kv_format = static_cast<kf_kv_format>(i("kv_format"));
  cfg.page_size = i("page_size");
  cfg.max_batch = i("max_batch");
  cfg.max_pages_per_seq = i("max_pages_per_seq");
  cfg.max_position = i("max_position");
  return cfg;
}

// The tensors of one layer in kf_layer_weights' order: the flat list layer_graph_create takes
// holds LAYER_FIELDS of them per layer (None for an absent one).
constexpr const char* kLayerFields[] = {"w_q",       "w_q_a",  "q_a_norm", "w_q_b",   "w_kv_a",
                                        "kv_a_norm", "w_kv_b", "w_o",      "kv_cache"};
constexpr size_t kNumLayerFields = sizeof(kLayerFields) / sizeof(kLayerFields[0]);

// A graph made by kf_layer_graph_create, destroyed with its Python object (or by close()).
class LayerGraph {
 public:
  explicit LayerGraph(kf_layer_graph* graph) : graph_(graph) {}
  ~LayerGraph() { kf_layer_graph_destroy(graph_); }
  LayerGraph(const LayerGraph&) = delete;
  LayerGraph& operator=(const LayerGraph&) = delete;

  void launch(uintptr_t stream) {
    kf_layer_graph* graph = open();
    // The CPU backend computes the layers here.
    check_unlocked("kf_layer_graph_launch",
                   [&] { return kf_layer_graph_launch(graph, as_stream(stream)); });
  }
  int kernel_nodes() {
    int nodes = 0;
    check(kf_layer_graph_kernel_nodes(open(), &nodes), "kf_layer_graph_kernel_nodes");
    return nodes;
  }
  void close() {
    kf_layer_graph_destroy(graph_);
    graph_ = nullptr;
  }

 private:
  kf_layer_graph* open() const {
    if (graph_ == nullptr) throw nb::value_error("graph: closed (close() was called)");
    return graph_;
  }
  kf_layer_graph* graph_;
};

LayerGraph* layer_graph_create(const nb::dict& config, const nb::list& weights,
                               nb::handle hidden, nb::handle output, nb::handle positions,
                               nb::handle cache_seqlens, nb::handle block_table,
                               nb::handle cos_sin, nb::handle error_buffer, int batch,
                               int num_workers, nb::handle workspace) {
  const kf_layer_config cfg = layer_config(config);
  const size_t n = nb::len(weights);
  if (n == 0 || n % kNumLayerFields != 0)
    throw nb::value_error(("weights: expected " + std::to_string(kNumLayerFields) +
                           " entries per layer, got " + std::to_string(n)).c_str());
  const int num_layers = int(n / kNumLayerFields);
  std::vector<Tensor> tensors;
  tensors.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const std::string name = "layers[" + std::to_string(k / kNumLayerFields) + "]." +
                             kLayerFields[k % kNumLayerFields];
    const bool is_cache = k % kNumLayerFields == kNumLayerFields - 1;
    tensors.push_back(is_cache ? as_output(weights[k], name.c_str(), /*optional=*/true)
                               : as_input(weights[k], name.c_str(), /*optional=*/true));
  }
  std::vector<kf_layer_weights> layers(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    Tensor* t = &tensors[size_t(l) * kNumLayerFields];
    layers[size_t(l)] = kf_layer_weights{t[0].in(), t[1].in(), t[2].in(), t[3].in(), t[4].in(),
                                         t[5].in(), t[6].in(), t[7].in(), t[8].out()};
  }
  Tensor hidden_t = as_input(hidden, "io.hidden");
  Tensor output_t = as_output(output, "io.output");
  Tensor positions_t = as_input(positions, "io.positions");
  Tensor seqlens_t = as_input(cache_seqlens, "io.cache_seqlens");
  Tensor table_t = as_input(block_table, "io.block_table");
  Tensor cos_sin_t = as_input(cos_sin, "io.cos_sin");
  Tensor error_t = as_output(error_buffer, "io.error_buffer", /*optional=*/true);
  Tensor workspace_t = as_output(workspace, "workspace", /*optional=*/true);
  const kf_layer_io io{hidden_t.in(),  output_t.out(), positions_t.in(), seqlens_t.in(),
                       table_t.in(),   cos_sin_t.in(), error_t.out()};
  kf_layer_graph* graph = nullptr;
  check_unlocked("kf_layer_graph_create", [&] {  // a CUDA graph is captured and instantiated
    return kf_layer_graph_create(&cfg, layers.data(), num_layers, &io, batch, num_workers,
                                 workspace_t.out(), &graph);
  });
  return new LayerGraph(graph);
}

size_t layer_workspace_size(const nb::dict& config, int batch, int num_workers, int device_id) {
  const kf_layer_config cfg = layer_config(config);
  size_t bytes = 0;
  check_unlocked("kf_layer_workspace_size", [&] {  // may query the driver for the worker count
    return kf_layer_workspace_size(&cfg, batch, num_workers, device_id, &bytes);
  });
  return bytes;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "KernelFlow-ops C API bindings (use the kernelflow package, not this module)";

  m.def("version", [] { return std::string(kf_version()); });
  m.def("build_info", [] { return std::string(kf_build_info()); });
  m.def("last_error", [] { return std::string(kf_last_error()); });
  m.def("status_string", [](int s) { return std::string(kf_status_string(static_cast<kf_status>(s))); },
        nb::arg("status"));
  m.def("cuda_device_count", &cuda_device_count);

  m.def("cache_bytes_per_token", &cache_bytes_per_token, nb::arg("kv_format"));
  m.def("cache_bytes_per_page", &cache_bytes_per_page, nb::arg("kv_format"), nb::arg("page_size"));
  m.def("default_num_workers", &default_num_workers, nb::arg("device_id"), nb::arg("h_q"),
        nb::arg("s_q"), nb::arg("kv_format") = int(KF_KV_BF16), nb::arg("batch") = 0);
  m.def("metadata_size", &metadata_size, nb::arg("batch"), nb::arg("num_workers"));
  m.def("workspace_size", &workspace_size, nb::arg("batch"), nb::arg("h_q"), nb::arg("s_q"),
        nb::arg("num_workers"));

  m.def("mla_metadata", &mla_metadata, nb::arg("cache_seqlens"), nb::arg("h_q"), nb::arg("s_q"),
        nb::arg("num_workers"), nb::arg("kv_format"), nb::arg("metadata"),
        nb::arg("stream") = 0);
  m.def("mla_decode", &mla_decode, nb::arg("q"), nb::arg("kv_cache"), nb::arg("kv_format"),
        nb::arg("block_table"), nb::arg("cache_seqlens"), nb::arg("metadata"),
        nb::arg("softmax_scale"), nb::arg("out"), nb::arg("lse"),
        nb::arg("workspace").none() = nb::none(), nb::arg("error_buffer").none() = nb::none(),
        nb::arg("stream") = 0);
  m.def("cache_append", &cache_append, nb::arg("kv"), nb::arg("kv_cache"), nb::arg("kv_format"),
        nb::arg("slot_mapping"), nb::arg("error_buffer").none() = nb::none(),
        nb::arg("stream") = 0);
  m.def("cache_convert", &cache_convert, nb::arg("src"), nb::arg("dst"), nb::arg("kv_format"),
        nb::arg("stream") = 0);
  m.def("linear_workspace_size", &linear_workspace_size, nb::arg("m"), nb::arg("n"), nb::arg("k"));
  m.def("linear", &linear, nb::arg("x"), nb::arg("weight"), nb::arg("out"),
        nb::arg("workspace").none() = nb::none(),
        nb::arg("stream") = 0);
  // Private: kernelflow.DecodeGraph wraps it.
  nb::class_<LayerGraph>(m, "_LayerGraph")
      .def("launch", &LayerGraph::launch, nb::arg("stream") = 0)
      .def_prop_ro("kernel_nodes", &LayerGraph::kernel_nodes)
      .def("close", &LayerGraph::close);
  m.def("layer_graph_create", &layer_graph_create, nb::arg("config"), nb::arg("weights"),
        nb::arg("hidden"), nb::arg("output"), nb::arg("positions"), nb::arg("cache_seqlens"),
        nb::arg("block_table"), nb::arg("cos_sin"), nb::arg("error_buffer").none(),
        nb::arg("batch"), nb::arg("num_workers"), nb::arg("workspace").none(),
        nb::rv_policy::take_ownership);
  m.def("layer_workspace_size", &layer_workspace_size, nb::arg("config"), nb::arg("batch"),
        nb::arg("num_workers"), nb::arg("device_id"));
  m.def("describe", &kf::py::describe, nb::arg("array"),
        "The DLTensor the binding builds for an array: what the C API sees.");

  m.attr("KV_BF16") = int(KF_KV_BF16);
  m.attr("KV_FP16") = int(KF_KV_FP16);
  m.attr("KV_FP8_E4M3") = int(KF_KV_FP8_E4M3);
  m.attr("KV_INT8") = int(KF_KV_INT8);
  m.attr("HEAD_DIM") = KF_MLA_HEAD_DIM;
  m.attr("LATENT_DIM") = KF_MLA_LATENT_DIM;
  m.attr("ROPE_DIM") = KF_MLA_ROPE_DIM;
  m.attr("MAX_HEADS") = KF_MLA_MAX_HEADS;
  m.attr("MAX_SQ") = KF_MLA_MAX_SQ;
  m.attr("BYTES_PER_TOKEN_8BIT") = KF_BYTES_PER_TOKEN_8BIT;
  m.attr("ERROR_BUFFER_LEN") = KF_ERROR_BUFFER_LEN;
  m.attr("DEVERR_SEQLEN_RANGE") = KF_DEVERR_SEQLEN_RANGE;
  m.attr("DEVERR_PAGE_RANGE") = KF_DEVERR_PAGE_RANGE;
  m.attr("DEVERR_METADATA") = KF_DEVERR_METADATA;
  m.attr("DEVERR_SLOT_RANGE") = KF_DEVERR_SLOT_RANGE;
  m.attr("LAYER_MAX_BATCH") = KF_LAYER_MAX_BATCH;
  nb::list fields;
  for (const char* field : kLayerFields) fields.append(field);
  m.attr("LAYER_FIELDS") = nb::tuple(fields);
}
