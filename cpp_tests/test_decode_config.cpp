// The two rules that pick the kernels a call runs, on the CPU:
// - the kernel family of a device (src/cuda/family.h): every compute capability from sm_70 to
//   sm_120 against the default build, one-architecture builds and a build with the sm_90a family,
//   with and without KF_KERNEL_FAMILY=sm80;
// - the portable family's decode instantiation (src/cuda/decode/decode_config.h): every row count
//   the C API accepts, every cache format, with and without two 32-row blocks fitting an SM. The
//   launch, the row-tile count and the default worker count all read it;
// - the sm_90a family's choice between its own kernel and the portable ones
//   (src/cuda/decode/sm90a/decode_config_sm90a.h), with its row tiles.
#include <gtest/gtest.h>

#include <optional>

#include "cuda/decode/decode_config.h"
#include "cuda/decode/sm90a/decode_config_sm90a.h"
#include "cuda/family.h"

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

// ---- kernel families --------------------------------------------------------------------

using kf::cuda::BuildArchs;
using kf::cuda::FamilyRequest;
using kf::cuda::KernelFamily;

constexpr int kDevices[] = {70, 75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121};

std::optional<KernelFamily> pick(int cc, const BuildArchs& b,
                                 FamilyRequest r = FamilyRequest::kAuto) {
  return kf::cuda::pick_family(cc / 10, cc % 10, b, r);
}

// check(cc, default family) for every device of kDevices from sm_80 on; below sm_80 the build b
// must give no family.
template <class Check>
void for_each_device(const BuildArchs& b, Check check) {
  for (int cc : kDevices) {
    SCOPED_TRACE(cc);
    const std::optional<KernelFamily> f = pick(cc, b);
    if (cc < 80) {
      EXPECT_FALSE(f.has_value());
      continue;
    }
    ASSERT_TRUE(f.has_value());
    check(cc, *f);
  }
}

// 16-bit caches above 16 rows run the sm_90a kernel in 64-row tiles; 16 rows or fewer run the
// portable kernels; 8-bit caches run the sm_90a 8-bit kernel in 16-row tiles at every batch with
// its switch (KF_SM90A_KV8), without it from 64 (FP8) or 128 (INT8) 16-row tiles of batch at 64
// rows or fewer, never where the batch is not known (0).
TEST(DecodeConfigSm90a, KernelForSixteenBitCachesAboveSixteenRows) {
  for (KvFormat f : kFormats) {
    for (int rows = 1; rows <= kf::kMaxHeads * kf::kMaxSq; ++rows) {
      const bool bits16 = f == KvFormat::kBF16 || f == KvFormat::kFP16;
      EXPECT_EQ(kf::cuda::sm90a_kernel_runs(rows, f), bits16 && rows > 16)
          << "rows " << rows << " format " << int(f);
    }
  }
  EXPECT_EQ(kf::cuda::sm90a_row_tiles(17), 1);
  EXPECT_EQ(kf::cuda::sm90a_row_tiles(64), 1);
  EXPECT_EQ(kf::cuda::sm90a_row_tiles(65), 2);
  EXPECT_EQ(kf::cuda::sm90a_row_tiles(128), 2);
  EXPECT_EQ(kf::cuda::sm90a_row_tiles(256), 4);
  EXPECT_EQ(kf::cuda::sm90a_row_tiles(kf::kMaxHeads * kf::kMaxSq), 32);
  for (KvFormat f : kFormats) {
    const bool bits8 = f == KvFormat::kFP8E4M3 || f == KvFormat::kINT8;
    for (int rows : {1, 16, 17, 64, 65, 128})
      for (int batch : {0, 1, 63, 64, 127, 128, 4096}) {
        EXPECT_EQ(kf::cuda::sm90a_kv8_kernel_runs(f, true, rows, batch), bits8);
        const int64_t tiles = int64_t(batch) * ((rows + 15) / 16);
        const bool large = f == KvFormat::kINT8 ? tiles >= 128 : tiles >= 64;
        EXPECT_EQ(kf::cuda::sm90a_kv8_kernel_runs(f, false, rows, batch),
                  bits8 && rows <= 64 && batch > 0 && large)
            << "rows " << rows << " batch " << batch << " format " << int(f);
      }
  }
  EXPECT_TRUE(kf::cuda::sm90a_kv8_kernel_runs(KvFormat::kFP8E4M3, false, 16, 64));
  EXPECT_FALSE(kf::cuda::sm90a_kv8_kernel_runs(KvFormat::kFP8E4M3, false, 16, 32));
  EXPECT_TRUE(kf::cuda::sm90a_kv8_kernel_runs(KvFormat::kFP8E4M3, false, 64, 16));
  EXPECT_FALSE(kf::cuda::sm90a_kv8_kernel_runs(KvFormat::kINT8, false, 16, 64));
  EXPECT_TRUE(kf::cuda::sm90a_kv8_kernel_runs(KvFormat::kINT8, false, 16, 128));
  EXPECT_FALSE(kf::cuda::sm90a_kv8_kernel_runs(KvFormat::kFP8E4M3, false, 128, 4096));
  EXPECT_EQ(kf::cuda::sm90a_kv8_row_tiles(1), 1);
  EXPECT_EQ(kf::cuda::sm90a_kv8_row_tiles(16), 1);
  EXPECT_EQ(kf::cuda::sm90a_kv8_row_tiles(17), 2);
  EXPECT_EQ(kf::cuda::sm90a_kv8_row_tiles(128), 8);
}

// The wgmma kernel's calls (16-bit caches above 16 rows) let the schedule put half the workers
// on the even ones at small batch; the portable kernels' calls (16 rows or fewer, 8-bit caches)
// keep every worker.
TEST(DecodeConfigSm90a, SpreadAtSmallBatchForTheWgmmaKernelOnly) {
  for (KvFormat f : kFormats)
    for (int rows = 1; rows <= kf::kMaxHeads * kf::kMaxSq; ++rows)
      EXPECT_EQ(kf::cuda::sm90a_spread_small_batch(rows, f), kf::cuda::sm90a_kernel_runs(rows, f))
          << "rows " << rows << " format " << int(f);
  EXPECT_FALSE(kf::cuda::sm90a_spread_small_batch(16, KvFormat::kBF16));
  EXPECT_TRUE(kf::cuda::sm90a_spread_small_batch(128, KvFormat::kBF16));
  EXPECT_FALSE(kf::cuda::sm90a_spread_small_batch(128, KvFormat::kFP8E4M3));
}

TEST(KernelFamily, ParsesWhatCMakePasses) {
  const BuildArchs d = kf::cuda::parse_build_archs("80 86 89 90");
  EXPECT_EQ(d.sass, (std::vector<int>{80, 86, 89, 90}));
  EXPECT_EQ(d.ptx, 90);
  EXPECT_FALSE(d.sm90a);
  const BuildArchs h = kf::cuda::parse_build_archs("80 86 89 90 90a");
  EXPECT_EQ(h.sass, (std::vector<int>{80, 86, 89, 90}));
  EXPECT_EQ(h.ptx, 90);
  EXPECT_TRUE(h.sm90a);
  const BuildArchs one = kf::cuda::parse_build_archs("86");
  EXPECT_EQ(one.sass, (std::vector<int>{86}));
  EXPECT_EQ(one.ptx, 86);
  const BuildArchs cpu = kf::cuda::parse_build_archs("cpu-only");
  EXPECT_TRUE(cpu.sass.empty());
  EXPECT_EQ(cpu.ptx, 0);
  EXPECT_FALSE(pick(90, cpu).has_value());
}

// The default build (SASS for 80 86 89 90, PTX for 90): every device from sm_80 on runs the
// portable family, through SASS up to sm_90 and through the PTX beyond (sm_100, sm_120).
TEST(KernelFamily, DefaultBuildRunsPortableFromSm80On) {
  const BuildArchs b = kf::cuda::parse_build_archs("80 86 89 90");
  for_each_device(b, [&](int cc, KernelFamily f) {
    EXPECT_EQ(f, KernelFamily::kSm80);
    EXPECT_EQ(kf::cuda::portable_sass_runs(cc, b), cc < 100);
    EXPECT_EQ(kf::cuda::portable_ptx_runs(cc, b), cc >= 90);
  });
}

// SASS runs on the same major version at an equal or higher minor; PTX on any later device.
TEST(KernelFamily, OneArchitectureBuilds) {
  const BuildArchs b86 = kf::cuda::parse_build_archs("86");
  EXPECT_FALSE(pick(80, b86).has_value());  // 8.0 < 8.6 and no older SASS
  EXPECT_EQ(pick(86, b86), KernelFamily::kSm80);
  EXPECT_EQ(pick(89, b86), KernelFamily::kSm80);  // sm_86 SASS on 8.9
  EXPECT_TRUE(kf::cuda::portable_sass_runs(89, b86));
  EXPECT_EQ(pick(90, b86), KernelFamily::kSm80);  // compute_86 PTX, JIT
  EXPECT_FALSE(kf::cuda::portable_sass_runs(90, b86));
  EXPECT_EQ(pick(120, b86), KernelFamily::kSm80);

  const BuildArchs b90 = kf::cuda::parse_build_archs("90");
  for (int cc : {80, 86, 89}) EXPECT_FALSE(pick(cc, b90).has_value()) << cc;
  EXPECT_EQ(pick(90, b90), KernelFamily::kSm80);
  EXPECT_EQ(pick(100, b90), KernelFamily::kSm80);
}

// The sm_90a family runs on compute capability 9.0 alone (arch-specific SASS, no PTX), by default
// there and when asked for (KF_KERNEL_FAMILY=sm90a); sm80 runs the portable family everywhere.
TEST(KernelFamily, Sm90aOnlyOnSm90) {
  const BuildArchs b = kf::cuda::parse_build_archs("80 86 89 90 90a");
  for_each_device(b, [&](int cc, KernelFamily f) {
    const KernelFamily hopper = cc == 90 ? KernelFamily::kSm90a : KernelFamily::kSm80;
    EXPECT_EQ(f, hopper);  // the default
    EXPECT_EQ(pick(cc, b, FamilyRequest::kSm80), KernelFamily::kSm80);
    EXPECT_EQ(pick(cc, b, FamilyRequest::kSm90a), hopper);
    EXPECT_EQ(pick(cc, kf::cuda::parse_build_archs("80 86 89 90"), FamilyRequest::kSm90a),
              KernelFamily::kSm80);
  });
}

TEST(KernelFamily, EnvironmentRequest) {
  EXPECT_EQ(kf::cuda::parse_family_request(""), FamilyRequest::kAuto);
  EXPECT_EQ(kf::cuda::parse_family_request("auto"), FamilyRequest::kAuto);
  EXPECT_EQ(kf::cuda::parse_family_request("sm80"), FamilyRequest::kSm80);
  EXPECT_EQ(kf::cuda::parse_family_request("sm90a"), FamilyRequest::kSm90a);
  for (const char* bad : {"SM90A", "SM80", "sm_80", "0", "portable"})
    EXPECT_FALSE(kf::cuda::parse_family_request(bad).has_value()) << bad;
}

// The C API's KF_ERROR_UNSUPPORTED message: the device's architecture, what was built, and the
// rebuild that adds the device; for a device that only has PTX, the driver as the other fix.
TEST(KernelFamily, ImageErrorMessages) {
  const BuildArchs b90 = kf::cuda::parse_build_archs("90");
  EXPECT_EQ(kf::cuda::image_error_message(8, 6, b90, "cudaErrorNoKernelImageForDevice"),
            "no kernel image for sm_86 in this build (built for sm_90; "
            "cudaErrorNoKernelImageForDevice); rebuild with KF_CUDA_ARCHS=\"90;86\"");
  const BuildArchs d = kf::cuda::parse_build_archs("80 86 89 90");
  EXPECT_EQ(kf::cuda::image_error_message(12, 0, d, "cudaErrorUnsupportedPtxVersion"),
            "sm_120 runs this build's compute_90 PTX, which the driver could not compile "
            "(cudaErrorUnsupportedPtxVersion): update the driver, or rebuild with "
            "KF_CUDA_ARCHS=\"80;86;89;90;120\"");
  // A device the build names: the list stays as it is.
  EXPECT_NE(kf::cuda::image_error_message(9, 0, d, "cudaErrorInvalidDeviceFunction")
                .find("KF_CUDA_ARCHS=\"80;86;89;90\""),
            std::string::npos);
}

}  // namespace
