// The decode kernel's per-piece and per-tile math: load Q, the scores of a KV tile (QK, split-K
// over the warps of a row group), the online softmax of a tile, and P V. Warp (g, d) of a block
// is row group g (kMFrags x 16 rows) and dim group d; `lane` is the warp lane. Every function is
// forced inline and takes the arrays it fills or reads (fragments, accumulators) from the
// kernel by reference: they live in registers for the piece or the tile.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/mla_shape.h"
#include "core/params.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/decode/sm80/kv8_dequant.cuh"
#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

// Column swizzles of the score and P buffers (bank-conflict-free fragment stores and ldmatrix).
template <int kBlockN>
__device__ __forceinline__ int score_swizzle(int row) {  // in floats
  return kBlockN == 16 ? ((row >> 1) & 1) << 3 : (row & 3) << 3;
}
template <int kBlockN>
__device__ __forceinline__ int p_swizzle(int row) {  // in 16-byte chunks
  return kBlockN == 16 ? (row >> 2) & 1 : (row >> 1) & 3;
}

// Every element of a float array (of any rank) to 0.
template <int N>
__device__ __forceinline__ void zero_fill(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) a[i] = 0.f;
}
template <typename A, int N>
__device__ __forceinline__ void zero_fill(A (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero_fill(a[i]);
}

// The element type of P and of the P V mma: q's dtype, fp16 for 8-bit caches.
template <class Tr, typename T>
using PvType = typename std::conditional<Tr::kKv8, __half, T>::type;

// ---- load Q ----
// This warp's q fragments of piece e's request, for the whole piece: rows g kRowsPerGroup +
// mf 16 + lane / 4 (+ 8), the k16 steps d, d + 4, ..., d + 28 of the 512 latent dims (rows past
// num_rows are zero). The rope step (dims 512..575) goes to shared memory instead
// (store_q_pe): read with ldmatrix every tile, it frees 4 kMFrags registers.
// 8-bit caches: fp16 fragments of dims 128 d + 32 (lane % 4) .. + 31 (kv8_dequant.cuh), scaled
// by 2^e_row; q_unscale[mf][hf] = 2^-e_row / kv8_code_unit undoes both in the scores.
template <class Tr, typename T, int kFmt>
__device__ __forceinline__ void load_q_fragments(const MlaDecodeParams& p, const T* q,
                                                 const PieceRun& e, int row0, int g, int d,
                                                 int lane,
                                                 uint32_t (&qf)[Tr::kMFrags][Tr::kQkSteps - 1][4],
                                                 float (&q_unscale)[Tr::kMFrags][2]) {
  constexpr int kQkSteps = Tr::kQkSteps;
#pragma unroll
  for (int mf = 0; mf < Tr::kMFrags; ++mf) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = row0 + g * Tr::kRowsPerGroup + mf * 16 + (lane >> 2) + hf * 8;
      const bool valid = row < p.num_rows;
      const int s = valid ? row / p.h_q : 0, h = valid ? row % p.h_q : 0;
      const T* qrow = q + int64_t(e.req) * p.q_batch_stride + int64_t(s) * p.q_seq_stride +
                      int64_t(h) * p.q_head_stride;
      if constexpr (Tr::kKv8) {
        static_assert(kQkSteps - 1 == 8, "");
        q_unscale[mf][hf] =
            kv8_q_fragments<T>(qrow + d * 128 + 32 * (lane & 3), valid, qf[mf], hf) *
            (1.f / kv8_code_unit<kFmt>());
      } else {
        const uint32_t* qw = reinterpret_cast<const uint32_t*>(qrow + d * 16 + 2 * (lane & 3));
#pragma unroll
        for (int ks = 0; ks < kQkSteps - 1; ++ks) {  // dims 16 * (4 ks + d) ..
          qf[mf][ks][hf] = valid ? __ldg(qw + ks * 32) : 0u;
          qf[mf][ks][2 + hf] = valid ? __ldg(qw + ks * 32 + 4) : 0u;
        }
      }
    }
  }
}

// q_pe (dims 512..575) of row group g's rows into shared memory, 128-byte rows with 16-byte
// chunks swizzled by the row. Only the group's own rows: the other row group may still be
// reading its q_pe. Readers see it after the piece's first tile barrier (a piece without tiles
// reads nothing).
template <class Tr, typename T>
__device__ __forceinline__ void store_q_pe(const DecodeSmem<Tr>& sm, const MlaDecodeParams& p,
                                           const T* q, const PieceRun& e, int row0, int g, int d,
                                           int lane) {
  const int gt = d * 32 + lane;
#pragma unroll
  for (int i = gt; i < Tr::kRowsPerGroup * 8; i += Tr::kDimGroups * 32) {
    const int r = g * Tr::kRowsPerGroup + i / 8, c = i % 8, row = row0 + r;
    uint32_t v3 = 0u, v2 = 0u, v1 = 0u, v0 = 0u;
    if (row < p.num_rows) {
      const uint32_t* src = reinterpret_cast<const uint32_t*>(
          q + int64_t(e.req) * p.q_batch_stride + int64_t(row / p.h_q) * p.q_seq_stride +
          int64_t(row % p.h_q) * p.q_head_stride + kLatentDim + c * 8);
      v0 = __ldg(src);
      v1 = __ldg(src + 1);
      v2 = __ldg(src + 2);
      v3 = __ldg(src + 3);
    }
    *reinterpret_cast<uint4*>(sm.base + Tr::kQpeOff + r * 128 + ((c ^ (r & 7)) << 4)) =
        make_uint4(v0, v1, v2, v3);
  }
}

// The softmax state of this thread's slot for a new piece: max -inf, sum 0, O's unit 1 (8-bit),
// and the causal limit of block row srow (query row row0 + srow) in piece e's request.
template <class Tr>
__device__ __forceinline__ void init_softmax_state(const DecodeSmem<Tr>& sm,
                                                   const MlaDecodeParams& p, const PieceRun& e,
                                                   int row0, int srow) {
  const int t = fresh_tid();
  const int row = row0 + srow;
  sm.row_max[t] = -INFINITY;
  sm.row_sum[t] = 0.f;
  if constexpr (Tr::kKv8) sm.unit[t] = 1.f;
  sm.visible[t] = row < p.num_rows ? visible_len(e.seqlen, p.s_q, row / p.h_q) : 0;
}

// ---- scores (QK) ----
// Two accumulator sets halve the dependent mma chain when a warp has one row fragment (a
// 32-token tile already has four independent n8 chains).
template <class Tr>
constexpr int kQkAccSets = (Tr::kMFrags == 1 && Tr::kBlockN == 16 && !Tr::kKv8) ? 2 : 1;

template <class Tr>
using QkAcc = float[kQkAccSets<Tr>][Tr::kMFrags][Tr::kNFrags][4];

// The A fragments of the rope step (q_pe, from shared memory) of this warp's rows.
template <class Tr>
__device__ __forceinline__ void load_q_pe_fragments(const DecodeSmem<Tr>& sm,
                                                    uint32_t (&qpe)[Tr::kMFrags][4], int g, int d,
                                                    int lane) {
#pragma unroll
  for (int mf = 0; mf < Tr::kMFrags; ++mf) {
    const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane & 15);
    ldmatrix_x4(qpe[mf], sm.q_pe + r * 128 + (((2 * d + (lane >> 4)) ^ (r & 7)) << 4));
  }
}

// 16-bit cache: s_acc += q . k over this warp's 144 dims (k16 steps d, d + 4, ..., d + 32; the
// last is the rope step) for the ring tile at shared address `tile`. ldmatrix.x4 rows: tokens
// (lane & 7) + 8 (lane >> 4), chunk + ((lane >> 3) & 1); step ks covers chunks 8 ks + 2 d (+1),
// and the swizzle only touches the low 3 bits, so one base address serves every step.
template <class Tr, typename T>
__device__ __forceinline__ void qk_tile16(QkAcc<Tr>& s_acc,
                                          const uint32_t (&qf)[Tr::kMFrags][Tr::kQkSteps - 1][4],
                                          const uint32_t (&qpe)[Tr::kMFrags][4], uint32_t tile,
                                          int d, int lane) {
  constexpr int kQkSteps = Tr::kQkSteps, kRowBytes = kHeadDim * 2;
  const uint32_t k_addr = tile + ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes +
                          (((2 * d + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
#pragma unroll
  for (int ks = 0; ks < kQkSteps; ++ks) {
#pragma unroll
    for (int np = 0; np < Tr::kNFrags / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, k_addr + np * 16 * kRowBytes + ks * 128);
#pragma unroll
      for (int mf = 0; mf < Tr::kMFrags; ++mf) {
        const uint32_t(&a)[4] = ks == kQkSteps - 1 ? qpe[mf] : qf[mf][ks < kQkSteps - 1 ? ks : 0];
        mma_16816<T>(s_acc[ks % kQkAccSets<Tr>][mf][2 * np], a, b[0], b[1]);
        mma_16816<T>(s_acc[ks % kQkAccSets<Tr>][mf][2 * np + 1], a, b[2], b[3]);
      }
    }
  }
}

// 8-bit cache: s_acc = scale_t 2^-e_row (q16 . k_q) over latent dims 128 d .. + 127 from the
// 8-bit codes of the ring tile at `tile8` (kb keeps the converted codes for P V), plus q_pe .
// k_pe over rope dims 512 + 16 d .. + 15 (B fragments in b; bf16 in the cache, converted for
// fp16 q, exact inside fp16's range). tile_smax: the tile's largest token scale (a quad of
// lanes holds all kBlockN of them).
template <class Tr, typename T, int kFmt>
__device__ __forceinline__ void qk_tile8(QkAcc<Tr>& s_acc, const uint32_t (&qf)[1][8][4],
                                         const float (&q_unscale)[1][2],
                                         const uint32_t (&qpe)[1][4], uint32_t tile,
                                         const uint8_t* tile8, const float* tile_scale,
                                         float& tile_smax, uint32_t (&kb)[Tr::kNFrags][8][2],
                                         uint32_t (&b)[4], int d, int lane) {
  constexpr int kNFrags = Tr::kNFrags;
  kv8_qk_latent_keep<kFmt, kNFrags>(s_acc[0][0], qf[0], tile8, d, lane, kb);
#pragma unroll
  for (int nf = 0; nf < kNFrags; ++nf) {
    const float2 sc2 = *reinterpret_cast<const float2*>(tile_scale + nf * 8 + 2 * (lane & 3));
    tile_smax = fmaxf(tile_smax, fmaxf(sc2.x, sc2.y));
#pragma unroll
    for (int k = 0; k < 4; ++k)
      s_acc[0][0][nf][k] *= ((k & 1) ? sc2.y : sc2.x) * q_unscale[0][k >> 1];
  }
  static_assert(kNFrags * 8 == Tr::kBlockN, "a quad's scales cover the tile");
  tile_smax = fmaxf(tile_smax, __shfl_xor_sync(0xffffffffu, tile_smax, 1));
  tile_smax = fmaxf(tile_smax, __shfl_xor_sync(0xffffffffu, tile_smax, 2));
  // ldmatrix.x4 rows: tokens (lane & 7) + 8 (lane >> 4), chunk 2 d + ((lane >> 3) & 1) of the
  // 128-byte rope rows.
  const uint32_t r_addr = tile + Tr::kKv8RopeOff +
                          ((lane & 7) + ((lane >> 4) << 3)) * (kRopeDim * 2) +
                          (((2 * d + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
#pragma unroll
  for (int np = 0; np < kNFrags / 2; ++np) {
    ldmatrix_x4(b, r_addr + np * 16 * (kRopeDim * 2));
    if constexpr (std::is_same<T, __half>::value) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = unpack2<__nv_bfloat16>(b[k]);
        b[k] = pack2<__half>(f.x, f.y);
      }
    }
    mma_16816<T>(s_acc[0][0][2 * np], qpe[0], b[0], b[1]);
    mma_16816<T>(s_acc[0][0][2 * np + 1], qpe[0], b[2], b[3]);
  }
}

// This warp's partial scores (the sum of its accumulator sets) into dim group d's slice of the
// score buffer, rows g kRowsPerGroup + mf 16 + lane / 4 (+ 8).
template <class Tr>
__device__ __forceinline__ void store_partial_scores(const DecodeSmem<Tr>& sm,
                                                     const QkAcc<Tr>& s_acc, int g, int d,
                                                     int lane) {
  constexpr int kBlockN = Tr::kBlockN, kAccSets = kQkAccSets<Tr>;
#pragma unroll
  for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane >> 2) + hf * 8;
      float* dst = sm.spart + (d * Tr::kBlockM + r) * kBlockN;
      const int swz = score_swizzle<kBlockN>(r);
#pragma unroll
      for (int nf = 0; nf < Tr::kNFrags; ++nf) {
        float2 v;
        v.x = s_acc[0][mf][nf][2 * hf];
        v.y = s_acc[0][mf][nf][2 * hf + 1];
        if (kAccSets == 2) {
          v.x += s_acc[kAccSets - 1][mf][nf][2 * hf];
          v.y += s_acc[kAccSets - 1][mf][nf][2 * hf + 1];
        }
        *reinterpret_cast<float2*>(dst + ((nf * 8 + 2 * (lane & 3)) ^ swz)) = v;
      }
    }
}

// ---- online softmax of one tile ----
// Scores of block row srow, tokens st0 .. st0 + kSoftTokens - 1: the 4 dim groups' partials
// added in a fixed order.
template <class Tr>
__device__ __forceinline__ void gather_scores(const DecodeSmem<Tr>& sm,
                                              float (&sc)[Tr::kSoftTokens], int srow, int st0) {
  constexpr int kBlockN = Tr::kBlockN;
#pragma unroll
  for (int k = 0; k < Tr::kSoftTokens; ++k) sc[k] = 0.f;
  const int swz = score_swizzle<kBlockN>(srow);
#pragma unroll
  for (int dd = 0; dd < Tr::kDimGroups; ++dd) {
    const float* src = sm.spart + (dd * Tr::kBlockM + srow) * kBlockN + (st0 ^ swz);
    if constexpr (Tr::kSoftTokens == 4) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      sc[0] += v.x, sc[1] += v.y, sc[2] += v.z, sc[3] += v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(src);
      sc[0] += v.x, sc[1] += v.y;
    }
  }
}

// One tile of the online softmax for this thread's slot `tid` (block row srow, tokens st0 ..):
// masks tokens that were not loaded or lie past the row's causal limit (tile token 0 is
// position tile_tok), moves the running max (in log2 units: exp2 with scale * log2 e folded into
// scale_log2), adds the tile's exponentials to the running sum, and stores P (PvType) and the
// row's O rescale factor alpha.
// Non-finite values (docs/spec.md section 6): a score s of a token the row sees becomes
// s + (s - s), s itself when finite and NaN when s is NaN or +-Inf, so p, the row sum and O turn
// NaN (the maximum, taken with fmaxf, skips it); masked tokens are -inf before that step, so
// nothing outside the row's positions reaches it.
// 16-bit: the running max follows every tile's max exactly, so the dominant token's P is
// exactly 1 (a lazy max would put bf16 outputs at the accuracy limit of docs/spec.md section 4).
// 8-bit: P' = p s_t / unit is an fp16 value that is never exactly 1 anyway, so the
// max is lazy: it moves only when a score passes it by 8 (p <= 2^8, far inside fp16), found with
// one vote; the row reduction (three shuffle steps) runs only then, and alpha stays exactly 1 in
// between (no O rescale). O moves to units of the power of two at or above the tile's largest
// scale (a tile of unloaded tokens keeps the old unit: their scales were zero-filled), so
// P' <= 1 stays out of fp16's subnormals for the tile's largest tokens; PV multiplies the
// unscaled codes, so P carries the token scales. Powers of two make 1 / unit and the O rescale
// exact, and the unit moves only when the largest scale crosses one.
template <class Tr, typename T>
__device__ __forceinline__ void softmax_tile(const DecodeSmem<Tr>& sm,
                                             float (&sc)[Tr::kSoftTokens], int tid, int lane,
                                             int srow, int st0, const int& read_slot,
                                             int tile_tok, float scale_log2, float tile_smax,
                                             const float* tile_scale) {
  constexpr int kBlockN = Tr::kBlockN, kSoftTokens = Tr::kSoftTokens;
  constexpr int kSoftTpr = Tr::kSoftThreadsPerRow;
  const float m_run = sm.row_max[tid];
  const int vis_end = sm.visible[tid];
  const float l_run = sm.row_sum[tid];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSoftTokens; ++k) {
    const bool valid =
        sm.tok_ok[read_slot * kBlockN + st0 + k] && tile_tok + st0 + k < vis_end;
    const float s = sc[k] * scale_log2;
    sc[k] = valid ? s + (s - s) : -INFINITY;
    mx = fmaxf(mx, sc[k]);
  }
  float m_new;
  if (!Tr::kKv8 || __any_sync(0xffffffffu, mx > m_run + 8.f)) {
#pragma unroll
    for (int o = 1; o < kSoftTpr; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    m_new = fmaxf(m_run, mx);
  } else {
    m_new = m_run;
  }
  const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no (-inf) - (-inf)
  const float alpha = fast_exp2(m_run - m_use);
  float ps = 0.f;
#pragma unroll
  for (int k = 0; k < kSoftTokens; ++k) {
    sc[k] = fast_exp2(sc[k] - m_use);
    ps += sc[k];
  }
  sm.row_sum[tid] = l_run * alpha + ps;
  sm.row_max[tid] = m_new;
  float o_alpha = alpha;
  if constexpr (Tr::kKv8) {
    const float unit_prev = sm.unit[tid];
    const float unit = tile_smax > 0.f ? pow2_at_least(tile_smax) : unit_prev;
    const float inv_unit = pow2_inverse(unit);
    o_alpha = alpha * (unit_prev * inv_unit);
    sm.unit[tid] = unit;
    // A token the row does not see has p exactly 0 and keeps P' = 0 whatever its scale: the
    // NaN scale of a non-finite latent (docs/spec.md section 6) reaches only the rows that see it.
#pragma unroll
    for (int k = 0; k < kSoftTokens; ++k)
      sc[k] = sc[k] == 0.f ? 0.f : sc[k] * (tile_scale[st0 + k] * inv_unit);
  }
  if (lane % kSoftTpr == 0) sm.alpha[srow] = o_alpha;
  uint8_t* pdst = sm.base + Tr::kPOff + srow * kBlockN * 2 +
                  (((st0 >> 3) ^ p_swizzle<kBlockN>(srow)) << 4) + (st0 & 7) * 2;
#pragma unroll
  for (int k = 0; k < kSoftTokens; k += 2)
    *reinterpret_cast<uint32_t*>(pdst + k * 2) = pack2<PvType<Tr, T>>(sc[k], sc[k + 1]);
}

// ---- P V ----
// O = alpha O + P V for this warp's rows and 128 output dims (16-bit: 16-dim blocks d, d + 4,
// ..., d + 28; 8-bit: kv8_dequant.cuh's permuted dims), for the ring tile at byte offset
// tile_off: V is the first 512 dims of the same tile (ldmatrix.trans); 8-bit caches reuse the
// codes QK converted (kb). Once the running max settles, alpha is exactly 1: skipping the
// multiply is then bit-identical and saves 64 kMFrags instructions per tile.
template <class Tr, typename T>
__device__ __forceinline__ void pv_tile(const DecodeSmem<Tr>& sm,
                                        float (&o_acc)[Tr::kMFrags][Tr::kPvFrags][4],
                                        uint32_t (&kb)[Tr::kKv8 ? Tr::kNFrags : 1][8][2],
                                        int tile_off, int g, int d, const int& lane) {
  constexpr int kMFrags = Tr::kMFrags, kPvFrags = Tr::kPvFrags, kBlockN = Tr::kBlockN;
  constexpr int kRowBytes = kHeadDim * 2;
  const float* alpha_s = sm.alpha;
  float a[kMFrags][2];
  bool rescale = false;
#pragma unroll
  for (int mf = 0; mf < kMFrags; ++mf) {
    const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane >> 2);
    a[mf][0] = alpha_s[r];
    a[mf][1] = alpha_s[r + 8];
    rescale = rescale || a[mf][0] != 1.f || a[mf][1] != 1.f;
  }
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
      for (int nf = 0; nf < kPvFrags; ++nf) {
        o_acc[mf][nf][0] *= a[mf][0];
        o_acc[mf][nf][1] *= a[mf][0];
        o_acc[mf][nf][2] *= a[mf][1];
        o_acc[mf][nf][3] *= a[mf][1];
      }
  }
#pragma unroll
  for (int kt = 0; kt < kBlockN / 16; ++kt) {
    uint32_t pa[kMFrags][4];
#pragma unroll
    for (int mf = 0; mf < kMFrags; ++mf) {
      const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane & 15);
      const int chunk = (2 * kt + (lane >> 4)) ^ p_swizzle<kBlockN>(r);
      ldmatrix_x4(pa[mf], sm.p + r * kBlockN * 2 + (chunk << 4));
    }
    if constexpr (Tr::kKv8) {
      kv8_pv_from_k<Tr::kNFrags>(o_acc[0], pa[0], kb, kt);
    } else {
      // ldmatrix.x4.trans rows: tokens (lane & 7) + 8 ((lane >> 3) & 1), chunk + lane / 16;
      // pair j holds dims 16 (4 j + d) .. + 15, chunks 8 j + 2 d (+1).
      const uint32_t v_addr = sm.kv + tile_off +
                              (kt * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * kRowBytes +
                              (((2 * d + (lane >> 4)) ^ (lane & 7)) << 4);
#pragma unroll
      for (int j = 0; j < kPvFrags / 2; ++j) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_addr + j * 128);
#pragma unroll
        for (int mf = 0; mf < kMFrags; ++mf) {
          mma_16816<T>(o_acc[mf][2 * j], pa[mf], b[0], b[1]);
          mma_16816<T>(o_acc[mf][2 * j + 1], pa[mf], b[2], b[3]);
        }
      }
    }
  }
}

}  // namespace kf::cuda
