// src/core/half_convert.h against the tests' own conversions: every 16-bit code, random floats,
// ties, overflow, subnormals and NaN.
#include "core/half_convert.h"
#include "test_util.h"

using namespace kft;

namespace {

std::vector<float> probe_floats() {
  auto rng = test_rng();
  std::uniform_real_distribution<float> logmag(-30.f, 20.f);
  std::vector<float> xs = {0.f, -0.f, 65504.f, 65519.f, 65520.f, -65520.f, 1e30f, INFINITY, -INFINITY,
                           std::ldexp(1.f, -24), std::ldexp(1.f, -25), std::ldexp(1.5f, -25), std::ldexp(1.f, -14),
                           std::ldexp(1023.f, -24), std::ldexp(2047.f, -25), 1.f + std::ldexp(1.f, -11),
                           1.f + std::ldexp(3.f, -11), 3.4e38f, -3.4e38f, 1.f + std::ldexp(1.f, -8)};
  for (int i = 0; i < 50000; ++i) xs.push_back((i & 1 ? -1.f : 1.f) * std::exp2(logmag(rng)));
  return xs;
}

// Every 16-bit code of a format decodes to the reference value and encodes back to itself
// (NaN codes: to some NaN).
template <typename Ref, typename Decode, typename Encode>
void expect_every_code_round_trips(Ref reference, Decode decode, Encode encode) {
  for (int c = 0; c < 65536; ++c) {
    const double want = reference(uint16_t(c));
    const float got = decode(uint16_t(c));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << c;
      ASSERT_TRUE(std::isnan(decode(encode(got)))) << c;
      continue;
    }
    ASSERT_EQ(double(got), want) << c;
    ASSERT_EQ(encode(got), uint16_t(c)) << c;
  }
}

TEST(HalfConvert, EveryFp16CodeDecodesAndRoundTrips) {
  expect_every_code_round_trips(from_f16, kf::half_to_float, kf::float_to_half);
}

TEST(HalfConvert, Fp16EncodeRoundsToNearestEven) {
  for (float x : probe_floats()) ASSERT_EQ(kf::float_to_half(x), to_f16(x)) << x;
  // midpoints between neighbouring codes
  for (int c = 0; c < 0x7bff; ++c) {
    const float mid = float((from_f16(uint16_t(c)) + from_f16(uint16_t(c + 1))) / 2);
    ASSERT_EQ(kf::float_to_half(mid), to_f16(mid)) << c;
    ASSERT_EQ(kf::float_to_half(mid) & 1, 0) << "tie to even at code " << c;
  }
}

TEST(HalfConvert, EveryBf16CodeDecodesAndRoundTrips) {
  expect_every_code_round_trips(from_bf16, kf::bf16_to_float, kf::float_to_bf16);
}

TEST(HalfConvert, Bf16EncodeRoundsToNearestEvenAndKeepsNaN) {
  for (float x : probe_floats()) ASSERT_EQ(kf::float_to_bf16(x), to_bf16(x)) << x;
  EXPECT_EQ(kf::float_to_bf16(1.f + std::ldexp(1.f, -8)), 0x3f80);  // tie: down to even
  EXPECT_EQ(kf::float_to_bf16(1.f + std::ldexp(3.f, -8)), 0x3f82);  // tie: up to even
  uint32_t nan_bits = 0x7fffffff;  // rounding the payload would carry into the exponent
  float nan;
  std::memcpy(&nan, &nan_bits, 4);
  EXPECT_TRUE(std::isnan(kf::bf16_to_float(kf::float_to_bf16(nan))));
}

}  // namespace
