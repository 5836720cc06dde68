// Standalone check + timing of the CUDA decode path (llm.c style): fresh random inputs, a float64
// CPU reference, poisoned outputs, NaN in page padding and unused pages, device error cases,
// bit-identical reruns, CUDA-graph replay with new lengths, cache append; then timings of
// decode+combine in CUDA graphs with caches rotated beyond L2.
//
// Build and run: bash research/run_decode_check.sh (nvcc -arch=sm_90, links src/cuda/**.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/half_convert.h"
#include "core/params.h"
#include "core/scheduler.h"
#include "cuda/combine/mla_combine.h"
#include "cuda/decode/sm80/mla_decode_kernel.cuh"
#include "cuda/launch.h"

using namespace kf;

#include "harness.cuh"

static uint16_t to16(float f, DType t) { return store_16(f, t); }
static double from16(uint16_t h, DType t) { return load_16(h, t); }
static const uint16_t kNaN16 = 0xFFFF;  // NaN in bf16 and fp16

// ------------------------------------------------------------------------------------------
struct Case {
  std::string name;
  DType dtype = DType::kBF16;
  int h_q = 16, s_q = 1, page_size = 64;
  std::vector<int> seqlens;
  int num_workers = 0;  // 0: SMs / row tiles
  int max_pages_per_seq = 0;  // 0: enough for the longest
  float scale = 0.114721f;
  // error injection
  std::vector<std::pair<int, int>> bad_pages;  // (request, page slot j) -> out-of-range value
  bool metadata_mismatch = false;
  int expect_flags = 0;
};

struct Setup {
  Case c;
  int batch, rows, num_pages, max_pages;
  std::vector<uint16_t> q, kv;
  std::vector<int32_t> block_table, seqlens;
  DevBuf<uint16_t> dq, dkv, dout;
  DevBuf<int32_t> dbt, dlen, dmeta, derr;
  DevBuf<float> dlse;
  DevBuf<uint8_t> dws;
  MlaDecodeParams p{};
  MlaMetadataParams mp{};
};

static int clamp_len(const Setup& s, int r) {
  const int64_t cap = int64_t(s.max_pages) * s.c.page_size;
  int64_t L = s.seqlens[r];
  return int(std::min<int64_t>(std::max<int64_t>(L, 0), cap));
}

static void build(Setup& s) {
  const Case& c = s.c;
  s.batch = int(c.seqlens.size());
  s.rows = c.h_q * c.s_q;
  s.seqlens = c.seqlens;
  int longest = 0;
  for (int L : c.seqlens) longest = std::max(longest, L);
  s.max_pages = c.max_pages_per_seq ? c.max_pages_per_seq : std::max(1, ceil_div(longest, c.page_size));
  // Pages: every request gets its own scattered pages, plus spare NaN pages.
  int used = 0;
  for (int r = 0; r < s.batch; ++r) used += ceil_div(clamp_len(s, r), c.page_size);
  s.num_pages = used + 7;
  std::vector<int> perm(s.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g_rng);
  s.block_table.assign(size_t(s.batch) * s.max_pages, 0);
  int next = 0;
  s.kv.assign(size_t(s.num_pages) * c.page_size * kHeadDim, kNaN16);  // NaN everywhere first
  for (int r = 0; r < s.batch; ++r) {
    const int L = clamp_len(s, r);
    const int np = ceil_div(L, c.page_size);
    for (int j = 0; j < s.max_pages; ++j) {
      // Unused entries point at a NaN page (valid index): never read.
      s.block_table[size_t(r) * s.max_pages + j] = j < np ? perm[next++] : perm[s.num_pages - 1];
    }
    for (int t = 0; t < L; ++t) {
      const int page = s.block_table[size_t(r) * s.max_pages + t / c.page_size];
      uint16_t* row = &s.kv[(size_t(page) * c.page_size + t % c.page_size) * kHeadDim];
      for (int k = 0; k < kHeadDim; ++k) row[k] = to16(randn(), c.dtype);
    }
  }
  for (auto [r, j] : c.bad_pages)
    s.block_table[size_t(r) * s.max_pages + j] = (j % 2) ? -7 : s.num_pages + 5;
  s.q.resize(size_t(s.batch) * s.rows * kHeadDim);
  for (auto& v : s.q) v = to16(randn(), c.dtype);

  const int workers = c.num_workers ? c.num_workers : default_workers(s.rows);
  s.dq = DevBuf<uint16_t>(s.q.size());
  s.dq.up(s.q);
  s.dkv = DevBuf<uint16_t>(s.kv.size());
  s.dkv.up(s.kv);
  s.dout = DevBuf<uint16_t>(size_t(s.batch) * s.rows * kLatentDim);
  s.dlse = DevBuf<float>(size_t(s.batch) * s.rows);
  s.dbt = DevBuf<int32_t>(s.block_table.size());
  s.dbt.up(s.block_table);
  s.dlen = DevBuf<int32_t>(s.batch);
  s.dlen.up(s.seqlens);
  s.dmeta = DevBuf<int32_t>(metadata_size(s.batch, workers));
  s.derr = DevBuf<int32_t>(4);
  s.dws = DevBuf<uint8_t>(workspace_bytes(s.batch, s.rows, workers));

  MlaMetadataParams& mp = s.mp;
  mp.cache_seqlens = s.dlen.p;
  mp.batch = s.batch;
  mp.h_q = c.metadata_mismatch ? c.h_q + 1 : c.h_q;
  mp.s_q = c.s_q;
  mp.num_workers = workers;
  mp.fixed_cost = kFixedCost16;
  mp.metadata = s.dmeta.p;
  mp.error_buffer = s.derr.p;

  MlaDecodeParams& p = s.p;
  p.dtype = c.dtype;
  p.kv_format = c.dtype == DType::kBF16 ? KvFormat::kBF16 : KvFormat::kFP16;
  p.batch = s.batch;
  p.s_q = c.s_q;
  p.h_q = c.h_q;
  p.num_rows = s.rows;
  p.page_size = c.page_size;
  p.page_shift = 0;
  while ((1 << p.page_shift) < c.page_size) ++p.page_shift;
  p.num_pages = s.num_pages;
  p.max_pages_per_seq = s.max_pages;
  p.softmax_scale = c.scale;
  p.q = s.dq.p;
  p.q_batch_stride = int64_t(s.rows) * kHeadDim;
  p.q_seq_stride = int64_t(c.h_q) * kHeadDim;
  p.q_head_stride = kHeadDim;
  p.kv = s.dkv.p;
  p.kv_page_stride = int64_t(c.page_size) * kHeadDim;
  p.kv_token_stride = kHeadDim;
  p.block_table = s.dbt.p;
  p.block_table_batch_stride = s.max_pages;
  p.cache_seqlens = s.dlen.p;
  p.metadata = s.dmeta.p;
  p.num_workers = workers;
  p.out = s.dout.p;
  p.o_batch_stride = int64_t(s.rows) * kLatentDim;
  p.o_seq_stride = int64_t(c.h_q) * kLatentDim;
  p.o_head_stride = kLatentDim;
  p.lse = s.dlse.p;
  p.o_accum = reinterpret_cast<float*>(s.dws.p);
  p.lse_accum = reinterpret_cast<float*>(s.dws.p + workspace_o_accum_bytes(s.batch, s.rows, workers));
  p.error_buffer = s.derr.p;
}

static void reset_outputs(Setup& s) {
  s.dout.fill_bytes(0xFF);
  s.dlse.fill_bytes(0xFF);
  s.dws.fill_bytes(0xFF);
  std::vector<int32_t> e = {0, -1, 0, 0};
  s.derr.up(e);
}

static void run_eager(Setup& s) {
  CK(cuda::launch_mla_metadata(s.mp, 0));
  CK(cuda::launch_mla_decode(s.p, 0));
  CK(cudaDeviceSynchronize());
}

// float64 reference of one request row: tokens on bad pages are absent.
static void reference(const Setup& s, int r, int i, std::vector<double>& o, double& lse) {
  const Case& c = s.c;
  const int L = clamp_len(s, r);
  const int vis = visible_len(L, c.s_q, i / c.h_q);
  const uint16_t* qr = &s.q[(size_t(r) * s.rows + i) * kHeadDim];
  std::vector<double> qd(kHeadDim);
  for (int k = 0; k < kHeadDim; ++k) qd[k] = from16(qr[k], c.dtype);
  std::vector<double> sc;
  std::vector<const uint16_t*> rowp;
  for (int t = 0; t < vis; ++t) {
    const int page = s.block_table[size_t(r) * s.max_pages + t / c.page_size];
    if (page < 0 || page >= s.num_pages) continue;
    const uint16_t* kr = &s.kv[(size_t(page) * c.page_size + t % c.page_size) * kHeadDim];
    double dot = 0;
    for (int k = 0; k < kHeadDim; ++k) dot += qd[k] * from16(kr[k], c.dtype);
    sc.push_back(dot * c.scale);
    rowp.push_back(kr);
  }
  o.assign(kLatentDim, 0.0);
  if (sc.empty()) {
    lse = -INFINITY;
    return;
  }
  const double mx = *std::max_element(sc.begin(), sc.end());
  double sum = 0;
  for (size_t j = 0; j < sc.size(); ++j) {
    const double pj = std::exp(sc[j] - mx);
    sum += pj;
    for (int d = 0; d < kLatentDim; ++d) o[d] += pj * from16(rowp[j][d], c.dtype);
  }
  for (auto& v : o) v /= sum;
  lse = mx + std::log(sum);
}

struct Verdict {
  double worst_cos = 0, worst_lse = 0;
  int bad_empty = 0, nonfinite = 0;
};

static Verdict verify(const Setup& s, const std::vector<uint16_t>& out, const std::vector<float>& lse) {
  const Case& c = s.c;
  Verdict v;
  std::vector<std::vector<double>> os(s.rows);
  std::vector<double> ls(s.rows);
  for (int r = 0; r < s.batch; ++r) {
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < s.rows; ++i) reference(s, r, i, os[i], ls[i]);
    for (int i = 0; i < s.rows; ++i) {
      const int sq = i / c.h_q, h = i % c.h_q;
      const uint16_t* g = &out[(size_t(r) * s.rows + i) * kLatentDim];
      const float gl = lse[(size_t(r) * c.h_q + h) * c.s_q + sq];
      if (ls[i] == -INFINITY) {
        bool zero = gl == -INFINITY;
        for (int d = 0; d < kLatentDim; ++d) zero = zero && from16(g[d], c.dtype) == 0.0;
        if (!zero) ++v.bad_empty;
        continue;
      }
      double xy = 0, xx = 0, yy = 0;
      bool finite = std::isfinite(gl);
      for (int d = 0; d < kLatentDim; ++d) {
        const double x = from16(g[d], c.dtype), y = os[i][d];
        finite = finite && std::isfinite(x);
        xy += x * y, xx += x * x, yy += y * y;
      }
      if (!finite) {
        ++v.nonfinite;
        continue;
      }
      const double cosd = (xx + yy) > 0 ? 1.0 - 2.0 * xy / (xx + yy) : 0.0;
      v.worst_cos = std::max(v.worst_cos, cosd);
      v.worst_lse = std::max(v.worst_lse, std::abs(double(gl) - ls[i]));
    }
  }
  return v;
}

static void check_case(const Case& c) {
  Setup s;
  s.c = c;
  build(s);
  printf("[%s] %s h_q=%d s_q=%d page=%d batch=%d workers=%d rows=%d\n", c.name.c_str(),
         c.dtype == DType::kBF16 ? "bf16" : "fp16", c.h_q, c.s_q, c.page_size, s.batch,
         s.p.num_workers, s.rows);
  reset_outputs(s);
  run_eager(s);
  auto out1 = s.dout.down();
  auto lse1 = s.dlse.down();
  auto err = s.derr.down();

  if (!c.metadata_mismatch) {
    // Metadata bytes equal the host scheduler's on clamped lengths.
    std::vector<int32_t> clamped(s.batch), meta(s.dmeta.n);
    for (int r = 0; r < s.batch; ++r) clamped[r] = std::max(0, s.seqlens[r]);
    build_schedule(clamped.data(), s.batch, c.h_q, c.s_q, s.p.num_workers, kFixedCost16, meta.data());
    EXPECT(meta == s.dmeta.down(), "GPU metadata differs from the host scheduler");
    const Verdict v = verify(s, out1, lse1);
    printf("  worst cos dist %.3e  worst |dlse| %.3e  bad empty rows %d  non-finite %d\n",
           v.worst_cos, v.worst_lse, v.bad_empty, v.nonfinite);
    EXPECT(v.worst_cos < 1e-5, "cosine distance %.3e", v.worst_cos);
    EXPECT(v.worst_lse < 1e-4, "lse error %.3e", v.worst_lse);
    EXPECT(v.bad_empty == 0 && v.nonfinite == 0, "empty/non-finite rows");
  } else {
    bool empty = true;
    for (auto h : out1) empty = empty && from16(h, c.dtype) == 0.0;
    for (auto l : lse1) empty = empty && l == -INFINITY;
    EXPECT(empty, "metadata mismatch must give o = 0, lse = -inf");
  }
  EXPECT(err[0] == c.expect_flags, "error flags %d, expected %d", err[0], c.expect_flags);
  printf("  error buffer: flags %d first %d value %d\n", err[0], err[1], err[2]);

  // A rerun on the same inputs gives the same bits.
  reset_outputs(s);
  run_eager(s);
  EXPECT(out1 == s.dout.down() && lse1 == s.dlse.down(), "rerun not bit-identical");
}

// Capture metadata + decode once; replay with new lengths: same bits as eager calls.
static void check_graph() {
  Case c;
  c.name = "graph";
  c.seqlens = {3001, 4000, 64, 778, 4096, 2048};  // pages for the longest of the steps below
  Setup s;
  s.c = c;
  build(s);
  printf("[graph replay] batch=%d workers=%d\n", s.batch, s.p.num_workers);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  CK(cuda::launch_mla_metadata(s.mp, st));
  CK(cuda::launch_mla_decode(s.p, st));
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const std::vector<std::vector<int>> steps = {{3000, 1, 0, 777, 4096, 65}, {3001, 2, 1, 778, 4096, 66},
                                               {10, 4000, 64, 0, 128, 2048}};
  for (const auto& lens : steps) {
    s.seqlens = lens;
    s.dlen.up(lens);
    reset_outputs(s);
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    auto og = s.dout.down();
    auto lg = s.dlse.down();
    reset_outputs(s);
    run_eager(s);
    EXPECT(og == s.dout.down() && lg == s.dlse.down(), "graph replay differs from eager");
    const Verdict v = verify(s, og, lg);
    EXPECT(v.worst_cos < 1e-5 && v.worst_lse < 1e-4 && v.bad_empty == 0 && v.nonfinite == 0,
           "graph replay wrong: cos %.3e lse %.3e", v.worst_cos, v.worst_lse);
  }
  printf("  ok\n");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

static void check_append(bool aligned_rows) {
  const DType t = DType::kBF16;
  const int page_size = 16, num_pages = 10, n = 50;
  const int64_t row_stride = aligned_rows ? kHeadDim : kHeadDim + 1;
  printf("[cache append] %s rows\n", aligned_rows ? "aligned" : "unaligned");
  std::vector<uint16_t> kv(size_t(n) * row_stride);
  for (auto& v : kv) v = to16(randn(), t);
  std::vector<uint16_t> cache(size_t(num_pages) * page_size * kHeadDim);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = uint16_t(i * 2654435761u >> 7);
  std::vector<int> slots(num_pages * page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), g_rng);
  std::vector<int64_t> slot_mapping(n);
  for (int i = 0; i < n; ++i) slot_mapping[i] = slots[i];
  slot_mapping[7] = -1;
  slot_mapping[19] = int64_t(num_pages) * page_size + 3;  // reported, skipped
  DevBuf<uint16_t> dkv(kv.size()), dcache(cache.size());
  DevBuf<int64_t> dslot(n);
  DevBuf<int32_t> derr(4);
  dkv.up(kv);
  dcache.up(cache);
  dslot.up(slot_mapping);
  derr.up({0, -1, 0, 0});
  CacheAppendParams p{};
  p.dtype = t;
  p.kv_format = KvFormat::kBF16;
  p.num_tokens = n;
  p.page_size = page_size;
  p.page_shift = 4;
  p.num_pages = num_pages;
  p.kv = dkv.p;
  p.kv_row_stride = row_stride;
  p.cache = dcache.p;
  p.cache_page_stride = int64_t(page_size) * kHeadDim;
  p.cache_token_stride = kHeadDim;
  p.slot_mapping = dslot.p;
  p.error_buffer = derr.p;
  CK(cuda::launch_cache_append(p, 0));
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> want = cache;
  for (int i = 0; i < n; ++i) {
    const int64_t sl = slot_mapping[i];
    if (sl < 0 || sl >= num_pages * page_size) continue;
    memcpy(&want[size_t(sl) * kHeadDim], &kv[size_t(i) * row_stride], kHeadDim * 2);
  }
  EXPECT(dcache.down() == want, "cache bytes differ");
  auto e = derr.down();
  EXPECT(e[0] == 8 && e[1] == 19, "append error buffer %d %d", e[0], e[1]);
  printf("  error buffer: flags %d first %d value %d\n", e[0], e[1], e[2]);
}

// ------------------------------------------------------------------------------------------
// Timing: decode+combine of b requests of s_k tokens, page 64, bf16, in CUDA graphs, each graph
// on its own scattered pages of a large pool so the rotated data exceeds the 60 MB L2.
__global__ void fill_random(uint16_t* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    const float f = (float(h & 0xffff) / 65535.f) * 2.f - 1.f;
    x[i] = __bfloat16_as_ushort(__float2bfloat16(f));
  }
}

typedef cudaError_t (*DecodeFn)(const MlaDecodeParams&, cudaStream_t);

struct TimeResult {
  double us, gbs, tflops;
};

static TimeResult time_decode(int h_q, int batch, int s_k, DecodeFn fn, int workers,
                              uint16_t* pool, int pool_pages, int s_q = 1) {
  const int page = 64, pages_per_seq = s_k / page, rows = h_q * s_q;
  const int need = batch * pages_per_seq;
  const int rot = std::max(1, std::min(64, pool_pages / need));
  std::vector<int32_t> lens(batch, s_k);
  DevBuf<int32_t> dlen(batch), dmeta(metadata_size(batch, workers));
  dlen.up(lens);
  DevBuf<uint16_t> dq(size_t(batch) * rows * kHeadDim), dout(size_t(batch) * rows * kLatentDim);
  fill_random<<<256, 256>>>(dq.p, dq.n, 7);
  DevBuf<float> dlse(size_t(batch) * rows);
  DevBuf<uint8_t> dws(workspace_bytes(batch, rows, workers));
  MlaMetadataParams mp{};
  mp.cache_seqlens = dlen.p;
  mp.batch = batch;
  mp.h_q = h_q;
  mp.s_q = s_q;
  mp.num_workers = workers;
  mp.fixed_cost = kFixedCost16;
  mp.metadata = dmeta.p;
  CK(cuda::launch_mla_metadata(mp, 0));
  std::vector<int32_t> perm(pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::vector<DevBuf<int32_t>*> tables;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> execs;
  for (int r = 0; r < rot; ++r) {
    std::vector<int32_t> bt(perm.begin() + size_t(r) * need, perm.begin() + size_t(r + 1) * need);
    std::shuffle(bt.begin(), bt.end(), g_rng);
    auto* t = new DevBuf<int32_t>(need);
    t->up(bt);
    tables.push_back(t);
    MlaDecodeParams p{};
    p.dtype = DType::kBF16;
    p.kv_format = KvFormat::kBF16;
    p.batch = batch, p.s_q = s_q, p.h_q = h_q, p.num_rows = rows;
    p.page_size = page, p.page_shift = 6, p.num_pages = pool_pages, p.max_pages_per_seq = pages_per_seq;
    p.softmax_scale = 0.114721f;
    p.q = dq.p;
    p.q_batch_stride = int64_t(rows) * kHeadDim, p.q_seq_stride = int64_t(h_q) * kHeadDim, p.q_head_stride = kHeadDim;
    p.kv = pool, p.kv_page_stride = int64_t(page) * kHeadDim, p.kv_token_stride = kHeadDim;
    p.block_table = t->p, p.block_table_batch_stride = pages_per_seq;
    p.cache_seqlens = dlen.p, p.metadata = dmeta.p, p.num_workers = workers;
    p.out = dout.p;
    p.o_batch_stride = int64_t(rows) * kLatentDim, p.o_seq_stride = int64_t(h_q) * kLatentDim, p.o_head_stride = kLatentDim;
    p.lse = dlse.p;
    p.o_accum = reinterpret_cast<float*>(dws.p);
    p.lse_accum = reinterpret_cast<float*>(dws.p + workspace_o_accum_bytes(batch, rows, workers));
    cudaGraph_t g;
    cudaGraphExec_t e;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CK(fn(p, st));
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    cudaGraphDestroy(g);
    execs.push_back(e);
  }
  for (int r = 0; r < rot; ++r) CK(cudaGraphLaunch(execs[r], st));
  const int iters = std::min(400, std::max(3 * rot, 60));
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(ev[i], st));
    CK(cudaGraphLaunch(execs[i % rot], st));
  }
  CK(cudaEventRecord(ev[iters], st));
  CK(cudaStreamSynchronize(st));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  std::sort(ms.begin(), ms.end());
  const double us = ms[iters / 2] * 1e3;
  for (auto& e : ev) cudaEventDestroy(e);
  for (auto e : execs) cudaGraphExecDestroy(e);
  for (auto* t : tables) delete t;
  cudaStreamDestroy(st);
  const double bytes = double(batch) * s_k * 1152;
  const double flops = 2.0 * batch * s_q * h_q * double(s_k) * (576 + 512);
  return {us, bytes / us * 1e-3, flops / us * 1e-6};
}

// Alternative configurations, tried beside the shipped ones.
template <class Tr>
cudaError_t decode_variant(const MlaDecodeParams& p, cudaStream_t st) {
  cudaError_t e = cuda::run_mla_decode_sm80<Tr, __nv_bfloat16>(p, st);
  if (e != cudaSuccess) return e;
  return cuda::launch_mla_combine(p, st);
}

template <class Tr>
cudaError_t decode_only(const MlaDecodeParams& p, cudaStream_t st) {
  return cuda::run_mla_decode_sm80<Tr, __nv_bfloat16>(p, st);
}

static void timings() {
  const int pool_pages = 2 * 128 * 64 + 64;  // two rotations of the largest batch
  DevBuf<uint16_t> pool(size_t(pool_pages) * 64 * kHeadDim);
  fill_random<<<1024, 256>>>(pool.p, pool.n, 1234);
  CK(cudaDeviceSynchronize());
  const int s_k = 4096;
  const int bs[] = {1, 8, 16, 32, 64, 128};
  const double flashmla16[] = {21.5, 27.0, 33.6, 50.4, 89.3, 151.2};
  const double flashmla128[] = {25.4, 34.9, 46.1, 75.4, 123.8, 233.4};
  printf("\nTimings: decode+combine, s_k=%d, page 64, bf16, CUDA graph, caches rotated, median\n", s_k);
  printf("%-28s %5s %9s %9s %9s %12s\n", "config", "b", "us", "GB/s", "TFLOPS", "FlashMLA us");
  for (int h_q : {16, 128}) {
    for (int i = 0; i < 6; ++i) {
      const int rows = h_q;
      TimeResult t = time_decode(h_q, bs[i], s_k, cuda::launch_mla_decode,
                                 default_workers(rows), pool.p, pool_pages);
      printf("%-28s %5d %9.1f %9.0f %9.1f %12.1f\n", h_q == 16 ? "h_q=16 shipped" : "h_q=128 shipped",
             bs[i], t.us, t.gbs, t.tflops, h_q == 16 ? flashmla16[i] : flashmla128[i]);
    }
  }
  const int sms = num_sms();
  printf("default workers: h_q=16 %d, h_q=32 rows %d, h_q=128 %d\n", default_workers(16),
         default_workers(32), default_workers(128));
  printf("variants:\n");
  using V16a = cuda::MlaDecodeTraits<1, 1, 16, 4>;
  for (int b : {1, 64, 128}) {
    TimeResult t = time_decode(16, b, s_k, decode_variant<V16a>, 2 * sms, pool.p, pool_pages);
    printf("%-28s %5d %9.1f %9.0f %9.1f\n", "h_q=16 M16 x4 stages 2/SM", b, t.us, t.gbs, t.tflops);
    t = time_decode(16, b, s_k, decode_variant<cuda::MlaTraitsM16>, sms, pool.p, pool_pages);
    printf("%-28s %5d %9.1f %9.0f %9.1f\n", "h_q=16 M16 x5 1 block/SM", b, t.us, t.gbs, t.tflops);
  }
  for (int b : {1, 64}) {
    TimeResult t = time_decode(16, b, s_k, decode_only<cuda::MlaTraitsM16>, 2 * sms, pool.p, pool_pages);
    printf("%-28s %5d %9.1f %9.0f %9.1f\n", "h_q=16 decode kernel only", b, t.us, t.gbs, t.tflops);
    t = time_decode(128, b, s_k, decode_only<cuda::MlaTraitsM64>, sms / 2, pool.p, pool_pages);
    printf("%-28s %5d %9.1f %9.0f %9.1f\n", "h_q=128 decode kernel only", b, t.us, t.gbs, t.tflops);
  }
  for (int b : {1, 64, 128}) {  // 32-row tiles, 4 warps, 2 blocks per SM, 4 row tiles
    TimeResult t = time_decode(128, b, s_k, decode_variant<cuda::MlaTraitsM32>, sms / 2, pool.p, pool_pages);
    printf("%-28s %5d %9.1f %9.0f %9.1f\n", "h_q=128 M32 x4 rowtiles 2/SM", b, t.us, t.gbs, t.tflops);
  }
  // Speculative decoding shape.
  {
    TimeResult t = time_decode(16, 64, s_k, cuda::launch_mla_decode, default_workers(32),
                               pool.p, pool_pages, 2);
    printf("%-28s %5d %9.1f %9.0f %9.1f\n", "h_q=16 s_q=2 shipped", 64, t.us, t.gbs, t.tflops);
  }
}

static void time_metadata() {
  for (int batch : {1, 64, 128, 1024}) {
    const int workers = num_sms();
    DevBuf<int32_t> dlen(batch), dmeta(metadata_size(batch, workers));
    std::vector<int32_t> lens(batch);
    for (auto& l : lens) l = randint(1, 8192);
    dlen.up(lens);
    MlaMetadataParams mp{};
    mp.cache_seqlens = dlen.p, mp.batch = batch, mp.h_q = 16, mp.s_q = 1, mp.num_workers = workers;
    mp.fixed_cost = kFixedCost16;
    mp.metadata = dmeta.p;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cuda::launch_mla_metadata(mp, 0));
    CK(cudaEventRecord(a));
    for (int i = 0; i < 20; ++i) CK(cuda::launch_mla_metadata(mp, 0));
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    printf("metadata kernel: batch %5d, %d workers: %.1f us\n", batch, workers, ms * 1e3 / 20);
  }
}

int main(int argc, char** argv) {
  // --no-time: checks only; --only I: check case I only (for the slow sanitizers).
  bool do_time = true;
  int only = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--no-time") do_time = false;
    if (std::string(argv[i]) == "--only" && i + 1 < argc) only = atoi(argv[++i]), do_time = false;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);

  std::vector<Case> cases;
  {
    Case c;
    c.name = "v2lite split";
    c.seqlens = {4096, 1, 0, 63, 64, 65, 1000, 2500, 777};
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "3 workers, many pieces";
    c.page_size = 16;
    c.num_workers = 3;
    for (int i = 0; i < 40; ++i) c.seqlens.push_back(randint(0, 300));
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "h128 fp16";
    c.dtype = DType::kFP16;
    c.h_q = 128;
    c.page_size = 32;
    c.seqlens = {3000, 17, 1024, 0};
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "s_q=4 causal (64 rows)";
    c.s_q = 4;
    c.seqlens = {300, 2, 4100, 3};
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "h1 s_q=16 page 256";
    c.dtype = DType::kFP16;
    c.h_q = 1;
    c.s_q = 16;
    c.page_size = 256;
    c.seqlens = {5, 700, 16};
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "h64 s_q=2 page 128";
    c.h_q = 64;
    c.s_q = 2;
    c.page_size = 128;
    c.seqlens = {1500, 130};
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "h8 s_q=3 (24 rows)";
    c.h_q = 8;
    c.s_q = 3;
    c.page_size = 16;
    for (int i = 0; i < 5; ++i) c.seqlens.push_back(randint(0, 2000));
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "h16 s_q=2 (32 rows) fp16";
    c.dtype = DType::kFP16;
    c.s_q = 2;
    c.page_size = 32;
    c.seqlens = {2049, 1, 0, 900};
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "h128 s_q=16 (2048 rows)";
    c.h_q = 128;
    c.s_q = 16;
    c.num_workers = 4;
    c.seqlens = {200, 40};
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "device errors";
    c.page_size = 16;
    c.max_pages_per_seq = 8;
    c.seqlens = {100, 5000, -3, 50};
    c.bad_pages = {{0, 2}, {0, 3}};
    c.expect_flags = 1 | 2;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "metadata for another h_q";
    c.seqlens = {100, 200};
    c.metadata_mismatch = true;
    c.expect_flags = 4;
    cases.push_back(c);
  }
  if (only >= 0) {
    check_case(cases.at(only));
  } else {
    for (const Case& c : cases) check_case(c);
    check_graph();
    check_append(true);
    check_append(false);
  }
  printf("\nCHECKS: %d passed, %d failed\n", g_checks - g_failures, g_failures);
  if (do_time) {
    time_metadata();
    timings();
  }
  return g_failures ? 1 : 0;
}
