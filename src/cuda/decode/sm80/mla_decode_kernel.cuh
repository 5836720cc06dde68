// MLA decode, the portable tensor-core kernel (sm_80/86/89/90). One block = (worker, row tile).
//
// What: for each piece (request, token range) of its worker, o = softmax(scale q k^T) v over the
// piece's tokens for the tile's kBlockM query rows. A request's only piece writes out (q dtype)
// and lse; other pieces write o_accum (normalized by their own sum) and lse_accum for the combine.
//
// The kernel below is the piece loop; its parts are in three headers:
//   mla_decode_pipeline.cuh  the block's start, the piece list, the shared-memory regions, and
//                            the KV tile pipeline (KvRing: a cp.async ring across pieces);
//   mla_decode_tile.cuh      load Q, the scores of a tile (QK), the online softmax, P V;
//   mla_decode_epilogue.cuh  1 / l and lse, then O / l to out or to the split partials.
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
// One row group with >= 2 tiles ahead (M32, 8-bit M16) waits for the next tile before the P
// barrier and skips the tile barrier: two barriers per tile instead of three.
// Memory: a kStages-deep cp.async ring of KV tiles (kAhead ahead of the one consumed; each warp
// copies a run of consecutive tokens of every tile, kv_tile_loader.cuh; the stream is marked
// evict-first in L2), zero-filled (src-size 0) past a piece's end and on bad pages so no NaN in
// page padding reaches an mma; 16-byte chunks XOR-swizzled by the token (a 1152-byte row stride
// would put the 8 rows of an ldmatrix in one bank group). The ring runs across piece
// boundaries: a worker's next piece streams in while the current one finishes.
// Shared memory: kStages * kBlockN * 1152 B of KV + 4 * kBlockM * kBlockN * 4 B of partial scores
// + P, q_pe and row stats; every configuration fits sm_86's 101376 bytes (static_assert in the
// traits): M16 86992 B, M32 89168 B, M64 85824 B. Registers (sm_86): 205 / 255 / 253 (the
// small-page instantiations 203 / 254 / 253), no spills.
// On sm_90 the kernel is launched as a programmatic dependent (pdl.cuh): it waits for the
// previous kernel before its first read.
//
// 8-bit caches (kFmt e4m3 / int8, MlaTraits8*): the ring holds the page's sections (644 B per
// token, 16-byte cp.async, the scale with a 4-byte one, chunks swizzled like the 16-bit rows);
// QK reads the 8-bit bytes into registers and converts them while building the fp16 mma
// fragments (kv8_dequant.cuh, exact codes), and P V reuses those registers transposed
// (movmatrix); the scale multiplies the latent part of each score, and P' = p * scale_t /
// S_tile (fp16, S_tile a power of two) carries it into PV with O in units of S_tile; the running
// max is lazy (softmax_tile). 16 rows per block for any row count. sm_86: 96272 B of shared
// memory, 216-241 registers, no spills.
//
// The parts are forced inline and every array they share lives in the kernel, passed by
// reference: the tile loop runs at up to 255 registers per thread, and the 8-bit loop's speed
// depends on where its code lands in the binary (8-11% between placements), so a change to the
// structure is checked against the disassembly or timed. Measured speeds: docs/optimization/decode.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/decode/sm80/kv_tile_loader.cuh"
#include "cuda/decode/sm80/mla_decode_epilogue.cuh"
#include "cuda/decode/sm80/mla_decode_pipeline.cuh"
#include "cuda/decode/sm80/mla_decode_sm80.h"  // the declarations (default kFmt)
#include "cuda/decode/sm80/mla_decode_tile.cuh"
#include "cuda/decode/sm80/mla_decode_traits.h"

namespace kf::cuda {

// kSmallPages: a 16-bit cache whose pages hold fewer tokens than a warp copies per tile
// (kv_tile_loader.cuh); a separate instantiation so the usual one keeps its registers.
template <class Tr, typename T, int kFmt, bool kSmallPages = false>
__global__ void __launch_bounds__(Tr::kNumThreads, 1)
    mla_decode_sm80_kernel(const __grid_constant__ MlaDecodeParams p) {
  static_assert(Tr::kKv8 == (kFmt != kKvFmt16), "8-bit formats use the 8-bit traits");
  constexpr bool kKv8 = Tr::kKv8;
  constexpr int kBlockN = Tr::kBlockN, kStages = Tr::kStages, kMFrags = Tr::kMFrags;
  constexpr int kNFrags = Tr::kNFrags, kQkSteps = Tr::kQkSteps, kPvFrags = Tr::kPvFrags;
  constexpr int kSoftTokens = Tr::kSoftTokens, kSoftTpr = Tr::kSoftThreadsPerRow;
  constexpr int kAhead = Tr::kAhead;
  // One row group and two or more tiles ahead: the block-wide barrier of a tile's arrival
  // merges into the previous tile's P barrier (the score and P barriers then span the block),
  // two barriers per tile, not three. Two row groups sync only within a group there, so they
  // keep the tile barrier; so does a ring one tile ahead, which would wait for the tile it has
  // just started.
  constexpr bool kMergedTileBarrier = Tr::kRowGroups == 1 && kAhead >= 2;
  using Ring = KvRing<Tr, T, kSmallPages>;

  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = warp / Tr::kDimGroups, d = warp % Tr::kDimGroups;
  const int w = blockIdx.x;
  const int row0 = blockIdx.y * Tr::kBlockM;
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlEntry, tid);
  if (!begin_block<Tr, T>(p, row0, blockIdx.x, gridDim.x)) return;
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlWaited, tid);

  const DecodeSmem<Tr> sm(smem);
  PieceRun* pieces = sm.pieces;
  const T* q = static_cast<const T*>(p.q);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;

  // Softmax mapping: thread -> (row srow of the block, tokens st0 .. st0 + kSoftTokens - 1).
  const int srow = g * Tr::kRowsPerGroup + d * Tr::kSoftRows + lane / kSoftTpr;
  const int st0 = (lane % kSoftTpr) * kSoftTokens;

  // Rounds of up to kMaxPieces pieces of this worker; the ring runs across a round's pieces.
  for (int first = 0;; first += Tr::kMaxPieces) {
    if (tid == 0) collect_pieces<Tr>(p, w, first, pieces, sm.counts);
    __syncthreads();
    const int n = sm.counts[0], total = sm.counts[1];
    if (first == 0) KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlPieces, tid);

    TileProducer prod;               // the next tile to start
    typename Ring::Pages prod_page;  // its pages
    const Ring ring(p, sm, n);
    int read_slot = 0;  // the ring slot being consumed; slot read_slot + kAhead is refilled
    ring.start(prod, prod_page);

    for (int pi = 0; pi < n; ++pi) {
      const int tok_begin = pieces[pi].begin, tok_end = pieces[pi].end;
      // Row indices of the per-piece code are recomputed from a fresh %tid.x: hoisted out of the
      // piece loop they would be live through the tile loop, where every register is taken.
      const int lane = fresh_tid() & 31;

      uint32_t qf[kMFrags][kQkSteps - 1][4];
      [[maybe_unused]] float q_unscale[kMFrags][2];
      load_q_fragments<Tr, T, kFmt>(p, q, pieces[pi], row0, g, d, lane, qf, q_unscale);
      store_q_pe<Tr, T>(sm, p, q, pieces[pi], row0, g, d, lane);
      float o_acc[kMFrags][kPvFrags][4];
      zero_fill(o_acc);
      init_softmax_state<Tr>(sm, p, pieces[pi], row0, srow);
      // 8-bit: the tile's latent codes converted once, in QK, kept for P V.
      [[maybe_unused]] uint32_t kb[kKv8 ? kNFrags : 1][8][2];

      for (int tile_tok = tok_begin; tile_tok < tok_end; tile_tok += kBlockN) {
        // Tile read_slot landed; slot read_slot + kAhead (the tile before the previous one with
        // kDeferPv, else the previous one) is free. With one row group, only a piece's first
        // tile needs this barrier: later tiles landed at the previous tile's P barrier.
        if (!kMergedTileBarrier || tile_tok == tok_begin) {
          cp_async_wait<kAhead - 1>();
          __syncthreads();
        }
        if (first == 0 && pi == 0 && tile_tok == tok_begin)
          KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlFirstTile, tid);
        // Deferred P V (M64): row group 1 finishes the previous tile of this piece first. Its P
        // and alpha rows are its own, and the softmax of this tile rewrites them only after the
        // group's barrier behind QK, which every warp of the group passes after this.
        if (Tr::kDeferPv && g == 1 && tile_tok != tok_begin)
          pv_tile<Tr, T>(sm, o_acc, kb, ((read_slot + kStages - 1) % kStages) * Tr::kKvTileBytes,
                         g, d, lane);

        const int tile_off = read_slot * Tr::kKvTileBytes;
        const uint32_t tile = sm.kv + tile_off;
        [[maybe_unused]] const uint8_t* tile8 = smem + Tr::kKvOff + tile_off;
        [[maybe_unused]] const float* tile_scale =
            reinterpret_cast<const float*>(tile8 + Tr::kKv8ScaleOff);
        [[maybe_unused]] float tile_smax = 0.f;  // 8-bit: the tile's largest token scale

        // ---- 1. partial scores over this warp's 144 dims ----
        {
          QkAcc<Tr> s_acc;
          zero_fill(s_acc);
          uint32_t qpe[kMFrags][4];
          load_q_pe_fragments<Tr>(sm, qpe, g, d, lane);
          if constexpr (kKv8) {
            uint32_t rope_b[4];
            qk_tile8<Tr, T, kFmt>(s_acc, qf, q_unscale, qpe, tile, tile8, tile_scale, tile_smax,
                                  kb, rope_b, d, lane);
          } else {
            qk_tile16<Tr, T>(s_acc, qf, qpe, tile, d, lane);
          }
          // Refill the free slot (everyone passed this tile's __syncthreads) while the mma
          // results are in flight.
          if (!kMergedTileBarrier) ring.refill(prod, prod_page, read_slot);
          store_partial_scores<Tr>(sm, s_acc, g, d, lane);
        }
        named_barrier(1 + g, Tr::kDimGroups * 32);
        // Every warp is past QK of this tile, so past P V of the previous one: its slot is free.
        if (kMergedTileBarrier) ring.refill(prod, prod_page, read_slot);

        // ---- 2. online softmax of row srow over this tile ----
        {
          float sc[kSoftTokens];
          gather_scores<Tr>(sm, sc, srow, st0);
          softmax_tile<Tr, T>(sm, sc, tid, lane, srow, st0, read_slot, tile_tok, scale_log2,
                              tile_smax, tile_scale);
        }
        // The piece's next tile (this thread's copies) before the P barrier, which then also
        // publishes that tile to every thread.
        if (kMergedTileBarrier && tile_tok + kBlockN < tok_end) cp_async_wait<kAhead - 1>();
        named_barrier(1 + g, Tr::kDimGroups * 32);

        // ---- 3. P V (row group 1 of kDeferPv runs it one tile late) ----
        if (!Tr::kDeferPv || g == 0) pv_tile<Tr, T>(sm, o_acc, kb, tile_off, g, d, lane);
        read_slot = read_slot + 1 == kStages ? 0 : read_slot + 1;
      }
      // Row group 1's deferred P V of the piece's last tile (its slot is refilled two tiles on).
      if (Tr::kDeferPv && g == 1 && tok_end > tok_begin)
        pv_tile<Tr, T>(sm, o_acc, kb, ((read_slot + kStages - 1) % kStages) * Tr::kKvTileBytes, g,
                       d, lane);

      // ---- epilogue: normalize by the row sums, write out/lse or the split partials ----
      const PieceRun e = pieces[pi];
      // The worker's first piece; every piece's (the last one's stays in the buffer).
      if (first == 0 && pi == 0) KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlFirstEpi, tid);
      KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlLastEpi, tid);
      float4 quad[4];  // 8-bit: the output transpose's values
      piece_epilogue<Tr, T, kFmt>(sm, p, e, o_acc, quad, row0, g, d, srow);
    }
    cp_async_wait<0>();
    if (first + Tr::kMaxPieces >= total) {
      if (tid == 0) KF_TIMELINE_PIECES(p.timeline, kTlDecode, total);
      break;
    }
    __syncthreads();  // everyone is done with this round's piece list
  }
  KF_TIMELINE_STAMP(p.timeline, kTlDecode, kTlExit, tid);
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
