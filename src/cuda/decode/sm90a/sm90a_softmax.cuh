// The sm_90a decode kernel's online softmax: a tile's scores into P against the running max the
// two warpgroups share, the rescale of O, P's pack into A fragments and its store for the other
// warpgroup, and the zeroing of V rows past a piece's end.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/mma_sm80.cuh"
#include "cuda/decode/sm90a/sm90a_block.cuh"

namespace kf::cuda::sm90a {

// ---- softmax ----
// Per piece, this thread's rows: lim[h] = the tokens of the piece row rbase + 8 h may see (its
// causal limit, at most the piece's end; the piece's end past num_rows); l[h] = this thread's
// share of the running sum over its warpgroup's tiles, relative to the shared running max.
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
// wgmma reads them after the hand-off that follows (kPa or kPb).
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

}  // namespace kf::cuda::sm90a
