// The sm_90a decode kernel's block (mla_decode_sm90a.cuh): its shared memory (Smem, the layout of
// mla_decode_sm90a_traits.h), a thread's place in it (Lane), and the synchronization between its
// two warpgroups (the hand-off mbarriers and a warpgroup's own barrier).
#pragma once

#include <cstdint>

#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"
#include "cuda/decode/sm90a/sm90a_smem.cuh"
#include "cuda/decode/sm90a/wgmma_sm90a.cuh"

namespace kf::cuda::sm90a {

using Tr = MlaSm90aTraits;
// The one named barrier (0 is __syncthreads): both warpgroups, every thread.
constexpr int kBarBoth = 1;
constexpr int kGroupThreads = 128;
// The hand-offs from one warpgroup to the other, each an mbarrier that every thread of the
// producing warpgroup arrives on (release) and the other waits on (acquire), once per step:
// kScaleA (warpgroup 0: m_A and scale_A stored), kScaleB (1: m_B and scale_B), kPa (0: P_A),
// kPb (1: P_B, steps with a tile B).
enum Handoff : int { kScaleA = 0, kScaleB = 1, kPa = 2, kPb = 3 };
// Bits of a thread's phase word: the parity of the slot barriers it waits on next, of each
// hand-off it waits on next (kHandoffBit << k) and of its warpgroup's barrier.
constexpr uint32_t kSlotBit = 1u, kHandoffBit = 2u, kGroupBit = 2u << 4;
static_assert(Tr::kHandoffs == 4, "kGroupBit follows the four hand-off bits");

// Byte offset of 16-byte chunk `chunk` (0 .. 71) of row `row` in a Q or KV tile.
__device__ __forceinline__ uint32_t tile_chunk_offset(int row, int chunk) {
  return (chunk >> 3) * Tr::kColBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// The block's shared memory, from the 1024-aligned base (token masks, pieces: SmemBase).
struct Smem : SmemBase<Tr> {
  __device__ __forceinline__ uint32_t q() const { return base_u32 + Tr::kQOff; }
  __device__ __forceinline__ uint32_t slot(int s) const {
    return base_u32 + Tr::kKvOff + s * Tr::kTileBytes;
  }
  __device__ __forceinline__ uint32_t p_tile(int s) const {
    return base_u32 + (s == 0 ? Tr::kPaOff : Tr::kPbOff);
  }
  __device__ __forceinline__ float* row_max() const {
    return reinterpret_cast<float*>(base + Tr::kRowMaxOff);
  }
  __device__ __forceinline__ float* scale(int s) const {
    return reinterpret_cast<float*>(base + (s == 0 ? Tr::kScaleAOff : Tr::kScaleBOff));
  }
  __device__ __forceinline__ float* row_sum() const {
    return reinterpret_cast<float*>(base + Tr::kRowSumOff);
  }
  __device__ __forceinline__ uint32_t full(int s, int cb) const {
    return base_u32 + Tr::kBarOff + 8 * (s * Tr::kColBlocks + cb);
  }
  __device__ __forceinline__ uint32_t handoff(int k) const {
    return base_u32 + Tr::kHandoffOff + 8 * k;
  }
  __device__ __forceinline__ uint32_t group_bar(int g) const {
    return base_u32 + Tr::kGroupBarOff + 8 * g;
  }
};

// This thread's place: warpgroup g (0 scores tiles A and owns O_L, 1 tiles B and O_R), lane,
// thread in its warpgroup, and its rows rbase, rbase + 8 of the block's 64.
struct Lane {
  int g, lane, gtid, rbase;
  __device__ __forceinline__ explicit Lane(int tid)
      : g(tid / 128), lane(tid & 31), gtid(tid & 127), rbase(((tid / 32) % 4) * 16 + (tid & 31) / 4) {}
};

// ---- hand-offs ----
// Hand-off k: every thread of the producing warpgroup arrives after its writes; the other
// warpgroup's threads wait for the phase they have not yet seen (bit kHandoffBit << k of ph).
__device__ __forceinline__ void handoff_arrive(const Smem& sm, Handoff k) {
  mbar_arrive(sm.handoff(k));
}
__device__ __forceinline__ void handoff_wait(const Smem& sm, Handoff k, uint32_t& ph) {
  const uint32_t bit = kHandoffBit << k;
  mbar_wait(sm.handoff(k), (ph & bit) ? 1u : 0u);
  ph ^= bit;
}
// Warpgroup g alone: every thread's earlier shared-memory writes are visible to all of it.
__device__ __forceinline__ void group_sync(const Smem& sm, int g, uint32_t& ph) {
  mbar_arrive(sm.group_bar(g));
  mbar_wait(sm.group_bar(g), (ph & kGroupBit) ? 1u : 0u);
  ph ^= kGroupBit;
}

}  // namespace kf::cuda::sm90a
