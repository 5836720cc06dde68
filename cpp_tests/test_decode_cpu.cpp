// CPU decode through the C API against the float64 reference (docs/spec.md section 4
// thresholds), on fresh random data with scattered pages, NaN page padding and poisoned outputs.
#include "core/scheduler.h"
#include "test_util.h"

using namespace kft;

namespace {

struct DecodeCase {
  const char* name;
  bool bf16;
  int batch, s_q, h_q, page_size, max_len, num_workers;
  double zero_fraction;
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

class CpuDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(CpuDecode, MatchesFloat64Reference) {
  const DecodeCase& c = GetParam();
  auto rng = test_rng();
  Problem pr = problem_of(c);
  pr.num_workers = c.num_workers;
  pr.seqlens = random_lengths(rng, c.batch, c.max_len, c.zero_fraction);
  Built b = build_problem(pr, rng);
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  expect_matches_reference(b);
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> v;
  // every power-of-two page size 1..256
  static const char* ps_names[] = {"Page1", "Page2", "Page4", "Page8", "Page16",
                                   "Page32", "Page64", "Page128", "Page256"};
  for (int i = 0; i <= 8; ++i) v.push_back({ps_names[i], true, 3, 1, 16, 1 << i, 1000, 5, 0.0});
  // h_q 1/16/128 x s_q 1..4 (causal), variable and zero lengths
  static const char* hs_names[3][4] = {
      {"Hq1Sq1", "Hq1Sq2", "Hq1Sq3", "Hq1Sq4"},
      {"Hq16Sq1", "Hq16Sq2", "Hq16Sq3", "Hq16Sq4"},
      {"Hq128Sq1", "Hq128Sq2", "Hq128Sq3", "Hq128Sq4"}};
  const int hs[3] = {1, 16, 128};
  for (int i = 0; i < 3; ++i)
    for (int s = 1; s <= 4; ++s)
      v.push_back({hs_names[i][s - 1], true, 3, s, hs[i], 64, hs[i] == 128 ? 400 : 1000, 7, 0.2});
  v.push_back({"Fp16Page16", false, 3, 1, 16, 16, 400, 5, 0.2});
  v.push_back({"Fp16Hq128Sq2", false, 2, 2, 128, 64, 150, 6, 0.0});
  v.push_back({"OneWorker", true, 4, 1, 16, 32, 300, 1, 0.25});
  v.push_back({"ManyWorkersFewRequests", true, 2, 2, 16, 64, 900, 40, 0.0});
  v.push_back({"MoreWorkersThanTiles", true, 1, 1, 16, 16, 70, 64, 0.0});
  v.push_back({"ShortCausalRows", true, 6, 4, 16, 2, 5, 3, 0.3});
  v.push_back({"LongSplitRequest", true, 1, 1, 16, 64, 5000, 9, 0.0});
  v.push_back({"MostlyEmpty", true, 8, 1, 16, 16, 100, 4, 0.75});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuDecode, ::testing::ValuesIn(decode_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) { return std::string(i.param.name); });

Problem split_problem(std::mt19937_64& rng) {
  Problem pr;
  pr.batch = 3;
  pr.s_q = 2;
  pr.h_q = 16;
  pr.page_size = 16;
  pr.num_workers = 11;
  pr.seqlens = random_lengths(rng, pr.batch, 700, 0.0);
  return pr;
}

// A split problem (changed by `base`) and a variant of it (changed by `vary` as well), built
// from the same random numbers and both decoded; status_a/b are the decode calls' statuses.
struct Twins {
  Problem pr;
  Built a, b;
  kf_status status_a, status_b;
  std::string error;
};
template <typename Base, typename Vary>
Twins decode_twins(int seed, Base base, Vary vary) {
  auto rng1 = test_rng(seed), rng2 = test_rng(seed);
  Twins t;
  t.pr = split_problem(rng1);
  split_problem(rng2);
  base(t.pr);
  Problem v = t.pr;
  vary(v);
  t.a = build_problem(t.pr, rng1);
  t.b = build_problem(v, rng2);
  t.status_a = run_decode(t.a);
  if (t.status_a != KF_SUCCESS) t.error = kf_last_error();
  t.status_b = run_decode(t.b);
  if (t.status_b != KF_SUCCESS) t.error = kf_last_error();
  return t;
}
auto no_change = [](Problem&) {};

TEST(CpuDecodeSchedule, SplitRequestsAreCombined) {
  auto rng = test_rng();
  Problem pr = split_problem(rng);
  Built b = build_problem(pr, rng);
  // The metadata must split at least one request, or this does not test the combine.
  const int32_t* meta = b.metadata.ptr<int32_t>();
  ASSERT_GT(meta[7], pr.batch) << "total pieces";
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  expect_matches_reference(b);
}

TEST(CpuDecodeDeterminism, RerunsAreBitIdentical) {
  auto rng = test_rng();
  Built b = build_problem(split_problem(rng), rng);
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  const auto out1 = b.out.snapshot(), lse1 = b.lse.snapshot();
  b.out.fill<uint16_t>(0x1234);  // different poison, stale workspace
  b.lse.fill<float>(7.f);
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  EXPECT_EQ(out1, b.out.snapshot());
  EXPECT_EQ(lse1, b.lse.snapshot());
}

TEST(CpuDecodeDeterminism, WorkspacePoisonDoesNotMatter) {
  auto rng = test_rng();
  Built b = build_problem(split_problem(rng), rng);
  b.workspace.fill<uint8_t>(0x00);
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  const auto out1 = b.out.snapshot(), lse1 = b.lse.snapshot();
  b.workspace.fill<uint8_t>(0x7f);
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  EXPECT_EQ(out1, b.out.snapshot());
  EXPECT_EQ(lse1, b.lse.snapshot());
}

TEST(CpuDecodePadding, NaNBeyondSeqlenGivesTheSameBits) {
  // s_q = 3: causal rows stop short of seqlen too; the twin has zero padding, same draws.
  Twins t = decode_twins(1, [](Problem& p) { p.s_q = 3; }, [](Problem& p) { p.nan_padding = false; });
  ASSERT_EQ(t.status_a, KF_SUCCESS) << t.error;
  ASSERT_EQ(t.status_b, KF_SUCCESS) << t.error;
  EXPECT_EQ(t.a.out.snapshot(), t.b.out.snapshot());
  EXPECT_EQ(t.a.lse.snapshot(), t.b.lse.snapshot());
}

TEST(CpuDecodeLayout, StridedQAndOutGiveTheSameBits) {
  Twins t = decode_twins(2, no_change, [](Problem& p) { p.strided = true; });
  ASSERT_EQ(t.status_a, KF_SUCCESS) << t.error;
  ASSERT_EQ(t.status_b, KF_SUCCESS) << t.error;
  const Problem& pr = t.pr;
  Built &a = t.a, &s = t.b;
  for (int r = 0; r < pr.batch; ++r)
    for (int q = 0; q < pr.s_q; ++q)
      for (int h = 0; h < pr.h_q; ++h) ASSERT_EQ(out_row(a, r, q, h), out_row(s, r, q, h));
  EXPECT_EQ(a.lse.snapshot(), s.lse.snapshot());
  expect_matches_reference(s);
}

TEST(CpuDecodeLayout, FourDimensionalCacheGivesTheSameBits) {
  Twins t = decode_twins(3, no_change, [](Problem& p) { p.cache_4d = true; });
  ASSERT_EQ(t.status_a, KF_SUCCESS) << t.error;
  ASSERT_EQ(t.status_b, KF_SUCCESS) << t.error;
  EXPECT_EQ(t.a.out.snapshot(), t.b.out.snapshot());
  EXPECT_EQ(t.a.lse.snapshot(), t.b.lse.snapshot());
}

TEST(CpuDecodeSchedule, WorkerCountChangesRoundingOnly) {
  Twins t = decode_twins(4, no_change, [](Problem& p) { p.num_workers = 1; });
  ASSERT_EQ(t.status_a, KF_SUCCESS) << t.error;
  ASSERT_EQ(t.status_b, KF_SUCCESS) << t.error;
  const Problem& pr = t.pr;
  Built &a = t.a, &o = t.b;
  double worst = 0;
  for (int r = 0; r < pr.batch; ++r)
    for (int q = 0; q < pr.s_q; ++q)
      for (int h = 0; h < pr.h_q; ++h) {
        const auto x = out_row(a, r, q, h), y = out_row(o, r, q, h);
        worst = std::max(worst, cosine_distance(x, y.data(), 512));
      }
  EXPECT_LT(worst, 1e-5);
  for (int i = 0; i < pr.batch * pr.h_q * pr.s_q; ++i)
    EXPECT_NEAR(a.lse.ptr<float>()[i], o.lse.ptr<float>()[i], 1e-5);
}

TEST(CpuDecodeEmpty, AllRequestsEmptyGiveZeroAndMinusInf) {
  auto rng = test_rng();
  Problem pr;
  pr.batch = 4;
  pr.s_q = 2;
  pr.seqlens = {0, 0, 0, 0};
  pr.num_workers = 3;
  Built b = build_problem(pr, rng);
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  for (int i = 0; i < pr.batch * pr.h_q * pr.s_q; ++i) EXPECT_EQ(b.lse.ptr<float>()[i], -INFINITY);
  for (int64_t i = 0; i < b.out.numel(); ++i) ASSERT_EQ(b.out.ptr<uint16_t>()[i], 0) << i;
}

TEST(CpuDecodeScale, SoftmaxScaleIsApplied) {
  // lse of a one-token request is scale * <q, k>: checks the scale is used, not 576^-0.5.
  auto rng = test_rng();
  Problem pr;
  pr.batch = 1;
  pr.h_q = 1;
  pr.seqlens = {1};
  pr.scale = 0.135234f;
  Built b = build_problem(pr, rng);
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  double dot = 0;
  for (int d = 0; d < 576; ++d) dot += b.q[d] * b.kv[0][d];
  EXPECT_NEAR(b.lse.ptr<float>()[0], 0.135234 * dot, 1e-4);
  const auto o = out_row(b, 0, 0, 0);
  for (int d = 0; d < 512; ++d) EXPECT_EQ(o[d], b.kv[0][d]) << d;  // one token: o = v exactly
}

// docs/spec.md section 6: a NaN or Inf in one query row makes that row's out and lse NaN also
// when its request is split over workers and merged (the merge's maximum must not drop a NaN
// piece), and leaves every other row's bits as they are.
TEST(CpuDecodeNonFinite, QueryRowIsNaNAtEveryWorkerCount) {
  for (const float bad : {NAN, INFINITY, -INFINITY})
    for (const int workers : {1, 2, 11, 132}) {
      SCOPED_TRACE("bad " + std::to_string(bad) + ", workers " + std::to_string(workers));
      auto rng1 = test_rng(workers), rng2 = test_rng(workers);
      Problem pr = split_problem(rng1);
      split_problem(rng2);
      pr.num_workers = workers;
      pr.seqlens = {300, 2000, 40};  // the long request is split from 2 workers on
      Built clean = build_problem(pr, rng1), b = build_problem(pr, rng2);
      // The request with the most pieces, split when there is more than one worker.
      const int32_t* piece_offset = kf::meta_piece_offset(b.metadata.ptr<int32_t>(), workers);
      int r = 0;
      for (int i = 1; i < pr.batch; ++i)
        if (piece_offset[i + 1] - piece_offset[i] > piece_offset[r + 1] - piece_offset[r]) r = i;
      if (workers > 1) {
        ASSERT_GT(piece_offset[r + 1] - piece_offset[r], 1) << "no split request";
      }
      const int s = pr.s_q - 1, h = 5, d = 100;
      b.q_t.ptr<uint16_t>()[((size_t(r) * pr.s_q + s) * pr.h_q + h) * 576 + d] =
          to_16(bad, pr.bf16);
      ASSERT_EQ(run_decode(clean), KF_SUCCESS) << kf_last_error();
      ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
      for (int rr = 0; rr < pr.batch; ++rr)
        for (int ss = 0; ss < pr.s_q; ++ss)
          for (int hh = 0; hh < pr.h_q; ++hh) {
            const size_t li = (size_t(rr) * pr.h_q + hh) * pr.s_q + ss;
            const float lse = b.lse.ptr<float>()[li], clean_lse = clean.lse.ptr<float>()[li];
            const std::vector<double> o = out_row(b, rr, ss, hh);
            if (rr == r && ss == s && hh == h) {
              EXPECT_TRUE(std::isnan(lse)) << "lse " << lse;
              for (int k = 0; k < 512; ++k) ASSERT_TRUE(std::isnan(o[k])) << "out[" << k << "]";
            } else {
              const std::string row =
                  std::to_string(rr) + "," + std::to_string(ss) + "," + std::to_string(hh);
              ASSERT_EQ(std::memcmp(&lse, &clean_lse, sizeof(float)), 0) << "row " << row;
              ASSERT_EQ(o, out_row(clean, rr, ss, hh)) << "row " << row;
            }
          }
    }
}

TEST(CpuDecodeErrorBuffer, StaysClearOnValidInput) {
  auto rng = test_rng();
  Built b = build_problem(split_problem(rng), rng);
  HostTensor eb(kI32, {4});
  eb.ptr<int32_t>()[1] = -1;
  ASSERT_EQ(run_decode(b, eb.dl()), KF_SUCCESS) << kf_last_error();
  EXPECT_EQ(eb.ptr<int32_t>()[0], 0);
  EXPECT_EQ(eb.ptr<int32_t>()[1], -1);
  expect_matches_reference(b);
}

}  // namespace
