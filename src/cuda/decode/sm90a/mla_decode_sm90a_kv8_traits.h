// Tile shapes and shared-memory layout of the sm_90a decode kernel for 8-bit caches
// (mla_decode_sm90a_kv8.cuh): static constexpr only, host- and device-visible.
//
// The kernel is token-major: the tokens of a 64-token KV tile are the M of every wgmma and the
// block's 16 query rows its N (S^T = K Q^T, O^T = V^T P^T), so a block of 16 rows computes no
// padded rows, and K and V are register (A) operands converted from the 8-bit codes as they are
// read from shared memory. Two consumer warpgroups (warps 0..7) take a piece's tiles in turn,
// each with its own online-softmax state, merged at the piece's end; a producer warpgroup
// (warps 8..11), one lane of which issues the tensor copies.
//
// Shared memory (from a 1024-aligned base): Q | kStages stages | P (one per consumer
// warpgroup) | per-row and per-warp scratch | the merge's buffer | mbarriers | token masks |
// piece list.
//   Q: nine blocks of 16 rows x 128 bytes (128-byte swizzle): blocks 0..7 the latent part of q in
//      fp16 (scaled per row into fp16's range, dims in the order the K fragments take them:
//      sm90a_kv8_tile.cuh), block 8 q_pe (bf16).
//   A stage (one tile): the latent codes as four column blocks of 64 tokens x 128 bytes
//      (128-byte swizzle, as the tensor copy writes them), the rope part as one block of 64 tokens
//      x 128 bytes (bf16, swizzled), and the scales, 256 bytes per page of the tile (page j's
//      tokens at 256 j, so each copy lands 128-byte aligned).
//   P: P'^T, 16 rows x 64 tokens of fp16 (128-byte swizzle), the B operand of O^T.
//   The merge: warpgroup 1's O (64 floats per thread, thread-major), its rows' max, sum and unit.
#pragma once

#include "core/mla_shape.h"

namespace kf::cuda {

struct MlaSm90aKv8Traits {
  static constexpr int kBlockM = 16;   // query rows per block (the wgmma N)
  static constexpr int kBlockN = 64;   // KV tokens per tile (the wgmma M; the scheduler's tile)
  static constexpr int kStages = 4;    // tiles in flight per block (one block per SM)
  static constexpr int kConsumerGroups = 2;
  static constexpr int kGroupThreads = 128;
  static constexpr int kConsumerThreads = kConsumerGroups * kGroupThreads;
  // + a producer warpgroup, of which one lane issues the copies: a whole warpgroup so that it
  // can give its registers to the consumers (setmaxnreg: 40 against 232 per thread).
  static constexpr int kNumThreads = kConsumerThreads + kGroupThreads;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static_assert(kConsumerThreads * kConsumerRegs + kGroupThreads * kProducerRegs <= 65536, "");
  static constexpr int kMaxPieces = 8;  // pieces of a worker staged in shared memory at once

  static constexpr int kQBlockBytes = kBlockM * 128;  // 16 rows x 64 16-bit dims
  static constexpr int kQBlocks = kHeadDim / 64;      // 8 latent + 1 rope
  static constexpr int kLatBlocks = kLatentDim / 128;  // 4 column blocks of 128 codes
  static constexpr int kLatBlockBytes = kBlockN * 128;
  static constexpr int kMaxTilePages = kBlockN / 16;  // 8-bit pages hold 16 tokens or more

  // A stage: latent | rope | scales (256 bytes per page of the tile).
  static constexpr int kStageRopeOff = kLatBlocks * kLatBlockBytes;
  static constexpr int kStageScaleOff = kStageRopeOff + kBlockN * 128;
  static constexpr int kStageScaleBytes = kMaxTilePages * 256;
  // Bytes the copies of one tile deliver (a stage's mbarrier transaction count).
  static constexpr int kStageTxBytes = kStageScaleOff + kBlockN * 4;
  static constexpr int kStageBytes = (kStageScaleOff + kStageScaleBytes + 1023) / 1024 * 1024;

  static constexpr int kQOff = 0;
  static constexpr int kStagesOff = kQOff + kQBlocks * kQBlockBytes;
  static constexpr int kPOff = kStagesOff + kStages * kStageBytes;
  static constexpr int kPBytes = kBlockM * 128;
  static constexpr int kQInvOff = kPOff + kConsumerGroups * kPBytes;  // float [16]: 2^-e of q
  // Per warpgroup, tile parity and warp: the tile's max and min score of each row and its
  // largest scale.
  static constexpr int kRedStride = 2 * kBlockM + 1;
  static constexpr int kRedOff = kQInvOff + kBlockM * 4;
  static constexpr int kRedBytes = kConsumerGroups * 2 * 4 * kRedStride * 4;
  static constexpr int kRowSumOff = kRedOff + kRedBytes;  // float [2 groups][4 warps][16]
  static constexpr int kMergeOff = kRowSumOff + kConsumerGroups * 4 * kBlockM * 4;
  static constexpr int kMergeRowBytes = (2 * kBlockM + 4) * 4;  // m[16], l[16], unit
  static constexpr int kMergeOOff = kMergeOff + kMergeRowBytes;  // float [64][128 threads]
  static constexpr int kMergeOBytes = 64 * kGroupThreads * 4;
  static constexpr int kBarOff = (kMergeOOff + kMergeOBytes + 7) / 8 * 8;  // full, empty
  static constexpr int kTokOkOff = kBarOff + 2 * kStages * 8;  // uint64 [kStages]
  static constexpr int kPieceOff = (kTokOkOff + kStages * 8 + 15) / 16 * 16;
  static constexpr int kPieceBytes = kMaxPieces * 32 + 16;  // + count words
  static constexpr int kSmemUsed = kPieceOff + kPieceBytes;
  static constexpr int kSmemBytes = kSmemUsed + 1024;  // + the base's alignment

  static_assert(kStagesOff % 1024 == 0 && kStageBytes % 1024 == 0 && kPOff % 1024 == 0,
                "swizzled operands start on 1024-byte atoms");
  static_assert(kStageScaleOff % 256 == 0, "");
  static_assert(kSmemBytes <= 232448, "sm_90 allows 227 KB of shared memory per block");
};

}  // namespace kf::cuda
