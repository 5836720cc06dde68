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
//   consumers  per piece: Q (64 rows x 576 dims) into shared memory; per tile: wait `full`,
//              S = Q K^T (36 wgmma m64n64k16 steps, both operands in shared memory), the online
//              softmax of docs/spec.md (natural-log lse; causal limit per row; masked tokens -inf;
//              a seen non-finite score turns its row NaN), O = alpha O + P V with P from the
//              score registers (16 wgmma steps, V = the slot's first 512 dims, MN-major), then
//              arrive on `empty`. Both warpgroups compute the same scores and softmax (identical
//              instructions on identical data: the same bits), so they need no exchange; each
//              owns 256 of the 512 output dims.
// Synchronization: mbarriers between the producer and the consumers (full: 128 producer
// arrivals; empty: 256 consumer arrivals); named barrier 1 between the two consumer
// warpgroups around each piece's Q load; __syncthreads between rounds of pieces.
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

// S = Q K^T for the tile in slot `slot` (shared address): 36 k16 steps, step ks at column block
// ks / 4, byte 32 (ks % 4) of its 128-byte rows (the descriptor's start address moves; the
// hardware applies the swizzle to the full address).
template <typename T>
__device__ __forceinline__ void qk_tile(float (&sacc)[32], uint32_t q_smem, uint32_t slot) {
  const uint64_t dq = smem_desc_sw128(q_smem, 16, 1024);
  const uint64_t dk = smem_desc_sw128(slot, 16, 1024);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    const uint32_t off = uint32_t((ks >> 2) * Tr::kColBlockBytes + (ks & 3) * 32) >> 4;
    wgmma_ss<T>(sacc, dq + off, dk + off, ks > 0 ? 1 : 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) reg_fence(sacc[i]);  // no read of S moves above the wait
}

// The online softmax state of this thread's two rows (h = 0, 1: block rows rbase + 8 h).
struct RowState {
  float m[2];  // running max, log2 units (-inf: nothing seen)
  float l[2];  // this thread's share of the running sum
  int vis[2];  // the row's causal limit in the piece's request (0 past num_rows)
};

// One tile of the online softmax on the score registers, as the portable kernel's softmax_tile
// (16-bit caches): masks tokens not loaded or past the row's causal limit (tile token 0 is
// position tok), s = score * scale log2 e, a seen score becomes s + (s - s) (NaN when s is not
// finite), the running max moves to the tile's (fmaxf skips NaN), alpha = 2^(m_old - m_new),
// p = 2^(s - m_new) in place, l = alpha l + sum p. alpha[h] is the rows' O rescale factor.
__device__ __forceinline__ void softmax_tile(float (&sacc)[32], RowState& st, float (&alpha)[2],
                                             const uint8_t* tok_ok, int tok, float scale_log2,
                                             int lane) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * (lane & 3) + e;
      const bool loaded = tok_ok[col] != 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x = sacc[4 * j + 2 * h + e];
        const float s = x * scale_log2;
        x = loaded && tok + col < st.vis[h] ? s + (s - s) : -INFINITY;
        mx[h] = fmaxf(mx[h], x);
      }
    }
  float m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(st.m[h], mx[h]);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // no (-inf) - (-inf)
    alpha[h] = fast_exp2(st.m[h] - m_use[h]);
    st.m[h] = m_new;
  }
  float ps[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int h = (i >> 1) & 1;
    sacc[i] = fast_exp2(sacc[i] - m_use[h]);
    ps[h] += sacc[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * alpha[h] + ps[h];
}

// O = alpha O + P V for this warpgroup's 256 output dims (column blocks 4 g .. 4 g + 3 of the
// slot): P's k16 step kt (tokens 16 kt ..) from score registers 8 kt .. 8 kt + 7, V's 16 rows
// of a column block at byte 2048 kt of it (MN-major, 8-row groups 1024 bytes apart).
template <typename T>
__device__ __forceinline__ void pv_tile(float (&o)[Tr::kPvBlocks][32], const float (&sacc)[32],
                                        const float (&alpha)[2], uint32_t slot, int g) {
#pragma unroll
  for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[nb][i] *= alpha[(i >> 1) & 1];
  constexpr int kSteps = Tr::kBlockN / 16;
  uint32_t a[kSteps][4];  // every P fragment before the fence: no register write between wgmmas
#pragma unroll
  for (int kt = 0; kt < kSteps; ++kt)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[kt][i] = pack2<T>(sacc[8 * kt + 2 * i], sacc[8 * kt + 2 * i + 1]);
  const uint64_t dv = smem_desc_sw128(slot + g * Tr::kPvBlocks * Tr::kColBlockBytes, 1024, 1024);
#pragma unroll
  for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(o[nb][i]);  // the rescale stays above the fence
  wgmma_fence();
#pragma unroll
  for (int kt = 0; kt < kSteps; ++kt)
#pragma unroll
    for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
      wgmma_rs<T>(o[nb], a[kt], dv + (uint32_t(nb * Tr::kColBlockBytes + kt * 2048) >> 4), 1);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(o[nb][i]);  // no use of O moves above the wait
}

// The piece's epilogue for this thread's rows rbase, rbase + 8: l = the quad's shares (a fixed
// order), 1 / l (0 for a row that saw nothing), lse = (m + log2 l) ln 2 (-inf for such a row;
// NaN when l is) by warpgroup 0, and O / l of this warpgroup's dims to out or o_accum.
template <typename T>
__device__ __forceinline__ void piece_epilogue(const MlaDecodeParams& p, const PieceRun& e,
                                               const RowState& st,
                                               const float (&o)[Tr::kPvBlocks][32], int row0,
                                               int rbase, int g, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const bool empty = l == 0.f;
    const float inv = empty ? 0.f : 1.f / l;
    const int row = row0 + rbase + 8 * h;
    if (row >= p.num_rows || e.write == kWriteNone) continue;
    const int s = row / p.h_q, hq = row % p.h_q;
    if (g == 0 && (lane & 3) == 0) {
      const float lse = empty ? -INFINITY : (st.m[h] + __log2f(l)) * 0.6931471805599453f;
      if (e.write == kWriteOut)
        p.lse[(int64_t(e.req) * p.h_q + hq) * p.s_q + s] = lse;
      else
        p.lse_accum[int64_t(e.piece) * p.num_rows + row] = lse;
    }
    const int col0 = g * Tr::kPvDimsPerGroup + 2 * (lane & 3);
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

// The consumers' round: every piece of pieces[0 .. n) with its tiles; k counts the block's tiles
// in the producer's order.
template <typename T>
__device__ __forceinline__ void consume_round(const MlaDecodeParams& p, const Smem& sm, int n,
                                              int& k, int row0, int ctid) {
  const int lane = ctid & 31, g = ctid / 128, rbase = ((ctid / 32) % 4) * 16 + lane / 4;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const PieceRun* pieces = sm.pieces();
  for (int pi = 0; pi < n; ++pi) {
    const PieceRun e = pieces[pi];
    // Both warpgroups are past the previous piece's last wgmma, which read Q.
    named_barrier(kConsumerBarrier, Tr::kConsumerThreads);
    load_q<T>(p, sm, e, row0, ctid);
    fence_proxy_async_smem();
    named_barrier(kConsumerBarrier, Tr::kConsumerThreads);

    RowState st;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + rbase + 8 * h;
      st.m[h] = -INFINITY;
      st.l[h] = 0.f;
      st.vis[h] = row < p.num_rows ? visible_len(e.seqlen, p.s_q, row / p.h_q) : 0;
    }
    float o[Tr::kPvBlocks][32];
#pragma unroll
    for (int nb = 0; nb < Tr::kPvBlocks; ++nb)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[nb][i] = 0.f;

    for (int tok = e.begin; tok < e.end; tok += Tr::kBlockN, ++k) {
      const RingPos pos(k);
      mbar_wait(sm.full(pos.slot), pos.parity);
      const uint32_t slot = sm.slot(pos.slot);
      float sacc[32];
      qk_tile<T>(sacc, sm.q(), slot);
      float alpha[2];
      softmax_tile(sacc, st, alpha, sm.tok_ok(pos.slot), tok, scale_log2, lane);
      pv_tile<T>(o, sacc, alpha, slot, g);
      mbar_arrive(sm.empty(pos.slot));  // this thread's wgmmas on the slot have completed
    }
    piece_epilogue<T>(p, e, st, o, row0, rbase, g, lane);
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
