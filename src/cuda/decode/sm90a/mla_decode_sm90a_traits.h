// Tile shapes and shared-memory layout of the sm_90a decode kernel (16-bit caches): static
// constexpr only, host- and device-visible.
//
// A block holds kBlockM = 64 query rows of one request (rows past num_rows are zero) and walks
// its worker's pieces in KV tiles of kBlockN = 64 tokens (the scheduler's tile, so a piece is
// whole tiles plus a tail). Threads: two consumer warpgroups (warps 0-3 and 4-7) and one
// producer warpgroup (warps 8-11). sm_90 allocates registers per warpgroup, so a block of 9
// warps gets 168 registers per thread like one of 12; setmaxnreg then moves registers from the
// producers (kProducerRegs) to the consumers (kConsumerRegs), whose 64 x 256 fp32 O (128 per
// thread) and 64 x 32 scores (16) need more than 168.
//   producer   copies each tile's 64 token rows (1152 bytes each) into a ring of kStages slots
//              with cp.async, zero-filling tokens past the piece and on bad pages, and signals
//              the slot's `full` mbarrier once its copies have landed;
//   consumers  warpgroup g computes the scores of the tile's tokens 32 g .. 32 g + 31 for the
//              64 rows (S = Q K^T, wgmma m64n32, A and B from shared memory), the two exchange
//              their row maxima (the same tile max in both), each writes its half of P to the
//              shared P tile, and warpgroup g adds P V for output dims 256 g .. 256 g + 255
//              (wgmma, P and V = the first 512 dims of the slot from shared memory); every
//              consumer thread then arrives on the slot's `empty` mbarrier.
// Q, the KV slots and P are stored as column blocks of 64 dims (128 bytes a row), each block
// kRows rows of 128 bytes with the 128-byte swizzle (wgmma_sm90a.cuh), 1024-byte aligned.
#pragma once

#include "core/mla_shape.h"

namespace kf::cuda {

struct MlaSm90aTraits {
  static constexpr int kBlockM = 64;  // query rows per block (one wgmma M)
  static constexpr int kBlockN = 64;  // KV tokens per tile (the scheduler's tile)
  static constexpr int kHalfN = kBlockN / 2;  // tokens of a tile whose scores a warpgroup computes
  static constexpr int kStages = 2;
  static constexpr int kConsumerThreads = 256;  // two warpgroups
  static constexpr int kProducerThreads = 128;  // one warpgroup
  static constexpr int kNumThreads = kConsumerThreads + kProducerThreads;
  // Registers per thread after setmaxnreg; the block's total stays 384 x 168 = 64512.
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = 224;
  static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                    kNumThreads * 168, "setmaxnreg moves registers, it does not add them");
  static constexpr int kPvDimsPerGroup = kLatentDim / 2;  // output dims per warpgroup
  static constexpr int kColBlocks = kHeadDim / 64;        // 9 column blocks of 64 dims
  static constexpr int kPvBlocks = kPvDimsPerGroup / 64;  // 4 column blocks of O per group

  static constexpr int kMaxPieces = 8;  // pieces of a worker staged in shared memory at once

  // Shared memory (bytes, from a 1024-aligned base): Q | KV ring | P | row maxima | row sums |
  // token flags | mbarriers | piece list; plus 1024 bytes to align the base.
  static constexpr int kColBlockBytes = 64 * 128;  // 64 rows x 128 bytes
  static constexpr int kTileBytes = kColBlocks * kColBlockBytes;
  static constexpr int kQOff = 0;
  static constexpr int kKvOff = kQOff + kTileBytes;
  static constexpr int kPOff = kKvOff + kStages * kTileBytes;  // 64 rows x 64 tokens (q dtype)
  static constexpr int kRowMaxOff = kPOff + kColBlockBytes;     // float [2 groups][kBlockM]
  static constexpr int kRowSumOff = kRowMaxOff + 2 * kBlockM * 4;  // float [2 groups][kBlockM]
  static constexpr int kTokOkOff = kRowSumOff + 2 * kBlockM * 4;
  static constexpr int kBarOff = kTokOkOff + kStages * kBlockN;  // full[kStages], empty[kStages]
  static constexpr int kPieceOff = kBarOff + 2 * kStages * 8;
  static constexpr int kPieceBytes = kMaxPieces * 32 + 16;  // + count words
  static constexpr int kSmemUsed = kPieceOff + kPieceBytes;
  static constexpr int kSmemBytes = kSmemUsed + 1024;

  static_assert(kBlockM == 64 && kBlockN == 64 && kHalfN == 32,
                "S: one m64n32 wgmma per warpgroup and k16 step; P V: k = 64 tokens");
  static_assert(kHeadDim % 64 == 0 && kLatentDim % 128 == 0, "");
  static_assert(kPOff % 1024 == 0, "the P tile is a 1024-aligned swizzled operand");
  static_assert(kBarOff % 8 == 0 && kPieceOff % 16 == 0, "");
  static_assert(kSmemBytes <= 232448, "sm_90 allows 227 KB of shared memory per block");
};

}  // namespace kf::cuda
