// The decode kernel's KV tile loads (cp.async into the ring), shared out by warp: warp w copies
// tokens w T .. w T + T - 1 of the tile (T = kBlockN / warps: 2, 4 or 8 tokens).
//
// Why by warp: a warp's T tokens lie in one page (pages hold a power of two >= T tokens, tiles
// start at multiples of 16 and T divides 16; 16-bit caches with smaller pages run a separate
// instantiation, kSmallPages, that looks up each token's page), so a warp needs one page lookup,
// one range check and one 64-bit page address per tile, and every copy is that address plus a
// lane offset plus an immediate. Per-thread tokens would give every thread its own lookup,
// 64-bit address, checks and error path, a large share of the tile loop's instructions. The
// loads are spread evenly over the warps rather than given to one warp: the tile loop runs at
// the pace of its slowest warp. Small pages get their own instantiation so the usual one keeps
// one lookup per warp.
//
// Layout written (as the consumers read it): 16-bit tiles are kBlockN rows of 1152 bytes, 16-byte
// chunk c of token j at (c & ~7) | ((c ^ j) & 7); 8-bit tiles keep the page's sections (kBlockN x
// 512 latent bytes | kBlockN x 128 rope bytes | kBlockN fp32 scales), chunks swizzled the same
// way inside the 512- and 128-byte rows. Tokens past the piece and on bad pages are zero-filled
// (src-size 0 reads nothing) and flagged 0 in tok_ok, so no NaN in page padding reaches an mma.
#pragma once

#include <cstdint>

#include "core/mla_shape.h"
#include "core/params.h"
#include "core/scheduler.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/mma_sm80.cuh"

namespace kf::cuda {

// The next tile to start: token `tok` of request `req`, whose piece ends at `end` (pi == the
// piece count: done, tok >= end).
struct TileProducer {
  int pi, tok, end, req;
};

template <class Tr, typename T, bool kSmallPages = false>
struct KvTileLoader {
  static constexpr int kTok = Tr::kBlockN / Tr::kNumWarps;  // tokens per warp
  static_assert(kTok >= 2 && 16 % kTok == 0, "a warp's tokens lie in one 16-token group");
  static_assert(kSchedBlockN % 16 == 0, "pieces (and so tiles) start at multiples of 16");
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int64_t kElemBytes = Tr::kKv8 ? 1 : int64_t(sizeof(T));  // of the strides
  // 16-bit rows: kLanes lanes per token (chunks c0, c0 + kLanes, ...), 32 / kLanes tokens per
  // pass. kLanes >= 8 keeps (c & 7) fixed per lane: one swizzled base per token.
  static constexpr int kLanes = kTok >= 4 ? 8 : 32 / kTok;
  static constexpr int kTokPerPass = 32 / kLanes;
  static constexpr int kPasses = kTok / kTokPerPass;
  static constexpr int kChunks = (kRowBytes / 16 + kLanes - 1) / kLanes;
  static_assert(kPasses >= 1 && (!Tr::kKv8 || kTok % 4 == 0), "");
  static_assert(!(kSmallPages && Tr::kKv8), "8-bit pages hold 16 tokens or more");

  // The pages a lane copies from in tile `pr` (0 past the piece): the page of the warp's tokens
  // (the same word in every lane); with kSmallPages (16-bit pages of fewer than kTok tokens), the
  // page of the lane's token in each pass.
  static constexpr int kLanePages = kSmallPages ? kPasses : 1;
  struct Pages {
    int v[kLanePages];
  };
  __device__ static Pages pages(const MlaDecodeParams& p, const TileProducer& pr, int warp,
                                int lane) {
    Pages pg;
    const int* row = p.block_table + int64_t(pr.req) * p.block_table_batch_stride;
#pragma unroll
    for (int ps = 0; ps < kLanePages; ++ps) {
      const int t = pr.tok + warp * kTok + (kSmallPages ? ps * kTokPerPass + lane / kLanes : 0);
      pg.v[ps] = t < pr.end ? __ldg(row + (t >> p.page_shift)) : 0;
    }
    return pg;
  }

  // Start warp `warp`'s share of tile `pr` into the ring tile at shared address `tile` (flags in
  // tok_ok_tile), then commit the group.
  __device__ static void issue(const MlaDecodeParams& p, const TileProducer& pr, const Pages& pg,
                               uint32_t tile, uint8_t* tok_ok_tile, int warp, int lane) {
    const int j0 = warp * kTok;
    const int t0 = pr.tok + j0;
    if constexpr (kSmallPages) {
      if (pr.tok < pr.end) issue16_small_pages(p, pr, pg, tile, tok_ok_tile, j0, lane);
    } else if (pr.tok < pr.end) {  // else the worker has no tile left: an empty group
      const uint32_t page = uint32_t(pg.v[0]);
      const bool live = t0 < pr.end;
      const bool page_ok = page < uint32_t(p.num_pages);  // also catches page < 0
      if (live && !page_ok && lane == 0)
        report_device_error(p.error_buffer, kDevErrPageRange, pr.req, int32_t(page));
      const bool ok = live && page_ok;
      // Tokens 0 .. n_live - 1 of the warp's share are copied. Every address stays inside the
      // cache (the first page when nothing is copied); a zero-size copy reads nothing.
      const int n_live = ok ? min(pr.end - t0, kTok) : 0;
      const uint32_t in0 = ok ? uint32_t(t0) & ((1u << p.page_shift) - 1u) : 0u;
      const uint8_t* base =
          static_cast<const uint8_t*>(p.kv) + (ok ? int64_t(page) * p.kv_page_stride * kElemBytes : 0);
      if constexpr (Tr::kKv8)
        issue8(p, base, in0, n_live, tile, tok_ok_tile, j0, lane);
      else
        issue16(p, base, in0, n_live, tile, tok_ok_tile, j0, lane);
    }
    cp_async_commit();
  }

  // One lane's chunks c0, c0 + kLanes, ... of 16-bit row j (src: the lane's first chunk in the
  // cache; n = 16 copies, 0 zero-fills), into the swizzled tile row.
  __device__ static void copy_row16(uint32_t tile, int j, int c0, const uint8_t* src, int n) {
    const uint32_t dst = tile + j * kRowBytes + (((c0 & ~7) | ((c0 ^ j) & 7)) << 4);
#pragma unroll
    for (int k = 0; k < kChunks; ++k)
      if ((kRowBytes / 16) % kLanes == 0 || c0 + k * kLanes < kRowBytes / 16)
        cp_async_16(dst + 16 * kLanes * k, src + 16 * kLanes * k, n);
  }

  // 16-bit rows: in pass ps, lane group jl copies token j0 + ps kTokPerPass + jl of the tile
  // (the warp's first n_live tokens; the rest zero-filled), from the page row at `base`.
  __device__ static void issue16(const MlaDecodeParams& p, const uint8_t* base, uint32_t in0,
                                 int n_live, uint32_t tile, uint8_t* tok_ok_tile, int j0, int lane) {
    const int jl = lane / kLanes, c0 = lane % kLanes;
    const int64_t tsb = p.kv_token_stride * int64_t(sizeof(T));
    const uint8_t* src = base + (int64_t(in0 + jl) * tsb + c0 * 16);
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int q = ps * kTokPerPass + jl;  // token of the warp's share
      const int j = j0 + q;                 // token of the tile
      const int n = q < n_live ? 16 : 0;
      copy_row16(tile, j, c0, src + ps * kTokPerPass * tsb, n);
      if (c0 == 0) tok_ok_tile[j] = n != 0;
    }
  }

  // 16-bit pages of fewer than kTok tokens (1, 2 or 4; accepted, though no one serves such
  // caches): every lane group copies from its own token's page.
  __device__ static void issue16_small_pages(const MlaDecodeParams& p, const TileProducer& pr,
                                             const Pages& pg, uint32_t tile, uint8_t* tok_ok_tile,
                                             int j0, int lane) {
    const int jl = lane / kLanes, c0 = lane % kLanes;
    const int64_t tsb = p.kv_token_stride * int64_t(sizeof(T));
    const uint8_t* kv = static_cast<const uint8_t*>(p.kv);
#pragma unroll
    for (int ps = 0; ps < kLanePages; ++ps) {
      const int j = j0 + ps * kTokPerPass + jl, t = pr.tok + j;
      const uint32_t page = uint32_t(pg.v[ps]);
      const bool live = t < pr.end, page_ok = page < uint32_t(p.num_pages);
      if (live && !page_ok && c0 == 0)
        report_device_error(p.error_buffer, kDevErrPageRange, pr.req, int32_t(page));
      const bool ok = live && page_ok;
      const uint8_t* src = kv + (ok ? int64_t(page) * p.kv_page_stride * kElemBytes +
                                          int64_t(t & (p.page_size - 1)) * tsb + c0 * 16
                                    : 0);
      copy_row16(tile, j, c0, src, ok ? 16 : 0);
      if (c0 == 0) tok_ok_tile[j] = ok;
    }
  }

  // 8-bit sections, 8 lanes per token, 4 tokens per pass: latent chunks c0 + 8 k (k < 4) and
  // rope chunk c0 share one swizzle (c0 ^ (j & 7)); lanes q < kTok copy token q's scale.
  __device__ static void issue8(const MlaDecodeParams& p, const uint8_t* base, uint32_t in0,
                                int n_live, uint32_t tile, uint8_t* tok_ok_tile, int j0, int lane) {
    const int jl = lane >> 3, c0 = lane & 7;
    const uint32_t page_size = uint32_t(p.page_size);
    const uint8_t* lat = base + ((in0 + jl) * kLatentDim + c0 * 16);
    const uint8_t* rope = base + (page_size * kLatentDim + (in0 + jl) * 128 + c0 * 16);
#pragma unroll
    for (int ps = 0; ps < kTok / 4; ++ps) {
      const int q = 4 * ps + jl, j = j0 + q;
      const int n = q < n_live ? 16 : 0;
      const uint32_t sw = (c0 ^ (j & 7)) << 4;
      const uint32_t lat_dst = tile + j * kLatentDim + sw;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        cp_async_16(lat_dst + 128 * k, lat + (4 * ps * kLatentDim + 128 * k), n);
      cp_async_16(tile + Tr::kKv8RopeOff + j * 128 + sw, rope + 4 * ps * 128, n);
      if (c0 == 0) tok_ok_tile[j] = n != 0;
    }
    if (lane < kTok)
      cp_async_4(tile + Tr::kKv8ScaleOff + (j0 + lane) * 4,
                 base + (page_size * (kLatentDim + 128) + (in0 + lane) * 4), lane < n_live ? 4 : 0);
  }
};

}  // namespace kf::cuda
