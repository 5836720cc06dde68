// What the sm_90a decode kernel copies into shared memory: a KV tile's column blocks by tensor
// copies from the cache's tensor map (bad and past-the-piece pages addressed outside it), and Q
// by cp.async, with Q's last column block then held in registers.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/decode/sm90a/sm90a_block.cuh"

namespace kf::cuda::sm90a {

// ---- tensor copies of a tile ----
// A tile's pages: page_rows = min(page size, 64) tokens per copy, tile_pages = 64 / page_rows;
// one_page: a tile is one page's rows. small_pages (pages of fewer than 64 rows) is the kernel's
// template argument kSmallPages, so with larger pages the geometry is the constant (64, 1, true)
// and the divisions and loops over a tile's pages fold away.
struct TileGeom {
  int page_rows, tile_pages;
  bool one_page;
  __device__ __forceinline__ TileGeom(const MlaDecodeParams& p, bool small_pages)
      : page_rows(small_pages ? p.page_size : Tr::kBlockN),
        tile_pages(small_pages ? Tr::kBlockN / p.page_size : 1),
        one_page(!small_pages) {}
};

// The tensor-map page coordinate of page j of the tile at token tok of piece e: the block-table
// entry, or num_pages (outside the tensor: the copy writes zeros) for a page wholly past the
// piece and for an entry out of range, which is reported.
__device__ __forceinline__ int tile_page_coord(const MlaDecodeParams& p, const PieceRun& e,
                                               int tok, int j, const TileGeom& tg) {
  const int t = tok + j * tg.page_rows;
  if (t >= e.end) return p.num_pages;
  const int32_t* bt = p.block_table + int64_t(e.req) * p.block_table_batch_stride;
  const int page = __ldg(bt + (t >> p.page_shift));
  if (uint32_t(page) >= uint32_t(p.num_pages)) {  // also catches page < 0
    report_device_error(p.error_buffer, kDevErrPageRange, e.req, page);
    return p.num_pages;
  }
  return page;
}

// Warp-collective (one warp of a warpgroup): the copies of column blocks [kCb0, kCb1) of the tile
// at token tok into slot s, page_coord: tile_page_coord of this lane's page (lane % tile_pages);
// the copy of a block's page 0 arms the block's barrier for the block's 8192 bytes. The call with block 8 also stores the tile's token
// mask (tokens of pages addressed outside the tensor cleared: their scores are masked; for pages
// past the piece the mask changes nothing) before any barrier is armed, so the scorer, which
// waits for every block's barrier, reads it after its wait.
template <int kCb0, int kCb1>
__device__ __forceinline__ void issue_tile_copies(const MlaDecodeParams& p, const Smem& sm,
                                                  const void* kv_map, int s, int tok,
                                                  int page_coord, const TileGeom& tg, int lane) {
  if (kCb1 == Tr::kColBlocks) {
    const uint32_t bad = __ballot_sync(0xffffffffu, lane < tg.tile_pages && page_coord == p.num_pages);
    if (lane == 0) {
      const uint64_t page_bits = tg.page_rows == 64 ? ~0ull : (1ull << tg.page_rows) - 1;
      uint64_t ok = ~0ull;
      for (int pg = 0; pg < tg.tile_pages; ++pg)
        if ((bad >> pg) & 1u) ok &= ~(page_bits << (pg * tg.page_rows));
      *sm.tok_ok(s) = ok;
    }
    __syncwarp();
  }
  // Copy c = lane + 32 k: page c % tile_pages (the same page for all of this lane's copies, as
  // tile_pages divides 32) of block kCb0 + c / tile_pages.
  const int j = lane % tg.tile_pages;
  const int row_in_page = p.page_size > Tr::kBlockN ? (tok & (p.page_size - 1)) : 0;
  for (int c = lane; c < (kCb1 - kCb0) * tg.tile_pages; c += 32) {
    const int cb = kCb0 + c / tg.tile_pages;
    const uint32_t bar = sm.full(s, cb);
    if (j == 0) mbar_arrive_expect_tx(bar, Tr::kColBlockBytes);
    tma_load_3d(sm.slot(s) + cb * Tr::kColBlockBytes + j * tg.page_rows * 128, kv_map, cb * 64,
                row_in_page, page_coord, bar);
  }
}

// One thread: the copies of column blocks [kCb0, kCb1) of a tile that is one page's rows (page
// coordinate page_coord, tile_page_coord of its page), unrolled; the call with block 8 first
// stores the tile's token mask (all tokens, or none for a page addressed outside the tensor),
// before it arms any barrier (see issue_tile_copies).
template <int kCb0, int kCb1>
__device__ __forceinline__ void issue_page_copies(const MlaDecodeParams& p, const Smem& sm,
                                                  const void* kv_map, int s, int tok,
                                                  int page_coord) {
  if (kCb1 == Tr::kColBlocks) *sm.tok_ok(s) = page_coord == p.num_pages ? 0ull : ~0ull;
  const int row_in_page = p.page_size > Tr::kBlockN ? (tok & (p.page_size - 1)) : 0;
#pragma unroll
  for (int cb = kCb0; cb < kCb1; ++cb) {
    const uint32_t bar = sm.full(s, cb);
    mbar_arrive_expect_tx(bar, Tr::kColBlockBytes);
    tma_load_3d(sm.slot(s) + cb * Tr::kColBlockBytes, kv_map, cb * 64, row_in_page, page_coord,
                bar);
  }
}

// The page coordinate this lane copies from in the tile at token tok, for a call of
// issue_tile_copies over `blocks` column blocks (lanes without a copy look up nothing).
__device__ __forceinline__ int lane_page_coord(const MlaDecodeParams& p, const PieceRun& e,
                                               int tok, int blocks, const TileGeom& tg,
                                               int lane) {
  if (lane >= blocks * tg.tile_pages && lane >= tg.tile_pages) return p.num_pages;
  return tile_page_coord(p, e, tok, lane % tg.tile_pages, tg);
}

// ---- Q ----
// The block's 64 rows of Q (piece e's request; zero past num_rows) into the swizzled Q tile by
// cp.async, kElems elements a copy (8: 16-byte chunks, 2: 4-byte words): warp w copies rows w,
// w + 8, .., its lanes the row's copies, so a row's address is computed once, by its warp.
template <typename T, int kElems>
__device__ __forceinline__ void copy_q_rows(const MlaDecodeParams& p, const Smem& sm, const T* q,
                                            int row0, int tid) {
  constexpr int kPerRow = kHeadDim / kElems;
  constexpr int kWarps = Tr::kNumThreads / 32;
  const int lane = tid % 32;
  for (int r = tid / 32; r < Tr::kBlockM; r += kWarps) {
    const int row = row0 + r;
    const bool live = row < p.num_rows;
    const T* src = live ? q + int64_t(row / p.h_q) * p.q_seq_stride +
                              int64_t(row % p.h_q) * p.q_head_stride
                        : q;
#pragma unroll
    for (int c = lane; c < kPerRow; c += 32) {
      const int el = c * kElems;
      const uint32_t dst = sm.q() + tile_chunk_offset(r, el >> 3) + (el & 7) * 2;
      if (kElems == 8)
        cp_async_16(dst, src + el, live ? 16 : 0);
      else
        cp_async_4(dst, src + el, live ? 4 : 0);
    }
  }
}

// Q of piece e's request into the Q tile (every copy in flight at once; no register holds the
// data): 16-byte chunks when q and its strides allow, else 4-byte words (q rows need only be
// 4-byte aligned). Waited for here.
template <typename T>
__device__ __forceinline__ void load_q(const MlaDecodeParams& p, const Smem& sm,
                                       const PieceRun& e, int row0, int tid) {
  const T* q = static_cast<const T*>(p.q) + int64_t(e.req) * p.q_batch_stride;
  const bool vec16 = (reinterpret_cast<uintptr_t>(p.q) & 15) == 0 && p.q_batch_stride % 8 == 0 &&
                     p.q_seq_stride % 8 == 0 && p.q_head_stride % 8 == 0;
  if (vec16)
    copy_q_rows<T, 8>(p, sm, q, row0, tid);
  else
    copy_q_rows<T, 2>(p, sm, q, row0, tid);
  cp_async_commit();
  cp_async_wait<0>();
}

// This thread's A fragments of Q's last column block (dims 512..575, four k16 steps) from the Q
// tile: q8[4 kk + i] as the A fragment of k16 step kk (wgmma_sm90a.cuh).
__device__ __forceinline__ void load_q_regs(const Smem& sm, const Lane& ln, uint32_t (&q8)[16]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ln.rbase + 8 * (i & 1);
      const int d = Tr::kQRegBlock * 64 + 16 * kk + 8 * (i >> 1) + 2 * (ln.lane & 3);
      q8[4 * kk + i] = *reinterpret_cast<const uint32_t*>(
          sm.base + Tr::kQOff + tile_chunk_offset(r, d >> 3) + (d & 7) * 2);
    }
}

}  // namespace kf::cuda::sm90a
