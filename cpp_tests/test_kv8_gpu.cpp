// 8-bit KV caches through the C API: kf_cache_convert on the CPU (equals appending every slot,
// and its argument checks), then the Gpu* group: quantize-on-write bytes equal to the CPU
// backend's with a canary (no byte outside the written tokens changes), conversion bytes, and
// decode on the same 8-bit cache against the CPU backend with bit-identical reruns. The Gpu*
// tests skip without CUDA or a device.
#include <cstring>

#include "gpu_util.h"

using namespace kft;

namespace {

constexpr kf_kv_format kFormats8[] = {KF_KV_FP8_E4M3, KF_KV_INT8};

// Rows with zero latents, huge and tiny magnitudes and a few large channels among N(0,1) ones.
void fill_rows(HostTensor& kv, int n, bool bf16, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  for (int i = 0; i < n; ++i)
    for (int d = 0; d < 576; ++d) {
      float x = normal(rng);
      if (i % 5 == 1 && d < 512) x = 0.f;
      if (i % 5 == 2) x *= 1000.f;
      if (i % 5 == 3 && d < 512) x *= 1e-4f;
      if (i % 5 == 4 && d % 64 == 3) x *= 40.f;
      kv.ptr<uint16_t>()[size_t(i) * 576 + d] = to_16(x, bf16);
    }
}

// Bytes of the tokens at `slots` in an 8-bit cache of num_pages x ps (core/kv_format8.h map).
std::vector<bool> token_bytes(int num_pages, int ps, const int64_t* slots, int n) {
  std::vector<bool> m(size_t(num_pages) * ps * 644, false);
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    const size_t base = size_t(slots[i] / ps) * ps * 644;
    const int t = int(slots[i] % ps);
    for (int k = 0; k < 512; ++k) m[base + t * 512 + k] = true;
    for (int k = 0; k < 128; ++k) m[base + ps * 512 + t * 128 + k] = true;
    for (int k = 0; k < 4; ++k) m[base + ps * 640 + t * 4 + k] = true;
  }
  return m;
}

TEST(Kv8Convert, CpuEqualsAppendOfEverySlot) {
  for (kf_kv_format fmt : kFormats8)
    for (bool bf16 : {true, false}) {
      auto rng = test_rng(fmt * 2 + bf16);
      const int num_pages = 4, ps = 32, n = num_pages * ps;
      HostTensor src(bf16 ? kBF16 : kF16, {num_pages, ps, 576}), slots(kI64, {n});
      fill_rows(src, n, bf16, rng);
      for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = i;
      HostTensor got(kU8, {num_pages, ps, 644}), want(kU8, {num_pages, ps, 644});
      got.fill_bytes(0x11);
      want.fill_bytes(0x22);
      HostTensor rows(bf16 ? kBF16 : kF16, {n, 576});
      std::memcpy(rows.ptr<uint8_t>(), src.ptr<uint8_t>(), rows.bytes());
      ASSERT_EQ(kf_cache_convert(src.dl(), got.dl(), fmt, nullptr), KF_SUCCESS) << kf_last_error();
      ASSERT_EQ(kf_cache_append(rows.dl(), want.dl(), fmt, slots.dl(), nullptr, nullptr), KF_SUCCESS);
      EXPECT_EQ(got.snapshot(), want.snapshot());
    }
}

TEST(Kv8Append, CpuChangesNoByteOutsideTheWrittenTokens) {
  for (kf_kv_format fmt : kFormats8) {
    auto rng = test_rng(fmt);
    const int num_pages = 4, ps = 32, n = 40;
    HostTensor kv(kF16, {n, 576}), slots(kI64, {n}), cache(kU8, {num_pages, ps, 644});
    fill_rows(kv, n, false, rng);
    std::vector<int64_t> perm(num_pages * ps);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = i % 4 == 1 ? -1 : perm[i];
    std::uniform_int_distribution<int> byte(0, 255);
    for (size_t i = 0; i < cache.bytes(); ++i) cache.ptr<uint8_t>()[i] = uint8_t(byte(rng));
    const auto canary = cache.snapshot();
    ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), fmt, slots.dl(), nullptr, nullptr), KF_SUCCESS);
    const auto mine = token_bytes(num_pages, ps, slots.ptr<int64_t>(), n);
    const auto now = cache.snapshot();
    size_t changed = 0, written = 0;
    for (size_t i = 0; i < now.size(); ++i) {
      changed += !mine[i] && now[i] != canary[i];
      written += mine[i] && now[i] != canary[i];
    }
    EXPECT_EQ(changed, 0u);
    EXPECT_GT(written, 0u);
  }
}

TEST(Kv8Convert, RefusesWhatDoesNotFit) {
  HostTensor src(kF16, {3, 16, 576}), dst(kU8, {3, 16, 644});
  EXPECT_EQ(kf_cache_convert(src.dl(), dst.dl(), KF_KV_BF16, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("dst_format"), std::string::npos);
  HostTensor few(kU8, {2, 16, 644});
  EXPECT_EQ(kf_cache_convert(src.dl(), few.dl(), KF_KV_INT8, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("num_pages"), std::string::npos);
  HostTensor small_pages(kF16, {3, 8, 576}), dst8(kU8, {3, 8, 644});
  EXPECT_EQ(kf_cache_convert(small_pages.dl(), dst8.dl(), KF_KV_INT8, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kf_cache_convert(nullptr, dst.dl(), KF_KV_INT8, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kf_cache_convert(src.dl(), nullptr, KF_KV_INT8, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("dst"), std::string::npos);
  HostTensor src_f32(kF32, {3, 16, 576});  // a 16-bit cache is bf16 or fp16
  EXPECT_EQ(kf_cache_convert(src_f32.dl(), dst.dl(), KF_KV_INT8, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("src"), std::string::npos);
  HostTensor dst_f16(kF16, {3, 16, 644});  // an 8-bit cache is bytes
  EXPECT_EQ(kf_cache_convert(src.dl(), dst_f16.dl(), KF_KV_FP8_E4M3, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("dst"), std::string::npos);
  DLTensor on_gpu = *dst.dl();
  on_gpu.device = DLDevice{kDLCUDA, 0};
  EXPECT_EQ(kf_cache_convert(src.dl(), &on_gpu, KF_KV_INT8, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("device"), std::string::npos);
  EXPECT_EQ(kf_cache_convert(src.dl(), dst.dl(), kf_kv_format(9), nullptr), KF_ERROR_INVALID_ARGUMENT);
  // The 8-bit cache inside the source's bytes.
  HostTensor buf(kU8, {3 * 16 * 576 * 2});
  DLTensor s = *src.dl(), d = *dst.dl();
  s.data = buf.ptr<uint8_t>();
  d.data = buf.ptr<uint8_t>() + 64;
  EXPECT_EQ(kf_cache_convert(&s, &d, KF_KV_INT8, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("overlap"), std::string::npos);
}

TEST(GpuKv8Append, WritesTheCpuBytesAndNothingElse) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (kf_kv_format fmt : kFormats8)
    for (bool bf16 : {true, false})
      for (int ps : {16, 64}) {
        auto rng = test_rng(fmt * 100 + bf16 * 10 + ps);
        const int num_pages = 6, n = 2 * ps + 5;
        HostTensor kv(bf16 ? kBF16 : kF16, {n, 576}), slots(kI64, {n});
        fill_rows(kv, n, bf16, rng);
        std::vector<int64_t> perm(num_pages * ps);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = i % 6 == 2 ? -1 : perm[i];
        HostTensor cache(kU8, {num_pages, ps, 644}), gpu(kU8, {num_pages, ps, 644});
        std::uniform_int_distribution<int> byte(0, 255);
        for (size_t i = 0; i < cache.bytes(); ++i) cache.ptr<uint8_t>()[i] = uint8_t(byte(rng));
        const auto canary = cache.snapshot();
        DeviceTensor dkv(kv), dslots(slots), dcache(cache);
        ASSERT_EQ(kf_cache_append(dkv.dl(), dcache.dl(), fmt, dslots.dl(), nullptr, nullptr), KF_SUCCESS)
            << kf_last_error();
        ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), fmt, slots.dl(), nullptr, nullptr), KF_SUCCESS);
        CUDA_OK(cudaDeviceSynchronize());
        dcache.download(gpu);
        EXPECT_EQ(gpu.snapshot(), cache.snapshot()) << "fmt " << fmt << " bf16 " << bf16 << " ps " << ps;
        const auto mine = token_bytes(num_pages, ps, slots.ptr<int64_t>(), n);
        const auto now = gpu.snapshot();
        size_t changed = 0;
        for (size_t i = 0; i < now.size(); ++i) changed += !mine[i] && now[i] != canary[i];
        EXPECT_EQ(changed, 0u);
      }
#endif
}

TEST(GpuKv8Convert, WritesTheCpuBytes) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (kf_kv_format fmt : kFormats8)
    for (bool bf16 : {true, false}) {
      auto rng = test_rng(fmt * 2 + bf16);
      const int num_pages = 5, ps = 64;
      HostTensor src(bf16 ? kBF16 : kF16, {num_pages, ps, 576});
      fill_rows(src, num_pages * ps, bf16, rng);
      HostTensor cpu(kU8, {num_pages, ps, 644}), gpu(kU8, {num_pages, ps, 644});
      ASSERT_EQ(kf_cache_convert(src.dl(), cpu.dl(), fmt, nullptr), KF_SUCCESS) << kf_last_error();
      DeviceTensor dsrc(src), ddst(gpu);
      ASSERT_EQ(kf_cache_convert(dsrc.dl(), ddst.dl(), fmt, nullptr), KF_SUCCESS) << kf_last_error();
      CUDA_OK(cudaDeviceSynchronize());
      ddst.download(gpu);
      EXPECT_EQ(gpu.snapshot(), cpu.snapshot());
    }
#endif
}

#if KF_TESTS_WITH_CUDA
// The GPU decode of an 8-bit cache against the CPU backend on the same cache bytes (worst row
// cosine distance below 1e-5, lse within 1e-4, empty rows zero with -inf), and a rerun (metadata
// made again) bit-identical; metadata made for pr.num_workers on the GPU.
template <typename Rng>
void expect_8bit_decode_matches_cpu(const Problem& pr, kf_kv_format fmt, Rng& rng) {
  Built b = build_problem(pr, rng);
  HostTensor cache8 = append_8bit_cache(b, fmt, 0xff);
  ASSERT_EQ(decode_8bit(b, cache8, fmt), KF_SUCCESS) << kf_last_error();  // CPU backend
  const auto cpu_out = b.out.snapshot(), cpu_lse = b.lse.snapshot();
  DeviceTensor q(b.q_t), kv(cache8), bt(b.block_table), sl(b.cache_seqlens), meta(b.metadata), out(b.out),
      lse(b.lse), ws(b.workspace);
  std::vector<std::vector<uint8_t>> runs;
  for (int run = 0; run < 2; ++run) {
    ASSERT_EQ(kf_mla_metadata_for_format(sl.dl(), pr.h_q, pr.s_q, pr.num_workers, KF_KV_BF16,
                                         meta.dl(), nullptr),
              KF_SUCCESS);
    ASSERT_EQ(kf_mla_decode(q.dl(), kv.dl(), fmt, bt.dl(), sl.dl(), meta.dl(), pr.scale, out.dl(), lse.dl(),
                            ws.dl(), nullptr, nullptr),
              KF_SUCCESS)
        << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    out.download(b.out);
    lse.download(b.lse);
    auto o = b.out.snapshot(), l = b.lse.snapshot();
    o.insert(o.end(), l.begin(), l.end());
    runs.push_back(o);
  }
  EXPECT_EQ(runs[0], runs[1]) << "rerun not bit-identical";
  double worst = 0, worst_lse = 0;
  const size_t rows = size_t(pr.batch) * pr.s_q * pr.h_q;
  for (size_t i = 0; i < rows; ++i) {  // out rows in [b, s_q, h] order; lse [b, h, s_q]
    const size_t r = i / (pr.s_q * pr.h_q), s = i / pr.h_q % pr.s_q, h = i % pr.h_q;
    const size_t li = (r * pr.h_q + h) * pr.s_q + s;
    float lg, lc;
    std::memcpy(&lg, b.lse.ptr<uint8_t>() + li * 4, 4);
    std::memcpy(&lc, cpu_lse.data() + li * 4, 4);
    std::vector<double> x(512), y(512);
    for (int d = 0; d < 512; ++d) {
      uint16_t a, bb;
      std::memcpy(&a, b.out.ptr<uint8_t>() + (i * 512 + d) * 2, 2);
      std::memcpy(&bb, cpu_out.data() + (i * 512 + d) * 2, 2);
      x[d] = from_16(a, pr.bf16), y[d] = from_16(bb, pr.bf16);
    }
    if (lc == -INFINITY) {
      EXPECT_EQ(lg, -INFINITY);
      for (double v : x) EXPECT_EQ(v, 0.0);
      continue;
    }
    worst = std::max(worst, cosine_distance(x, y.data(), 512));
    worst_lse = std::max(worst_lse, std::fabs(double(lg) - double(lc)));
  }
  EXPECT_LT(worst, 1e-5) << "fmt " << fmt << " h_q " << pr.h_q;
  EXPECT_LT(worst_lse, 1e-4) << "fmt " << fmt << " h_q " << pr.h_q;
}
#endif

TEST(GpuKv8Decode, MatchesCpuBackendAndRerunsBitIdentical) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  struct C {
    bool bf16;
    int h_q, s_q, ps;
  };
  for (const char* kv8 : {"", "1"})  // KF_SM90A_KV8: on an H200, the sm_90a 8-bit kernel too
  for (kf_kv_format fmt : kFormats8)
    for (C c : {C{true, 16, 1, 64}, C{false, 16, 2, 16}, C{true, 128, 1, 32}, C{false, 8, 4, 256}}) {
      SCOPED_TRACE(std::string("KF_SM90A_KV8=") + kv8);
      EnvScope kv8_scope("KF_SM90A_KV8", kv8);
      auto rng = test_rng(fmt * 1000 + c.h_q * 10 + c.s_q);
      Problem pr;
      pr.bf16 = c.bf16, pr.h_q = c.h_q, pr.s_q = c.s_q, pr.page_size = c.ps;
      pr.batch = 5, pr.num_workers = 40;
      pr.seqlens = {0, 1, 777, 3000, 65};
      expect_8bit_decode_matches_cpu(pr, fmt, rng);
    }
#endif
}

// Large 8-bit batches with the batch-aware default worker count (no switch): on an sm_90 device
// with the sm_90a family the count is one block per SM, which runs the sm_90a 8-bit kernel
// (decode_config_sm90a.h, sm90a_kv8_kernel_runs), elsewhere the format's count; either way the
// decode matches the CPU backend. 128 requests of up to 700 tokens, h_q 16, bf16 q.
TEST(GpuKv8Decode, LargeBatchDefaultWorkersMatchCpuBackend) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  EnvScope kv8_scope("KF_SM90A_KV8", "");
  int major = 0, sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const char* family = std::getenv("KF_KERNEL_FAMILY");
  const bool sm90a = major == 9 && std::string(kf_build_info()).find(" 90a") != std::string::npos &&
                     (family == nullptr || std::string(family) != "sm80");
  for (kf_kv_format fmt : kFormats8) {
    SCOPED_TRACE("fmt " + std::to_string(int(fmt)));
    int w_format = 0, w_small = 0, w_large = 0;
    ASSERT_EQ(kf_mla_default_num_workers_for_format(0, 16, 1, fmt, &w_format), KF_SUCCESS)
        << kf_last_error();
    ASSERT_EQ(kf_mla_default_num_workers_for_batch(0, 16, 1, fmt, 8, &w_small), KF_SUCCESS)
        << kf_last_error();
    ASSERT_EQ(kf_mla_default_num_workers_for_batch(0, 16, 1, fmt, 128, &w_large), KF_SUCCESS)
        << kf_last_error();
    EXPECT_EQ(w_small, w_format) << "a small batch keeps the format's count";
    EXPECT_EQ(w_large, sm90a ? sms : w_format);
    auto rng = test_rng(fmt * 7 + 128);
    Problem pr;
    pr.bf16 = true, pr.h_q = 16, pr.s_q = 1, pr.page_size = 64;
    pr.batch = 128, pr.num_workers = w_large;
    pr.seqlens.resize(pr.batch);
    for (int& len : pr.seqlens) len = int(rng() % 701);
    expect_8bit_decode_matches_cpu(pr, fmt, rng);
  }
#endif
}

}  // namespace
