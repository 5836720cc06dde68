#include "capi/mla_validate.h"

#include <cinttypes>
#include <climits>
#include <cmath>
#include <string>

#include "capi/error.h"
#include "capi/scalar_check.h"
#include "capi/tensor_check.h"
#include "core/kv_format8.h"
#include "core/scheduler.h"

namespace kf::capi {
namespace {

constexpr int kRowAlign = 16;       // bytes: kernels load q, cache and out rows 16 bytes at a time
constexpr int kRowAlignElems16 = 8;  // the same in 16-bit elements
constexpr int kWorkspaceAlign = 256;

DType dtype_of(DLDataType t) { return same_dtype(t, kDtBF16) ? DType::kBF16 : DType::kFP16; }

int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

// The 16-bit formats name the dtype of q / kv; the 8-bit formats take either.
kf_status check_format_dtype(kf_kv_format f, const DLTensor* t, const char* name) {
  if (f == KF_KV_BF16 && !same_dtype(t->dtype, kDtBF16))
    return fail(KF_ERROR_INVALID_ARGUMENT, "kv_format: KF_KV_BF16 needs %s of dtype bfloat16, got %s",
                name, dtype_name(t->dtype).c_str());
  if (f == KF_KV_FP16 && !same_dtype(t->dtype, kDtF16))
    return fail(KF_ERROR_INVALID_ARGUMENT, "kv_format: KF_KV_FP16 needs %s of dtype float16, got %s",
                name, dtype_name(t->dtype).c_str());
  return KF_SUCCESS;
}

}  // namespace

kf_status check_cache(const DLTensor* c, kf_kv_format f, DLDataType operand, CacheGeometry* g) {
  const char* name = "kv_cache";
  const bool q8 = f == KF_KV_FP8_E4M3 || f == KF_KV_INT8;
  const DLDataType want = q8 ? kDtU8 : operand;
  if (!same_dtype(c->dtype, want))
    return fail(KF_ERROR_INVALID_ARGUMENT, "kv_cache: expected dtype %s for kv_format %s, got %s",
                dtype_name(want).c_str(), kv_format_name(f), dtype_name(c->dtype).c_str());
  const int64_t row = q8 ? kBytesPerToken8bit : kHeadDim;
  if (c->ndim != 3 && c->ndim != 4)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "kv_cache: expected 3 dimensions [num_pages, page_size, %" PRId64
                "] (or 4 with a 1 before the last), got %d (shape %s)",
                row, c->ndim, shape_string(c).c_str());
  const int last = c->ndim - 1;
  if (c->ndim == 4) KF_CHECK(check_dim(c, name, 2, 1, "kv heads"));
  KF_CHECK(check_dim(c, name, last, row, q8 ? "bytes per token" : "head dim: 512 latent + 64 rope"));
  KF_CHECK(check_dim_range(c, name, 0, 1, INT32_MAX, "num_pages"));
  KF_CHECK(check_page_size(f, c->shape[1], "kv_cache: shape[1] (page_size)"));
  KF_CHECK(check_last_contiguous(c, name));
  const int page_size = int(c->shape[1]);
  if (!q8) {
    KF_CHECK(check_stride_multiple(c, name, 1, kRowAlignElems16, "16-byte aligned rows"));
    KF_CHECK(check_stride_multiple(c, name, 0, kRowAlignElems16, "16-byte aligned rows"));
  } else {
    if (page_size > 1 && raw_stride(c, 1) != kBytesPerToken8bit)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "kv_cache: expected a compact page (stride[1] = %d bytes), got stride[1] = %" PRId64,
                  kBytesPerToken8bit, raw_stride(c, 1));
    KF_CHECK(check_stride_multiple(c, name, 0, kRowAlign, "16-byte aligned pages"));
    if (c->shape[0] > 1 && raw_stride(c, 0) < kv8_page_bytes(page_size))
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "kv_cache: expected stride[0] >= page_size * %d = %" PRId64
                  " bytes (pages must not overlap), got %" PRId64,
                  kBytesPerToken8bit, kv8_page_bytes(page_size), raw_stride(c, 0));
  }
  KF_CHECK(check_alignment(c, name, kRowAlign));
  g->page_size = page_size;
  g->page_shift = log2_exact(page_size);
  g->num_pages = int(c->shape[0]);
  g->page_stride = stride_of(c, 0);
  g->token_stride = q8 ? kBytesPerToken8bit : stride_of(c, 1);
  return KF_SUCCESS;
}

kf_status check_error_buffer(const DLTensor* e) {
  const char* name = "error_buffer";
  KF_CHECK(check_dtype(e, name, kDtI32));
  KF_CHECK(check_ndim(e, name, 1, "[4]"));
  KF_CHECK(check_dim_range(e, name, 0, KF_ERROR_BUFFER_LEN, INT64_MAX, "length"));
  KF_CHECK(check_compact(e, name));
  return check_alignment(e, name, 4);
}

namespace {

// A 1-D compact int32 tensor of `len` elements (len < 0: any length).
kf_status check_int32_vector(const DLTensor* t, const char* name, int64_t len, const char* what) {
  KF_CHECK(check_dtype(t, name, kDtI32));
  KF_CHECK(check_ndim(t, name, 1, what));
  if (len >= 0) KF_CHECK(check_dim(t, name, 0, len, "batch (of q)"));
  KF_CHECK(check_compact(t, name));
  return check_alignment(t, name, 4);
}

}  // namespace

kf_status validate_metadata_call(const DLTensor* cache_seqlens, int h_q, int s_q, int num_workers,
                                 kf_kv_format kv_format, DLTensor* metadata, Device* dev,
                                 MlaMetadataParams* p) {
  KF_CHECK(check_kv_format(kv_format));
  KF_CHECK(check_present(cache_seqlens, "cache_seqlens"));
  KF_CHECK(check_present(metadata, "metadata"));
  KF_CHECK(resolve_device(cache_seqlens, "cache_seqlens", dev));
  KF_CHECK(check_same_device(cache_seqlens, "cache_seqlens", metadata, "metadata"));
  KF_CHECK(check_h_q(h_q, "h_q"));
  KF_CHECK(check_s_q(s_q, "s_q"));
  KF_CHECK(check_num_workers(num_workers, "num_workers"));
  KF_CHECK(check_int32_vector(cache_seqlens, "cache_seqlens", -1, "[b]"));
  KF_CHECK(check_dim_range(cache_seqlens, "cache_seqlens", 0, 1, kMaxBatch, "batch"));
  const int batch = int(cache_seqlens->shape[0]);
  KF_CHECK(check_int32_vector(metadata, "metadata", -1, "[kf_mla_metadata_size(b, num_workers)]"));
  const int64_t want = metadata_size(batch, num_workers);
  if (metadata->shape[0] != want)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "metadata: expected kf_mla_metadata_size(batch=%d, num_workers=%d) = %" PRId64
                " int32 elements, got %" PRId64,
                batch, num_workers, want, metadata->shape[0]);
  *p = MlaMetadataParams{};
  p->cache_seqlens = reinterpret_cast<const int32_t*>(data_address(cache_seqlens));
  p->batch = batch;
  p->h_q = h_q;
  p->s_q = s_q;
  p->num_workers = num_workers;
  p->fixed_cost = sched_fixed_cost(KvFormat(int(kv_format)));
  p->metadata = reinterpret_cast<int32_t*>(data_address(metadata));
  p->error_buffer = nullptr;
  return KF_SUCCESS;
}

kf_status validate_decode_call(const DecodeArgs& a, Device* dev, MlaDecodeParams* p) {
  const DLTensor* q = a.q;
  KF_CHECK(check_present(q, "q"));
  KF_CHECK(check_present(a.kv_cache, "kv_cache"));
  KF_CHECK(check_present(a.block_table, "block_table"));
  KF_CHECK(check_present(a.cache_seqlens, "cache_seqlens"));
  KF_CHECK(check_present(a.metadata, "metadata"));
  KF_CHECK(check_present(a.out, "out"));
  KF_CHECK(check_present(a.lse, "lse"));
  if (a.workspace) KF_CHECK(check_present(a.workspace, "workspace"));
  if (a.error_buffer) KF_CHECK(check_present(a.error_buffer, "error_buffer"));
  KF_CHECK(check_kv_format(a.kv_format));

  KF_CHECK(resolve_device(q, "q", dev));
  const std::pair<const DLTensor*, const char*> others[] = {
      {a.kv_cache, "kv_cache"}, {a.block_table, "block_table"}, {a.cache_seqlens, "cache_seqlens"},
      {a.metadata, "metadata"}, {a.out, "out"},                 {a.lse, "lse"},
      {a.workspace, "workspace"}, {a.error_buffer, "error_buffer"}};
  for (const auto& [t, name] : others)
    if (t) KF_CHECK(check_same_device(q, "q", t, name));

  // q [b, s_q, h_q, 576]
  KF_CHECK(check_dtype(q, "q", kDtBF16, kDtF16));
  KF_CHECK(check_ndim(q, "q", 4, "[b, s_q, h_q, 576]"));
  KF_CHECK(check_dim(q, "q", 3, kHeadDim, "head dim: 512 latent + 64 rope"));
  KF_CHECK(check_dim_range(q, "q", 0, 1, kMaxBatch, "batch"));
  KF_CHECK(check_dim_range(q, "q", 1, 1, KF_MLA_MAX_SQ, "s_q"));
  KF_CHECK(check_dim_range(q, "q", 2, 1, KF_MLA_MAX_HEADS, "h_q"));
  KF_CHECK(check_last_contiguous(q, "q"));
  for (int axis = 0; axis < 3; ++axis)
    KF_CHECK(check_stride_multiple(q, "q", axis, kRowAlignElems16, "16-byte aligned rows"));
  KF_CHECK(check_alignment(q, "q", kRowAlign));
  const int batch = int(q->shape[0]), s_q = int(q->shape[1]), h_q = int(q->shape[2]);

  KF_CHECK(check_format_dtype(a.kv_format, q, "q"));
  CacheGeometry g;
  KF_CHECK(check_cache(a.kv_cache, a.kv_format, q->dtype, &g));

  // block_table [b, max_pages_per_seq]
  const DLTensor* bt = a.block_table;
  KF_CHECK(check_dtype(bt, "block_table", kDtI32));
  KF_CHECK(check_ndim(bt, "block_table", 2, "[b, max_pages_per_seq]"));
  KF_CHECK(check_dim(bt, "block_table", 0, batch, "batch (of q)"));
  KF_CHECK(check_dim_range(bt, "block_table", 1, 1, INT32_MAX, "max_pages_per_seq"));
  KF_CHECK(check_last_contiguous(bt, "block_table"));
  KF_CHECK(check_alignment(bt, "block_table", 4));
  if (bt->shape[1] * g.page_size > INT32_MAX)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "block_table: expected max_pages_per_seq * page_size <= 2^31 - 1 (int32 lengths), "
                "got %" PRId64 " * %d",
                bt->shape[1], g.page_size);

  KF_CHECK(check_int32_vector(a.cache_seqlens, "cache_seqlens", batch, "[b]"));

  // metadata: the worker count comes from its size, 17 + b + 8 * num_workers.
  const DLTensor* md = a.metadata;
  KF_CHECK(check_int32_vector(md, "metadata", -1, "[kf_mla_metadata_size(b, num_workers)]"));
  const int64_t base = metadata_size(batch, 0);
  const int64_t rest = md->shape[0] - base;
  if (rest < kMetaWorkerLen || rest % kMetaWorkerLen != 0 || rest / kMetaWorkerLen > kMaxWorkers)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "metadata: expected kf_mla_metadata_size(batch=%d, num_workers) = %" PRId64
                " + %d * num_workers int32 elements (num_workers 1..%" PRId64 "), got %" PRId64,
                batch, base, kMetaWorkerLen, kMaxWorkers, md->shape[0]);
  const int num_workers = int(rest / kMetaWorkerLen);

  // out [b, s_q, h_q, 512]
  const DLTensor* out = a.out;
  if (!same_dtype(out->dtype, q->dtype))
    return fail(KF_ERROR_INVALID_ARGUMENT, "out: expected dtype %s (the dtype of q), got %s",
                dtype_name(q->dtype).c_str(), dtype_name(out->dtype).c_str());
  KF_CHECK(check_ndim(out, "out", 4, "[b, s_q, h_q, 512]"));
  KF_CHECK(check_dim(out, "out", 0, batch, "batch (of q)"));
  KF_CHECK(check_dim(out, "out", 1, s_q, "s_q (of q)"));
  KF_CHECK(check_dim(out, "out", 2, h_q, "h_q (of q)"));
  KF_CHECK(check_dim(out, "out", 3, kLatentDim, "latent dim"));
  KF_CHECK(check_last_contiguous(out, "out"));
  for (int axis = 0; axis < 3; ++axis)
    KF_CHECK(check_stride_multiple(out, "out", axis, kRowAlignElems16, "16-byte aligned rows"));
  KF_CHECK(check_no_overlap(out, "out"));
  KF_CHECK(check_alignment(out, "out", kRowAlign));

  // lse [b, h_q, s_q] fp32, compact
  const DLTensor* lse = a.lse;
  KF_CHECK(check_dtype(lse, "lse", kDtF32));
  KF_CHECK(check_ndim(lse, "lse", 3, "[b, h_q, s_q]"));
  KF_CHECK(check_dim(lse, "lse", 0, batch, "batch (of q)"));
  KF_CHECK(check_dim(lse, "lse", 1, h_q, "h_q (of q)"));
  KF_CHECK(check_dim(lse, "lse", 2, s_q, "s_q (of q)"));
  KF_CHECK(check_compact(lse, "lse"));
  KF_CHECK(check_alignment(lse, "lse", 4));

  // workspace: bytes of any dtype, compact, 256-byte aligned
  const int64_t need = workspace_bytes(batch, s_q * h_q, num_workers);
  const DLTensor* ws = a.workspace;
  const int64_t have = ws ? bytes_of(ws) : 0;
  if (have < need)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "workspace: expected at least %" PRId64
                " bytes (kf_mla_workspace_size(batch=%d, h_q=%d, s_q=%d, num_workers=%d)), got %s%" PRId64
                " bytes",
                need, batch, h_q, s_q, num_workers, ws ? "" : "NULL, ", have);
  if (ws && have > 0) {
    KF_CHECK(check_compact(ws, "workspace"));
    KF_CHECK(check_alignment(ws, "workspace", kWorkspaceAlign));
  }
  if (a.error_buffer) KF_CHECK(check_error_buffer(a.error_buffer));

  if (!std::isfinite(a.softmax_scale))
    return fail(KF_ERROR_INVALID_ARGUMENT, "softmax_scale: expected a finite value, got %g",
                double(a.softmax_scale));

  *p = MlaDecodeParams{};
  p->dtype = dtype_of(q->dtype);
  p->kv_format = KvFormat(int(a.kv_format));
  p->batch = batch;
  p->s_q = s_q;
  p->h_q = h_q;
  p->num_rows = s_q * h_q;
  p->page_size = g.page_size;
  p->page_shift = g.page_shift;
  p->num_pages = g.num_pages;
  p->max_pages_per_seq = int(bt->shape[1]);
  p->softmax_scale = a.softmax_scale;
  p->q = reinterpret_cast<const void*>(data_address(q));
  p->q_batch_stride = stride_of(q, 0);
  p->q_seq_stride = stride_of(q, 1);
  p->q_head_stride = stride_of(q, 2);
  p->kv = reinterpret_cast<const void*>(data_address(a.kv_cache));
  p->kv_page_stride = g.page_stride;
  p->kv_token_stride = g.token_stride;
  p->block_table = reinterpret_cast<const int32_t*>(data_address(bt));
  p->block_table_batch_stride = stride_of(bt, 0);
  p->cache_seqlens = reinterpret_cast<const int32_t*>(data_address(a.cache_seqlens));
  p->metadata = reinterpret_cast<const int32_t*>(data_address(md));
  p->num_workers = num_workers;
  p->out = reinterpret_cast<void*>(data_address(out));
  p->o_batch_stride = stride_of(out, 0);
  p->o_seq_stride = stride_of(out, 1);
  p->o_head_stride = stride_of(out, 2);
  p->lse = reinterpret_cast<float*>(data_address(lse));
  if (need > 0) {
    char* w = reinterpret_cast<char*>(data_address(ws));
    p->o_accum = reinterpret_cast<float*>(w);
    p->lse_accum =
        reinterpret_cast<float*>(w + workspace_o_accum_bytes(batch, p->num_rows, num_workers));
  }
  p->error_buffer = a.error_buffer ? reinterpret_cast<int32_t*>(data_address(a.error_buffer)) : nullptr;
  return KF_SUCCESS;
}

kf_status validate_append_call(const DLTensor* kv, DLTensor* kv_cache, kf_kv_format kv_format,
                               const DLTensor* slot_mapping, DLTensor* error_buffer, Device* dev,
                               CacheAppendParams* p) {
  KF_CHECK(check_present(kv, "kv"));
  KF_CHECK(check_present(kv_cache, "kv_cache"));
  KF_CHECK(check_present(slot_mapping, "slot_mapping"));
  if (error_buffer) KF_CHECK(check_present(error_buffer, "error_buffer"));
  KF_CHECK(check_kv_format(kv_format));
  KF_CHECK(resolve_device(kv, "kv", dev));
  KF_CHECK(check_same_device(kv, "kv", kv_cache, "kv_cache"));
  KF_CHECK(check_same_device(kv, "kv", slot_mapping, "slot_mapping"));
  if (error_buffer) KF_CHECK(check_same_device(kv, "kv", error_buffer, "error_buffer"));

  // kv [n, 576]
  KF_CHECK(check_dtype(kv, "kv", kDtBF16, kDtF16));
  KF_CHECK(check_ndim(kv, "kv", 2, "[n, 576]"));
  KF_CHECK(check_dim(kv, "kv", 1, kHeadDim, "head dim: 512 latent + 64 rope"));
  KF_CHECK(check_dim_range(kv, "kv", 0, 0, INT32_MAX, "num_tokens"));
  KF_CHECK(check_last_contiguous(kv, "kv"));
  KF_CHECK(check_stride_multiple(kv, "kv", 0, kRowAlignElems16, "16-byte aligned rows"));
  KF_CHECK(check_alignment(kv, "kv", kRowAlign));
  const int n = int(kv->shape[0]);

  KF_CHECK(check_format_dtype(kv_format, kv, "kv"));
  CacheGeometry g;
  KF_CHECK(check_cache(kv_cache, kv_format, kv->dtype, &g));
  KF_CHECK(check_no_overlap(kv_cache, "kv_cache"));

  // slot_mapping [n] int64
  KF_CHECK(check_dtype(slot_mapping, "slot_mapping", kDtI64));
  KF_CHECK(check_ndim(slot_mapping, "slot_mapping", 1, "[n]"));
  KF_CHECK(check_dim(slot_mapping, "slot_mapping", 0, n, "n (rows of kv)"));
  KF_CHECK(check_compact(slot_mapping, "slot_mapping"));
  KF_CHECK(check_alignment(slot_mapping, "slot_mapping", 8));
  if (error_buffer) KF_CHECK(check_error_buffer(error_buffer));

  *p = CacheAppendParams{};
  p->dtype = dtype_of(kv->dtype);
  p->kv_format = KvFormat(int(kv_format));
  p->num_tokens = n;
  p->page_size = g.page_size;
  p->page_shift = g.page_shift;
  p->num_pages = g.num_pages;
  p->kv = reinterpret_cast<const void*>(data_address(kv));
  p->kv_row_stride = stride_of(kv, 0);
  p->cache = reinterpret_cast<void*>(data_address(kv_cache));
  p->cache_page_stride = g.page_stride;
  p->cache_token_stride = g.token_stride;
  p->slot_mapping = reinterpret_cast<const int64_t*>(data_address(slot_mapping));
  p->error_buffer = error_buffer ? reinterpret_cast<int32_t*>(data_address(error_buffer)) : nullptr;
  return KF_SUCCESS;
}

kf_status validate_convert_call(const DLTensor* src_cache, DLTensor* dst_cache,
                                kf_kv_format dst_format, Device* dev, CacheConvertParams* p) {
  KF_CHECK(check_present(src_cache, "src_cache"));
  KF_CHECK(check_present(dst_cache, "dst_cache"));
  KF_CHECK(check_kv_format(dst_format));
  if (dst_format != KF_KV_FP8_E4M3 && dst_format != KF_KV_INT8)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "dst_format: expected KF_KV_FP8_E4M3 or KF_KV_INT8 (an 8-bit format), got %s",
                kv_format_name(dst_format));
  KF_CHECK(resolve_device(src_cache, "src_cache", dev));
  KF_CHECK(check_same_device(src_cache, "src_cache", dst_cache, "dst_cache"));

  // The source is a 16-bit cache in its own dtype; the page size must also suit the 8-bit format.
  KF_CHECK(check_dtype(src_cache, "src_cache", kDtBF16, kDtF16));
  const kf_kv_format src_format = same_dtype(src_cache->dtype, kDtBF16) ? KF_KV_BF16 : KF_KV_FP16;
  CacheGeometry gs, gd;
  // check_cache words its messages for "kv_cache": name the tensor of this call instead.
  const auto renamed = [](kf_status s, const char* name) {
    std::string m = last_error();
    if (m.rfind("kv_cache", 0) == 0) m = name + m.substr(8);
    return fail(s, "%s", m.c_str());
  };
  if (const kf_status s = check_cache(src_cache, src_format, src_cache->dtype, &gs); s != KF_SUCCESS)
    return renamed(s, "src_cache");
  if (const kf_status s = check_cache(dst_cache, dst_format, src_cache->dtype, &gd); s != KF_SUCCESS)
    return renamed(s, "dst_cache");
  if (gs.page_size != gd.page_size)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "dst_cache: expected page_size %d (of src_cache), got %d", gs.page_size,
                gd.page_size);
  KF_CHECK(check_page_size(dst_format, gs.page_size, "src_cache: shape[1] (page_size)"));
  if (gs.num_pages != gd.num_pages)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "dst_cache: expected num_pages %d (of src_cache), got %d", gs.num_pages,
                gd.num_pages);
  KF_CHECK(check_no_overlap(dst_cache, "dst_cache"));
  // Byte spans of the two caches must be disjoint (the conversion reads while it writes).
  const uint64_t s0 = data_address(src_cache), d0 = data_address(dst_cache);
  const uint64_t s1 = s0 + uint64_t(gs.num_pages - 1) * uint64_t(gs.page_stride) * 2 +
                      uint64_t(gs.page_size - 1) * uint64_t(gs.token_stride) * 2 + kHeadDim * 2;
  const uint64_t d1 = d0 + uint64_t(gd.num_pages - 1) * uint64_t(gd.page_stride) +
                      uint64_t(kv8_page_bytes(gd.page_size));
  if (s0 < d1 && d0 < s1)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "dst_cache: overlaps src_cache in memory; expected two separate caches");

  *p = CacheConvertParams{};
  p->src_dtype = dtype_of(src_cache->dtype);
  p->dst_format = KvFormat(int(dst_format));
  p->page_size = gs.page_size;
  p->page_shift = gs.page_shift;
  p->num_pages = gs.num_pages;
  p->src = reinterpret_cast<const void*>(s0);
  p->src_page_stride = gs.page_stride;
  p->src_token_stride = gs.token_stride;
  p->dst = reinterpret_cast<void*>(d0);
  p->dst_page_stride = gd.page_stride;
  return KF_SUCCESS;
}

}  // namespace kf::capi
