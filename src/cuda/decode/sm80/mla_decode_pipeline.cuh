// The decode kernel's work list and KV stream: the shared-memory regions (DecodeSmem), a
// worker's pieces clamped into shared memory (collect_pieces), the block's start with the
// metadata check (begin_block; write_empty_rows when the metadata belongs to another call), and
// the KV tile pipeline, a cp.async ring of KV tiles that runs across the pieces of a round
// (KvRing).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "core/scheduler.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/metadata_check.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/decode/sm80/kv_tile_loader.cuh"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

// A piece as a block runs it: the token range clamped to what the block table addresses.
struct PieceRun {
  int req, begin, end, seqlen;  // seqlen: the clamped length, for the causal limits
  int piece;
  int write;  // 0: o_accum/lse_accum, 1: out/lse (the request's only piece), 2: nothing
  int pad0, pad1;
};
enum { kWriteAccum = 0, kWriteOut = 1, kWriteNone = 2 };

// The regions of the decode kernel's shared memory (offsets: mla_decode_traits.h), made once at
// the kernel's start.
template <class Tr>
struct DecodeSmem {
  uint8_t* base;
  float* spart;      // QK's partial scores [kDimGroups][kBlockM][kBlockN] (score_swizzle)
  float* alpha;      // per block row: the O rescale factor of the current tile
  float* inv_l;      // per block row: 1 / l (times O's unit for 8-bit caches), for the epilogue
  float* row_max;    // softmax state, one slot per thread (its row srow and its tokens): the
  float* row_sum;    //   running max, this thread's share of the running sum,
  int* visible;      //   the row's causal limit in the piece's request
  uint8_t* tok_ok;   // per ring slot and token: 1 if it was loaded (in its piece, valid page)
  PieceRun* pieces;  // this round's pieces
  int* counts;       // [0]: pieces in the list, [1]: the worker's total
  uint32_t kv;       // shared-space addresses: the KV ring,
  uint32_t p;        //   P (q dtype; fp16 for 8-bit caches),
  uint32_t q_pe;     //   q_pe of the block's rows (128-byte rows, chunks swizzled by the row)
  float* unit;       // softmax state (8-bit caches): the unit of this thread's O

  __device__ __forceinline__ explicit DecodeSmem(uint8_t* smem)
      : base(smem),
        spart(reinterpret_cast<float*>(smem + Tr::kSpartOff)),
        alpha(reinterpret_cast<float*>(smem + Tr::kAlphaOff)),
        inv_l(reinterpret_cast<float*>(smem + Tr::kInvLOff)),
        row_max(reinterpret_cast<float*>(smem + Tr::kRowMaxOff)),
        row_sum(reinterpret_cast<float*>(smem + Tr::kRowSumOff)),
        visible(reinterpret_cast<int*>(smem + Tr::kVisOff)),
        tok_ok(smem + Tr::kTokOkOff),
        pieces(reinterpret_cast<PieceRun*>(smem + Tr::kPieceOff)),
        counts(reinterpret_cast<int*>(smem + Tr::kPieceOff + Tr::kMaxPieces * sizeof(PieceRun))),
        kv(smem_u32(smem + Tr::kKvOff)),
        p(smem_u32(smem + Tr::kPOff)),
        q_pe(smem_u32(smem + Tr::kQpeOff)),
        unit(reinterpret_cast<float*>(smem + Tr::kUnitOff)) {}
};

// Thread 0: the pieces [first, first + kMaxPieces) of worker w, clamped, into shared memory;
// counts[0] = how many were stored, counts[1] = the worker's total.
template <class Tr>
__device__ void collect_pieces(const MlaDecodeParams& p, int w, int first, PieceRun* pieces,
                               int* counts) {
  const int32_t* wk = meta_worker(p.metadata, w);
  const bool sane = wk[kWStartReq] >= 0 && wk[kWStartReq] <= p.batch && wk[kWEndReq] >= 0 &&
                    wk[kWEndReq] <= p.batch && wk[kWStartTile] >= 0 &&
                    wk[kWStartTile] <= (1 << 25) && wk[kWEndTile] >= 0 &&
                    wk[kWEndTile] <= (1 << 25);  // 2^25 tiles of 64 hold INT32_MAX tokens
  if (!sane) {
    report_device_error(p.error_buffer, kDevErrMetadata, w, wk[kWStartReq]);
    counts[0] = counts[1] = 0;
    return;
  }
  const int64_t cap = int64_t(p.max_pages_per_seq) << p.page_shift;
  const int64_t piece_cap = max_pieces(p.batch, p.num_workers);
  const int32_t* seqlens = p.cache_seqlens;
  int idx = 0, n = 0;
  for_each_piece(
      p.metadata, w, [&](int r) { return seqlens[r] < 0 ? 0 : seqlens[r]; },
      [&](const Piece& pc) {
        if (idx >= first && idx < first + Tr::kMaxPieces) {
          const int len = seqlens[pc.req];
          if (len < 0 || len > cap)
            report_device_error(p.error_buffer, kDevErrSeqlenRange, pc.req, len);
          const int clamped = len < 0 ? 0 : (len > cap ? int(cap) : len);
          PieceRun e;
          e.req = pc.req;
          e.seqlen = clamped;
          e.begin = pc.token_begin;
          e.end = pc.token_end < clamped ? pc.token_end : clamped;
          if (e.end < e.begin) e.end = e.begin;
          e.piece = pc.piece;
          e.write = pc.only_piece ? kWriteOut : kWriteAccum;
          if (!pc.only_piece && (pc.piece < 0 || pc.piece >= piece_cap)) {
            report_device_error(p.error_buffer, kDevErrMetadata, pc.req, pc.piece);
            e.begin = e.end = 0;
            e.write = kWriteNone;
          }
          e.pad0 = e.pad1 = 0;
          pieces[n++] = e;
        }
        ++idx;
      });
  counts[0] = n;
  counts[1] = idx;
}

// Metadata made for another call: every row of this block's share of requests is empty (worker
// w of `workers` takes requests w, w + workers, ...).
template <class Tr, typename T>
__device__ void write_empty_rows(const MlaDecodeParams& p, int row0, int w, int workers) {
  T* out = static_cast<T*>(p.out);
  for (int r = w; r < p.batch; r += workers) {
    for (int i = threadIdx.x; i < Tr::kBlockM * (kLatentDim / 8); i += Tr::kNumThreads) {
      const int row = row0 + i / (kLatentDim / 8), c = i % (kLatentDim / 8);
      if (row >= p.num_rows) continue;
      const int s = row / p.h_q, h = row % p.h_q;
      T* o = out + r * p.o_batch_stride + s * p.o_seq_stride + h * p.o_head_stride + c * 8;
      for (int k = 0; k < 8; k += 2) *reinterpret_cast<uint32_t*>(o + k) = 0u;
      if (c == 0) p.lse[(int64_t(r) * p.h_q + h) * p.s_q + s] = -INFINITY;
    }
  }
}

// The block's start, before any other read: wait for the previous kernel in the stream (the
// kernel is launched as a programmatic dependent, pdl.cuh; that kernel may have written q, the
// cache, the block table or the metadata), and check that the metadata was made for this call.
// Metadata made for another call: thread 0 of worker 0's first row tile reports it, every block
// writes its rows as empty, and the block returns false. The block is worker w of `workers`
// (the kernels place the worker on different grid axes).
__device__ __forceinline__ void prefetch_l1(const void* a) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(a));
}

// Thread 0, once it holds the worker's first point (request req, tile `tile`): that request's
// cache_seqlens entry and the block-table entry of that tile requested into L1. Nothing waits for
// them: collect_pieces reads the length one round trip later and the ring's first page lookup
// (KvRing::start) the entry two round trips later, and both find them in L1. Points outside the
// batch or the table (an idle worker, metadata of another call) request nothing.
__device__ __forceinline__ void prefetch_first_lookups(const MlaDecodeParams& p, int req,
                                                       int tile) {
  if (req < 0 || req >= p.batch || tile < 0) return;
  prefetch_l1(p.cache_seqlens + req);
  const int64_t page = (int64_t(tile) * kSchedBlockN) >> p.page_shift;
  if (page < p.max_pages_per_seq)
    prefetch_l1(p.block_table + int64_t(req) * p.block_table_batch_stride + page);
}

template <class Tr, typename T>
__device__ __forceinline__ bool begin_block(const MlaDecodeParams& p, int row0, int w,
                                            int workers) {
  const int tid = threadIdx.x;
  pdl_wait();
  // Thread 0 loads the worker's first point beside the header words (one round trip for both;
  // the row stays in L1 for collect_pieces), then requests the lookups that follow from it.
  int32_t first_req = -1, first_tile = 0;
  if (tid == 0) {
    const int32_t* wk = meta_worker(p.metadata, w);
    first_req = wk[kWStartReq];
    first_tile = wk[kWStartTile];
  }
  const bool matches = metadata_matches(p);
  if (tid == 0) prefetch_first_lookups(p, first_req, first_tile);
  if (!matches) {
    if (w == 0 && row0 == 0 && tid == 0)
      report_device_error(p.error_buffer, kDevErrMetadata, 0, p.metadata[kMetaMagicIdx]);
    write_empty_rows<Tr, T>(p, row0, w, workers);
    return false;
  }
  return true;
}

// The KV tile pipeline of one round of pieces: a ring of kStages tiles in shared memory, filled
// kAhead tiles ahead of the one consumed and running across piece boundaries (a worker's next
// piece streams in while the current one finishes). Every warp tracks the producer, the next
// tile to start (TileProducer: piece, token, piece end, request, in registers, so no
// shared-memory round trip precedes a tile's range check and copies), and copies its share of
// each tile (kv_tile_loader.cuh). The state lives in the caller: the producer, its pages
// (looked up one tile ahead, so their latency is hidden) and the slot being consumed.
template <class Tr, typename T, bool kSmallPages>
struct KvRing {
  using Loader = KvTileLoader<Tr, T, kSmallPages>;  // each warp copies kBlockN / kNumWarps tokens
  using Pages = typename Loader::Pages;
  static constexpr int kBlockN = Tr::kBlockN, kStages = Tr::kStages, kAhead = Tr::kAhead;

  const MlaDecodeParams& p;
  const PieceRun* pieces;
  int n;  // pieces in the list
  uint32_t kv_smem;
  uint8_t* tok_ok;

  __device__ __forceinline__ KvRing(const MlaDecodeParams& p_, const DecodeSmem<Tr>& sm, int n_)
      : p(p_), pieces(sm.pieces), n(n_), kv_smem(sm.kv), tok_ok(sm.tok_ok) {}

  // The producer at the start of piece pi (pi == n: done).
  __device__ __forceinline__ TileProducer producer_at(int pi) const {
    if (pi >= n) return {n, 0, 0, 0};
    return {pi, pieces[pi].begin, pieces[pi].end, pieces[pi].req};
  }
  // Past the end of its piece, the producer moves to the next piece that has tokens.
  __device__ __forceinline__ void skip_done_pieces(TileProducer& pr) const {
    while (pr.pi < n && pr.tok >= pr.end) pr = producer_at(pr.pi + 1);
  }
  // Start this warp's copies of tile pr (pages pg) into ring slot `slot`. The warp and lane
  // come from a fresh %tid.x (here and in lookup): kept from the kernel's start they would hold
  // two more registers through the tile loop, which has none to spare at 32 rows per warp.
  __device__ __forceinline__ void issue(const TileProducer& pr, const Pages& pg, int slot) const {
    const int t = fresh_tid();
    Loader::issue(p, pr, pg, kv_smem + slot * Tr::kKvTileBytes, tok_ok + slot * kBlockN, t >> 5,
                  t & 31);
  }
  // The pages this lane copies from in tile pr.
  __device__ __forceinline__ Pages lookup(const TileProducer& pr) const {
    const int t = fresh_tid();
    return Loader::pages(p, pr, t >> 5, t & 31);
  }

  // Prologue: look up the pages of the first kAhead + 1 tiles together (one latency, not
  // kAhead + 1), start kAhead of them into slots 0 .. kAhead - 1; prod and prod_page are then
  // the next tile and its pages.
  __device__ __forceinline__ void start(TileProducer& prod, Pages& prod_page) const {
    prod = producer_at(0);
    skip_done_pieces(prod);
    TileProducer prs[kAhead + 1];
    Pages pages[kAhead + 1];
#pragma unroll
    for (int s = 0; s <= kAhead; ++s) {
      prs[s] = prod;
      pages[s] = lookup(prod);
      prod.tok += kBlockN;
      skip_done_pieces(prod);
    }
#pragma unroll
    for (int s = 0; s < kAhead; ++s) issue(prs[s], pages[s], s);
    prod = prs[kAhead];
    prod_page = pages[kAhead];
  }
  // With slot read_slot being consumed: start the producer's tile in the free slot
  // read_slot + kAhead, advance the producer and look up its pages.
  __device__ __forceinline__ void refill(TileProducer& prod, Pages& prod_page,
                                         const int& read_slot) const {
    issue(prod, prod_page, (read_slot + kAhead) % kStages);
    prod.tok += kBlockN;
    if (prod.tok >= prod.end) skip_done_pieces(prod);  // a piece ended (or all did)
    prod_page = lookup(prod);
  }
};

}  // namespace kf::cuda
