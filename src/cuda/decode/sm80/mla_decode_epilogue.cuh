// The decode kernel's epilogue for one piece: the row sums and maxima become 1 / l and the
// natural-log lse, then O / l is written: to out (q dtype) when the piece is its request's only
// one, else to the split partials o_accum / lse_accum that the combine merges.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/mla_shape.h"
#include "core/params.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/decode/sm80/kv8_dequant.cuh"
#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

// Block row srow's statistics, after the piece's last tile: l = the sum of the row's
// kSoftThreadsPerRow shares; the row's first thread stores 1 / l (times O's unit for 8-bit
// caches) for the O stores and writes lse = (m + log2 l) ln 2 (m: the running max, in log2
// units) to lse or lse_accum. A row that saw no position (l = 0) gets 1 / l = 0, lse = -inf;
// a row whose sum is NaN (it saw a non-finite score) gets NaN in both.
template <class Tr, int kFmt>
__device__ __forceinline__ void finish_row_stats(const DecodeSmem<Tr>& sm,
                                                 const MlaDecodeParams& p, const PieceRun& e,
                                                 int row0, int srow, int lane) {
  constexpr int kSoftTpr = Tr::kSoftThreadsPerRow;
  float l = sm.row_sum[fresh_tid()];
#pragma unroll
  for (int o = 1; o < kSoftTpr; o <<= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane % kSoftTpr == 0) {
    const float m_run = sm.row_max[fresh_tid()];
    const bool empty = l == 0.f;
    float unit = 1.f;  // 8-bit caches: O is in units of the last tile's largest scale
    if constexpr (Tr::kKv8) unit = sm.unit[fresh_tid()] * (1.f / kv8_code_unit<kFmt>());
    sm.inv_l[srow] = empty ? 0.f : unit / l;
    const int row = row0 + srow;
    if (row < p.num_rows && e.write != kWriteNone) {
      const float lse = empty ? -INFINITY : (m_run + __log2f(l)) * 0.6931471805599453f;
      const int s = row / p.h_q, h = row % p.h_q;
      if (e.write == kWriteOut)
        p.lse[(int64_t(e.req) * p.h_q + h) * p.s_q + s] = lse;
      else
        p.lse_accum[int64_t(e.piece) * p.num_rows + row] = lse;
    }
  }
}

// 16-bit caches: O / l of this warp's rows and 128 dims to out or o_accum. Output pair i of a
// thread's row is fragment i, dims d 16 + 2 (lane % 4) + 64 (i / 2) + 8 (i % 2): a quad's 4
// pairs are 32 consecutive bytes (one sector). The partials are stored evict-last in L2: the
// combine reads them back after the rest of the call's KV stream has passed through L2. (The
// 8-bit path stores its partials plainly: evict-last did not pay off there.)
template <class Tr, typename T>
__device__ __forceinline__ void store_o16(const DecodeSmem<Tr>& sm, const MlaDecodeParams& p,
                                          const PieceRun& e,
                                          const float (&o_acc)[Tr::kMFrags][Tr::kPvFrags][4],
                                          int row0, int g, int d, int lane) {
  const float* inv_l_s = sm.inv_l;
#pragma unroll
  for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane >> 2) + hf * 8;
      const int row = row0 + r;
      if (row >= p.num_rows) continue;
      const float inv = inv_l_s[r];
      auto pair = [&](int i, int& col, float& v0, float& v1) {
        col = d * 16 + 2 * (lane & 3) + (i >> 1) * 64 + (i & 1) * 8;
        v0 = o_acc[mf][i][2 * hf] * inv;
        v1 = o_acc[mf][i][2 * hf + 1] * inv;
      };
      if (e.write == kWriteOut) {
        const int s = row / p.h_q, h = row % p.h_q;
        T* o = static_cast<T*>(p.out) + int64_t(e.req) * p.o_batch_stride +
               int64_t(s) * p.o_seq_stride + int64_t(h) * p.o_head_stride;
#pragma unroll
        for (int i = 0; i < Tr::kPvFrags; ++i) {
          int col;
          float v0, v1;
          pair(i, col, v0, v1);
          *reinterpret_cast<uint32_t*>(o + col) = pack2<T>(v0, v1);
        }
      } else {
        float* o = p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim;
#pragma unroll
        for (int i = 0; i < Tr::kPvFrags; ++i) {
          int col;
          float v0, v1;
          pair(i, col, v0, v1);
          st_global_keep(o + col, make_float2(v0, v1), l2_evict_last_policy());
        }
      }
    }
}

// 8-bit caches: O / l to out or o_accum. A thread's row holds 32 consecutive output dims,
// 128 d + 32 t .. + 31 (t = lane % 4, kv8_dequant.cuh's permuted P V dims); a quad transpose
// first makes each store instruction cover 16 consecutive dims of one thread's run (stored as
// they lie, each instruction would touch 32 sectors for 8 bytes each): lane t then stores dims
// 32 s + 16 b + 4 t .. + 3 of source thread s's run. a: the four float4 a transpose works on.
// Every lane of the warp runs the transposes, so rows past num_rows skip only the stores.
template <class Tr, typename T>
__device__ __forceinline__ void store_o8(const DecodeSmem<Tr>& sm, const MlaDecodeParams& p,
                                         const PieceRun& e,
                                         const float (&o_acc)[1][16][4], int row0, int g, int d,
                                         int lane, float4 (&a)[4]) {
  const float* inv_l_s = sm.inv_l;
  const int t = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = g * Tr::kRowsPerGroup + (lane >> 2) + hf * 8;
    const int row = row0 + r;
    const float inv = inv_l_s[r];
    const int s_q = row / p.h_q, h_q = row % p.h_q;
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      // a[j]: dims 16 b + 4 j .. + 3 of this thread's run: dim 2 f + e is o[f][e + 2 hf].
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int f = 8 * b + 2 * j;
        a[j] = make_float4(o_acc[0][f][2 * hf] * inv, o_acc[0][f][2 * hf + 1] * inv,
                           o_acc[0][f + 1][2 * hf] * inv, o_acc[0][f + 1][2 * hf + 1] * inv);
      }
      quad_transpose(a, t);  // a[s]: dims 16 b + 4 t .. of thread s's run
      if (row >= p.num_rows) continue;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int col = d * 128 + 32 * s + 16 * b + 4 * t;
        if (e.write == kWriteOut) {  // out rows are only 4-byte aligned
          T* o = static_cast<T*>(p.out) + int64_t(e.req) * p.o_batch_stride +
                 int64_t(s_q) * p.o_seq_stride + int64_t(h_q) * p.o_head_stride + col;
          reinterpret_cast<uint32_t*>(o)[0] = pack2<T>(a[s].x, a[s].y);
          reinterpret_cast<uint32_t*>(o)[1] = pack2<T>(a[s].z, a[s].w);
        } else {
          float* o = p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim + col;
          *reinterpret_cast<float4*>(o) = a[s];
        }
      }
    }
  }
}

// The epilogue of piece e for row group g: finish_row_stats, then O / l stored (8-bit caches:
// quad is store_o8's transpose buffer). The first barrier: the previous piece's epilogue may
// still be reading inv_l, and an empty piece has no tile barrier in between.
template <class Tr, typename T, int kFmt>
__device__ __forceinline__ void piece_epilogue(const DecodeSmem<Tr>& sm,
                                               const MlaDecodeParams& p, const PieceRun& e,
                                               const float (&o_acc)[Tr::kMFrags][Tr::kPvFrags][4],
                                               float4 (&quad)[4], int row0, int g, int d,
                                               int srow) {
  const int lane = fresh_tid() & 31;
  named_barrier(1 + g, Tr::kDimGroups * 32);
  finish_row_stats<Tr, kFmt>(sm, p, e, row0, srow, lane);
  named_barrier(1 + g, Tr::kDimGroups * 32);
  if constexpr (Tr::kKv8) {
    if (e.write != kWriteNone) store_o8<Tr, T>(sm, p, e, o_acc, row0, g, d, lane, quad);
  } else if (e.write != kWriteNone) {
    store_o16<Tr, T>(sm, p, e, o_acc, row0, g, d, lane);
  }
}

}  // namespace kf::cuda
