// The attention's merge and the output absorption in one launch (the layer's steps 3b and 4) for
// up to kGemmNarrowMaxM rows on GPUs with thread-block clusters:
//   o_lat[b, h] = sum_k w_k o_accum[k][h]   over request b's pieces k (mla_combine.cu's merge),
//   o_heads[b, h*v : (h+1)*v] = o_lat[b, h] W_UV[h]^T   (the narrow skinny GEMM),
// so the layer has no combine node. The v / 16 column tiles of head h (C of them, 1, 2, 4 or 8)
// are one cluster; block t of the cluster:
//   1. requests its 16 weight rows over all 512 k (the narrow kernel's two 256-k stages) before
//      pdl_wait: the weights do not depend on the decode;
//   2. merges latent values [t S, t S + S) of head h (S = 512 / C) for every row b < m: a
//      request the decode split into n > 1 pieces gets sum_k w_k o_accum[k] with
//      core/softmax_merge.h's weights, added in piece order by each of `tpi` lanes over every
//      tpi-th piece and then across the lanes in a fixed butterfly (the same bits on every
//      launch); a request of one piece was written to o_lat by the decode and is copied from
//      there. Rounded to bf16 (o_lat's type) into this block's shared memory;
//   3. after a cluster barrier, gathers the whole X tile (512 k of every row) from the blocks of
//      its cluster (distributed shared memory) into the narrow kernel's stage layout;
//   4. multiplies and writes o_heads as the narrow kernel does (skinny_gemm_narrow.cuh).
// o_lat is not written for split requests, nor the lse (the layer uses neither). Metadata made
// for another call (the decode then wrote empty rows and reported it) is read as one piece per
// request; a piece range outside the workspace is reported as the combine reports it.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "core/softmax_merge.h"
#include "cuda/common/cluster.cuh"
#include "cuda/common/device_error.cuh"
#include "cuda/common/metadata_check.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/layer/layer_kernels.h"
#include "cuda/layer/skinny_gemm.cuh"
#include "cuda/layer/skinny_gemm_narrow.cuh"

namespace kf::cuda {
namespace {

struct UvCombine {
  GemmLaunch uv;         // planned: narrow, one job over the heads, k = 512
  MlaDecodeParams attn;  // the decode's call: metadata, o_accum, lse_accum, error buffer
  int cluster;           // C: the column tiles of one head
};

// Per row b < m of the block: the request's first piece, its piece count (<= 1: read o_lat)
// and the merged lse of head h's row.
struct RowMerge {
  int first[kGemmNarrowMaxM];
  int n[kGemmNarrowMaxM];
  float lse[kGemmNarrowMaxM];
};

// The device code below is sm_90 code (clusters); the kernel traps elsewhere.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Warp `warp` fills the rows b = warp, warp + 4, ... of `rows` for head h: the max of the
// pieces' lse values (nan_max keeps NaN) and the sum of their exponentials, each over lanes
// k = lane, lane + 32, ... then in a butterfly.
__device__ __forceinline__ void merge_rows(const MlaDecodeParams& p, int m, int h, bool matches,
                                           bool reporter, RowMerge& rows, int warp, int lane) {
  const int32_t* piece_offset = meta_piece_offset(p.metadata, p.num_workers);
  for (int b = warp; b < m; b += kGemmThreads / 32) {
    int first = 0, n = 0;
    if (matches) {
      first = __ldcg(piece_offset + b);
      const int last = __ldcg(piece_offset + b + 1);
      n = last - first;
      if (n > 1 && (first < 0 || last > max_pieces(p.batch, p.num_workers))) {
        if (reporter && lane == 0) report_device_error(p.error_buffer, kDevErrMetadata, b, last);
        n = 0;
      }
    }
    float lse = 0.f;
    if (n > 1) {
      const float* lse_k = p.lse_accum + int64_t(first) * p.num_rows + h;
      float mx = -INFINITY;
      for (int k = lane; k < n; k += 32) mx = nan_max(mx, __ldcg(lse_k + int64_t(k) * p.num_rows));
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, s));
      float sum = 0.f;
      if (mx != -INFINITY)
        for (int k = lane; k < n; k += 32) sum += expf(__ldcg(lse_k + int64_t(k) * p.num_rows) - mx);
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
      lse = merged_lse(mx, sum);
    }
    if (lane == 0) {
      rows.first[b] = first;
      rows.n[b] = n;
      rows.lse[b] = lse;
    }
  }
}

// Lanes per (row, float4) item sharing its pieces: all 128 threads busy where the items allow.
__device__ __forceinline__ int lanes_per_item(int items) {
  return items <= 16 ? 8 : items <= 32 ? 4 : items <= 64 ? 2 : 1;
}

// Latent values [s0, s0 + S) of head h for rows b < m, bf16, into slice[b * S + ..].
template <int S>
__device__ __forceinline__ void merge_slice(const UvCombine& a, const GemmOperands& op,
                                            const RowMerge& rows, int m, int h, int s0,
                                            uint16_t* slice, int tid) {
  const MlaDecodeParams& p = a.attn;
  constexpr int kGroups = S / 4;  // float4 groups of a row's slice
  const int items = m * kGroups, tpi = lanes_per_item(items), sub = tid % tpi;
  const int per_pass = kGemmThreads / tpi;
  for (int item0 = 0; item0 < items; item0 += per_pass) {
    const int item = item0 + tid / tpi;
    const bool live = item < items;  // every lane of a group agrees (tpi divides 32)
    const int b = live ? item / kGroups : 0, c = 4 * (live ? item % kGroups : 0);
    const int n = live ? rows.n[b] : 0;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (n > 1) {
      const float lse = rows.lse[b];
      const int64_t piece_floats = int64_t(p.num_rows) * kLatentDim;
      const float* o_k = p.o_accum + int64_t(rows.first[b]) * piece_floats + int64_t(h) * kLatentDim + s0 + c;
      const float* lse_k = p.lse_accum + int64_t(rows.first[b]) * p.num_rows + h;
#pragma unroll 4
      for (int k = sub; k < n; k += tpi) {
        const float w = piece_weight(__ldcg(lse_k + int64_t(k) * p.num_rows), lse);
        const float4 o = __ldcg(reinterpret_cast<const float4*>(o_k + int64_t(k) * piece_floats));
        acc.x = fmaf(w, o.x, acc.x);
        acc.y = fmaf(w, o.y, acc.y);
        acc.z = fmaf(w, o.z, acc.z);
        acc.w = fmaf(w, o.w, acc.w);
      }
    }
    for (int s = 1; s < tpi; s <<= 1) {  // the same sum in every lane of the group
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, s);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, s);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, s);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, s);
    }
    if (!live || sub != 0) continue;
    uint2 v;
    if (n > 1) {
      v.x = pack2<__nv_bfloat16>(acc.x, acc.y);
      v.y = pack2<__nv_bfloat16>(acc.z, acc.w);
    } else {  // one piece: the decode's own bf16 row
      v = __ldcg(reinterpret_cast<const uint2*>(op.x + int64_t(b) * op.ldx + s0 + c));
    }
    *reinterpret_cast<uint2*>(slice + b * S + c) = v;
  }
}

// The X rows of both narrow stages (k 0..255, 256..511) from the cluster's slices: 16-byte
// chunk (row r, k 8 j) of the latent row lives in block (8 j) / S at offset (8 j) % S; rows at
// or past m are zero.
template <int MT, int S>
__device__ __forceinline__ void gather_x(uint8_t* smem, const uint16_t* slice, int m, int tid) {
  using Shape = NarrowShape<MT>;
  constexpr int kChunks = 2 * Shape::kXRows * kNarrowChunks;  // both stages
  for (int i = tid; i < kChunks; i += kGemmThreads) {
    const int stage = i / (Shape::kXRows * kNarrowChunks), rest = i % (Shape::kXRows * kNarrowChunks);
    const int row = rest / kNarrowChunks, chunk = rest % kNarrowChunks;
    const int k = stage * kNarrowStageK + chunk * 8;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < m) v = ld_cluster_f32x4(slice + row * S + k % S, k / S);
    uint8_t* xs = smem + stage * Shape::kStageBytes + Shape::kWBytes;
    *reinterpret_cast<float4*>(xs + gemm_swizzle(row, chunk, kGemmNarrowRowBytes)) = v;
  }
}

#endif

template <int MT, int S>
__global__ void __launch_bounds__(kGemmThreads) uv_combine_kernel(const __grid_constant__ UvCombine a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Shape = NarrowShape<MT>;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ RowMerge rows;
  uint16_t* slice = reinterpret_cast<uint16_t*>(smem + 2 * Shape::kStageBytes);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const GemmLaunch& g = a.uv;
  const int bid = blockIdx.x, rank = bid % a.cluster;
  const GemmTileId id = gemm_tile_id(g, bid, kGemmNarrowTileN);  // z = head, rank = its tile
  const GemmOperands op = gemm_operands(g, id);
  for (int i = 0; i < 2; ++i) narrow_load_w(smem + i * Shape::kStageBytes, op, id.n0, i * kNarrowStageK, g.k, tid);
  cp_async_commit();
  pdl_wait();  // o_accum, lse_accum and o_lat are the decode's output
  merge_rows(a.attn, g.m, id.z, metadata_matches(a.attn), bid == 0, rows, warp, lane);
  __syncthreads();
  merge_slice<S>(a, op, rows, g.m, id.z, rank * S, slice, tid);
  cluster_arrive_release();  // this block's slice is in place ...
  cluster_wait();            // ... and so is every other block's
  gather_x<MT, S>(smem, slice, g.m, tid);
  cluster_arrive_relaxed();  // this block's reads of the others' slices have returned
  cp_async_wait<0>();
  __syncthreads();
  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  narrow_stage_mma<MT>(acc, smem, warp, lane);
  narrow_stage_mma<MT>(acc, smem + Shape::kStageBytes, warp, lane);
  pdl_launch_dependents();
  narrow_epilogue<MT>(g, op, id.n0, acc, warp, lane, smem);
  cluster_wait();  // no block leaves while another may still read its slice
#else
  (void)a;
  __trap();  // launched only where the device has clusters (sm_90+)
#endif
}

template <int MT, int S>
cudaError_t launch_with(const UvCombine& a, cudaStream_t stream) {
  auto kernel = uv_combine_kernel<MT, S>;
  const int smem = 2 * NarrowShape<MT>::kStageBytes + NarrowShape<MT>::kXRows * S * 2;
  const cudaError_t err = allow_smem(kernel, smem);
  if (err != cudaSuccess) return err;
  return launch_dependent(kernel, dim3(a.uv.tiles), dim3(kGemmThreads), smem, stream, a.cluster, a);
}

template <int MT>
cudaError_t launch_mt(const UvCombine& a, cudaStream_t stream) {
  switch (a.cluster) {
    case 1: return launch_with<MT, 512>(a, stream);
    case 2: return launch_with<MT, 256>(a, stream);
    case 4: return launch_with<MT, 128>(a, stream);
    default: return launch_with<MT, 64>(a, stream);
  }
}

}  // namespace

bool uv_combine_supported(const GemmLaunch& uv, const MlaDecodeParams& attn) {
  GemmLaunch planned = uv;
  if (!device_has_clusters() || !plan_gemm(planned, WeightLayout::kNK) || !planned.narrow ||
      planned.num_jobs != 1 || planned.k != kLatentDim)
    return false;
  const int c = planned.job[0].tiles_n;
  return (c == 1 || c == 2 || c == 4 || c == 8) && attn.dtype == DType::kBF16 && attn.s_q == 1 &&
         attn.num_rows == planned.job[0].num_z && attn.batch == planned.m &&
         attn.metadata != nullptr && attn.o_accum != nullptr && attn.lse_accum != nullptr;
}

cudaError_t launch_uv_combine(const GemmLaunch& uv, const MlaDecodeParams& attn,
                              cudaStream_t stream) {
  if (!uv_combine_supported(uv, attn)) return cudaErrorInvalidValue;
  UvCombine a{uv, attn, 0};
  plan_gemm(a.uv, WeightLayout::kNK);
  a.cluster = a.uv.job[0].tiles_n;
  return a.uv.m <= 8 ? launch_mt<1>(a, stream) : launch_mt<2>(a, stream);
}

}  // namespace kf::cuda
