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
//         O_R = scale_A scale_B O_R + (scale_B P_A) V_A,R    (P_A scaled, from shared memory)
//         O_R = O_R + P_B V_B,R                              (P_B from registers)
//   wg 0  O_L = scale_B O_L + P_B V_B,L                      (P_B from shared memory)
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
// Parts: sm90a_block.cuh (shared memory, a thread's place, the hand-offs), sm90a_copies.cuh
// (tensor copies of a tile, Q), sm90a_mma.cuh (the wgmma products), sm90a_softmax.cuh (the online
// softmax and P), sm90a_step.cuh (one step of each warpgroup); this file: a piece's epilogue, a
// piece, a worker's rounds of pieces, the kernel and its launch.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm90a/mla_decode_sm90a.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"
#include "cuda/decode/sm90a/sm90a_step.cuh"
#include "cuda/decode/sm90a/wgmma_sm90a.cuh"

namespace kf::cuda {
namespace sm90a {

// The piece's epilogue for this thread's rows rbase, rbase + 8: l = the quad's shares (a fixed
// order), then the two warpgroups' sums through shared memory (warpgroup 0's + warpgroup 1's in
// both: the same bits), 1 / l (0 for a row that saw nothing), lse = (m + log2 l) ln 2 (-inf for
// such a row; NaN when l is) by warpgroup 0, and O / l of this warpgroup's dims to out or
// o_accum. m is the shared running max, last stored by warpgroup 1 before its kScaleB hand-off of
// the last step. O goes through shared memory (the KV slots, which no copy or product of the
// piece uses any more once both warpgroups passed the first barrier below) and leaves as one
// bulk copy per row (out's rows are 16-byte aligned by the call contract, o_accum's by the
// workspace's), issued by thread `row` of the block. The next piece waits for the copies' reads
// before its tile copies overwrite the slots (run_piece).
template <typename T>
__device__ __forceinline__ void piece_epilogue(const MlaDecodeParams& p, const Smem& sm,
                                               const PieceRun& e, const RowState& st,
                                               const float (&o)[128], int row0,
                                               const Lane& ln) {
  float* row_sum = sm.row_sum();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if ((ln.lane & 3) == 0) row_sum[ln.g * Tr::kBlockM + ln.rbase + 8 * h] = l;
  }
  named_barrier(kBarBoth, Tr::kNumThreads);  // both warpgroups' sums (and the last m) are stored
  if (e.write == kWriteNone) return;
  const bool to_out = e.write == kWriteOut;
  const int col0 = ln.g * (kLatentDim / 2) + 2 * (ln.lane & 3);
  const uint32_t stage = sm.slot(0);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = ln.rbase + 8 * h;
    const float l = row_sum[r] + row_sum[Tr::kBlockM + r];
    const bool empty = l == 0.f;
    const float inv = empty ? 0.f : 1.f / l;
    const int row = row0 + r;
    const int s = row / p.h_q, hq = row % p.h_q;
    if (ln.g == 0 && (ln.lane & 3) == 0 && row < p.num_rows) {
      const float m = sm.row_max()[r];
      const float lse = empty ? -INFINITY : (m + __log2f(l)) * 0.6931471805599453f;
      if (to_out)
        p.lse[(int64_t(e.req) * p.h_q + hq) * p.s_q + s] = lse;
      else
        p.lse_accum[int64_t(e.piece) * p.num_rows + row] = lse;
    }
    if (to_out) {
      const uint32_t dst = stage + r * Tr::kStageOutRowBytes + col0 * 2;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        st_shared_u32(dst + 16 * j, pack2<T>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv));
    } else {
      const uint32_t dst = stage + r * Tr::kStageAccumRowBytes + col0 * 4;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        st_shared_f32x2(dst + 32 * j, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    }
  }
  fence_proxy_async_smem();
  named_barrier(kBarBoth, Tr::kNumThreads);  // the staged rows are visible to the bulk copies
  const int r = ln.g * kGroupThreads + ln.gtid;
  const int row = row0 + r;
  if (r >= Tr::kBlockM || row >= p.num_rows) return;
  if (to_out) {
    T* out = static_cast<T*>(p.out) + int64_t(e.req) * p.o_batch_stride +
             int64_t(row / p.h_q) * p.o_seq_stride + int64_t(row % p.h_q) * p.o_head_stride;
    bulk_store(out, stage + r * Tr::kStageOutRowBytes, kLatentDim * 2);
  } else {
    bulk_store_keep(p.o_accum + (int64_t(e.piece) * p.num_rows + row) * kLatentDim,
                    stage + r * Tr::kStageAccumRowBytes, kLatentDim * 4, l2_evict_last_policy());
  }
  bulk_commit();
}

// One piece: both warpgroups are past the previous piece (its wgmmas read Q, the P tiles and the
// slots; its epilogue read the row sums and maxima); the copies of tiles 0 and 1 start, Q is
// stored and the running max reset; each warpgroup scores its first tile, then the steps.
// ph: this thread's phase bits (kSlotBit: the slot this warpgroup scores).
// first_piece: the worker's first (for the timeline build's stamps).
template <typename T>
__device__ __forceinline__ void run_piece(const PieceWalk& w, int row0, uint32_t& ph,
                                          const Lane& ln, int tid, bool first_piece) {
  const Smem& sm = w.sm;
  const PieceRun& e = w.e;
  bulk_wait_read();  // the last piece's O has left the slots
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
    // A row past num_rows (its Q zero-filled, its O and lse never stored) sees the piece as a
    // row without a causal limit does, so a warp holding such rows still takes the softmax's
    // branch for whole tiles (tile_softmax) on every tile but the piece's last.
    const int vis = row < w.p.num_rows ? visible_len(e.seqlen, w.p.s_q, row / w.p.h_q) : e.end;
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
  if (first_piece) KF_TIMELINE_STAMP(w.p.timeline, kTlDecode, kTlFirstTile, tid);
  for (int i = 0; 2 * i < w.n_tiles; ++i) {
    if (ln.g == 0)
      step_group0<T>(w, i, s, o, st, q8, ph, ln);
    else
      step_group1<T>(w, i, s, o, st, q8, ph, ln);
  }
  // The worker's first piece; every piece's (the last one's stays in the buffer).
  if (first_piece) KF_TIMELINE_STAMP(w.p.timeline, kTlDecode, kTlFirstEpi, tid);
  KF_TIMELINE_STAMP(w.p.timeline, kTlDecode, kTlLastEpi, tid);
  piece_epilogue<T>(w.p, sm, e, st, o, row0, ln);
}

// The rounds of up to kMaxPieces pieces of worker w: thread 0 collects a round's pieces, then
// every piece of the round runs.
template <typename T, bool kSmallPages>
__device__ __forceinline__ void run_rounds(const MlaDecodeParams& p, const Smem& sm,
                                           const void* kv_map, int w, int row0, int tid) {
  const Lane ln(tid);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  uint32_t ph = 0;  // phase bits (kSlotBit, kHandoffBit << k, kGroupBit)
  for (int first = 0;; first += Tr::kMaxPieces) {
    if (tid == 0) collect_pieces<Tr>(p, w, first, sm.pieces(), sm.counts());
    __syncthreads();  // the piece list (and, first time, the barriers' init) is visible
    const int n = sm.counts()[0];
    if (first == 0) KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlPieces, tid);
    for (int pi = 0; pi < n; ++pi) {
      const PieceRun e = sm.pieces()[pi];
      const int span = e.end - e.begin;
      const PieceWalk walk{p, sm, kv_map, e, TileGeom(p, kSmallPages),
                           span > 0 ? (span + Tr::kBlockN - 1) / Tr::kBlockN : 0, scale_log2};
      run_piece<T>(walk, row0, ph, ln, tid, first + pi == 0);
    }
    // The worker's piece total, read again here (shared memory, unchanged during the round)
    // rather than held in a register through the round.
    if (first + Tr::kMaxPieces >= sm.counts()[1]) {
      if (tid == 0) KF_TIMELINE_PIECES(p.timeline, kTlDecode, sm.counts()[1]);
      break;
    }
    __syncthreads();  // everyone is done with this round's piece list
  }
  bulk_wait_all();  // the last piece's O is written before the block ends
}

}  // namespace sm90a

// Block (row tile, worker): the row tiles of a worker (h_q s_q > 64) are neighbours in the
// launch order, so they read the same KV tiles close together in time and the second read can
// find them in L2. kSmallPages: pages of fewer than 64 rows (a tile spans several pages; TileGeom).
template <typename T, bool kSmallPages>
__global__ void __launch_bounds__(MlaSm90aTraits::kNumThreads, 1)
    mla_decode_sm90a_kernel(const __grid_constant__ MlaDecodeParams p,
                            const __grid_constant__ CUtensorMap kv_map) {
  using Tr = MlaSm90aTraits;
  extern __shared__ __align__(16) uint8_t smem_raw[];  // aligned to 1024 below
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const sm90a::Smem sm{{smem_raw + pad, raw + pad}};
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * Tr::kBlockM, w = blockIdx.y;
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlEntry, tid);
  if (tid == 0) sm90a::tma_prefetch_map(&kv_map);
  if (!begin_block<Tr, T>(p, row0, w, gridDim.y)) return;
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlWaited, tid);
  if (tid == 0) {
    for (int i = 0; i < 2 * Tr::kColBlocks; ++i)
      sm90a::mbar_init(sm.base_u32 + Tr::kBarOff + 8 * i, 1);
    for (int k = 0; k < Tr::kHandoffs; ++k) sm90a::mbar_init(sm.handoff(k), sm90a::kGroupThreads);
    for (int g = 0; g < 2; ++g) sm90a::mbar_init(sm.group_bar(g), sm90a::kGroupThreads);
    sm90a::fence_mbarrier_init();
  }
  sm90a::run_rounds<T, kSmallPages>(p, sm, &kv_map, w, row0, tid);
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlExit, tid);
  pdl_launch_dependents();  // this block is done: a dependent kernel may start launching
}

// Launch on `stream` with the cache's tensor map; the attribute is set per call (cheap, allowed
// during capture).
template <typename T, bool kSmallPages>
cudaError_t run_mla_decode_sm90a(const MlaDecodeParams& p, const CUtensorMap& kv_map,
                                 cudaStream_t stream) {
  using Tr = MlaSm90aTraits;
  auto kernel = mla_decode_sm90a_kernel<T, kSmallPages>;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(ceil_div(p.num_rows, Tr::kBlockM), p.num_workers);
  return launch_pdl(kernel, grid, dim3(Tr::kNumThreads), Tr::kSmemBytes, stream, p, kv_map);
}

#define KF_DECODE_SM90A_INSTANTIATE(T, kSmallPages)                                     \
  template cudaError_t run_mla_decode_sm90a<T, kSmallPages>(const MlaDecodeParams&,      \
                                                            const CUtensorMap&, cudaStream_t);

}  // namespace kf::cuda
