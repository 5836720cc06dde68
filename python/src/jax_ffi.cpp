// kernelflow._jax_ffi: the library's calls as XLA FFI handlers, for jax.ffi.ffi_call
// (python/kernelflow/jax.py registers them and is the only caller).
//
// Each handler views XLA's buffers as DLTensors and calls the C API: on the CPU backend with no
// stream, on CUDA on the stream and device XLA runs the computation on. XLA hands custom calls
// compact row-major buffers, so every view has NULL strides. The CUDA handlers are marked
// command-buffer compatible: the C API's CUDA path launches kernels only (no allocation, no
// host synchronization, no host reads of device data), the decode's workspace is an XLA-owned
// result, and bad device-side values are clamped and flagged in an XLA-owned error buffer
// instead of being reported from the host, so XLA may record the calls into a CUDA graph.
//
// Targets (the same arguments on both platforms):
//   kernelflow_mla_metadata    cache_seqlens -> metadata; attrs h_q, s_q, num_workers, kv_format
//   kernelflow_mla_decode      q, kv_cache, block_table, cache_seqlens, metadata
//                              -> out, lse, workspace; attrs softmax_scale, kv_format
//   kernelflow_cache_append    kv, kv_cache, slot_mapping -> kv_cache (aliased); attr kv_format
//   kernelflow_cache_convert   src -> dst; attr kv_format
//   kernelflow_linear          x, weight -> out, workspace (zero-filled here before the call)
// and the *_checked variants of decode and append, which take an int32[4] error buffer as their
// last argument and return it (aliased) as their last result.
#include <kernelflow/kernelflow.h>
#include <nanobind/nanobind.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "jax_ffi_tensor.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;
using kf::jax_ffi::Place;
using kf::jax_ffi::View;

namespace {

// A failed kf_status as the error XLA raises in Python (JaxRuntimeError), naming the Python
// function and carrying the library's message.
ffi::Error check(kf_status status, const char* what) {
  if (status == KF_SUCCESS) return ffi::Error::Success();
  std::string msg = std::string("kernelflow.jax.") + what + ": " + kf_last_error();
  ffi::ErrorCode code = ffi::ErrorCode::kInternal;
  if (status == KF_ERROR_INVALID_ARGUMENT) code = ffi::ErrorCode::kInvalidArgument;
  if (status == KF_ERROR_UNSUPPORTED) code = ffi::ErrorCode::kUnimplemented;
  return ffi::Error(code, std::move(msg));
}

ffi::Error bad_attr(const char* what, const char* name, int32_t value) {
  return ffi::Error::InvalidArgument(std::string("kernelflow.jax.") + what + ": " + name +
                                     " attribute " + std::to_string(value) + " is out of range");
}

// ---- the calls, on any place --------------------------------------------------------------

ffi::Error metadata(Place place, ffi::AnyBuffer cache_seqlens, ffi::Result<ffi::AnyBuffer> out,
                    int32_t h_q, int32_t s_q, int32_t num_workers, int32_t kv_format) {
  if (!kf::jax_ffi::valid_format(kv_format)) return bad_attr("get_mla_metadata", "kv_format", kv_format);
  View seqlens, meta;
  if (auto e = seqlens.wrap(cache_seqlens, place, "cache_seqlens"); e.failure()) return e;
  if (auto e = meta.wrap(*out, place, "metadata"); e.failure()) return e;
  return check(kf_mla_metadata_for_format(&seqlens.dl, h_q, s_q, num_workers,
                                          static_cast<kf_kv_format>(kv_format), &meta.dl,
                                          place.stream),
               "get_mla_metadata");
}

ffi::Error decode(Place place, ffi::AnyBuffer q, ffi::AnyBuffer kv_cache,
                  ffi::AnyBuffer block_table, ffi::AnyBuffer cache_seqlens,
                  ffi::AnyBuffer metadata, ffi::Result<ffi::AnyBuffer> out,
                  ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> workspace,
                  DLTensor* error_buffer, float softmax_scale, int32_t kv_format) {
  if (!kf::jax_ffi::valid_format(kv_format)) return bad_attr("mla_decode", "kv_format", kv_format);
  View q_v, kv_v, bt_v, sl_v, md_v, out_v, lse_v, ws_v;
  for (auto [view, buffer, name] :
       {std::tuple{&q_v, &q, "q"}, {&kv_v, &kv_cache, "kv_cache"},
        {&bt_v, &block_table, "block_table"}, {&sl_v, &cache_seqlens, "cache_seqlens"},
        {&md_v, &metadata, "metadata"}, {&out_v, &*out, "out"}, {&lse_v, &*lse, "lse"}})
    if (auto e = view->wrap(*buffer, place, name); e.failure()) return e;
  if (auto e = ws_v.wrap_aligned_bytes(*workspace, place, "workspace"); e.failure()) return e;
  return check(kf_mla_decode(&q_v.dl, &kv_v.dl, static_cast<kf_kv_format>(kv_format), &bt_v.dl,
                             &sl_v.dl, &md_v.dl, softmax_scale, &out_v.dl, &lse_v.dl, &ws_v.dl,
                             error_buffer, place.stream),
               "mla_decode");
}

// An updated-in-place result (input_output_aliases): XLA normally gives it the argument's buffer;
// where the two differ, the argument's contents are copied into the result first, so the update
// always starts from what the caller passed.
ffi::Error start_from(const ffi::AnyBuffer& arg, ffi::Result<ffi::AnyBuffer>& result, Place place,
                      const char* name) {
  if (arg.untyped_data() == result->untyped_data()) return ffi::Error::Success();
  if (!kf::jax_ffi::copy_bytes(result->untyped_data(), arg.untyped_data(), arg.size_bytes(), place))
    return ffi::Error::Internal(std::string("kernelflow.jax: copying ") + name +
                                " into its aliased result failed");
  return ffi::Error::Success();
}

ffi::Error append(Place place, ffi::AnyBuffer kv, ffi::AnyBuffer cache_in,
                  ffi::Result<ffi::AnyBuffer> kv_cache, ffi::AnyBuffer slot_pairs,
                  DLTensor* error_buffer, int32_t kv_format) {
  if (!kf::jax_ffi::valid_format(kv_format)) return bad_attr("cache_append", "kv_format", kv_format);
  View kv_v, cache_v, slots_v;
  if (auto e = kv_v.wrap(kv, place, "kv"); e.failure()) return e;
  if (auto e = start_from(cache_in, kv_cache, place, "kv_cache"); e.failure()) return e;
  if (auto e = cache_v.wrap(*kv_cache, place, "kv_cache"); e.failure()) return e;
  if (auto e = slots_v.wrap_int64_pairs(slot_pairs, place, "slot_mapping"); e.failure()) return e;
  return check(kf_cache_append(&kv_v.dl, &cache_v.dl, static_cast<kf_kv_format>(kv_format),
                               &slots_v.dl, error_buffer, place.stream),
               "cache_append");
}

ffi::Error convert(Place place, ffi::AnyBuffer src, ffi::Result<ffi::AnyBuffer> dst,
                   int32_t kv_format) {
  if (!kf::jax_ffi::valid_format(kv_format)) return bad_attr("convert_cache", "kv_format", kv_format);
  View src_v, dst_v;
  if (auto e = src_v.wrap(src, place, "src"); e.failure()) return e;
  if (auto e = dst_v.wrap(*dst, place, "dst"); e.failure()) return e;
  return check(kf_cache_convert(&src_v.dl, &dst_v.dl, static_cast<kf_kv_format>(kv_format),
                                place.stream),
               "convert_cache");
}

// The workspace is an XLA-owned result, so it starts uninitialized: zero-filled on the stream
// first (kf_linear's rule), a memset XLA may record into a command buffer with the kernels.
ffi::Error linear(Place place, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                  ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace) {
  View x_v, w_v, out_v, ws_v;
  if (auto e = x_v.wrap(x, place, "x"); e.failure()) return e;
  if (auto e = w_v.wrap(weight, place, "weight"); e.failure()) return e;
  if (auto e = out_v.wrap(*out, place, "out"); e.failure()) return e;
  if (auto e = ws_v.wrap_aligned_bytes(*workspace, place, "workspace"); e.failure()) return e;
  if (!kf::jax_ffi::zero_bytes(ws_v.dl.data, size_t(ws_v.dl.shape[0]), place))
    return ffi::Error::Internal("kernelflow.jax: zero-filling linear's workspace failed");
  return check(kf_linear(&x_v.dl, &w_v.dl, &out_v.dl, &ws_v.dl, place.stream), "linear");
}

// The error-buffer argument of a *_checked target: the library writes into its aliased result,
// which starts from the argument's contents.
ffi::Error error_view(const ffi::AnyBuffer& arg, ffi::Result<ffi::AnyBuffer> result, Place place,
                      View* view) {
  if (auto e = start_from(arg, result, place, "error_buffer"); e.failure()) return e;
  return view->wrap(*result, place, "error_buffer");
}

ffi::Error decode_checked(Place place, ffi::AnyBuffer q, ffi::AnyBuffer kv_cache,
                          ffi::AnyBuffer block_table, ffi::AnyBuffer cache_seqlens,
                          ffi::AnyBuffer metadata, ffi::AnyBuffer error_in,
                          ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                          ffi::Result<ffi::AnyBuffer> workspace,
                          ffi::Result<ffi::AnyBuffer> error_out, float softmax_scale,
                          int32_t kv_format) {
  View errors;
  if (auto e = error_view(error_in, error_out, place, &errors); e.failure()) return e;
  return decode(place, q, kv_cache, block_table, cache_seqlens, metadata, out, lse, workspace,
                &errors.dl, softmax_scale, kv_format);
}

ffi::Error decode_unchecked(Place place, ffi::AnyBuffer q, ffi::AnyBuffer kv_cache,
                            ffi::AnyBuffer block_table, ffi::AnyBuffer cache_seqlens,
                            ffi::AnyBuffer metadata, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::AnyBuffer> lse,
                            ffi::Result<ffi::AnyBuffer> workspace, float softmax_scale,
                            int32_t kv_format) {
  return decode(place, q, kv_cache, block_table, cache_seqlens, metadata, out, lse, workspace,
                nullptr, softmax_scale, kv_format);
}

ffi::Error append_checked(Place place, ffi::AnyBuffer kv, ffi::AnyBuffer cache_in,
                          ffi::AnyBuffer slot_pairs, ffi::AnyBuffer error_in,
                          ffi::Result<ffi::AnyBuffer> kv_cache,
                          ffi::Result<ffi::AnyBuffer> error_out, int32_t kv_format) {
  View errors;
  if (auto e = error_view(error_in, error_out, place, &errors); e.failure()) return e;
  return append(place, kv, cache_in, kv_cache, slot_pairs, &errors.dl, kv_format);
}

ffi::Error append_unchecked(Place place, ffi::AnyBuffer kv, ffi::AnyBuffer cache_in,
                            ffi::AnyBuffer slot_pairs, ffi::Result<ffi::AnyBuffer> kv_cache,
                            int32_t kv_format) {
  return append(place, kv, cache_in, kv_cache, slot_pairs, nullptr, kv_format);
}

// ---- bindings: the same argument list on both platforms ----------------------------------

// CUDA handlers start with the stream and the device ordinal XLA runs on; CPU ones with
// nothing. `on<P>(fn)` turns either prefix into the Place the calls above take. The stream is
// bound as void*: it is the cudaStream_t the C API takes as void*, and the module then needs
// no CUDA headers.
enum class Platform { kCpu, kCuda };

template <Platform P>
auto bind() {
  if constexpr (P == Platform::kCuda)
    return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>();
  else
    return ffi::Ffi::Bind();
}

// The targets, in the order of kTargetNames; a CUDA handler counts its calls (CallCount).
enum Target {
  kMetadata, kDecode, kDecodeChecked, kAppend, kAppendChecked, kConvert, kLinear, kNumTargets
};
constexpr const char* kTargetNames[kNumTargets] = {
    "kernelflow_mla_metadata",       "kernelflow_mla_decode",
    "kernelflow_mla_decode_checked", "kernelflow_cache_append", "kernelflow_cache_append_checked",
    "kernelflow_cache_convert",      "kernelflow_linear"};

// Per CUDA target: the handler's calls, and those made while its stream was capturing (XLA
// recording the call into a command buffer). Replays of a recorded command buffer run the
// kernels without calling the handler, so neither count moves then. The cost per call: two
// relaxed atomic increments and one cudaStreamIsCapturing query.
struct CallCount {
  std::atomic<uint64_t> calls{0}, captured{0};
};
CallCount g_counts[kNumTargets];

template <Platform P, Target kT, typename Fn>
auto on(Fn fn) {
  if constexpr (P == Platform::kCuda)
    return [fn](void* stream, int32_t device, auto... args) {
      const Place place{DLDevice{kDLCUDA, device}, stream};
      g_counts[kT].calls.fetch_add(1, std::memory_order_relaxed);
      if (kf::jax_ffi::stream_capturing(place))
        g_counts[kT].captured.fetch_add(1, std::memory_order_relaxed);
      return fn(place, args...);
    };
  else
    return [fn](auto... args) { return fn(Place{DLDevice{kDLCPU, 0}, nullptr}, args...); };
}

template <Platform P>
auto metadata_binding() {
  return bind<P>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<int32_t>("h_q")
      .template Attr<int32_t>("s_q")
      .template Attr<int32_t>("num_workers")
      .template Attr<int32_t>("kv_format");
}

// The decode's operands: q, kv_cache, block_table, cache_seqlens, metadata (then the error
// buffer when checked); its results out, lse, workspace (then the error buffer).
template <Platform P, bool kChecked>
auto decode_binding() {
  auto args = bind<P>()
                  .template Arg<ffi::AnyBuffer>()
                  .template Arg<ffi::AnyBuffer>()
                  .template Arg<ffi::AnyBuffer>()
                  .template Arg<ffi::AnyBuffer>()
                  .template Arg<ffi::AnyBuffer>();
  auto rets = [&] {
    if constexpr (kChecked)
      return std::move(args)
          .template Arg<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>();
    else
      return std::move(args)
          .template Ret<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>();
  }();
  return std::move(rets).template Attr<float>("softmax_scale").template Attr<int32_t>("kv_format");
}

// kv, kv_cache, slot_mapping (then the error buffer when checked).
template <Platform P, bool kChecked>
auto append_binding() {
  auto args = bind<P>()
                  .template Arg<ffi::AnyBuffer>()
                  .template Arg<ffi::AnyBuffer>()
                  .template Arg<ffi::AnyBuffer>();
  auto rets = [&] {
    if constexpr (kChecked)
      return std::move(args)
          .template Arg<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>()
          .template Ret<ffi::AnyBuffer>();
    else
      return std::move(args).template Ret<ffi::AnyBuffer>();
  }();
  return std::move(rets).template Attr<int32_t>("kv_format");
}

template <Platform P>
auto convert_binding() {
  return bind<P>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<int32_t>("kv_format");
}

// x, weight; results out, workspace.
template <Platform P>
auto linear_binding() {
  return bind<P>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

// The handler object of a binding and a call; CUDA handlers may be recorded into command
// buffers (see the top of this file).
template <Platform P, Target kT, typename Binding, typename Fn>
auto make_handler(Binding binding, Fn fn) {
  if constexpr (P == Platform::kCuda)
    return std::move(binding).To(on<P, kT>(fn), {ffi::Traits::kCmdBufferCompatible});
  else
    return std::move(binding).To(on<P, kT>(fn));
}

template <Platform P> auto metadata_handler() { return make_handler<P, kMetadata>(metadata_binding<P>(), metadata); }
template <Platform P> auto decode_handler() { return make_handler<P, kDecode>(decode_binding<P, false>(), decode_unchecked); }
template <Platform P> auto decode_checked_handler() { return make_handler<P, kDecodeChecked>(decode_binding<P, true>(), decode_checked); }
template <Platform P> auto append_handler() { return make_handler<P, kAppend>(append_binding<P, false>(), append_unchecked); }
template <Platform P> auto append_checked_handler() { return make_handler<P, kAppendChecked>(append_binding<P, true>(), append_checked); }
template <Platform P> auto convert_handler() { return make_handler<P, kConvert>(convert_binding<P>(), convert); }
template <Platform P> auto linear_handler() { return make_handler<P, kLinear>(linear_binding<P>(), linear); }

// The C entry point XLA calls: the handler made once by `Make`, then called per execution.
template <auto Make>
XLA_FFI_Error* entry(XLA_FFI_CallFrame* call_frame) {
  static auto* handler = Make().release();
  return handler->Call(call_frame);
}

nb::capsule capsule(XLA_FFI_Handler* handler) {
  return nb::capsule(reinterpret_cast<void*>(handler));
}

// {target name: handler capsule} for one platform.
template <Platform P>
nb::dict targets() {
  nb::dict d;
  d[kTargetNames[kMetadata]] = capsule(entry<metadata_handler<P>>);
  d[kTargetNames[kDecode]] = capsule(entry<decode_handler<P>>);
  d[kTargetNames[kDecodeChecked]] = capsule(entry<decode_checked_handler<P>>);
  d[kTargetNames[kAppend]] = capsule(entry<append_handler<P>>);
  d[kTargetNames[kAppendChecked]] = capsule(entry<append_checked_handler<P>>);
  d[kTargetNames[kConvert]] = capsule(entry<convert_handler<P>>);
  d[kTargetNames[kLinear]] = capsule(entry<linear_handler<P>>);
  return d;
}

}  // namespace

NB_MODULE(_jax_ffi, m) {
  m.doc() = "XLA FFI handlers of the KernelFlow-ops C API (use kernelflow.jax, not this module)";
  m.def("targets", [] {
    nb::dict d;
    d["cpu"] = targets<Platform::kCpu>();
    d["CUDA"] = targets<Platform::kCuda>();
    return d;
  }, "{platform: {target name: handler capsule}} for jax.ffi.register_ffi_target.");
  m.def("cuda_call_counts", [] {
    nb::dict d;
    for (int t = 0; t < kNumTargets; ++t)
      d[kTargetNames[t]] = nb::make_tuple(g_counts[t].calls.load(), g_counts[t].captured.load());
    return d;
  }, "{target name: (calls, calls made while the stream was capturing)} of the CUDA handlers.");
}
