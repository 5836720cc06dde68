// MLA decode, the sm_90a kernel for 16-bit caches (wgmma). One block = (worker, 64-row tile).
//
// What: the portable kernel's contract (mla_decode_kernel.cuh): for each piece (request, token
// range) of its worker, o = softmax(scale q k^T) v over the piece's tokens for the tile's 64
// query rows; a request's only piece writes out (q dtype) and lse, other pieces write o_accum
// (normalized by their own sum) and lse_accum for the combine. The piece list, the metadata
// check and the empty rows of a foreign metadata are the portable family's
// (mla_decode_pipeline.cuh), so both families read and write the same bytes.
//
// Roles (mla_decode_sm90a_traits.h): warps 8-11 are the producer warpgroup, warps 0-7 two
// consumer warpgroups.
//   producer   for every tile of the round's pieces, in order: wait for the slot's `empty`
//              barrier, copy the 64 token rows with cp.async (16-byte chunks into the 128-byte
//              swizzled column blocks; src-size 0 zero-fills tokens past the piece and on bad
//              pages, so no NaN in page padding reaches an MMA, and flags them in tok_ok), then,
//              once the previous tile's copies landed (cp.async.wait_group 1), fence them into
//              the async proxy and arrive on that slot's `full` barrier. The cache is paged, so
//              a TMA tensor map (one per cache, addressing whole boxes) would need a box per page
//              row-chunk; per-token cp.async handles any page size and the bad-page rule the same
//              way as the portable loader.
//   consumers  per piece: Q (64 rows x 576 dims) into shared memory; per tile, warpgroup g
//              (0, 1) owns the tile's tokens 32 g .. 32 g + 31 for the scores and output dims
//              256 g .. 256 g + 255 for O, so no product is computed twice:
//                S_g = Q K_g^T (36 wgmma m64n32k16 steps, both operands in shared memory);
//                the online softmax of docs/spec.md on S_g (natural-log lse; causal limit per
//                row; masked tokens -inf; a seen non-finite score turns its row NaN), with the
//                row max over both halves exchanged through shared memory;
//                P_g (q dtype) into the shared P tile (64 x 64), so the P of the whole tile is
//                there for both warpgroups;
//                O_g = alpha O_g + P V_g (16 wgmma m64n64k16 steps, P and V = the slot's first
//                512 dims from shared memory, V MN-major),
//              then one wgmma wait and an arrival on `empty`. Both warpgroups compute the same
//              tile max and so the same alpha (the same instructions on the same values); each
//              sums l over its own tokens, and the epilogue adds the two sums in a fixed order.
// Synchronization: mbarriers between the producer and the consumers (full: 128 producer
// arrivals; empty: 256 consumer arrivals); named barrier 1 between the two consumer warpgroups:
// twice around each piece's Q load, per tile once after the row maxima are stored and once after
// P is stored, and once in the epilogue after the row sums are stored (each use says which
// reads and writes it orders); __syncthreads between rounds of pieces.
// The block is launched as a programmatic dependent (pdl.cuh) like the portable kernel.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm90a/mla_decode_sm90a.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"
#include "cuda/decode/sm90a/wgmma_sm90a.cuh"

namespace kf::cuda {
namespace sm90a {

using Tr = MlaSm90aTraits;
constexpr int kConsumerBarrier = 1;  // named barrier of the two consumer warpgroups

// Byte offset of 16-byte chunk `chunk` (0 .. 71) of row `row` in a Q or KV tile.
__device__ __forceinline__ uint32_t tile_chunk_offset(int row, int chunk) {
  return (chunk >> 3) * Tr::kColBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// The block's shared memory, from the 1024-aligned base.
struct Smem {
  uint8_t* base;
  uint32_t base_u32;
  __device__ __forceinline__ uint32_t q() const { return base_u32 + Tr::kQOff; }
  __device__ __forceinline__ uint32_t slot(int s) const {
    return base_u32 + Tr::kKvOff + s * Tr::kTileBytes;
  }
  __device__ __forceinline__ uint32_t p_tile() const { return base_u32 + Tr::kPOff; }
  // The tile row maxima / row sums the two warpgroups exchange: [group][block row].
  __device__ __forceinline__ float* row_max() const {
    return reinterpret_cast<float*>(base + Tr::kRowMaxOff);
  }
  __device__ __forceinline__ float* row_sum() const {
    return reinterpret_cast<float*>(base + Tr::kRowSumOff);
  }
  __device__ __forceinline__ uint8_t* tok_ok(int s) const {
    return base + Tr::kTokOkOff + s * Tr::kBlockN;
  }
  __device__ __forceinline__ uint32_t full(int s) const { return base_u32 + Tr::kBarOff + 8 * s; }
  __device__ __forceinline__ uint32_t empty(int s) const {
    return base_u32 + Tr::kBarOff + 8 * (Tr::kStages + s);
  }
  __device__ __forceinline__ PieceRun* pieces() const {
    return reinterpret_cast<PieceRun*>(base + Tr::kPieceOff);
  }
  __device__ __forceinline__ int* counts() const {
    return reinterpret_cast<int*>(base + Tr::kPieceOff + Tr::kMaxPieces * sizeof(PieceRun));
  }
};

// The ring position of the block's k-th tile: its slot and the parity of the slot's use.
struct RingPos {
  int slot;
  uint32_t parity;
  __device__ __forceinline__ explicit RingPos(int k)
      : slot(k % Tr::kStages), parity(uint32_t(k / Tr::kStages) & 1u) {}
};

// ---- producer ----
// The producer warpgroup's copies of tile (piece e, tokens tok .. tok + 63) into slot `s`:
// thread ptid (0 .. 127) copies token 16 i + ptid / 8 in pass i (4 passes), chunk ptid % 8 of
// each of the 9 column blocks (one swizzled base per token; 8 consecutive threads read 128
// consecutive bytes). The 4 pages are looked up first, so their latencies overlap.
template <typename T>
__device__ __forceinline__ void produce_tile(const MlaDecodeParams& p, const Smem& sm,
                                             const PieceRun& e, int tok, int s, int ptid) {
  constexpr int kTokPerPass = Tr::kProducerThreads / 8;
  constexpr int kPasses = Tr::kBlockN / kTokPerPass;
  const int c0 = ptid & 7, tok_lane = ptid >> 3;
  const int32_t* bt = p.block_table + int64_t(e.req) * p.block_table_batch_stride;
  int page[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int t = tok + kTokPerPass * i + tok_lane;
    page[i] = t < e.end ? __ldg(bt + (t >> p.page_shift)) : 0;
  }
  const uint8_t* kv = static_cast<const uint8_t*>(p.kv);
  const int64_t page_bytes = p.kv_page_stride * int64_t(sizeof(T));
  const int64_t token_bytes = p.kv_token_stride * int64_t(sizeof(T));
  const uint32_t slot = sm.slot(s);
  uint8_t* tok_ok = sm.tok_ok(s);
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int j = kTokPerPass * i + tok_lane, t = tok + j;
    const bool live = t < e.end;
    const bool page_ok = uint32_t(page[i]) < uint32_t(p.num_pages);  // also catches page < 0
    if (live && !page_ok && c0 == 0)
      report_device_error(p.error_buffer, kDevErrPageRange, e.req, page[i]);
    const bool ok = live && page_ok;
    // Every address stays inside the cache (its first row when nothing is copied).
    const uint8_t* src =
        kv + (ok ? int64_t(page[i]) * page_bytes + int64_t(t & (p.page_size - 1)) * token_bytes
                 : 0) +
        c0 * 16;
    const uint32_t dst = slot + tile_chunk_offset(j, c0);
#pragma unroll
    for (int cb = 0; cb < Tr::kColBlocks; ++cb)
      cp_async_16(dst + cb * Tr::kColBlockBytes, src + cb * 128, ok ? 16 : 0);
    if (c0 == 0) tok_ok[j] = ok;
  }
  cp_async_commit();
}

// The tile's copies of this thread have landed (wait_group): fence them into the async proxy and
// arrive on the slot's `full` barrier.
template <int kPending>
__device__ __forceinline__ void publish_tile(const Smem& sm, int s) {
  cp_async_wait<kPending>();
  fence_proxy_async_smem();
  mbar_arrive(sm.full(s));
}

// The producer's round: every tile of pieces[0 .. n), in order; k counts the block's tiles.
template <typename T>
__device__ __forceinline__ void produce_round(const MlaDecodeParams& p, const Smem& sm, int n,
                                              int& k, int ptid) {
  const PieceRun* pieces = sm.pieces();
  int prev = -1;  // the slot whose copies are in flight, not yet published
  for (int pi = 0; pi < n; ++pi) {
    const PieceRun e = pieces[pi];
    for (int tok = e.begin; tok < e.end; tok += Tr::kBlockN, ++k) {
      const RingPos pos(k);
      mbar_wait(sm.empty(pos.slot), pos.parity ^ 1u);  // the consumers released its last use
      produce_tile<T>(p, sm, e, tok, pos.slot, ptid);
      if (prev >= 0) publish_tile<1>(sm, prev);
      prev = pos.slot;
    }
  }
  if (prev >= 0) publish_tile<0>(sm, prev);
}

// ---- consumers ----
// Q of piece e's request, the block's 64 rows (zero past num_rows), into the swizzled Q tile:
// 4-byte loads (q rows are only 4-byte aligned), consecutive threads on consecutive words.
template <typename T>
__device__ __forceinline__ void load_q(const MlaDecodeParams& p, const Smem& sm,
                                       const PieceRun& e, int row0, int ctid) {
  constexpr int kWords = kHeadDim / 2;
  const T* q = static_cast<const T*>(p.q) + int64_t(e.req) * p.q_batch_stride;
  for (int i = ctid; i < Tr::kBlockM * kWords; i += Tr::kConsumerThreads) {
    const int r = i / kWords, wd = i % kWords, row = row0 + r;
    uint32_t v = 0u;
    if (row < p.num_rows) {
      const T* qrow = q + int64_t(row / p.h_q) * p.q_seq_stride + int64_t(row % p.h_q) * p.q_head_stride;
      v = __ldg(reinterpret_cast<const uint32_t*>(qrow) + wd);
    }
    const int el = 2 * wd;
    *reinterpret_cast<uint32_t*>(sm.base + Tr::kQOff + tile_chunk_offset(r, el >> 3) +
                                 (el & 7) * 2) = v;
  }
}

// Issue S = Q K^T for this warpgroup's half of the tile in slot `slot` (tokens 32 g .. 32 g + 31,
// rows 32 g .. of every column block: 4096 g bytes in, a whole number of 1024-byte atoms): 36 k16
// steps of m64n32, step ks at column block ks / 4, byte 32 (ks % 4) of its 128-byte rows (the
// descriptor's start address moves; the hardware applies the swizzle to the full address). One
// wgmma group, committed; the caller waits for it before it reads s.
template <typename T>
__device__ __forceinline__ void issue_qk_half(float (&s)[16], uint32_t q_smem, uint32_t slot,
                                              int g) {
  const uint64_t dq = smem_desc_sw128(q_smem, 16, 1024);
  const uint64_t dk = smem_desc_sw128(slot + g * Tr::kHalfN * 128, 16, 1024);
  wgmma_fence();  // orders the registers' earlier uses (the last tile's softmax) before the wgmma
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    const uint32_t off = uint32_t((ks >> 2) * Tr::kColBlockBytes + (ks & 3) * 32) >> 4;
    wgmma_ss_n32<T>(s, dq + off, dk + off, ks > 0 ? 1 : 0);
  }
  wgmma_commit();
}

template <int N>
__device__ __forceinline__ void reg_fence_all(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}

// The online softmax state of this thread's two rows (h = 0, 1: block rows rbase + 8 h). m is the
// same in both warpgroups; l is the sum over this thread's tokens of its own warpgroup's halves.
struct RowState {
  float m[2];  // running max, log2 units (-inf: nothing seen)
  float l[2];  // this thread's share of the running sum
  int vis[2];  // the row's causal limit in the piece's request (0 past num_rows)
};

// This thread's place in the consumer warpgroups.
struct ConsumerLane {
  int g;      // warpgroup: S for tokens 32 g .., O for dims 256 g ..
  int lane;   // lane in the warp
  int rbase;  // its first block row (16 (warp in group) + lane / 4); the second is rbase + 8
};

// One tile of the online softmax on this warpgroup's half of the scores, as the portable
// kernel's softmax_tile (16-bit caches): masks tokens not loaded or past the row's causal limit
// (tile token 0 is position tok; this half's token c is tile token 32 g + c), s = score * scale
// log2 e, a seen score becomes s + (s - s) (NaN when s is not finite). The tile max of a row is
// the max over both halves: each warpgroup stores its rows' half max, and after the consumers'
// barrier both read the two in the same order (fmaxf skips NaN, so no half max is NaN), so both
// reach the same m. Then alpha = 2^(m_old - m_new), p = 2^(s - m_new) in place, l = alpha l +
// sum p (this half's p). alpha[h] is the rows' O rescale factor, the same in both warpgroups.
__device__ __forceinline__ void softmax_half(float (&s)[16], RowState& st, float (&alpha)[2],
                                             const Smem& sm, const uint8_t* tok_ok, int tok,
                                             float scale_log2, const ConsumerLane& cl) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < Tr::kHalfN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = cl.g * Tr::kHalfN + 8 * j + 2 * (cl.lane & 3) + e;
      const bool loaded = tok_ok[col] != 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x = s[4 * j + 2 * h + e];
        const float v = x * scale_log2;
        x = loaded && tok + col < st.vis[h] ? v + (v - v) : -INFINITY;
        mx[h] = fmaxf(mx[h], x);
      }
    }
  float* row_max = sm.row_max();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    if ((cl.lane & 3) == 0) row_max[cl.g * Tr::kBlockM + cl.rbase + 8 * h] = mx[h];
  }
  // Both halves' maxima are stored. The other warpgroup stores the next tile's only after this
  // tile's P barrier (store_p_half), which this warpgroup reaches after its reads below.
  named_barrier(kConsumerBarrier, Tr::kConsumerThreads);
  float m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = cl.rbase + 8 * h;
    const float tile_max = fmaxf(row_max[r], row_max[Tr::kBlockM + r]);
    const float m_new = fmaxf(st.m[h], tile_max);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // no (-inf) - (-inf)
    alpha[h] = fast_exp2(st.m[h] - m_use[h]);
    st.m[h] = m_new;
  }
  float ps[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int h = (i >> 1) & 1;
    s[i] = fast_exp2(s[i] - m_use[h]);
    ps[h] += s[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * alpha[h] + ps[h];
}

// This warpgroup's half of P (q dtype) into the shared P tile: block row r, tile token t at
// 16-byte chunk t / 8 of row r (128-byte swizzle, like a column block of Q), so P is the K-major
// A operand of P V. Then the async-proxy fence and the consumers' barrier: after it both halves
// are visible to both warpgroups' wgmmas. Each warpgroup writes P only after its own P V of the
// tile before completed (wgmma_wait in consume_tile) and after the row-max barrier of this tile,
// which the other warpgroup reaches only after the same wait: no wgmma still reads the P tile.
template <typename T>
__device__ __forceinline__ void store_p_half(const float (&s)[16], const Smem& sm,
                                             const ConsumerLane& cl) {
#pragma unroll
  for (int j = 0; j < Tr::kHalfN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cl.rbase + 8 * h, t = cl.g * Tr::kHalfN + 8 * j + 2 * (cl.lane & 3);
      *reinterpret_cast<uint32_t*>(sm.base + Tr::kPOff + tile_chunk_offset(r, t >> 3) +
                                   (t & 7) * 2) = pack2<T>(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
    }
  fence_proxy_async_smem();
  named_barrier(kConsumerBarrier, Tr::kConsumerThreads);
}

// Issue O = alpha O + P V for this warpgroup's 256 output dims (column blocks 4 g .. 4 g + 3 of
// the slot): P's k16 step kt (tokens 16 kt ..) at byte 32 kt of the P tile's rows (K-major),
// V's 16 rows of a column block at byte 2048 kt of it (MN-major, 8-row groups 1024 bytes apart).
// O must not be part of a pending wgmma (the rescale writes it); the group is committed, not
// waited for.
template <typename T>
__device__ __forceinline__ void issue_pv(float (&o)[Tr::kPvBlocks][32], const float (&alpha)[2],
                                         const Smem& sm, uint32_t slot, int g) {
  // The rescale is skipped by a warp none of whose rows moved its max (alpha exactly 1: the
  // product would be O itself, so the bits are the same either way).
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[nb][i] *= alpha[(i >> 1) & 1];
  }
#pragma unroll
  for (int nb = 0; nb < Tr::kPvBlocks; ++nb) reg_fence_all(o[nb]);  // the rescale stays above
  const uint64_t dp = smem_desc_sw128(sm.p_tile(), 16, 1024);
  const uint64_t dv = smem_desc_sw128(slot + g * Tr::kPvBlocks * Tr::kColBlockBytes, 1024, 1024);
  wgmma_fence();  // O was written by the rescale
#pragma unroll
  for (int kt = 0; kt < Tr::kBlockN / 16; ++kt)
#pragma unroll
    for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
      wgmma_ss_bmn<T>(o[nb], dp + (uint32_t(kt * 32) >> 4),
                      dv + (uint32_t(nb * Tr::kColBlockBytes + kt * 2048) >> 4), 1);
  wgmma_commit();
}

// The piece's epilogue for this thread's rows rbase, rbase + 8: l = the quad's shares (a fixed
// order), then the two warpgroups' sums through shared memory (warpgroup 0's + warpgroup 1's in
// both: the same bits), 1 / l (0 for a row that saw nothing), lse = (m + log2 l) ln 2 (-inf for
// such a row; NaN when l is) by warpgroup 0, and O / l of this warpgroup's dims to out or
// o_accum. The row sums are stored again only in the next piece's epilogue, after that piece's
// first consumers' barrier (consume_round), which both warpgroups reach after the reads here.
template <typename T>
__device__ __forceinline__ void piece_epilogue(const MlaDecodeParams& p, const Smem& sm,
                                               const PieceRun& e, const RowState& st,
                                               const float (&o)[Tr::kPvBlocks][32], int row0,
                                               const ConsumerLane& cl) {
  float* row_sum = sm.row_sum();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if ((cl.lane & 3) == 0) row_sum[cl.g * Tr::kBlockM + cl.rbase + 8 * h] = l;
  }
  named_barrier(kConsumerBarrier, Tr::kConsumerThreads);  // both warpgroups' sums are stored
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = cl.rbase + 8 * h;
    const float l = row_sum[r] + row_sum[Tr::kBlockM + r];
    const bool empty = l == 0.f;
    const float inv = empty ? 0.f : 1.f / l;
    const int row = row0 + r;
    if (row >= p.num_rows || e.write == kWriteNone) continue;
    const int s = row / p.h_q, hq = row % p.h_q;
    if (cl.g == 0 && (cl.lane & 3) == 0) {
      const float lse = empty ? -INFINITY : (st.m[h] + __log2f(l)) * 0.6931471805599453f;
      if (e.write == kWriteOut)
        p.lse[(int64_t(e.req) * p.h_q + hq) * p.s_q + s] = lse;
      else
        p.lse_accum[int64_t(e.piece) * p.num_rows + row] = lse;
    }
    const int col0 = cl.g * Tr::kPvDimsPerGroup + 2 * (cl.lane & 3);
    if (e.write == kWriteOut) {
      T* out = static_cast<T*>(p.out) + int64_t(e.req) * p.o_batch_stride +
               int64_t(s) * p.o_seq_stride + int64_t(hq) * p.o_head_stride + col0;
#pragma unroll
      for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<uint32_t*>(out + nb * 64 + 8 * j) =
              pack2<T>(o[nb][4 * j + 2 * h] * inv, o[nb][4 * j + 2 * h + 1] * inv);
    } else {
      float* acc = p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim + col0;
      const uint64_t keep = l2_evict_last_policy();
#pragma unroll
      for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          st_global_keep(acc + nb * 64 + 8 * j,
                         make_float2(o[nb][4 * j + 2 * h] * inv, o[nb][4 * j + 2 * h + 1] * inv),
                         keep);
    }
  }
}

// One KV tile k (tokens tok ..) of a piece: wait for the producer's copies (`full`), this
// warpgroup's half of the scores, the softmax with the row-max exchange, P into the shared P
// tile, P V for this warpgroup's dims. After the last wgmma wait every wgmma of this warpgroup
// that read slot k has completed, so each thread arrives on the slot's `empty` barrier and the
// producer refills it with tile k + 2 while tile k + 1 is computed.
template <typename T>
__device__ __forceinline__ void consume_tile(const Smem& sm, float (&o)[Tr::kPvBlocks][32],
                                             RowState& st, int k, int tok, float scale_log2,
                                             const ConsumerLane& cl) {
  const RingPos pos(k);
  const uint32_t slot = sm.slot(pos.slot);
  mbar_wait(sm.full(pos.slot), pos.parity);  // the producer's copies of tile k landed
  float s[16];
  issue_qk_half<T>(s, sm.q(), slot, cl.g);
  wgmma_wait<0>();
  reg_fence_all(s);  // no read of S above the wait
  float alpha[2];
  softmax_half(s, st, alpha, sm, sm.tok_ok(pos.slot), tok, scale_log2, cl);
  store_p_half<T>(s, sm, cl);
  issue_pv<T>(o, alpha, sm, slot, cl.g);
  wgmma_wait<0>();
#pragma unroll
  for (int nb = 0; nb < Tr::kPvBlocks; ++nb) reg_fence_all(o[nb]);  // no use of O above the wait
  mbar_arrive(sm.empty(pos.slot));
}

// The consumers' round: every piece of pieces[0 .. n) with its tiles; k counts the block's tiles
// in the producer's order.
template <typename T>
__device__ __forceinline__ void consume_round(const MlaDecodeParams& p, const Smem& sm, int n,
                                              int& k, int row0, int ctid) {
  const ConsumerLane cl{ctid / 128, ctid & 31, ((ctid / 32) % 4) * 16 + (ctid & 31) / 4};
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const PieceRun* pieces = sm.pieces();
  for (int pi = 0; pi < n; ++pi) {
    const PieceRun e = pieces[pi];
    // Both warpgroups are past the previous piece's last wgmma (which read Q and the P tile) and
    // its epilogue's reads of the row sums.
    named_barrier(kConsumerBarrier, Tr::kConsumerThreads);
    load_q<T>(p, sm, e, row0, ctid);
    fence_proxy_async_smem();
    named_barrier(kConsumerBarrier, Tr::kConsumerThreads);  // Q is visible to both warpgroups

    RowState st;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + cl.rbase + 8 * h;
      st.m[h] = -INFINITY;
      st.l[h] = 0.f;
      st.vis[h] = row < p.num_rows ? visible_len(e.seqlen, p.s_q, row / p.h_q) : 0;
    }
    float o[Tr::kPvBlocks][32];
#pragma unroll
    for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[nb][i] = 0.f;
    for (int tok = e.begin; tok < e.end; tok += Tr::kBlockN, ++k)
      consume_tile<T>(sm, o, st, k, tok, scale_log2, cl);
    piece_epilogue<T>(p, sm, e, st, o, row0, cl);
  }
}

// The rounds of up to kMaxPieces pieces of worker w: thread 0 collects a round's pieces, then
// round(n, k) runs them (n pieces; k counts the block's tiles, the ring position, alike in both
// roles). Each role calls this in its own branch, so the two branches keep their own register
// budgets; their __syncthreads pair up.
template <class Round>
__device__ __forceinline__ void run_rounds(const MlaDecodeParams& p, const Smem& sm, int w,
                                           int tid, Round&& round) {
  int k = 0;
  for (int first = 0;; first += Tr::kMaxPieces) {
    if (tid == 0) collect_pieces<Tr>(p, w, first, sm.pieces(), sm.counts());
    __syncthreads();  // the piece list (and, first time, the barriers' init) is visible
    const int n = sm.counts()[0], total = sm.counts()[1];
    round(n, k);
    if (first + Tr::kMaxPieces >= total) break;
    __syncthreads();  // everyone is done with this round's piece list
  }
}

}  // namespace sm90a

template <typename T>
__global__ void __launch_bounds__(MlaSm90aTraits::kNumThreads, 1)
    mla_decode_sm90a_kernel(const __grid_constant__ MlaDecodeParams p) {
  using Tr = MlaSm90aTraits;
  extern __shared__ __align__(16) uint8_t smem_raw[];  // aligned to 1024 below
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const sm90a::Smem sm{smem_raw + pad, raw + pad};
  const int tid = threadIdx.x, w = blockIdx.x;
  const int row0 = blockIdx.y * Tr::kBlockM;
  if (!begin_block<Tr, T>(p, row0)) return;

  if (tid == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90a::mbar_init(sm.full(s), Tr::kProducerThreads);
      sm90a::mbar_init(sm.empty(s), Tr::kConsumerThreads);
    }
  }
  const int role = __shfl_sync(0xffffffffu, tid / 128, 0);  // warpgroup, uniform per warp
  if (role * 128 >= Tr::kConsumerThreads) {
    // Registers move from the producer warpgroup to the consumers (every warp of a warpgroup
    // executes its setmaxnreg).
    sm90a::setmaxnreg_dec<Tr::kProducerRegs>();
    sm90a::run_rounds(p, sm, w, tid, [&](int n, int& k) {
      sm90a::produce_round<T>(p, sm, n, k, tid - Tr::kConsumerThreads);
    });
  } else {
    sm90a::setmaxnreg_inc<Tr::kConsumerRegs>();
    sm90a::run_rounds(p, sm, w, tid, [&](int n, int& k) {
      sm90a::consume_round<T>(p, sm, n, k, row0, tid);
    });
  }
  pdl_launch_dependents();  // this block is done: a dependent kernel may start launching
}

// Launch on `stream`; the attribute is set per call (cheap, allowed during capture).
template <typename T>
cudaError_t run_mla_decode_sm90a(const MlaDecodeParams& p, cudaStream_t stream) {
  using Tr = MlaSm90aTraits;
  auto kernel = mla_decode_sm90a_kernel<T>;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.num_workers, ceil_div(p.num_rows, Tr::kBlockM));
  return launch_pdl(kernel, grid, dim3(Tr::kNumThreads), Tr::kSmemBytes, stream, p);
}

#define KF_DECODE_SM90A_INSTANTIATE(T) \
  template cudaError_t run_mla_decode_sm90a<T>(const MlaDecodeParams&, cudaStream_t);

}  // namespace kf::cuda
