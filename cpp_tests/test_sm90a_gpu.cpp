// The sm_90a decode family (src/cuda/decode/sm90a/) against the CPU backend and the float64
// reference, next to the portable family on the same inputs: bf16 and fp16, pages of 16, 32 and
// 64 tokens (scattered, NaN in every unused slot), h_q 16, 64 and 128, s_q 1 and 2, lengths from 0
// to several 64-token tiles (most not multiples of 64), workers with one piece up to workers with
// more pieces than a block stages at once; s_q up to 16 (causal, requests shorter than s_q);
// bit-identical reruns and graph replay; a non-finite score in the tokens the kernel's second
// consumer warpgroup scores. Skips with the reason where the device or the build has
// no sm_90a family (it needs compute capability 9.0 and a build for 90). h_q 16 with s_q 1 runs the portable M16 kernel in both families (the sm_90a
// family's explicit choice, decode_family_sm90a.cu); every other case runs the wgmma kernel.
#include <cstring>

#include "core/scheduler.h"
#include "gpu_util.h"

using namespace kft;

namespace {

#if KF_TESTS_WITH_CUDA

// KF_KERNEL_FAMILY for the scope of one check ("" unsets it: the default family).
class FamilyScope : public EnvScope {
 public:
  explicit FamilyScope(const char* value) : EnvScope("KF_KERNEL_FAMILY", value) {}
};

// Why the sm_90a family does not run here ("" when it does): it needs a 9.0 device and a build
// whose architectures include 90 (kf_build_info() then lists "90a").
std::string sm90a_missing() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return "the device's compute capability could not be read";
  if (major != 9 || minor != 0)
    return "device 0 is sm_" + std::to_string(major * 10 + minor) + ", the sm_90a family runs on sm_90";
  if (std::string(kf_build_info()).find(" 90a") == std::string::npos)
    return std::string("this build has no sm_90a family (") + kf_build_info() + ")";
  return "";
}

#define KF_REQUIRE_SM90A()                                   \
  do {                                                       \
    const std::string why = sm90a_missing();                 \
    if (!why.empty()) GTEST_SKIP() << why;                   \
  } while (0)

// Lengths 0 .. several tiles: empty, shorter than a page, a tile's edges, not multiples of 64.
const std::vector<int> kLengths = {0, 1, 63, 64, 65, 130, 200, 511, 777, 1000};

// Decode `pr` on the device with the family `family` asks for; results into `res`.
void decode_with(const char* family, const Problem& pr, DeviceProblem& dev, Built& res) {
  FamilyScope scope(family);
  ASSERT_EQ(dev.step(pr, pr.bf16 ? KF_KV_BF16 : KF_KV_FP16), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(dev.download_results(res));
}

// A second decode of the same inputs by the family `family` asks for, with out and lse poisoned
// in between, gives the same bits.
void expect_rerun_identical(const char* family, const Problem& pr, DeviceProblem& dev, Built& res) {
  FamilyScope scope(family);
  const auto out1 = res.out.snapshot(), lse1 = res.lse.snapshot();
  res.out.fill<uint16_t>(nan_16(pr.bf16));
  res.lse.fill<float>(std::numeric_limits<float>::quiet_NaN());
  CUDA_OK(dev.out.upload(res.out));
  CUDA_OK(dev.lse.upload(res.lse));
  ASSERT_EQ(dev.decode(pr, pr.bf16 ? KF_KV_BF16 : KF_KV_FP16), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(dev.download_results(res));
  EXPECT_EQ(out1, res.out.snapshot()) << "rerun changed out";
  EXPECT_EQ(lse1, res.lse.snapshot()) << "rerun changed lse";
}

#endif  // KF_TESTS_WITH_CUDA

struct Sm90aCase {
  bool bf16;
  int page_size, h_q, s_q;
};
std::string case_name(const Sm90aCase& c) {
  return std::string(c.bf16 ? "Bf16" : "Fp16") + "Page" + std::to_string(c.page_size) + "Hq" +
         std::to_string(c.h_q) + "Sq" + std::to_string(c.s_q);
}
void PrintTo(const Sm90aCase& c, std::ostream* os) { *os << case_name(c); }

class GpuSm90aDecode : public ::testing::TestWithParam<Sm90aCase> {};

// Per worker count (the default, 1: every request on one block, two rounds of pieces; 5: split
// requests): the CPU backend's result, then the portable family and the sm_90a family against
// it, the sm_90a rerun bit for bit, and the sm_90a result against float64 (default workers).
TEST_P(GpuSm90aDecode, MatchesCpuBackendLikeThePortableFamily) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  KF_REQUIRE_SM90A();
  const Sm90aCase& c = GetParam();
  auto rng = test_rng();
  Problem pr;
  pr.bf16 = c.bf16;
  pr.page_size = c.page_size;
  pr.h_q = c.h_q;
  pr.s_q = c.s_q;
  pr.batch = int(kLengths.size());
  pr.seqlens = kLengths;
  std::shuffle(pr.seqlens.begin(), pr.seqlens.end(), rng);
  int default_workers = 0;
  ASSERT_EQ(kf_mla_default_num_workers_for_format(0, c.h_q, c.s_q, KF_KV_BF16, &default_workers),
            KF_SUCCESS)
      << kf_last_error();
  for (int workers : {default_workers, 1, 5}) {
    SCOPED_TRACE("num_workers " + std::to_string(workers));
    pr.num_workers = workers;
    Built cpu = build_problem(pr, rng);  // NaN padding, scattered pages
    DeviceProblem dev(cpu);
    ASSERT_TRUE(dev.ok());
    ASSERT_EQ(run_decode(cpu), KF_SUCCESS) << kf_last_error();
    Built res = build_problem(pr, rng);  // host buffers of the same shapes for the results
    {
      SCOPED_TRACE("KF_KERNEL_FAMILY=sm80");
      decode_with("sm80", pr, dev, res);
      expect_close_to(res, cpu);
    }
    SCOPED_TRACE("sm_90a family");
    decode_with("sm90a", pr, dev, res);
    expect_close_to(res, cpu);
    expect_rerun_identical("sm90a", pr, dev, res);
    if (workers == default_workers) {
      CUDA_OK(dev.download_results(cpu));  // the sm_90a result beside the inputs it came from
      expect_matches_reference(cpu);
    }
  }
#endif
}

std::vector<Sm90aCase> sm90a_cases() {
  std::vector<Sm90aCase> v;
  for (bool bf16 : {true, false})
    for (int page : {16, 32, 64})
      for (int h_q : {16, 64, 128})
        for (int s_q : {1, 2}) v.push_back({bf16, page, h_q, s_q});
  // Row counts that leave padding rows in a 64-row tile: 40 rows in one tile, 72 in two (the
  // second holds 8 rows and 56 of padding).
  v.push_back({true, 64, 40, 1});
  v.push_back({false, 32, 24, 3});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuSm90aDecode, ::testing::ValuesIn(sm90a_cases()),
                         [](const ::testing::TestParamInfo<Sm90aCase>& i) {
                           return case_name(i.param);
                         });

// A long request split over many workers, with h_q 128 and s_q 2 (256 rows, 4 row tiles): the
// partials and the combine, against the CPU backend.
// The metadata follows the family that will decode it (MlaMetadataParams::spread): for a 128-row
// call of one 4096-token request on 66 workers the sm_90a family puts half the workers on the
// even ones (pieces of two tiles), the portable family keeps every worker. Each is the CPU walk's
// bytes for the flag its header records.
TEST(GpuSm90aMetadata, SpreadFollowsTheFamily) {
  KF_REQUIRE_SM90A();
  const std::vector<int32_t> lens = {4096};
  HostTensor sl(kI32, {1});
  sl.ptr<int32_t>()[0] = lens[0];
  DeviceTensor dsl(sl);
  ASSERT_TRUE(dsl.ok());
  size_t n = 0;
  ASSERT_EQ(kf_mla_metadata_size(1, 66, &n), KF_SUCCESS);
  HostTensor meta(kI32, {int64_t(n)});
  for (const char* family : {"sm80", "sm90a"}) {
    FamilyScope scope(family);
    const bool spread = std::string(family) == "sm90a";
    meta.fill<int32_t>(-1);
    DeviceTensor dmeta(meta);
    ASSERT_TRUE(dmeta.ok());
    ASSERT_EQ(kf_mla_metadata_for_format(dsl.dl(), 128, 1, 66, KF_KV_BF16, dmeta.dl(), nullptr),
              KF_SUCCESS)
        << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(dmeta.download(meta));
    const int32_t* m = meta.ptr<int32_t>();
    EXPECT_EQ(m[kf::kMetaSpreadIdx], spread ? 1 : 0) << family;
    EXPECT_EQ(m[kf::kMetaTotalPiecesIdx], spread ? 32 : 64) << family;
    std::vector<int32_t> want(n);
    kf::build_schedule(lens.data(), 1, 128, 1, 66, kf::kFixedCost16, spread, want.data());
    EXPECT_EQ(0, std::memcmp(m, want.data(), n * sizeof(int32_t))) << family;
  }
}

TEST(GpuSm90aDecodeSplit, LongRequestsMatchCpuBackend) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  KF_REQUIRE_SM90A();
  auto rng = test_rng();
  Problem pr;
  pr.batch = 3;
  pr.h_q = 128;
  pr.s_q = 2;
  pr.num_workers = 132;
  pr.seqlens = {9000, 4097, 33};
  Built cpu = build_problem(pr, rng);
  DeviceProblem dev(cpu);
  ASSERT_TRUE(dev.ok());
  ASSERT_EQ(run_decode(cpu), KF_SUCCESS) << kf_last_error();
  Built res = build_problem(pr, rng);
  decode_with("sm90a", pr, dev, res);
  expect_close_to(res, cpu);
  CUDA_OK(dev.download_results(cpu));
  expect_matches_reference(cpu);
#endif
}

// Causal decodes of many query tokens (s_q up to 16: up to 2048 rows, 32 row tiles), with
// requests shorter than s_q (their first rows see nothing), against the CPU backend and float64.
TEST(GpuSm90aDecodeCausal, ManyQueryTokensMatchCpuBackend) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  KF_REQUIRE_SM90A();
  struct Shape {
    int h_q, s_q;
  };
  for (const Shape sh : {Shape{16, 16}, Shape{128, 4}, Shape{8, 3}, Shape{128, 16}}) {
    SCOPED_TRACE("h_q " + std::to_string(sh.h_q) + " s_q " + std::to_string(sh.s_q));
    auto rng = test_rng(uint64_t(sh.h_q) * 100 + sh.s_q);
    Problem pr;
    pr.batch = 5;
    pr.h_q = sh.h_q;
    pr.s_q = sh.s_q;
    pr.page_size = 32;
    pr.num_workers = 20;
    pr.seqlens = {0, 2, 15, 64, 300};
    Built cpu = build_problem(pr, rng);
    DeviceProblem dev(cpu);
    ASSERT_TRUE(dev.ok());
    ASSERT_EQ(run_decode(cpu), KF_SUCCESS) << kf_last_error();
    Built res = build_problem(pr, rng);
    decode_with("sm90a", pr, dev, res);
    expect_close_to(res, cpu);
    CUDA_OK(dev.download_results(cpu));
    expect_matches_reference(cpu);
  }
#endif
}

// docs/spec.md section 6 through the split of a tile between the wgmma kernel's two consumer
// warpgroups: a NaN or Inf in the rope dims of token 104 of request 1 (tile token 40, scored by
// warpgroup 1) makes that token's score non-finite, so every row that sees the token (s = 1;
// with s_q 2 and length 105 row s = 0 sees tokens 0 .. 103) is NaN in all 512 output dims (warpgroup
// 0's dims get it only through the shared P tile) and in lse; every other row keeps the bits of a
// clean run. The portable family gives the same NaN rows. One worker per request, and split.
TEST(GpuSm90aDecodeNonFinite, TokenScoredByTheSecondWarpgroupMakesItsRowsNaN) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  KF_REQUIRE_SM90A();
  const int bad_req = 1, bad_tok = 104, bad_dim = 540, bad_s = 1;
  for (const float bad : {NAN, INFINITY})
    for (const int workers : {3, 7}) {
      SCOPED_TRACE("bad " + std::to_string(bad) + ", workers " + std::to_string(workers));
      Problem pr;
      pr.batch = 3;
      pr.h_q = 64;
      pr.s_q = 2;
      pr.page_size = 32;
      pr.num_workers = workers;
      pr.seqlens = {300, 105, 200};
      auto rng1 = test_rng(7), rng2 = test_rng(7);
      Built clean = build_problem(pr, rng1), b = build_problem(pr, rng2);
      const int page = b.block_table.ptr<int32_t>()[bad_req * b.max_pages + bad_tok / pr.page_size];
      b.cache.ptr<uint16_t>()[(int64_t(page) * pr.page_size + bad_tok % pr.page_size) * 576 +
                              bad_dim] = to_16(bad, pr.bf16);
      DeviceProblem dev_clean(clean), dev(b);
      ASSERT_TRUE(dev_clean.ok() && dev.ok());
      decode_with("sm90a", pr, dev_clean, clean);
      for (const char* family : {"sm90a", "sm80"}) {
        SCOPED_TRACE(std::string("KF_KERNEL_FAMILY=") + family);
        decode_with(family, pr, dev, b);
        for (int r = 0; r < pr.batch; ++r)
          for (int s = 0; s < pr.s_q; ++s)
            for (int h = 0; h < pr.h_q; ++h) {
              const size_t li = (size_t(r) * pr.h_q + h) * pr.s_q + s;
              const float lse = b.lse.ptr<float>()[li], clean_lse = clean.lse.ptr<float>()[li];
              const std::vector<double> o = out_row(b, r, s, h);
              const std::string row = std::to_string(r) + "," + std::to_string(s) + "," +
                                      std::to_string(h);
              if (r == bad_req && s == bad_s) {
                ASSERT_TRUE(std::isnan(lse)) << "row " << row << " lse " << lse;
                for (int d = 0; d < 512; ++d) ASSERT_TRUE(std::isnan(o[d])) << row << " out[" << d << "]";
              } else if (std::string(family) == "sm90a") {
                ASSERT_EQ(std::memcmp(&lse, &clean_lse, sizeof(float)), 0) << "row " << row;
                ASSERT_EQ(o, out_row(clean, r, s, h)) << "row " << row;
              } else {
                ASSERT_TRUE(std::isfinite(lse)) << "row " << row;
              }
            }
      }
    }
#endif
}

// A CUDA graph captured with the sm_90a kernel, replayed with new lengths, equals an eager run.
TEST(GpuSm90aDecodeGraph, ReplayWithNewLengthsMatchesEager) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  KF_REQUIRE_SM90A();
  FamilyScope scope("");
  auto rng = test_rng();
  Problem pr;
  pr.batch = 4;
  pr.h_q = 128;
  pr.s_q = 1;
  pr.num_workers = 40;
  pr.seqlens = {900, 900, 900, 900};
  Built b = build_problem(pr, rng);
  DeviceProblem dev(b);
  ASSERT_TRUE(dev.ok());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const kf_status captured = dev.step(pr, KF_KV_BF16, nullptr, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, KF_SUCCESS) << kf_last_error();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < pr.batch; ++r) b.cache_seqlens.ptr<int32_t>()[r] = 70 + 250 * r;
  CUDA_OK(dev.cache_seqlens.upload(b.cache_seqlens));
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

}  // namespace
