// The CUDA backend against the CPU backend, through the C API on cudaMalloc'd buffers. Every test
// skips with a reason where the build has no CUDA or no device is visible, so the binary builds
// and lists these tests on any machine.
#include "gpu_util.h"

using namespace kft;

namespace {

struct GpuCase {
  const char* name;
  bool bf16;
  int batch, s_q, h_q, page_size, max_len;
  double zero_fraction;
};
void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }

class GpuDecode : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuDecode, MatchesCpuBackendAndReference) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  const GpuCase& c = GetParam();
  auto rng = test_rng();
  Problem pr = problem_of(c);
  int w = 0;
  ASSERT_EQ(kf_mla_default_num_workers_for_format(0, c.h_q, c.s_q, KF_KV_BF16, &w), KF_SUCCESS)
      << kf_last_error();
  pr.num_workers = w;
  pr.seqlens = random_lengths(rng, c.batch, c.max_len, c.zero_fraction);
  Built cpu = build_problem(pr, rng);
  DeviceProblem dev(cpu);  // uploads the poisoned out/lse/workspace too
  ASSERT_EQ(run_decode(cpu), KF_SUCCESS) << kf_last_error();

  const auto meta_cpu = cpu.metadata.snapshot();
  ASSERT_EQ(dev.step(pr, c.bf16 ? KF_KV_BF16 : KF_KV_FP16), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());

  Built gpu = build_problem(pr, rng);  // host buffers of the same shapes for the results
  CUDA_OK(dev.download_results(gpu));
  dev.metadata.download(gpu.metadata);
  const auto meta_gpu = gpu.metadata.snapshot();
  EXPECT_EQ(metadata_expected_on_gpu(pr, meta_cpu, meta_gpu), meta_gpu)
      << "GPU metadata differs from the CPU scheduler's";
  expect_close_to(gpu, cpu);
  // The GPU result against float64 on the same inputs (cpu holds them).
  CUDA_OK(dev.download_results(cpu));
  expect_matches_reference(cpu);
#endif
}

std::vector<GpuCase> gpu_cases() {
  return {
      {"Bf16Hq16Page64", true, 8, 1, 16, 64, 3000, 0.1},
      {"Bf16Hq128Page64", true, 4, 1, 128, 64, 1500, 0.1},
      {"Bf16Hq16Sq2Page16", true, 6, 2, 16, 16, 1000, 0.2},
      {"Bf16Hq128Sq4Page32", true, 3, 4, 128, 32, 600, 0.0},
      {"Fp16Hq16Page32", false, 8, 1, 16, 32, 2000, 0.2},
      {"Fp16Hq128Sq2Page64", false, 3, 2, 128, 64, 800, 0.0},
      {"Bf16ManyShortRequests", true, 64, 1, 16, 64, 100, 0.3},
      {"Bf16OneLongRequest", true, 1, 1, 16, 64, 20000, 0.0},
  };
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuDecode, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& i) { return std::string(i.param.name); });

TEST(GpuDecodeDeterminism, RerunsAreBitIdentical) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  Problem pr;
  pr.batch = 5;
  pr.h_q = 16;
  pr.s_q = 2;
  pr.num_workers = 40;
  pr.seqlens = random_lengths(rng, pr.batch, 3000, 0.0);
  Built b = build_problem(pr, rng);
  DeviceProblem dev(b);
  ASSERT_EQ(dev.step(pr, KF_KV_BF16), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(dev.download_results(b));
  const auto out1 = b.out.snapshot(), lse1 = b.lse.snapshot();
  b.out.fill<uint16_t>(0x7fc0);
  dev.out.upload(b.out);
  ASSERT_EQ(dev.decode(pr, KF_KV_BF16), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(dev.download_results(b));
  EXPECT_EQ(out1, b.out.snapshot());
  EXPECT_EQ(lse1, b.lse.snapshot());
#endif
}

TEST(GpuDecodeGraph, ReplayWithNewLengthsMatchesEager) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  Problem pr;
  pr.batch = 4;
  pr.h_q = 16;
  pr.num_workers = 24;
  pr.seqlens = {900, 900, 900, 900};
  Built b = build_problem(pr, rng);
  DeviceProblem dev(b);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const kf_status captured = dev.step(pr, KF_KV_BF16, nullptr, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, KF_SUCCESS) << kf_last_error();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // New (shorter) lengths: the pages already hold those tokens.
  for (int r = 0; r < pr.batch; ++r) b.cache_seqlens.ptr<int32_t>()[r] = 100 + 250 * r;
  dev.cache_seqlens.upload(b.cache_seqlens);
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(dev.download_results(b));
  const auto out_graph = b.out.snapshot(), lse_graph = b.lse.snapshot();
  ASSERT_EQ(dev.step(pr, KF_KV_BF16, nullptr, stream), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(dev.download_results(b));
  EXPECT_EQ(out_graph, b.out.snapshot());
  EXPECT_EQ(lse_graph, b.lse.snapshot());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
#endif
}

TEST(GpuCacheAppend, WritesTheCpuBytes) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (bool bf16 : {true, false}) {
    auto rng = test_rng(bf16);
    std::normal_distribution<float> normal;
    const int n = 300, num_pages = 8, ps = 64;
    HostTensor kv(bf16 ? kBF16 : kF16, {n, 576}), slots(kI64, {n});
    HostTensor cache_cpu(bf16 ? kBF16 : kF16, {num_pages, ps, 576}), cache_gpu = HostTensor(bf16 ? kBF16 : kF16, {num_pages, ps, 576});
    for (int64_t i = 0; i < kv.numel(); ++i) kv.ptr<uint16_t>()[i] = to_16(normal(rng), bf16);
    std::vector<int64_t> perm(num_pages * ps);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = i % 7 == 3 ? -1 : perm[i];
    cache_cpu.fill<uint16_t>(nan_16(bf16));
    DeviceTensor dkv(kv), dslots(slots), dcache(cache_cpu);
    const kf_kv_format fmt = bf16 ? KF_KV_BF16 : KF_KV_FP16;
    ASSERT_EQ(kf_cache_append(kv.dl(), cache_cpu.dl(), fmt, slots.dl(), nullptr, nullptr), KF_SUCCESS);
    ASSERT_EQ(kf_cache_append(dkv.dl(), dcache.dl(), fmt, dslots.dl(), nullptr, nullptr), KF_SUCCESS)
        << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    dcache.download(cache_gpu);
    EXPECT_EQ(cache_cpu.snapshot(), cache_gpu.snapshot());
  }
#endif
}

TEST(GpuErrorBuffer, BadDeviceValuesAreMaskedAndReported) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  Problem pr;
  pr.batch = 3;
  pr.num_workers = 8;
  pr.seqlens = {100, 200, 300};
  Built b = build_problem(pr, rng);
  DeviceProblem dev(b);
  ASSERT_EQ(dev.metadata_call(pr), KF_SUCCESS) << kf_last_error();
  // The host cannot see device contents: a length beyond the block table and a bad page are
  // clamped/masked by the kernel and reported, never read out of bounds.
  b.cache_seqlens.ptr<int32_t>()[1] = 1 << 30;
  b.block_table.ptr<int32_t>()[2 * b.max_pages] = b.num_pages + 1000;
  dev.cache_seqlens.upload(b.cache_seqlens);
  dev.block_table.upload(b.block_table);
  HostTensor eb(kI32, {4});
  eb.ptr<int32_t>()[1] = -1;
  DeviceTensor deb(eb);
  ASSERT_EQ(dev.decode(pr, KF_KV_BF16, deb.dl()), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  deb.download(eb);
  EXPECT_NE(eb.ptr<int32_t>()[0] & KF_DEVERR_SEQLEN_RANGE, 0);
  EXPECT_NE(eb.ptr<int32_t>()[0] & KF_DEVERR_PAGE_RANGE, 0);
  EXPECT_GE(eb.ptr<int32_t>()[1], 1);
  // Request 0 is untouched by either fault and still correct.
  CUDA_OK(dev.download_results(b));
  b.cache_seqlens.ptr<int32_t>()[1] = 200;
  const Reference ref = reference_decode(b);
  const auto o = out_row(b, 0, 0, 0);
  EXPECT_LT(cosine_distance(o, &ref.o[0], 512), 1e-5);
#endif
}

TEST(GpuErrorBuffer, MetadataForAnotherHeadCountIsReported) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  Problem pr;
  pr.batch = 2;
  pr.num_workers = 3;
  pr.seqlens = {100, 200};
  Built b = build_problem(pr, rng);
  DeviceProblem dev(b);
  Problem other = pr;
  other.h_q = 8;  // same metadata size, other header
  ASSERT_EQ(dev.metadata_call(other), KF_SUCCESS) << kf_last_error();
  HostTensor eb(kI32, {4});
  eb.ptr<int32_t>()[1] = -1;
  DeviceTensor deb(eb);
  ASSERT_EQ(dev.decode(pr, KF_KV_BF16, deb.dl()), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  deb.download(eb);
  EXPECT_NE(eb.ptr<int32_t>()[0] & KF_DEVERR_METADATA, 0);
#endif
}

// The 8-bit formats: skipped while the CUDA backend reports them unsupported.
TEST(Gpu8bit, AppendWritesTheCpuBytes) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (kf_kv_format fmt : {KF_KV_FP8_E4M3, KF_KV_INT8}) {
    auto rng = test_rng(fmt);
    Problem pr;
    pr.batch = 3;
    pr.page_size = 64;
    pr.seqlens = random_lengths(rng, pr.batch, 700, 0.0);
    Built b = build_problem(pr, rng);
    HostTensor cpu_cache = append_8bit_cache(b, fmt, 0xff);
    // the same rows through the GPU, in one call
    int total = 0;
    for (int len : pr.seqlens) total += len;
    HostTensor kv(kBF16, {total, 576}), slots(kI64, {total});
    int i = 0;
    for (int r = 0; r < pr.batch; ++r)
      for (int t = 0; t < pr.seqlens[r]; ++t, ++i) {
        for (int d = 0; d < 576; ++d) kv.ptr<uint16_t>()[i * 576 + d] = to_bf16(float(b.kv[r][size_t(t) * 576 + d]));
        slots.ptr<int64_t>()[i] =
            int64_t(b.block_table.ptr<int32_t>()[r * b.max_pages + t / pr.page_size]) * pr.page_size + t % pr.page_size;
      }
    HostTensor gpu_cache(kU8, {b.num_pages, pr.page_size, 644});
    gpu_cache.fill_bytes(0xff);
    DeviceTensor dkv(kv), dslots(slots), dcache(gpu_cache);
    const kf_status s = kf_cache_append(dkv.dl(), dcache.dl(), fmt, dslots.dl(), nullptr, nullptr);
    ASSERT_EQ(s, KF_SUCCESS) << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    dcache.download(gpu_cache);
    EXPECT_EQ(cpu_cache.snapshot(), gpu_cache.snapshot());
  }
#endif
}

TEST(Gpu8bit, DecodeMatchesCpuBackend) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (kf_kv_format fmt : {KF_KV_FP8_E4M3, KF_KV_INT8})
    for (int hq : {16, 128}) {
      auto rng = test_rng(fmt * 1000 + hq);
      Problem pr;
      pr.batch = 4;
      pr.h_q = hq;
      pr.s_q = hq == 16 ? 2 : 1;
      pr.page_size = 64;
      ASSERT_EQ(kf_mla_default_num_workers_for_format(0, pr.h_q, pr.s_q, KF_KV_BF16, &pr.num_workers),
                KF_SUCCESS);
      pr.seqlens = random_lengths(rng, pr.batch, 2000, 0.2);
      Built cpu = build_problem(pr, rng);
      HostTensor cache = append_8bit_cache(cpu, fmt, 0xff);
      DeviceProblem dev(cpu);
      DeviceTensor dcache(cache);
      ASSERT_EQ(decode_8bit(cpu, cache, fmt), KF_SUCCESS) << kf_last_error();
      const kf_status s = kf_mla_decode(dev.q.dl(), dcache.dl(), fmt, dev.block_table.dl(), dev.cache_seqlens.dl(),
                                        dev.metadata.dl(), pr.scale, dev.out.dl(), dev.lse.dl(), dev.workspace.dl(),
                                        nullptr, nullptr);
      ASSERT_EQ(s, KF_SUCCESS) << kf_last_error();
      CUDA_OK(cudaDeviceSynchronize());
      Built gpu = build_problem(pr, rng);
      CUDA_OK(dev.download_results(gpu));
      expect_close_to(gpu, cpu);  // docs/spec.md section 4: same 8-bit cache, GPU vs CPU, worst row < 1e-5
    }
#endif
}

TEST(GpuDevice, DefaultWorkersFromSmCount) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (int hq : {16, 128}) {
    int w = 0;
    ASSERT_EQ(kf_mla_default_num_workers_for_format(0, hq, 1, KF_KV_BF16, &w), KF_SUCCESS)
        << kf_last_error();
    EXPECT_GE(w, 1);
    int sms = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // At most two decode blocks per SM fit (shared memory), spread over the row tiles.
    EXPECT_LE(w, 2 * sms);
    EXPECT_GE(w, sms / 8);  // 128 rows: at most 8 row tiles
  }
  // 8-bit caches run 16 rows per block: the count for 16 rows, divided by the row tiles.
  for (kf_kv_format f : {KF_KV_FP8_E4M3, KF_KV_INT8}) {
    int w16 = 0, w32 = 0, w128 = 0;
    ASSERT_EQ(kf_mla_default_num_workers_for_format(0, 16, 1, f, &w16), KF_SUCCESS) << kf_last_error();
    ASSERT_EQ(kf_mla_default_num_workers_for_format(0, 16, 2, f, &w32), KF_SUCCESS) << kf_last_error();
    ASSERT_EQ(kf_mla_default_num_workers_for_format(0, 128, 1, f, &w128), KF_SUCCESS) << kf_last_error();
    EXPECT_EQ(w32, w16 / 2);
    EXPECT_EQ(w128, w16 / 8 < 1 ? 1 : w16 / 8);
  }
  int w = 0;
  EXPECT_EQ(kf_mla_default_num_workers_for_format(kf_cuda_device_count(), 16, 1, KF_KV_BF16, &w),
            KF_ERROR_INVALID_ARGUMENT);
#endif
}

TEST(GpuErrors, MixedHostAndDeviceTensorsAreRejected) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  Problem pr;
  pr.seqlens = {10, 20};
  Built b = build_problem(pr, rng);
  DeviceProblem dev(b);
  EXPECT_EQ(kf_mla_decode(dev.q.dl(), dev.cache.dl(), KF_KV_BF16, dev.block_table.dl(), dev.cache_seqlens.dl(),
                          dev.metadata.dl(), pr.scale, b.out.dl(), dev.lse.dl(), dev.workspace.dl(), nullptr, nullptr),
            KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("out: expected device cuda:0"), std::string::npos) << kf_last_error();
#endif
}

}  // namespace
