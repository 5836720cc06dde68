// CPU MLA decode: the structure of the GPU path in fp32. Each worker of the metadata decodes its
// pieces (a request's token range) tile by tile with an online softmax; a request with one piece
// writes out/lse directly, other pieces write normalized partials (o_accum, lse_accum) that a
// combine merges in piece order with core/softmax_merge.h. Rows are q's memory order (s, h).
// Non-finite values follow docs/spec.md section 6: a NaN or Inf that a row sees makes the row's
// out and lse NaN at every worker count; that needs IEEE arithmetic, hence the check below.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/half_convert.h"
#include "core/softmax_merge.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_util.h"
#include "cpu/kv_rows.h"

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "the CPU backend relies on IEEE NaN and Inf: build it without -ffast-math"
#endif

namespace kf::cpu {
namespace {

// 16 independent partial sums in a fixed tree: vectorizable without -ffast-math, deterministic.
inline float dot_head(const float* a, const float* b) {
  float acc[16] = {};
  for (int i = 0; i < kHeadDim; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[i + k] * b[i + k];
  for (int s = 8; s > 0; s >>= 1)
    for (int k = 0; k < s; ++k) acc[k] += acc[k + s];
  return acc[0];
}

// A finite score unchanged, +-Inf (and NaN) as NaN: an infinite score would otherwise become a
// weight of 0 or an exp(inf - inf) depending on the other scores; as NaN it poisons the row.
inline float nan_if_infinite(float s) { return s + (s - s); }

struct Scratch {
  std::vector<float> q;      // [rows, 576]
  std::vector<float> kv;     // [kSchedBlockN, 576]
  std::vector<float> acc;    // [rows, 512]
  std::vector<float> m, l;   // [rows]: running max, running sum
  std::vector<float> score;  // [kSchedBlockN]
  explicit Scratch(int rows)
      : q(size_t(rows) * kHeadDim), kv(size_t(kSchedBlockN) * kHeadDim),
        acc(size_t(rows) * kLatentDim), m(rows), l(rows), score(kSchedBlockN) {}
};

int page_of(const MlaDecodeParams& p, int req, int token) {
  const int page = p.block_table[int64_t(req) * p.block_table_batch_stride + (token >> p.page_shift)];
  return std::min(std::max(page, 0), p.num_pages - 1);  // bad entries were reported, clamp
}

void decode_piece(const MlaDecodeParams& p, const Piece& pc, int seqlen, Scratch& s) {
  const int rows = p.num_rows;
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  for (int i = 0; i < rows; ++i) {
    const int sq = i / p.h_q, h = i % p.h_q;
    load_row_16(q + pc.req * p.q_batch_stride + sq * p.q_seq_stride + h * p.q_head_stride, p.dtype,
                kHeadDim, &s.q[size_t(i) * kHeadDim]);
  }
  std::fill(s.m.begin(), s.m.end(), -INFINITY);
  std::fill(s.l.begin(), s.l.end(), 0.f);
  std::fill(s.acc.begin(), s.acc.end(), 0.f);

  for (int t0 = pc.token_begin; t0 < pc.token_end; t0 += kSchedBlockN) {
    const int n = std::min(kSchedBlockN, pc.token_end - t0);
    for (int j = 0; j < n; ++j) {
      const int t = t0 + j;
      load_kv_row(p, page_of(p, pc.req, t), t & (p.page_size - 1), &s.kv[size_t(j) * kHeadDim]);
    }
    for (int i = 0; i < rows; ++i) {
      // Causal limit of the row's query; tokens past it (and past seqlen) are never read.
      const int nv = std::min(t0 + n, visible_len(seqlen, p.s_q, i / p.h_q)) - t0;
      if (nv <= 0) continue;
      const float* qi = &s.q[size_t(i) * kHeadDim];
      float mx = s.m[i];
      for (int j = 0; j < nv; ++j) {
        s.score[j] = nan_if_infinite(p.softmax_scale * dot_head(qi, &s.kv[size_t(j) * kHeadDim]));
        mx = nan_max(mx, s.score[j]);
      }
      float* acc = &s.acc[size_t(i) * kLatentDim];
      const float corr = expf(s.m[i] - mx);  // 0 on the first visible tile (m = -inf, mx not)
      float l = s.l[i] * corr;
      for (int d = 0; d < kLatentDim; ++d) acc[d] *= corr;
      for (int j = 0; j < nv; ++j) {
        const float pj = expf(s.score[j] - mx);
        l += pj;
        const float* v = &s.kv[size_t(j) * kHeadDim];
        for (int d = 0; d < kLatentDim; ++d) acc[d] += pj * v[d];
      }
      s.m[i] = mx;
      s.l[i] = l;
    }
  }

  for (int i = 0; i < rows; ++i) {
    const int sq = i / p.h_q, h = i % p.h_q;
    const bool empty = s.l[i] == 0.f;  // the row saw no position (a NaN l is not empty)
    const float inv = empty ? 0.f : 1.f / s.l[i];
    const float lse = empty ? -INFINITY : s.m[i] + logf(s.l[i]);
    const float* acc = &s.acc[size_t(i) * kLatentDim];
    if (pc.only_piece) {
      uint16_t* o = static_cast<uint16_t*>(p.out) + pc.req * p.o_batch_stride + sq * p.o_seq_stride +
                    h * p.o_head_stride;
      for (int d = 0; d < kLatentDim; ++d) o[d] = store_16(acc[d] * inv, p.dtype);
      p.lse[(int64_t(pc.req) * p.h_q + h) * p.s_q + sq] = lse;
    } else {
      float* o = p.o_accum + (int64_t(pc.piece) * rows + i) * kLatentDim;
      for (int d = 0; d < kLatentDim; ++d) o[d] = acc[d] * inv;
      p.lse_accum[int64_t(pc.piece) * rows + i] = lse;
    }
  }
}

// Merge request r's pieces [first, last) in piece order.
void combine_request(const MlaDecodeParams& p, int r, int first, int last, std::vector<float>& o) {
  const int rows = p.num_rows;
  for (int i = 0; i < rows; ++i) {
    float max_lse = -INFINITY;
    for (int k = first; k < last; ++k)
      max_lse = nan_max(max_lse, p.lse_accum[int64_t(k) * rows + i]);
    float sum_exp = 0.f;
    if (max_lse != -INFINITY)
      for (int k = first; k < last; ++k)
        sum_exp += expf(p.lse_accum[int64_t(k) * rows + i] - max_lse);
    const float lse = merged_lse(max_lse, sum_exp);
    std::fill(o.begin(), o.end(), 0.f);
    for (int k = first; k < last; ++k) {
      const float w = piece_weight(p.lse_accum[int64_t(k) * rows + i], lse);
      if (w == 0.f) continue;  // an empty piece: its o_accum is zero, skip the read
      const float* ok = p.o_accum + (int64_t(k) * rows + i) * kLatentDim;
      for (int d = 0; d < kLatentDim; ++d) o[d] += w * ok[d];
    }
    const int sq = i / p.h_q, h = i % p.h_q;
    uint16_t* out = static_cast<uint16_t*>(p.out) + r * p.o_batch_stride + sq * p.o_seq_stride +
                    h * p.o_head_stride;
    for (int d = 0; d < kLatentDim; ++d) out[d] = store_16(o[d], p.dtype);
    p.lse[(int64_t(r) * p.h_q + h) * p.s_q + sq] = lse;
  }
}

bool metadata_fits(const MlaDecodeParams& p) {
  const int32_t* m = p.metadata;
  return m[kMetaMagicIdx] == kMetaMagic && m[kMetaVersionIdx] == kMetaVersion &&
         m[kMetaBatchIdx] == p.batch && m[kMetaHqIdx] == p.h_q && m[kMetaSqIdx] == p.s_q &&
         m[kMetaWorkersIdx] == p.num_workers;
}

}  // namespace

void mla_decode(const MlaDecodeParams& p) {
  if (!metadata_fits(p)) {
    report_device_error(p.error_buffer, KF_DEVERR_METADATA, 0, p.metadata[kMetaMagicIdx]);
    return;
  }
  // Clamp lengths to what the block table addresses and check the pages in use, as the kernels
  // do; the C API has already refused such values for CPU tensors.
  const int64_t cap = int64_t(p.max_pages_per_seq) * p.page_size;
  std::vector<int> seqlens(p.batch);
  for (int r = 0; r < p.batch; ++r) {
    int64_t len = p.cache_seqlens[r];
    if (len < 0 || len > cap) {
      report_device_error(p.error_buffer, KF_DEVERR_SEQLEN_RANGE, r, len);
      len = std::min(std::max<int64_t>(len, 0), cap);
    }
    seqlens[r] = int(len);
    const int pages = ceil_div(seqlens[r], p.page_size);
    for (int j = 0; j < pages; ++j) {
      const int page = p.block_table[int64_t(r) * p.block_table_batch_stride + j];
      if (page < 0 || page >= p.num_pages)
        report_device_error(p.error_buffer, KF_DEVERR_PAGE_RANGE, r, page);
    }
  }
  const auto seqlen_of = [&](int r) { return seqlens[r]; };

  run_threads(p.num_workers, [&](int t, int nt) {
    Scratch s(p.num_rows);
    for (int w = t; w < p.num_workers; w += nt)
      for_each_piece(p.metadata, w, seqlen_of,
                     [&](const Piece& pc) { decode_piece(p, pc, seqlens[pc.req], s); });
  });

  const int32_t* piece_offset = meta_piece_offset(p.metadata, p.num_workers);
  run_threads(p.batch, [&](int t, int nt) {
    std::vector<float> o(kLatentDim);
    for (int r = t; r < p.batch; r += nt)
      if (piece_offset[r + 1] - piece_offset[r] > 1)
        combine_request(p, r, piece_offset[r], piece_offset[r + 1], o);
  });
}

}  // namespace kf::cpu
