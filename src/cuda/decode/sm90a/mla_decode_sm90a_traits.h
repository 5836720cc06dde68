// Tile shapes and shared-memory layout of the sm_90a decode kernel (16-bit caches): static
// constexpr only, host- and device-visible.
//
// A block holds kBlockM = 64 query rows of one request (rows past num_rows are zero) and walks
// its worker's pieces in KV tiles of kBlockN = 64 tokens (the scheduler's tile, so a piece is
// whole tiles plus a tail). Threads: two consumer warpgroups (warps 0-3 and 4-7) and one
// producer warpgroup (warps 8-11). sm_90 allocates registers per warpgroup, so a block of 9
// warps gets 168 registers per thread like one of 12; setmaxnreg then moves registers from the
// producers (kProducerRegs) to the consumers (kConsumerRegs), whose 64 x 256 fp32 O (128 per
// thread) and 64 x 64 scores (32) need more than 168.
//   producer   copies each tile's 64 token rows (1152 bytes each) into a ring of kStages slots
//              with cp.async, zero-filling tokens past the piece and on bad pages, and signals
//              the slot's `full` mbarrier once its copies have landed;
//   consumers  both warpgroups compute the same 64 x 64 scores S = Q K^T (wgmma, A and B from
//              shared memory) and the same online softmax; warpgroup g then adds P V for output
//              dims 256 g .. 256 g + 255 (wgmma, P from registers, V = the first 512 dims of the
//              same slot), and every consumer thread arrives on the slot's `empty` mbarrier.
// Q and the KV slots are stored as 9 column blocks of 64 dims (128 bytes a row), each block
// kRows rows of 128 bytes with the 128-byte swizzle (wgmma_sm90a.cuh), 1024-byte aligned.
#pragma once

#include "core/mla_shape.h"

namespace kf::cuda {

struct MlaSm90aTraits {
  static constexpr int kBlockM = 64;  // query rows per block (one wgmma M)
  static constexpr int kBlockN = 64;  // KV tokens per tile (the scheduler's tile)
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

  // Shared memory (bytes, from a 1024-aligned base): Q | KV ring | token flags | mbarriers |
  // piece list; plus 1024 bytes to align the base.
  static constexpr int kColBlockBytes = 64 * 128;  // 64 rows x 128 bytes
  static constexpr int kTileBytes = kColBlocks * kColBlockBytes;
  static constexpr int kQOff = 0;
  static constexpr int kKvOff = kQOff + kTileBytes;
  static constexpr int kTokOkOff = kKvOff + kStages * kTileBytes;
  static constexpr int kBarOff = kTokOkOff + kStages * kBlockN;  // full[kStages], empty[kStages]
  static constexpr int kPieceOff = kBarOff + 2 * kStages * 8;
  static constexpr int kPieceBytes = kMaxPieces * 32 + 16;  // + count words
  static constexpr int kSmemUsed = kPieceOff + kPieceBytes;
  static constexpr int kSmemBytes = kSmemUsed + 1024;

  static_assert(kBlockM == 64 && kBlockN == 64, "one m64n64 wgmma per k16 step");
  static_assert(kHeadDim % 64 == 0 && kLatentDim % 128 == 0, "");
  static_assert(kBarOff % 8 == 0 && kPieceOff % 16 == 0, "");
  static_assert(kSmemBytes <= 232448, "sm_90 allows 227 KB of shared memory per block");
};

}  // namespace kf::cuda
