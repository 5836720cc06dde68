// The rule that picks the decode kernel's instantiation (src/cuda/decode/decode_config.h), on the
// CPU: every row count the C API accepts, every cache format, with and without two 32-row blocks
// fitting an SM. The launch, mla_row_tiles and the default worker count all read this rule.
#include <gtest/gtest.h>

#include "cuda/decode/decode_config.h"

namespace {

using kf::KvFormat;
using kf::cuda::DecodeConfig;

constexpr KvFormat kFormats[] = {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3,
                                 KvFormat::kINT8};

TEST(DecodeConfig, EveryRowCountAndFormat) {
  for (KvFormat f : kFormats) {
    for (int fit = 0; fit < 2; ++fit) {
      for (int rows = 1; rows <= kf::kMaxHeads * kf::kMaxSq; ++rows) {
        int asked = 0;
        const DecodeConfig c = kf::cuda::decode_config(rows, f, [&] {
          ++asked;
          return fit == 1;
        });
        const int per_tile = kf::cuda::decode_config_rows(c);
        const int tiles = kf::cuda::decode_config_row_tiles(c, rows);
        SCOPED_TRACE(testing::Message() << "format " << int(f) << " rows " << rows << " fit " << fit);
        // The tiles cover the rows, and no tile is empty.
        EXPECT_GE(tiles * per_tile, rows);
        EXPECT_LT((tiles - 1) * per_tile, rows);
        if (kf::is_8bit(f)) {
          EXPECT_EQ(c, f == KvFormat::kINT8 ? DecodeConfig::kInt8Rows16 : DecodeConfig::kE4M3Rows16);
          EXPECT_EQ(per_tile, 16);
          EXPECT_EQ(asked, 0);
        } else if (rows <= 16) {
          EXPECT_EQ(c, DecodeConfig::k16Rows16);
          EXPECT_EQ(tiles, 1);
          EXPECT_EQ(asked, 0);
        } else if (rows <= 32) {
          EXPECT_EQ(c, DecodeConfig::k16Rows32);
          EXPECT_EQ(tiles, 1);
          EXPECT_EQ(asked, 0);
        } else {
          // Only here does the occupancy answer matter, and it is asked once.
          EXPECT_EQ(asked, 1);
          EXPECT_EQ(c, fit ? DecodeConfig::k16Rows32 : DecodeConfig::k16Rows64);
          EXPECT_EQ(per_tile, fit ? 32 : 64);
        }
      }
    }
  }
}

// The instantiation each configuration names: its cache format and, below, its rows per block
// (a change of the traits shows up here).
TEST(DecodeConfig, Instances) {
  const auto fmt = [](DecodeConfig c) {
    return kf::cuda::with_instance(c, [](auto in) { return int(decltype(in)::kFmt); });
  };
  const auto is8 = [](DecodeConfig c) {
    return kf::cuda::with_instance(c, [](auto in) { return decltype(in)::Traits::kKv8; });
  };
  for (DecodeConfig c : {DecodeConfig::k16Rows16, DecodeConfig::k16Rows32, DecodeConfig::k16Rows64}) {
    EXPECT_EQ(fmt(c), kf::cuda::kKvFmt16);
    EXPECT_FALSE(is8(c));
  }
  EXPECT_EQ(fmt(DecodeConfig::kE4M3Rows16), kf::cuda::kKvFmtE4M3);
  EXPECT_EQ(fmt(DecodeConfig::kInt8Rows16), kf::cuda::kKvFmtInt8);
  EXPECT_TRUE(is8(DecodeConfig::kE4M3Rows16));
  EXPECT_TRUE(is8(DecodeConfig::kInt8Rows16));

  EXPECT_EQ(kf::cuda::decode_config_rows(DecodeConfig::k16Rows16), 16);
  EXPECT_EQ(kf::cuda::decode_config_rows(DecodeConfig::k16Rows32), 32);
  EXPECT_EQ(kf::cuda::decode_config_rows(DecodeConfig::k16Rows64), 64);
  EXPECT_EQ(kf::cuda::decode_config_rows(DecodeConfig::kE4M3Rows16), 16);
  EXPECT_EQ(kf::cuda::decode_config_rows(DecodeConfig::kInt8Rows16), 16);
  // h_q 128, s_q 1: 4 tiles of 32 rows on sm_90, 2 of 64 on sm_80/86/89; 8 of 16 for 8-bit.
  EXPECT_EQ(kf::cuda::decode_config_row_tiles(DecodeConfig::k16Rows32, 128), 4);
  EXPECT_EQ(kf::cuda::decode_config_row_tiles(DecodeConfig::k16Rows64, 128), 2);
  EXPECT_EQ(kf::cuda::decode_config_row_tiles(DecodeConfig::kInt8Rows16, 128), 8);
}

}  // namespace
