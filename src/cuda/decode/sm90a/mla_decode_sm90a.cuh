// MLA decode, the sm_90a kernel for 16-bit caches (wgmma, tensor copies). One block = (worker,
// 64-row tile).
//
// What: the portable kernel's contract (mla_decode_kernel.cuh): for each piece (request, token
// range) of its worker, o = softmax(scale q k^T) v over the piece's tokens for the tile's 64
// query rows; a request's only piece writes out (q dtype) and lse, other pieces write o_accum
// (normalized by their own sum) and lse_accum for the combine. The piece list, the metadata
// check and the empty rows of a foreign metadata are the portable family's
// (mla_decode_pipeline.cuh), so both families read and write the same bytes.
//
// How (mla_decode_sm90a_traits.h for the layout): a piece's tiles are taken two at a time, A
// (slot 0) and B (slot 1). Warpgroup 0 scores A, warpgroup 1 scores B (S = Q K^T, 64 x 64 over
// all 576 dims), and the running row max m is shared through shared memory:
//   wg 0  m_A = max(m, max S_A), scale_A = 2^(m - m_A), P_A = 2^(S_A - m_A);
//         O_L = scale_A O_L + P_A V_A,L                      (P_A from registers)
//   wg 1  m_B = max(m_A, max S_B), scale_B = 2^(m_A - m_B), P_B = 2^(S_B - m_B);
//         O_R = scale_A scale_B O_R + P_B V_B,R              (P_B from registers)
//   wg 0  O_L = scale_B O_L + P_B V_B,L                      (P_B from shared memory)
//   wg 1  O_R = O_R + (scale_B P_A) V_A,R                    (P_A scaled, from shared memory)
// (V_x,L / V_x,R: dims 0..255 / 256..511 of tile x), the online softmax of docs/spec.md with the
// max and the rescale split between the two warpgroups, so one warpgroup's softmax runs while
// the other's matrix products keep the tensor cores busy. Each warpgroup sums l over its own
// tile's P (relative to the latest m); the epilogue adds the two in a fixed order.
// Copies: the cache is read by tensor copies (TMA) of one column block (64 dims) of one page's
// rows, through a 3-D tensor map [pages][page rows][576] (kv_tensor_map_sm90a.h), each column
// block of a slot with its own mbarrier, so a warpgroup starts on a tile's first dims while the
// rest lands. A slot's column blocks 0..3 are refilled by warpgroup 0 and 4..8 by warpgroup 1,
// each as soon as its own last read of them has completed. Pages past the piece and pages whose
// block-table entry is out of range are addressed outside the tensor (zero-filled); the latter
// are reported and their tokens masked. Tokens of the piece's last tile past its end are masked
// in S, and their V rows are zeroed before P V, so NaN in page padding never reaches an MMA.
// Synchronization, all through mbarriers but for kBarBoth and __syncthreads: per column block,
// the slot's mbarrier (tensor copies -> the warpgroup that scores the tile); between the two
// warpgroups the four hand-offs of a step (Handoff: kScaleA m_A and scale_A stored, kScaleB m_B
// and scale_B, kPa P_A, kPb P_B), each arrived on by every thread of its producer (release) and
// waited on by the other warpgroup (acquire); a warpgroup's own mbarrier after it zeroes V rows;
// kBarBoth (bar.sync, all 256 threads) around each piece's Q and in the epilogue; __syncthreads
// between rounds of pieces. A warpgroup that signals a hand-off of step i + 1 has waited for one
// the other signalled after seeing that hand-off's step i, so no phase completes twice unseen.
// The other warpgroup's tile is read only after a hand-off that its scorer signalled after
// waiting for the tile's copies.
// The block is launched as a programmatic dependent (pdl.cuh) like the portable kernel.
#pragma once

#include <cuda.h>
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
// The one named barrier (0 is __syncthreads): both warpgroups, every thread.
constexpr int kBarBoth = 1;
constexpr int kGroupThreads = 128;
// The hand-offs from one warpgroup to the other, each an mbarrier that every thread of the
// producing warpgroup arrives on (release) and the other waits on (acquire), once per step:
// kScaleA (warpgroup 0: m_A and scale_A stored), kScaleB (1: m_B and scale_B), kPa (0: P_A),
// kPb (1: P_B, steps with a tile B).
enum Handoff : int { kScaleA = 0, kScaleB = 1, kPa = 2, kPb = 3 };
// Bits of a thread's phase word: the parity of the slot barriers it waits on next, of each
// hand-off it waits on next (kHandoffBit << k) and of its warpgroup's barrier.
constexpr uint32_t kSlotBit = 1u, kHandoffBit = 2u, kGroupBit = 2u << 4;
static_assert(Tr::kHandoffs == 4, "kGroupBit follows the four hand-off bits");

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
  __device__ __forceinline__ uint32_t p_tile(int s) const {
    return base_u32 + (s == 0 ? Tr::kPaOff : Tr::kPbOff);
  }
  __device__ __forceinline__ float* row_max() const {
    return reinterpret_cast<float*>(base + Tr::kRowMaxOff);
  }
  __device__ __forceinline__ float* scale(int s) const {
    return reinterpret_cast<float*>(base + (s == 0 ? Tr::kScaleAOff : Tr::kScaleBOff));
  }
  __device__ __forceinline__ float* row_sum() const {
    return reinterpret_cast<float*>(base + Tr::kRowSumOff);
  }
  __device__ __forceinline__ uint32_t full(int s, int cb) const {
    return base_u32 + Tr::kBarOff + 8 * (s * Tr::kColBlocks + cb);
  }
  __device__ __forceinline__ uint32_t handoff(int k) const {
    return base_u32 + Tr::kHandoffOff + 8 * k;
  }
  __device__ __forceinline__ uint32_t group_bar(int g) const {
    return base_u32 + Tr::kGroupBarOff + 8 * g;
  }
  // Bit t: token t of the tile in slot s was copied from a valid page.
  __device__ __forceinline__ uint64_t* tok_ok(int s) const {
    return reinterpret_cast<uint64_t*>(base + Tr::kTokOkOff) + s;
  }
  __device__ __forceinline__ PieceRun* pieces() const {
    return reinterpret_cast<PieceRun*>(base + Tr::kPieceOff);
  }
  __device__ __forceinline__ int* counts() const {
    return reinterpret_cast<int*>(base + Tr::kPieceOff + Tr::kMaxPieces * sizeof(PieceRun));
  }
};

// This thread's place: warpgroup g (0 scores tiles A and owns O_L, 1 tiles B and O_R), lane,
// thread in its warpgroup, and its rows rbase, rbase + 8 of the block's 64.
struct Lane {
  int g, lane, gtid, rbase;
  __device__ __forceinline__ explicit Lane(int tid)
      : g(tid / 128), lane(tid & 31), gtid(tid & 127), rbase(((tid / 32) % 4) * 16 + (tid & 31) / 4) {}
};

// ---- hand-offs ----
// Hand-off k: every thread of the producing warpgroup arrives after its writes; the other
// warpgroup's threads wait for the phase they have not yet seen (bit kHandoffBit << k of ph).
__device__ __forceinline__ void handoff_arrive(const Smem& sm, Handoff k) {
  mbar_arrive(sm.handoff(k));
}
__device__ __forceinline__ void handoff_wait(const Smem& sm, Handoff k, uint32_t& ph) {
  const uint32_t bit = kHandoffBit << k;
  mbar_wait(sm.handoff(k), (ph & bit) ? 1u : 0u);
  ph ^= bit;
}
// Warpgroup g alone: every thread's earlier shared-memory writes are visible to all of it.
__device__ __forceinline__ void group_sync(const Smem& sm, int g, uint32_t& ph) {
  mbar_arrive(sm.group_bar(g));
  mbar_wait(sm.group_bar(g), (ph & kGroupBit) ? 1u : 0u);
  ph ^= kGroupBit;
}

// ---- tensor copies of a tile ----
// A tile's pages: page_rows = min(page size, 64) tokens per copy, tile_pages = 64 / page_rows.
struct TileGeom {
  int page_rows, tile_pages;
  __device__ __forceinline__ explicit TileGeom(const MlaDecodeParams& p)
      : page_rows(p.page_size < Tr::kBlockN ? p.page_size : Tr::kBlockN),
        tile_pages(p.page_size < Tr::kBlockN ? Tr::kBlockN / p.page_size : 1) {}
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

// ---- matrix products ----
template <int N>
__device__ __forceinline__ void reg_fence_all(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}

// Issue S (+)= Q K^T over column blocks [kCb0, kCb1) of the tile in slot s, in the order
// kFirst .. kCb1 - 1, then kCb0 .. kFirst - 1 (the blocks copied first, first), waiting for each
// block's copies (barrier parity `parity`) before its four k16 steps (m64n64, both operands
// K-major in shared memory; block 8's Q from registers). kZero: the first step starts S at zero.
// One committed group; the caller waits for it before it reads s.
template <typename T, int kCb0, int kCb1, int kFirst, bool kZero>
__device__ __forceinline__ void issue_scores(float (&s)[32], const uint32_t (&q8)[16],
                                             const Smem& sm, int slot, uint32_t parity) {
  const uint64_t dq = smem_desc_sw128(sm.q(), 16, 1024);
  const uint64_t dk = smem_desc_sw128(sm.slot(slot), 16, 1024);
#pragma unroll
  for (int n = 0; n < kCb1 - kCb0; ++n) {
    const int cb = kFirst + n < kCb1 ? kFirst + n : kCb0 + (kFirst + n - kCb1);
    mbar_wait(sm.full(slot, cb), parity);
    reg_fence_all(s);
    wgmma_fence();  // s was read by the last tile's softmax
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t off = uint32_t(cb * Tr::kColBlockBytes + kk * 32) >> 4;
      const int acc = kZero && n == 0 && kk == 0 ? 0 : 1;
      if (cb < Tr::kQRegBlock) {
        wgmma_ss_n64<T>(s, dq + off, dk + off, acc);
      } else {
        const uint32_t a[4] = {q8[4 * kk], q8[4 * kk + 1], q8[4 * kk + 2], q8[4 * kk + 3]};
        wgmma_rs_n64<T>(s, a, dk + off, acc);
      }
    }
  }
  wgmma_commit();
}

// V of warpgroup g's output dims in slot s as the MN-major B of an n256 wgmma: column blocks
// 4 g .. 4 g + 3 (8192 bytes apart), 8-token groups 1024 bytes apart; k16 step kt starts 2048 kt
// bytes in.
__device__ __forceinline__ uint64_t v_desc(const Smem& sm, int slot, int g) {
  return smem_desc_sw128(sm.slot(slot) + g * Tr::kOBlocksPerGroup * Tr::kColBlockBytes,
                         Tr::kColBlockBytes, 1024);
}

// Issue O += P V_g with P (q dtype) from registers: pa[4 kt ..] is the A fragment of tokens
// 16 kt .. 16 kt + 15. One committed group.
template <typename T>
__device__ __forceinline__ void issue_pv_regs(float (&o)[128], const uint32_t (&pa)[16],
                                              const Smem& sm, int slot, int g) {
  const uint64_t dv = v_desc(sm, slot, g);
  wgmma_fence();  // o was rescaled and pa written by ordinary instructions
#pragma unroll
  for (int kt = 0; kt < Tr::kBlockN / 16; ++kt) {
    const uint32_t a[4] = {pa[4 * kt], pa[4 * kt + 1], pa[4 * kt + 2], pa[4 * kt + 3]};
    wgmma_rs_n256_bmn<T>(o, a, dv + (uint32_t(kt * 2048) >> 4), 1);
  }
  wgmma_commit();
}

// Issue O += P V_g with P from the shared P tile of slot ps (K-major: tokens 16 kt .. at byte
// 32 kt of its 128-byte rows). One committed group.
template <typename T>
__device__ __forceinline__ void issue_pv_smem(float (&o)[128], const Smem& sm, int ps, int slot,
                                              int g) {
  const uint64_t dp = smem_desc_sw128(sm.p_tile(ps), 16, 1024);
  const uint64_t dv = v_desc(sm, slot, g);
  wgmma_fence();  // o was rescaled by ordinary instructions
#pragma unroll
  for (int kt = 0; kt < Tr::kBlockN / 16; ++kt)
    wgmma_ss_n256_bmn<T>(o, dp + (uint32_t(kt * 32) >> 4), dv + (uint32_t(kt * 2048) >> 4), 1);
  wgmma_commit();
}

// ---- softmax ----
// Per piece, this thread's rows: lim[h] = the tokens of the piece row rbase + 8 h may see (its
// causal limit, at most the piece's end; 0 past num_rows); l[h] = this thread's share of the
// running sum over its warpgroup's tiles, relative to the shared running max.
struct RowState {
  int lim[2];
  float l[2];
};

// The scores of one tile (token tok at column 0) turned into P in place, for the running max
// m_prev of each row (log2 units, shared memory). A score is seen when its token is copied
// (tok_ok bit) and inside the row's limit; unseen ones give p = 0. The row's tile max in log2
// units is max(seen) scale log2(e) (min(seen) for a negative scale), m_new = max(m_prev, it)
// (fmaxf skips NaN), p = 2^(score scale log2(e) - m_new) (m_new = -inf counts as 0, so no
// (-inf) - (-inf)). A seen infinite score makes every p of its row NaN, and a NaN score its own
// p, so a row that sees a non-finite score turns NaN, as in the portable kernel. Tiles inside
// both rows' limits with every page copied (all but a piece's last tiles and bad pages) take a
// branch without per-token tests. Returns the rows' m_new and the sums of p.
__device__ __forceinline__ void tile_softmax(float (&s)[32], const RowState& st,
                                             const float (&m_prev)[2], float (&m_new)[2],
                                             float (&psum)[2], uint64_t tok_ok, int tok,
                                             float scale_log2, const Lane& ln) {
  const bool whole = __all_sync(0xffffffffu, tok_ok == ~0ull &&
                                                 tok + Tr::kBlockN <= min(st.lim[0], st.lim[1]));
  const uint64_t ok = tok_ok >> (2 * (ln.lane & 3));  // bit 8 j + e: this thread's column
  // seen(i): score s[i] (column 8 j + 2 (lane % 4) + e, row h) takes part.
  auto seen = [&](int i) {
    const int j = i >> 2, h = (i >> 1) & 1, e = i & 1;
    return ((ok >> (8 * j + e)) & 1u) != 0 && tok + 8 * j + 2 * (ln.lane & 3) + e < st.lim[h];
  };
  float hi[2] = {-INFINITY, -INFINITY}, lo[2] = {INFINITY, INFINITY};
  if (whole) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      hi[(i >> 1) & 1] = fmaxf(hi[(i >> 1) & 1], s[i]);
      lo[(i >> 1) & 1] = fminf(lo[(i >> 1) & 1], s[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const bool in = seen(i);
      hi[(i >> 1) & 1] = fmaxf(hi[(i >> 1) & 1], in ? s[i] : -INFINITY);
      lo[(i >> 1) & 1] = fminf(lo[(i >> 1) & 1], in ? s[i] : INFINITY);
    }
  }
  float m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      hi[h] = fmaxf(hi[h], __shfl_xor_sync(0xffffffffu, hi[h], d));
      lo[h] = fminf(lo[h], __shfl_xor_sync(0xffffffffu, lo[h], d));
    }
    const float tile_max = scale_log2 >= 0.f ? hi[h] * scale_log2 : lo[h] * scale_log2;
    m_new[h] = fmaxf(m_prev[h], tile_max);
    const bool infinite = hi[h] == INFINITY || lo[h] == -INFINITY;
    m_use[h] = infinite ? NAN : (m_new[h] == -INFINITY ? 0.f : m_new[h]);
    psum[h] = 0.f;
  }
  if (whole) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = fast_exp2(fmaf(s[i], scale_log2, -m_use[(i >> 1) & 1]));
      psum[(i >> 1) & 1] += s[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = seen(i) ? fast_exp2(fmaf(s[i], scale_log2, -m_use[(i >> 1) & 1])) : 0.f;
      psum[(i >> 1) & 1] += s[i];
    }
  }
}

// 2^(m_prev - m_new) with m_new = -inf counted as 0 (the factor is 0 while nothing was seen).
__device__ __forceinline__ float rescale_factor(float m_prev, float m_new) {
  return fast_exp2(m_prev - (m_new == -INFINITY ? 0.f : m_new));
}

// The running max of this thread's rows from shared memory, and the new one stored with the
// rows' scale factors (one lane of each quad, after every lane of the warp read the old max).
__device__ __forceinline__ void read_row_max(const Smem& sm, const Lane& ln, float (&m)[2]) {
  m[0] = sm.row_max()[ln.rbase];
  m[1] = sm.row_max()[ln.rbase + 8];
}
__device__ __forceinline__ void store_row_max(const Smem& sm, const Lane& ln, int s,
                                              const float (&m)[2], const float (&scale)[2]) {
  __syncwarp();
  if ((ln.lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sm.row_max()[ln.rbase + 8 * h] = m[h];
      sm.scale(s)[ln.rbase + 8 * h] = scale[h];
    }
  }
}

// O's rows times f; skipped by a warp none of whose rows has f != 1 (the product would be O
// itself: the same bits either way).
__device__ __forceinline__ void scale_rows(float (&o)[128], const float (&f)[2]) {
  if (!__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) return;
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] *= f[(i >> 1) & 1];
}

// P (fp32 accumulator layout of S) as q-dtype A fragments of the four k16 steps of P V.
template <typename T>
__device__ __forceinline__ void pack_p(const float (&s)[32], uint32_t (&pa)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) pa[i] = pack2<T>(s[2 * i], s[2 * i + 1]);
}

// This warpgroup's P fragments into the shared P tile of slot ps: block row r, token t at 16-byte
// chunk t / 8 of row r (128-byte swizzle), the K-major A operand of the other warpgroup's P V.
// One stmatrix (four 8 x 8 matrices) per k16 step: matrix i of step kt is rows 8 (i % 2) .. of
// the warp's 16, tokens 16 kt + 8 (i / 2) .., whose fragment is pa[4 kt + i]; lane l gives the
// address of row l % 8 of matrix l / 8. Then the async-proxy fence, so the other warpgroup's
// wgmma reads them after the named barrier that follows.
__device__ __forceinline__ void store_p(const uint32_t (&pa)[16], const Smem& sm, int ps,
                                        const Lane& ln) {
  const uint32_t tile = sm.p_tile(ps);
  const int mi = ln.lane >> 3;
  const int row = (ln.rbase & ~15) + (ln.lane & 7) + 8 * (mi & 1);
#pragma unroll
  for (int kt = 0; kt < Tr::kBlockN / 16; ++kt) {
    const uint32_t addr = tile + tile_chunk_offset(row, 2 * kt + (mi >> 1));
    asm volatile(
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
        "r"(pa[4 * kt]), "r"(pa[4 * kt + 1]), "r"(pa[4 * kt + 2]), "r"(pa[4 * kt + 3])
        : "memory");
  }
  fence_proxy_async_smem();
}

// The V rows (dims 0..511) of tile tokens [first, 64) in slot s set to zero by one warpgroup,
// visible to wgmma (fence) and to the whole warpgroup (group_sync): tokens past the piece's end
// whose page rows hold anything (NaN padding included), so that P = 0 there adds exactly 0.
__device__ __forceinline__ void zero_v_rows(const Smem& sm, int s, int first, const Lane& ln,
                                            uint32_t& ph) {
  for (int i = ln.gtid; i < Tr::kVBlocks * Tr::kBlockN * 8; i += kGroupThreads) {
    const int cb = i / (Tr::kBlockN * 8), row = (i / 8) % Tr::kBlockN, c = i % 8;
    if (row >= first)
      *reinterpret_cast<uint4*>(sm.base + Tr::kKvOff + s * Tr::kTileBytes +
                                cb * Tr::kColBlockBytes + row * 128 + c * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_smem();
  group_sync(sm, ln.g, ph);
}

// ---- one piece ----
// The state of a piece's walk: its tiles, the copies' geometry and the tensor map.
struct PieceWalk {
  const MlaDecodeParams& p;
  const Smem& sm;
  const void* kv_map;
  const PieceRun& e;
  TileGeom tg;
  int n_tiles;
  float scale_log2;
};

// Warp 0 of each warpgroup: this warpgroup's part of the copies of the tile at token tok into
// slot s (warpgroup 0: column blocks 0..3, warpgroup 1: 4..8), page coordinate coord.
__device__ __forceinline__ void issue_group_copies(const PieceWalk& w, int s, int tok, int coord,
                                                   const Lane& ln) {
  if (ln.gtid >= 32) return;
  if (ln.g == 0)
    issue_tile_copies<0, Tr::kOBlocksPerGroup>(w.p, w.sm, w.kv_map, s, tok, coord, w.tg, ln.lane);
  else
    issue_tile_copies<Tr::kOBlocksPerGroup, Tr::kColBlocks>(w.p, w.sm, w.kv_map, s, tok, coord,
                                                            w.tg, ln.lane);
}
// The page coordinate this lane of warp 0 copies from for issue_group_copies of the tile at tok.
__device__ __forceinline__ int group_page_coord(const PieceWalk& w, int tok, const Lane& ln) {
  if (ln.gtid >= 32) return w.p.num_pages;
  const int blocks = ln.g == 0 ? Tr::kOBlocksPerGroup : Tr::kColBlocks - Tr::kOBlocksPerGroup;
  return lane_page_coord(w.p, w.e, tok, blocks, w.tg, ln.lane);
}

// The tiles of step i: A = 2 i (slot 0, tokens tok_a ..) and B = 2 i + 1 (slot 1), whether B and
// the next step's tiles exist, and this lane's page coordinates for its warpgroup's copies of
// the next step's tiles (looked up at the step's start, so their latency is hidden).
struct StepTiles {
  int tok_a, tok_b;
  bool has_b, has_a2, has_b2;
  int coord_a2, coord_b2;
  __device__ __forceinline__ StepTiles(const PieceWalk& w, int i, const Lane& ln)
      : tok_a(w.e.begin + 2 * i * Tr::kBlockN),
        tok_b(tok_a + Tr::kBlockN),
        has_b(2 * i + 1 < w.n_tiles),
        has_a2(2 * i + 2 < w.n_tiles),
        has_b2(2 * i + 3 < w.n_tiles),
        coord_a2(has_a2 ? group_page_coord(w, tok_a + 2 * Tr::kBlockN, ln) : 0),
        coord_b2(has_b2 ? group_page_coord(w, tok_b + 2 * Tr::kBlockN, ln) : 0) {}
};

// Warpgroup 0's part of step i (StepTiles): on entry s holds S_A; on exit S of the next step's
// tile A (when there is one).
template <typename T>
__device__ __forceinline__ void step_group0(const PieceWalk& w, int i, float (&s)[32],
                                            float (&o)[128], RowState& st,
                                            const uint32_t (&q8)[16], uint32_t& ph,
                                            const Lane& ln) {
  const Smem& sm = w.sm;
  const StepTiles t(w, i, ln);
  if (t.tok_a + Tr::kBlockN > w.e.end) zero_v_rows(sm, 0, w.e.end - t.tok_a, ln, ph);

  // m_A, scale_A, P_A; O_L = scale_A O_L + P_A V_A,L.
  float m_prev[2], m_new[2], psum[2], f[2];
  read_row_max(sm, ln, m_prev);
  tile_softmax(s, st, m_prev, m_new, psum, *sm.tok_ok(0), t.tok_a, w.scale_log2, ln);
  f[0] = rescale_factor(m_prev[0], m_new[0]);
  f[1] = rescale_factor(m_prev[1], m_new[1]);
  store_row_max(sm, ln, 0, m_new, f);
  handoff_arrive(sm, kScaleA);
  scale_rows(o, f);
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * f[h] + psum[h];
  uint32_t pa[16];
  pack_p<T>(s, pa);
  issue_pv_regs<T>(o, pa, sm, 0, 0);
  wgmma_wait<0>();
  reg_fence_all(o);
  // Slot 0's blocks 0..3 are read for the last time (warpgroup 1 never reads them): refill them
  // with tile 2 i + 2.
  if (t.has_a2) issue_group_copies(w, 0, t.tok_a + 2 * Tr::kBlockN, t.coord_a2, ln);

  // scale_B from warpgroup 1: P_A scaled by it for warpgroup 1's P_A V_A,R; O_L = scale_B O_L +
  // P_B V_B,L.
  handoff_wait(sm, kScaleB, ph);
  const float fb[2] = {sm.scale(1)[ln.rbase], sm.scale(1)[ln.rbase + 8]};
#pragma unroll
  for (int j = 0; j < 32; ++j) s[j] *= fb[(j >> 1) & 1];
  pack_p<T>(s, pa);
  store_p(pa, sm, 0, ln);
  handoff_arrive(sm, kPa);
  scale_rows(o, fb);
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] *= fb[h];
  if (t.has_b) {
    handoff_wait(sm, kPb, ph);
    issue_pv_smem<T>(o, sm, 1, 1, 0);
  }
  // S of tile 2 i + 2: its blocks 0..3 (copied first) while P_B V_B,L runs; once that completed,
  // slot 1's blocks 0..3 are refilled with tile 2 i + 3; then blocks 4..8.
  if (t.has_a2) issue_scores<T, 0, Tr::kOBlocksPerGroup, 0, true>(s, q8, sm, 0, ph & kSlotBit);
  if (t.has_b) {
    if (t.has_a2)
      wgmma_wait<1>();
    else
      wgmma_wait<0>();
    if (t.has_b2) issue_group_copies(w, 1, t.tok_b + 2 * Tr::kBlockN, t.coord_b2, ln);
  }
  if (t.has_a2) {
    issue_scores<T, Tr::kOBlocksPerGroup, Tr::kColBlocks, Tr::kOBlocksPerGroup, false>(
        s, q8, sm, 0, ph & kSlotBit);
    ph ^= kSlotBit;
  }
  wgmma_wait<0>();
  reg_fence_all(o);
  reg_fence_all(s);
}

// Warpgroup 1's part of step i: on entry s holds S_B (when tile B exists); on exit S of the next
// step's tile B (when there is one).
template <typename T>
__device__ __forceinline__ void step_group1(const PieceWalk& w, int i, float (&s)[32],
                                            float (&o)[128], RowState& st,
                                            const uint32_t (&q8)[16], uint32_t& ph,
                                            const Lane& ln) {
  const StepTiles t(w, i, ln);
  const Smem& sm = w.sm;
  if (t.has_b && t.tok_b + Tr::kBlockN > w.e.end) zero_v_rows(sm, 1, w.e.end - t.tok_b, ln, ph);

  // m_B, scale_B, P_B (no tile B: P_B = 0, m_B = m_A); O_R = scale_A scale_B O_R + P_B V_B,R.
  handoff_wait(sm, kScaleA, ph);
  float m_prev[2], m_new[2] = {0.f, 0.f}, psum[2] = {0.f, 0.f}, f[2];
  read_row_max(sm, ln, m_prev);
  if (t.has_b) {
    tile_softmax(s, st, m_prev, m_new, psum, *sm.tok_ok(1), t.tok_b, w.scale_log2, ln);
  } else {
    m_new[0] = m_prev[0];
    m_new[1] = m_prev[1];
  }
  f[0] = rescale_factor(m_prev[0], m_new[0]);
  f[1] = rescale_factor(m_prev[1], m_new[1]);
  store_row_max(sm, ln, 1, m_new, f);
  handoff_arrive(sm, kScaleB);
  const float fo[2] = {sm.scale(0)[ln.rbase] * f[0], sm.scale(0)[ln.rbase + 8] * f[1]};
  scale_rows(o, fo);
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * fo[h] + psum[h];
  if (t.has_b) {
    uint32_t pb[16];
    pack_p<T>(s, pb);
    store_p(pb, sm, 1, ln);
    issue_pv_regs<T>(o, pb, sm, 1, 1);
  }
  // O_R += (scale_B P_A) V_A,R; P_B is stored (and fenced) for warpgroup 0.
  handoff_wait(sm, kPa, ph);
  issue_pv_smem<T>(o, sm, 0, 0, 1);
  if (t.has_b) handoff_arrive(sm, kPb);
  // Refill slot 1's blocks 4..8 once P_B V_B,R completed, slot 0's once P_A V_A,R did; then S of
  // tile 2 i + 3.
  if (t.has_b) {
    wgmma_wait<1>();
    if (t.has_b2) issue_group_copies(w, 1, t.tok_b + 2 * Tr::kBlockN, t.coord_b2, ln);
  }
  wgmma_wait<0>();
  if (t.has_a2) issue_group_copies(w, 0, t.tok_a + 2 * Tr::kBlockN, t.coord_a2, ln);
  if (t.has_b2) {
    // Blocks 4..8 first: this warpgroup copied them before warpgroup 0 copied 0..3.
    issue_scores<T, 0, Tr::kColBlocks, Tr::kOBlocksPerGroup, true>(s, q8, sm, 1, ph & kSlotBit);
    ph ^= kSlotBit;
    wgmma_wait<0>();
  }
  reg_fence_all(o);
  reg_fence_all(s);
}

// The piece's epilogue for this thread's rows rbase, rbase + 8: l = the quad's shares (a fixed
// order), then the two warpgroups' sums through shared memory (warpgroup 0's + warpgroup 1's in
// both: the same bits), 1 / l (0 for a row that saw nothing), lse = (m + log2 l) ln 2 (-inf for
// such a row; NaN when l is) by warpgroup 0, and O / l of this warpgroup's dims to out or
// o_accum. m is the shared running max, last stored by warpgroup 1 before its kScaleB hand-off of
// the last step.
template <typename T>
__device__ __forceinline__ void piece_epilogue(const MlaDecodeParams& p, const Smem& sm,
                                               const PieceRun& e, const RowState& st,
                                               const float (&o)[128], int row0, const Lane& ln) {
  float* row_sum = sm.row_sum();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if ((ln.lane & 3) == 0) row_sum[ln.g * Tr::kBlockM + ln.rbase + 8 * h] = l;
  }
  named_barrier(kBarBoth, Tr::kNumThreads);  // both warpgroups' sums (and the last m) are stored
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = ln.rbase + 8 * h;
    const float l = row_sum[r] + row_sum[Tr::kBlockM + r];
    const bool empty = l == 0.f;
    const float inv = empty ? 0.f : 1.f / l;
    const int row = row0 + r;
    if (row >= p.num_rows || e.write == kWriteNone) continue;
    const int s = row / p.h_q, hq = row % p.h_q;
    if (ln.g == 0 && (ln.lane & 3) == 0) {
      const float m = sm.row_max()[r];
      const float lse = empty ? -INFINITY : (m + __log2f(l)) * 0.6931471805599453f;
      if (e.write == kWriteOut)
        p.lse[(int64_t(e.req) * p.h_q + hq) * p.s_q + s] = lse;
      else
        p.lse_accum[int64_t(e.piece) * p.num_rows + row] = lse;
    }
    const int col0 = ln.g * (kLatentDim / 2) + 2 * (ln.lane & 3);
    if (e.write == kWriteOut) {
      T* out = static_cast<T*>(p.out) + int64_t(e.req) * p.o_batch_stride +
               int64_t(s) * p.o_seq_stride + int64_t(hq) * p.o_head_stride + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) =
            pack2<T>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    } else {
      float* acc = p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim + col0;
      const uint64_t keep = l2_evict_last_policy();
#pragma unroll
      for (int j = 0; j < 32; ++j)
        st_global_keep(acc + 8 * j, make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv),
                       keep);
    }
  }
}

// One piece: both warpgroups are past the previous piece (its wgmmas read Q, the P tiles and the
// slots; its epilogue read the row sums and maxima); the copies of tiles 0 and 1 start, Q is
// stored and the running max reset; each warpgroup scores its first tile, then the steps.
// ph: this thread's phase bits (kSlotBit: the slot this warpgroup scores).
template <typename T>
__device__ __forceinline__ void run_piece(const PieceWalk& w, int row0, uint32_t& ph,
                                          const Lane& ln, int tid) {
  const Smem& sm = w.sm;
  const PieceRun& e = w.e;
  named_barrier(kBarBoth, Tr::kNumThreads);
  for (int t = 0; t < 2 && t < w.n_tiles; ++t) {
    const int tok = e.begin + t * Tr::kBlockN;
    issue_group_copies(w, t, tok, group_page_coord(w, tok, ln), ln);
  }
  load_q<T>(w.p, sm, e, row0, tid);
  if (tid < Tr::kBlockM) sm.row_max()[tid] = -INFINITY;
  fence_proxy_async_smem();
  named_barrier(kBarBoth, Tr::kNumThreads);  // Q and the running max are visible to both

  uint32_t q8[16];
  load_q_regs(sm, ln, q8);
  RowState st;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + ln.rbase + 8 * h;
    const int vis = row < w.p.num_rows ? visible_len(e.seqlen, w.p.s_q, row / w.p.h_q) : 0;
    st.lim[h] = vis < e.end ? vis : e.end;
    st.l[h] = 0.f;
  }
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[32];
  if (ln.g < w.n_tiles) {
    issue_scores<T, 0, Tr::kColBlocks, 0, true>(s, q8, sm, ln.g, ph & kSlotBit);
    ph ^= kSlotBit;
    wgmma_wait<0>();
    reg_fence_all(s);
  }
  for (int i = 0; 2 * i < w.n_tiles; ++i) {
    if (ln.g == 0)
      step_group0<T>(w, i, s, o, st, q8, ph, ln);
    else
      step_group1<T>(w, i, s, o, st, q8, ph, ln);
  }
  piece_epilogue<T>(w.p, sm, e, st, o, row0, ln);
}

// The rounds of up to kMaxPieces pieces of worker w: thread 0 collects a round's pieces, then
// every piece of the round runs.
template <typename T>
__device__ __forceinline__ void run_rounds(const MlaDecodeParams& p, const Smem& sm,
                                           const void* kv_map, int w, int row0, int tid) {
  const Lane ln(tid);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  uint32_t ph = 0;  // phase bits (kSlotBit, kHandoffBit << k, kGroupBit)
  for (int first = 0;; first += Tr::kMaxPieces) {
    if (tid == 0) collect_pieces<Tr>(p, w, first, sm.pieces(), sm.counts());
    __syncthreads();  // the piece list (and, first time, the barriers' init) is visible
    const int n = sm.counts()[0];
    for (int pi = 0; pi < n; ++pi) {
      const PieceRun e = sm.pieces()[pi];
      const int span = e.end - e.begin;
      const PieceWalk walk{p, sm, kv_map, e, TileGeom(p),
                           span > 0 ? (span + Tr::kBlockN - 1) / Tr::kBlockN : 0, scale_log2};
      run_piece<T>(walk, row0, ph, ln, tid);
    }
    // The worker's piece total, read again here (shared memory, unchanged during the round)
    // rather than held in a register through the round.
    if (first + Tr::kMaxPieces >= sm.counts()[1]) break;
    __syncthreads();  // everyone is done with this round's piece list
  }
}

}  // namespace sm90a

template <typename T>
__global__ void __launch_bounds__(MlaSm90aTraits::kNumThreads, 1)
    mla_decode_sm90a_kernel(const __grid_constant__ MlaDecodeParams p,
                            const __grid_constant__ CUtensorMap kv_map) {
  using Tr = MlaSm90aTraits;
  extern __shared__ __align__(16) uint8_t smem_raw[];  // aligned to 1024 below
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const sm90a::Smem sm{smem_raw + pad, raw + pad};
  const int tid = threadIdx.x;
  const int row0 = blockIdx.y * Tr::kBlockM;
  if (tid == 0) sm90a::tma_prefetch_map(&kv_map);
  if (!begin_block<Tr, T>(p, row0)) return;
  if (tid == 0) {
    for (int i = 0; i < 2 * Tr::kColBlocks; ++i)
      sm90a::mbar_init(sm.base_u32 + Tr::kBarOff + 8 * i, 1);
    for (int k = 0; k < Tr::kHandoffs; ++k) sm90a::mbar_init(sm.handoff(k), sm90a::kGroupThreads);
    for (int g = 0; g < 2; ++g) sm90a::mbar_init(sm.group_bar(g), sm90a::kGroupThreads);
    sm90a::fence_mbarrier_init();
  }
  sm90a::run_rounds<T>(p, sm, &kv_map, blockIdx.x, row0, tid);
  pdl_launch_dependents();  // this block is done: a dependent kernel may start launching
}

// Launch on `stream` with the cache's tensor map; the attribute is set per call (cheap, allowed
// during capture).
template <typename T>
cudaError_t run_mla_decode_sm90a(const MlaDecodeParams& p, const CUtensorMap& kv_map,
                                 cudaStream_t stream) {
  using Tr = MlaSm90aTraits;
  auto kernel = mla_decode_sm90a_kernel<T>;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.num_workers, ceil_div(p.num_rows, Tr::kBlockM));
  return launch_pdl(kernel, grid, dim3(Tr::kNumThreads), Tr::kSmemBytes, stream, p, kv_map);
}

#define KF_DECODE_SM90A_INSTANTIATE(T)                                                      \
  template cudaError_t run_mla_decode_sm90a<T>(const MlaDecodeParams&, const CUtensorMap&, \
                                               cudaStream_t);

}  // namespace kf::cuda
