// Per-block event stamps for the timeline build (CMake -DKF_TIMELINE=ON, which defines
// KF_TIMELINE=1): thread 0 of each block of the decode kernels, the combine and the fused
// layer's GEMM and prologue launches records the global timer (%globaltimer, ns) at the events
// below into the buffer whose device address the KF_TIMELINE_BUFFER switch gives (switches.h;
// MlaDecodeParams::timeline, GemmLaunch::timeline). Kernels stamp through
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

// The launches a timeline tells apart: the attention's two, and the fused layer's (each of its
// launches records over the previous layer's, so a layer graph's buffer holds its last layer).
enum TimelineKernel {
  kTlDecode = 0,
  kTlCombine = 1,
  kTlGemmProj = 2,  // the layer's first projections ([W_q; W_kv_a], or [W_q_a; W_kv_a])
  kTlQAbsorb = 3,   // the query absorption with the prologue (its GEMM blocks, then the rows')
  kTlGemmUv = 4,    // the output absorption (W_UV per head)
  kTlGemmO = 5,     // the output projection W_o
  kTlGemmQb = 6,    // W_q_b (query compression)
  kTlGemmOther = 7, // a GEMM launched outside the layer (kf_linear)
};
constexpr int kTimelineKernels = 8;
constexpr int kTimelineMaxBlocks = 16384;
constexpr int kTimelineEvents = 8;

// The events (kernelflow/bench/timeline.py names them in the same order). A GEMM block stamps
// entry, waited, first_tile (its first stage of weights and X landed), first_epilogue (its ring
// drained, the epilogue begins), two steps of its epilogue in slots a decode block uses for
// other events (kTlGemmPartials, kTlGemmStored below) and exit; the prologue's blocks entry,
// waited and exit.
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
// A GEMM block's epilogue (timeline.py calls them "partials" and "stored"): every split's partial
// of its tile in place (past the cluster barrier; where the splits are added in global memory,
// the tile's last block once it has seen the others arrive) and its share of Y stored (the
// unsplit tile, the cluster block's part of the sum, or the last block's whole sum).
constexpr int kTlGemmPartials = kTlPieces;
constexpr int kTlGemmStored = kTlLastEpi;

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
