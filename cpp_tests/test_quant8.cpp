// 8-bit caches (KF_KV_FP8_E4M3, KF_KV_INT8) on the CPU: the conversions against brute force, the
// bytes quantize-on-write puts in a sectioned page (non-finite tokens included), and decode
// accuracy (docs/spec.md sections 2, 4, 6).
#include "core/quant.h"
#include "test_util.h"

using namespace kft;

namespace {

// ---- an independent quantizer: brute-force nearest e4m3, std::nearbyint for int8 ----------

double e4m3_value(uint8_t code) {  // from the format's definition
  const int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}

uint8_t e4m3_brute(float y) {
  if (std::isnan(y)) return 0x7f;
  const uint8_t sign = std::signbit(y) ? 0x80 : 0;
  const double a = std::fabs(double(y));
  if (a >= 448.0) return sign | 0x7e;
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double err = std::fabs(e4m3_value(uint8_t(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {  // ties to the even code
      best = uint8_t(c);
      best_err = err;
    }
  }
  return sign | best;
}

int8_t int8_ref(float y) {
  const float r = std::nearbyint(y);  // default rounding: to nearest even
  return int8_t(std::max(-127.f, std::min(127.f, r)));
}

constexpr uint32_t kScaleNaN = 0x7fc00000u;  // the scale of a latent with a NaN or Inf

float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Expected bytes of one token: latent codes, the bf16 rope, and the scale. A latent with a NaN
// or an Inf stores zero codes and the NaN scale (docs/spec.md section 6).
struct Token8 {
  uint8_t latent[512];
  uint16_t rope[64];
  float scale;
};
Token8 quantize_ref(const uint16_t* row, bool bf16, bool e4m3) {
  Token8 t{};
  float x[512];
  float amax = 0;
  bool finite = true;
  for (int i = 0; i < 512; ++i) {
    x[i] = float(from_16(row[i], bf16));
    finite = finite && std::isfinite(x[i]);
    if (finite) amax = std::max(amax, std::fabs(x[i]));
  }
  const float qmax = e4m3 ? 448.f : 127.f;
  if (!finite) {
    t.scale = float_of_bits(kScaleNaN);
  } else if (amax > 0) {
    const float inv = qmax / amax;
    for (int i = 0; i < 512; ++i)
      t.latent[i] = e4m3 ? e4m3_brute(x[i] * inv) : uint8_t(int8_ref(x[i] * inv));
    t.scale = amax / qmax;
  }
  for (int i = 0; i < 64; ++i) t.rope[i] = to_bf16(float(from_16(row[512 + i], bf16)));
  return t;
}

// ---- conversions ----------------------------------------------------------------------------

TEST(Quant8Convert, E4m3DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_value(uint8_t(c));
    const float got = kf::e4m3_to_float(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << c;
    }
  }
}

TEST(Quant8Convert, E4m3EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(kf::float_to_e4m3(kf::e4m3_to_float(uint8_t(c))), uint8_t(c)) << c;
  }
}

TEST(Quant8Convert, E4m3EncodeMatchesBruteForce) {
  auto rng = test_rng();
  std::uniform_real_distribution<float> logmag(-14.f, 10.f);
  std::vector<float> xs = {0.f, -0.f, 448.f, -448.f, 449.f, 464.f, 1e6f, INFINITY, -INFINITY,
                           std::ldexp(1.f, -10), std::ldexp(1.f, -9), std::ldexp(1.5f, -10), std::ldexp(1.f, -6),
                           std::ldexp(0.9375f, -6), 1.0625f, 1.1875f, 416.f, 432.f, 440.f, 447.9f};
  for (int i = 0; i < 20000; ++i) xs.push_back((i & 1 ? -1.f : 1.f) * std::exp2(logmag(rng)));
  // exact midpoints between neighbouring codes: ties go to the even code
  for (int c = 0; c < 0x7e; ++c) xs.push_back(float((e4m3_value(uint8_t(c)) + e4m3_value(uint8_t(c + 1))) / 2));
  for (float x : xs) ASSERT_EQ(kf::float_to_e4m3(x), e4m3_brute(x)) << x;
  EXPECT_EQ(kf::float_to_e4m3(NAN) & 0x7f, 0x7f);
}

TEST(Quant8Convert, Int8RoundsHalfToEvenAndSaturates) {
  const std::pair<float, int> cases[] = {{2.5f, 2},  {3.5f, 4},    {-2.5f, -2}, {-3.5f, -4},  {0.5f, 0},
                                         {1.5f, 2},  {126.5f, 126}, {127.4f, 127}, {200.f, 127}, {-1e9f, -127},
                                         {-0.4f, 0}, {0.f, 0}};
  for (auto [x, want] : cases) EXPECT_EQ(int(kf::float_to_int8_sat(x)), want) << x;
  EXPECT_EQ(int(kf::float_to_int8_sat(NAN)), 0);
}

TEST(Quant8Convert, ZeroLatentStoresZerosAndScaleZero) {
  float x[512] = {};
  uint8_t q[512];
  std::memset(q, 0xab, sizeof(q));
  EXPECT_EQ(kf::quantize_latent(x, true, q), 0.f);
  for (uint8_t v : q) ASSERT_EQ(v, 0);
  std::memset(q, 0xab, sizeof(q));
  EXPECT_EQ(kf::quantize_latent(x, false, q), 0.f);
  for (uint8_t v : q) ASSERT_EQ(v, 0);
}

TEST(Quant8Convert, LargestMagnitudeMapsToQmax) {
  auto rng = test_rng();
  std::normal_distribution<float> normal;
  float x[512];
  for (float& v : x) v = normal(rng);
  x[77] = -9.f;  // the amax, negative
  uint8_t q[512];
  EXPECT_EQ(kf::quantize_latent(x, true, q), 9.f / 448.f);
  EXPECT_EQ(q[77], 0xfe);  // -448
  EXPECT_EQ(kf::quantize_latent(x, false, q), 9.f / 127.f);
  EXPECT_EQ(int8_t(q[77]), -127);
}

TEST(Quant8Convert, NonFiniteLatentStoresZeroCodesAndNaNScale) {
  auto rng = test_rng();
  std::normal_distribution<float> normal;
  for (const float bad : {NAN, INFINITY, -INFINITY})
    for (const int at : {0, 200, 511})
      for (const bool e4m3 : {true, false}) {
        float x[512];
        for (float& v : x) v = normal(rng);
        x[at] = bad;
        uint8_t q[512];
        std::memset(q, 0xab, sizeof(q));
        EXPECT_EQ(bits_of(kf::quantize_latent(x, e4m3, q)), kScaleNaN) << bad << " at " << at;
        for (uint8_t v : q) ASSERT_EQ(v, 0) << bad << " at " << at;
        // Every value of the token decodes to NaN.
        for (uint8_t v : q)
          ASSERT_TRUE(std::isnan(kf::dequant_latent_value(v, e4m3, float_of_bits(kScaleNaN))));
      }
}

TEST(Quant8Convert, AmaxStepCountsNaNAsInfinityInAnyOrder) {
  // The GPU reduces per-lane maxima with fmaxf: +Inf must survive any order of the steps.
  const float vals[] = {1.f, -3.f, NAN, 2.f, -INFINITY, 0.5f};
  float fwd = 0.f, rev = 0.f;
  for (float v : vals) fwd = kf::latent_amax_step(fwd, v);
  for (int i = 5; i >= 0; --i) rev = kf::latent_amax_step(rev, vals[i]);
  EXPECT_EQ(fwd, INFINITY);
  EXPECT_EQ(rev, INFINITY);
  EXPECT_EQ(std::fmax(kf::latent_amax_step(0.f, NAN), 7.f), INFINITY);
  EXPECT_FALSE(kf::latent_has_codes(INFINITY));
  EXPECT_FALSE(kf::latent_has_codes(0.f));
  EXPECT_TRUE(kf::latent_has_codes(1e-30f));
}

// ---- append: the sectioned page -------------------------------------------------------------

struct Append8Case {
  const char* name;
  kf_kv_format fmt;
  bool bf16;
  int page_size;
};
void PrintTo(const Append8Case& c, std::ostream* os) { *os << c.name; }
class Append8 : public ::testing::TestWithParam<Append8Case> {};

TEST_P(Append8, WritesTheSectionedPageBytes) {
  const Append8Case& c = GetParam();
  const bool e4m3 = c.fmt == KF_KV_FP8_E4M3;
  auto rng = test_rng();
  std::normal_distribution<float> normal;
  const int num_pages = 3, ps = c.page_size, n = 2 * ps;
  HostTensor kv(c.bf16 ? kBF16 : kF16, {n, 576}), slots(kI64, {n}), cache(kU8, {num_pages, ps, 644});
  for (int i = 0; i < n; ++i)
    for (int d = 0; d < 576; ++d)
      kv.ptr<uint16_t>()[i * 576 + d] = to_16(i == 3 && d < 512 ? 0.f : normal(rng) * (d % 37 == 0 ? 8 : 1), c.bf16);
  // Non-finite tokens: NaN / +Inf / -Inf in the latent (zero codes, NaN scale), Inf in the rope.
  kv.ptr<uint16_t>()[4 * 576 + 17] = nan_16(c.bf16);
  kv.ptr<uint16_t>()[5 * 576 + 511] = to_16(INFINITY, c.bf16);
  kv.ptr<uint16_t>()[6 * 576 + 0] = to_16(-INFINITY, c.bf16);
  kv.ptr<uint16_t>()[7 * 576 + 530] = to_16(INFINITY, c.bf16);
  std::vector<int64_t> perm(num_pages * ps);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = i % 9 == 8 ? -1 : perm[i];
  cache.fill_bytes(0x5a);
  ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), c.fmt, slots.dl(), nullptr, nullptr), KF_SUCCESS) << kf_last_error();

  // Expected page bytes: untouched 0x5a except the written tokens' three parts.
  std::vector<uint8_t> want(cache.bytes(), 0x5a);
  for (int i = 0; i < n; ++i) {
    const int64_t s = slots.ptr<int64_t>()[i];
    if (s < 0) continue;
    const int64_t page = s / ps, t = s % ps;
    uint8_t* base = want.data() + page * ps * 644;
    const Token8 tok = quantize_ref(kv.ptr<uint16_t>() + i * 576, c.bf16, e4m3);
    std::memcpy(base + t * 512, tok.latent, 512);
    std::memcpy(base + ps * 512 + t * 128, tok.rope, 128);
    std::memcpy(base + ps * 640 + t * 4, &tok.scale, 4);
  }
  const auto got = cache.snapshot();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(int(got[i]), int(want[i])) << "byte " << i;
}

INSTANTIATE_TEST_SUITE_P(Cases, Append8,
                         ::testing::Values(Append8Case{"Fp8Bf16Page16", KF_KV_FP8_E4M3, true, 16},
                                           Append8Case{"Fp8Fp16Page64", KF_KV_FP8_E4M3, false, 64},
                                           Append8Case{"Int8Bf16Page32", KF_KV_INT8, true, 32},
                                           Append8Case{"Int8Fp16Page256", KF_KV_INT8, false, 256}),
                         [](const ::testing::TestParamInfo<Append8Case>& i) { return std::string(i.param.name); });

// ---- decode -----------------------------------------------------------------------------------

// The cache's values as the decode must see them: code * scale, rope in bf16.
std::vector<std::vector<double>> dequantized(Built& b, HostTensor& cache, bool e4m3) {
  const Problem& pr = b.pr;
  const int ps = pr.page_size;
  std::vector<std::vector<double>> kv(pr.batch);
  for (int r = 0; r < pr.batch; ++r) {
    kv[r].resize(size_t(pr.seqlens[r]) * 576);
    for (int t = 0; t < pr.seqlens[r]; ++t) {
      const int page = b.block_table.ptr<int32_t>()[r * b.max_pages + t / ps], o = t % ps;
      const uint8_t* base = cache.ptr<uint8_t>() + int64_t(page) * ps * 644;
      float scale;
      std::memcpy(&scale, base + ps * 640 + o * 4, 4);
      for (int d = 0; d < 512; ++d) {
        const uint8_t code = base[o * 512 + d];
        kv[r][size_t(t) * 576 + d] = (e4m3 ? e4m3_value(code) : double(int8_t(code))) * double(scale);
      }
      for (int d = 0; d < 64; ++d) {
        uint16_t h;
        std::memcpy(&h, base + ps * 512 + o * 128 + 2 * d, 2);
        kv[r][size_t(t) * 576 + 512 + d] = from_bf16(h);
      }
    }
  }
  return kv;
}

struct Decode8Case {
  const char* name;
  kf_kv_format fmt;
  bool bf16;
  int batch, s_q, h_q, page_size, max_len, num_workers;
};
void PrintTo(const Decode8Case& c, std::ostream* os) { *os << c.name; }
class Decode8 : public ::testing::TestWithParam<Decode8Case> {};

TEST_P(Decode8, MatchesReferenceOnTheDequantizedCache) {
  const Decode8Case& c = GetParam();
  auto rng = test_rng();
  Problem pr = problem_of(c);
  pr.num_workers = c.num_workers;
  pr.seqlens = random_lengths(rng, c.batch, c.max_len, 0.2);
  Built b = build_problem(pr, rng);
  HostTensor cache = append_8bit_cache(b, c.fmt, 0xff);
  ASSERT_EQ(decode_8bit(b, cache, c.fmt), KF_SUCCESS) << kf_last_error();
  b.kv = dequantized(b, cache, c.fmt == KF_KV_FP8_E4M3);
  expect_matches_reference(b);  // the decode itself: the 16-bit thresholds (docs/spec.md 4)
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Decode8,
    ::testing::Values(Decode8Case{"Fp8Hq16Page16", KF_KV_FP8_E4M3, true, 4, 1, 16, 16, 700, 5},
                      Decode8Case{"Fp8Hq128Sq2Page64", KF_KV_FP8_E4M3, true, 2, 2, 128, 64, 300, 6},
                      Decode8Case{"Fp8Fp16QPage256", KF_KV_FP8_E4M3, false, 3, 1, 16, 256, 900, 4},
                      Decode8Case{"Int8Hq16Sq4Page32", KF_KV_INT8, true, 4, 4, 16, 32, 500, 7},
                      Decode8Case{"Int8Hq128Page16", KF_KV_INT8, true, 2, 1, 128, 16, 300, 3},
                      Decode8Case{"Int8Fp16QPage64", KF_KV_INT8, false, 3, 2, 16, 64, 600, 9}),
    [](const ::testing::TestParamInfo<Decode8Case>& i) { return std::string(i.param.name); });

// docs/spec.md section 4: against the unquantized cache, N(0, 1) data, s_k >= 1024, V2-Lite
// scale, cosine distance over the whole output below 3e-3 (FP8) and 5e-4 (INT8).
void check_accuracy(kf_kv_format fmt, double limit) {
  auto rng = test_rng();
  Problem pr;
  pr.batch = 4;
  pr.h_q = 16;
  pr.page_size = 64;
  pr.num_workers = 6;
  pr.seqlens = {1024, 1500, 2048, 1100};
  Built b = build_problem(pr, rng);
  HostTensor cache = append_8bit_cache(b, fmt, 0xff);
  ASSERT_EQ(decode_8bit(b, cache, fmt), KF_SUCCESS) << kf_last_error();
  const Reference ref = reference_decode(b);  // the unquantized cache
  double xy = 0, xx = 0, yy = 0, worst_row = 0;
  for (int r = 0; r < pr.batch; ++r)
    for (int h = 0; h < pr.h_q; ++h) {
      const auto o = out_row(b, r, 0, h);
      const double* ro = &ref.o[(size_t(r) * pr.h_q + h) * 512];
      worst_row = std::max(worst_row, cosine_distance(o, ro, 512));
      for (int d = 0; d < 512; ++d) {
        xy += o[d] * ro[d];
        xx += o[d] * o[d];
        yy += ro[d] * ro[d];
      }
    }
  const double whole = 1 - 2 * xy / (xx + yy);
  ::testing::Test::RecordProperty("whole_output_cosine_distance", std::to_string(whole));
  ::testing::Test::RecordProperty("worst_row_cosine_distance", std::to_string(worst_row));
  if (std::getenv("KF_TEST_VERBOSE")) std::printf("  whole output %.3g, worst row %.3g\n", whole, worst_row);
  EXPECT_LT(whole, limit);
}

TEST(Decode8Accuracy, Fp8AgainstUnquantizedCache) { check_accuracy(KF_KV_FP8_E4M3, 3e-3); }
TEST(Decode8Accuracy, Int8AgainstUnquantizedCache) { check_accuracy(KF_KV_INT8, 5e-4); }

TEST(Decode8Padding, GarbageBeyondSeqlenGivesTheSameBits) {
  for (kf_kv_format fmt : {KF_KV_FP8_E4M3, KF_KV_INT8}) {
    auto rng = test_rng(fmt);
    Problem pr;
    pr.batch = 3;
    pr.s_q = 3;
    pr.page_size = 32;
    pr.num_workers = 7;
    pr.seqlens = random_lengths(rng, pr.batch, 500, 0.0);
    Built b = build_problem(pr, rng);
    HostTensor nan_pad = append_8bit_cache(b, fmt, 0xff), zero_pad = append_8bit_cache(b, fmt, 0x00);
    ASSERT_EQ(decode_8bit(b, nan_pad, fmt), KF_SUCCESS) << kf_last_error();
    const auto out1 = b.out.snapshot(), lse1 = b.lse.snapshot();
    ASSERT_EQ(decode_8bit(b, zero_pad, fmt), KF_SUCCESS) << kf_last_error();
    EXPECT_EQ(out1, b.out.snapshot());
    EXPECT_EQ(lse1, b.lse.snapshot());
  }
}

}  // namespace
