#include "capi/host_check.h"

#include <cinttypes>
#include <vector>

#include "capi/error.h"

namespace kf::capi {
namespace {

kf_status check_header_field(const int32_t* meta, int idx, int32_t want, const char* field) {
  if (meta[idx] == want) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "metadata: expected %s %d (of this call), got %d: make it with "
              "kf_mla_metadata_for_format for this batch",
              field, want, meta[idx]);
}

}  // namespace

kf_status check_metadata_seqlens_host(const MlaMetadataParams& p) {
  for (int r = 0; r < p.batch; ++r)
    if (p.cache_seqlens[r] < 0)
      return fail(KF_ERROR_INVALID_ARGUMENT, "cache_seqlens[%d] = %d: expected >= 0", r,
                  p.cache_seqlens[r]);
  return KF_SUCCESS;
}

kf_status check_decode_contents_host(const MlaDecodeParams& p) {
  const int64_t cap = int64_t(p.max_pages_per_seq) * p.page_size;
  for (int r = 0; r < p.batch; ++r) {
    const int32_t len = p.cache_seqlens[r];
    if (len < 0 || len > cap)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "cache_seqlens[%d] = %d: expected 0..%" PRId64
                  " (max_pages_per_seq %d * page_size %d)",
                  r, len, cap, p.max_pages_per_seq, p.page_size);
    const int pages = ceil_div(len, p.page_size);
    const int32_t* row = p.block_table + int64_t(r) * p.block_table_batch_stride;
    for (int j = 0; j < pages; ++j)
      if (row[j] < 0 || row[j] >= p.num_pages)
        return fail(KF_ERROR_INVALID_ARGUMENT,
                    "block_table[%d, %d] = %d: expected a page index in [0, %d) (num_pages of "
                    "kv_cache); request %d uses its first %d entries",
                    r, j, row[j], p.num_pages, r, pages);
  }

  const int32_t* meta = p.metadata;
  if (meta[kMetaMagicIdx] != kMetaMagic || meta[kMetaVersionIdx] != kMetaVersion)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "metadata: expected magic 0x%08X version %d (made by kf_mla_metadata_for_format), "
                "got 0x%08X version %d",
                unsigned(kMetaMagic), kMetaVersion, unsigned(meta[kMetaMagicIdx]),
                meta[kMetaVersionIdx]);
  KF_CHECK(check_header_field(meta, kMetaBatchIdx, p.batch, "batch"));
  KF_CHECK(check_header_field(meta, kMetaHqIdx, p.h_q, "h_q"));
  KF_CHECK(check_header_field(meta, kMetaSqIdx, p.s_q, "s_q"));
  KF_CHECK(check_header_field(meta, kMetaWorkersIdx, p.num_workers, "num_workers"));

  // The schedule depends on the lengths only through their tile counts: rebuild it (with the
  // fixed cost it was made with) and compare, so metadata left over from other lengths cannot
  // drop or repeat positions.
  const int32_t fixed_cost = meta[kMetaFixedCostIdx];
  if (fixed_cost < 0 || fixed_cost > kMaxFixedCost)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "metadata: fixed cost %d out of range 0..%d: make it with "
                "kf_mla_metadata_for_format",
                fixed_cost, kMaxFixedCost);
  const int32_t spread = meta[kMetaSpreadIdx];
  if (spread != 0 && spread != 1)
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "metadata: placement word %d is neither 0 nor 1: make it with "
                "kf_mla_metadata_for_format",
                spread);
  std::vector<int32_t> seqlens(p.cache_seqlens, p.cache_seqlens + p.batch);
  std::vector<int32_t> want(size_t(metadata_size(p.batch, p.num_workers)));
  build_schedule(seqlens.data(), p.batch, p.h_q, p.s_q, p.num_workers, fixed_cost, spread == 1,
                 want.data());
  for (size_t i = 0; i < want.size(); ++i)
    if (meta[i] != want[i])
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "metadata: does not match cache_seqlens (element %zu: expected %d, got %d); "
                  "rebuild it with kf_mla_metadata_for_format after the lengths change",
                  i, want[i], meta[i]);
  return KF_SUCCESS;
}

kf_status check_append_contents_host(const CacheAppendParams& p) {
  const int64_t num_slots = int64_t(p.num_pages) * p.page_size;
  for (int i = 0; i < p.num_tokens; ++i)
    if (p.slot_mapping[i] >= num_slots)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "slot_mapping[%d] = %" PRId64 ": expected < %" PRId64
                  " (num_pages %d * page_size %d), or negative to skip",
                  i, p.slot_mapping[i], num_slots, p.num_pages, p.page_size);
  return KF_SUCCESS;
}

}  // namespace kf::capi
