// Test helpers: host tensors behind DLTensors, 16-bit conversions written independently of the
// library, random MLA decode problems on a scattered paged cache, and a float64 reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernelflow/kernelflow.h"

namespace kft {

constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kF16{kDLFloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};
constexpr DLDataType kU8{kDLUInt, 8, 1};
constexpr float kScaleV2Lite = 0.114721f;

// ---- 16-bit values, independent of src/core/half_convert.h --------------------------------

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  const uint32_t lsb = (u >> 16) & 1u;
  return uint16_t((u + 0x7fffu + lsb) >> 16);
}
inline double from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// fp16 by arithmetic on doubles (no _Float16, so any compiler builds the tests): round to the
// quantum of the value's binade with nearbyint (ties to even), then encode.
inline uint16_t to_f16(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7c00;
  int e = a > 0 ? std::ilogb(a) : -14;
  if (e < -14) e = -14;                       // subnormal binade: quantum 2^-24
  const double quantum = std::ldexp(1.0, e - 10);
  double q = std::nearbyint(a / quantum);     // exact division by a power of two
  if (q >= 2048) {                            // rounded up into the next binade
    q /= 2;
    ++e;
  }
  if (q < 1024) return uint16_t(sign | uint16_t(q));  // subnormal (e == -14)
  return uint16_t(sign | uint16_t((e + 15) << 10) | uint16_t(q - 1024));
}
inline double from_f16(uint16_t b) {
  const int e = (b >> 10) & 31, m = b & 1023;
  const double mag = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return (b & 0x8000) ? -mag : mag;
}
inline uint16_t to_16(float f, bool bf16) { return bf16 ? to_bf16(f) : to_f16(f); }
inline double from_16(uint16_t h, bool bf16) { return bf16 ? from_bf16(h) : from_f16(h); }
inline uint16_t nan_16(bool bf16) { return bf16 ? 0x7fc0 : 0x7e00; }

// ---- host tensors ---------------------------------------------------------------------------

// An owned, 256-byte aligned host buffer seen through a DLTensor. Strides are optional (NULL =
// compact). dl() re-points shape/strides, so the object may be moved.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DLDataType dt, std::vector<int64_t> shape, std::vector<int64_t> strides = {})
      : shape_(std::move(shape)), strides_(std::move(strides)) {
    int64_t extent = 1;  // elements spanned
    if (strides_.empty()) {
      for (int64_t s : shape_) extent *= s;
    } else {
      for (size_t i = 0; i < shape_.size(); ++i)
        if (shape_[i] == 0) extent = 0;
      if (extent) {
        extent = 1;
        for (size_t i = 0; i < shape_.size(); ++i) extent += (shape_[i] - 1) * strides_[i];
      }
    }
    bytes_ = size_t(std::max<int64_t>(extent, 1)) * (dt.bits / 8);
    const size_t alloc = (bytes_ + 255) / 256 * 256 + 256;
    mem_.reset(static_cast<uint8_t*>(std::aligned_alloc(256, alloc)), std::free);
    std::memset(mem_.get(), 0, alloc);
    t_.data = mem_.get();
    t_.device = DLDevice{kDLCPU, 0};
    t_.dtype = dt;
    t_.ndim = int(shape_.size());
    t_.byte_offset = 0;
  }
  DLTensor* dl() {
    t_.shape = shape_.data();
    t_.strides = strides_.empty() ? nullptr : strides_.data();
    return &t_;
  }
  template <typename T>
  T* ptr() {
    return reinterpret_cast<T*>(mem_.get());
  }
  size_t bytes() const { return bytes_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }
  const std::vector<int64_t>& shape() const { return shape_; }
  void fill_bytes(uint8_t v) { std::memset(mem_.get(), v, bytes_); }
  template <typename T>
  void fill(T v) {
    T* p = ptr<T>();
    for (size_t i = 0; i < bytes_ / sizeof(T); ++i) p[i] = v;
  }
  std::vector<uint8_t> snapshot() const { return {mem_.get(), mem_.get() + bytes_}; }

 private:
  std::vector<int64_t> shape_, strides_;
  std::shared_ptr<uint8_t> mem_;
  size_t bytes_ = 0;
  DLTensor t_{};
};

// ---- a random decode problem ----------------------------------------------------------------

struct Problem {
  bool bf16 = true;
  int batch = 2, s_q = 1, h_q = 16, page_size = 64, num_workers = 4;
  std::vector<int> seqlens;
  float scale = kScaleV2Lite;
  bool cache_4d = false;   // [num_pages, page_size, 1, 576]
  bool strided = false;    // q and out with padded strides
  bool nan_padding = true; // NaN everywhere a request's valid positions are not
};

// The shape fields every parameterized case table carries (dtype, batch, s_q, h_q, page size).
template <typename Case>
Problem problem_of(const Case& c) {
  Problem pr;
  pr.bf16 = c.bf16;
  pr.batch = c.batch;
  pr.s_q = c.s_q;
  pr.h_q = c.h_q;
  pr.page_size = c.page_size;
  return pr;
}

// Logical values (exactly representable in the 16-bit dtype), the tensors that hold them, and
// the metadata built through the C API.
struct Built {
  Problem pr;
  std::vector<double> q;                  // [b, s_q, h_q, 576]
  std::vector<std::vector<double>> kv;    // per request [len, 576]
  HostTensor q_t, cache, block_table, cache_seqlens, metadata, out, lse, workspace;
  int num_pages = 0, max_pages = 0;
};

inline std::vector<int64_t> compact_or(bool strided, std::vector<int64_t> shape,
                                       std::vector<int64_t> pad) {
  if (!strided) return {};
  // Row-major strides over shape padded by `pad` per dimension.
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i] + pad[i];
  }
  return st;
}

inline Built build_problem(const Problem& pr, std::mt19937_64& rng) {
  Built b;
  b.pr = pr;
  std::normal_distribution<float> normal(0.f, 1.f);
  const int B = pr.batch, D = KF_MLA_HEAD_DIM, ps = pr.page_size;

  // q, possibly with padded strides (multiples of 8 elements keep rows 16-byte aligned)
  const std::vector<int64_t> q_shape{B, pr.s_q, pr.h_q, D};
  b.q_t = HostTensor(pr.bf16 ? kBF16 : kF16, q_shape, compact_or(pr.strided, q_shape, {1, 0, 2, 64}));
  b.q.resize(size_t(B) * pr.s_q * pr.h_q * D);
  {
    DLTensor* t = b.q_t.dl();
    uint16_t* p = b.q_t.ptr<uint16_t>();
    for (int r = 0; r < B; ++r)
      for (int s = 0; s < pr.s_q; ++s)
        for (int h = 0; h < pr.h_q; ++h)
          for (int d = 0; d < D; ++d) {
            const uint16_t v = to_16(normal(rng), pr.bf16);
            int64_t off = d;
            const int64_t idx[3] = {r, s, h};
            for (int k = 0; k < 3; ++k)
              off += idx[k] * (t->strides ? t->strides[k] : (k == 0 ? pr.s_q * pr.h_q * D : k == 1 ? pr.h_q * D : D));
            p[off] = v;
            b.q[((size_t(r) * pr.s_q + s) * pr.h_q + h) * D + d] = from_16(v, pr.bf16);
          }
  }

  // pages: scattered by a shuffled permutation, spare pages left NaN
  int needed = 0;
  b.max_pages = 1;
  for (int len : pr.seqlens) {
    needed += (len + ps - 1) / ps;
    b.max_pages = std::max(b.max_pages, (len + ps - 1) / ps + 1);
  }
  b.num_pages = needed + 3;
  std::vector<int> perm(b.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);

  std::vector<int64_t> c_shape{b.num_pages, ps, D};
  if (pr.cache_4d) c_shape = {b.num_pages, ps, 1, D};
  b.cache = HostTensor(pr.bf16 ? kBF16 : kF16, c_shape);
  b.cache.fill<uint16_t>(pr.nan_padding ? nan_16(pr.bf16) : 0);
  b.block_table = HostTensor(kI32, {B, b.max_pages});
  b.block_table.fill<int32_t>(0x7fffffff);  // entries not in use: never read
  b.cache_seqlens = HostTensor(kI32, {B});
  b.kv.resize(B);
  int next = 0;
  for (int r = 0; r < B; ++r) {
    const int len = pr.seqlens[r];
    b.cache_seqlens.ptr<int32_t>()[r] = len;
    for (int j = 0; j < (len + ps - 1) / ps; ++j) b.block_table.ptr<int32_t>()[r * b.max_pages + j] = perm[next++];
    b.kv[r].resize(size_t(len) * D);
    for (int t = 0; t < len; ++t) {
      const int page = b.block_table.ptr<int32_t>()[r * b.max_pages + t / ps];
      uint16_t* row = b.cache.ptr<uint16_t>() + (int64_t(page) * ps + t % ps) * D;
      for (int d = 0; d < D; ++d) {
        row[d] = to_16(normal(rng), pr.bf16);
        b.kv[r][size_t(t) * D + d] = from_16(row[d], pr.bf16);
      }
    }
  }

  size_t meta_n = 0, ws_bytes = 0;
  EXPECT_EQ(kf_mla_metadata_size(B, pr.num_workers, &meta_n), KF_SUCCESS);
  EXPECT_EQ(kf_mla_workspace_size(B, pr.h_q, pr.s_q, pr.num_workers, &ws_bytes), KF_SUCCESS);
  b.metadata = HostTensor(kI32, {int64_t(meta_n)});
  EXPECT_EQ(kf_mla_metadata_for_format(b.cache_seqlens.dl(), pr.h_q, pr.s_q, pr.num_workers,
                                       KF_KV_BF16, b.metadata.dl(), nullptr),
            KF_SUCCESS)
      << kf_last_error();
  b.workspace = HostTensor(kU8, {int64_t(ws_bytes)});
  b.workspace.fill<uint8_t>(0xff);  // NaN floats: a partial that is read before written shows

  const std::vector<int64_t> o_shape{B, pr.s_q, pr.h_q, KF_MLA_LATENT_DIM};
  b.out = HostTensor(pr.bf16 ? kBF16 : kF16, o_shape, compact_or(pr.strided, o_shape, {2, 1, 0, 8}));
  b.out.fill<uint16_t>(nan_16(pr.bf16));
  b.lse = HostTensor(kF32, {B, pr.h_q, pr.s_q});
  b.lse.fill<float>(std::numeric_limits<float>::quiet_NaN());
  return b;
}

inline kf_status run_decode(Built& b, DLTensor* error_buffer = nullptr) {
  return kf_mla_decode(b.q_t.dl(), b.cache.dl(), b.pr.bf16 ? KF_KV_BF16 : KF_KV_FP16,
                       b.block_table.dl(), b.cache_seqlens.dl(), b.metadata.dl(), b.pr.scale,
                       b.out.dl(), b.lse.dl(), b.workspace.dl(), error_buffer, nullptr);
}

// out[r, s, h, :] as doubles, whatever the strides.
inline std::vector<double> out_row(Built& b, int r, int s, int h) {
  DLTensor* t = b.out.dl();
  const Problem& pr = b.pr;
  const int64_t st0 = t->strides ? t->strides[0] : int64_t(pr.s_q) * pr.h_q * 512;
  const int64_t st1 = t->strides ? t->strides[1] : int64_t(pr.h_q) * 512;
  const int64_t st2 = t->strides ? t->strides[2] : 512;
  const uint16_t* p = b.out.ptr<uint16_t>() + r * st0 + s * st1 + h * st2;
  std::vector<double> v(512);
  for (int d = 0; d < 512; ++d) v[d] = from_16(p[d], pr.bf16);
  return v;
}

// ---- float64 reference -----------------------------------------------------------------------

struct Reference {
  std::vector<double> o;    // [b, s_q, h_q, 512]
  std::vector<double> lse;  // [b, h_q, s_q]
};

// Straight from docs/spec.md section 1: per (request, query s, head h), softmax over the
// positions the query sees (causal: 0 .. len - s_q + s), values are the first 512 dims of the
// cache row.
inline Reference reference_decode(const Built& b) {
  const Problem& pr = b.pr;
  const int D = KF_MLA_HEAD_DIM, V = KF_MLA_LATENT_DIM;
  Reference ref;
  ref.o.assign(size_t(pr.batch) * pr.s_q * pr.h_q * V, 0.0);
  ref.lse.assign(size_t(pr.batch) * pr.h_q * pr.s_q, -INFINITY);
  std::vector<double> score;
  for (int r = 0; r < pr.batch; ++r) {
    const int len = pr.seqlens[r];
    for (int s = 0; s < pr.s_q; ++s) {
      const int seen = std::max(0, std::min(len, len - pr.s_q + s + 1));
      for (int h = 0; h < pr.h_q; ++h) {
        if (seen == 0) continue;
        const double* q = &b.q[((size_t(r) * pr.s_q + s) * pr.h_q + h) * D];
        score.assign(seen, 0.0);
        double mx = -INFINITY;
        for (int t = 0; t < seen; ++t) {
          const double* k = &b.kv[r][size_t(t) * D];
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[d] * k[d];
          score[t] = double(pr.scale) * dot;
          mx = std::max(mx, score[t]);
        }
        double sum = 0;
        double* o = &ref.o[((size_t(r) * pr.s_q + s) * pr.h_q + h) * V];
        for (int t = 0; t < seen; ++t) {
          const double p = std::exp(score[t] - mx);
          sum += p;
          for (int d = 0; d < V; ++d) o[d] += p * b.kv[r][size_t(t) * D + d];
        }
        for (int d = 0; d < V; ++d) o[d] /= sum;
        ref.lse[(size_t(r) * pr.h_q + h) * pr.s_q + s] = mx + std::log(sum);
      }
    }
  }
  return ref;
}

inline double cosine_distance(const std::vector<double>& x, const double* y, int n) {
  double xy = 0, xx = 0, yy = 0;
  for (int i = 0; i < n; ++i) {
    xy += x[i] * y[i];
    xx += x[i] * x[i];
    yy += y[i] * y[i];
  }
  if (xx + yy == 0) return 0;
  return 1.0 - 2.0 * xy / (xx + yy);
}

// Checks out/lse of a finished decode against the float64 reference with the thresholds of
// docs/spec.md section 4.
inline void expect_matches_reference(Built& b, double max_cos = 1e-5, double max_lse = 1e-4) {
  const Reference ref = reference_decode(b);
  const Problem& pr = b.pr;
  double worst = 0, worst_lse = 0;
  for (int r = 0; r < pr.batch; ++r)
    for (int s = 0; s < pr.s_q; ++s)
      for (int h = 0; h < pr.h_q; ++h) {
        const std::vector<double> o = out_row(b, r, s, h);
        const double ref_lse = ref.lse[(size_t(r) * pr.h_q + h) * pr.s_q + s];
        const float lse = b.lse.ptr<float>()[(size_t(r) * pr.h_q + h) * pr.s_q + s];
        const double* ro = &ref.o[((size_t(r) * pr.s_q + s) * pr.h_q + h) * 512];
        if (ref_lse == -INFINITY) {  // the row sees nothing: exactly 0 and -inf
          ASSERT_EQ(lse, -INFINITY) << "r=" << r << " s=" << s << " h=" << h;
          for (int d = 0; d < 512; ++d) ASSERT_EQ(o[d], 0.0) << "r=" << r << " s=" << s << " d=" << d;
          continue;
        }
        for (int d = 0; d < 512; ++d) ASSERT_TRUE(std::isfinite(o[d])) << "r=" << r << " d=" << d;
        worst = std::max(worst, cosine_distance(o, ro, 512));
        worst_lse = std::max(worst_lse, std::fabs(double(lse) - ref_lse));
        ASSERT_TRUE(std::isfinite(lse));
      }
  EXPECT_LT(worst, max_cos);
  EXPECT_LT(worst_lse, max_lse);
  if (std::getenv("KF_TEST_VERBOSE"))
    std::printf("  worst row cosine distance %.3g, worst |lse error| %.3g\n", worst, worst_lse);
}

// An 8-bit cache holding the tokens of a 16-bit problem, written by kf_cache_append; padding
// bytes are `pad` (0xff: NaN codes and NaN scales).
inline HostTensor append_8bit_cache(Built& b, kf_kv_format fmt, uint8_t pad) {
  const Problem& pr = b.pr;
  HostTensor cache(kU8, {b.num_pages, pr.page_size, 644});
  cache.fill_bytes(pad);
  for (int r = 0; r < pr.batch; ++r) {
    const int len = pr.seqlens[r];
    if (len == 0) continue;
    HostTensor kv(pr.bf16 ? kBF16 : kF16, {len, 576}), slots(kI64, {len});
    for (int t = 0; t < len; ++t) {
      for (int d = 0; d < 576; ++d) kv.ptr<uint16_t>()[t * 576 + d] = to_16(float(b.kv[r][size_t(t) * 576 + d]), pr.bf16);
      slots.ptr<int64_t>()[t] =
          int64_t(b.block_table.ptr<int32_t>()[r * b.max_pages + t / pr.page_size]) * pr.page_size + t % pr.page_size;
    }
    EXPECT_EQ(kf_cache_append(kv.dl(), cache.dl(), fmt, slots.dl(), nullptr, nullptr), KF_SUCCESS) << kf_last_error();
  }
  return cache;
}

inline kf_status decode_8bit(Built& b, HostTensor& cache, kf_kv_format fmt) {
  return kf_mla_decode(b.q_t.dl(), cache.dl(), fmt, b.block_table.dl(), b.cache_seqlens.dl(), b.metadata.dl(),
                       b.pr.scale, b.out.dl(), b.lse.dl(), b.workspace.dl(), nullptr, nullptr);
}

inline std::vector<int> random_lengths(std::mt19937_64& rng, int batch, int max_len,
                                       double zero_fraction) {
  std::uniform_int_distribution<int> len(1, std::max(1, max_len));
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int> v(batch);
  for (int& x : v) x = u(rng) < zero_fraction ? 0 : len(rng);
  return v;
}

// A fresh seed per check: from the test name and a counter, so failures reproduce.
inline std::mt19937_64 test_rng(uint64_t salt = 0) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  return std::mt19937_64(std::hash<std::string>{}(name) ^ (salt * 0x9E3779B97F4A7C15ull));
}

// Threads meeting at a point (std::barrier is C++20).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

}  // namespace kft
