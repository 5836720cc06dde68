// A consumer warpgroup of the sm_90a 8-bit decode kernel (mla_decode_sm90a_kv8.cuh): a piece's
// Q, one KV tile's scores, softmax and product. Token-major: the tile's 64 tokens are the M of
// every wgmma and the block's 16 query rows its N.
//
// Fragments (wgmma_sm90a.cuh; warp w of the warpgroup, lane = 4 g + t): an m64n16 accumulator
// d[4 j + 2 h + e] is M row 16 w + g + 8 h, query row n = 8 j + 2 t + e. The A fragment of a k16
// step: a[0] M row 16 w + g, k 2 t, 2 t + 1; a[1] row + 8; a[2], a[3] the same rows, k + 8.
//
// Scores S^T = K Q^T (M = tokens, k = dims). A dot product does not care about the order of
// its k index, so k16 step 4 G + i (G < 8, i < 4) takes, in thread t, the four consecutive dims
// 64 G + 16 t + 4 i .. + 3 (k 2 t, 2 t + 1 are the first two, k 2 t + 8, 2 t + 9 the last two):
// one 4-byte word of the codes gives the thread's two registers of a token, and one 16-byte
// load of a token gives four k16 steps. Q's latent blocks hold q in that order (store_q_kv8).
// The rope part (bf16 in the cache) is an ordinary K-major operand in shared memory.
//
// Output O^T = V^T P'^T (M = dims, k = tokens). M row r = 16 w + g + 8 h of product c (c < 8)
// is dim 128 w + 16 g + 2 c + h: a thread's dims are 16 consecutive codes of a token (one
// 16-byte load per token), and its accumulators hold 16 consecutive output dims of each of its
// query rows. The k index is the tile's token order; P'^T is stored in it.
//
// 8-bit values (kv8_dequant.cuh): the codes convert exactly to fp16, so both products run in
// fp16 on the codes; q is scaled per row by 2^e_n into fp16's range (q16), and the per-token
// scale enters the scores and P:
//   s = (scale_t 2^-e_n S_lat + S_rope) softmax_scale,  O += (p scale_t / S_tile) V_codes
// with S_tile the power of two at or above the tile's largest scale (P' <= 1 in fp16), O kept in
// units of the current S_tile (the rescale of O carries the ratio of the units).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/decode/sm80/kv8_dequant.cuh"
#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm90a/mla_decode_sm90a_kv8_traits.h"
#include "cuda/decode/sm90a/sm90a_mma.cuh"  // reg_fence_all
#include "cuda/decode/sm90a/sm90a_smem.cuh"
#include "cuda/decode/sm90a/wgmma_sm90a.cuh"

namespace kf::cuda::sm90a_kv8 {

using Tr = MlaSm90aKv8Traits;
using sm90a::smem_desc_sw128;
// Named barriers (0 is __syncthreads): consumer warpgroup wg alone is 1 + wg; both consumer
// warpgroups kBarConsumers; the whole block kBarBlock.
constexpr int kBarConsumers = 3;

__device__ __forceinline__ void group_sync(int wg) { named_barrier(1 + wg, Tr::kGroupThreads); }
// The whole block (consumers and producer) between rounds of pieces: the roles reach it from
// their own loops, so the barrier is the unaligned form (bar.sync, __syncthreads included, asks
// every thread to execute the same instruction; compute-sanitizer's synccheck reports otherwise).
constexpr int kBarBlock = 4;
__device__ __forceinline__ void block_sync() {
  asm volatile("barrier.sync %0, %1;\n" ::"n"(kBarBlock), "n"(Tr::kNumThreads) : "memory");
}
__device__ __forceinline__ void consumers_sync() {
  named_barrier(kBarConsumers, Tr::kConsumerThreads);
}

// The block's shared memory, from the 1024-aligned base (token masks, pieces: SmemBase).
struct Smem : sm90a::SmemBase<Tr> {
  __device__ __forceinline__ uint32_t q() const { return base_u32 + Tr::kQOff; }
  __device__ __forceinline__ uint32_t stage(int s) const {
    return base_u32 + Tr::kStagesOff + s * Tr::kStageBytes;
  }
  __device__ __forceinline__ const uint8_t* stage_ptr(int s) const {
    return base + Tr::kStagesOff + s * Tr::kStageBytes;
  }
  __device__ __forceinline__ uint32_t p_tile(int wg) const {
    return base_u32 + Tr::kPOff + wg * Tr::kPBytes;
  }
  __device__ __forceinline__ float* q_inv() const {
    return reinterpret_cast<float*>(base + Tr::kQInvOff);
  }
  __device__ __forceinline__ float* red(int wg, int parity, int warp) const {
    return reinterpret_cast<float*>(base + Tr::kRedOff) +
           ((wg * 2 + parity) * 4 + warp) * Tr::kRedStride;
  }
  __device__ __forceinline__ float* row_sum(int wg, int warp) const {
    return reinterpret_cast<float*>(base + Tr::kRowSumOff) + (wg * 4 + warp) * Tr::kBlockM;
  }
  // Warpgroup 1's rows for the merge: m [16], l [16], unit; its O, float i of thread j at
  // merge_o()[i * 128 + j].
  __device__ __forceinline__ float* merge_rows() const {
    return reinterpret_cast<float*>(base + Tr::kMergeOff);
  }
  __device__ __forceinline__ float* merge_o() const {
    return reinterpret_cast<float*>(base + Tr::kMergeOOff);
  }
  __device__ __forceinline__ uint32_t full(int s) const { return base_u32 + Tr::kBarOff + 8 * s; }
  __device__ __forceinline__ uint32_t empty(int s) const {
    return base_u32 + Tr::kBarOff + 8 * (Tr::kStages + s);
  }
};

// A consumer thread's place: warpgroup wg, warp w (0..3) in it, g = lane / 4, t = lane % 4.
struct Lane {
  int wg, w, lane, g, t, gtid;
  __device__ __forceinline__ explicit Lane(int tid)
      : wg(tid >> 7), w((tid >> 5) & 3), lane(tid & 31), g((tid & 31) >> 2), t(tid & 3),
        gtid(tid & 127) {}
  // The query row of accumulator column c = 2 j + e (j, e < 2).
  __device__ __forceinline__ int col(int c) const { return 8 * (c >> 1) + 2 * t + (c & 1); }
};

// Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled block.
__device__ __forceinline__ uint32_t swz(int r, int c) { return r * 128 + (((c ^ r) & 7) << 4); }
// The same for a block of 16 rows stored as two 8-row atoms (Q, P).
__device__ __forceinline__ uint32_t swz16(int r, int c) {
  return (r >> 3) * 1024 + swz(r & 7, c);
}

// ---- Q ----
// The block's 16 rows of q (piece e's request; zero past num_rows) into the Q blocks: eight
// threads per row, thread `part` of a row loads latent dims 64 part .. + 63 (4-byte loads: q rows
// need only be 4-byte aligned), scales them by the row's 2^e (its largest |q| into [2^14, 2^15):
// kv8_q_exponent) into fp16 and stores them in the scores' k order (the header) as block
// `part`, and copies rope dims 8 part .. + 7 to block 8. q_inv[row] = 2^-e. The async-proxy fence
// and the barrier that publish them are the caller's.
__device__ __forceinline__ void store_q_kv8(const MlaDecodeParams& p, const Smem& sm,
                                            const PieceRun& e, int row0, int ct) {
  const int n = ct >> 3, part = ct & 7;
  const int row = row0 + n;
  const bool live = row < p.num_rows;
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q) +
                           int64_t(e.req) * p.q_batch_stride +
                           (live ? int64_t(row / p.h_q) * p.q_seq_stride +
                                       int64_t(row % p.h_q) * p.q_head_stride
                                 : 0);
  const uint32_t* lat = reinterpret_cast<const uint32_t*>(q + 64 * part);
  float2 v[32];
  float mx = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    v[i] = unpack2<__nv_bfloat16>(live ? __ldg(lat + i) : 0u);
    mx = fmaxf(mx, fmaxf(fabsf(v[i].x), fabsf(v[i].y)));
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
  const int k = kv8_q_exponent(mx);
  const float up = __uint_as_float(uint32_t(127 + k) << 23);
  // k16 step 4 part + i: chunk 2 i holds dims 16 t + 4 i + {0, 1} (t < 4, k 2 t, 2 t + 1),
  // chunk 2 i + 1 dims 16 t + 4 i + {2, 3}. v[m] is dims 2 m, 2 m + 1.
  uint8_t* qb = sm.base + Tr::kQOff + part * Tr::kQBlockBytes;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint4 c;
      c.x = pack2<__half>(v[2 * i + u].x * up, v[2 * i + u].y * up);
      c.y = pack2<__half>(v[8 + 2 * i + u].x * up, v[8 + 2 * i + u].y * up);
      c.z = pack2<__half>(v[16 + 2 * i + u].x * up, v[16 + 2 * i + u].y * up);
      c.w = pack2<__half>(v[24 + 2 * i + u].x * up, v[24 + 2 * i + u].y * up);
      *reinterpret_cast<uint4*>(qb + swz16(n, 2 * i + u)) = c;
    }
  const uint32_t* rope = reinterpret_cast<const uint32_t*>(q + kLatentDim + 8 * part);
  uint4 r;
  r.x = live ? __ldg(rope) : 0u;
  r.y = live ? __ldg(rope + 1) : 0u;
  r.z = live ? __ldg(rope + 2) : 0u;
  r.w = live ? __ldg(rope + 3) : 0u;
  *reinterpret_cast<uint4*>(sm.base + Tr::kQOff + 8 * Tr::kQBlockBytes + swz16(n, part)) = r;
  if (part == 0) sm.q_inv()[n] = __uint_as_float(uint32_t(127 - k) << 23);
}

// ---- per piece ----
// This thread's query rows (accumulator columns c = 2 j + e): lim[c] = the tokens the row may see
// (its causal limit, at most the piece's end; 0 past num_rows), qinv[c] = its 2^-e; the running
// max m (log2 units, the same in every thread of the warpgroup), this thread's share l of the
// running sum, and the unit of O (the last tile's S_tile).
struct PieceState {
  int lim[4];
  float qinv[4];
  float m[4];
  float l[4];
  float unit;
};

// ---- one tile ----
// Token rows 16 w + g and + 8 of the tile in stage s: 16-byte chunk 4 G + t of their 512 codes
// (the scores' k16 steps 4 G .. 4 G + 3).
__device__ __forceinline__ void load_k_chunks(const Smem& sm, int s, int G, const Lane& ln,
                                              uint4& x0, uint4& x1) {
  const uint8_t* sp = sm.stage_ptr(s) + (G >> 1) * Tr::kLatBlockBytes;
  const int r0 = 16 * ln.w + ln.g, c = 4 * (G & 1) + ln.t;
  x0 = *reinterpret_cast<const uint4*>(sp + swz(r0, c));
  x1 = *reinterpret_cast<const uint4*>(sp + swz(r0 + 8, c));
}

// Issue S^T for the tile in stage s: the rope part (bf16, both operands in shared memory) into
// sr, the latent part (fp16 codes converted into A fragments, q16 in shared memory) into sl.
// A group per 64 dims, the next group's codes loaded before the wait for the one before (a
// wgmma reads its A registers asynchronously: at most two groups' fragments are in flight); on
// return only the last group may be pending.
template <int kFmt>
__device__ __forceinline__ void issue_scores(float (&sl)[8], float (&sr)[8], const Smem& sm,
                                             int s, const Lane& ln) {
  static_assert(kv8_code_unit<kFmt>() == 1.f, "sm_90a converts e4m3 codes to their values");
  const uint64_t dq = smem_desc_sw128(sm.q(), 16, 1024);
  const uint64_t dr = smem_desc_sw128(sm.stage(s) + Tr::kStageRopeOff, 16, 1024);
  uint4 x0, x1;
  load_k_chunks(sm, s, 0, ln, x0, x1);
  sm90a::reg_fence_all(sl);  // the last tile's softmax is done with them
  sm90a::reg_fence_all(sr);
  sm90a::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    sm90a::wgmma_ss_n16_bf16(sr, dr + (uint32_t(kk * 32) >> 4),
                             dq + (uint32_t(8 * Tr::kQBlockBytes + kk * 32) >> 4), kk > 0);
#pragma unroll
  for (int G = 0; G < 8; ++G) {
    const uint32_t w0[4] = {x0.x, x0.y, x0.z, x0.w}, w1[4] = {x1.x, x1.y, x1.z, x1.w};
    uint32_t a[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      kv8x4_to_f16<kFmt>(w0[i], a[i][0], a[i][2]);
      kv8x4_to_f16<kFmt>(w1[i], a[i][1], a[i][3]);
    }
    sm90a::wgmma_fence();  // the A fragments were written by ordinary instructions
#pragma unroll
    for (int i = 0; i < 4; ++i)
      sm90a::wgmma_rs_n16_f16(sl, a[i], dq + (uint32_t(G * Tr::kQBlockBytes + i * 32) >> 4),
                              G > 0 || i > 0);
    sm90a::wgmma_commit();
    if (G < 7) load_k_chunks(sm, s, G + 1, ln, x0, x1);
    sm90a::wgmma_wait<1>();
  }
}

// The thread's four tokens 16 kt + 2 t + {0, 1, 8, 9} of the tile in stage s, 16 codes each
// (dims 128 w + 16 g ..); tokens with their zero_mask bit set (past the piece's end) as zeros,
// so NaN in page padding never reaches the product.
template <bool kPartial>
__device__ __forceinline__ void load_v_chunks(const Smem& sm, int s, int kt, uint64_t zero_mask,
                                              const Lane& ln, uint32_t (&x)[4][4]) {
  const uint8_t* sp = sm.stage_ptr(s) + ln.w * Tr::kLatBlockBytes;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int tok = 16 * kt + 2 * ln.t + (u & 1) + 8 * (u >> 1);
    uint4 v = *reinterpret_cast<const uint4*>(sp + swz(tok, ln.g));
    if (kPartial && ((zero_mask >> tok) & 1u)) v = make_uint4(0u, 0u, 0u, 0u);
    x[u][0] = v.x, x[u][1] = v.y, x[u][2] = v.z, x[u][3] = v.w;
  }
}

// Issue O^T += V^T P'^T for the tile in stage s (P'^T in this warpgroup's P tile). A group per
// k16 step, the next step's codes loaded before the wait for the one before; all complete on
// return (a product pending across the tile loop's back edge makes ptxas serialize every wgmma,
// C7514, as the rescale of O reads the accumulators). kPartial: some tokens are past the
// piece's end (zero_mask != 0).
template <int kFmt, bool kPartial>
__device__ __forceinline__ void issue_output(float (&o)[8][8], const Smem& sm, int s,
                                             uint64_t zero_mask, const Lane& ln) {
  const uint64_t dp = smem_desc_sw128(sm.p_tile(ln.wg), 16, 1024);
  uint32_t x[4][4];
  load_v_chunks<kPartial>(sm, s, 0, zero_mask, ln, x);
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
    uint32_t a[8][4];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      // dims 2 c, 2 c + 1 of the thread's 16 (byte 2 c of the chunk): byte (c & 1) * 2 of word
      // c / 2. Pair the two tokens of a register: (tok_a[b], tok_b[b], tok_a[b+1], tok_b[b+1]).
      const uint32_t sel = (c & 1) ? 0x7362u : 0x5140u;
      kv8x4_to_f16<kFmt>(__byte_perm(x[0][c >> 1], x[1][c >> 1], sel), a[c][0], a[c][1]);
      kv8x4_to_f16<kFmt>(__byte_perm(x[2][c >> 1], x[3][c >> 1], sel), a[c][2], a[c][3]);
    }
    if (kt == 0)  // the rescale stays before the fence (later steps: o is in flight)
#pragma unroll
      for (int c = 0; c < 8; ++c) sm90a::reg_fence_all(o[c]);
    sm90a::wgmma_fence();
#pragma unroll
    for (int c = 0; c < 8; ++c)
      sm90a::wgmma_rs_n16_f16(o[c], a[c], dp + (uint32_t(kt * 32) >> 4), 1);
    sm90a::wgmma_commit();
    if (kt < 3) {
      load_v_chunks<kPartial>(sm, s, kt + 1, zero_mask, ln, x);
      sm90a::wgmma_wait<1>();
    } else {
      sm90a::wgmma_wait<0>();
    }
  }
}

// The scales of the thread's tokens 16 w + g + 8 h of the tile in stage s (page j of the tile
// at 256 j; a tile's pages hold 2^rows_shift of its tokens).
__device__ __forceinline__ void load_scales(const Smem& sm, int s, int rows_shift, const Lane& ln,
                                            float (&sc)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tok = 16 * ln.w + ln.g + 8 * h, j = tok >> rows_shift;
    sc[h] = *reinterpret_cast<const float*>(sm.stage_ptr(s) + Tr::kStageScaleOff + 256 * j +
                                            4 * (tok - (j << rows_shift)));
  }
}

// The online softmax of one tile (token tok0 of the request at tile token 0, the piece ending at
// token end; sc: the scales of the thread's tokens): the scores from sl, sr into P'^T (shared,
// fp16), O rescaled, m, l and the unit advanced. A score is seen when its token was copied (ok
// bit) and lies inside the row's limit; unseen ones give p = 0. The tile's max (and min, for the
// non-finite check) of each row and its largest scale come from the warpgroup's four warps
// through shared memory (red, by tile parity). As in the other kernels, a seen infinite score
// makes its row's p NaN. P'^T is fenced for the async proxy and published by the warpgroup's
// barrier at the end.
__device__ __forceinline__ void tile_softmax(float (&sl)[8], const float (&sr)[8],
                                             float (&o)[8][8], PieceState& ps, const Smem& sm,
                                             const float (&sc)[2], int tok0, int end, uint64_t ok,
                                             int parity, float scale_log2, const Lane& ln) {
  bool tok_in[2];
  float smax = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) tok_in[h] = ((ok >> (16 * ln.w + ln.g + 8 * h)) & 1u) != 0;
  float hi[4], lo[4];
  uint32_t seen = 0;  // bit i: score i takes part
#pragma unroll
  for (int c = 0; c < 4; ++c) hi[c] = -INFINITY, lo[c] = INFINITY;
  // Tiles inside every row's limit with every page copied (all but a piece's last tiles and bad
  // pages) take a branch without per-score tests.
  const bool whole =
      ok == ~0ull && tok0 + Tr::kBlockN <= min(min(ps.lim[0], ps.lim[1]), min(ps.lim[2], ps.lim[3]));
  if (__all_sync(0xffffffffu, whole)) {
    seen = 0xffu;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = (i >> 1) & 1, c = 2 * (i >> 2) + (i & 1);
      sl[i] = fmaf(sl[i], sc[h] * ps.qinv[c], sr[i]) * scale_log2;
      hi[c] = fmaxf(hi[c], sl[i]);
      lo[c] = fminf(lo[c], sl[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = (i >> 1) & 1, c = 2 * (i >> 2) + (i & 1);
      sl[i] = fmaf(sl[i], sc[h] * ps.qinv[c], sr[i]) * scale_log2;
      const bool in = tok_in[h] && tok0 + 16 * ln.w + ln.g + 8 * h < ps.lim[c];
      seen |= uint32_t(in) << i;
      hi[c] = fmaxf(hi[c], in ? sl[i] : -INFINITY);
      lo[c] = fminf(lo[c], in ? sl[i] : INFINITY);
    }
  }
  // The tile's largest scale over its tokens inside the piece (past its end a page row holds
  // anything).
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (tok_in[h] && tok0 + 16 * ln.w + ln.g + 8 * h < end) smax = fmaxf(smax, sc[h]);
#pragma unroll
  for (int d = 4; d <= 16; d <<= 1) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      hi[c] = fmaxf(hi[c], __shfl_xor_sync(0xffffffffu, hi[c], d));
      lo[c] = fminf(lo[c], __shfl_xor_sync(0xffffffffu, lo[c], d));
    }
    smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, d));
  }
  float* red = sm.red(ln.wg, parity, ln.w);
  if (ln.g == 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      red[ln.col(c)] = hi[c];
      red[Tr::kBlockM + ln.col(c)] = lo[c];
    }
    if (ln.t == 0) red[2 * Tr::kBlockM] = smax;
  }
  group_sync(ln.wg);
  float tmax = 0.f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float* rw = sm.red(ln.wg, parity, w);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      hi[c] = fmaxf(hi[c], rw[ln.col(c)]);
      lo[c] = fminf(lo[c], rw[Tr::kBlockM + ln.col(c)]);
    }
    tmax = fmaxf(tmax, rw[2 * Tr::kBlockM]);
  }
  // S_tile: the power of two at or above the largest scale (1 when every scale is 0).
  const float s_tile = tmax > 0.f ? pow2_at_least(tmax) : 1.f;
  const float inv_tile = pow2_inverse(s_tile);
  float f[4], m_use[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float m_new = fmaxf(ps.m[c], hi[c]);
    const bool infinite = hi[c] == INFINITY || lo[c] == -INFINITY;
    m_use[c] = infinite ? NAN : (m_new == -INFINITY ? 0.f : m_new);
    const float alpha = fast_exp2(ps.m[c] - (m_new == -INFINITY ? 0.f : m_new));
    f[c] = alpha == 0.f ? 0.f : alpha * (ps.unit * inv_tile);
    ps.l[c] *= alpha;
    ps.m[c] = m_new;
  }
  ps.unit = s_tile;
  // P' = p scale_t / S_tile into P'^T (row = query row, k = token).
  const uint32_t pt = sm.p_tile(ln.wg);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int h = (i >> 1) & 1, c = 2 * (i >> 2) + (i & 1);
    const float pv = ((seen >> i) & 1u) ? fast_exp2(sl[i] - m_use[c]) : 0.f;
    ps.l[c] += pv;
    const float u = ((seen >> i) & 1u) ? sc[h] * inv_tile : 0.f;
    const int tok = 16 * ln.w + ln.g + 8 * h, n = ln.col(c);
    const __half hv = __float2half_rn(pv * u);
    asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(pt + swz16(n, tok >> 3) + (tok & 7) * 2),
                 "h"(*reinterpret_cast<const unsigned short*>(&hv))
                 : "memory");
  }
  sm90a::fence_proxy_async_smem();
  if (__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f || f[2] != 1.f || f[3] != 1.f)) {
#pragma unroll
    for (int c8 = 0; c8 < 8; ++c8)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[c8][i] *= f[2 * (i >> 2) + (i & 1)];
  }
  group_sync(ln.wg);  // P'^T is complete for the product
}

}  // namespace kf::cuda::sm90a_kv8
