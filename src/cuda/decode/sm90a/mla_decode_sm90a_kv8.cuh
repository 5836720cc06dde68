// MLA decode, the sm_90a kernel for 8-bit caches (FP8 e4m3, INT8; bf16 q): wgmma with the KV
// tile as the register operand, tensor copies, warp specialization. One block = (worker, 16-row
// tile).
//
// What: the decode kernels' contract (mla_decode_kernel.cuh): for each piece (request, token
// range) of its worker, o = softmax(scale q k^T) v over the piece's tokens for the tile's 16
// query rows; a request's only piece writes out (bf16) and lse, other pieces write o_accum
// (normalized by their own sum) and lse_accum for the combine. The piece list, the metadata check
// and the empty rows of a foreign metadata are the portable family's (mla_decode_pipeline.cuh).
//
// How: token-major products (sm90a_kv8_tile.cuh): per 64-token tile, S^T = K Q^T and
// O^T += V^T P'^T with the tile's tokens as the wgmma M and the 16 query rows as N, K and V
// converted from their 8-bit codes to fp16 A fragments as a consumer warpgroup reads them from
// shared memory, so no converted copy of a tile is stored and no query row is padded. The two
// consumer warpgroups take a piece's tiles in turn (each its own running max, sum and O; one's
// softmax runs while the other's products do) and merge at the piece's end. Lane 0 of the
// producer warpgroup copies each tile's three page sections into a stage by tensor copies
// (kv_tensor_map_sm90a.h; pages past the piece and pages whose block-table entry is out of range
// are addressed outside the tensor and arrive as zeros, the latter reported and masked), kStages
// tiles ahead, across the pieces of a round. Synchronization: per stage a `full` mbarrier (the
// copies' bytes, armed by the producer) and an `empty` one (lane 0 of each warp of the consuming
// warpgroup, once its products that read the stage completed); inside a warpgroup its named
// barrier (the tile max exchange, P'^T); between the two the named barrier kBarConsumers (Q, the
// merge); the block barrier kBarBlock between rounds of pieces.
// The block is launched as a programmatic dependent (pdl.cuh) like the other decode kernels.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm90a/kv_tensor_map_sm90a.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_kv8_traits.h"
#include "cuda/decode/sm90a/sm90a_copies.cuh"
#include "cuda/decode/sm90a/sm90a_kv8_tile.cuh"
#include "cuda/decode/sm90a/sm90a_mma.cuh"

namespace kf::cuda {
namespace sm90a_kv8 {

// ---- producer (lane 0 of warpgroup 2) ----
// The copies of the tile at token tok of piece e into stage s: per page of the tile the four
// latent column blocks, the rope block and the scales, all completing on the stage's `full`
// barrier; first the tile's token mask (tokens of pages addressed outside the tensor cleared),
// before the barrier is armed, so the consumers read it after their wait.
__device__ __forceinline__ void issue_tile(const MlaDecodeParams& p, const Smem& sm,
                                           const Kv8TensorMaps& maps, const PieceRun& e, int tok,
                                           int s) {
  const sm90a::TileGeom tg(p, p.page_size < Tr::kBlockN);
  const int row_in_page = p.page_size > Tr::kBlockN ? (tok & (p.page_size - 1)) : 0;
  int coord[Tr::kMaxTilePages];
  uint64_t ok = ~0ull;
  const uint64_t page_bits = tg.page_rows == 64 ? ~0ull : (1ull << tg.page_rows) - 1;
#pragma unroll
  for (int j = 0; j < Tr::kMaxTilePages; ++j) {
    if (j >= tg.tile_pages) break;
    coord[j] = sm90a::tile_page_coord(p, e, tok, j, tg);
    if (coord[j] == p.num_pages) ok &= ~(page_bits << (j * tg.page_rows));
  }
  *sm.tok_ok(s) = ok;
  const uint32_t bar = sm.full(s), st = sm.stage(s);
  sm90a::mbar_arrive_expect_tx(bar, Tr::kStageTxBytes);
#pragma unroll
  for (int j = 0; j < Tr::kMaxTilePages; ++j) {
    if (j >= tg.tile_pages) break;
    const uint32_t rows = j * tg.page_rows * 128;
#pragma unroll
    for (int b = 0; b < Tr::kLatBlocks; ++b)
      sm90a::tma_load_3d(st + b * Tr::kLatBlockBytes + rows, &maps.latent, b * 128, row_in_page,
                         coord[j], bar);
    sm90a::tma_load_3d(st + Tr::kStageRopeOff + rows, &maps.rope, 0, row_in_page, coord[j], bar);
    sm90a::tma_load_2d(st + Tr::kStageScaleOff + 256 * j, &maps.scale, row_in_page, coord[j],
                       bar);
  }
}

// The producer's walk over a round's n pieces: tile `it` (counted over the block's rounds) goes
// to stage it % kStages once the consumers released the tile before it there.
__device__ __forceinline__ void produce_round(const MlaDecodeParams& p, const Smem& sm,
                                              const Kv8TensorMaps& maps, int n, uint32_t& it) {
  for (int pi = 0; pi < n; ++pi) {
    const PieceRun e = sm.pieces()[pi];
    for (int tok = e.begin; tok < e.end; tok += Tr::kBlockN, ++it) {
      const int s = int(it % Tr::kStages);
      sm90a::mbar_wait(sm.empty(s), ((it / Tr::kStages) & 1u) ^ 1u);
      issue_tile(p, sm, maps, e, tok, s);
    }
  }
}

// ---- consumer warpgroups ----
// This warpgroup's rows at the piece's end: l, its threads' shares added in a fixed order (in
// every thread, for its columns).
__device__ __forceinline__ void group_row_sums(const Smem& sm, const PieceState& ps,
                                               const Lane& ln, float (&l)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    l[c] = ps.l[c];
#pragma unroll
    for (int d = 4; d <= 16; d <<= 1) l[c] += __shfl_xor_sync(0xffffffffu, l[c], d);
  }
  if (ln.g == 0)
#pragma unroll
    for (int c = 0; c < 4; ++c) sm.row_sum(ln.wg, ln.w)[ln.col(c)] = l[c];
  group_sync(ln.wg);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int n = ln.col(c);
    l[c] = sm.row_sum(ln.wg, 0)[n] + sm.row_sum(ln.wg, 1)[n] + sm.row_sum(ln.wg, 2)[n] +
           sm.row_sum(ln.wg, 3)[n];
  }
}

// The piece's end (both consumer warpgroups): warpgroup 1 leaves its rows' max, sum and unit and
// its O in the merge buffer; warpgroup 0 merges them with its own (each side weighted by
// 2^(m_side - m) and its unit; 1 / l is 0 for a row that saw nothing) and writes O to out or
// o_accum, 16 consecutive dims of each of the thread's rows per store, and
// lse = (m + log2 l) ln 2 (-inf for a row that saw nothing).
__device__ __forceinline__ void piece_epilogue(const MlaDecodeParams& p, const Smem& sm,
                                               const PieceRun& e, const PieceState& ps,
                                               const float (&o)[8][8], int row0, const Lane& ln) {
  float l[4];
  group_row_sums(sm, ps, ln, l);
  float* mr = sm.merge_rows();
  float* mo = sm.merge_o();
  if (ln.wg == 1) {
    if (ln.w == 0 && ln.g == 0)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        mr[ln.col(c)] = ps.m[c];
        mr[Tr::kBlockM + ln.col(c)] = l[c];
      }
    if (ln.gtid == 0) mr[2 * Tr::kBlockM] = ps.unit;
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) mo[(8 * c + i) * Tr::kGroupThreads + ln.gtid] = o[c][i];
  }
  consumers_sync();  // warpgroup 1's rows are in the merge buffer (one call site for both)
  if (ln.wg == 1 || e.write == kWriteNone) return;
  const bool to_out = e.write == kWriteOut;
  const float unit1 = mr[2 * Tr::kBlockM];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int n = ln.col(c), row = row0 + n;
    if (row >= p.num_rows) continue;
    const float m1 = mr[n], l1 = mr[Tr::kBlockM + n];
    const float m = fmaxf(ps.m[c], m1);
    const float mz = m == -INFINITY ? 0.f : m;
    const float a0 = fast_exp2(ps.m[c] - mz), a1 = fast_exp2(m1 - mz);
    const float lsum = l[c] * a0 + l1 * a1;
    const bool empty = lsum == 0.f;
    const float f0 = empty ? 0.f : a0 * ps.unit / lsum, f1 = empty ? 0.f : a1 * unit1 / lsum;
    const int s = row / p.h_q, hq = row % p.h_q;
    if (ln.w == 0 && ln.g == 0) {
      const float lse = empty ? -INFINITY : (m + __log2f(lsum)) * 0.6931471805599453f;
      if (to_out)
        p.lse[(int64_t(e.req) * p.h_q + hq) * p.s_q + s] = lse;
      else
        p.lse_accum[int64_t(e.piece) * p.num_rows + row] = lse;
    }
    // v[2 k + h] = dim 2 k + h of the thread's 16: o[k][i0 + 2 h] (and warpgroup 1's).
    const int i0 = 4 * (c >> 1) + (c & 1);
    float v[16];
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        v[2 * k + h] = o[k][i0 + 2 * h] * f0 +
                       mo[(8 * k + i0 + 2 * h) * Tr::kGroupThreads + ln.gtid] * f1;
    const int dim0 = 128 * ln.w + 16 * ln.g;
    if (to_out) {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + int64_t(e.req) * p.o_batch_stride +
                           int64_t(s) * p.o_seq_stride + int64_t(hq) * p.o_head_stride + dim0;
      uint4 w0, w1;
      w0.x = pack2<__nv_bfloat16>(v[0], v[1]);
      w0.y = pack2<__nv_bfloat16>(v[2], v[3]);
      w0.z = pack2<__nv_bfloat16>(v[4], v[5]);
      w0.w = pack2<__nv_bfloat16>(v[6], v[7]);
      w1.x = pack2<__nv_bfloat16>(v[8], v[9]);
      w1.y = pack2<__nv_bfloat16>(v[10], v[11]);
      w1.z = pack2<__nv_bfloat16>(v[12], v[13]);
      w1.w = pack2<__nv_bfloat16>(v[14], v[15]);
      reinterpret_cast<uint4*>(out)[0] = w0;
      reinterpret_cast<uint4*>(out)[1] = w1;
    } else {
      float4* acc = reinterpret_cast<float4*>(
          p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim + dim0);
#pragma unroll
      for (int q4 = 0; q4 < 4; ++q4)
        acc[q4] = make_float4(v[4 * q4], v[4 * q4 + 1], v[4 * q4 + 2], v[4 * q4 + 3]);
    }
  }
}

// The consumer warpgroups' walk over a round's n pieces (tile counter `it` as the producer's):
// warpgroup 0 stores the piece's Q; warpgroup wg takes the piece's tiles wg, wg + 2, ..; per
// tile: wait for its stage; S^T; the softmax into P'^T; O^T; release the stage. Then the merge.
template <int kFmt>
__device__ __forceinline__ void consume_round(const MlaDecodeParams& p, const Smem& sm, int n,
                                              uint32_t& it, int row0, const Lane& ln) {
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const int rows_shift = p.page_shift < 6 ? p.page_shift : 6;  // a tile page's tokens, log2
  for (int pi = 0; pi < n; ++pi) {
    const PieceRun e = sm.pieces()[pi];
    if (ln.wg == 0) {
      store_q_kv8(p, sm, e, row0, ln.gtid);
      sm90a::fence_proxy_async_smem();
    }
    consumers_sync();  // Q and q_inv are visible (the last piece's products are complete)
    PieceState ps;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int row = row0 + ln.col(c);
      const int vis = row < p.num_rows ? visible_len(e.seqlen, p.s_q, row / p.h_q) : 0;
      ps.lim[c] = vis < e.end ? vis : e.end;
      ps.qinv[c] = sm.q_inv()[ln.col(c)];
      ps.m[c] = -INFINITY;
      ps.l[c] = 0.f;
    }
    ps.unit = 1.f;
    float o[8][8];
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[c][i] = 0.f;
    const int n_tiles = e.end > e.begin ? (e.end - e.begin + Tr::kBlockN - 1) / Tr::kBlockN : 0;
    for (int ti = ln.wg; ti < n_tiles; ti += Tr::kConsumerGroups) {
      const uint32_t t_it = it + uint32_t(ti);
      const int s = int(t_it % Tr::kStages);
      const int tok = e.begin + ti * Tr::kBlockN;
      sm90a::mbar_wait(sm.full(s), (t_it / Tr::kStages) & 1u);
      if (t_it == 0) KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlFirstTile, ln.gtid);
      const uint64_t ok = *sm.tok_ok(s);
      float sc[2];
      load_scales(sm, s, rows_shift, ln, sc);
      float sl[8], sr[8];
      issue_scores<kFmt>(sl, sr, sm, s, ln);
      sm90a::wgmma_wait<0>();
      sm90a::reg_fence_all(sl);
      sm90a::reg_fence_all(sr);
#pragma unroll
      for (int c = 0; c < 8; ++c) sm90a::reg_fence_all(o[c]);
      tile_softmax(sl, sr, o, ps, sm, sc, tok, e.end, ok, (ti >> 1) & 1, scale_log2, ln);
      // Tokens past the piece's end are read as zeros in the product.
      const int valid = e.end - tok;
      const uint64_t zero_mask = valid >= 64 ? 0ull : ~0ull << valid;
      if (zero_mask == 0)
        issue_output<kFmt, false>(o, sm, s, 0, ln);
      else
        issue_output<kFmt, true>(o, sm, s, zero_mask, ln);
      __syncwarp();  // the warp's products that read the stage are complete
      if (ln.lane == 0) sm90a::mbar_arrive(sm.empty(s));
    }
    it += uint32_t(n_tiles);
#pragma unroll
    for (int c = 0; c < 8; ++c) sm90a::reg_fence_all(o[c]);
    // The worker's first piece with tiles; every piece's (the last one's stays in the buffer).
    if (it == uint32_t(n_tiles)) KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlFirstEpi, ln.gtid);
    KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlLastEpi, ln.gtid);
    piece_epilogue(p, sm, e, ps, o, row0, ln);
  }
}

// The rounds of up to kMaxPieces pieces of worker w, walked by one role (kConsumer: the two
// consumer warpgroups; else the producer warpgroup, lane 0 of which works): thread 0 collects a
// round's pieces, and every thread of the block passes the same block barriers around them.
template <int kFmt, bool kConsumer>
__device__ __forceinline__ void role_rounds(const MlaDecodeParams& p, const Smem& sm,
                                            const Kv8TensorMaps& maps, int w, int row0, int tid) {
  const Lane ln(tid);
  uint32_t it = 0;
  for (int first = 0;; first += Tr::kMaxPieces) {
    if (tid == 0) collect_pieces<Tr>(p, w, first, sm.pieces(), sm.counts());
    block_sync();  // the piece list (and, first time, the barriers' init) is visible
    const int n = sm.counts()[0];
    if (first == 0) KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlPieces, tid);
    if constexpr (kConsumer)
      consume_round<kFmt>(p, sm, n, it, row0, ln);
    else if (tid == Tr::kConsumerThreads)
      produce_round(p, sm, maps, n, it);
    if (first + Tr::kMaxPieces >= sm.counts()[1]) {
      if (tid == 0) KF_TIMELINE_PIECES(p.timeline, kTlDecode, sm.counts()[1]);
      break;
    }
    block_sync();  // everyone is done with this round's piece list
  }
}

// Each role in its own loop, after the registers moved from the producer warpgroup to the
// consumers (setmaxnreg), so ptxas gives the consumers' code its larger budget.
template <int kFmt>
__device__ __forceinline__ void run_rounds(const MlaDecodeParams& p, const Smem& sm,
                                           const Kv8TensorMaps& maps, int w, int row0, int tid) {
  if (tid < Tr::kConsumerThreads) {
    sm90a::setmaxnreg<true, Tr::kConsumerRegs>();
    role_rounds<kFmt, true>(p, sm, maps, w, row0, tid);
  } else {
    sm90a::setmaxnreg<false, Tr::kProducerRegs>();
    role_rounds<kFmt, false>(p, sm, maps, w, row0, tid);
  }
}

}  // namespace sm90a_kv8

// Block (row tile, worker). kFmt: kKvFmtE4M3 or kKvFmtInt8.
template <int kFmt>
__global__ void __launch_bounds__(MlaSm90aKv8Traits::kNumThreads, 1)
    mla_decode_sm90a_kv8_kernel(const __grid_constant__ MlaDecodeParams p,
                                const __grid_constant__ Kv8TensorMaps maps) {
  using Tr = MlaSm90aKv8Traits;
  extern __shared__ __align__(16) uint8_t smem_raw[];  // aligned to 1024 below
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const sm90a_kv8::Smem sm{{smem_raw + pad, raw + pad}};
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * Tr::kBlockM, w = blockIdx.y;
  if (tid == Tr::kConsumerThreads) {
    sm90a::tma_prefetch_map(&maps.latent);
    sm90a::tma_prefetch_map(&maps.rope);
    sm90a::tma_prefetch_map(&maps.scale);
  }
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlEntry, tid);
  if (!begin_block<Tr, __nv_bfloat16>(p, row0, w, gridDim.y)) return;
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlWaited, tid);
  if (tid == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90a::mbar_init(sm.full(s), 1);
      sm90a::mbar_init(sm.empty(s), Tr::kGroupThreads / 32);
    }
    sm90a::fence_mbarrier_init();
  }
  sm90a_kv8::run_rounds<kFmt>(p, sm, maps, w, row0, tid);
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlExit, tid);
  pdl_launch_dependents();  // this block is done: a dependent kernel may start launching
}

template <int kFmt>
cudaError_t run_mla_decode_sm90a_kv8(const MlaDecodeParams& p, const Kv8TensorMaps& maps,
                                     cudaStream_t stream) {
  using Tr = MlaSm90aKv8Traits;
  auto kernel = mla_decode_sm90a_kv8_kernel<kFmt>;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(p.num_rows, Tr::kBlockM), p.num_workers);
  return launch_pdl(kernel, grid, dim3(Tr::kNumThreads), Tr::kSmemBytes, stream, p, maps);
}

#define KF_DECODE_SM90A_KV8_INSTANTIATE(kFmt)                                              \
  template cudaError_t run_mla_decode_sm90a_kv8<kFmt>(const MlaDecodeParams&,           \
                                                      const Kv8TensorMaps&, cudaStream_t);

}  // namespace kf::cuda
