// Tile shapes and shared-memory layout of the sm_90a decode kernel (16-bit caches): static
// constexpr only, host- and device-visible.
//
// A block holds kBlockM = 64 query rows of one request (rows past num_rows are zero) and walks
// its worker's pieces in KV tiles of kBlockN = 64 tokens (the scheduler's tile), two tiles per
// step: tile A in slot 0, tile B in slot 1. Two warpgroups, no producer warps (one thread issues
// the tensor copies), so each thread may hold up to 255 registers:
//   warpgroup 0 computes S_A = Q K_A^T (64 x 64, all 576 dims) and owns O_L, output dims 0..255;
//   warpgroup 1 computes S_B = Q K_B^T and owns O_R, output dims 256..511.
// Each warpgroup multiplies its own P (registers) with its half of its own tile's V and the other
// warpgroup's P (shared memory) with its half of the other tile's V (mla_decode_sm90a.cuh).
// Q, the KV slots and the P tiles are stored as column blocks of 64 dims (128 bytes a row), each
// block 64 rows of 128 bytes with the 128-byte swizzle (wgmma_sm90a.cuh), 1024-byte aligned.
// Q's last column block (dims 512..575) is also held in registers for the scores, so its shared
// memory holds P_B once every thread has read it.
#pragma once

#include "core/mla_shape.h"

namespace kf::cuda {

struct MlaSm90aTraits {
  static constexpr int kBlockM = 64;  // query rows per block (one wgmma M)
  static constexpr int kBlockN = 64;  // KV tokens per tile (the scheduler's tile)
  static constexpr int kNumThreads = 256;  // two warpgroups
  static constexpr int kColBlocks = kHeadDim / 64;   // 9 column blocks of 64 dims
  static constexpr int kVBlocks = kLatentDim / 64;   // 8: the V part of a tile
  static constexpr int kOBlocksPerGroup = kVBlocks / 2;  // 4 column blocks of O per warpgroup
  static constexpr int kQRegBlock = kColBlocks - 1;  // Q's column block held in registers
  // A page's rows of a column block fill whole 1024-byte swizzle atoms (one tensor copy each).
  static constexpr int kMinPageSize = 8;

  static constexpr int kMaxPieces = 8;  // pieces of a worker staged in shared memory at once

  // Shared memory (bytes, from a 1024-aligned base): Q | slot 0 | slot 1 | P_A | running max |
  // scale A | scale B | row sums | mbarriers (tile copies, hand-offs, warpgroups) | token masks |
  // piece list; plus 1024 bytes to align the base.
  static constexpr int kColBlockBytes = 64 * 128;  // 64 rows x 128 bytes
  static constexpr int kTileBytes = kColBlocks * kColBlockBytes;
  static constexpr int kQOff = 0;
  static constexpr int kPbOff = kQOff + kQRegBlock * kColBlockBytes;  // P_B: Q's last block
  static constexpr int kKvOff = kQOff + kTileBytes;
  static constexpr int kPaOff = kKvOff + 2 * kTileBytes;   // P_A, 64 rows x 64 tokens
  static constexpr int kRowMaxOff = kPaOff + kColBlockBytes;  // float [kBlockM], log2 units
  static constexpr int kScaleAOff = kRowMaxOff + kBlockM * 4;  // float [kBlockM]
  static constexpr int kScaleBOff = kScaleAOff + kBlockM * 4;  // float [kBlockM]
  static constexpr int kRowSumOff = kScaleBOff + kBlockM * 4;  // float [2 groups][kBlockM]
  static constexpr int kBarOff = kRowSumOff + 2 * kBlockM * 4;  // full[2 slots][kColBlocks]
  static constexpr int kHandoffs = 4;  // mbarriers of the hand-offs between the warpgroups
  static constexpr int kHandoffOff = kBarOff + 2 * kColBlocks * 8;  // [kHandoffs]
  static constexpr int kGroupBarOff = kHandoffOff + kHandoffs * 8;  // [2 warpgroups]
  static constexpr int kTokOkOff = kGroupBarOff + 2 * 8;  // uint64 [2 slots]
  static constexpr int kPieceOff = kTokOkOff + 2 * 8;
  static constexpr int kPieceBytes = kMaxPieces * 32 + 16;  // + count words
  static constexpr int kSmemUsed = kPieceOff + kPieceBytes;
  static constexpr int kSmemBytes = kSmemUsed + 1024;

  // A piece's O is staged in the KV slots (free once the piece's last step is done) and stored
  // by bulk copies, one per row: rows of 512 floats (o_accum) or 512 q-dtype values (out), each
  // row 32 (floats) or 16 (16-bit values) bytes longer than its data, so the eight rows of a
  // warp's store fall in different banks.
  static constexpr int kStageAccumRowBytes = kLatentDim * 4 + 32;
  static constexpr int kStageOutRowBytes = kLatentDim * 2 + 16;

  static_assert(kBlockM == 64 && kBlockN == 64, "S: m64n64 wgmma; P V: k = 64 tokens");
  static_assert(kBlockM * kStageAccumRowBytes <= 2 * kTileBytes, "O staged in the two slots");
  static_assert(kHeadDim % 64 == 0 && kLatentDim % 128 == 0, "");
  static_assert(kPbOff % 1024 == 0 && kPaOff % 1024 == 0, "P tiles are 1024-aligned operands");
  static_assert(kBarOff % 8 == 0 && kHandoffOff % 8 == 0 && kGroupBarOff % 8 == 0 &&
                    kTokOkOff % 8 == 0 && kPieceOff % 16 == 0,
                "");
  static_assert(kSmemBytes <= 232448, "sm_90 allows 227 KB of shared memory per block");
};

}  // namespace kf::cuda
