// Per-block event stamps for the timeline build (CMake -DKF_TIMELINE=ON, which defines
// KF_TIMELINE=1): thread 0 of each block of the decode kernels and the combine records the
// global timer (%globaltimer, ns) at the events below into the buffer whose device address the
// KF_TIMELINE_BUFFER switch gives (switches.h; MlaDecodeParams::timeline). Kernels stamp through
// KF_TIMELINE_STAMP / KF_TIMELINE_PIECES (below), which other builds expand to nothing, so their
// code is the same as without the stamps; the field stays null there. python -m
// kernelflow.bench.timeline reads the buffer and prints where a call's time goes.
//
// Layout: uint64 [kTimelineKernels][kTimelineMaxBlocks][kTimelineEvents]; block b of a grid is
// blockIdx.x + gridDim.x (blockIdx.y + gridDim.y blockIdx.z); blocks past kTimelineMaxBlocks are
// not recorded. Every call overwrites its blocks' slots, so after a replay of several calls the
// buffer holds the last call's stamps (a slot a call does not reach keeps an earlier value:
// the tool zeroes the buffer before the replay it reads).
#pragma once

#include <cstdint>

namespace kf::cuda {

enum TimelineKernel { kTlDecode = 0, kTlCombine = 1 };
constexpr int kTimelineKernels = 2;
constexpr int kTimelineMaxBlocks = 16384;
constexpr int kTimelineEvents = 8;

// The events (kernelflow/bench/timeline.py names them in the same order).
enum TimelineEvent {
  kTlEntry = 0,       // the block's first instruction
  kTlWaited = 1,      // past the dependency wait (and, for a decode, the metadata check)
  kTlPieces = 2,      // decode: the first round's piece list in shared memory
  kTlFirstTile = 3,   // decode: the first tile of the first piece landed (its scores, sm_90a)
  kTlFirstEpi = 4,    // decode: the first piece's epilogue begins
  kTlLastEpi = 5,     // decode: a piece's epilogue begins (the last piece's stays)
  kTlExit = 6,        // the block's last instruction (before it lets dependents launch)
  kTlPiecesDone = 7,  // decode: pieces the block ran | the SM it ran on << 32 (not a time)
};

__device__ __forceinline__ void timeline_record(uint64_t* buf, int kernel, int event,
                                                uint64_t value) {
  if (buf == nullptr) return;
  const uint64_t b =
      blockIdx.x + uint64_t(gridDim.x) * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
  if (b >= uint64_t(kTimelineMaxBlocks)) return;
  buf[(uint64_t(kernel) * kTimelineMaxBlocks + b) * kTimelineEvents + event] = value;
}

// The block's piece count and its SM (%smid) at kTlPiecesDone.
__device__ __forceinline__ void timeline_pieces(uint64_t* buf, int kernel, int pieces) {
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  timeline_record(buf, kernel, kTlPiecesDone, (uint64_t(sm) << 32) | uint32_t(pieces));
}

// Thread `tid` == 0 records the global timer at `event`.
__device__ __forceinline__ void timeline_stamp(uint64_t* buf, int kernel, int event, int tid) {
  if (tid != 0 || buf == nullptr) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  timeline_record(buf, kernel, event, t);
}

}  // namespace kf::cuda

// The call sites' form: the stamp in the timeline build, nothing at all (not even its
// arguments' evaluation) in any other, so those builds compile the kernels as without it.
#if defined(KF_TIMELINE) && KF_TIMELINE
#define KF_TIMELINE_STAMP(buf, kernel, event, tid) \
  ::kf::cuda::timeline_stamp((buf), (kernel), (event), (tid))
#define KF_TIMELINE_PIECES(buf, kernel, pieces) \
  ::kf::cuda::timeline_pieces((buf), (kernel), (pieces))
#else
#define KF_TIMELINE_STAMP(buf, kernel, event, tid) ((void)0)
#define KF_TIMELINE_PIECES(buf, kernel, pieces) ((void)0)
#endif
