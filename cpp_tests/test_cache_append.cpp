// kf_cache_append on CPU tensors: rows land at their slots bit for bit, negative slots are
// skipped, nothing else changes; a cache filled by appends decodes like the reference.
#include "test_util.h"

using namespace kft;

namespace {

struct AppendSetup {
  bool bf16 = true;
  int num_pages = 6, page_size = 16, n = 40;
  bool cache_4d = false;
  int64_t kv_row_stride = 576;
};

void check_append(const AppendSetup& a) {
  auto rng = test_rng(uint64_t(a.page_size) * 31 + a.n);
  std::normal_distribution<float> normal;
  const DLDataType dt = a.bf16 ? kBF16 : kF16;
  HostTensor kv(dt, {a.n, 576}, a.kv_row_stride == 576 ? std::vector<int64_t>{} : std::vector<int64_t>{a.kv_row_stride, 1});
  for (int i = 0; i < a.n; ++i)
    for (int d = 0; d < 576; ++d) kv.ptr<uint16_t>()[i * a.kv_row_stride + d] = to_16(normal(rng), a.bf16);
  std::vector<int64_t> shape{a.num_pages, a.page_size, 576};
  if (a.cache_4d) shape = {a.num_pages, a.page_size, 1, 576};
  HostTensor cache(dt, shape);
  cache.fill<uint16_t>(nan_16(a.bf16));
  const auto before = cache.snapshot();

  // distinct random slots, every fifth row skipped
  std::vector<int64_t> slots(int64_t(a.num_pages) * a.page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  HostTensor slot_mapping(kI64, {a.n});
  for (int i = 0; i < a.n; ++i) slot_mapping.ptr<int64_t>()[i] = i % 5 == 4 ? -1 - i : slots[i];

  ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), a.bf16 ? KF_KV_BF16 : KF_KV_FP16, slot_mapping.dl(), nullptr, nullptr),
            KF_SUCCESS)
      << kf_last_error();
  std::vector<bool> written(slots.size(), false);
  for (int i = 0; i < a.n; ++i) {
    const int64_t s = slot_mapping.ptr<int64_t>()[i];
    if (s < 0) continue;
    written[s] = true;
    ASSERT_EQ(0, std::memcmp(cache.ptr<uint16_t>() + s * 576, kv.ptr<uint16_t>() + i * a.kv_row_stride, 1152)) << i;
  }
  const auto after = cache.snapshot();
  for (size_t s = 0; s < written.size(); ++s) {
    if (written[s]) continue;
    ASSERT_EQ(0, std::memcmp(&before[s * 1152], &after[s * 1152], 1152)) << "slot " << s;
  }
}

TEST(CacheAppend, Bf16RowsLandAtTheirSlots) { check_append({}); }
TEST(CacheAppend, Fp16RowsLandAtTheirSlots) {
  AppendSetup a;
  a.bf16 = false;
  check_append(a);
}
TEST(CacheAppend, PageSizeOne) {
  AppendSetup a;
  a.page_size = 1;
  a.num_pages = 64;
  check_append(a);
}
TEST(CacheAppend, FourDimensionalCache) {
  AppendSetup a;
  a.cache_4d = true;
  a.page_size = 64;
  a.num_pages = 2;
  a.n = 100;
  check_append(a);
}
TEST(CacheAppend, StridedKvRows) {
  AppendSetup a;
  a.kv_row_stride = 640;
  check_append(a);
}

TEST(CacheAppend, NoRowsIsANoOp) {
  HostTensor kv(kBF16, {0, 576}), cache(kBF16, {2, 16, 576}), slots(kI64, {0});
  cache.fill<uint16_t>(0x7fc0);
  const auto before = cache.snapshot();
  ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), KF_KV_BF16, slots.dl(), nullptr, nullptr), KF_SUCCESS)
      << kf_last_error();
  EXPECT_EQ(before, cache.snapshot());
}

TEST(CacheAppend, ErrorBufferStaysClear) {
  HostTensor kv(kBF16, {2, 576}), cache(kBF16, {2, 16, 576}), slots(kI64, {2}), eb(kI32, {4});
  slots.ptr<int64_t>()[0] = 31;
  slots.ptr<int64_t>()[1] = -1;
  eb.ptr<int32_t>()[1] = -1;
  ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), KF_KV_BF16, slots.dl(), eb.dl(), nullptr), KF_SUCCESS);
  EXPECT_EQ(eb.ptr<int32_t>()[0], 0);
  EXPECT_EQ(eb.ptr<int32_t>()[1], -1);
}

// Write every request's tokens with appends (one token per call, as decode does, and a prefill
// in one call), then decode.
TEST(CacheAppend, AppendedCacheDecodesLikeTheReference) {
  for (bool bf16 : {true, false}) {
    auto rng = test_rng(bf16);
    Problem pr;
    pr.bf16 = bf16;
    pr.batch = 3;
    pr.s_q = 2;
    pr.page_size = 32;
    pr.seqlens = {70, 1, 200};
    pr.num_workers = 5;
    Built b = build_problem(pr, rng);
    b.cache.fill<uint16_t>(nan_16(bf16));
    for (int r = 0; r < pr.batch; ++r) {
      const int len = pr.seqlens[r];
      const int prefill = len / 2;
      auto slot_of = [&](int t) {
        return int64_t(b.block_table.ptr<int32_t>()[r * b.max_pages + t / pr.page_size]) * pr.page_size + t % pr.page_size;
      };
      auto rows = [&](int t0, int t1) {
        HostTensor kv(bf16 ? kBF16 : kF16, {t1 - t0, 576});
        HostTensor slots(kI64, {t1 - t0});
        for (int t = t0; t < t1; ++t) {
          for (int d = 0; d < 576; ++d)
            kv.ptr<uint16_t>()[(t - t0) * 576 + d] = to_16(float(b.kv[r][size_t(t) * 576 + d]), bf16);
          slots.ptr<int64_t>()[t - t0] = slot_of(t);
        }
        ASSERT_EQ(kf_cache_append(kv.dl(), b.cache.dl(), bf16 ? KF_KV_BF16 : KF_KV_FP16, slots.dl(), nullptr, nullptr),
                  KF_SUCCESS)
            << kf_last_error();
      };
      if (prefill > 0) rows(0, prefill);
      for (int t = prefill; t < len; ++t) rows(t, t + 1);
    }
    ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
    expect_matches_reference(b);
  }
}

}  // namespace
