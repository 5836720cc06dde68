// kf_linear (out = x weight^T, the fused layer's skinny GEMM as an operation): the CPU backend
// against a float64 reference, the size query, every argument error, and on a GPU the kernels
// (narrow and wide, split and unsplit) against the CPU backend, with NaN in the rows' padding,
// a poisoned out, reruns and the workspace left zero.
#include "gpu_util.h"

#include <cmath>
#include <functional>
#include <random>

namespace kft {
namespace {

struct LinearProblem {
  int m, n, k;
  int64_t ldx, ldw, ldy;  // row strides (elements); > k or n leaves padding
  HostTensor x, w, y, ws;
};

// Random x and weight (values of either sign, magnitude about 1), NaN in every row's padding,
// out poisoned with NaN, the workspace zero-filled.
LinearProblem make_problem(int m, int n, int k, bool padded, std::mt19937_64& rng) {
  LinearProblem p{m, n, k, padded ? k + 64 : k, padded ? k + 8 : k, padded ? n + 3 : n, {}, {}, {}, {}};
  p.x = HostTensor(kBF16, {m, k}, {p.ldx, 1});
  p.w = HostTensor(kBF16, {n, k}, {p.ldw, 1});
  p.y = HostTensor(kBF16, {m, n}, {p.ldy, 1});
  std::normal_distribution<float> nd(0.f, 1.f);
  p.x.fill<uint16_t>(0x7fc0);
  p.w.fill<uint16_t>(0x7fc0);
  p.y.fill<uint16_t>(0x7fc0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < k; ++j) p.x.ptr<uint16_t>()[i * p.ldx + j] = to_bf16(nd(rng));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < k; ++j) p.w.ptr<uint16_t>()[i * p.ldw + j] = to_bf16(nd(rng) * 0.05f);
  size_t bytes = 0;
  EXPECT_EQ(kf_linear_workspace_size(m, n, k, &bytes), KF_SUCCESS) << kf_last_error();
  p.ws = HostTensor(kU8, {int64_t(std::max<size_t>(bytes, 1))});
  return p;
}

double ref_value(LinearProblem& p, int i, int j) {
  double s = 0;
  for (int t = 0; t < p.k; ++t)
    s += from_bf16(p.x.ptr<uint16_t>()[i * p.ldx + t]) * from_bf16(p.w.ptr<uint16_t>()[j * p.ldw + t]);
  return s;
}

// out against the float64 sums: within one bf16 rounding (2^-8 relative) plus the fp32 sum's
// error, which grows with k.
void expect_matches_reference(LinearProblem& p, const char* what) {
  int bad = 0;
  for (int i = 0; i < p.m; ++i)
    for (int j = 0; j < p.n; ++j) {
      const double r = ref_value(p, i, j), got = from_bf16(p.y.ptr<uint16_t>()[i * p.ldy + j]);
      const double tol = std::ldexp(std::fabs(r), -8) + 1e-6 * p.k;
      if (!(std::fabs(got - r) <= tol) && bad++ < 3)
        ADD_FAILURE() << what << " m " << p.m << " n " << p.n << " k " << p.k << ": out[" << i
                      << "][" << j << "] = " << got << ", expected " << r;
    }
  EXPECT_EQ(bad, 0) << what;
}

TEST(LinearCpu, MatchesFloat64Reference) {
  auto rng = test_rng();
  for (auto [m, n, k] : {std::tuple{1, 1, 64}, {3, 300, 128}, {8, 577, 2048}, {33, 64, 512},
                         {128, 40, 192}}) {
    for (bool padded : {false, true}) {
      LinearProblem p = make_problem(m, n, k, padded, rng);
      ASSERT_EQ(kf_linear(p.x.dl(), p.w.dl(), p.y.dl(), p.ws.dl(), nullptr), KF_SUCCESS)
          << kf_last_error();
      expect_matches_reference(p, padded ? "cpu, padded rows" : "cpu");
      // The padding of out's rows is left alone (row 0's lies inside the tensor when m > 1).
      if (padded && m > 1) EXPECT_EQ(p.y.ptr<uint16_t>()[p.n], 0x7fc0);
    }
  }
}

TEST(LinearCpu, WorkspaceSize) {
  size_t b = 1;
  // The narrow kernel (<= 32 rows, k <= 2048) never splits: no workspace.
  ASSERT_EQ(kf_linear_workspace_size(32, 3648, 2048, &b), KF_SUCCESS);
  EXPECT_EQ(b, 0u);
  // Many tiles: one split each, no workspace.
  ASSERT_EQ(kf_linear_workspace_size(64, 64 * 264, 2048, &b), KF_SUCCESS);
  EXPECT_EQ(b, 0u);
  // Few tiles over a long k split it: partials and counters.
  ASSERT_EQ(kf_linear_workspace_size(64, 2048, 2048, &b), KF_SUCCESS);
  EXPECT_GT(b, size_t(264) * 64 * 64 * 4);
  ASSERT_EQ(kf_linear_workspace_size(1, 1536, 7168, &b), KF_SUCCESS);
  EXPECT_GT(b, 0u);
  EXPECT_EQ(kf_linear_workspace_size(0, 8, 64, &b), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("m: expected 1..128, got 0"), std::string::npos);
  EXPECT_EQ(kf_linear_workspace_size(129, 8, 64, &b), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kf_linear_workspace_size(8, 0, 64, &b), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("n: expected"), std::string::npos);
  EXPECT_EQ(kf_linear_workspace_size(8, 8, 96, &b), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("k: expected a multiple of 64, got 96"),
            std::string::npos);
  EXPECT_EQ(kf_linear_workspace_size(8, 8, 64, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find("bytes"), std::string::npos);
}

struct LinearErrorCase {
  const char* name;
  std::function<void(LinearProblem&, DLTensor*&, DLTensor*&, DLTensor*&, DLTensor*&)> breaks;
  const char* message;  // a substring of kf_last_error()
};
void PrintTo(const LinearErrorCase& c, std::ostream* os) { *os << c.name; }

class LinearErrors : public ::testing::TestWithParam<LinearErrorCase> {};

// Each broken call fails naming the argument and writes nothing into out.
TEST_P(LinearErrors, NamesTheArgument) {
  auto rng = test_rng();
  LinearProblem p = make_problem(64, 256, 2048, false, rng);  // splits: needs a workspace
  DLTensor *x = p.x.dl(), *w = p.w.dl(), *y = p.y.dl(), *ws = p.ws.dl();
  ASSERT_EQ(kf_linear(x, w, y, ws, nullptr), KF_SUCCESS) << kf_last_error();
  p.y.fill<uint16_t>(0x7fc0);
  const auto before = p.y.snapshot();
  GetParam().breaks(p, x, w, y, ws);
  EXPECT_EQ(kf_linear(x, w, y, ws, nullptr), KF_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kf_last_error()).find(GetParam().message), std::string::npos)
      << "message: " << kf_last_error() << "\nexpected to contain: " << GetParam().message;
  EXPECT_EQ(p.y.snapshot(), before) << "out written by a failed call";
}

// A tensor a broken case points the call at, kept alive to the end of the process.
HostTensor& keep(HostTensor t) {
  static std::vector<std::unique_ptr<HostTensor>> kept;
  kept.push_back(std::make_unique<HostTensor>(std::move(t)));
  return *kept.back();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LinearErrors,
    ::testing::Values(
        LinearErrorCase{"x_null", [](auto&, auto& x, auto&, auto&, auto&) { x = nullptr; },
                        "x: expected a tensor, got NULL"},
        LinearErrorCase{"weight_null", [](auto&, auto&, auto& w, auto&, auto&) { w = nullptr; },
                        "weight: expected a tensor, got NULL"},
        LinearErrorCase{"out_null", [](auto&, auto&, auto&, auto& y, auto&) { y = nullptr; },
                        "out: expected a tensor, got NULL"},
        LinearErrorCase{"x_fp16",
                        [](auto&, auto& x, auto&, auto&, auto&) {
                          x = keep(HostTensor(DLDataType{kDLFloat, 16, 1}, {64, 2048})).dl();
                        },
                        "x: expected dtype bfloat16, got float16"},
        LinearErrorCase{"x_3d",
                        [](auto&, auto& x, auto&, auto&, auto&) {
                          x = keep(HostTensor(kBF16, {64, 1, 2048})).dl();
                        },
                        "x: expected 2 dimensions [m, k], got 3"},
        LinearErrorCase{"m_129",
                        [](auto&, auto& x, auto&, auto&, auto&) {
                          x = keep(HostTensor(kBF16, {129, 2048})).dl();
                        },
                        "x.shape[0] (m): expected 1..128, got 129"},
        LinearErrorCase{"m_0",
                        [](auto&, auto& x, auto&, auto&, auto&) {
                          x = keep(HostTensor(kBF16, {0, 2048})).dl();
                        },
                        "x.shape[0] (m): expected 1..128, got 0"},
        LinearErrorCase{"k_not_64",
                        [](auto&, auto& x, auto& w, auto&, auto&) {
                          x = keep(HostTensor(kBF16, {64, 2000})).dl();
                          w = keep(HostTensor(kBF16, {256, 2000})).dl();
                        },
                        "x.shape[1] (k): expected a multiple of 64, got 2000"},
        LinearErrorCase{"weight_k",
                        [](auto&, auto&, auto& w, auto&, auto&) {
                          w = keep(HostTensor(kBF16, {256, 1024})).dl();
                        },
                        "weight: expected shape[1] (k (x.shape[1])) = 2048"},
        LinearErrorCase{"out_n",
                        [](auto&, auto&, auto&, auto& y, auto&) {
                          y = keep(HostTensor(kBF16, {64, 255})).dl();
                        },
                        "out: expected shape[1] (n (weight.shape[0])) = 256"},
        LinearErrorCase{"x_row_stride",
                        [](auto&, auto& x, auto&, auto&, auto&) {
                          x = keep(HostTensor(kBF16, {64, 2048}, {2052, 1})).dl();
                        },
                        "x: expected stride[0] a multiple of 8 elements"},
        LinearErrorCase{"weight_columns_strided",
                        [](auto&, auto&, auto& w, auto&, auto&) {
                          w = keep(HostTensor(kBF16, {256, 2048}, {1, 256})).dl();
                        },
                        "weight: expected"},
        LinearErrorCase{"out_overlaps_x",
                        [](auto& p, auto&, auto&, auto& y, auto&) {
                          static DLTensor t;
                          t = *p.x.dl();  // x's first rows seen as out [64, 256]
                          static int64_t shape[2] = {64, 256}, strides[2] = {2048, 1};
                          t.shape = shape;
                          t.strides = strides;
                          y = &t;
                        },
                        "out: expected memory apart from x"},
        LinearErrorCase{"workspace_null", [](auto&, auto&, auto&, auto&, auto& ws) { ws = nullptr; },
                        "workspace: expected at least"},
        LinearErrorCase{"workspace_small",
                        [](auto&, auto&, auto&, auto&, auto& ws) {
                          ws = keep(HostTensor(kU8, {1024})).dl();
                        },
                        "workspace: expected at least"}));

#if KF_TESTS_WITH_CUDA

// The GPU result against the CPU backend's on the same inputs: within one bf16 rounding of the
// larger of the two (the fp32 sums run in another order), and over the whole output within
// 1e-6 cosine distance.
void expect_gpu_matches_cpu(LinearProblem& g, LinearProblem& c, const char* what) {
  double dot = 0, gg = 0, cc = 0;
  int bad = 0;
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      const double a = from_bf16(g.y.ptr<uint16_t>()[i * g.ldy + j]);
      const double b = from_bf16(c.y.ptr<uint16_t>()[i * c.ldy + j]);
      dot += a * b, gg += a * a, cc += b * b;
      if (!(std::fabs(a - b) <= std::ldexp(std::max(std::fabs(a), std::fabs(b)), -7) + 1e-6 * g.k) &&
          bad++ < 3)
        ADD_FAILURE() << what << " m " << g.m << " n " << g.n << " k " << g.k << ": out[" << i
                      << "][" << j << "] = " << a << " on the GPU, " << b << " on the CPU";
    }
  EXPECT_EQ(bad, 0) << what;
  EXPECT_LT(1 - dot / std::sqrt(gg * cc), 1e-6) << what;
}

// One shape: the CPU backend, then the GPU into a NaN-poisoned out, compared; a rerun gives the
// same bits and leaves the workspace zero.
void check_gpu(int m, int n, int k, bool padded, std::mt19937_64& rng) {
  LinearProblem c = make_problem(m, n, k, padded, rng);
  LinearProblem g = c;  // the inputs shared (a HostTensor copy shares its buffer), out its own
  g.y = HostTensor(kBF16, {m, n}, {c.ldy, 1});
  g.y.fill<uint16_t>(0x7fc0);
  ASSERT_EQ(kf_linear(c.x.dl(), c.w.dl(), c.y.dl(), c.ws.dl(), nullptr), KF_SUCCESS)
      << kf_last_error();
  DeviceTensor x(c.x), w(c.w), y(g.y), ws(c.ws);
  ASSERT_TRUE(x.ok() && w.ok() && y.ok() && ws.ok());
  ASSERT_EQ(kf_linear(x.dl(), w.dl(), y.dl(), ws.dl(), nullptr), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(y.download(g.y));
  expect_gpu_matches_cpu(g, c, padded ? "padded rows" : "compact");
  if (padded && m > 1) EXPECT_EQ(g.y.ptr<uint16_t>()[n], 0x7fc0) << "out's row padding written";
  const auto first = g.y.snapshot();
  ASSERT_EQ(kf_linear(x.dl(), w.dl(), y.dl(), ws.dl(), nullptr), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(y.download(g.y));
  EXPECT_EQ(g.y.snapshot(), first) << "rerun m " << m << " n " << n << " k " << k;
  HostTensor wsh(kU8, {int64_t(c.ws.bytes())});
  CUDA_OK(ws.download(wsh));
  int nonzero = 0;
  for (size_t i = 0; i < wsh.bytes(); ++i) nonzero += wsh.ptr<uint8_t>()[i] != 0;
  EXPECT_EQ(nonzero, 0) << "workspace not left zero, m " << m << " n " << n << " k " << k;
}

TEST(GpuLinear, MatchesCpuBackendAndReruns) {
  KF_REQUIRE_GPU();
  auto rng = test_rng();
  // Narrow (<= 32 rows, k <= 2048), wide unsplit and split, one and two stages of k.
  for (auto [m, n, k] : {std::tuple{1, 3648, 2048}, {8, 300, 2048}, {16, 1, 64}, {32, 2048, 128},
                         {33, 577, 2048}, {64, 2048, 2048}, {128, 576, 512}, {1, 1536, 7168},
                         {64, 7168, 1536}, {128, 64, 4096}})
    for (bool padded : {false, true}) check_gpu(m, n, k, padded, rng);
}

// The small shapes scripts/sanitize.sh runs under compute-sanitizer: the narrow kernel, and the
// wide one splitting k (the workspace's partials and counters; through a cluster on sm_90).
TEST(GpuSanitizeLinear, NarrowAndSplit) {
  KF_REQUIRE_GPU();
  auto rng = test_rng();
  check_gpu(8, 100, 256, true, rng);
  check_gpu(64, 100, 1024, true, rng);
}

#endif

}  // namespace
}  // namespace kft
