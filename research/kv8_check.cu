// Standalone check + timing of the 8-bit KV cache path on the GPU (llm.c style, one binary, no
// Python): exhaustive dequant conversions, quantize-on-write bytes against the CPU backend (and
// a canary: no byte outside the written slots changes), bulk conversion bytes, decode against
// the CPU backend on the same 8-bit cache (worst row < 1e-5, lse < 1e-4) across dtypes, formats,
// page sizes, head counts, s_q and lengths, NaN page padding and bad pages, bit-identical reruns,
// graph replay == eager, accuracy against the unquantized float64 reference (SPEC.md 4); then
// timings of bf16 vs fp8_e4m3 vs int8 decode+combine in CUDA graphs at equal shapes.
//
// Build and run: bash research/run_kv8_check.sh (links src/cuda/**.cu and the CPU backend).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/half_convert.h"
#include "core/kv_format8.h"
#include "core/params.h"
#include "core/quant.h"
#include "core/scheduler.h"
#include "cpu/cpu_backend.h"
#include "cuda/combine/mla_combine.h"
#include "cuda/decode/sm80/kv8_dequant.cuh"
#include "cuda/decode/sm80/mla_decode_sm80.h"
#include "cuda/launch.h"
#ifdef KF_TIMELINE
#include "cuda/common/timeline.cuh"
#endif

using namespace kf;

#define KF_HARNESS_SEED 20261201
#include "harness.cuh"

static const char* fmt_name(KvFormat f) {
  switch (f) {
    case KvFormat::kBF16: return "bf16";
    case KvFormat::kFP16: return "fp16";
    case KvFormat::kFP8E4M3: return "fp8_e4m3";
    default: return "int8";
  }
}

// ---- 1. the dequant conversions, every byte ---------------------------------------------------
__global__ void conversions_kernel(float* e4m3_f16, float* int8_f16, float* e4m3_2m8) {
  const int v = threadIdx.x;  // 0..255, in every byte position of a word
  const uint32_t w = uint32_t(v) * 0x01010101u;
  uint32_t lo, hi;
  cuda::e4m3x4_to_f16(w, lo, hi);
  e4m3_f16[v] = __low2float(*reinterpret_cast<__half2*>(&lo));
  e4m3_f16[256 + v] = __high2float(*reinterpret_cast<__half2*>(&lo));
  e4m3_f16[512 + v] = __low2float(*reinterpret_cast<__half2*>(&hi));
  e4m3_f16[768 + v] = __high2float(*reinterpret_cast<__half2*>(&hi));
  cuda::e4m3x4_to_f16_2m8(w, lo, hi);  // the sm_80/86 path, values times 2^-8
  e4m3_2m8[v] = __low2float(*reinterpret_cast<__half2*>(&lo)) * 256.f;
  e4m3_2m8[256 + v] = __high2float(*reinterpret_cast<__half2*>(&lo)) * 256.f;
  e4m3_2m8[512 + v] = __low2float(*reinterpret_cast<__half2*>(&hi)) * 256.f;
  e4m3_2m8[768 + v] = __high2float(*reinterpret_cast<__half2*>(&hi)) * 256.f;
  cuda::int8x4_to_f16(w, lo, hi);
  int8_f16[v] = __low2float(*reinterpret_cast<__half2*>(&lo));
  int8_f16[256 + v] = __high2float(*reinterpret_cast<__half2*>(&lo));
  int8_f16[512 + v] = __low2float(*reinterpret_cast<__half2*>(&hi));
  int8_f16[768 + v] = __high2float(*reinterpret_cast<__half2*>(&hi));
}

static void check_conversions() {
  printf("[dequant conversions] every e4m3 and int8 byte, every byte position\n");
  DevBuf<float> a(1024), b(1024), c(1024);
  conversions_kernel<<<1, 256>>>(a.p, b.p, c.p);
  CK(cudaDeviceSynchronize());
  auto e = a.down(), i8 = b.down(), e2 = c.down();
  int bad_e = 0, bad_i = 0, bad_2 = 0;
  for (int pos = 0; pos < 4; ++pos)
    for (int v = 0; v < 256; ++v) {
      if ((v & 0x7f) != 0x7f) {  // e4m3 NaN: never written for finite input
        const float want = e4m3_to_float(uint8_t(v));
        if (float_bits(e[pos * 256 + v]) != float_bits(want)) ++bad_e;
        if (float_bits(e2[pos * 256 + v]) != float_bits(want)) ++bad_2;
      }
      if (v != 0x80 && i8[pos * 256 + v] != float(int8_t(v))) ++bad_i;
    }
  EXPECT(bad_e == 0 && bad_i == 0 && bad_2 == 0,
         "conversions: %d e4m3, %d int8, %d e4m3 (bit trick, 2^-8) wrong", bad_e, bad_i, bad_2);
}

// ---- 2. quantize-on-write and bulk conversion: bytes equal the CPU backend's --------------------
static uint16_t to16(float f, DType t) { return store_16(f, t); }

// Rows with what makes quantization interesting: N(0,1), a zero row, huge and tiny magnitudes
// (e4m3 subnormals after scaling), a few large channels, exact ties.
static void fill_rows(std::vector<uint16_t>& kv, int n, int64_t stride, DType t) {
  for (int i = 0; i < n; ++i) {
    uint16_t* r = &kv[size_t(i) * stride];
    const int kind = i % 6;
    for (int k = 0; k < kHeadDim; ++k) {
      float x = randn();
      if (kind == 1) x = 0.f;
      if (kind == 2) x *= 1000.f;
      if (kind == 3) x *= (k % 7 == 0) ? 1.f : 1e-4f;
      if (kind == 4 && k < kLatentDim && k % 64 == 3) x *= 40.f;
      if (kind == 5) x = float(int(x * 4)) * 0.25f;
      r[k] = to16(x, t);
    }
  }
}

static void check_append(DType t, KvFormat f, int page_size) {
  printf("[append %s <- %s page %d]\n", fmt_name(f), t == DType::kBF16 ? "bf16" : "fp16", page_size);
  const int num_pages = 9, n = 3 * page_size + 5;
  const int64_t stride = kHeadDim + 8 * (randint(0, 2));  // padded rows too
  std::vector<uint16_t> kv(size_t(n) * stride);
  fill_rows(kv, n, stride, t);
  const size_t page_bytes = size_t(kv8_page_bytes(page_size));
  std::vector<uint8_t> cache(num_pages * page_bytes);
  for (auto& b : cache) b = uint8_t(randint(0, 255));  // the canary
  std::vector<int> slots(num_pages * page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), g_rng);
  std::vector<int64_t> slot_mapping(n);
  for (int i = 0; i < n; ++i) slot_mapping[i] = slots[i];
  slot_mapping[3] = -1;
  slot_mapping[n - 2] = int64_t(num_pages) * page_size + 1;  // reported, skipped
  DevBuf<uint16_t> dkv(kv.size());
  DevBuf<uint8_t> dcache(cache.size());
  DevBuf<int64_t> dslot(n);
  DevBuf<int32_t> derr(4);
  dkv.up(kv), dcache.up(cache), dslot.up(slot_mapping), derr.up({0, -1, 0, 0});
  CacheAppendParams p{};
  p.dtype = t, p.kv_format = f, p.num_tokens = n, p.page_size = page_size;
  p.page_shift = 0;
  while ((1 << p.page_shift) < page_size) ++p.page_shift;
  p.num_pages = num_pages, p.kv = dkv.p, p.kv_row_stride = stride, p.cache = dcache.p;
  p.cache_page_stride = int64_t(page_bytes), p.cache_token_stride = kBytesPerToken8bit;
  p.slot_mapping = dslot.p, p.error_buffer = derr.p;
  CK(cuda::launch_cache_append(p, 0));
  CK(cudaDeviceSynchronize());
  const auto got = dcache.down();
  std::vector<uint8_t> want = cache;
  std::vector<int32_t> herr = {0, -1, 0, 0};
  CacheAppendParams hp = p;
  hp.kv = kv.data(), hp.cache = want.data(), hp.slot_mapping = slot_mapping.data(), hp.error_buffer = herr.data();
  cpu::cache_append(hp);
  EXPECT(got == want, "GPU append bytes differ from the CPU backend's");
  // Canary: every byte outside the written tokens' latent, rope and scale is unchanged.
  std::vector<uint8_t> touched(cache.size(), 0);
  for (int i = 0; i < n; ++i) {
    const int64_t s = slot_mapping[i];
    if (s < 0 || s >= int64_t(num_pages) * page_size) continue;
    uint8_t* base = touched.data() + (s / page_size) * page_bytes;
    const int o = int(s % page_size);
    memset(base + kv8_latent_offset(page_size, o), 1, kKv8LatentBytes);
    memset(base + kv8_rope_offset(page_size, o), 1, kKv8RopeBytes);
    memset(base + kv8_scale_offset(page_size, o), 1, kKv8ScaleBytes);
  }
  size_t changed = 0;
  for (size_t b = 0; b < cache.size(); ++b) changed += !touched[b] && got[b] != cache[b];
  EXPECT(changed == 0, "append changed %zu bytes outside the written slots", changed);
  auto e = derr.down();
  EXPECT(e[0] == 8 && e[1] == n - 2, "append error buffer %d %d", e[0], e[1]);
}

static void check_convert(DType t, KvFormat f, int page_size) {
  printf("[convert %s -> %s page %d]\n", t == DType::kBF16 ? "bf16" : "fp16", fmt_name(f), page_size);
  const int num_pages = 7;
  const int64_t token_stride = kHeadDim + 8, page_stride = page_size * token_stride + 64;
  std::vector<uint16_t> src(size_t(num_pages) * page_stride);
  for (int pg = 0; pg < num_pages; ++pg) {
    std::vector<uint16_t> rows(size_t(page_size) * token_stride);
    fill_rows(rows, page_size, token_stride, t);
    std::copy(rows.begin(), rows.end(), src.begin() + size_t(pg) * page_stride);
  }
  const int64_t dst_stride = kv8_page_bytes(page_size) + 32;
  DevBuf<uint16_t> dsrc(src.size());
  DevBuf<uint8_t> ddst(size_t(num_pages) * dst_stride);
  dsrc.up(src);
  ddst.fill_bytes(0x5A);
  CacheConvertParams p{};
  p.src_dtype = t, p.dst_format = f, p.page_size = page_size;
  p.page_shift = 0;
  while ((1 << p.page_shift) < page_size) ++p.page_shift;
  p.num_pages = num_pages, p.src = dsrc.p, p.src_page_stride = page_stride, p.src_token_stride = token_stride;
  p.dst = ddst.p, p.dst_page_stride = dst_stride;
  CK(cuda::launch_cache_convert(p, 0));
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> want(ddst.n, 0x5A);
  CacheConvertParams hp = p;
  hp.src = src.data(), hp.dst = want.data();
  cpu::cache_convert(hp);
  EXPECT(ddst.down() == want, "GPU convert bytes differ from the CPU backend's");
}

// ---- 3. decode on an 8-bit cache: GPU vs the CPU backend --------------------------------------
struct Case {
  std::string name;
  DType dtype = DType::kBF16;
  KvFormat fmt = KvFormat::kFP8E4M3;
  int h_q = 16, s_q = 1, page_size = 64;
  std::vector<int> seqlens;
  int num_workers = 0;
  int max_pages_per_seq = 0;
  float scale = 0.114721f;
  std::vector<std::pair<int, int>> bad_pages;
  int expect_flags = 0;
};

struct Setup {
  Case c;
  int batch, rows, num_pages, max_pages, workers;
  std::vector<uint16_t> q;
  std::vector<float> kv_f;          // the unquantized rows [num_pages * page_size, 576] (NaN pad)
  std::vector<uint8_t> kv8;         // the 8-bit cache, NaN (0xFF) padding
  std::vector<int32_t> block_table, seqlens;
  DevBuf<uint16_t> dq, dout;
  DevBuf<uint8_t> dkv, dws;
  DevBuf<int32_t> dbt, dlen, dmeta, derr;
  DevBuf<float> dlse;
  MlaDecodeParams p{};
  MlaMetadataParams mp{};
};

static int clamp_len(const Setup& s, int r) {
  const int64_t cap = int64_t(s.max_pages) * s.c.page_size;
  return int(std::min<int64_t>(std::max<int64_t>(s.seqlens[r], 0), cap));
}

static void build(Setup& s) {
  const Case& c = s.c;
  s.batch = int(c.seqlens.size());
  s.rows = c.h_q * c.s_q;
  s.seqlens = c.seqlens;
  int longest = 0;
  for (int L : c.seqlens) longest = std::max(longest, L);
  s.max_pages = c.max_pages_per_seq ? c.max_pages_per_seq : std::max(1, ceil_div(longest, c.page_size));
  int used = 0;
  for (int r = 0; r < s.batch; ++r) used += ceil_div(clamp_len(s, r), c.page_size);
  s.num_pages = used + 5;
  std::vector<int> perm(s.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g_rng);
  s.block_table.assign(size_t(s.batch) * s.max_pages, 0);
  const size_t page_bytes = size_t(kv8_page_bytes(c.page_size));
  s.kv8.assign(s.num_pages * page_bytes, 0xFF);  // NaN latents, rope and scales everywhere first
  s.kv_f.assign(size_t(s.num_pages) * c.page_size * kHeadDim, NAN);
  int next = 0;
  std::vector<uint16_t> row16(kHeadDim);
  for (int r = 0; r < s.batch; ++r) {
    const int L = clamp_len(s, r), np = ceil_div(L, c.page_size);
    for (int j = 0; j < s.max_pages; ++j)
      s.block_table[size_t(r) * s.max_pages + j] = j < np ? perm[next++] : perm[s.num_pages - 1];
    for (int t = 0; t < L; ++t) {
      const int page = s.block_table[size_t(r) * s.max_pages + t / c.page_size], o = t % c.page_size;
      // The row as a bf16 kv would carry it; quantized as the append does (CPU backend).
      for (int k = 0; k < kHeadDim; ++k) row16[k] = to16(randn(), DType::kBF16);
      float* f = &s.kv_f[(size_t(page) * c.page_size + o) * kHeadDim];
      for (int k = 0; k < kHeadDim; ++k) f[k] = bf16_to_float(row16[k]);
      CacheAppendParams ap{};
      const int64_t slot = int64_t(page) * c.page_size + o;
      ap.dtype = DType::kBF16, ap.kv_format = c.fmt, ap.num_tokens = 1, ap.page_size = c.page_size;
      ap.page_shift = 0;
      while ((1 << ap.page_shift) < c.page_size) ++ap.page_shift;
      ap.num_pages = s.num_pages, ap.kv = row16.data(), ap.kv_row_stride = kHeadDim;
      ap.cache = s.kv8.data(), ap.cache_page_stride = int64_t(page_bytes);
      ap.cache_token_stride = kBytesPerToken8bit, ap.slot_mapping = &slot, ap.error_buffer = nullptr;
      cpu::cache_append(ap);
    }
  }
  for (auto [r, j] : c.bad_pages) s.block_table[size_t(r) * s.max_pages + j] = (j % 2) ? -7 : s.num_pages + 5;
  s.q.resize(size_t(s.batch) * s.rows * kHeadDim);
  for (auto& v : s.q) v = to16(randn(), c.dtype);

  s.workers = c.num_workers ? c.num_workers : default_workers(s.rows, c.fmt);
  s.dq = DevBuf<uint16_t>(s.q.size());
  s.dq.up(s.q);
  s.dkv = DevBuf<uint8_t>(s.kv8.size());
  s.dkv.up(s.kv8);
  s.dout = DevBuf<uint16_t>(size_t(s.batch) * s.rows * kLatentDim);
  s.dlse = DevBuf<float>(size_t(s.batch) * s.rows);
  s.dbt = DevBuf<int32_t>(s.block_table.size());
  s.dbt.up(s.block_table);
  s.dlen = DevBuf<int32_t>(s.batch);
  s.dlen.up(s.seqlens);
  s.dmeta = DevBuf<int32_t>(metadata_size(s.batch, s.workers));
  s.derr = DevBuf<int32_t>(4);
  s.dws = DevBuf<uint8_t>(std::max<int64_t>(256, workspace_bytes(s.batch, s.rows, s.workers)));

  s.mp = MlaMetadataParams{};
  s.mp.cache_seqlens = s.dlen.p, s.mp.batch = s.batch, s.mp.h_q = c.h_q, s.mp.s_q = c.s_q;
  s.mp.num_workers = s.workers, s.mp.metadata = s.dmeta.p, s.mp.error_buffer = s.derr.p;
  s.mp.fixed_cost = kFixedCost8;  // the 8-bit schedule
  MlaDecodeParams& p = s.p;
  p = MlaDecodeParams{};
  p.dtype = c.dtype, p.kv_format = c.fmt, p.batch = s.batch, p.s_q = c.s_q, p.h_q = c.h_q;
  p.num_rows = s.rows, p.page_size = c.page_size;
  p.page_shift = 0;
  while ((1 << p.page_shift) < c.page_size) ++p.page_shift;
  p.num_pages = s.num_pages, p.max_pages_per_seq = s.max_pages, p.softmax_scale = c.scale;
  p.q = s.dq.p, p.q_batch_stride = int64_t(s.rows) * kHeadDim, p.q_seq_stride = int64_t(c.h_q) * kHeadDim;
  p.q_head_stride = kHeadDim;
  p.kv = s.dkv.p, p.kv_page_stride = int64_t(page_bytes), p.kv_token_stride = kBytesPerToken8bit;
  p.block_table = s.dbt.p, p.block_table_batch_stride = s.max_pages;
  p.cache_seqlens = s.dlen.p, p.metadata = s.dmeta.p, p.num_workers = s.workers;
  p.out = s.dout.p, p.o_batch_stride = int64_t(s.rows) * kLatentDim;
  p.o_seq_stride = int64_t(c.h_q) * kLatentDim, p.o_head_stride = kLatentDim;
  p.lse = s.dlse.p;
  p.o_accum = reinterpret_cast<float*>(s.dws.p);
  p.lse_accum = reinterpret_cast<float*>(s.dws.p + workspace_o_accum_bytes(s.batch, s.rows, s.workers));
  p.error_buffer = s.derr.p;
}

static void reset_outputs(Setup& s) {
  s.dout.fill_bytes(0xFF), s.dlse.fill_bytes(0xFF), s.dws.fill_bytes(0xFF);
  s.derr.up({0, -1, 0, 0});
}
static void run_eager(Setup& s) {
  CK(cuda::launch_mla_metadata(s.mp, 0));
  CK(cuda::launch_mla_decode(s.p, 0));
  CK(cudaDeviceSynchronize());
}

// The CPU backend on the same 8-bit cache (host copies of every tensor, host metadata).
static void cpu_decode(const Setup& s, std::vector<uint16_t>& out, std::vector<float>& lse) {
  std::vector<int32_t> clamped(s.batch), meta(metadata_size(s.batch, s.workers));
  for (int r = 0; r < s.batch; ++r) clamped[r] = std::max(0, s.seqlens[r]);
  build_schedule(clamped.data(), s.batch, s.c.h_q, s.c.s_q, s.workers, kFixedCost8, meta.data());
  std::vector<uint8_t> ws(std::max<int64_t>(256, workspace_bytes(s.batch, s.rows, s.workers)) + 256);
  uint8_t* w = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ws.data()) + 255) / 256 * 256);
  out.assign(size_t(s.batch) * s.rows * kLatentDim, 0);
  lse.assign(size_t(s.batch) * s.rows, 0.f);
  std::vector<int32_t> err = {0, -1, 0, 0};
  MlaDecodeParams p = s.p;
  p.q = s.q.data(), p.kv = s.kv8.data(), p.block_table = s.block_table.data();
  p.cache_seqlens = s.seqlens.data(), p.metadata = meta.data(), p.out = out.data(), p.lse = lse.data();
  p.o_accum = reinterpret_cast<float*>(w);
  p.lse_accum = reinterpret_cast<float*>(w + workspace_o_accum_bytes(s.batch, s.rows, s.workers));
  p.error_buffer = err.data();
  cpu::mla_decode(p);
}

struct Verdict {
  double worst_cos = 0, worst_lse = 0;
  int bad_empty = 0, nonfinite = 0;
};

static double from16(uint16_t h, DType t) { return load_16(h, t); }

static Verdict compare(const Setup& s, const std::vector<uint16_t>& a, const std::vector<float>& la,
                       const std::vector<uint16_t>& b, const std::vector<float>& lb) {
  Verdict v;
  const DType t = s.c.dtype;
  for (size_t o = 0; o < la.size(); ++o) {
    // out is [b, s_q, h, 512], lse [b, h, s_q]
    const size_t r = o / s.rows, sq = (o % s.rows) / s.c.h_q, h = o % s.c.h_q;
    const size_t i = (r * s.c.h_q + h) * s.c.s_q + sq;
    // Tokens on an out-of-range page: the GPU masks them, the CPU backend (which refuses such
    // tables at the C API) clamps the page; both report. Not comparable rows.
    bool bad_request = false;
    for (auto [br, j] : s.c.bad_pages) bad_request = bad_request || size_t(br) == r;
    if (bad_request) continue;
    const uint16_t* x = &a[o * kLatentDim];
    const uint16_t* y = &b[o * kLatentDim];
    if (lb[i] == -INFINITY) {
      bool zero = la[i] == -INFINITY;
      for (int d = 0; d < kLatentDim; ++d) zero = zero && from16(x[d], t) == 0.0;
      if (!zero) ++v.bad_empty;
      continue;
    }
    double xy = 0, xx = 0, yy = 0;
    bool finite = std::isfinite(la[i]);
    for (int d = 0; d < kLatentDim; ++d) {
      const double xv = from16(x[d], t), yv = from16(y[d], t);
      finite = finite && std::isfinite(xv);
      xy += xv * yv, xx += xv * xv, yy += yv * yv;
    }
    if (!finite) {
      ++v.nonfinite;
      continue;
    }
    v.worst_cos = std::max(v.worst_cos, (xx + yy) > 0 ? 1.0 - 2.0 * xy / (xx + yy) : 0.0);
    v.worst_lse = std::max(v.worst_lse, std::abs(double(la[i]) - double(lb[i])));
  }
  return v;
}

// Whole-output cosine distance against float64 attention over the unquantized rows (SPEC.md 4).
static double accuracy_vs_unquantized(const Setup& s, const std::vector<uint16_t>& out) {
  const Case& c = s.c;
  double xy = 0, xx = 0, yy = 0;
  for (int r = 0; r < s.batch; ++r) {
    const int L = clamp_len(s, r);
    for (int i = 0; i < s.rows; ++i) {
      const int vis = visible_len(L, c.s_q, i / c.h_q);
      if (vis == 0) continue;
      const uint16_t* qr = &s.q[(size_t(r) * s.rows + i) * kHeadDim];
      std::vector<double> sc(vis), o(kLatentDim, 0.0);
      double mx = -INFINITY;
      for (int t = 0; t < vis; ++t) {
        const int page = s.block_table[size_t(r) * s.max_pages + t / c.page_size];
        const float* kr = &s.kv_f[(size_t(page) * c.page_size + t % c.page_size) * kHeadDim];
        double dot = 0;
        for (int k = 0; k < kHeadDim; ++k) dot += from16(qr[k], c.dtype) * kr[k];
        sc[t] = dot * c.scale;
        mx = std::max(mx, sc[t]);
      }
      double sum = 0;
      for (int t = 0; t < vis; ++t) {
        const int page = s.block_table[size_t(r) * s.max_pages + t / c.page_size];
        const float* kr = &s.kv_f[(size_t(page) * c.page_size + t % c.page_size) * kHeadDim];
        const double pj = std::exp(sc[t] - mx);
        sum += pj;
        for (int d = 0; d < kLatentDim; ++d) o[d] += pj * kr[d];
      }
      const uint16_t* g = &out[(size_t(r) * s.rows + i) * kLatentDim];
      for (int d = 0; d < kLatentDim; ++d) {
        const double x = from16(g[d], c.dtype), y = o[d] / sum;
        xy += x * y, xx += x * x, yy += y * y;
      }
    }
  }
  return 1.0 - 2.0 * xy / (xx + yy);
}

static void check_case(const Case& c, bool gated_accuracy = false) {
  Setup s;
  s.c = c;
  build(s);
  printf("[%s] %s q, %s cache, h_q=%d s_q=%d page=%d batch=%d workers=%d\n", c.name.c_str(),
         c.dtype == DType::kBF16 ? "bf16" : "fp16", fmt_name(c.fmt), c.h_q, c.s_q, c.page_size,
         s.batch, s.workers);
  reset_outputs(s);
  run_eager(s);
  auto out1 = s.dout.down();
  auto lse1 = s.dlse.down();
  auto err = s.derr.down();
  std::vector<uint16_t> cout;
  std::vector<float> clse;
  cpu_decode(s, cout, clse);
  const Verdict v = compare(s, out1, lse1, cout, clse);
  printf("  vs CPU backend: worst cos dist %.3e  worst |dlse| %.3e  bad empty %d  non-finite %d\n",
         v.worst_cos, v.worst_lse, v.bad_empty, v.nonfinite);
  EXPECT(v.worst_cos < 1e-5, "cosine distance %.3e", v.worst_cos);
  EXPECT(v.worst_lse < 1e-4, "lse error %.3e", v.worst_lse);
  EXPECT(v.bad_empty == 0 && v.nonfinite == 0, "empty/non-finite rows");
  EXPECT(err[0] == c.expect_flags, "error flags %d, expected %d", err[0], c.expect_flags);
  if (gated_accuracy) {
    const double a = accuracy_vs_unquantized(s, out1);
    const double lim = c.fmt == KvFormat::kFP8E4M3 ? 3e-3 : 5e-4;
    printf("  vs unquantized float64 (whole output): cos dist %.3e (limit %.0e)\n", a, lim);
    EXPECT(a < lim, "accuracy %.3e over %.0e", a, lim);
  }
  reset_outputs(s);
  run_eager(s);
  EXPECT(out1 == s.dout.down() && lse1 == s.dlse.down(), "rerun not bit-identical");
}

static void check_graph(DType t, KvFormat f) {
  Case c;
  c.name = "graph";
  c.dtype = t, c.fmt = f;
  c.seqlens = {3001, 4000, 64, 778, 4096, 2048};
  Setup s;
  s.c = c;
  build(s);
  printf("[graph replay] %s q, %s cache, batch=%d\n", t == DType::kBF16 ? "bf16" : "fp16", fmt_name(f), s.batch);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  CK(cuda::launch_mla_metadata(s.mp, st));
  CK(cuda::launch_mla_decode(s.p, st));
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const std::vector<std::vector<int>> steps = {{3000, 1, 0, 777, 4096, 65}, {10, 4000, 64, 0, 128, 2048}};
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
    std::vector<uint16_t> co;
    std::vector<float> cl;
    cpu_decode(s, co, cl);
    const Verdict v = compare(s, og, lg, co, cl);
    EXPECT(v.worst_cos < 1e-5 && v.worst_lse < 1e-4 && v.bad_empty == 0 && v.nonfinite == 0,
           "graph replay wrong: cos %.3e lse %.3e", v.worst_cos, v.worst_lse);
  }
  printf("  ok\n");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

// ---- 4. timings -----------------------------------------------------------------------------
__global__ void fill_random(uint16_t* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    const float f = (float(h & 0xffff) / 65535.f) * 2.f - 1.f;
    x[i] = __bfloat16_as_ushort(__float2bfloat16(f));
  }
}

struct Pools {
  int pages = 0;
  DevBuf<uint16_t> bf16;
  DevBuf<uint8_t> fp8, int8;
  const void* of(KvFormat f) const {
    return f == KvFormat::kBF16 ? (const void*)bf16.p : f == KvFormat::kFP8E4M3 ? (const void*)fp8.p : (const void*)int8.p;
  }
};

struct TimeResult {
  double us, gbs;
};

static bool g_profile = false;  // --profile: one rotation, one timed launch (for ncu)
static bool g_timeline = false;  // --timeline (KF_TIMELINE builds): per-block timestamps

#ifdef KF_TIMELINE
// One eager call with the decode's per-block timestamps (src/cuda/common/timeline.cuh), summarized
// relative to the first block's entry: where a call's time goes besides streaming.
static void print_timeline(MlaDecodeParams p, cudaStream_t st, const char* what) {
  const int blocks = p.num_workers * cuda::mla_row_tiles(0, p.num_rows, p.kv_format);
  const size_t words = cuda::kTimelineHeader + size_t(blocks) * cuda::kTimelineSlots;
  std::vector<unsigned long long> init(words, 0);
  init[0] = ~0ull;
  DevBuf<unsigned long long> tl(words);
  tl.up(init);
  p.timeline = tl.p;
  for (int i = 0; i < 3; ++i) {  // warm, then the recorded call
    if (i == 2) CK(cudaMemcpyAsync(tl.p, init.data(), words * 8, cudaMemcpyHostToDevice, st));
    CK(cuda::launch_mla_decode(p, st));
  }
  CK(cudaStreamSynchronize(st));
  const auto v = tl.down();
  auto slot = [&](int b, int s) { return v[cuda::kTimelineHeader + size_t(b) * cuda::kTimelineSlots + s]; };
  unsigned long long t0 = ~0ull;
  for (int b = 0; b < blocks; ++b) t0 = std::min(t0, slot(b, cuda::kTlEntry));
  auto us = [&](unsigned long long t) { return t == 0 ? -1.0 : (double(t) - double(t0)) * 1e-3; };
  std::vector<double> entry, pieces, first, exit_, stream, npieces, piece_gap;
  for (int b = 0; b < blocks; ++b) {
    entry.push_back(us(slot(b, cuda::kTlEntry)));
    pieces.push_back(us(slot(b, cuda::kTlPieces)) - entry.back());
    exit_.push_back(us(slot(b, cuda::kTlExit)));
    npieces.push_back(double(slot(b, cuda::kTlNumPieces)));
    if (slot(b, cuda::kTlFirstTile) != 0) {
      first.push_back(us(slot(b, cuda::kTlFirstTile)) - entry.back());
      stream.push_back(exit_.back() - us(slot(b, cuda::kTlFirstTile)));
    }
  }
  auto q = [](std::vector<double> x, double f) {
    if (x.empty()) return -1.0;
    std::sort(x.begin(), x.end());
    return x[std::min(x.size() - 1, size_t(f * x.size()))];
  };
  printf("[timeline %s] %d blocks; us from the first block's entry (median / p90 / max):\n", what, blocks);
  printf("  entry              %7.2f %7.2f %7.2f\n", q(entry, .5), q(entry, .9), q(entry, 1));
  printf("  piece list (+entry)%7.2f %7.2f %7.2f\n", q(pieces, .5), q(pieces, .9), q(pieces, 1));
  printf("  first tile (+entry)%7.2f %7.2f %7.2f\n", q(first, .5), q(first, .9), q(first, 1));
  printf("  first tile -> exit %7.2f %7.2f %7.2f\n", q(stream, .5), q(stream, .9), q(stream, 1));
  printf("  exit               %7.2f %7.2f %7.2f  (min %.2f)\n", q(exit_, .5), q(exit_, .9), q(exit_, 1), q(exit_, 0));
  printf("  pieces per block   %7.0f %7.0f %7.0f\n", q(npieces, .5), q(npieces, .9), q(npieces, 1));
  if (v[0] != ~0ull) printf("  combine            start %.2f, end %.2f\n", us(v[0]), us(v[1]));
  // Who finishes late: exit by pieces per block, by the block's tokens, and per SM (the blocks
  // sharing an SM share its bandwidth).
  std::map<int, std::vector<double>> by_pieces;
  std::map<int, std::pair<double, double>> by_sm;  // sm -> (tokens, latest exit)
  std::vector<std::pair<double, double>> tok_exit;
  for (int b = 0; b < blocks; ++b) {
    const double tok = double(slot(b, cuda::kTlTokens)), ex = exit_[b];
    by_pieces[int(npieces[b])].push_back(ex);
    auto& sm = by_sm[int(slot(b, cuda::kTlSm))];
    sm.first += tok;
    sm.second = std::max(sm.second, ex);
    tok_exit.push_back({tok, ex});
  }
  for (auto& kv : by_pieces)
    printf("  exit, %d piece(s)   %7.2f %7.2f %7.2f  (%zu blocks)\n", kv.first, q(kv.second, .5),
           q(kv.second, .9), q(kv.second, 1), kv.second.size());
  std::sort(tok_exit.begin(), tok_exit.end());
  const size_t nb = tok_exit.size();
  auto band = [&](size_t lo, size_t hi, const char* name) {
    std::vector<double> t, e;
    for (size_t i = lo; i < hi; ++i) t.push_back(tok_exit[i].first), e.push_back(tok_exit[i].second);
    printf("  %-18s tokens %6.0f..%6.0f, exit median %7.2f max %7.2f\n", name, t.front(), t.back(),
           q(e, .5), q(e, 1));
  };
  if (nb >= 4) {
    band(0, nb / 4, "fewest tokens (1/4)");
    band(nb - nb / 4, nb, "most tokens (1/4)");
  }
  // KF_TIMELINE_CSV=<dir>: every block's row too, one file per call, for offline analysis.
  if (const char* dir = getenv("KF_TIMELINE_CSV")) {
    static int calls = 0;
    char path[512];
    snprintf(path, sizeof path, "%s/timeline-%02d.csv", dir, calls++);
    if (FILE* f = fopen(path, "w")) {
      fprintf(f, "# %s\nblock,sm,entry,pieces,first_tile,exit,npieces,tokens,s3,s4,s5,s6,s7,s8,s9,s10\n", what);
      for (int b = 0; b < blocks; ++b) {
        fprintf(f, "%d,%llu,%.3f,%.3f,%.3f,%.3f,%.0f,%llu", b, slot(b, cuda::kTlSm), entry[b],
                us(slot(b, cuda::kTlPieces)), us(slot(b, cuda::kTlFirstTile)), exit_[b], npieces[b],
                slot(b, cuda::kTlTokens));
        // Slots 3..10: piece ends, or a diagnostic build's own marks.
        for (int s = 3; s <= 10; ++s) fprintf(f, ",%.3f", us(slot(b, s)));
        fprintf(f, "\n");
      }
      fclose(f);
    }
  }
  std::vector<double> sm_tok, sm_exit;
  for (auto& kv : by_sm) sm_tok.push_back(kv.second.first), sm_exit.push_back(kv.second.second);
  printf("  per SM (%zu): tokens min %.0f median %.0f max %.0f; latest exit min %.2f median %.2f "
         "max %.2f\n", sm_tok.size(), q(sm_tok, 0), q(sm_tok, .5), q(sm_tok, 1), q(sm_exit, 0),
         q(sm_exit, .5), q(sm_exit, 1));
}
#endif

static TimeResult time_decode(const Pools& pools, KvFormat f, int h_q, int batch, int s_k, int workers) {
  const int page = 64, pages_per_seq = s_k / page, rows = h_q;
  const int need = batch * pages_per_seq;
  const int rot = g_profile ? 1 : std::max(1, std::min(64, pools.pages / need));
  std::vector<int32_t> lens(batch, s_k);
  DevBuf<int32_t> dlen(batch), dmeta(metadata_size(batch, workers));
  dlen.up(lens);
  DevBuf<uint16_t> dq(size_t(batch) * rows * kHeadDim), dout(size_t(batch) * rows * kLatentDim);
  fill_random<<<256, 256>>>(dq.p, dq.n, 7);
  DevBuf<float> dlse(size_t(batch) * rows);
  DevBuf<uint8_t> dws(std::max<int64_t>(256, workspace_bytes(batch, rows, workers)));
  MlaMetadataParams mp{};
  mp.cache_seqlens = dlen.p, mp.batch = batch, mp.h_q = h_q, mp.s_q = 1, mp.num_workers = workers;
  mp.fixed_cost = sched_fixed_cost(f);
  mp.metadata = dmeta.p;
  CK(cuda::launch_mla_metadata(mp, 0));
  std::vector<int32_t> perm(pools.pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::vector<DevBuf<int32_t>*> tables;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> execs;
  [[maybe_unused]] MlaDecodeParams last_p{};
  const bool q8 = is_8bit(f);
  for (int r = 0; r < rot; ++r) {
    std::vector<int32_t> bt(perm.begin() + size_t(r) * need, perm.begin() + size_t(r + 1) * need);
    std::shuffle(bt.begin(), bt.end(), g_rng);
    auto* t = new DevBuf<int32_t>(need);
    t->up(bt);
    tables.push_back(t);
    MlaDecodeParams p{};
    p.dtype = DType::kBF16, p.kv_format = f;
    p.batch = batch, p.s_q = 1, p.h_q = h_q, p.num_rows = rows;
    p.page_size = page, p.page_shift = 6, p.num_pages = pools.pages, p.max_pages_per_seq = pages_per_seq;
    p.softmax_scale = 0.114721f;
    p.q = dq.p, p.q_batch_stride = int64_t(rows) * kHeadDim, p.q_seq_stride = int64_t(h_q) * kHeadDim;
    p.q_head_stride = kHeadDim;
    p.kv = pools.of(f);
    p.kv_page_stride = q8 ? kv8_page_bytes(page) : int64_t(page) * kHeadDim;
    p.kv_token_stride = q8 ? kBytesPerToken8bit : kHeadDim;
    p.block_table = t->p, p.block_table_batch_stride = pages_per_seq;
    p.cache_seqlens = dlen.p, p.metadata = dmeta.p, p.num_workers = workers;
    p.out = dout.p, p.o_batch_stride = int64_t(rows) * kLatentDim, p.o_seq_stride = int64_t(h_q) * kLatentDim;
    p.o_head_stride = kLatentDim, p.lse = dlse.p;
    p.o_accum = reinterpret_cast<float*>(dws.p);
    p.lse_accum = reinterpret_cast<float*>(dws.p + workspace_o_accum_bytes(batch, rows, workers));
    last_p = p;
    cudaGraph_t g;
    cudaGraphExec_t e;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CK(cuda::launch_mla_decode(p, st));
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    cudaGraphDestroy(g);
    execs.push_back(e);
  }
  for (int r = 0; r < rot; ++r) CK(cudaGraphLaunch(execs[r], st));
  const int iters = g_profile ? 1 : std::min(300, std::max(2 * rot, 40));
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
#ifdef KF_TIMELINE
  if (g_timeline) {
    char what[96];
    snprintf(what, sizeof what, "%s h_q=%d b=%d s_k=%d workers=%d, graph median %.1f us", fmt_name(f),
             h_q, batch, s_k, workers, us);
    print_timeline(last_p, st, what);
  }
#endif
  for (auto& e : ev) cudaEventDestroy(e);
  for (auto e : execs) cudaGraphExecDestroy(e);
  for (auto* t : tables) delete t;
  cudaStreamDestroy(st);
  const double bytes = double(batch) * s_k * (q8 ? kBytesPerToken8bit : 1152);
  return {us, bytes / us * 1e-3};
}

static void timings() {
  const double peak = 4429.0;  // GB/s, SPEC.md 5 (read-only kernel)
  Pools pools;
  pools.pages = 64 * 65536 / 64 + 64;  // b = 64 at s_k = 64K once; 2+ rotations below 32K
  pools.bf16 = DevBuf<uint16_t>(size_t(pools.pages) * 64 * kHeadDim);
  pools.fp8 = DevBuf<uint8_t>(size_t(pools.pages) * kv8_page_bytes(64));
  pools.int8 = DevBuf<uint8_t>(size_t(pools.pages) * kv8_page_bytes(64));
  fill_random<<<2048, 256>>>(pools.bf16.p, pools.bf16.n, 1234);
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kINT8}) {
    CacheConvertParams cp{};
    cp.src_dtype = DType::kBF16, cp.dst_format = f, cp.page_size = 64, cp.page_shift = 6;
    cp.num_pages = pools.pages, cp.src = pools.bf16.p, cp.src_page_stride = 64 * kHeadDim;
    cp.src_token_stride = kHeadDim, cp.dst = (void*)pools.of(f), cp.dst_page_stride = kv8_page_bytes(64);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    CK(cuda::launch_cache_convert(cp, 0));
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    const double gb = double(pools.pages) * 64 * (1152 + 644) * 1e-9;
    printf("convert bf16 -> %s: %d pages of 64 in %.2f ms (%.0f GB/s read+write)\n", fmt_name(f),
           pools.pages, ms, gb / (ms * 1e-3));
  }
  CK(cudaDeviceSynchronize());
  const int w16 = default_workers(16);
  printf("\nTimings: decode+combine, page 64, bf16 q, CUDA graph, caches rotated beyond L2, median; "
         "8-bit bytes = b*s_k*644, read peak %.0f GB/s\n", peak);
  printf("%-6s %5s %6s | %9s %6s | %9s %6s %7s | %9s %6s %7s\n", "h_q", "b", "s_k", "bf16 us",
         "%peak", "fp8 us", "%peak", "speedup", "int8 us", "%peak", "speedup");
  auto row = [&](int h_q, int b, int s_k) {
    const int w = getenv("KF_W16") ? atoi(getenv("KF_W16"))  // 16-bit workers (experiments)
                                   : default_workers(h_q);
    const TimeResult t16 = time_decode(pools, KvFormat::kBF16, h_q, b, s_k, w);
    const int w8 = getenv("KF_W8") ? atoi(getenv("KF_W8"))  // 8-bit workers (experiments)
                                   : default_workers(h_q, KvFormat::kFP8E4M3);
    const TimeResult t8 = time_decode(pools, KvFormat::kFP8E4M3, h_q, b, s_k, w8);
    const TimeResult ti = time_decode(pools, KvFormat::kINT8, h_q, b, s_k, w8);
    printf("%-6d %5d %6d | %9.1f %5.1f%% | %9.1f %5.1f%% %6.2fx | %9.1f %5.1f%% %6.2fx\n", h_q, b, s_k,
           t16.us, 100 * t16.gbs / peak, t8.us, 100 * t8.gbs / peak, t16.us / t8.us, ti.us,
           100 * ti.gbs / peak, t16.us / ti.us);
  };
  if (g_profile) {  // h_q=16, b=64, s_k=16384 once per format, nothing else
    if (getenv("KF_PROFILE_H128"))  // or the compute-bound h_q=128, b=64, s_k=4096
      row(128, 64, 4096);
    else if (getenv("KF_PROFILE_B128"))  // or h_q=16, b=128, s_k=4096 (the combine's cost there)
      row(16, 128, 4096);
    else
      row(16, 64, 16384);
    return;
  }
  if (g_timeline) {
    for (int b : {1, 64, 128}) row(16, b, 4096);
    row(128, 64, 4096);
    return;
  }
  if (getenv("KF_ONLY_B1")) {  // the latency-bound single request
    row(16, 1, 4096);
    row(16, 1, 16384);
    row(16, 8, 4096);
    return;
  }
  if (getenv("KF_ONLY_H16")) {  // quick h_q = 16 comparisons (code-placement experiments)
    for (int b : {64, 128}) row(16, b, 4096);
    for (int b : {64, 128}) row(16, b, 16384);
    return;
  }
  if (getenv("KF_ONLY_H32")) {  // 32 rows (h_q 32, or h_q 16 at s_q 2: the same kernels)
    for (int b : {64, 128}) row(32, b, 4096);
    row(32, 64, 16384);
    return;
  }
  if (getenv("KF_ONLY_H128")) {  // quick h_q = 128 comparisons
    for (int b : {8, 64}) row(128, b, 4096);
    return;
  }
  for (int b : {1, 8, 16, 32, 64, 128}) row(16, b, 4096);
  for (int b : {64, 128}) row(16, b, 16384);
  for (int b : {8, 64}) row(128, b, 4096);
  printf("s_k sweep (h_q=16, b=64):\n");
  for (int s_k : {1024, 2048, 4096, 8192, 16384, 32768, 65536}) row(16, 64, s_k);
  printf("default workers h_q=16: %d\n", w16);
}

int main(int argc, char** argv) {
  bool do_time = true;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--no-time") do_time = false;
  bool time_only = false;  // --time-only: the timings without the checks (placement sweeps)
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--profile") g_profile = true;
    if (std::string(argv[i]) == "--timeline") g_timeline = true;
    if (std::string(argv[i]) == "--time-only") time_only = true;
  }
  if (g_profile || g_timeline || time_only) {  // a few rows only with the first two (timings())
    timings();
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);

  check_conversions();
  for (DType t : {DType::kBF16, DType::kFP16})
    for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kINT8}) {
      check_append(t, f, 16);
      check_append(t, f, 64);
      check_convert(t, f, 32);
    }
  check_append(DType::kBF16, KvFormat::kINT8, 256);

  std::vector<std::pair<Case, bool>> cases;
  for (DType t : {DType::kBF16, DType::kFP16})
    for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kINT8}) {
      Case c;
      c.dtype = t, c.fmt = f;
      c.name = "gated: h16 N(0,1) s_k 1024..4096";
      c.seqlens = {4096, 1024, 2000, 3333};
      cases.push_back({c, true});
      c = Case{};
      c.dtype = t, c.fmt = f;
      c.name = "mixed lengths page 16";
      c.page_size = 16;
      c.seqlens = {0, 1, 15, 16, 17, 63, 64, 65, 1000, 2500};
      cases.push_back({c, false});
      c = Case{};
      c.dtype = t, c.fmt = f;
      c.name = "h128 page 32";
      c.h_q = 128, c.page_size = 32;
      c.seqlens = {3000, 17, 1024, 0};
      cases.push_back({c, false});
      c = Case{};
      c.dtype = t, c.fmt = f;
      c.name = "h16 s_q=2 (32 rows) page 128";
      c.s_q = 2, c.page_size = 128;
      c.seqlens = {2049, 1, 0, 900};
      cases.push_back({c, false});
    }
  {
    Case c;
    c.name = "s_q=4 causal (64 rows) page 256";
    c.fmt = KvFormat::kINT8, c.s_q = 4, c.page_size = 256;
    c.seqlens = {300, 2, 4100, 3};
    cases.push_back({c, false});
    c = Case{};
    c.name = "3 workers, many pieces";
    c.page_size = 16, c.num_workers = 3;
    for (int i = 0; i < 30; ++i) c.seqlens.push_back(randint(0, 300));
    cases.push_back({c, false});
    c = Case{};
    c.name = "h64 s_q=2";
    c.dtype = DType::kFP16, c.h_q = 64, c.s_q = 2;
    c.seqlens = {1500, 130};
    cases.push_back({c, false});
    c = Case{};
    c.name = "h8 s_q=3 (24 rows)";
    c.fmt = KvFormat::kINT8, c.h_q = 8, c.s_q = 3, c.page_size = 16;
    for (int i = 0; i < 5; ++i) c.seqlens.push_back(randint(0, 2000));
    cases.push_back({c, false});
    c = Case{};
    c.name = "long 65536";
    c.seqlens = {65536, 100};
    cases.push_back({c, false});
    c = Case{};
    c.name = "device errors";
    c.page_size = 16, c.max_pages_per_seq = 8;
    c.seqlens = {100, 5000, -3, 50};
    c.bad_pages = {{0, 2}, {0, 3}};
    c.expect_flags = 1 | 2;
    cases.push_back({c, false});
  }
  for (const auto& [c, gated] : cases) check_case(c, gated);
  check_graph(DType::kBF16, KvFormat::kFP8E4M3);
  check_graph(DType::kFP16, KvFormat::kINT8);
  printf("\nCHECKS: %d passed, %d failed\n", g_checks - g_failures, g_failures);
  if (do_time) timings();
  return g_failures ? 1 : 0;
}
