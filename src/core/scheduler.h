// The balanced split scheduler: host+device code shared by the CPU backend and the GPU metadata
// kernel, so both produce the same metadata bytes for the same cache_seqlens.
//
// Model. Request r costs seg_len(r) = tiles(r) + F units, tiles(r) = ceil(len / 64): the fixed
// part F stands for what a piece costs besides its KV tiles (loading q, the epilogue, a combine
// input); it depends on the cache format (sched_fixed_cost) and is recorded in the metadata.
// Lay all requests on one line of T = sum seg_len units and cut it at
// c_w = floor(w * T / W_a) for w = 1 .. W_a-1, W_a the active workers (W, or fewer when that
// keeps every request whole, or half of W at small batch where the caller allows it: "Whole
// requests" and "Half the workers" below). A cut inside request r's fixed part moves
// back to the request's start (the whole request goes to the later worker); a cut inside its
// tiles splits it there. Worker w owns the line from its start to the next worker's start, so
// every tile is covered exactly once, and its cost is at most ceil(T / W_a) + F (the fixed cost
// of a continued request, or a cut moved back by at most the fixed part), which is the bound
// the tests check: the mean plus one tile of rounding plus the fixed cost of a piece.
//
// Metadata layout (int32):
//   [0, kMetaHeaderLen)            header: magic, version, batch, h_q, s_q, num_workers,
//                                  block_n, total_pieces, fixed_cost F, spread (1 when the
//                                  half-the-workers placement below was allowed), then zeros
//   next num_workers * kMetaWorkerLen   per worker: start_req, start_tile, end_req, end_tile,
//                                  first_piece, then zeros. The worker covers the (req, tile)
//                                  points in [start, end) in lexicographic order; an empty
//                                  request r owns the single point (r, 0).
//   next batch + 1                 piece_offset: request r's pieces are
//                                  piece_offset[r] .. piece_offset[r+1]-1, in KV order, so the
//                                  combine merges them in a fixed order (bit-identical reruns).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/mla_shape.h"

namespace kf {

constexpr int kSchedBlockN = 64;  // tokens per scheduling tile; pieces start at multiples of it
// A piece's fixed cost F in tiles, by cache format: what starting a piece costs besides its KV
// tiles. 1 is the fastest value measured on the H200 for decode + combine with either kind of
// cache (docs/optimization/decode.md): 0 and 2 are slower at b = 1, FlashMLA's 5 at b = 8 to 128. The
// formats keep separate constants: the split is a per-format choice recorded in the metadata,
// and may differ on other GPUs.
constexpr int kFixedCost16 = 1;
constexpr int kFixedCost8 = 1;
constexpr int kMaxFixedCost = 64;  // what a metadata header may record
KF_HD inline int sched_fixed_cost(KvFormat f) { return is_8bit(f) ? kFixedCost8 : kFixedCost16; }
constexpr int kMetaHeaderLen = 16;
constexpr int kMetaWorkerLen = 8;
constexpr int32_t kMetaMagic = 0x4B464D44;  // "KFMD"
constexpr int32_t kMetaVersion = 3;  // the layout below, with the fixed cost and spread in the header

enum MetaHeader {
  kMetaMagicIdx = 0,
  kMetaVersionIdx,
  kMetaBatchIdx,
  kMetaHqIdx,
  kMetaSqIdx,
  kMetaWorkersIdx,
  kMetaBlockNIdx,
  kMetaTotalPiecesIdx,
  kMetaFixedCostIdx,
  kMetaSpreadIdx
};
enum MetaWorker { kWStartReq = 0, kWStartTile, kWEndReq, kWEndTile, kWFirstPiece };

KF_HD inline int64_t metadata_size(int batch, int num_workers) {
  return kMetaHeaderLen + int64_t(num_workers) * kMetaWorkerLen + batch + 1;
}
KF_HD inline int32_t* meta_worker(int32_t* meta, int w) {
  return meta + kMetaHeaderLen + w * kMetaWorkerLen;
}
KF_HD inline const int32_t* meta_worker(const int32_t* meta, int w) {
  return meta + kMetaHeaderLen + w * kMetaWorkerLen;
}
KF_HD inline const int32_t* meta_piece_offset(const int32_t* meta, int num_workers) {
  return meta + kMetaHeaderLen + num_workers * kMetaWorkerLen;
}
// Most pieces a batch can be split into: one per request plus one per cut.
KF_HD inline int64_t max_pieces(int batch, int num_workers) { return int64_t(batch) + num_workers; }

// Tiles of a request; the caller clamps the length to what the block table can address.
// In 64 bits: a length near INT32_MAX (a bad device-side value) must not wrap.
KF_HD inline int sched_tiles(int seqlen) {
  return seqlen <= 0 ? 0 : int((int64_t(seqlen) + kSchedBlockN - 1) / kSchedBlockN);
}

// ---- Whole requests ----
// The line is cut for W_a active workers, W_a <= W = num_workers: W_a = W unless a smaller count
// gives every worker whole requests. With q = ceil(batch / W) requests per worker, the candidate
// is W' = ceil(batch / q); it is taken when W' >= 19/20 W (the balance coarser by at most about
// 5%) and its cuts split no request (they all fall on request starts, as for q W' requests of
// equal length). Then no request has two pieces: no combine input and no second piece start in
// a worker, which on the H200 costs more than the 3-5% of balance given up (b = 64 and 128 on
// 66 workers: the combine alone takes 5% of the decode). Workers W_a .. W - 1 get no work.
KF_HD inline int sched_whole_candidate(int batch, int num_workers) {
  if (batch < 1 || num_workers < 2) return num_workers;
  const int q = (batch + num_workers - 1) / num_workers;
  const int w = (batch + q - 1) / q;
  return w < num_workers && int64_t(20) * w >= int64_t(19) * num_workers ? w : num_workers;
}
// The cut between workers w - 1 and w of W_a (0 < w < W_a) on a line of `total` units lies at
// floor(w total / W_a). It splits a request when it falls past the request's fixed part.
KF_HD inline int64_t schedule_cut_point(int64_t total, int active, int w) {
  return total / active * w + total % active * w / active;
}

// ---- Half the workers, on the even ones, at small batch ----
// Where the caller allows it (`spread`: the decode family that will run the call says so,
// DecodeFamily::spread_small_batch; never on the CPU backend), a line shorter than the worker
// count but longer than a quarter of it (W / 4 < T < W, W even, and the whole-request rule not
// taken) is cut for W_a = W / 2 workers, and cut j's share goes to worker 2 j: worker w's range
// runs from cut sched_cut_index(w) to cut sched_cut_index(w + 1), so every odd worker starts and
// ends at the same cut and gets nothing. On the H200's sm_90a kernel (one block per SM) pieces of
// two tiles fill its two-tile step and the working blocks lie across the grid rather than in its
// first half: h_q 128 b = 1, h_q 64 b = 2 and h_q 32 b = 2 at s_k 4096 7-9% faster; on the
// portable kernels the same placement was 4-7% slower (docs/optimization/decode.md,
// sched-spread-half), so they do not ask for it.
KF_HD inline bool sched_spread_half(int64_t total, int num_workers) {
  return num_workers >= 4 && num_workers % 2 == 0 && total < num_workers &&
         4 * total > num_workers;
}
// W_a and the placement: the whole-request rule's W_a (sched_active_workers*), or W / 2 spread.
struct SchedWorkers {
  int active;
  bool spread;
};
KF_HD inline SchedWorkers sched_workers(int whole_active, int64_t total, int num_workers,
                                        bool spread_allowed) {
  if (spread_allowed && whole_active == num_workers && sched_spread_half(total, num_workers))
    return {num_workers / 2, true};
  return {whole_active, false};
}
// The cut that starts worker w (and ends worker w - 1): cut w, or cut (w + 1) / 2 when spread.
KF_HD inline int sched_cut_index(int w, bool spread) { return spread ? (w + 1) / 2 : w; }

// ---- The same schedule in closed form, for the GPU's parallel metadata kernel ----
// With S[r] = sum of seg_len over requests < r (S[0] = 0, S[batch] = T), the cut between
// workers w - 1 and w (0 < w < W_a) lies at c_w = floor(w T / W_a): in the first request r with
// S[r + 1] > c_w, at tile c_w - S[r] - F (0 if that is not positive). Cut 0 is (0, 0),
// cuts W_a .. W are (batch, 0). Cut w is a piece boundary when it splits a request and differs from cut
// w - 1; with nb(w) the number of boundaries among cuts 1..w, worker w's first piece is
// cut_req(w) + nb(w), request r's first piece is r + (boundaries in requests before r), and the
// batch has batch + nb(W) pieces. build_schedule's walk yields exactly these values (checked on
// the CPU over random batches in cpp_tests/test_scheduler.cpp).
struct SchedCut {
  int req, tile;
};
KF_HD inline int64_t sched_seg_len(int seqlen, int fixed_cost) {
  return sched_tiles(seqlen) + fixed_cost;
}
// `active` is W_a (sched_active_workers); cuts W_a .. W are (batch, 0).
KF_HD inline SchedCut schedule_cut(const int64_t* seg_prefix, int batch, int active,
                                   int fixed_cost, int w) {
  if (w <= 0) return {0, 0};
  if (w >= active) return {batch, 0};
  const int64_t total = seg_prefix[batch];
  const int64_t c = schedule_cut_point(total, active, w);
  int lo = 0, hi = batch;  // the first r with seg_prefix[r + 1] > c, or batch
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (seg_prefix[mid + 1] > c)
      hi = mid;
    else
      lo = mid + 1;
  }
  const int64_t o = c - seg_prefix[lo];
  return {lo, (lo < batch && o > fixed_cost) ? int(o - fixed_cost) : 0};
}
// W_a from the prefix sums (sequentially; the GPU kernel checks the candidate's cuts in
// parallel, with the same result).
KF_HD inline int sched_active_workers(const int64_t* seg_prefix, int batch, int num_workers,
                                      int fixed_cost) {
  const int cand = sched_whole_candidate(batch, num_workers);
  for (int w = 1; w < cand; ++w)
    if (schedule_cut(seg_prefix, batch, cand, fixed_cost, w).tile > 0) return num_workers;
  return cand;
}
KF_HD inline bool schedule_boundary(SchedCut prev, SchedCut cut) {
  return cut.tile > 0 && (cut.req != prev.req || cut.tile != prev.tile);
}
KF_HD inline void write_meta_worker(int32_t* meta, int w, SchedCut start, SchedCut end,
                                   int first_piece) {
  int32_t* wk = meta_worker(meta, w);
  wk[kWStartReq] = start.req;
  wk[kWStartTile] = start.tile;
  wk[kWEndReq] = end.req;
  wk[kWEndTile] = end.tile;
  wk[kWFirstPiece] = first_piece;
  for (int i = kWFirstPiece + 1; i < kMetaWorkerLen; ++i) wk[i] = 0;
}
KF_HD inline void write_meta_header(int32_t* meta, int batch, int h_q, int s_q, int num_workers,
                                   int total_pieces, int fixed_cost, bool spread) {
  meta[kMetaMagicIdx] = kMetaMagic;
  meta[kMetaVersionIdx] = kMetaVersion;
  meta[kMetaBatchIdx] = batch;
  meta[kMetaHqIdx] = h_q;
  meta[kMetaSqIdx] = s_q;
  meta[kMetaWorkersIdx] = num_workers;
  meta[kMetaBlockNIdx] = kSchedBlockN;
  meta[kMetaTotalPiecesIdx] = total_pieces;
  meta[kMetaFixedCostIdx] = fixed_cost;
  meta[kMetaSpreadIdx] = spread ? 1 : 0;
  for (int i = kMetaSpreadIdx + 1; i < kMetaHeaderLen; ++i) meta[i] = 0;
}

// W_a by walking the requests (build_schedule's way: no prefix array), `total` the line's
// length.
KF_HD inline int sched_active_workers_walk(const int32_t* seqlens, int batch, int num_workers,
                                           int fixed_cost, int64_t total) {
  const int cand = sched_whole_candidate(batch, num_workers);
  int r = 0;
  int64_t seg_start = 0;
  for (int w = 1; w < cand; ++w) {
    const int64_t c = schedule_cut_point(total, cand, w);
    while (r < batch && seg_start + sched_seg_len(seqlens[r], fixed_cost) <= c)
      seg_start += sched_seg_len(seqlens[r++], fixed_cost);
    if (r < batch && c - seg_start > fixed_cost) return num_workers;
  }
  return cand;
}

// Fill the metadata. `seqlens` are clamped to >= 0 by the caller (nothing more: the metadata call
// does not see the block table; decode clamps each piece to what the block table addresses).
// Sequential, O(batch + num_workers). The GPU's metadata kernel computes the same values in
// parallel from the closed form above, and runs this walk for batches too large for its shared
// memory (cuda/sched/).
KF_HD inline void build_schedule(const int32_t* seqlens, int batch, int h_q, int s_q,
                                 int num_workers, int fixed_cost, bool spread, int32_t* meta) {
  int64_t total = 0;
  for (int r = 0; r < batch; ++r) total += sched_seg_len(seqlens[r], fixed_cost);
  const SchedWorkers sw =
      sched_workers(sched_active_workers_walk(seqlens, batch, num_workers, fixed_cost, total),
                    total, num_workers, spread);
  const int active = sw.active;

  int32_t* piece_offset = meta + kMetaHeaderLen + num_workers * kMetaWorkerLen;
  for (int r = 0; r <= batch; ++r) piece_offset[r] = 0;  // used as split counts first

  // Walk cuts and requests together. (prev_req, prev_tile) is the previous worker's start.
  int r = 0;
  int64_t seg_start = 0;
  int prev_req = 0, prev_tile = 0;
  int32_t* w0 = meta_worker(meta, 0);
  w0[kWStartReq] = 0;
  w0[kWStartTile] = 0;
  // Cut k lies at c = floor(k * total / W_a), stepped without a 64-bit division per cut (slow on
  // a GPU): k * total = k * step * W_a + k * rem, and frac carries k * rem modulo W_a. Worker w
  // starts at cut k = sched_cut_index(w); a repeated cut (spread) repeats the previous point.
  const int64_t step = total / active, rem = total % active;
  int64_t c = 0, frac = 0;
  int k_prev = 0, req = 0, tile = 0;
  for (int w = 1; w <= num_workers; ++w) {
    const int k = sched_cut_index(w, sw.spread);
    if (k == k_prev) {
      // the same cut as worker w - 1's start: (req, tile) unchanged
    } else if (k >= active) {
      k_prev = k;
      req = batch;
      tile = 0;
    } else {
      k_prev = k;
      c += step;
      frac += rem;
      if (frac >= active) {
        frac -= active;
        c += 1;
      }
      while (r < batch && seg_start + sched_seg_len(seqlens[r], fixed_cost) <= c) {
        seg_start += sched_seg_len(seqlens[r], fixed_cost);
        ++r;
      }
      req = r;
      int64_t o = c - seg_start;
      tile = (r < batch && o > fixed_cost) ? int(o - fixed_cost) : 0;
    }
    // A distinct cut inside a request adds a piece to it.
    if (tile > 0 && (req != prev_req || tile != prev_tile)) piece_offset[req] += 1;
    int32_t* prev = meta_worker(meta, w - 1);
    prev[kWEndReq] = req;
    prev[kWEndTile] = tile;
    if (w < num_workers) {
      int32_t* cur = meta_worker(meta, w);
      cur[kWStartReq] = req;
      cur[kWStartTile] = tile;
    }
    prev_req = req;
    prev_tile = tile;
  }
  // Split counts (1 + cuts) -> exclusive prefix.
  int32_t acc = 0;
  for (int q = 0; q < batch; ++q) {
    int32_t n = 1 + piece_offset[q];
    piece_offset[q] = acc;
    acc += n;
  }
  piece_offset[batch] = acc;
  // First piece of each worker: the worker that starts mid-request continues the piece after
  // the previous one in that request; one that starts at a request's start opens its piece 0.
  int run_req = -1, run_k = 0, last_tile = -1;
  for (int w = 0; w < num_workers; ++w) {
    int32_t* wk = meta_worker(meta, w);
    int sr = wk[kWStartReq], st = wk[kWStartTile];
    if (sr != run_req) {
      run_req = sr;
      run_k = 0;
      last_tile = 0;
    }
    if (st > 0 && st != last_tile) {
      ++run_k;
      last_tile = st;
    }
    wk[kWFirstPiece] = (sr < batch ? piece_offset[sr] : acc) + run_k;
    for (int i = kWFirstPiece + 1; i < kMetaWorkerLen; ++i) wk[i] = 0;
  }
  write_meta_header(meta, batch, h_q, s_q, num_workers, acc, fixed_cost, spread);
}

// One piece of work: request `req`, tokens [token_begin, token_end), split index `piece`
// (global), and whether it is the request's only piece (then it writes the final output).
struct Piece {
  int req;
  int token_begin, token_end;
  int piece;
  bool only_piece;
};

// Iterate the pieces of worker w: call f(Piece) for each, in order. seqlens are the clamped
// lengths, clamped to >= 0 as for build_schedule.
template <typename SeqlenFn, typename F>
KF_HD inline void for_each_piece(const int32_t* meta, int w, SeqlenFn seqlen_of, F&& f) {
  const int num_workers = meta[kMetaWorkersIdx];
  const int batch = meta[kMetaBatchIdx];
  const int32_t* wk = meta_worker(meta, w);
  const int32_t* piece_offset = meta_piece_offset(meta, num_workers);
  const int start_req = wk[kWStartReq], start_tile = wk[kWStartTile];
  const int end_req = wk[kWEndReq], end_tile = wk[kWEndTile];
  int piece = wk[kWFirstPiece];
  if (start_req == end_req && start_tile == end_tile) return;  // an empty worker (repeated cut)
  for (int r = start_req; r < batch && (r < end_req || (r == end_req && end_tile > 0)); ++r) {
    const int len = seqlen_of(r);
    const int lo = (r == start_req) ? start_tile : 0;
    const int hi = (r == end_req) ? end_tile : sched_tiles(len);
    if (r != start_req) piece = piece_offset[r];
    Piece p;
    p.req = r;
    p.token_begin = lo * kSchedBlockN;
    p.token_end = int64_t(hi) * kSchedBlockN < len ? hi * kSchedBlockN : len;
    p.piece = piece;
    p.only_piece = piece_offset[r + 1] - piece_offset[r] == 1;
    f(p);
  }
}

}  // namespace kf
