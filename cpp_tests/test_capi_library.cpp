// Library-level C API: version, build info, status strings, the size queries, and the
// thread-local last error.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/params.h"
#include "test_util.h"

using namespace kft;

namespace {


TEST(Library, VersionMatchesHeaderMacros) {
  const std::string want = std::to_string(KF_VERSION_MAJOR) + "." + std::to_string(KF_VERSION_MINOR) +
                           "." + std::to_string(KF_VERSION_PATCH);
  EXPECT_EQ(want, kf_version());
  EXPECT_STREQ(kf_version(), "0.1.0");
}

TEST(Library, BuildInfoNamesVersionArchsAndRuntime) {
  const std::string info = kf_build_info();
  EXPECT_NE(info.find("0.1.0"), std::string::npos) << info;
#if KF_TESTS_WITH_CUDA
  EXPECT_NE(info.find("cuda archs"), std::string::npos) << info;
  EXPECT_NE(info.find("cuda runtime"), std::string::npos) << info;
#else
  EXPECT_NE(info.find("cpu-only"), std::string::npos) << info;
#endif
  EXPECT_EQ(info.find('\n'), std::string::npos) << "one line";
  EXPECT_EQ(kf_build_info(), kf_build_info()) << "a stable pointer";
}

TEST(Library, StatusStringsAreDistinct) {
  const kf_status all[] = {KF_SUCCESS, KF_ERROR_INVALID_ARGUMENT, KF_ERROR_UNSUPPORTED, KF_ERROR_CUDA,
                           KF_ERROR_INTERNAL};
  std::set<std::string> seen;
  for (kf_status s : all) {
    ASSERT_NE(kf_status_string(s), nullptr);
    EXPECT_GT(std::strlen(kf_status_string(s)), 0u);
    EXPECT_TRUE(seen.insert(kf_status_string(s)).second) << kf_status_string(s);
  }
  EXPECT_NE(std::string(kf_status_string(KF_ERROR_INVALID_ARGUMENT)).find("INVALID_ARGUMENT"), std::string::npos);
  EXPECT_STREQ(kf_status_string(kf_status(42)), "unknown kf_status");
}

TEST(Library, CudaDeviceCountNeverFails) {
  const int n = kf_cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(n, kf_cuda_device_count());
#if !KF_TESTS_WITH_CUDA
  EXPECT_EQ(n, 0);
#endif
}

TEST(Sizes, BytesPerTokenAndPage) {
  size_t n = 0;
  ASSERT_EQ(kf_cache_bytes_per_token(KF_KV_BF16, &n), KF_SUCCESS);
  EXPECT_EQ(n, 1152u);
  ASSERT_EQ(kf_cache_bytes_per_token(KF_KV_FP16, &n), KF_SUCCESS);
  EXPECT_EQ(n, 1152u);
  ASSERT_EQ(kf_cache_bytes_per_token(KF_KV_FP8_E4M3, &n), KF_SUCCESS);
  EXPECT_EQ(n, 644u);
  ASSERT_EQ(kf_cache_bytes_per_token(KF_KV_INT8, &n), KF_SUCCESS);
  EXPECT_EQ(n, 644u);
  for (int ps = 1; ps <= 256; ps *= 2) {
    ASSERT_EQ(kf_cache_bytes_per_page(KF_KV_BF16, ps, &n), KF_SUCCESS);
    EXPECT_EQ(n, 1152u * ps);
  }
  ASSERT_EQ(kf_cache_bytes_per_page(KF_KV_INT8, 64, &n), KF_SUCCESS);
  EXPECT_EQ(n, 644u * 64);
  EXPECT_STREQ(kf_last_error(), "");
}

TEST(Sizes, MetadataAndWorkspaceFollowTheCore) {
  for (int b : {1, 7, 64})
    for (int w : {1, 3, 132}) {
      size_t n = 0;
      ASSERT_EQ(kf_mla_metadata_size(b, w, &n), KF_SUCCESS);
      EXPECT_EQ(n, size_t(16 + 8 * w + b + 1));
      for (int hq : {1, 16, 128})
        for (int sq : {1, 4}) {
          ASSERT_EQ(kf_mla_workspace_size(b, hq, sq, w, &n), KF_SUCCESS);
          EXPECT_EQ(n, size_t(kf::workspace_bytes(b, hq * sq, w)));
          EXPECT_EQ(n % 256, 0u);
          if (w == 1) {
            EXPECT_EQ(n, 0u);  // one worker never splits a request
          } else {
            // o_accum and lse_accum for every piece the schedule can make
            EXPECT_GE(n, size_t(b + w) * hq * sq * (512 + 1) * 4);
          }
        }
    }
}

TEST(Sizes, DefaultWorkersOnCpu) {
  for (kf_kv_format f : {KF_KV_BF16, KF_KV_FP16, KF_KV_FP8_E4M3, KF_KV_INT8}) {
    int w = 0;
    ASSERT_EQ(kf_mla_default_num_workers_for_format(-1, 16, 2, f, &w), KF_SUCCESS);
    EXPECT_EQ(w, 4) << kf_last_error();
  }
  int w = 0;
  ASSERT_EQ(kf_mla_default_num_workers_for_format(-1, 16, 1, KF_KV_BF16, &w), KF_SUCCESS);
  EXPECT_EQ(w, 4);
}

TEST(Sizes, WorkspaceOfAnyDtypeCountsBytes) {
  auto rng = test_rng();
  Problem pr;
  pr.seqlens = {300, 5};
  pr.num_workers = 6;
  Built b = build_problem(pr, rng);
  const int64_t bytes = b.workspace.numel();
  HostTensor ws(kF32, {bytes / 4});
  b.workspace = ws;
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  expect_matches_reference(b);
}

TEST(LastError, ClearedBySuccess) {
  size_t n;
  ASSERT_EQ(kf_mla_metadata_size(0, 1, &n), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()), "");
  ASSERT_EQ(kf_mla_metadata_size(1, 1, &n), KF_SUCCESS);
  EXPECT_STREQ(kf_last_error(), "");
}

TEST(LastError, NamesArgumentExpectedAndGot) {
  HostTensor q(kI32, {1, 1, 16, 576});
  auto rng = test_rng();
  Problem pr;
  pr.seqlens = {10};
  pr.batch = 1;
  Built b = build_problem(pr, rng);
  ASSERT_EQ(kf_mla_decode(q.dl(), b.cache.dl(), KF_KV_BF16, b.block_table.dl(), b.cache_seqlens.dl(),
                          b.metadata.dl(), 0.1f, b.out.dl(), b.lse.dl(), b.workspace.dl(), nullptr, nullptr),
            KF_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(kf_last_error(), "q: expected dtype bfloat16 or float16, got int32");
}

TEST(LastError, IsThreadLocal) {
  constexpr int kThreads = 6;
  Barrier sync(kThreads);
  std::atomic<int> bad{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      size_t n;
      // Even threads fail with their own batch in the message; odd threads succeed.
      const int batch = t % 2 == 0 ? -(t + 1) : t + 1;
      for (int round = 0; round < 200; ++round) {
        const kf_status s = kf_mla_metadata_size(batch, 2, &n);
        sync.arrive_and_wait();  // every thread has made its call before any reads
        const std::string msg = kf_last_error();
        if (t % 2 == 0) {
          if (s != KF_ERROR_INVALID_ARGUMENT || msg.find("got " + std::to_string(batch)) == std::string::npos)
            ++bad;
        } else if (s != KF_SUCCESS || !msg.empty()) {
          ++bad;
        }
        sync.arrive_and_wait();
      }
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(LastError, FreshThreadStartsEmpty) {
  size_t n;
  ASSERT_NE(kf_mla_metadata_size(0, 0, &n), KF_SUCCESS);
  std::string other = "unset";
  std::thread([&] { other = kf_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(kf_last_error()), "");
}

}  // namespace
