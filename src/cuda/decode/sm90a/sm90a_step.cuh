// One step of the sm_90a decode kernel (two KV tiles, A and B), each warpgroup's part of it:
// the seesaw of mla_decode_sm90a.cuh's header, with the refills of the slots and the next
// tiles' scores.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "cuda/decode/sm90a/sm90a_copies.cuh"
#include "cuda/decode/sm90a/sm90a_mma.cuh"
#include "cuda/decode/sm90a/sm90a_softmax.cuh"

namespace kf::cuda::sm90a {

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
// slot s (warpgroup 0: column blocks 0..3, warpgroup 1: 4..8), page coordinate coord (lane 0's
// alone when a tile is one page: that lane issues them all).
__device__ __forceinline__ void issue_group_copies(const PieceWalk& w, int s, int tok, int coord,
                                                   const Lane& ln) {
  if (ln.gtid >= 32) return;
  if (w.tg.one_page) {
    if (ln.lane != 0) return;
    if (ln.g == 0)
      issue_page_copies<0, Tr::kOBlocksPerGroup>(w.p, w.sm, w.kv_map, s, tok, coord);
    else
      issue_page_copies<Tr::kOBlocksPerGroup, Tr::kColBlocks>(w.p, w.sm, w.kv_map, s, tok, coord);
    return;
  }
  if (ln.g == 0)
    issue_tile_copies<0, Tr::kOBlocksPerGroup>(w.p, w.sm, w.kv_map, s, tok, coord, w.tg, ln.lane);
  else
    issue_tile_copies<Tr::kOBlocksPerGroup, Tr::kColBlocks>(w.p, w.sm, w.kv_map, s, tok, coord,
                                                            w.tg, ln.lane);
}
// The page coordinate this lane of warp 0 copies from for issue_group_copies of the tile at tok.
__device__ __forceinline__ int group_page_coord(const PieceWalk& w, int tok, const Lane& ln) {
  if (ln.gtid >= 32 || (w.tg.one_page && ln.lane != 0)) return w.p.num_pages;
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

// Warpgroup 1's part of step i (t: StepTiles, t.has_b = kHasB): on entry s holds S_B (when tile
// B exists); on exit S of the next step's tile B (when there is one). A step without a tile B
// (a piece's last, of an odd tile count) is its own instantiation, so that no wgmma or wait of
// the step with one sits in a branch (ptxas would serialize the wgmmas).
template <typename T, bool kHasB>
__device__ __forceinline__ void step_group1_impl(const PieceWalk& w, float (&s)[32],
                                                 float (&o)[128], RowState& st,
                                                 const uint32_t (&q8)[16], uint32_t& ph,
                                                 const Lane& ln, StepTiles t) {
  t.has_b = kHasB;
  const Smem& sm = w.sm;
  if (t.has_b && t.tok_b + Tr::kBlockN > w.e.end) zero_v_rows(sm, 1, w.e.end - t.tok_b, ln, ph);

  // P_B against tile B's own row max m_loc first, while warpgroup 0 still works on tile A's
  // softmax; once m_A is in, m_B = max(m_A, m_loc) and P_B, its sum scaled by 2^(m_loc - m_B)
  // (0 for a row that sees nothing of tile B; a row with a non-finite score stays NaN). No tile
  // B: P_B = 0, m_B = m_A.
  float m_loc[2] = {-INFINITY, -INFINITY}, psum[2] = {0.f, 0.f};
  if (t.has_b) {
    const float none[2] = {-INFINITY, -INFINITY};
    tile_softmax(s, st, none, m_loc, psum, *sm.tok_ok(1), t.tok_b, w.scale_log2, ln);
  }
  handoff_wait(sm, kScaleA, ph);
  float m_prev[2], m_new[2], f[2];
  read_row_max(sm, ln, m_prev);
#pragma unroll
  for (int h = 0; h < 2; ++h) m_new[h] = fmaxf(m_prev[h], m_loc[h]);
  if (t.has_b) {
    float c[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      c[h] = m_loc[h] == -INFINITY ? 0.f : rescale_factor(m_loc[h], m_new[h]);
      psum[h] *= c[h];
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) s[j] *= c[(j >> 1) & 1];
  }
  f[0] = rescale_factor(m_prev[0], m_new[0]);
  f[1] = rescale_factor(m_prev[1], m_new[1]);
  store_row_max(sm, ln, 1, m_new, f);
  handoff_arrive(sm, kScaleB);
  const float fo[2] = {sm.scale(0)[ln.rbase] * f[0], sm.scale(0)[ln.rbase + 8] * f[1]};
  scale_rows(o, fo);
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * fo[h] + psum[h];
  uint32_t pb[16];
  if (t.has_b) {
    pack_p<T>(s, pb);
    store_p(pb, sm, 1, ln);
  }
  // O_R += (scale_B P_A) V_A,R first: it is slot 0's last read, so slot 0's blocks 4..8 are
  // refilled with tile 2 i + 2 (which warpgroup 0 scores first in the next step) as early as the
  // hand-off of P_A allows; then O_R += P_B V_B,R, after which slot 1's blocks 4..8 are refilled
  // with tile 2 i + 3; then S of tile 2 i + 3. P_B is stored (and fenced) for warpgroup 0.
  // Without a tile B an empty group stands for P_B V_B,R, so the waits below count the same.
  handoff_wait(sm, kPa, ph);
  issue_pv_smem<T>(o, sm, 0, 0, 1);
  if (t.has_b) {
    handoff_arrive(sm, kPb);
    issue_pv_regs<T>(o, pb, sm, 1, 1);
  } else {
    wgmma_commit();
  }
  wgmma_wait<1>();
  if (t.has_a2) issue_group_copies(w, 0, t.tok_a + 2 * Tr::kBlockN, t.coord_a2, ln);
  wgmma_wait<0>();
  if (t.has_b2) issue_group_copies(w, 1, t.tok_b + 2 * Tr::kBlockN, t.coord_b2, ln);
  if (t.has_b2) {
    // Blocks 4..8 first: this warpgroup copied them before warpgroup 0 copied 0..3.
    issue_scores<T, 0, Tr::kColBlocks, Tr::kOBlocksPerGroup, true>(s, q8, sm, 1, ph & kSlotBit);
    ph ^= kSlotBit;
    wgmma_wait<0>();
  }
  reg_fence_all(o);
  reg_fence_all(s);
}

// Warpgroup 1's part of step i.
template <typename T>
__device__ __forceinline__ void step_group1(const PieceWalk& w, int i, float (&s)[32],
                                            float (&o)[128], RowState& st,
                                            const uint32_t (&q8)[16], uint32_t& ph,
                                            const Lane& ln) {
  const StepTiles t(w, i, ln);
  if (t.has_b)
    step_group1_impl<T, true>(w, s, o, st, q8, ph, ln, t);
  else
    step_group1_impl<T, false>(w, s, o, st, q8, ph, ln, t);
}

}  // namespace kf::cuda::sm90a
