// MLA combine: for each request split into pieces k = piece_offset[r] .. piece_offset[r+1]-1,
// out[row] = sum_k w_k o_accum[k][row], lse[row] = log sum_k exp(lse_accum[k][row]), with
// core/softmax_merge.h's merged_lse / piece_weight. Deterministic: the max and the sum of
// exponentials are reduced in a fixed butterfly, the weighted sum in a fixed order.
// Every warp reduces the row's lse values itself (lane k holds pieces k, k + 32, ...) and owns
// 128 output values (lane l: 4 of them); the pieces go in rounds of kGroup (a round's rows load
// together, one round trip; the first round loads with the lse values). Two tilings:
//  - many requests (few pieces each): grid (batch, rows), warp g owns values 128 g ..: no shared
//    memory, no block barrier; kGroup 8 (64 registers: b = 64 at h_q = 16 is one wave);
//  - few requests (many pieces each: b = 1 spreads a request over ~64 workers): grid (batch,
//    rows, 4), the block's 4 warps share 128 values and take the rounds in turn (warp w: rounds
//    w, w + 4, ...), then add their sums in warp order through shared memory. kGroup 16: 64
//    pieces are one round trip instead of four.
// It lets the next call's decode, a programmatic dependent (pdl.cuh), launch as it finishes.
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

constexpr int kThreads = kLatentDim / 4;  // one float4 of the row per thread

// A 16-byte load through the read-only path (the partials are complete: stream order).
__device__ __forceinline__ float4 ldg_nc_f4(const float4* src) {
  float4 o;
  asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(o.x), "=f"(o.y), "=f"(o.z), "=f"(o.w)
               : "l"(src));
  return o;
}

template <typename T, int kGroup, bool kWarpsOverPieces>
__global__ void __launch_bounds__(kThreads)
    mla_combine_kernel(const __grid_constant__ MlaDecodeParams p) {
#ifdef KF_TIMELINE
  if (p.timeline != nullptr && threadIdx.x == 0) atomicMin(&p.timeline[0], (unsigned long long)timeline_now());
#endif
  static_assert(32 % kGroup == 0, "a round stays inside one 32-piece chunk of lse values");
  constexpr int kWarps = kThreads / 32;
  const int r = blockIdx.x, row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int quarter = kWarpsOverPieces ? int(blockIdx.z) : warp;  // values 128 quarter ..
  // The request's piece range loads with the header words (one round trip, not two).
  const int32_t* piece_offset = meta_piece_offset(p.metadata, p.num_workers);
  const int first = piece_offset[r], last = piece_offset[r + 1];
  if (!metadata_matches(p)) return;  // decode wrote empty rows and reported
  if (last - first <= 1) return;
  if (first < 0 || last > max_pieces(p.batch, p.num_workers)) {
    if (tid == 0 && row == 0 && quarter == 0)
      report_device_error(p.error_buffer, kDevErrMetadata, r, last);
    return;
  }
  const int n = last - first;
  const float* lse_k = p.lse_accum + int64_t(first) * p.num_rows + row;
  const float4* o_base = reinterpret_cast<const float4*>(
      p.o_accum + (int64_t(first) * p.num_rows + row) * kLatentDim) + quarter * 32 + lane;
  const int64_t piece_stride = int64_t(p.num_rows) * kLatentDim / 4;  // in float4
  auto lse_of = [&](int k) { return k < n ? lse_k[int64_t(k) * p.num_rows] : -INFINITY; };
  auto load_group = [&](float4 (&o)[kGroup], int k0) {
#pragma unroll
    for (int u = 0; u < kGroup; ++u)  // nothing is loaded past the last piece
      o[u] = k0 + u < n ? ldg_nc_f4(o_base + (k0 + u) * piece_stride)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  // This warp's rounds: pieces kGroup rho .. + kGroup - 1 for rho = rho0, rho0 + rho_step, ...
  const int rho0 = kWarpsOverPieces ? warp : 0, rho_step = kWarpsOverPieces ? kWarps : 1;

  // One round trip: the first round's rows, this lane's first lse value and the lse of the
  // lane's piece in the first round's 32-piece chunk.
  float4 o[kGroup];
  load_group(o, rho0 * kGroup);
  const float lse0 = lse_of(lane);
  const int chunk0 = (rho0 * kGroup) & ~31;
  const float lse_chunk0 = chunk0 == 0 ? lse0 : lse_of(chunk0 + lane);

  // lse = log sum_k exp(lse_k): lane maxima and sums over pieces lane, lane + 32, ..., then a
  // butterfly (the same fixed order in every warp).
  float mx = lse0;
  for (int k = lane + 32; k < n; k += 32) mx = fmaxf(mx, lse_of(k));
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, s));
  float sum = 0.f;
  if (mx != -INFINITY) {
    sum = expf(lse0 - mx);
    for (int k = lane + 32; k < n; k += 32) sum += expf(lse_of(k) - mx);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  const float lse = merged_lse(mx, sum);

  // acc = sum_k w_k o_k over this warp's rounds: piece k's weight comes from lane k % 32 of its
  // chunk; a round's kGroup products are added in a fixed pairwise tree.
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int rho = rho0; rho * kGroup < n; rho += rho_step) {
    const int k0 = rho * kGroup, chunk = k0 & ~31;
    if (rho != rho0) load_group(o, k0);
    const float w_lane = piece_weight(chunk == chunk0 ? lse_chunk0 : lse_of(chunk + lane), lse);
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const float w = __shfl_sync(0xffffffffu, w_lane, k0 - chunk + u);  // 0 past the last piece
      o[u].x *= w;
      o[u].y *= w;
      o[u].z *= w;
      o[u].w *= w;
    }
#pragma unroll
    for (int step = 1; step < kGroup; step <<= 1)
#pragma unroll
      for (int u = 0; u < kGroup; u += 2 * step) {
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
  if constexpr (kWarpsOverPieces) {  // the warps' sums, added in warp order by warp 0
    __shared__ float4 part[kWarps - 1][32];
    if (warp > 0) part[warp - 1][lane] = acc;
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int w = 0; w < kWarps - 1; ++w) {
      const float4 v = part[w][lane];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
  }
  const int s = row / p.h_q, h = row % p.h_q;
  T* out = static_cast<T*>(p.out) + int64_t(r) * p.o_batch_stride + int64_t(s) * p.o_seq_stride +
           int64_t(h) * p.o_head_stride + quarter * 128 + 4 * lane;
  // 4-byte stores: out rows need only 4-byte alignment.
  reinterpret_cast<uint32_t*>(out)[0] = pack2<T>(acc.x, acc.y);
  reinterpret_cast<uint32_t*>(out)[1] = pack2<T>(acc.z, acc.w);
  if (quarter == 0 && lane == 0) p.lse[(int64_t(r) * p.h_q + h) * p.s_q + s] = lse;
  pdl_launch_dependents();
#ifdef KF_TIMELINE
  if (p.timeline != nullptr && tid == 0) atomicMax(&p.timeline[1], (unsigned long long)timeline_now());
#endif
}

template <typename T>
cudaError_t launch(const MlaDecodeParams& p, cudaStream_t stream) {
  const dim3 grid(p.batch, p.num_rows);
  // Few requests for many workers (>= 32 workers per request: ~32 or more pieces each): the
  // warps of a block split the pieces (grid z: the 4 quarters of the row); otherwise the dims.
  // Measured on the H200 (bf16, h_q = 16, s_k = 4096, 264 workers, decode + combine): b = 1
  // 16.1 -> 14.0 us, b = 8 27.4 -> 26.2 us; b = 16 (16 workers per request) 36.2 -> 37.4 us.
  // A plain launch: as a programmatic dependent of the decode it was slower (pdl.cuh).
  const bool many_pieces = p.num_workers >= 32 * p.batch;
  if (many_pieces)
    mla_combine_kernel<T, 16, true><<<dim3(grid.x, grid.y, kThreads / 32), kThreads, 0, stream>>>(p);
  else
    mla_combine_kernel<T, 8, false><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_mla_combine(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.dtype == DType::kBF16 ? launch<__nv_bfloat16>(p, stream) : launch<__half>(p, stream);
}

}  // namespace kf::cuda
