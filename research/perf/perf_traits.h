// Traits of the research versions (v1+): the shipped MlaDecodeTraits plus the switches the
// experiments add. Same layout rules; every configuration fits sm_86's 101376 bytes.
#pragma once

#include "core/mla_shape.h"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

template <int kMFrags_, int kRowGroups_, int kBlockN_, int kStages_, int kMinBlocks_ = 1,
          bool kDeferPv_ = false, bool kQpeSmem_ = true, bool kLazyRescale_ = false>
struct PerfTraits {
  static constexpr int kMFrags = kMFrags_;
  static constexpr int kRowGroups = kRowGroups_;
  static constexpr int kDimGroups = 4;
  static constexpr int kNumWarps = kRowGroups * kDimGroups;
  static constexpr int kNumThreads = kNumWarps * 32;
  static constexpr int kRowsPerGroup = kMFrags * 16;
  static constexpr int kBlockM = kRowGroups * kRowsPerGroup;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;  // __launch_bounds__ minimum blocks per SM
  // Row group 1 runs its P V one tile late, so its mma phases overlap group 0's softmax.
  static constexpr bool kDeferPv = kDeferPv_;
  static constexpr bool kQpeSmem = kQpeSmem_;
  static constexpr bool kLazyRescale = kLazyRescale_;  // rescale O only when the max grows by 2^8

  static constexpr int kQkDims = kHeadDim / kDimGroups;
  static constexpr int kQkSteps = kQkDims / 16;
  static constexpr int kPvDims = kLatentDim / kDimGroups;
  static constexpr int kPvFrags = kPvDims / 8;
  static constexpr int kNFrags = kBlockN / 8;
  static constexpr int kRowChunks = kHeadDim * 2 / 16;
  // cp.async mapping: >= 8 threads per token (the swizzle), each thread kTokPerThread tokens.
  static constexpr int kThreadsPerToken = kNumThreads / kBlockN >= 8 ? kNumThreads / kBlockN : 8;
  static constexpr int kTokPerThread = kBlockN * kThreadsPerToken / kNumThreads;
  static constexpr int kTokStride = kNumThreads / kThreadsPerToken;

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
  static constexpr int kQpeBytes = kQpeSmem ? kBlockM * kRopeDim * 2 : 0;
  static constexpr int kPieceOff = kQpeOff + kQpeBytes;
  static constexpr int kPieceBytes = kMaxPieces * 32 + 16;
  static constexpr int kSmemBytes = kPieceOff + kPieceBytes;

  static_assert(kSmemBytes <= kSm86MaxSmemPerBlock, "does not fit sm_86's 99 KiB per block");
  static_assert(kBlockN == 16 || kBlockN == 32, "score swizzles are written for 16 or 32 tokens");
  static_assert(kNumThreads % kBlockN == 0 && kSoftTokens >= 2, "");
  static_assert(kTokPerThread * kTokStride == kBlockN, "");
  static_assert(kStages >= (kDeferPv ? 3 : 2), "");
  static_assert(!kDeferPv || kRowGroups == 2, "");
};

}  // namespace kf::cuda
