// Tile shapes of the portable (sm_80/86/89/90) MLA decode kernel: static constexpr only, one set
// for every architecture (the sm_90 build uses the sm_86 tiles, stages and shared memory).
//
// A block holds kBlockM query rows of one request and walks its worker's pieces in KV tiles of
// kBlockN tokens. Warps form kRowGroups x kDimGroups: a warp holds kMFrags x 16 rows; for QK it
// owns 144 of the 576 dims (split-K, partial scores reduced through shared memory), for PV it owns
// 128 of the 512 output dims. Every warp works on every KV tile.
//
// 8-bit caches (kKv8): the ring holds tiles in the page's own sections (kBlockN x 512 latent
// bytes | kBlockN x 128 rope bytes | kBlockN fp32 scales, 644 B per token), 16-byte chunks
// XOR-swizzled by the token like the 16-bit tiles. The warps read the 8-bit bytes straight into
// registers and convert them while building the mma fragments (kv8_dequant.cuh): no staging pass
// through shared memory, and the latent mma runs in fp16 for either q dtype.
#pragma once

#include "core/mla_shape.h"

namespace kf::cuda {

// The cache format a kernel instantiation reads: 16-bit rows in q's dtype, or an 8-bit format.
enum KvFmt { kKvFmt16 = 0, kKvFmtE4M3 = 1, kKvFmtInt8 = 2 };

constexpr int kSm86MaxSmemPerBlock = 101376;  // 99 KiB opt-in: the smallest of sm_80/86/89/90

template <int kMFrags_, int kRowGroups_, int kBlockN_, int kStages_, bool kKv8_ = false,
          bool kDeferPv_ = false>
struct MlaDecodeTraits {
  static constexpr bool kKv8 = kKv8_;
  // Row group 1 runs its P V one tile late, so its mma phase overlaps group 0's softmax (and
  // the other way round). It still reads tile t - 1 during tile t, so one fewer tile is in
  // flight ahead: kAhead tiles ahead of the one consumed, the refill target is tile t - kStages
  // + kAhead.
  static constexpr bool kDeferPv = kDeferPv_;
  static constexpr int kAhead = kDeferPv_ ? kStages_ - 2 : kStages_ - 1;
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
  static constexpr int kRowChunks = kHeadDim * 2 / 16;      // 16-byte chunks per 16-bit row
  static constexpr int kRowChunks8 = (kLatentDim + kRopeDim * 2) / 16;  // 8-bit: latent + rope
  // Softmax stage: each warp of a row group finishes kSoftRows rows of the group's scores.
  static constexpr int kSoftRows = kRowsPerGroup / kDimGroups;
  static constexpr int kSoftThreadsPerRow = 32 / kSoftRows;
  static constexpr int kSoftTokens = kBlockN / kSoftThreadsPerRow;

  static constexpr int kMaxPieces = 8;  // pieces of a worker staged in shared memory at once

  // Shared memory (bytes), all dynamic: KV ring | partial scores | P | row stats (alpha, 1/l,
  // running max and sum, causal limit; 8-bit: the O unit) | token flags | q_pe | piece list.
  static constexpr int kKvTileBytes = kKv8 ? kBlockN * kBytesPerToken8bit : kBlockN * kHeadDim * 2;
  static constexpr int kKv8RopeOff = kBlockN * kLatentDim;         // inside an 8-bit ring tile
  static constexpr int kKv8ScaleOff = kBlockN * (kLatentDim + kRopeDim * 2);
  static constexpr int kKvOff = 0;
  static constexpr int kSpartOff = kKvOff + kStages * kKvTileBytes;
  static constexpr int kSpartBytes = kDimGroups * kBlockM * kBlockN * 4;
  static constexpr int kPOff = kSpartOff + kSpartBytes;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;  // q's dtype; fp16 for 8-bit caches
  static constexpr int kAlphaOff = kPOff + kPBytes;
  static constexpr int kInvLOff = kAlphaOff + kBlockM * 4;
  static constexpr int kRowMaxOff = kInvLOff + kBlockM * 4;  // softmax state: one slot per thread
  static constexpr int kRowSumOff = kRowMaxOff + kNumThreads * 4;
  static constexpr int kVisOff = kRowSumOff + kNumThreads * 4;
  // 8-bit: the unit of each softmax thread's O (P is normalized by the tile's largest scale).
  static constexpr int kUnitOff = kVisOff + kNumThreads * 4;
  static constexpr int kUnitBytes = kKv8 ? kNumThreads * 4 : 0;
  static constexpr int kTokOkOff = kUnitOff + kUnitBytes;
  static constexpr int kTokOkBytes = (kStages * kBlockN + 15) / 16 * 16;
  static constexpr int kQpeOff = kTokOkOff + kTokOkBytes;  // q_pe of the block's rows
  static constexpr int kQpeBytes = kBlockM * kRopeDim * 2;
  static constexpr int kPieceOff = kQpeOff + kQpeBytes;
  static constexpr int kPieceBytes = kMaxPieces * 32 + 16;  // + count words
  static constexpr int kSmemBytes = kPieceOff + kPieceBytes;

  static_assert(kSmemBytes <= kSm86MaxSmemPerBlock, "does not fit sm_86's 99 KiB per block");
  static_assert(kHeadDim % (kDimGroups * 16) == 0 && kLatentDim % (kDimGroups * 16) == 0, "");
  static_assert(kBlockN == 16 || kBlockN == 32, "score swizzles are written for 16 or 32 tokens");
  static_assert(kSoftTokens >= 2, "");
  static_assert(kStages >= 2, "");
  static_assert(!kDeferPv || (kRowGroups == 2 && kStages >= 3 && !kKv8), "");
  static_assert(!kKv8 || kMFrags == 1, "8-bit: one row fragment per warp (o_acc holds 128 dims)");
  static_assert(kKvTileBytes % 16 == 0 && kKv8RopeOff % 16 == 0 && kKv8ScaleOff % 16 == 0, "");
};

// The instantiated configurations, picked by the number of query rows (s_q * h_q).
// <= 16 rows, memory-bound (h_q = 16): 32-token tiles, 2 stages, half the barriers and softmax
// passes of 16-token tiles (most useful with 1 block per SM, sm_86's case; sm_90 runs 2).
using MlaTraitsM16 = MlaDecodeTraits<1, 1, 32, 2>;
// 17..32 rows; also more rows (more row tiles) where two of these blocks fit an SM (sm_90).
using MlaTraitsM32 = MlaDecodeTraits<2, 1, 16, 4>;
// > 32 rows where one 32-row block fills an SM (sm_80/86/89), compute-bound (h_q = 128):
// deferred P V for row group 1 (kDeferPv above).
using MlaTraitsM64 = MlaDecodeTraits<2, 2, 16, 3, false, true>;
// 8-bit caches: 32-token tiles (20,608 B each), one 16-row fragment per warp, 16 rows per
// block for every row count (more rows: more row tiles, mla_row_tiles).
using MlaTraits8M16 = MlaDecodeTraits<1, 1, 32, 4, true>;

}  // namespace kf::cuda
