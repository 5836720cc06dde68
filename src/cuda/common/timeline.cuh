// Research instrumentation: per-block timestamps of the decode kernel and the combine's span, for
// builds with -DKF_TIMELINE only (research/kv8_check.cu --timeline reads and summarizes them).
// In every other build the marks compile to nothing and MlaDecodeParams has no timeline field.
//
// Layout of p.timeline (uint64, %globaltimer in ns): words [0, 16) the combine (0: earliest block
// start, 1: latest block end; the host sets them to ~0 and 0), then kTimelineSlots words per
// decode block (blockIdx.y * gridDim.x + blockIdx.x): the slots below.
#pragma once

#include <cstdint>

namespace kf::cuda {

constexpr int kTimelineHeader = 16;
constexpr int kTimelineSlots = 16;
enum TimelineSlot {
  kTlEntry = 0,      // kernel entry
  kTlPieces = 1,     // the first round's piece list in shared memory
  kTlFirstTile = 2,  // the first KV tile landed
  kTlPieceEnd = 3,   // + i: piece i's epilogue done (i < 8)
  kTlExit = 11,
  kTlSm = 12,        // %smid
  kTlNumPieces = 13,
  kTlTokens = 14,    // tokens of the first round's pieces
};

__device__ __forceinline__ uint64_t timeline_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace kf::cuda

#ifdef KF_TIMELINE
// Thread 0 of a decode block writes `value` into its slot.
#define KF_TIMELINE_SET(p, slot, value)                                                      \
  do {                                                                                       \
    if ((p).timeline != nullptr && threadIdx.x == 0)                                         \
      (p).timeline[kf::cuda::kTimelineHeader +                                               \
                   (uint64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kf::cuda::kTimelineSlots + \
                   (slot)] = (value);                                                        \
  } while (0)
#define KF_TIMELINE_MARK(p, slot) KF_TIMELINE_SET(p, slot, kf::cuda::timeline_now())
#else
#define KF_TIMELINE_SET(p, slot, value) ((void)0)
#define KF_TIMELINE_MARK(p, slot) ((void)0)
#endif
