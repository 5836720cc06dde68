// The narrow skinny GEMM: Y[M, N] = X[M, K] W[N][K]^T for M <= kGemmNarrowMaxM and K <=
// kGemmNarrowMaxK (layer_kernels.h says why), where the weight bytes are all the traffic and the
// kernel's time is how long it takes to have enough of them in flight. A block of 4 warps owns
// 16 output columns over all of K, so no block waits on another (no split-K partials, no
// counters) and the blocks of a launch stream their weight rows from the first instruction: the
// weights of each block's first kStages - 1 stages are requested before pdl_wait (gemm_ring).
//
// A stage is 256 k: the block's 16 weight rows of 512 bytes and the X tile (8 MT rows of 512
// bytes), swizzled as gemm_layout.h says; warp w multiplies k 64 w .. 64 w + 63 of each stage
// (four k16 steps of mma.sync m16n8k16, the weight as the A operand as in the wide kernel), so
// the four warps hold partial sums over disjoint k, added in warp order at the end (the same
// bits on every launch). K needs to be a multiple of 64 only: chunks past K are zero-filled.
// cp.async of 16 bytes through L2 only (.cg), kStages stages in a ring (72 KB at MT = 1, 80 KB
// at MT = 2, 96 KB at MT = 4; sm_86 allows 99 KB).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/half_convert.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/layer/gemm_layout.h"
#include "cuda/layer/layer_kernels.h"
#include "cuda/layer/skinny_gemm.cuh"

namespace kf::cuda {

constexpr int kNarrowStageK = kGemmNarrowRowBytes / 2;  // 256
constexpr int kNarrowChunks = kGemmNarrowRowBytes / 16;  // 32 per row
static_assert(kGemmThreads / 32 * 64 == kNarrowStageK, "one 64-k slice per warp");

template <int MT>
struct NarrowShape {
  static_assert(MT == 1 || MT == 2 || MT == 4, "the narrow kernel takes at most 32 rows");
  static constexpr int kStages = MT == 1 ? 6 : MT == 2 ? 5 : 4;
  static constexpr int kWBytes = kGemmNarrowTileN * kGemmNarrowRowBytes;  // 8 KB
  static constexpr int kXRows = 8 * MT;
  static constexpr int kStageBytes = kWBytes + kXRows * kGemmNarrowRowBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kSmemBytes <= 99 * 1024, "the ring fits sm_86's shared memory per block");
  static_assert(kSmemBytes >= kGemmThreads / 32 * MT * 32 * 4 * int(sizeof(float)),
                "the warp partials fit in the stage ring");
};

// The weight rows n0 .. n0 + 15 over k0 .. k0 + 255 (rows past n_cols and chunks past k are
// zero-filled).
__device__ __forceinline__ void narrow_load_w(uint8_t* stage, const GemmOperands& op, int n0,
                                              int k0, int k, int tid) {
#pragma unroll
  for (int i = 0; i < kGemmNarrowTileN * kNarrowChunks / kGemmThreads; ++i) {
    const auto [row, chunk] = gemm_copy_chunk(tid + i * kGemmThreads, kGemmNarrowRowBytes);
    const int kc = k0 + chunk * 8;
    const bool ok = n0 + row < op.n_cols && kc < k;
    const uint16_t* src = op.w + (ok ? int64_t(n0 + row) * op.ldw + kc : 0);
    cp_async_16_cg(smem_u32(stage + gemm_swizzle(row, chunk, kGemmNarrowRowBytes)), src,
                   ok ? 16 : 0);
  }
}

template <int MT>
__device__ __forceinline__ void narrow_load_x(uint8_t* stage, const GemmOperands& op, int m,
                                              int k0, int k, int tid) {
  uint8_t* xs = stage + NarrowShape<MT>::kWBytes;
#pragma unroll
  for (int i = 0; i < NarrowShape<MT>::kXRows * kNarrowChunks / kGemmThreads; ++i) {
    const auto [row, chunk] = gemm_copy_chunk(tid + i * kGemmThreads, kGemmNarrowRowBytes);
    const int kc = k0 + chunk * 8;
    const bool ok = row < m && kc < k;
    const uint16_t* src = op.x + (ok ? int64_t(row) * op.ldx + kc : 0);
    cp_async_16_cg(smem_u32(xs + gemm_swizzle(row, chunk, kGemmNarrowRowBytes)), src,
                   ok ? 16 : 0);
  }
}

// acc[j] += this warp's 64 k of the stage: W rows (16 columns) x X rows 8 j .. 8 j + 7.
template <int MT>
__device__ __forceinline__ void narrow_stage_mma(float (&acc)[MT][4], const uint8_t* stage,
                                                 int warp, int lane) {
  const uint8_t* xs = stage + NarrowShape<MT>::kWBytes;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {  // 32 k: two k16 steps
    uint32_t a[2][4];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      const TileChunk c = gemm_a_chunk_narrow(warp, lane, 2 * kk + st);
      ldmatrix_x4(a[st], smem_u32(stage + gemm_swizzle(c.row, c.chunk, kGemmNarrowRowBytes)));
    }
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      uint32_t b[4];
      const TileChunk c = gemm_b_chunk(j, lane, kk, 8 * warp);
      ldmatrix_x4(b, smem_u32(xs + gemm_swizzle(c.row, c.chunk, kGemmNarrowRowBytes)));
      mma_16816<__nv_bfloat16>(acc[j], a[0], b[0], b[1]);
      mma_16816<__nv_bfloat16>(acc[j], a[1], b[2], b[3]);
    }
  }
}

// The warps' partials (after the ring is drained) added in warp order by warp 0, which writes
// the bf16 outputs.
template <int MT>
__device__ __forceinline__ void narrow_epilogue(const GemmLaunch& g, const GemmOperands& op,
                                                int n0, const float (&acc)[MT][4], int warp,
                                                int lane, uint8_t* smem) {
  float* part = reinterpret_cast<float*>(smem);  // [warp][j][lane][4]
  __syncthreads();  // every warp is done reading the ring
  if (warp != 0) {
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[((warp * MT + j) * 32 + lane) * 4 + e] = acc[j][e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float sum = acc[j][e];
#pragma unroll
      for (int w = 1; w < kGemmThreads / 32; ++w) sum += part[((w * MT + j) * 32 + lane) * 4 + e];
      const int row = gemm_acc_row(j, lane, e), col = n0 + gemm_acc_col(0, lane, e);
      if (row < g.m && col < op.n_cols) op.y[int64_t(row) * op.ldy + col] = float_to_bf16(sum);
    }
}

// Block `bid` (one 16-column tile of a job and head). smem: NarrowShape<MT>::kSmemBytes.
template <int MT>
__device__ __forceinline__ void narrow_block(const GemmLaunch& g, int bid, uint8_t* smem) {
  using Shape = NarrowShape<MT>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const GemmTileId id = gemm_tile_id(g, bid, kGemmNarrowTileN);
  const GemmOperands op = gemm_operands(g, id);
  const int nk = (g.k + kNarrowStageK - 1) / kNarrowStageK;
  auto stage_ptr = [&](int i) { return smem + (i % Shape::kStages) * Shape::kStageBytes; };
  float acc[MT][4];
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlEntry, tid);
  gemm_ring<Shape::kStages>(
      nk, acc,
      [&](int i) { narrow_load_w(stage_ptr(i), op, id.n0, i * kNarrowStageK, g.k, tid); },
      [&](int i) {
        if (i == 0) KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlWaited, tid);
        narrow_load_x<MT>(stage_ptr(i), op, g.m, i * kNarrowStageK, g.k, tid);
      },
      [&](int i) {
        if (i == 0) KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlFirstTile, tid);
        narrow_stage_mma<MT>(acc, stage_ptr(i), warp, lane);
      });
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlFirstEpi, tid);
  narrow_epilogue<MT>(g, op, id.n0, acc, warp, lane, smem);
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlExit, tid);
}

}  // namespace kf::cuda
