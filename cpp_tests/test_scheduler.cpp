// Invariants of the split scheduler (src/core/scheduler.h) over many random batches: exact
// coverage, the per-worker cost bound, piece order and numbering, determinism, and the C API's
// metadata being the same bytes.
#include <map>
#include <set>

#include "core/scheduler.h"
#include "test_util.h"

using namespace kft;

namespace {

struct Sched {
  std::vector<int32_t> seqlens;
  int h_q = 16, s_q = 1, W = 1;
  int fc = kf::kFixedCost16;  // the per-piece fixed cost
  bool spread = false;         // half the workers on the even ones allowed at small batch
  std::vector<int32_t> meta;
  int batch() const { return int(seqlens.size()); }
  void build() {
    meta.assign(size_t(kf::metadata_size(batch(), W)), -12345);
    kf::build_schedule(seqlens.data(), batch(), h_q, s_q, W, fc, spread, meta.data());
  }
  std::vector<kf::Piece> pieces_of(int w) const {
    std::vector<kf::Piece> v;
    kf::for_each_piece(meta.data(), w, [&](int r) { return seqlens[r]; },
                       [&](const kf::Piece& p) { v.push_back(p); });
    return v;
  }
};

Sched random_sched(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> nb(1, 64), nw(1, 300), len(1, 5000), mode(0, 3);
  Sched s;
  s.seqlens.resize(nb(rng));
  const int m = mode(rng);
  for (auto& x : s.seqlens) {
    const int v = len(rng);
    x = m == 0 ? v : m == 1 ? v % 70 : m == 2 ? (v % 3 == 0 ? 0 : v) : v % 7;  // mixes of sizes
  }
  s.W = nw(rng);
  s.h_q = 1 << std::uniform_int_distribution<int>(0, 7)(rng);
  s.s_q = std::uniform_int_distribution<int>(1, 16)(rng);
  const int costs[] = {kf::kFixedCost16, kf::kFixedCost8, 0, 2, kf::kMaxFixedCost};
  s.fc = costs[std::uniform_int_distribution<int>(0, 4)(rng)];
  s.spread = rng() % 2 == 0;
  s.build();
  return s;
}

// Every (request, tile) point covered exactly once; an empty request owns one empty piece.
void expect_exact_cover(const Sched& s) {
  std::map<std::pair<int, int>, int> seen;  // (req, tile) -> times
  std::vector<int> empty_pieces(s.batch(), 0);
  for (int w = 0; w < s.W; ++w)
    for (const kf::Piece& p : s.pieces_of(w)) {
      ASSERT_GE(p.req, 0);
      ASSERT_LT(p.req, s.batch());
      ASSERT_EQ(p.token_begin % kf::kSchedBlockN, 0);
      ASSERT_LE(p.token_end, s.seqlens[p.req]);
      if (s.seqlens[p.req] == 0) {
        ASSERT_EQ(p.token_begin, 0);
        ASSERT_EQ(p.token_end, 0);
        ++empty_pieces[p.req];
        continue;
      }
      ASSERT_LT(p.token_begin, p.token_end) << "a piece of a non-empty request holds a token";
      for (int t = p.token_begin; t < p.token_end; t += kf::kSchedBlockN)
        ++seen[{p.req, t / kf::kSchedBlockN}];
    }
  for (int r = 0; r < s.batch(); ++r) {
    if (s.seqlens[r] == 0) {
      EXPECT_EQ(empty_pieces[r], 1) << "request " << r;
      continue;
    }
    for (int t = 0; t < kf::sched_tiles(s.seqlens[r]); ++t) ASSERT_EQ((seen[{r, t}]), 1) << "r=" << r << " tile=" << t;
  }
  int64_t total = 0;
  for (const auto& kv : seen) total += kv.second;
  int64_t want = 0;
  for (int len : s.seqlens) want += kf::sched_tiles(len);
  EXPECT_EQ(total, want);
}

TEST(Scheduler, RandomBatchesCoverEveryTileExactlyOnce) {
  auto rng = test_rng();
  for (int i = 0; i < 400; ++i) {
    Sched s = random_sched(rng);
    SCOPED_TRACE("batch " + std::to_string(s.batch()) + " W " + std::to_string(s.W));
    expect_exact_cover(s);
    if (HasFatalFailure()) return;
  }
}

TEST(Scheduler, WorkerCostWithinMeanPlusFixedCost) {
  auto rng = test_rng();
  for (int i = 0; i < 400; ++i) {
    Sched s = random_sched(rng);
    int64_t T = 0;
    for (int len : s.seqlens) T += kf::sched_tiles(len) + s.fc;
    const int active = kf::sched_workers(kf::sched_active_workers_walk(s.seqlens.data(),
                                                                       s.batch(), s.W, s.fc, T),
                                         T, s.W, s.spread)
                           .active;
    const int64_t bound = (T + active - 1) / active + s.fc;
    for (int w = 0; w < s.W; ++w) {
      int64_t cost = 0;
      for (const kf::Piece& p : s.pieces_of(w))
        cost += kf::ceil_div(p.token_end - p.token_begin, kf::kSchedBlockN) + s.fc;
      ASSERT_LE(cost, bound) << "worker " << w << " of " << s.W << ", batch " << s.batch();
    }
  }
}

TEST(Scheduler, PiecesAreNumberedInKvOrder) {
  auto rng = test_rng();
  for (int i = 0; i < 400; ++i) {
    Sched s = random_sched(rng);
    const int32_t* po = kf::meta_piece_offset(s.meta.data(), s.W);
    ASSERT_EQ(po[0], 0);
    ASSERT_EQ(po[s.batch()], s.meta[kf::kMetaTotalPiecesIdx]);
    ASSERT_LE(po[s.batch()], kf::max_pieces(s.batch(), s.W));
    std::map<int, kf::Piece> by_index;
    int last_global = -1;
    for (int w = 0; w < s.W; ++w)
      for (const kf::Piece& p : s.pieces_of(w)) {
        ASSERT_GT(p.piece, last_global) << "pieces increase along workers";
        last_global = p.piece;
        ASSERT_GE(p.piece, po[p.req]);
        ASSERT_LT(p.piece, po[p.req + 1]);
        ASSERT_EQ(p.only_piece, po[p.req + 1] - po[p.req] == 1);
        ASSERT_TRUE(by_index.emplace(p.piece, p).second) << "piece " << p.piece << " twice";
      }
    ASSERT_EQ(int(by_index.size()), po[s.batch()]) << "every piece index used";
    // Within a request the pieces tile [0, seqlen) in index order.
    for (int r = 0; r < s.batch(); ++r) {
      ASSERT_EQ(by_index[po[r]].token_begin, 0) << "r=" << r;
      ASSERT_EQ(by_index[po[r + 1] - 1].token_end, s.seqlens[r]) << "r=" << r;
      for (int k = po[r]; k + 1 < po[r + 1]; ++k)
        ASSERT_EQ(by_index[k].token_end, by_index[k + 1].token_begin) << "r=" << r << " k=" << k;
    }
  }
}

TEST(Scheduler, SameInputSameBytes) {
  auto rng = test_rng();
  for (int i = 0; i < 100; ++i) {
    Sched s = random_sched(rng);
    const std::vector<int32_t> first = s.meta;
    s.meta.assign(s.meta.size(), 777);  // different garbage before the rebuild
    s.build();
    ASSERT_EQ(first, s.meta);
  }
}

TEST(Scheduler, HeaderRecordsTheCall) {
  Sched s;
  s.seqlens = {10, 0, 300};
  s.h_q = 128;
  s.s_q = 3;
  s.W = 5;
  s.fc = 7;
  s.build();
  EXPECT_EQ(s.meta[kf::kMetaMagicIdx], kf::kMetaMagic);
  EXPECT_EQ(s.meta[kf::kMetaVersionIdx], kf::kMetaVersion);
  EXPECT_EQ(s.meta[kf::kMetaBatchIdx], 3);
  EXPECT_EQ(s.meta[kf::kMetaHqIdx], 128);
  EXPECT_EQ(s.meta[kf::kMetaSqIdx], 3);
  EXPECT_EQ(s.meta[kf::kMetaWorkersIdx], 5);
  EXPECT_EQ(s.meta[kf::kMetaBlockNIdx], kf::kSchedBlockN);
  EXPECT_EQ(s.meta[kf::kMetaFixedCostIdx], 7);
  EXPECT_EQ(s.meta[kf::kMetaSpreadIdx], 0);
  s.spread = true;
  s.build();
  EXPECT_EQ(s.meta[kf::kMetaSpreadIdx], 1);
  for (int i = kf::kMetaSpreadIdx + 1; i < kf::kMetaHeaderLen; ++i) EXPECT_EQ(s.meta[i], 0);
}

TEST(Scheduler, FixedCostByCacheFormat) {
  EXPECT_EQ(kf::sched_fixed_cost(kf::KvFormat::kBF16), kf::kFixedCost16);
  EXPECT_EQ(kf::sched_fixed_cost(kf::KvFormat::kFP16), kf::kFixedCost16);
  EXPECT_EQ(kf::sched_fixed_cost(kf::KvFormat::kFP8E4M3), kf::kFixedCost8);
  EXPECT_EQ(kf::sched_fixed_cost(kf::KvFormat::kINT8), kf::kFixedCost8);
  // A larger fixed cost splits less: 64 requests of 4096 tokens over 264 workers.
  Sched a, b;
  a.seqlens.assign(64, 4096);
  a.W = 264;
  b = a;
  a.fc = 1;
  b.fc = 5;
  a.build();
  b.build();
  expect_exact_cover(a);
  expect_exact_cover(b);
  EXPECT_GT(a.meta[kf::kMetaTotalPiecesIdx], 0);
  EXPECT_NE(a.meta, b.meta);
}

TEST(Scheduler, AllEmptyRequests) {
  Sched s;
  s.seqlens.assign(9, 0);
  s.W = 4;
  s.build();
  expect_exact_cover(s);
  EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], 9);
}

TEST(Scheduler, MoreWorkersThanWork) {
  Sched s;
  s.seqlens = {64};
  s.W = 132;
  s.build();
  expect_exact_cover(s);
  int busy = 0;
  for (int w = 0; w < s.W; ++w) busy += !s.pieces_of(w).empty();
  EXPECT_GE(busy, 1);
  EXPECT_LE(s.meta[kf::kMetaTotalPiecesIdx], 1 + 1) << "one tile splits into at most one piece";
}

TEST(Scheduler, OneWorkerNeverSplits) {
  auto rng = test_rng();
  for (int i = 0; i < 50; ++i) {
    Sched s = random_sched(rng);
    s.W = 1;
    s.build();
    EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], s.batch());
    for (const kf::Piece& p : s.pieces_of(0)) EXPECT_TRUE(p.only_piece);
  }
}

TEST(Scheduler, LongRequestIsSplitAcrossWorkers) {
  Sched s;
  s.seqlens = {64 * 1000};
  s.W = 8;
  s.build();
  expect_exact_cover(s);
  EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], 8);
  for (int w = 0; w < s.W; ++w) EXPECT_EQ(s.pieces_of(w).size(), 1u) << w;
}

TEST(Scheduler, CApiMetadataIsTheSharedScheduler) {
  auto rng = test_rng();
  for (int i = 0; i < 30; ++i) {
    Sched s = random_sched(rng);
    HostTensor seqlens(kI32, {s.batch()});
    std::copy(s.seqlens.begin(), s.seqlens.end(), seqlens.ptr<int32_t>());
    size_t n = 0;
    ASSERT_EQ(kf_mla_metadata_size(s.batch(), s.W, &n), KF_SUCCESS);
    ASSERT_EQ(n, s.meta.size());
    HostTensor meta(kI32, {int64_t(n)});
    meta.fill<int32_t>(-1);
    // Every other trial a 16-bit cache (the 16-bit fixed cost), else the format's own cost.
    const kf_kv_format f = i % 2 ? kf_kv_format(i % 4) : KF_KV_BF16;
    s.fc = i % 2 ? kf::sched_fixed_cost(kf::KvFormat(int(f))) : kf::kFixedCost16;
    s.spread = false;  // the CPU backend never spreads
    s.build();
    const kf_status st =
        kf_mla_metadata_for_format(seqlens.dl(), s.h_q, s.s_q, s.W, f, meta.dl(), nullptr);
    ASSERT_EQ(st, KF_SUCCESS) << kf_last_error();
    ASSERT_EQ(0, std::memcmp(meta.ptr<int32_t>(), s.meta.data(), n * 4));
  }
}

// The closed form the GPU's parallel metadata kernel evaluates (one value per thread), run here
// step by step: the same bytes as build_schedule's walk.
std::vector<int32_t> closed_form_schedule(const std::vector<int32_t>& seqlens, int h_q, int s_q,
                                          int W, int fc, bool spread) {
  const int batch = int(seqlens.size());
  std::vector<int32_t> meta(size_t(kf::metadata_size(batch, W)), -777);
  std::vector<int64_t> seg_prefix(batch + 1, 0);
  for (int r = 0; r < batch; ++r)
    seg_prefix[r + 1] = seg_prefix[r] + kf::sched_seg_len(std::max(0, seqlens[r]), fc);
  const kf::SchedWorkers sw = kf::sched_workers(
      kf::sched_active_workers(seg_prefix.data(), batch, W, fc), seg_prefix[batch], W, spread);
  std::vector<kf::SchedCut> cut(W + 1);
  for (int w = 0; w <= W; ++w)
    cut[w] = kf::schedule_cut(seg_prefix.data(), batch, sw.active, fc,
                              kf::sched_cut_index(w, sw.spread));
  std::vector<int> nb(W + 1, 0);  // boundaries among cuts 1..w
  for (int w = 1; w <= W; ++w) nb[w] = nb[w - 1] + kf::schedule_boundary(cut[w - 1], cut[w]);
  for (int w = 0; w < W; ++w)
    kf::write_meta_worker(meta.data(), w, cut[w], cut[w + 1], cut[w].req + nb[w]);
  int32_t* piece_offset = meta.data() + kf::kMetaHeaderLen + W * kf::kMetaWorkerLen;
  for (int r = 0; r <= batch; ++r) {
    int last = -1;  // the last cut in a request before r
    for (int w = 0; w <= W; ++w)
      if (cut[w].req < r) last = w;
    piece_offset[r] = r + (last < 0 ? 0 : nb[last]);
  }
  kf::write_meta_header(meta.data(), batch, h_q, s_q, W, batch + nb[W], fc, spread);
  return meta;
}

// Equal requests, b = q W' with W' >= 19/20 of the workers (b 64 and 128 on the H200's 66
// workers of an h_q 128 decode): W' workers with q whole requests each, no request split; the
// closed form agrees. One request a tile longer: every worker runs and requests are split.
TEST(Scheduler, WholeRequestsWhenTheyLineUp) {
  for (int b : {64, 128}) {
    Sched s;
    s.seqlens.assign(b, 4096);
    s.W = 66;
    s.h_q = 128;
    s.build();
    EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], b);
    for (int w = 0; w < 64; ++w) EXPECT_EQ(int(s.pieces_of(w).size()), b / 64) << "worker " << w;
    for (int w = 64; w < 66; ++w) EXPECT_TRUE(s.pieces_of(w).empty()) << "worker " << w;
    EXPECT_EQ(closed_form_schedule(s.seqlens, s.h_q, s.s_q, s.W, s.fc, s.spread), s.meta);
    s.seqlens[3] += 64;
    s.build();
    EXPECT_GT(s.meta[kf::kMetaTotalPiecesIdx], b);
    for (int w = 0; w < 66; ++w) EXPECT_FALSE(s.pieces_of(w).empty()) << "worker " << w;
    EXPECT_EQ(closed_form_schedule(s.seqlens, s.h_q, s.s_q, s.W, s.fc, s.spread), s.meta);
  }
}

// Spread allowed, W / 4 < T < W (h_q 128, b 1, s_k 4096 on the H200's 66 workers: T = 65): the
// line is cut for W / 2 workers placed on the even ones, every odd worker empty, pieces of two
// tiles (worker 0's cut falls in the request's fixed part, so worker 2 starts the request); not
// allowed, or with T >= W or T <= W / 4, every worker takes a share as before. The header records
// the flag; the closed form agrees.
TEST(Scheduler, HalfTheWorkersSpreadAtSmallBatch) {
  Sched s;
  s.seqlens = {4096};
  s.W = 66;
  s.h_q = 128;
  s.spread = true;
  s.build();
  EXPECT_EQ(s.meta[kf::kMetaSpreadIdx], 1);
  expect_exact_cover(s);
  EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], 32);
  for (int w = 0; w < s.W; ++w) {
    const auto mine = s.pieces_of(w);
    if (w % 2 == 1 || w == 0) {
      EXPECT_TRUE(mine.empty()) << "worker " << w;
    } else {
      ASSERT_EQ(mine.size(), 1u) << "worker " << w;
      EXPECT_EQ(mine[0].token_begin, (w - 2) * kf::kSchedBlockN) << "worker " << w;
      EXPECT_EQ(mine[0].token_end - mine[0].token_begin, 2 * kf::kSchedBlockN) << "worker " << w;
    }
  }
  EXPECT_EQ(closed_form_schedule(s.seqlens, s.h_q, s.s_q, s.W, s.fc, s.spread), s.meta);
  s.spread = false;  // not allowed (the portable kernels, the CPU backend): every worker
  s.build();
  EXPECT_EQ(s.meta[kf::kMetaSpreadIdx], 0);
  EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], 64);
  EXPECT_EQ(closed_form_schedule(s.seqlens, s.h_q, s.s_q, s.W, s.fc, s.spread), s.meta);
  s.spread = true;
  s.seqlens = {4096, 4096};  // T = 130 >= W: every worker
  s.build();
  int odd_busy = 0;
  for (int w = 1; w < s.W; w += 2) odd_busy += !s.pieces_of(w).empty();
  EXPECT_EQ(odd_busy, s.W / 2 - 1) << "all but one odd worker busy (one cut in a fixed part)";
  EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], 64);
  s.seqlens = {256};  // T = 5 <= W / 4: every worker (most of them empty)
  s.build();
  EXPECT_EQ(s.meta[kf::kMetaTotalPiecesIdx], 4);
  EXPECT_EQ(closed_form_schedule(s.seqlens, s.h_q, s.s_q, s.W, s.fc, s.spread), s.meta);
}

TEST(Scheduler, ClosedFormEqualsTheWalk) {
  auto rng = test_rng();
  std::uniform_int_distribution<int> kind(0, 4);
  for (int i = 0; i < 400; ++i) {
    Sched s = random_sched(rng);
    if (i % 5 == 0) {  // lengths near INT32_MAX (64-bit cost sums), zeros, ones
      for (auto& x : s.seqlens) {
        const int k = kind(rng);
        x = k == 0 ? INT32_MAX - int(rng() % 1000) : k == 1 ? 0 : k == 2 ? 1 : x;
      }
      s.build();
    }
    if (i % 7 == 3) {  // equal lengths, b = q W' with W' near W (whole requests, or not)
      const int q = 1 + int(rng() % 3), wa = 1 + int(rng() % 40);
      s.seqlens.assign(size_t(q) * wa, int(rng() % 3000));
      s.W = wa + int(rng() % 4);
      s.build();
    }
    ASSERT_EQ(closed_form_schedule(s.seqlens, s.h_q, s.s_q, s.W, s.fc, s.spread), s.meta)
        << "case " << i << ": batch " << s.batch() << " W " << s.W;
  }
}

}  // namespace
