// Snapshot of the 16-bit-only traits as of 2026-11-30 (before the 8-bit work), for research/perf.
#pragma once

#include "core/mla_shape.h"

namespace kf::cuda {

constexpr int kSm86MaxSmemPerBlock = 101376;  // 99 KiB opt-in: the smallest of sm_80/86/89/90

template <int kMFrags_, int kRowGroups_, int kBlockN_, int kStages_>
struct MlaDecodeTraits {
  static constexpr int kMFrags = kMFrags_;  // 16-row mma fragments per warp
  static constexpr int kRowGroups = kRowGroups_;
  static constexpr int kDimGroups = 4;
  static constexpr int kNumWarps = kRowGroups * kDimGroups;
  static constexpr int kNumThreads = kNumWarps * 32;
  static constexpr int kRowsPerGroup = kMFrags * 16;
  static constexpr int kBlockM = kRowGroups * kRowsPerGroup;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;

  static constexpr int kQkDims = kHeadDim / kDimGroups;     // 144 dims of q.k per warp
  static constexpr int kQkSteps = kQkDims / 16;             // k16 steps
  static constexpr int kPvDims = kLatentDim / kDimGroups;   // 128 output dims per warp
  static constexpr int kPvFrags = kPvDims / 8;              // n8 fragments
  static constexpr int kNFrags = kBlockN / 8;               // n8 fragments of a score tile
  static constexpr int kRowChunks = kHeadDim * 2 / 16;      // 16-byte chunks per cache row
  static constexpr int kThreadsPerToken = kNumThreads / kBlockN;  // cp.async issue mapping

  static constexpr int kSoftRows = kRowsPerGroup / kDimGroups;
  static constexpr int kSoftThreadsPerRow = 32 / kSoftRows;
  static constexpr int kSoftTokens = kBlockN / kSoftThreadsPerRow;

  static constexpr int kMaxPieces = 8;

  static constexpr int kKvTileBytes = kBlockN * kHeadDim * 2;
  static constexpr int kKvOff = 0;
  static constexpr int kSpartOff = kKvOff + kStages * kKvTileBytes;
  static constexpr int kSpartBytes = kDimGroups * kBlockM * kBlockN * 4;
  static constexpr int kPOff = kSpartOff + kSpartBytes;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;
  static constexpr int kAlphaOff = kPOff + kPBytes;
  static constexpr int kInvLOff = kAlphaOff + kBlockM * 4;
  static constexpr int kRowMaxOff = kInvLOff + kBlockM * 4;
  static constexpr int kRowSumOff = kRowMaxOff + kNumThreads * 4;
  static constexpr int kVisOff = kRowSumOff + kNumThreads * 4;
  static constexpr int kTokOkOff = kVisOff + kNumThreads * 4;
  static constexpr int kTokOkBytes = (kStages * kBlockN + 15) / 16 * 16;
  static constexpr int kQpeOff = kTokOkOff + kTokOkBytes;
  static constexpr int kQpeBytes = kBlockM * kRopeDim * 2;
  static constexpr int kPieceOff = kQpeOff + kQpeBytes;
  static constexpr int kPieceBytes = kMaxPieces * 32 + 16;
  static constexpr int kSmemBytes = kPieceOff + kPieceBytes;

  static_assert(kSmemBytes <= kSm86MaxSmemPerBlock, "does not fit sm_86's 99 KiB per block");
  static_assert(kHeadDim % (kDimGroups * 16) == 0 && kLatentDim % (kDimGroups * 16) == 0, "");
  static_assert(kBlockN == 16 || kBlockN == 32, "score swizzles are written for 16 or 32 tokens");
  static_assert(kNumThreads % kBlockN == 0 && kSoftTokens >= 2, "");
  static_assert(kStages >= 2, "");
};

using MlaTraitsM16 = MlaDecodeTraits<1, 1, 16, 5>;
using MlaTraitsM32 = MlaDecodeTraits<2, 1, 16, 4>;
using MlaTraitsM64 = MlaDecodeTraits<2, 2, 16, 3>;

}  // namespace kf::cuda
