// research/perf harness (adapted from research/mla_decode_check.cu): every version vN runs the
// same checks (float64 reference, worst-row cosine < 1e-5, NaN padding, bit-identical rerun,
// graph replay) and the same timings; the table v0 vs vN is printed last.
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
#include "perf_version.h"
#include "cuda/launch.h"

using namespace kf;

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                      \
    }                                                                               \
  } while (0)

static int g_failures = 0;
static int g_checks = 0;
#define EXPECT(cond, ...)                  \
  do {                                     \
    ++g_checks;                            \
    if (!(cond)) {                         \
      ++g_failures;                        \
      printf("  FAIL: " __VA_ARGS__);      \
      printf("\n");                        \
    }                                      \
  } while (0)

static std::mt19937_64 g_rng(20261130);
static perf::Version g_v;  // the version under test
static float randn() {
  static std::normal_distribution<float> d(0.f, 1.f);
  return d(g_rng);
}
static int randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_rng); }

static uint16_t to16(float f, DType t) { return store_16(f, t); }
static double from16(uint16_t h, DType t) { return load_16(h, t); }
static const uint16_t kNaN16 = 0xFFFF;  // NaN in bf16 and fp16

template <typename X>
struct DevBuf {
  X* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t n_ = 0) : n(n_) {
    if (n) CK(cudaMalloc(&p, n * sizeof(X)));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void up(const std::vector<X>& h) { CK(cudaMemcpy(p, h.data(), n * sizeof(X), cudaMemcpyHostToDevice)); }
  std::vector<X> down() const {
    std::vector<X> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(X), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_bytes(int v) { CK(cudaMemset(p, v, n * sizeof(X))); }
};

int num_sms() {
  int dev, n;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

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

  const int workers = c.num_workers ? c.num_workers : g_v.workers(0, s.rows);
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
  CK((s.rows <= 16 ? g_v.small : g_v.large)(s.p, 0));
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
    build_schedule(clamped.data(), s.batch, c.h_q, c.s_q, s.p.num_workers, meta.data());
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
  CK((s.rows <= 16 ? g_v.small : g_v.large)(s.p, st));
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

static bool g_profile = false;  // one eager launch, no graph (for ncu)
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
    if (g_profile) {
      CK(fn(p, st));
      CK(cudaStreamSynchronize(st));
      for (auto* tt : tables) delete tt;
      cudaStreamDestroy(st);
      return {0, 0, 0};
    }
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


namespace kf::perf {
Version make_v0();
Version make_v1();
Version make_v2();
Version make_v3();
Version make_v4();
Version make_v5();
Version make_v6();
}  // namespace kf::perf

static std::vector<Case> check_cases() {
  std::vector<Case> cases;
  { Case c; c.name = "v2lite split"; c.seqlens = {4096, 1, 0, 63, 64, 65, 1000, 2500, 777}; cases.push_back(c); }
  { Case c; c.name = "3 workers, many pieces"; c.page_size = 16; c.num_workers = 3;
    for (int i = 0; i < 40; ++i) c.seqlens.push_back(randint(0, 300));
    cases.push_back(c); }
  { Case c; c.name = "h128"; c.h_q = 128; c.page_size = 32; c.seqlens = {3000, 17, 1024, 0}; cases.push_back(c); }
  { Case c; c.name = "h128 b=8 long, 5 workers"; c.h_q = 128; c.num_workers = 5;
    for (int i = 0; i < 8; ++i) c.seqlens.push_back(randint(1, 5000));
    cases.push_back(c); }
  { Case c; c.name = "s_q=4 causal (64 rows)"; c.s_q = 4; c.seqlens = {300, 2, 4100, 3}; cases.push_back(c); }
  { Case c; c.name = "h64 s_q=2 page 128"; c.h_q = 64; c.s_q = 2; c.page_size = 128; c.seqlens = {1500, 130}; cases.push_back(c); }
  { Case c; c.name = "h16 page 16"; c.page_size = 16; c.seqlens = {2049, 1, 0, 900}; cases.push_back(c); }
  { Case c; c.name = "h16 scale 1 (large scores)"; c.scale = 1.0f; c.seqlens = {4096, 333, 1200}; cases.push_back(c); }
  { Case c; c.name = "h128 scale 1 (large scores)"; c.h_q = 128; c.scale = 1.0f; c.seqlens = {2000, 77}; cases.push_back(c); }
  { Case c; c.name = "device errors"; c.page_size = 16; c.max_pages_per_seq = 8; c.seqlens = {100, 5000, -3, 50};
    c.bad_pages = {{0, 2}, {0, 3}}; c.expect_flags = 1 | 2; cases.push_back(c); }
  return cases;
}

struct Row { std::string what; int h_q, b; double us[8]; };

int main(int argc, char** argv) {
  bool do_time = true;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--no-time") do_time = false;
    if (std::string(argv[i]) == "--profile") g_profile = true;
  }
  if (g_profile) {  // v0 and v5 only, h_q=16 b=64 and h_q=128 b=64 (eager, for ncu)
    const int pool_pages = 64 * 64 + 64;
    DevBuf<uint16_t> pool(size_t(pool_pages) * 64 * kHeadDim);
    fill_random<<<1024, 256>>>(pool.p, pool.n, 1234);
    for (perf::Version v : {perf::make_v0(), perf::make_v5()}) {
      time_decode(16, 64, 4096, v.small_only, v.workers(0, 16), pool.p, pool_pages);
      time_decode(128, 64, 4096, v.large_only, v.workers(0, 128), pool.p, pool_pages);
    }
    CK(cudaDeviceSynchronize());
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  // Run 1 compared v0 v1 v2 v3 (results-run1.log); run 2: v0 vs the combinations.
  std::vector<perf::Version> vs = {perf::make_v0(), perf::make_v4(), perf::make_v5(), perf::make_v6()};
  if (getenv("PERF_RUN1")) vs = {perf::make_v0(), perf::make_v1(), perf::make_v2(), perf::make_v3()};
  const int nv = int(vs.size());
  std::vector<int> fails(nv, 0);
  for (int v = 0; v < nv; ++v) {
    g_v = vs[v];
    printf("==== %s: checks (workers h16 %d, h128 %d)\n", g_v.name, g_v.workers(0, 16), g_v.workers(0, 128));
    const int f0 = g_failures;
    for (const Case& c : check_cases()) check_case(c);
    check_graph();
    fails[v] = g_failures - f0;
    printf("==== %s: %d failures\n", g_v.name, fails[v]);
  }
  printf("\nCHECKS: %d passed, %d failed\n", g_checks - g_failures, g_failures);
  if (!do_time) return g_failures ? 1 : 0;

  const int pool_pages = 2 * 128 * 64 + 64;
  DevBuf<uint16_t> pool(size_t(pool_pages) * 64 * kHeadDim);
  fill_random<<<1024, 256>>>(pool.p, pool.n, 1234);
  CK(cudaDeviceSynchronize());
  const int s_k = 4096, sms = num_sms();
  std::vector<Row> rows;
  auto add = [&](const std::string& what, int h_q, int b, auto fn_of, auto workers_of) {
    Row r{what, h_q, b, {}};
    for (int v = 0; v < nv; ++v) {
      g_v = vs[v];
      TimeResult t = time_decode(h_q, b, s_k, fn_of(vs[v]), workers_of(vs[v]), pool.p, pool_pages);
      r.us[v] = t.us;
    }
    rows.push_back(r);
  };
  auto full = [](const perf::Version& v) { return v.small; };
  auto fullL = [](const perf::Version& v) { return v.large; };
  auto only = [](const perf::Version& v) { return v.small_only; };
  auto onlyL = [](const perf::Version& v) { return v.large_only; };
  auto dflt16 = [](const perf::Version& v) { return v.workers(0, 16); };
  auto dflt128 = [](const perf::Version& v) { return v.workers(0, 128); };
  for (int b : {1, 64, 128}) add("h16 decode+combine", 16, b, full, dflt16);
  for (int b : {64, 128}) add("h128 decode+combine", 128, b, fullL, dflt128);
  add("h16 decode only", 16, 64, only, dflt16);
  add("h128 decode only", 128, 64, onlyL, dflt128);
  for (int w : {32, 64, 128}) add("h16 d+c workers=" + std::to_string(w), 16, 1, full, [w](const perf::Version&) { return w; });
  add("h16 d+c workers=SMs", 16, 64, full, [sms](const perf::Version&) { return sms; });

  printf("\nTimings: s_k=%d, page 64, bf16, CUDA graph, caches rotated, median us (GB/s | TFLOPS)\n", s_k);
  printf("%-24s %4s %5s", "what", "h_q", "b");
  for (int v = 0; v < nv; ++v) printf(" %17s", vs[v].name);
  printf("\n");
  for (const Row& r : rows) {
    printf("%-24s %4d %5d", r.what.c_str(), r.h_q, r.b);
    for (int v = 0; v < nv; ++v) {
      const double bytes = double(r.b) * s_k * 1152, flops = 2.0 * r.b * r.h_q * double(s_k) * 1088;
      const double rate = r.h_q == 16 ? bytes / r.us[v] * 1e-3 : flops / r.us[v] * 1e-6;
      printf(" %7.1f (%5.0f%s)", r.us[v], rate, r.h_q == 16 ? "G" : "T");
    }
    printf("\n");
  }
  printf("checks:");
  for (int v = 0; v < nv; ++v) printf(" %s %s", vs[v].name, fails[v] ? "FAIL" : "ok");
  printf("\n");
  return g_failures ? 1 : 0;
}
