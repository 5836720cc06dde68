// The fused decode layer on the CPU (docs/spec.md section 3), in fp32 from the bf16 weights.
// Each layer: q = x W_q^T (or the compressed query: rmsnorm(x W_q_a^T) * q_a_norm, then W_q_b),
// kv = x W_kv_a^T, c = rmsnorm(kv[:512]) * kv_a_norm, RoPE on q_pe and k_pe, the cache row
// [c | k_pe] written at position cache_seqlens[b] - 1, q_lat = q_nope W_UK per head, attention
// over the cache, o = W_UV o_lat per head, y = o W_o^T.
//
// Where the GPU graph stores a value in bf16 that another kernel reads, this backend rounds it
// the same way, so both compute the same function of their inputs:
//   - the cache row goes through cache_append's own code from a bf16 row (16-bit caches store
//     it, 8-bit caches quantize it to the bytes kf_cache_append writes);
//   - the attention is mla_decode's own code on a bf16 query [q_lat | q_pe] (the GPU's q_attn)
//     and gives a bf16 o_lat;
//   - each layer's output is rounded to bf16 before it feeds the next layer (the GPU keeps its
//     activations in bf16), and the last one is stored in io.output as bf16.
// Everything else (projections, norms, RoPE, the absorptions) stays fp32.
#include "cpu/layer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/half_convert.h"
#include "core/params.h"
#include "core/scheduler.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_util.h"
#include "cpu/kv_rows.h"

namespace kf::cpu {
namespace {

// Sum of a[i] * b[i] in 16 independent partial sums and a fixed tree: vectorizable without
// -ffast-math, and the same bits on every run.
float dot(const float* a, const float* b, int n) {
  float acc[16] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * b[i + k];
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  for (int s = 8; s > 0; s >>= 1)
    for (int k = 0; k < s; ++k) acc[k] += acc[k + s];
  return acc[0];
}

// y[m * y_stride + n] = <input(m, n), weight_row(n)> over `in` values, for m < rows and
// n < out; weight rows are bf16. Threads take the outputs n by a fixed stride and every value is
// one dot(), so the result does not depend on the thread count.
template <typename WeightRow, typename Input>
void project(int rows, int out, int in, WeightRow weight_row, Input input, float* y,
             int64_t y_stride) {
  run_threads(out, [&](int t, int nt) {
    std::vector<float> w(size_t(in), 0.f);
    for (int n = t; n < out; n += nt) {
      load_row_16(weight_row(n), DType::kBF16, in, w.data());
      for (int m = 0; m < rows; ++m) y[m * y_stride + n] = dot(input(m, n), w.data(), in);
    }
  });
}

// y = x W^T: x fp32 [rows, in] compact, W bf16 [out, in] (row stride w_stride), y [rows, out].
void linear(const float* x, int rows, int in, const uint16_t* w, int64_t w_stride, int out,
            float* y) {
  project(
      rows, out, in, [&](int n) { return w + n * w_stride; },
      [&](int m, int) { return x + int64_t(m) * in; }, y, out);
}

// v = v / sqrt(mean(v^2) + eps) * weight, in fp32 (weight bf16).
void rms_norm(float* v, int n, const uint16_t* weight, float eps) {
  const float inv = 1.f / std::sqrt(dot(v, v, n) / float(n) + eps);
  for (int i = 0; i < n; ++i) v[i] = v[i] * inv * bf16_to_float(weight[i]);
}

// RoPE on interleaved pairs: (x[2i], x[2i+1]) rotated by cos cs[i], sin cs[half + i] (one row
// [2, half] of the cos/sin table).
void rope(float* x, const float* cs, int half) {
  for (int i = 0; i < half; ++i) {
    const float c = cs[i], s = cs[half + i];
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

// What the step's static buffers let each request do; bad values are reported (kernelflow.h's
// device error flags) and made safe, as the GPU graph does: a length outside
// [1, max_pages_per_seq * page_size] writes no cache row and the attention sees the length
// clamped into [0, max_pages_per_seq * page_size]; a position outside [0, max_position) is
// clamped into it.
struct Step {
  std::vector<int32_t> seqlen;    // the lengths the attention sees
  std::vector<int32_t> position;  // the RoPE positions
  std::vector<bool> writes;       // whether the new row (position seqlen - 1) is written
  std::vector<int32_t> metadata;  // the decode schedule, shared by every layer
};

Step guard_step(const LayerGraphParams& p) {
  const LayerDims& d = p.dims;
  const LayerIo& io = p.io;
  const int64_t cap = int64_t(d.max_pages_per_seq) * d.page_size;
  Step s;
  s.seqlen.resize(size_t(p.batch));
  s.position.resize(size_t(p.batch));
  s.writes.resize(size_t(p.batch));
  for (int b = 0; b < p.batch; ++b) {
    const int32_t len = io.cache_seqlens[b];
    s.writes[b] = len >= 1 && len <= cap;
    if (!s.writes[b]) report_device_error(io.error_buffer, KF_DEVERR_SEQLEN_RANGE, b, len);
    s.seqlen[b] = int32_t(std::clamp<int64_t>(len, 0, cap));
    const int32_t pos = io.positions[b];
    if (pos < 0 || pos >= d.max_position)
      report_device_error(io.error_buffer, KF_DEVERR_SEQLEN_RANGE, b, pos);
    s.position[b] = std::clamp(pos, 0, d.max_position - 1);
  }
  s.metadata.resize(size_t(metadata_size(p.batch, p.num_workers)));
  MlaMetadataParams mp{};
  mp.cache_seqlens = s.seqlen.data();
  mp.batch = p.batch;
  mp.h_q = d.heads;
  mp.s_q = 1;
  mp.num_workers = p.num_workers;
  mp.fixed_cost = sched_fixed_cost(d.kv_format);
  mp.metadata = s.metadata.data();
  mla_metadata(mp);
  return s;
}

// fp32 intermediates of one layer for the whole batch (row b is request b).
struct Scratch {
  std::vector<float> x;          // [batch, hidden]: the layer's input
  std::vector<float> q_a;        // [batch, q_lora]
  std::vector<float> q;          // [batch, heads * 192]
  std::vector<float> kv;         // [batch, 576]
  std::vector<uint16_t> row;     // bf16 [batch, 576]: the cache rows
  std::vector<int64_t> slot;     // [batch]: their cache slots (-1: not written)
  std::vector<float> q_lat;      // [batch, heads, 512]
  std::vector<uint16_t> q_attn;  // bf16 [batch, heads, 576]: the attention's query
  std::vector<uint16_t> o_lat;   // bf16 [batch, heads, 512]: the attention's output
  std::vector<float> lse;        // [batch, heads]
  std::vector<float> o_accum, lse_accum;  // the attention's split partials
  std::vector<float> o;          // [batch, heads * v]
  std::vector<float> y;          // [batch, hidden]

  Scratch(const LayerDims& d, int batch, int num_workers) {
    const size_t b = size_t(batch), heads = size_t(d.heads);
    const size_t pieces = size_t(max_pieces(batch, num_workers));
    x.resize(b * d.hidden);
    q_a.resize(b * d.q_lora);
    q.resize(b * d.q_out());
    kv.resize(b * d.kv_a_out());
    row.resize(b * kHeadDim);
    slot.resize(b);
    q_lat.resize(b * heads * kLatentDim);
    q_attn.resize(b * heads * kHeadDim);
    o_lat.resize(b * heads * kLatentDim);
    lse.resize(b * heads);
    o_accum.resize(pieces * heads * kLatentDim);
    lse_accum.resize(pieces * heads);
    o.resize(b * d.o_in());
    y.resize(b * d.hidden);
  }
};

// Steps 1 and 3 for the query: q (both model shapes), then RoPE on every head's q_pe.
void query_projection(const LayerGraphParams& p, const LayerWeights& w, const Step& st,
                      Scratch& s) {
  const LayerDims& d = p.dims;
  if (d.q_lora == 0) {
    linear(s.x.data(), p.batch, d.hidden, w.w_q, w.w_q_stride, d.q_out(), s.q.data());
  } else {
    linear(s.x.data(), p.batch, d.hidden, w.w_q_a, w.w_q_a_stride, d.q_lora, s.q_a.data());
    for (int b = 0; b < p.batch; ++b)
      rms_norm(&s.q_a[size_t(b) * d.q_lora], d.q_lora, w.q_a_norm, d.eps);
    linear(s.q_a.data(), p.batch, d.q_lora, w.w_q_b, w.w_q_b_stride, d.q_out(), s.q.data());
  }
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < d.heads; ++h)
      rope(&s.q[size_t(b) * d.q_out() + size_t(h) * d.q_head() + d.nope],
           p.io.cos_sin + int64_t(st.position[b]) * d.rope, d.rope / 2);
}

// Steps 2 to 4: the cache row [rmsnorm(kv[:512]) * kv_a_norm | RoPE(kv[512:])] in bf16, written
// by cache_append at position seqlen - 1 of each request whose length and page are valid.
void write_cache_rows(const LayerGraphParams& p, const LayerWeights& w, const Step& st,
                      Scratch& s) {
  const LayerDims& d = p.dims;
  linear(s.x.data(), p.batch, d.hidden, w.w_kv_a, w.w_kv_a_stride, d.kv_a_out(), s.kv.data());
  for (int b = 0; b < p.batch; ++b) {
    float* kv = &s.kv[size_t(b) * d.kv_a_out()];
    rms_norm(kv, d.kv_lora, w.kv_a_norm, d.eps);
    rope(kv + d.kv_lora, p.io.cos_sin + int64_t(st.position[b]) * d.rope, d.rope / 2);
    for (int i = 0; i < kHeadDim; ++i) s.row[size_t(b) * kHeadDim + i] = float_to_bf16(kv[i]);

    s.slot[b] = -1;
    if (!st.writes[b]) continue;
    const int t = st.seqlen[b] - 1;
    const int page = p.io.block_table[b * p.io.block_table_stride + (t >> d.page_shift)];
    if (page < 0 || page >= w.num_pages) {
      report_device_error(p.io.error_buffer, KF_DEVERR_PAGE_RANGE, b, page);
      continue;
    }
    s.slot[b] = int64_t(page) * d.page_size + (t & (d.page_size - 1));
  }
  CacheAppendParams ap{};
  ap.dtype = DType::kBF16;
  ap.kv_format = d.kv_format;
  ap.num_tokens = p.batch;
  ap.page_size = d.page_size;
  ap.page_shift = d.page_shift;
  ap.num_pages = w.num_pages;
  ap.kv = s.row.data();
  ap.kv_row_stride = kHeadDim;
  ap.cache = w.kv_cache;
  ap.cache_page_stride = w.kv_page_stride;
  ap.cache_token_stride = w.kv_token_stride;
  ap.slot_mapping = s.slot.data();
  ap.error_buffer = nullptr;  // every slot given lies inside the cache
  cache_append(ap);
}

// Step 5 and the attention's query: q_lat[h] = q_nope[h] W_UK[h] (W_UK[h] = w_kv_b rows
// [h * 256, h * 256 + 128)), then q_attn[b][h] = bf16([q_lat | q_pe]).
void absorbed_query(const LayerGraphParams& p, const LayerWeights& w, Scratch& s) {
  const LayerDims& d = p.dims;
  run_threads(d.heads, [&](int t, int nt) {
    std::vector<float> w_uk(size_t(d.nope) * kLatentDim);
    for (int h = t; h < d.heads; h += nt) {
      for (int i = 0; i < d.nope; ++i)
        load_row_16(w.w_kv_b + (int64_t(h) * (d.nope + d.v) + i) * w.w_kv_b_stride, DType::kBF16,
                    kLatentDim, &w_uk[size_t(i) * kLatentDim]);
      for (int b = 0; b < p.batch; ++b) {
        const float* q_nope = &s.q[size_t(b) * d.q_out() + size_t(h) * d.q_head()];
        float* q_lat = &s.q_lat[(size_t(b) * d.heads + h) * kLatentDim];
        std::fill(q_lat, q_lat + kLatentDim, 0.f);
        for (int i = 0; i < d.nope; ++i) {
          const float a = q_nope[i];
          const float* row = &w_uk[size_t(i) * kLatentDim];
          for (int j = 0; j < kLatentDim; ++j) q_lat[j] += a * row[j];
        }
        uint16_t* q_attn = &s.q_attn[(size_t(b) * d.heads + h) * kHeadDim];
        for (int j = 0; j < kLatentDim; ++j) q_attn[j] = float_to_bf16(q_lat[j]);
        for (int i = 0; i < d.rope; ++i) q_attn[kLatentDim + i] = float_to_bf16(q_nope[d.nope + i]);
      }
    }
  });
}

// Step 6: mla_decode over the layer's cache with the step's lengths and schedule.
void attention(const LayerGraphParams& p, const LayerWeights& w, const Step& st, Scratch& s) {
  const MlaDecodeParams dp = layer_attention_params(
      p, w, {s.q_attn.data(), s.o_lat.data(), s.lse.data(), s.o_accum.data(), s.lse_accum.data(),
             st.seqlen.data(), st.metadata.data()});
  mla_decode(dp);
}

// Step 7: o[h] = W_UV[h] o_lat[h] (W_UV[h] = w_kv_b rows [h * 256 + 128, h * 256 + 256)), then
// y = o W_o^T.
void output_projection(const LayerGraphParams& p, const LayerWeights& w, Scratch& s) {
  const LayerDims& d = p.dims;
  std::vector<float> o_lat(s.o_lat.size());
  load_row_16(s.o_lat.data(), DType::kBF16, int(o_lat.size()), o_lat.data());
  project(
      p.batch, d.o_in(), kLatentDim,
      [&](int n) {
        const int h = n / d.v, i = n % d.v;
        return w.w_kv_b + (int64_t(h) * (d.nope + d.v) + d.nope + i) * w.w_kv_b_stride;
      },
      [&](int b, int n) { return &o_lat[(size_t(b) * d.heads + n / d.v) * kLatentDim]; },
      s.o.data(), d.o_in());
  linear(s.o.data(), p.batch, d.o_in(), w.w_o, w.w_o_stride, d.hidden, s.y.data());
}

}  // namespace

void decode_layers(const LayerGraphParams& p) {
  const LayerDims& d = p.dims;
  const Step st = guard_step(p);
  Scratch s(d, p.batch, p.num_workers);
  for (int b = 0; b < p.batch; ++b)
    load_row_16(p.io.hidden + b * p.io.hidden_stride, DType::kBF16, d.hidden,
                &s.x[size_t(b) * d.hidden]);
  for (int l = 0; l < p.num_layers; ++l) {
    const LayerWeights& w = p.layers[l];
    query_projection(p, w, st, s);
    write_cache_rows(p, w, st, s);
    absorbed_query(p, w, s);
    attention(p, w, st, s);
    output_projection(p, w, s);
    // The layer's output in bf16: the next layer's input, or io.output after the last layer.
    const bool last = l == p.num_layers - 1;
    for (int b = 0; b < p.batch; ++b)
      for (int i = 0; i < d.hidden; ++i) {
        const uint16_t y = float_to_bf16(s.y[size_t(b) * d.hidden + i]);
        if (last)
          p.io.output[b * p.io.output_stride + i] = y;
        else
          s.x[size_t(b) * d.hidden + i] = bf16_to_float(y);
      }
  }
}

}  // namespace kf::cpu
