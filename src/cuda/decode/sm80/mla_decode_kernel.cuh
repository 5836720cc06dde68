// MLA decode, the portable tensor-core kernel (sm_80/86/89/90). One block = (worker, row tile).
//
// What: for each piece (request, token range) of its worker, o = softmax(scale q k^T) v over the
// piece's tokens for the tile's kBlockM query rows. A request's only piece writes out (q dtype)
// and lse; other pieces write o_accum (normalized by their own sum) and lse_accum for the combine.
//
// Tiling (mla_decode_traits.h): per KV tile of kBlockN tokens,
//   1. QK, split-K: warp (g, d) multiplies its rows' q[144 dims: the k16 steps d, d+4, ..., d+32]
//      (A fragments held in registers for the whole piece) by the tile's K (ldmatrix) and stores
//      partial scores. Interleaving the dim groups keeps each warp's swizzled addresses one base
//      plus constants.
//   2. softmax: each warp of the row group sums the 4 partials of kSoftRows rows in a fixed order,
//      masks (causal limit, piece end, bad pages), runs the online softmax in fp32 (exp2 with
//      scale*log2e folded in) and stores P (q dtype) and the rescale factor alpha per row.
//   3. PV: warp (g, d) rescales O[its rows, 128 dims: 16-dim blocks d, d+4, ..., d+28] by alpha
//      and adds P V, V being the first 512 dims of the same shared-memory tile (ldmatrix.trans).
//      M64 (kDeferPv): row group 1 runs step 3 one tile late, overlapping its mma work with
//      group 0's softmax.
// Memory: a kStages-deep cp.async ring of KV tiles (kAhead ahead of the one consumed; each warp
// copies a run of consecutive tokens of every tile, kv_tile_loader.cuh; the stream is marked
// evict-first in L2), zero-filled (src-size 0) past a piece's end
// and on bad pages so no NaN in page padding reaches an mma; 16-byte chunks XOR-swizzled by the
// token (a 1152-byte row stride would put the 8 rows of an ldmatrix in one bank group). The ring
// runs across piece boundaries: a worker's next piece streams in while the current one finishes.
// Shared memory: kStages * kBlockN * 1152 B of KV + 4 * kBlockM * kBlockN * 4 B of partial scores
// + P, q_pe and row stats; every configuration fits sm_86's 101376 bytes (static_assert in the
// traits): M16 86992 B, M32 89168 B, M64 85824 B. Registers (sm_86): 206 / 254 / 253, no spills.
// One row group with >= 2 tiles ahead (M32, 8-bit M16) waits for the next tile before the P
// barrier and skips the tile barrier: two barriers per tile instead of three.
// On sm_90 the kernel is launched as a programmatic dependent (pdl.cuh): it waits for the
// previous kernel at its first instruction.
// Measured (H200, s_k 4096, page 64, bf16, decode+combine in a CUDA graph, docs/status.md):
// h_q=16: 10.3 us at b=1, 3.7-3.8 TB/s (82-85%) at b=64, 3.9-4.1 TB/s (88-90%) at b=128;
// h_q=128: 222-236 TFLOPS at b=64..128 (35-38% of mma.sync's 625-630), in 32-row tiles on sm_90
// (mla_decode_launch.cu picks the row tile per device).
//
// 8-bit caches (kFmt e4m3 / int8, MlaTraits8*): the ring holds the page's sections (644 B per
// token, 16-byte cp.async, the scale with a 4-byte one, chunks swizzled like the 16-bit rows);
// QK reads the 8-bit bytes into registers and converts them while building the fp16 mma
// fragments (kv8_dequant.cuh, exact codes), and P V reuses those registers transposed
// (movmatrix); the scale multiplies the latent part of each score, and P' = p * scale_t /
// S_tile (fp16, S_tile a power of two) carries it into PV with O in units of S_tile; the running
// max is lazy (see the softmax). 16 rows per block for any row count. sm_86: 96272 B of shared
// memory, 216-241 registers, no spills. Measured (H200, h_q=16, b=64): FP8 1.29x bf16's speed at
// s_k 4096, 1.42-1.47x for s_k 16K-64K (77-81% of the read peak); INT8 1.22x / 1.28-1.35x. The tile loop is
// dependency-bound at two warps per scheduler, and its speed moves 8-11% with where it lands in
// the binary (research/perf/NOTES.md, fifth session).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/params.h"
#include "core/scheduler.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/metadata_check.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/decode/sm80/kv8_dequant.cuh"
#include "cuda/decode/sm80/kv_tile_loader.cuh"
#include "cuda/decode/sm80/mla_decode_sm80.h"  // the declarations (default kFmt)
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

// Column swizzles of the score and P buffers (bank-conflict-free fragment stores and ldmatrix).
template <int kBlockN>
__device__ __forceinline__ int score_swizzle(int row) {  // in floats
  return kBlockN == 16 ? ((row >> 1) & 1) << 3 : (row & 3) << 3;
}
template <int kBlockN>
__device__ __forceinline__ int p_swizzle(int row) {  // in 16-byte chunks
  return kBlockN == 16 ? (row >> 2) & 1 : (row >> 1) & 3;
}

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

// Metadata made for another call: every row of this block's share of requests is empty.
template <class Tr, typename T>
__device__ void write_empty_rows(const MlaDecodeParams& p, int row0) {
  T* out = static_cast<T*>(p.out);
  for (int r = blockIdx.x; r < p.batch; r += gridDim.x) {
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

// kSmallPages: a 16-bit cache whose pages hold fewer tokens than a warp copies per tile
// (kv_tile_loader.cuh); a separate instantiation so the usual one keeps its registers.
template <class Tr, typename T, int kFmt, bool kSmallPages = false>
__global__ void __launch_bounds__(Tr::kNumThreads, 1)
    mla_decode_sm80_kernel(const __grid_constant__ MlaDecodeParams p) {
  static_assert(Tr::kKv8 == (kFmt != kKvFmt16), "8-bit formats use the 8-bit traits");
  constexpr bool kKv8 = Tr::kKv8;
  // 8-bit: s = scale_t * 2^-e_row * (q16 . k_q) + q_pe . k_pe; P in fp16, normalized per tile.
  using PT = typename std::conditional<kKv8, __half, T>::type;  // P and the PV mma
  constexpr int kBlockN = Tr::kBlockN, kStages = Tr::kStages, kMFrags = Tr::kMFrags;
  constexpr int kNFrags = Tr::kNFrags, kQkSteps = Tr::kQkSteps, kPvFrags = Tr::kPvFrags;
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kSoftTokens = Tr::kSoftTokens, kSoftTpr = Tr::kSoftThreadsPerRow;
  // Two accumulator sets halve the dependent mma chain when a warp has one row fragment.
  // (A 32-token tile already has four independent n8 chains.)
  constexpr int kAccSets = (kMFrags == 1 && kBlockN == 16 && !kKv8) ? 2 : 1;
  constexpr int kAhead = Tr::kAhead;
  // One row group and two or more tiles ahead: the block-wide barrier of a tile's arrival
  // merges into the previous tile's P barrier (the score and P barriers then span the block),
  // two barriers per tile, not three. Two row groups sync only within a group there, so they
  // keep the tile barrier; so does a ring one tile ahead, which would wait for the tile it has
  // just started (measured on the H200: bf16 h_q=16 b=64 5% slower).
  constexpr bool kMergedTileBarrier = Tr::kRowGroups == 1 && kAhead >= 2;
  using Loader = KvTileLoader<Tr, T, kSmallPages>;  // each warp copies kBlockN / kNumWarps tokens

  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = warp / Tr::kDimGroups, d = warp % Tr::kDimGroups;
  const int w = blockIdx.x;
  const int row0 = blockIdx.y * Tr::kBlockM;
  // Launched as a programmatic dependent (pdl.cuh): wait for the previous kernel in the stream
  // (it may have written q, the cache, the block table or the metadata) before any read.
  pdl_wait();
  if (tid == 0) {
    // Touch the worker's metadata row now, in parallel with the header reads below: thread 0
    // then finds it in L1 when it collects the pieces.
    const int32_t* wk = meta_worker(p.metadata, w);
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(wk));
  }
  if (!metadata_matches(p)) {
    if (w == 0 && blockIdx.y == 0 && tid == 0)
      report_device_error(p.error_buffer, kDevErrMetadata, 0, p.metadata[kMetaMagicIdx]);
    write_empty_rows<Tr, T>(p, row0);
    return;
  }

  float* spart = reinterpret_cast<float*>(smem + Tr::kSpartOff);
  float* alpha_s = reinterpret_cast<float*>(smem + Tr::kAlphaOff);
  float* inv_l_s = reinterpret_cast<float*>(smem + Tr::kInvLOff);
  float* m_s = reinterpret_cast<float*>(smem + Tr::kRowMaxOff);
  float* l_s = reinterpret_cast<float*>(smem + Tr::kRowSumOff);
  int* vis_s = reinterpret_cast<int*>(smem + Tr::kVisOff);
  uint8_t* tok_ok = smem + Tr::kTokOkOff;
  PieceRun* pieces = reinterpret_cast<PieceRun*>(smem + Tr::kPieceOff);
  int* counts = reinterpret_cast<int*>(smem + Tr::kPieceOff + Tr::kMaxPieces * sizeof(PieceRun));
  const uint32_t kv_smem = smem_u32(smem + Tr::kKvOff);
  const uint32_t p_smem = smem_u32(smem + Tr::kPOff);
  const uint32_t qpe_smem = smem_u32(smem + Tr::kQpeOff);

  float* unit_s = reinterpret_cast<float*>(smem + Tr::kUnitOff);
  const T* q = static_cast<const T*>(p.q);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;

  // Softmax mapping: thread -> (row srow of the block, tokens st0 .. st0 + kSoftTokens - 1).
  const int srow = g * Tr::kRowsPerGroup + d * Tr::kSoftRows + lane / kSoftTpr;
  const int st0 = (lane % kSoftTpr) * kSoftTokens;

  for (int first = 0;; first += Tr::kMaxPieces) {
    if (tid == 0) collect_pieces<Tr>(p, w, first, pieces, counts);
    __syncthreads();
    const int n = counts[0], total = counts[1];

    // ---- producer: the next tile to load (every warp tracks it and copies its share). Its
    // piece's end and request live in registers: reading them from the piece list for every tile
    // put a shared-memory round trip in front of each range check and cp.async (ncu, H200). ----
    auto producer_at = [&](int pi) -> TileProducer {
      if (pi >= n) return {n, 0, 0, 0};
      return {pi, pieces[pi].begin, pieces[pi].end, pieces[pi].req};
    };
    auto skip_done_pieces = [&](TileProducer& pr) {
      while (pr.pi < n && pr.tok >= pr.end) pr = producer_at(pr.pi + 1);
    };
    // The warp and lane come from a fresh %tid.x: captured from the kernel's start they kept two
    // more registers live through the 255-register h_q = 128 loop, which then ran 8% slower.
    using Pages = typename Loader::Pages;
    auto issue = [&](const TileProducer& pr, const Pages& pg, int slot) {
      const int t = fresh_tid();
      Loader::issue(p, pr, pg, kv_smem + slot * Tr::kKvTileBytes, tok_ok + slot * kBlockN, t >> 5,
                    t & 31);
    };
    auto lookup = [&](const TileProducer& pr) {
      const int t = fresh_tid();
      return Loader::pages(p, pr, t >> 5, t & 31);
    };

    TileProducer prod = producer_at(0);
    skip_done_pieces(prod);
    Pages prod_page;
    {
      // Prologue: look up the pages of the first kAhead + 1 tiles together (one latency, not
      // kAhead + 1), then start kAhead of them.
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
    int read_slot = 0;  // the tile being consumed; slot read_slot + kAhead is refilled
    // Start the tile kAhead ahead in the free slot and look up the page of the one after it
    // (used one tile later: its latency is hidden).
    auto refill = [&]() {
      issue(prod, prod_page, (read_slot + kAhead) % kStages);
      prod.tok += kBlockN;
      if (prod.tok >= prod.end) skip_done_pieces(prod);  // a piece ended (or all did)
      prod_page = lookup(prod);
    };

    for (int pi = 0; pi < n; ++pi) {
      const int tok_begin = pieces[pi].begin, tok_end = pieces[pi].end;
      // Row indices of the per-piece code are recomputed from a fresh %tid.x: hoisted out of the
      // piece loop they would be live through the tile loop, where every register is taken.
      const int lane = fresh_tid() & 31;

      // q fragments of this warp: rows g*kRowsPerGroup + mf*16 + lane/4 (+8), dims of group d.
      // The last k-step (the rope dims 512..575) goes to shared memory instead and is read with
      // ldmatrix every tile: it frees 4 kMFrags registers for a negligible share of smem traffic.
      // 8-bit: fp16 fragments of dims 128 d + 32 t .. (kv8_dequant.cuh), q_unscale = 2^-e_row.
      uint32_t qf[kMFrags][kQkSteps - 1][4];
      [[maybe_unused]] float q_unscale[kMFrags][2];
#pragma unroll
      for (int mf = 0; mf < kMFrags; ++mf) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int row = row0 + g * Tr::kRowsPerGroup + mf * 16 + (lane >> 2) + hf * 8;
          const bool valid = row < p.num_rows;
          const int s = valid ? row / p.h_q : 0, h = valid ? row % p.h_q : 0;
          const T* qrow = q + int64_t(pieces[pi].req) * p.q_batch_stride +
                          int64_t(s) * p.q_seq_stride + int64_t(h) * p.q_head_stride;
          if constexpr (kKv8) {
            static_assert(kQkSteps - 1 == 8, "");
            // (times 1 / kv8_code_unit: the fragments hold the codes times that unit)
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
      {
        // The group's own rows only: the other row group may still be reading its q_pe. Readers
        // see it after the first tile's __syncthreads (a piece without tiles reads nothing).
        const int gt = d * 32 + lane;
#pragma unroll
        for (int i = gt; i < Tr::kRowsPerGroup * 8; i += Tr::kDimGroups * 32) {
          const int r = g * Tr::kRowsPerGroup + i / 8, c = i % 8, row = row0 + r;
          uint32_t v[4] = {0u, 0u, 0u, 0u};
          if (row < p.num_rows) {
            const uint32_t* src = reinterpret_cast<const uint32_t*>(
                q + int64_t(pieces[pi].req) * p.q_batch_stride +
                int64_t(row / p.h_q) * p.q_seq_stride + int64_t(row % p.h_q) * p.q_head_stride +
                kLatentDim + c * 8);
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = __ldg(src + k);
          }
          *reinterpret_cast<uint4*>(smem + Tr::kQpeOff + r * 128 + ((c ^ (r & 7)) << 4)) =
              make_uint4(v[0], v[1], v[2], v[3]);
        }
      }
      float o_acc[kMFrags][kPvFrags][4];
#pragma unroll
      for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
        for (int nf = 0; nf < kPvFrags; ++nf)
#pragma unroll
          for (int k = 0; k < 4; ++k) o_acc[mf][nf][k] = 0.f;

      // Softmax state of row srow lives in shared memory (registers are the scarce resource
      // here), one slot per thread: running max, this thread's share of the running sum, and the
      // row's causal limit.
      {
        const int t = fresh_tid();
        const int row = row0 + srow;
        m_s[t] = -INFINITY;
        l_s[t] = 0.f;
        if constexpr (kKv8) unit_s[t] = 1.f;
        vis_s[t] = row < p.num_rows ? visible_len(pieces[pi].seqlen, p.s_q, row / p.h_q) : 0;
      }

      // ---- 3. O = alpha * O + P V over this warp's 128 output dims, for the ring tile at byte
      // offset `tile_off` (a lambda: kDeferPv's row group 1 runs it for the previous tile) ----
      // 8-bit: the tile's latent codes converted once, in QK, kept for P.V (kv8_pv_from_k).
      [[maybe_unused]] uint32_t kb[kKv8 ? kNFrags : 1][8][2];
      auto pv = [&](const int tile_off) {
        // Once the running max settles alpha is exactly 1: skipping the multiply is then
        // bit-identical and saves 64 kMFrags instructions per tile.
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
            ldmatrix_x4(pa[mf], p_smem + r * kBlockN * 2 + (chunk << 4));
          }
          if constexpr (kKv8) {
            kv8_pv_from_k<kNFrags>(o_acc[0], pa[0], kb, kt);
          } else {
            // ldmatrix.x4.trans rows: tokens (lane & 7) + 8 * ((lane >> 3) & 1), chunk + lane/16;
            // pair j holds dims 16 (4 j + d) .. + 15, chunks 8 j + 2 d (+1).
            const uint32_t v_addr = kv_smem + tile_off +
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
      };

      for (int tile_tok = tok_begin; tile_tok < tok_end; tile_tok += kBlockN) {
        // Tile read_slot landed; slot read_slot + kAhead (the tile before the previous one with
        // kDeferPv, else the previous one) is free. With one row group, only a piece's first
        // tile needs this barrier: later tiles landed at the previous tile's P barrier.
        if (!kMergedTileBarrier || tile_tok == tok_begin) {
          cp_async_wait<kAhead - 1>();
          __syncthreads();
        }
        // Deferred P V (M64): row group 1 finishes the previous tile of this piece first. Its P
        // and alpha rows are its own, and softmax(t) rewrites them only after the group's
        // barrier behind QK(t), which every warp of the group passes after this.
        if (Tr::kDeferPv && g == 1 && tile_tok != tok_begin)
          pv(((read_slot + kStages - 1) % kStages) * Tr::kKvTileBytes);

        const int tile_off = read_slot * Tr::kKvTileBytes;
        const uint32_t tile = kv_smem + tile_off;
        [[maybe_unused]] const uint8_t* tile8 = smem + Tr::kKvOff + tile_off;
        [[maybe_unused]] const float* tile_scale = reinterpret_cast<const float*>(tile8 + Tr::kKv8ScaleOff);

        // 8-bit: the tile's largest token scale (every warp finds it from the scales its QK
        // reads: a quad of lanes holds all kBlockN of them).
        [[maybe_unused]] float tile_smax = 0.f;
        // ---- 1. partial scores over this warp's 144 dims ----
        {
          float s_acc[kAccSets][kMFrags][kNFrags][4];
#pragma unroll
          for (int a = 0; a < kAccSets; ++a)
#pragma unroll
            for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
              for (int nf = 0; nf < kNFrags; ++nf)
#pragma unroll
                for (int k = 0; k < 4; ++k) s_acc[a][mf][nf][k] = 0.f;
          uint32_t qpe[kMFrags][4];  // the rope step's A fragments (q_pe, from shared memory)
#pragma unroll
          for (int mf = 0; mf < kMFrags; ++mf) {
            const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane & 15);
            ldmatrix_x4(qpe[mf], qpe_smem + r * 128 + (((2 * d + (lane >> 4)) ^ (r & 7)) << 4));
          }
          if constexpr (kKv8) {
            // Latent dims 128 d .. + 127 from the 8-bit codes, then s = scale_t 2^-e_row s.
            kv8_qk_latent_keep<kFmt, kNFrags>(s_acc[0][0], qf[0], tile8, d, lane, kb);
#pragma unroll
            for (int nf = 0; nf < kNFrags; ++nf) {
              const float2 sc2 =
                  *reinterpret_cast<const float2*>(tile_scale + nf * 8 + 2 * (lane & 3));
              tile_smax = fmaxf(tile_smax, fmaxf(sc2.x, sc2.y));
#pragma unroll
              for (int k = 0; k < 4; ++k)
                s_acc[0][0][nf][k] *= ((k & 1) ? sc2.y : sc2.x) * q_unscale[0][k >> 1];
            }
            static_assert(!kKv8 || kNFrags * 8 == kBlockN, "a quad's scales cover the tile");
            tile_smax = fmaxf(tile_smax, __shfl_xor_sync(0xffffffffu, tile_smax, 1));
            tile_smax = fmaxf(tile_smax, __shfl_xor_sync(0xffffffffu, tile_smax, 2));
            // The rope step: dims 512 + 16 d .. + 15, bf16 in the cache (fp16 q: converted,
            // exact inside fp16's range). ldmatrix.x4 rows: tokens (lane & 7) + 8 (lane >> 4),
            // chunk 2 d + ((lane >> 3) & 1) of the 128-byte rope rows.
            const uint32_t r_addr = tile + Tr::kKv8RopeOff +
                                    ((lane & 7) + ((lane >> 4) << 3)) * (kRopeDim * 2) +
                                    (((2 * d + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
#pragma unroll
            for (int np = 0; np < kNFrags / 2; ++np) {
              uint32_t b[4];
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
          } else {
            // ldmatrix.x4 rows: tokens (lane & 7) + 8 * (lane >> 4), chunk + ((lane >> 3) & 1).
            // Step ks covers chunks 8 ks + 2 d (+1): the swizzle only touches the low 3 bits, so
            // one base address serves every step.
            const uint32_t k_addr = tile + ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes +
                                    (((2 * d + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
#pragma unroll
            for (int ks = 0; ks < kQkSteps; ++ks) {
#pragma unroll
              for (int np = 0; np < kNFrags / 2; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, k_addr + np * 16 * kRowBytes + ks * 128);
#pragma unroll
                for (int mf = 0; mf < kMFrags; ++mf) {
                  const uint32_t(&a)[4] =
                      ks == kQkSteps - 1 ? qpe[mf] : qf[mf][ks < kQkSteps - 1 ? ks : 0];
                  mma_16816<T>(s_acc[ks % kAccSets][mf][2 * np], a, b[0], b[1]);
                  mma_16816<T>(s_acc[ks % kAccSets][mf][2 * np + 1], a, b[2], b[3]);
                }
              }
            }
          }
          // Refill the free slot (everyone passed this tile's __syncthreads) while
          // the mma results are in flight.
          if (!kMergedTileBarrier) refill();
#pragma unroll
          for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane >> 2) + hf * 8;
              float* dst = spart + (d * Tr::kBlockM + r) * kBlockN;
              const int swz = score_swizzle<kBlockN>(r);
#pragma unroll
              for (int nf = 0; nf < kNFrags; ++nf) {
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
        named_barrier(1 + g, Tr::kDimGroups * 32);
        // Every warp is past QK of this tile, so past P V of the previous one: its slot is free.
        if (kMergedTileBarrier) refill();

        // ---- 2. online softmax of row srow over this tile ----
        {
          float sc[kSoftTokens];
#pragma unroll
          for (int k = 0; k < kSoftTokens; ++k) sc[k] = 0.f;
          const int swz = score_swizzle<kBlockN>(srow);
#pragma unroll
          for (int dd = 0; dd < Tr::kDimGroups; ++dd) {
            const float* src = spart + (dd * Tr::kBlockM + srow) * kBlockN + (st0 ^ swz);
            if constexpr (kSoftTokens == 4) {
              const float4 v = *reinterpret_cast<const float4*>(src);
              sc[0] += v.x, sc[1] += v.y, sc[2] += v.z, sc[3] += v.w;
            } else {
              const float2 v = *reinterpret_cast<const float2*>(src);
              sc[0] += v.x, sc[1] += v.y;
            }
          }
          const float m_run = m_s[tid];
          const int vis_end = vis_s[tid];
          const float l_run = l_s[tid];
          float mx = -INFINITY;
#pragma unroll
          for (int k = 0; k < kSoftTokens; ++k) {
            const bool valid = tok_ok[read_slot * kBlockN + st0 + k] && tile_tok + st0 + k < vis_end;
            sc[k] = valid ? sc[k] * scale_log2 : -INFINITY;
            mx = fmaxf(mx, sc[k]);
          }
          // 16-bit: the running max follows every tile's max exactly, so the dominant token's P
          // is exactly 1 in bf16. A lazy max (moving only past +8 in log2 units) measured 7%
          // faster at h_q = 128 on the H200 but put bf16 outputs at the 1e-5 cosine-distance
          // limit (research/perf/NOTES.md), so it is not used there.
          // 8-bit: P' = p s_t / unit is an fp16 value that is never exactly 1 anyway, so the max
          // is lazy: it moves only when a score passes it by 8 (p <= 2^8, far inside fp16), found
          // with one vote; the row reduction (three shuffle steps) runs only then, and alpha
          // stays exactly 1 in between (no O rescale).
          float m_new;
          if (!kKv8 || __any_sync(0xffffffffu, mx > m_run + 8.f)) {
#pragma unroll
            for (int o = 1; o < kSoftTpr; o <<= 1)
              mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
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
          l_s[tid] = l_run * alpha + ps;
          m_s[tid] = m_new;
          float o_alpha = alpha;
          if constexpr (kKv8) {
            // O moves to units of the power of two at or above this tile's largest scale (a
            // tile of unloaded tokens keeps the old unit: their scales were zero-filled), so
            // P' = p s_t / unit <= 1 stays out of fp16's subnormals for the tile's largest
            // tokens. PV multiplies the unscaled codes, so P carries the token scales. Powers of
            // two make 1 / unit and the O rescale exact, and the unit moves only when the
            // largest scale crosses one (O is rescaled only then or when the max moves).
            const float unit_prev = unit_s[tid];
            const float unit = tile_smax > 0.f ? pow2_at_least(tile_smax) : unit_prev;
            const float inv_unit = pow2_inverse(unit);
            o_alpha = alpha * (unit_prev * inv_unit);
            unit_s[tid] = unit;
#pragma unroll
            for (int k = 0; k < kSoftTokens; ++k) sc[k] *= tile_scale[st0 + k] * inv_unit;
          }
          if (lane % kSoftTpr == 0) alpha_s[srow] = o_alpha;
          uint8_t* pdst = smem + Tr::kPOff + srow * kBlockN * 2 +
                          (((st0 >> 3) ^ p_swizzle<kBlockN>(srow)) << 4) + (st0 & 7) * 2;
#pragma unroll
          for (int k = 0; k < kSoftTokens; k += 2)
            *reinterpret_cast<uint32_t*>(pdst + k * 2) = pack2<PT>(sc[k], sc[k + 1]);
        }
        // The piece's next tile (this thread's copies) before the P barrier, which then also
        // publishes that tile to every thread.
        if (kMergedTileBarrier && tile_tok + kBlockN < tok_end) cp_async_wait<kAhead - 1>();
        named_barrier(1 + g, Tr::kDimGroups * 32);

        // ---- 3. P V (row group 1 of kDeferPv runs it one tile late, see above) ----
        if (!Tr::kDeferPv || g == 0) pv(tile_off);
        read_slot = read_slot + 1 == kStages ? 0 : read_slot + 1;
      }
      // Row group 1's deferred P V of the piece's last tile (its slot is refilled two tiles on).
      if (Tr::kDeferPv && g == 1 && tok_end > tok_begin)
        pv(((read_slot + kStages - 1) % kStages) * Tr::kKvTileBytes);

      // ---- epilogue: normalize by the row sums, write out/lse or the split partials ----
      {
        const PieceRun e = pieces[pi];
        const int lane = fresh_tid() & 31;
        // The previous piece's epilogue may still be reading inv_l_s (an empty piece has no tile
        // barrier in between).
        named_barrier(1 + g, Tr::kDimGroups * 32);
        float l = l_s[fresh_tid()];
#pragma unroll
        for (int o = 1; o < kSoftTpr; o <<= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane % kSoftTpr == 0) {
          const float m_run = m_s[fresh_tid()];
          const bool empty = !(l > 0.f);
          float unit = 1.f;  // 8-bit caches: O is in units of the last tile's largest scale
          if constexpr (kKv8) unit = unit_s[fresh_tid()] * (1.f / kv8_code_unit<kFmt>());
          inv_l_s[srow] = empty ? 0.f : unit / l;
          const int row = row0 + srow;
          if (row < p.num_rows && e.write != kWriteNone) {
            const float lse = empty ? -INFINITY : (m_run + __log2f(l)) * 0.6931471805599453f;
            const int s = row / p.h_q, h = row % p.h_q;
            if (e.write == kWriteOut)
              p.lse[(int64_t(e.req) * p.h_q + h) * p.s_q + s] = lse;
            else
              p.lse_accum[int64_t(e.piece) * p.num_rows + row] = lse;
          }
        }
        named_barrier(1 + g, Tr::kDimGroups * 32);
        if constexpr (kKv8) {
          // 8-bit: a thread's row holds 32 consecutive output dims, 128 d + 32 t .. + 31
          // (kv8_dequant.cuh's permuted P V dims). Stored as they lie, each store instruction
          // touched 32 sectors for 8 bytes each, 4x the 16-bit path's count: on the H200 the fp8
          // epilogue took ~4.3 us per piece vs ~1 us for bf16 (per-step timeline, b = 1). A quad
          // transpose first makes each instruction cover 16 consecutive dims of one thread's run:
          // lane t then stores dims 32 s + 16 b + 4 t .. + 3 (s = the source thread).
          if (e.write != kWriteNone) {
            const int t = lane & 3;
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int r = g * Tr::kRowsPerGroup + (lane >> 2) + hf * 8;
              const int row = row0 + r;
              const float inv = inv_l_s[r];
              const int s_q = row / p.h_q, h_q = row % p.h_q;
#pragma unroll
              for (int b = 0; b < 2; ++b) {
                // a[j]: dims 16 b + 4 j .. + 3 of this thread's run: dim 2 f + e is o[f][e + 2 hf].
                float4 a[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  const int f = 8 * b + 2 * j;
                  a[j] = make_float4(o_acc[0][f][2 * hf] * inv, o_acc[0][f][2 * hf + 1] * inv,
                                     o_acc[0][f + 1][2 * hf] * inv, o_acc[0][f + 1][2 * hf + 1] * inv);
                }
                quad_transpose(a, t);  // a[s]: dims 16 b + 4 t .. of thread s's run
                if (row >= p.num_rows) continue;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                  const int col = d * 128 + 32 * s + 16 * b + 4 * t;
                  if (e.write == kWriteOut) {  // out rows are only 4-byte aligned
                    T* o = static_cast<T*>(p.out) + int64_t(e.req) * p.o_batch_stride +
                           int64_t(s_q) * p.o_seq_stride + int64_t(h_q) * p.o_head_stride + col;
                    reinterpret_cast<uint32_t*>(o)[0] = pack2<T>(a[s].x, a[s].y);
                    reinterpret_cast<uint32_t*>(o)[1] = pack2<T>(a[s].z, a[s].w);
                  } else {  // (evict-last here made FP8 2% slower at s_k 16K: not used)
                    *reinterpret_cast<float4*>(p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim +
                                               col) = a[s];
                  }
                }
              }
            }
          }
        } else if (e.write != kWriteNone) {
#pragma unroll
          for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int r = g * Tr::kRowsPerGroup + mf * 16 + (lane >> 2) + hf * 8;
              const int row = row0 + r;
              if (row >= p.num_rows) continue;
              const float inv = inv_l_s[r];
              // Output pair i (i < kPvFrags) of this thread's row: fragment i, dims d * 16 + 2 t +
              // 64 (i / 2) + 8 (i % 2): a quad's 4 pairs are 32 consecutive bytes (one sector).
              auto pair = [&](int i, int& col, float& v0, float& v1) {
                col = d * 16 + 2 * (lane & 3) + (i >> 1) * 64 + (i & 1) * 8;
                v0 = o_acc[mf][i][2 * hf] * inv;
                v1 = o_acc[mf][i][2 * hf + 1] * inv;
              };
              if (e.write == kWriteOut) {
                const int s = row / p.h_q, h = row % p.h_q;
                T* o = static_cast<T*>(p.out) + int64_t(e.req) * p.o_batch_stride +
                       int64_t(s) * p.o_seq_stride + int64_t(h) * p.o_head_stride;
#pragma unroll
                for (int i = 0; i < kPvFrags; ++i) {
                  int col;
                  float v0, v1;
                  pair(i, col, v0, v1);
                  *reinterpret_cast<uint32_t*>(o + col) = pack2<T>(v0, v1);
                }
              } else {
                // Marked evict-last in L2 (mma_sm80.cuh): measured on the H200, bf16 h_q 16
                // b = 128 s_k 4096 158.3 -> 155.8 us, s_k 16K 578 -> 569; h_q >= 32 within 1%.
                float* o = p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim;
#pragma unroll
                for (int i = 0; i < kPvFrags; ++i) {
                  int col;
                  float v0, v1;
                  pair(i, col, v0, v1);
                  st_global_keep(o + col, make_float2(v0, v1), l2_evict_last_policy());
                }
              }
            }
        }
      }
    }
    cp_async_wait<0>();
    if (first + Tr::kMaxPieces >= total) break;
    __syncthreads();  // everyone is done with this round's piece list
  }
  pdl_launch_dependents();  // this block is done: a dependent kernel may start launching
}

// Launch one configuration; the attribute is set per call (cheap, allowed during capture).
template <class Tr, typename T, int kFmt>
cudaError_t run_mla_decode_sm80(const MlaDecodeParams& p, cudaStream_t stream) {
  auto kernel = mla_decode_sm80_kernel<Tr, T, kFmt>;
  if constexpr (!Tr::kKv8) {
    if (p.page_size < KvTileLoader<Tr, T>::kTok) kernel = mla_decode_sm80_kernel<Tr, T, kFmt, true>;
  }
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.num_workers, ceil_div(p.num_rows, Tr::kBlockM));
  // cudaLaunchKernelEx reports the launch's own errors; no cudaGetLastError after it.
  return launch_pdl(kernel, grid, dim3(Tr::kNumThreads), Tr::kSmemBytes, stream, p);
}

// Blocks of this configuration that fit on one SM of `device` (2 on sm_90 for the 16- and
// 32-row tiles: a second block hides the first one's per-tile latency; 1 on sm_80/86/89), from
// the kernel's registers and shared memory and the device's per-SM limits.
template <class Tr, typename T, int kFmt>
int mla_decode_sm80_blocks_per_sm(int device) {
  cudaFuncAttributes a;
  int smem_sm = 0, regs_sm = 0, threads_sm = 0, reserved = 0;
  if (cudaFuncGetAttributes(&a, mla_decode_sm80_kernel<Tr, T, kFmt>) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&regs_sm, cudaDevAttrMaxRegistersPerMultiprocessor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&threads_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  const int by_smem = smem_sm / (Tr::kSmemBytes + int(a.sharedSizeBytes) + reserved);
  const int warp_regs = (a.numRegs + 7) / 8 * 8 * 32;  // allocated per warp in units of 256
  const int by_regs = regs_sm / (warp_regs * Tr::kNumWarps);
  const int by_threads = threads_sm / Tr::kNumThreads;
  const int n = by_smem < by_regs ? (by_smem < by_threads ? by_smem : by_threads)
                                  : (by_regs < by_threads ? by_regs : by_threads);
  return n < 1 ? 1 : n;
}

// Explicit instantiation of one configuration (one .cu file per family, so a small machine builds
// them in parallel).
#define KF_DECODE_INSTANTIATE(Tr, T, F)                                                       \
  template cudaError_t run_mla_decode_sm80<Tr, T, F>(const MlaDecodeParams&, cudaStream_t); \
  template int mla_decode_sm80_blocks_per_sm<Tr, T, F>(int);

}  // namespace kf::cuda
