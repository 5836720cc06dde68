// MLA combine: for each request split into pieces k = piece_offset[r] .. piece_offset[r+1]-1,
// out[row] = sum_k w_k o_accum[k][row], lse[row] = log sum_k exp(lse_accum[k][row]), with
// core/softmax_merge.h's merged_lse / piece_weight. Deterministic: the max and the sum of
// exponentials are reduced in a fixed butterfly, the weighted sum in a fixed order.
// The row's lse values are reduced by a warp (lane k holds pieces k, k + 32, ...). Two tilings:
//  - many requests (< 32 workers per request: b >= 9 on the H200's 264 h_q 16 workers), few
//    pieces each: one warp per row, 4 rows per block; lane l holds the row's float4s l, l + 32,
//    l + 64, l + 96 (512-byte loads per warp) and adds the pieces in index order, kRound
//    pieces' loads in flight at once, the first round with the lse values (two round trips for
//    up to kRound pieces, the metadata words included);
//  - few requests (many pieces each: b = 1 spreads a request over ~64 workers): grid (batch,
//    rows, 4), a block's 4 warps share 128 values of the row, take rounds of 16 pieces in turn
//    (warp w: rounds w, w + 4, ...; a round's products added in a fixed pairwise tree) and add
//    their sums in warp order through shared memory.
// It lets the next call's decode, a programmatic dependent (pdl.cuh), launch as it finishes, or
// the next kernel launch at its start where the caller asks (combine_early_dependents: the fused
// layer's output absorption streams its weights meanwhile). The few-requests tiling, and both
// tilings under that flag, are themselves launched as programmatic dependents of the decode and
// wait for it before their first read of its partials (the metadata words are read before the
// wait: load_piece_range); the many-requests tiling of plain calls is launched plainly (launch()
// says why).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/scheduler.h"
#include "core/softmax_merge.h"
#include "cuda/combine/mla_combine.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/metadata_check.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/timeline.cuh"

namespace kf::cuda {
namespace {

constexpr int kRowFloat4s = kLatentDim / 4;  // 128
constexpr int kRowsPerBlock = 4;             // many requests: a warp per row
constexpr int kRound = 4;                    // many requests: pieces loaded together
constexpr int kManyRound = 16;               // few requests: pieces per warp round
constexpr int kManyWarps = 4;                // few requests: warps sharing 128 values of a row

// A 16-byte load through the read-only path (the partials are complete: stream order).
__device__ __forceinline__ float4 ldg_nc_f4(const float4* src) {
  float4 o;
  asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(o.x), "=f"(o.y), "=f"(o.z), "=f"(o.w)
               : "l"(src));
  return o;
}

// The metadata words piece_range decides from: request r's piece_offset pair and the header
// check. They are loaded before the kernel's dependency wait (pdl_wait): the metadata was written
// before the decode began, and the decode lets this kernel launch only from blocks that have
// passed their own wait for the kernels before it, so the wait is needed for the partials alone.
struct PieceRangeWords {
  int first, last;
  bool matches;
};
__device__ __forceinline__ PieceRangeWords load_piece_range(const MlaDecodeParams& p, int r) {
  const int32_t* piece_offset = meta_piece_offset(p.metadata, p.num_workers);
  return {piece_offset[r], piece_offset[r + 1], metadata_matches(p)};
}

// Request r's pieces [first, first + n) from its loaded words; false when there is nothing to
// merge here: metadata made for another call (the decode wrote empty rows and reported), one
// piece (the decode wrote out), or a range outside the workspace (reported by `reporter`).
__device__ __forceinline__ bool piece_range(const MlaDecodeParams& p, int r,
                                            const PieceRangeWords& words, bool reporter,
                                            int& first, int& n) {
  first = words.first;
  const int last = words.last;
  if (!words.matches) return false;
  if (last - first <= 1) return false;
  if (first < 0 || last > max_pieces(p.batch, p.num_workers)) {
    if (reporter) report_device_error(p.error_buffer, kDevErrMetadata, r, last);
    return false;
  }
  n = last - first;
  return true;
}


// lse = log sum_k exp(lse_k) over n pieces, in every lane of the warp: lane maxima and sums
// over pieces lane, lane + 32, ..., then a butterfly (the same fixed order in every warp).
// lse0 = lse_of(lane) and lse1 = lse_of(lane + 32), already loaded (with the first partials, so
// that up to 64 pieces cost no further round trip). The maximum keeps NaN (nan_max).
template <class LseOf>
__device__ __forceinline__ float warp_merged_lse(const LseOf& lse_of, int n, int lane, float lse0,
                                                 float lse1) {
  float mx = lse0;
  if (lane + 32 < n) mx = nan_max(mx, lse1);
  for (int k = lane + 64; k < n; k += 32) mx = nan_max(mx, lse_of(k));
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, s));
  float sum = 0.f;
  if (mx != -INFINITY) {
    sum = expf(lse0 - mx);
    if (lane + 32 < n) sum += expf(lse1 - mx);
    for (int k = lane + 64; k < n; k += 32) sum += expf(lse_of(k) - mx);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  return merged_lse(mx, sum);
}

// 4 values of an out row (only 4-byte aligned: 4-byte stores).
template <typename T>
__device__ __forceinline__ void store4(T* out, float4 v) {
  reinterpret_cast<uint32_t*>(out)[0] = pack2<T>(v.x, v.y);
  reinterpret_cast<uint32_t*>(out)[1] = pack2<T>(v.z, v.w);
}

// Many requests, few pieces each: a warp per row (see the top of the file).
template <typename T>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    mla_combine_rows_kernel(const __grid_constant__ MlaDecodeParams p) {
  KF_TIMELINE_STAMP(p.timeline, kTlCombine, kTlEntry, threadIdx.x);
  if (p.combine_early_dependents) pdl_launch_dependents();
  const int r = blockIdx.x, lane = threadIdx.x & 31;
  const int row = blockIdx.y * kRowsPerBlock + int(threadIdx.x >> 5);
  const PieceRangeWords words = load_piece_range(p, r);
  pdl_wait();  // the decode's partials (a no-op when launched plainly)
  KF_TIMELINE_STAMP(p.timeline, kTlCombine, kTlWaited, threadIdx.x);
  int first = 0, n = 0;
  if (row >= p.num_rows || !piece_range(p, r, words, row == 0 && lane == 0, first, n)) return;
  const float* lse_k = p.lse_accum + int64_t(first) * p.num_rows + row;
  const float4* o_base =
      reinterpret_cast<const float4*>(p.o_accum + (int64_t(first) * p.num_rows + row) * kLatentDim) +
      lane;
  const int64_t piece_stride = int64_t(p.num_rows) * kRowFloat4s;  // in float4
  auto lse_of = [&](int k) { return k < n ? lse_k[int64_t(k) * p.num_rows] : -INFINITY; };
  float4 o[kRound][4];
  auto load_round = [&](int k0) {
#pragma unroll
    for (int u = 0; u < kRound; ++u)
#pragma unroll
      for (int j = 0; j < 4; ++j)  // nothing is loaded past the last piece
        o[u][j] = k0 + u < n ? ldg_nc_f4(o_base + (k0 + u) * piece_stride + 32 * j)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  load_round(0);  // in flight with the lse values
  const float lse0 = lse_of(lane), lse1 = lse_of(lane + 32);
  const float lse = warp_merged_lse(lse_of, n, lane, lse0, lse1);

  // acc = sum_k w_k o_k in piece order; piece k's weight comes from lane k % 32 of its chunk.
  float4 acc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  static_assert(32 % kRound == 0, "a round stays inside one 32-piece chunk of lse values");
  for (int k0 = 0; k0 < n; k0 += kRound) {
    if (k0 > 0) load_round(k0);
    const int chunk = k0 & ~31;
    const float w_lane =
        piece_weight(chunk == 0 ? lse0 : (chunk == 32 ? lse1 : lse_of(chunk + lane)), lse);
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const float w = __shfl_sync(0xffffffffu, w_lane, k0 - chunk + u);
      if (k0 + u < n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[j].x = fmaf(w, o[u][j].x, acc[j].x);
          acc[j].y = fmaf(w, o[u][j].y, acc[j].y);
          acc[j].z = fmaf(w, o[u][j].z, acc[j].z);
          acc[j].w = fmaf(w, o[u][j].w, acc[j].w);
        }
      }
    }
  }
  const int s = row / p.h_q, h = row % p.h_q;
  T* out = static_cast<T*>(p.out) + int64_t(r) * p.o_batch_stride + int64_t(s) * p.o_seq_stride +
           int64_t(h) * p.o_head_stride + 4 * lane;
#pragma unroll
  for (int j = 0; j < 4; ++j) store4<T>(out + 128 * j, acc[j]);
  if (lane == 0) p.lse[(int64_t(r) * p.h_q + h) * p.s_q + s] = lse;
  KF_TIMELINE_STAMP(p.timeline, kTlCombine, kTlExit, threadIdx.x);
  if (!p.combine_early_dependents) pdl_launch_dependents();
}

// Few requests, many pieces each: a block per (request, row, quarter of the row) (see the top).
template <typename T>
__global__ void __launch_bounds__(kManyWarps * 32)
    mla_combine_pieces_kernel(const __grid_constant__ MlaDecodeParams p) {
  KF_TIMELINE_STAMP(p.timeline, kTlCombine, kTlEntry, threadIdx.x);
  if (p.combine_early_dependents) pdl_launch_dependents();
  const int r = blockIdx.x, row = blockIdx.y, quarter = blockIdx.z;  // values 128 quarter ..
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const PieceRangeWords words = load_piece_range(p, r);
  pdl_wait();  // the decode's partials (a no-op when launched plainly)
  KF_TIMELINE_STAMP(p.timeline, kTlCombine, kTlWaited, tid);
  int first = 0, n = 0;
  if (!piece_range(p, r, words, tid == 0 && row == 0 && quarter == 0, first, n)) return;
  const float* lse_k = p.lse_accum + int64_t(first) * p.num_rows + row;
  const float4* o_base = reinterpret_cast<const float4*>(
      p.o_accum + (int64_t(first) * p.num_rows + row) * kLatentDim) + quarter * 32 + lane;
  const int64_t piece_stride = int64_t(p.num_rows) * kRowFloat4s;  // in float4
  auto lse_of = [&](int k) { return k < n ? lse_k[int64_t(k) * p.num_rows] : -INFINITY; };
  auto load_group = [&](float4 (&o)[kManyRound], int k0) {
#pragma unroll
    for (int u = 0; u < kManyRound; ++u)  // nothing is loaded past the last piece
      o[u] = k0 + u < n ? ldg_nc_f4(o_base + (k0 + u) * piece_stride)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  // This warp's rounds: pieces kManyRound rho .. + kManyRound - 1 for rho = warp, warp + 4, ...
  // One round trip: the first round's rows, this lane's first two lse values and the lse of the
  // lane's piece in the first round's 32-piece chunk.
  float4 o[kManyRound];
  load_group(o, warp * kManyRound);
  const float lse0 = lse_of(lane), lse1 = lse_of(lane + 32);
  const int chunk0 = (warp * kManyRound) & ~31;
  const float lse_chunk0 = chunk0 == 0 ? lse0 : (chunk0 == 32 ? lse1 : lse_of(chunk0 + lane));
  const float lse = warp_merged_lse(lse_of, n, lane, lse0, lse1);

  // acc = sum_k w_k o_k over this warp's rounds: piece k's weight comes from lane k % 32 of its
  // chunk; a round's products are added in a fixed pairwise tree.
  static_assert(32 % kManyRound == 0, "a round stays inside one 32-piece chunk of lse values");
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int rho = warp; rho * kManyRound < n; rho += kManyWarps) {
    const int k0 = rho * kManyRound, chunk = k0 & ~31;
    if (rho != warp) load_group(o, k0);
    const float w_lane = piece_weight(chunk == chunk0 ? lse_chunk0 : lse_of(chunk + lane), lse);
#pragma unroll
    for (int u = 0; u < kManyRound; ++u) {
      const float w = __shfl_sync(0xffffffffu, w_lane, k0 - chunk + u);  // 0 past the last piece
      o[u].x *= w;
      o[u].y *= w;
      o[u].z *= w;
      o[u].w *= w;
    }
#pragma unroll
    for (int step = 1; step < kManyRound; step <<= 1)
#pragma unroll
      for (int u = 0; u < kManyRound; u += 2 * step) {
        o[u].x += o[u + step].x;
        o[u].y += o[u + step].y;
        o[u].z += o[u + step].z;
        o[u].w += o[u + step].w;
      }
    acc.x += o[0].x;
    acc.y += o[0].y;
    acc.z += o[0].z;
    acc.w += o[0].w;
  }
  __shared__ float4 part[kManyWarps - 1][32];  // the warps' sums, added in warp order by warp 0
  if (warp > 0) part[warp - 1][lane] = acc;
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kManyWarps - 1; ++w) {
    const float4 v = part[w][lane];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  const int s = row / p.h_q, h = row % p.h_q;
  T* out = static_cast<T*>(p.out) + int64_t(r) * p.o_batch_stride + int64_t(s) * p.o_seq_stride +
           int64_t(h) * p.o_head_stride + quarter * 128 + 4 * lane;
  store4<T>(out, acc);
  if (quarter == 0 && lane == 0) p.lse[(int64_t(r) * p.h_q + h) * p.s_q + s] = lse;
  KF_TIMELINE_STAMP(p.timeline, kTlCombine, kTlExit, tid);
  if (!p.combine_early_dependents) pdl_launch_dependents();
}

template <typename T>
cudaError_t launch(const MlaDecodeParams& p, cudaStream_t stream) {
  // Few requests for many workers (>= 32 workers per request: ~32 or more pieces each): the
  // warps of a block split the pieces, so a row's long piece list is not one warp's serial
  // chain. Otherwise a warp per row: typically 2-5 pieces, the row's lse values reduced once,
  // one wave of blocks. The few-requests tiling is launched as a programmatic dependent of the
  // decode, so its launch overlaps the decode's last blocks (faster on the H200 at h_q 16 b <= 8
  // and h_q 128 b <= 2: docs/optimization/decode.md, step combine-dependent). In plain calls the
  // many-requests tiling is launched plainly: as a dependent it was no faster at h_q 16 b 64 /
  // 128 and slower at h_q 128 b 4 (same step). The fused layer (combine_early_dependents), where
  // the combine's own dependent streams weights early, launches both tilings as dependents
  // (docs/optimization/layer.md).
  if (p.num_workers >= 32 * p.batch) {
    const dim3 grid(p.batch, p.num_rows, kRowFloat4s / 32);
    return launch_pdl(mla_combine_pieces_kernel<T>, grid, dim3(kManyWarps * 32), 0, stream, p);
  } else {
    const dim3 grid(p.batch, ceil_div(p.num_rows, kRowsPerBlock));
    if (p.combine_early_dependents)
      return launch_pdl(mla_combine_rows_kernel<T>, grid, dim3(kRowsPerBlock * 32), 0, stream, p);
    mla_combine_rows_kernel<T><<<grid, kRowsPerBlock * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_mla_combine(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.dtype == DType::kBF16 ? launch<__nv_bfloat16>(p, stream) : launch<__half>(p, stream);
}

}  // namespace kf::cuda
