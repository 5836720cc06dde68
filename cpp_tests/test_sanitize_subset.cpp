// The GPU subset that scripts/sanitize.sh runs under compute-sanitizer (GpuSanitize.*), and the
// device-side contents cases (GpuContents.*): block_table entries outside [0, num_pages),
// cache_seqlens negative or beyond what the block table addresses, slot_mapping past the cache.
// The host cannot see those values without a sync, so the kernels must mask or clamp them, never
// touch memory outside the tensors (memcheck proves it), and report them in the error buffer.
//
// Shapes are small because the sanitizers slow kernels 10-100x. Every device buffer is uploaded
// whole from an initialized host buffer (NaN in page padding and spare pages, NaN-poisoned out,
// lse and workspace), so initcheck judges the kernels' own reads. Skips without a CUDA device.
#include "gpu_util.h"

using namespace kft;

namespace {

#if KF_TESTS_WITH_CUDA

// A host tensor with the dtype, shape and strides of `t` (for results downloaded from a device).
HostTensor same_layout(HostTensor& t) {
  DLTensor* d = t.dl();
  std::vector<int64_t> strides;
  if (d->strides) strides.assign(d->strides, d->strides + d->ndim);
  return HostTensor(d->dtype, t.shape(), strides);
}

// Rows of the out tensor `o` of problem `pr` as doubles, whatever its strides.
std::vector<double> row_of(HostTensor& o, const Problem& pr, int r, int s, int h) {
  DLTensor* t = o.dl();
  const int64_t st0 = t->strides ? t->strides[0] : int64_t(pr.s_q) * pr.h_q * 512;
  const int64_t st1 = t->strides ? t->strides[1] : int64_t(pr.h_q) * 512;
  const int64_t st2 = t->strides ? t->strides[2] : 512;
  const uint16_t* p = o.ptr<uint16_t>() + r * st0 + s * st1 + h * st2;
  std::vector<double> v(512);
  for (int d = 0; d < 512; ++d) v[d] = from_16(p[d], pr.bf16);
  return v;
}

// Two finished decodes of one problem (x: GPU, y: CPU backend): rows that see nothing exactly 0
// and -inf in both, other rows within docs/spec.md section 4's thresholds.
void expect_outputs_close(const Problem& pr, HostTensor& xo, HostTensor& xl, HostTensor& yo,
                          HostTensor& yl, double max_cos = 1e-5, double max_lse = 1e-4) {
  double worst = 0, worst_lse = 0;
  for (int r = 0; r < pr.batch; ++r)
    for (int s = 0; s < pr.s_q; ++s)
      for (int h = 0; h < pr.h_q; ++h) {
        const auto x = row_of(xo, pr, r, s, h), y = row_of(yo, pr, r, s, h);
        const size_t li = (size_t(r) * pr.h_q + h) * pr.s_q + s;
        const float lx = xl.ptr<float>()[li], ly = yl.ptr<float>()[li];
        if (ly == -INFINITY) {
          ASSERT_EQ(lx, -INFINITY) << "r=" << r << " s=" << s << " h=" << h;
          for (int d = 0; d < 512; ++d) ASSERT_EQ(x[d], 0.0) << "r=" << r << " s=" << s << " h=" << h;
          continue;
        }
        for (int d = 0; d < 512; ++d) ASSERT_TRUE(std::isfinite(x[d])) << "r=" << r << " s=" << s << " h=" << h;
        ASSERT_TRUE(std::isfinite(lx)) << "r=" << r;
        worst = std::max(worst, cosine_distance(x, y.data(), 512));
        worst_lse = std::max(worst_lse, std::fabs(double(lx) - double(ly)));
      }
  EXPECT_LT(worst, max_cos);
  EXPECT_LT(worst_lse, max_lse);
}

Problem small_problem(std::vector<int> seqlens, int page_size, int num_workers) {
  Problem pr;
  pr.batch = int(seqlens.size());
  pr.s_q = 1;
  pr.h_q = 16;
  pr.page_size = page_size;
  pr.num_workers = num_workers;
  pr.seqlens = std::move(seqlens);
  return pr;
}

int32_t& table_at(Built& b, int r, int j) { return b.block_table.ptr<int32_t>()[r * b.max_pages + j]; }

// Pages no request uses (build_problem leaves 3 spare pages, NaN-filled).
std::vector<int> spare_pages(Built& b) {
  std::vector<bool> used(b.num_pages, false);
  for (int r = 0; r < b.pr.batch; ++r)
    for (int j = 0; j < (b.pr.seqlens[r] + b.pr.page_size - 1) / b.pr.page_size; ++j) used[table_at(b, r, j)] = true;
  std::vector<int> spare;
  for (int p = 0; p < b.num_pages; ++p)
    if (!used[p]) spare.push_back(p);
  return spare;
}

// Gives request r real tokens up to `len` positions: unused block_table columns get spare pages
// and padding rows get random values, in the host cache and in b.kv (the reference's view).
void extend_request(Built& b, int r, int len, std::mt19937_64& rng) {
  const int ps = b.pr.page_size;
  ASSERT_LE(len, b.max_pages * ps);
  std::vector<int> spare = spare_pages(b);
  const int have_pages = (b.pr.seqlens[r] + ps - 1) / ps;
  for (int j = have_pages; j < (len + ps - 1) / ps; ++j) {
    ASSERT_FALSE(spare.empty()) << "not enough spare pages";
    table_at(b, r, j) = spare.back();
    spare.pop_back();
  }
  std::normal_distribution<float> normal;
  for (int t = b.pr.seqlens[r]; t < len; ++t) {
    uint16_t* row = b.cache.ptr<uint16_t>() + (int64_t(table_at(b, r, t / ps)) * ps + t % ps) * 576;
    for (int d = 0; d < 576; ++d) {
      row[d] = to_16(normal(rng), b.pr.bf16);
      b.kv[r].push_back(from_16(row[d], b.pr.bf16));
    }
  }
  b.pr.seqlens[r] = len;  // the reference's length; the device's cache_seqlens stay as they are
}

// The optional error buffer: int32[len] = [0, -1, 0, sentinel...]; words past 2 must never change.
constexpr int32_t kSentinel = 0x5A5A5A5A;
struct ErrorBuffer {
  explicit ErrorBuffer(int len = 4) : host(kI32, {len}), dev(reset_host(host)) {}
  static HostTensor& reset_host(HostTensor& h) {
    int32_t* w = h.ptr<int32_t>();
    for (int64_t i = 0; i < h.numel(); ++i) w[i] = kSentinel;
    w[0] = 0;
    w[1] = -1;
    w[2] = 0;
    return h;
  }
  void reset() {
    reset_host(host);
    dev.upload(host);
    cudaDeviceSynchronize();
  }
  std::vector<int32_t> read() {
    HostTensor h(kI32, host.shape());
    dev.download(h);
    return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + h.numel());
  }
  HostTensor host;
  DeviceTensor dev;
};

std::string words(const std::vector<int32_t>& w) {
  std::string s = "[";
  for (size_t i = 0; i < w.size(); ++i) s += (i ? ", " : "") + std::to_string(w[i]);
  return s + "]";
}

void expect_clean(const std::vector<int32_t>& w) {
  ASSERT_GE(w.size(), 4u);
  EXPECT_EQ(w[0], 0) << words(w);
  EXPECT_EQ(w[1], -1) << words(w);
  EXPECT_EQ(w[2], 0) << words(w);
  for (size_t i = 3; i < w.size(); ++i) EXPECT_EQ(w[i], kSentinel) << "word " << i << " written: " << words(w);
}

void expect_report(const std::vector<int32_t>& w, int32_t flags, int32_t req, int32_t value) {
  ASSERT_GE(w.size(), 4u);
  EXPECT_EQ(w[0], flags) << words(w);
  EXPECT_EQ(w[1], req) << words(w);
  EXPECT_EQ(w[2], value) << words(w);
  for (size_t i = 3; i < w.size(); ++i) EXPECT_EQ(w[i], kSentinel) << "word " << i << " written: " << words(w);
}

// Runs metadata + decode of `b` on the GPU as its host tensors are now (possibly with bad
// contents), with an error buffer; downloads out/lse into b's host tensors.
void gpu_decode(Built& b, ErrorBuffer& eb) {
  DeviceProblem dev(b);
  ASSERT_TRUE(dev.ok() && eb.dev.ok()) << "cudaMalloc failed";
  ASSERT_EQ(dev.step(b.pr, b.pr.bf16 ? KF_KV_BF16 : KF_KV_FP16, eb.dev.dl()), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(dev.download_results(b));
}

#endif  // KF_TESTS_WITH_CUDA

// ---- GpuSanitize: the representative subset, small shapes --------------------------------------

struct SanCase {
  const char* name;
  bool bf16;
  int batch, s_q, h_q, page_size, max_len;
  double zero_fraction;
  int num_workers;  // 0: the device default
  bool strided, cache_4d;
};
void PrintTo(const SanCase& c, std::ostream* os) { *os << c.name; }

std::vector<SanCase> san_cases() {
  return {
      {"Bf16Hq16Page64Split", true, 3, 1, 16, 64, 400, 0.0, 8, false, false},
      {"Fp16Hq16Sq2Page16", false, 3, 2, 16, 16, 300, 0.3, 5, false, false},   // 32 rows
      {"Bf16Hq128Page32", true, 2, 1, 128, 32, 200, 0.0, 4, false, false},     // two row tiles
      {"Fp16Hq64Sq4Page64", false, 2, 4, 64, 64, 150, 0.0, 3, false, false},   // four row tiles
      {"Bf16OneWorker", true, 3, 1, 16, 64, 300, 0.3, 1, false, false},        // no workspace
      {"Bf16DefaultWorkers", true, 4, 1, 16, 32, 500, 0.25, 0, false, false},  // mostly idle workers
      {"Bf16ShorterThanSq", true, 5, 3, 8, 16, 4, 0.2, 6, false, false},       // causal empty rows
      {"Bf16StridedQOut4dCache", true, 3, 2, 16, 32, 250, 0.0, 7, true, true},
  };
}

class GpuSanitize : public ::testing::TestWithParam<SanCase> {};

TEST_P(GpuSanitize, DecodeMatchesCpuBackend) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  const SanCase& c = GetParam();
  auto rng = test_rng();
  Problem pr = problem_of(c);
  pr.strided = c.strided;
  pr.cache_4d = c.cache_4d;
  pr.num_workers = c.num_workers;
  if (pr.num_workers == 0) {
    ASSERT_EQ(kf_mla_default_num_workers_for_format(0, c.h_q, c.s_q, KF_KV_BF16, &pr.num_workers),
              KF_SUCCESS)
        << kf_last_error();
  }
  pr.seqlens = random_lengths(rng, c.batch, c.max_len, c.zero_fraction);
  Built b = build_problem(pr, rng);
  DeviceProblem dev(b);  // uploads before the CPU run: out/lse/workspace go up poisoned
  ASSERT_TRUE(dev.ok()) << "cudaMalloc failed";
  ErrorBuffer eb;
  const auto meta_cpu = b.metadata.snapshot();
  ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
  HostTensor cpu_out = same_layout(b.out), cpu_lse = same_layout(b.lse);
  std::memcpy(cpu_out.ptr<uint8_t>(), b.out.ptr<uint8_t>(), b.out.bytes());
  std::memcpy(cpu_lse.ptr<uint8_t>(), b.lse.ptr<uint8_t>(), b.lse.bytes());

  ASSERT_EQ(dev.step(pr, c.bf16 ? KF_KV_BF16 : KF_KV_FP16, eb.dev.dl()), KF_SUCCESS) << kf_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(dev.download_results(b));
  CUDA_OK(dev.metadata.download(b.metadata));
  const auto meta_gpu = b.metadata.snapshot();
  EXPECT_EQ(metadata_expected_on_gpu(pr, meta_cpu, meta_gpu), meta_gpu)
      << "GPU metadata differs from the CPU scheduler's";
  expect_clean(eb.read());
  expect_outputs_close(pr, b.out, b.lse, cpu_out, cpu_lse);
  expect_matches_reference(b);  // the GPU result against float64
#endif
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuSanitize, ::testing::ValuesIn(san_cases()),
                         [](const ::testing::TestParamInfo<SanCase>& i) { return std::string(i.param.name); });

TEST(GpuSanitizeAppend, WritesTheCpuBytes) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (bool bf16 : {true, false}) {
    auto rng = test_rng(bf16);
    std::normal_distribution<float> normal;
    const int n = 70, num_pages = 5, ps = 32;
    const DLDataType dt = bf16 ? kBF16 : kF16;
    HostTensor kv(dt, {n, 576}), slots(kI64, {n}), cache(dt, {num_pages, ps, 576});
    for (int64_t i = 0; i < kv.numel(); ++i) kv.ptr<uint16_t>()[i] = to_16(normal(rng), bf16);
    std::vector<int64_t> perm(num_pages * ps);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = i % 6 == 5 ? -1 - i : perm[i];
    cache.fill<uint16_t>(nan_16(bf16));
    DeviceTensor dkv(kv), dslots(slots), dcache(cache);
    ErrorBuffer eb;
    const kf_kv_format fmt = bf16 ? KF_KV_BF16 : KF_KV_FP16;
    ASSERT_EQ(kf_cache_append(dkv.dl(), dcache.dl(), fmt, dslots.dl(), eb.dev.dl(), nullptr), KF_SUCCESS)
        << kf_last_error();
    ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), fmt, slots.dl(), nullptr, nullptr), KF_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    HostTensor got(dt, {num_pages, ps, 576});
    CUDA_OK(dcache.download(got));
    EXPECT_EQ(cache.snapshot(), got.snapshot());
    expect_clean(eb.read());
  }
#endif
}

// 8-bit caches: the GPU appends the CPU's bytes and decodes like the CPU backend, with and
// without KF_SM90A_KV8 (on an H200: the sm_90a 8-bit kernel, else the portable one).
TEST(GpuSanitize8bit, AppendAndDecodeMatchCpu) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (const char* kv8 : {"", "1"})
  for (kf_kv_format fmt : {KF_KV_FP8_E4M3, KF_KV_INT8}) {
    SCOPED_TRACE(std::string("KF_SM90A_KV8=") + kv8);
    EnvScope kv8_scope("KF_SM90A_KV8", kv8);
    auto rng = test_rng(fmt);
    Problem pr = small_problem({150, 0, 77}, 16, 5);
    pr.s_q = 2;
    Built b = build_problem(pr, rng);
    HostTensor cpu_cache = append_8bit_cache(b, fmt, 0xff);
    int total = 0;
    for (int len : pr.seqlens) total += len;
    HostTensor kv(kBF16, {total, 576}), slots(kI64, {total});
    for (int r = 0, i = 0; r < pr.batch; ++r)
      for (int t = 0; t < pr.seqlens[r]; ++t, ++i) {
        for (int d = 0; d < 576; ++d) kv.ptr<uint16_t>()[i * 576 + d] = to_bf16(float(b.kv[r][size_t(t) * 576 + d]));
        slots.ptr<int64_t>()[i] = int64_t(table_at(b, r, t / pr.page_size)) * pr.page_size + t % pr.page_size;
      }
    HostTensor gpu_cache(kU8, {b.num_pages, pr.page_size, 644});
    gpu_cache.fill_bytes(0xff);
    DeviceTensor dkv(kv), dslots(slots), dcache(gpu_cache);
    DeviceProblem dev(b);
    ErrorBuffer eb;
    const kf_status s = kf_cache_append(dkv.dl(), dcache.dl(), fmt, dslots.dl(), eb.dev.dl(), nullptr);
    ASSERT_EQ(s, KF_SUCCESS) << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(dcache.download(gpu_cache));
    EXPECT_EQ(cpu_cache.snapshot(), gpu_cache.snapshot());

    ASSERT_EQ(decode_8bit(b, cpu_cache, fmt), KF_SUCCESS) << kf_last_error();
    HostTensor cpu_out = same_layout(b.out), cpu_lse = same_layout(b.lse);
    std::memcpy(cpu_out.ptr<uint8_t>(), b.out.ptr<uint8_t>(), b.out.bytes());
    std::memcpy(cpu_lse.ptr<uint8_t>(), b.lse.ptr<uint8_t>(), b.lse.bytes());
    ASSERT_EQ(dev.metadata_call(pr), KF_SUCCESS) << kf_last_error();
    const kf_status d = dev.decode(pr, fmt, eb.dev.dl(), nullptr, dcache.dl());
    ASSERT_EQ(d, KF_SUCCESS) << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(dev.out.download(b.out));
    CUDA_OK(dev.lse.download(b.lse));
    expect_outputs_close(pr, b.out, b.lse, cpu_out, cpu_lse);
    expect_clean(eb.read());
  }
#endif
}

// One decode step (append one token per request, metadata, decode) captured in a CUDA graph and
// replayed with new lengths, slots and rows: each replay against the CPU backend on a host
// mirror of the cache, and bit-identical to the same step run eagerly.
TEST(GpuSanitizeGraph, CapturedStepMatchesCpuAndEager) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  std::normal_distribution<float> normal;
  Problem pr = small_problem({200, 150, 90}, 32, 6);
  Built b = build_problem(pr, rng);  // every position < the built length holds a real token
  const std::vector<int> built_len = pr.seqlens;
  DeviceProblem dev(b);
  ASSERT_TRUE(dev.ok());
  HostTensor kv(kBF16, {pr.batch, 576}), slots(kI64, {pr.batch});
  for (int64_t i = 0; i < kv.numel(); ++i) kv.ptr<uint16_t>()[i] = to_bf16(normal(rng));
  for (int r = 0; r < pr.batch; ++r) slots.ptr<int64_t>()[r] = -1;
  DeviceTensor dkv(kv), dslots(slots);
  ErrorBuffer eb;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto step = [&] {
    const kf_status a = kf_cache_append(dkv.dl(), dev.cache.dl(), KF_KV_BF16, dslots.dl(), eb.dev.dl(), stream);
    const kf_status d = dev.step(pr, KF_KV_BF16, eb.dev.dl(), stream);
    return a != KF_SUCCESS ? a : d;
  };
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const kf_status captured = step();
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, KF_SUCCESS) << kf_last_error();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int replay = 0; replay < 3; ++replay) {
    // New lengths (0 allowed), the new token at position len - 1, fresh rows.
    std::vector<int> lens(pr.batch);
    for (int r = 0; r < pr.batch; ++r) {
      lens[r] = std::uniform_int_distribution<int>(0, built_len[r])(rng);
      if (replay == 0 && r == 1) lens[r] = 0;
      b.cache_seqlens.ptr<int32_t>()[r] = lens[r];
      const int t = lens[r] - 1;
      slots.ptr<int64_t>()[r] = t < 0 ? -1 : int64_t(table_at(b, r, t / pr.page_size)) * pr.page_size + t % pr.page_size;
      for (int d = 0; d < 576; ++d) kv.ptr<uint16_t>()[r * 576 + d] = to_bf16(normal(rng));
    }
    CUDA_OK(dev.cache_seqlens.upload(b.cache_seqlens, stream));
    CUDA_OK(dslots.upload(slots, stream));
    CUDA_OK(dkv.upload(kv, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    HostTensor g_out = same_layout(b.out), g_lse = same_layout(b.lse);
    CUDA_OK(dev.out.download(g_out));
    CUDA_OK(dev.lse.download(g_lse));

    // The host mirror: the same append, metadata and decode on the CPU backend.
    ASSERT_EQ(kf_cache_append(kv.dl(), b.cache.dl(), KF_KV_BF16, slots.dl(), nullptr, nullptr), KF_SUCCESS)
        << kf_last_error();
    ASSERT_EQ(kf_mla_metadata_for_format(b.cache_seqlens.dl(), pr.h_q, pr.s_q, pr.num_workers,
                                         KF_KV_BF16, b.metadata.dl(), nullptr),
              KF_SUCCESS);
    ASSERT_EQ(run_decode(b), KF_SUCCESS) << kf_last_error();
    Problem now = pr;
    now.seqlens = lens;
    expect_outputs_close(now, g_out, g_lse, b.out, b.lse);
    HostTensor g_cache = same_layout(b.cache);
    CUDA_OK(dev.cache.download(g_cache));
    EXPECT_EQ(g_cache.snapshot(), b.cache.snapshot()) << "replay " << replay << ": cache bytes";

    // The same step eagerly (the append rewrites the same bytes): the graph's bits.
    ASSERT_EQ(step(), KF_SUCCESS) << kf_last_error();
    CUDA_OK(cudaStreamSynchronize(stream));
    HostTensor e_out = same_layout(b.out), e_lse = same_layout(b.lse);
    CUDA_OK(dev.out.download(e_out));
    CUDA_OK(dev.lse.download(e_lse));
    EXPECT_EQ(e_out.snapshot(), g_out.snapshot()) << "replay " << replay;
    EXPECT_EQ(e_lse.snapshot(), g_lse.snapshot()) << "replay " << replay;
  }
  expect_clean(eb.read());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
#endif
}

// ---- GpuContents: out-of-range device-side values --------------------------------------------

TEST(GpuContents, NegativeSeqlenGivesEmptyRowsAndIsReported) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (int32_t bad : {-1, -5000, INT32_MIN}) {
    auto rng = test_rng(uint32_t(bad));
    Built b = build_problem(small_problem({120, 70, 200}, 32, 6), rng);
    b.cache_seqlens.ptr<int32_t>()[1] = bad;
    ErrorBuffer eb;
    gpu_decode(b, eb);
    expect_report(eb.read(), KF_DEVERR_SEQLEN_RANGE, 1, bad);
    b.pr.seqlens[1] = 0;  // the reference: request 1 sees nothing (o = 0, lse = -inf)
    expect_matches_reference(b);
  }
#endif
}

TEST(GpuContents, SeqlenBeyondBlockTableIsClampedAndReported) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (int over : {1, 31, 1000}) {
    auto rng = test_rng(over);
    Built b = build_problem(small_problem({70, 100, 90}, 32, 6), rng);
    const int cap = b.max_pages * b.pr.page_size;
    extend_request(b, 1, cap, rng);  // real tokens up to the clamp: the result is checkable
    b.cache_seqlens.ptr<int32_t>()[1] = cap + over;
    ErrorBuffer eb;
    gpu_decode(b, eb);
    expect_report(eb.read(), KF_DEVERR_SEQLEN_RANGE, 1, cap + over);
    expect_matches_reference(b);  // request 1 over its first `cap` positions
  }
#endif
}

// A huge length makes the scheduler see ~2^25 tiles; the requests scheduled after it must still
// be decoded (and the bad one clamped), not dropped with a metadata report.
TEST(GpuContents, HugeSeqlenLeavesOtherRequestsRight) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (int32_t bad : {1 << 30, INT32_MAX - 64, INT32_MAX}) {
    for (int workers : {4, 16}) {
      SCOPED_TRACE("cache_seqlens[1] = " + std::to_string(bad) + ", " + std::to_string(workers) + " workers");
      auto rng = test_rng(uint64_t(bad) * 7 + workers);
      Built b = build_problem(small_problem({60, 150, 100, 40}, 32, workers), rng);
      const int cap = b.max_pages * b.pr.page_size;
      extend_request(b, 1, cap, rng);
      b.cache_seqlens.ptr<int32_t>()[1] = bad;
      ErrorBuffer eb;
      gpu_decode(b, eb);
      expect_report(eb.read(), KF_DEVERR_SEQLEN_RANGE, 1, bad);
      expect_matches_reference(b);
    }
  }
#endif
}

TEST(GpuContents, PageOutOfRangeIsMaskedAndReported) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  for (int which = 0; which < 4; ++which) {
    auto rng = test_rng(which);
    Built b = build_problem(small_problem({130, 100, 60}, 32, 6), rng);
    const int32_t bad = which == 0 ? b.num_pages : which == 1 ? -1 : which == 2 ? INT32_MAX : INT32_MIN;
    SCOPED_TRACE("block_table[1, 1] = " + std::to_string(bad));
    table_at(b, 1, 1) = bad;  // positions 32..63 of request 1
    ErrorBuffer eb;
    gpu_decode(b, eb);
    expect_report(eb.read(), KF_DEVERR_PAGE_RANGE, 1, bad);
    // Masked: request 1 attends to its other positions (s_q = 1: every position is visible, so
    // dropping the page's rows is the same softmax).
    b.kv[1].erase(b.kv[1].begin() + 32 * 576, b.kv[1].begin() + 64 * 576);
    b.pr.seqlens[1] -= 32;
    expect_matches_reference(b);
  }
#endif
}

TEST(GpuContents, AllPagesOutOfRangeGiveAnEmptyRow) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  Built b = build_problem(small_problem({130, 100, 60}, 32, 6), rng);
  const int32_t bad = b.num_pages + 7;
  table_at(b, 2, 0) = bad;
  table_at(b, 2, 1) = bad;
  ErrorBuffer eb;
  gpu_decode(b, eb);
  expect_report(eb.read(), KF_DEVERR_PAGE_RANGE, 2, bad);
  b.pr.seqlens[2] = 0;
  expect_matches_reference(b);
#endif
}

TEST(GpuContents, SlotBeyondCacheIsSkippedAndReported) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  const int num_pages = 4, ps = 16, n = 6;
  const int64_t num_slots = num_pages * ps;
  for (int64_t bad : {num_slots, num_slots + 1000, int64_t(1) << 40, INT64_MAX}) {
    SCOPED_TRACE("slot_mapping[1] = " + std::to_string(bad));
    auto rng = test_rng(uint64_t(bad));
    std::normal_distribution<float> normal;
    HostTensor kv(kBF16, {n, 576}), slots(kI64, {n}), cache(kBF16, {num_pages, ps, 576});
    for (int64_t i = 0; i < kv.numel(); ++i) kv.ptr<uint16_t>()[i] = to_bf16(normal(rng));
    const int64_t s[n] = {3, bad, -1, 17, INT64_MIN, num_slots - 1};
    for (int i = 0; i < n; ++i) slots.ptr<int64_t>()[i] = s[i];
    cache.fill<uint16_t>(nan_16(true));
    DeviceTensor dkv(kv), dslots(slots), dcache(cache);
    ErrorBuffer eb;
    ASSERT_EQ(kf_cache_append(dkv.dl(), dcache.dl(), KF_KV_BF16, dslots.dl(), eb.dev.dl(), nullptr), KF_SUCCESS)
        << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    expect_report(eb.read(), KF_DEVERR_SLOT_RANGE, 1, int32_t(bad));  // word 2: the value as int32
    // The other rows landed, the bad one was skipped: the CPU's bytes with that row skipped.
    slots.ptr<int64_t>()[1] = -1;
    ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(), KF_KV_BF16, slots.dl(), nullptr, nullptr), KF_SUCCESS)
        << kf_last_error();
    HostTensor got(kBF16, {num_pages, ps, 576});
    CUDA_OK(dcache.download(got));
    EXPECT_EQ(cache.snapshot(), got.snapshot());
  }
#endif
}

// The contract of kernelflow.h: the caller zeroes the buffer (word 1 to -1); the library only
// ORs flags into word 0 and sets words 1-2 once, for the first bad value, across calls, until the
// caller resets it; clean calls leave it alone; nothing past word 2 is written.
TEST(GpuContents, ErrorBufferContract) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  std::normal_distribution<float> normal;
  Built b = build_problem(small_problem({130, 100, 60}, 32, 6), rng);
  DeviceProblem dev(b);
  ASSERT_TRUE(dev.ok());
  ErrorBuffer eb(8);
  HostTensor kv(kBF16, {2, 576}), slots(kI64, {2});
  for (int64_t i = 0; i < kv.numel(); ++i) kv.ptr<uint16_t>()[i] = to_bf16(normal(rng));
  const int64_t spare_slot = int64_t(spare_pages(b).front()) * b.pr.page_size;
  slots.ptr<int64_t>()[0] = spare_slot;
  slots.ptr<int64_t>()[1] = -1;
  DeviceTensor dkv(kv), dslots(slots);
  auto decode = [&] {
    ASSERT_EQ(dev.step(b.pr, KF_KV_BF16, eb.dev.dl()), KF_SUCCESS) << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
  };
  auto append = [&] {
    CUDA_OK(dslots.upload(slots));
    ASSERT_EQ(kf_cache_append(dkv.dl(), dev.cache.dl(), KF_KV_BF16, dslots.dl(), eb.dev.dl(), nullptr), KF_SUCCESS)
        << kf_last_error();
    CUDA_OK(cudaDeviceSynchronize());
  };

  decode();
  append();
  expect_clean(eb.read());  // clean calls write nothing

  const int32_t bad_page = b.num_pages + 3;
  table_at(b, 2, 0) = bad_page;
  CUDA_OK(dev.block_table.upload(b.block_table));
  decode();
  expect_report(eb.read(), KF_DEVERR_PAGE_RANGE, 2, bad_page);

  const int64_t bad_slot = int64_t(b.num_pages) * b.pr.page_size + 5;
  slots.ptr<int64_t>()[1] = bad_slot;
  append();  // not reset: the flag joins, the first fault (request 2) stays in words 1-2
  expect_report(eb.read(), KF_DEVERR_PAGE_RANGE | KF_DEVERR_SLOT_RANGE, 2, bad_page);

  decode();  // the same fault again changes nothing
  expect_report(eb.read(), KF_DEVERR_PAGE_RANGE | KF_DEVERR_SLOT_RANGE, 2, bad_page);

  eb.reset();  // the caller's reset; then the append's fault is the first
  append();
  expect_report(eb.read(), KF_DEVERR_SLOT_RANGE, 1, int32_t(bad_slot));

  // A buffer whose word 1 was left at 0 (not -1) gets the flags but keeps words 1-2.
  eb.reset();
  eb.host.ptr<int32_t>()[1] = 0;
  CUDA_OK(eb.dev.upload(eb.host));
  CUDA_OK(cudaDeviceSynchronize());
  decode();
  expect_report(eb.read(), KF_DEVERR_PAGE_RANGE, 0, 0);
#endif
}

// Values changed in place between replays of a captured decode are judged per replay.
TEST(GpuContents, ReportedInsideCudaGraphReplays) {
  KF_REQUIRE_GPU();
#if KF_TESTS_WITH_CUDA
  auto rng = test_rng();
  Built b = build_problem(small_problem({130, 100, 60}, 32, 6), rng);
  DeviceProblem dev(b);
  ASSERT_TRUE(dev.ok());
  ErrorBuffer eb;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const kf_status captured = dev.step(b.pr, KF_KV_BF16, eb.dev.dl(), stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, KF_SUCCESS) << kf_last_error();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  auto replay = [&] {
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
  };
  replay();
  expect_clean(eb.read());
  b.cache_seqlens.ptr<int32_t>()[2] = -3;
  CUDA_OK(dev.cache_seqlens.upload(b.cache_seqlens, stream));
  replay();
  expect_report(eb.read(), KF_DEVERR_SEQLEN_RANGE, 2, -3);
  b.cache_seqlens.ptr<int32_t>()[2] = 60;
  CUDA_OK(dev.cache_seqlens.upload(b.cache_seqlens, stream));
  eb.reset();
  replay();
  expect_clean(eb.read());
  CUDA_OK(dev.download_results(b));
  expect_matches_reference(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
#endif
}

}  // namespace
