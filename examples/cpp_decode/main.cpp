// One DeepSeek-V2-Lite-shaped MLA decode step through the C API, in bf16: q [2, 1, 16, 576] and a
// paged cache of bf16 rows (KF_KV_BF16, 64 tokens per page, pages scattered), two requests of 700
// and 1500 positions, softmax scale 0.114721. The worker count, the metadata and the decode run on
// the CPU backend and, when a GPU is present, on the GPU too; each output is checked against a
// plain double-precision loop over the same bf16 inputs. Exit code 0 when every check passes.
#include <kernelflow/kernelflow.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#ifdef EXAMPLE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

constexpr int kBatch = 2, kSq = 1, kHq = 16, kPage = 64, kDim = 576, kDimV = 512;
constexpr float kScale = 0.114721f;  // DeepSeek-V2-Lite: 192^-0.5 * mscale^2

uint16_t to_bf16(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A DLTensor over caller memory; strides NULL = compact.
DLTensor tensor(void* data, DLDevice dev, DLDataType dt, int ndim, int64_t* shape) {
  DLTensor t{};
  t.data = data;
  t.device = dev;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

#define CHECK_KF(call)                                                                   \
  do {                                                                                   \
    kf_status s_ = (call);                                                               \
    if (s_ != KF_SUCCESS) {                                                              \
      std::fprintf(stderr, "%s failed: %s: %s\n", #call, kf_status_string(s_), kf_last_error()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

struct Problem {
  std::vector<int32_t> seqlens{700, 1500};
  int pages_per_seq = 0, num_pages = 0;
  std::vector<uint16_t> q, cache;
  std::vector<int32_t> block_table;
};

Problem make_problem() {
  Problem p;
  std::mt19937 rng(2026);
  std::normal_distribution<float> n01;
  p.pages_per_seq = (1500 + kPage - 1) / kPage;
  p.num_pages = kBatch * p.pages_per_seq;
  p.q.resize(size_t(kBatch) * kSq * kHq * kDim);
  for (auto& v : p.q) v = to_bf16(n01(rng));
  p.cache.resize(size_t(p.num_pages) * kPage * kDim);
  for (auto& v : p.cache) v = to_bf16(n01(rng));
  p.block_table.resize(size_t(kBatch) * p.pages_per_seq);
  for (size_t i = 0; i < p.block_table.size(); ++i)  // scattered pages
    p.block_table[i] = int32_t((i * 7 + 3) % p.block_table.size());
  return p;
}

// Worst cosine distance over rows of the result against a double-precision loop.
double check(const Problem& p, const std::vector<uint16_t>& out) {
  double worst = 0;
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHq; ++h) {
      const uint16_t* qr = &p.q[(size_t(b) * kHq + h) * kDim];
      std::vector<double> s(p.seqlens[b]);
      double mx = -INFINITY;
      for (int t = 0; t < p.seqlens[b]; ++t) {
        int page = p.block_table[size_t(b) * p.pages_per_seq + t / kPage];
        const uint16_t* kr = &p.cache[(size_t(page) * kPage + t % kPage) * kDim];
        double d = 0;
        for (int i = 0; i < kDim; ++i) d += double(from_bf16(qr[i])) * from_bf16(kr[i]);
        s[t] = d * kScale;
        mx = std::fmax(mx, s[t]);
      }
      std::vector<double> o(kDimV, 0.0);
      double sum = 0;
      for (int t = 0; t < p.seqlens[b]; ++t) {
        int page = p.block_table[size_t(b) * p.pages_per_seq + t / kPage];
        const uint16_t* kr = &p.cache[(size_t(page) * kPage + t % kPage) * kDim];
        double w = std::exp(s[t] - mx);
        sum += w;
        for (int i = 0; i < kDimV; ++i) o[i] += w * from_bf16(kr[i]);
      }
      double xy = 0, xx = 0, yy = 0;
      for (int i = 0; i < kDimV; ++i) {
        double x = o[i] / sum, y = from_bf16(out[(size_t(b) * kHq + h) * kDimV + i]);
        xy += x * y, xx += x * x, yy += y * y;
      }
      worst = std::fmax(worst, 1 - 2 * xy / (xx + yy));
    }
  return worst;
}

// Runs metadata + decode with all buffers on `dev`; `put`/`get` move host data there and back.
template <typename Alloc, typename Put, typename Get>
std::vector<uint16_t> run_decode(const Problem& p, DLDevice dev, int device_id, Alloc alloc,
                                 Put put, Get get, void* stream) {
  const DLDataType bf16{kDLBfloat, 16, 1}, i32{kDLInt, 32, 1}, f32{kDLFloat, 32, 1},
      u8{kDLUInt, 8, 1};
  int64_t q_shape[4] = {kBatch, kSq, kHq, kDim};
  int64_t c_shape[3] = {p.num_pages, kPage, kDim};
  int64_t bt_shape[2] = {kBatch, p.pages_per_seq};
  int64_t sl_shape[1] = {kBatch};
  int64_t o_shape[4] = {kBatch, kSq, kHq, kDimV};
  int64_t lse_shape[3] = {kBatch, kHq, kSq};

  int workers = 0;
  CHECK_KF(kf_mla_default_num_workers_for_format(device_id, kHq, kSq, KF_KV_BF16, &workers));
  size_t meta_n = 0, ws_bytes = 0;
  CHECK_KF(kf_mla_metadata_size(kBatch, workers, &meta_n));
  CHECK_KF(kf_mla_workspace_size(kBatch, kHq, kSq, workers, &ws_bytes));
  int64_t meta_shape[1] = {int64_t(meta_n)};
  int64_t ws_shape[1] = {int64_t(ws_bytes)};

  void* q = put(p.q.data(), p.q.size() * 2);
  void* cache = put(p.cache.data(), p.cache.size() * 2);
  void* bt = put(p.block_table.data(), p.block_table.size() * 4);
  void* sl = put(p.seqlens.data(), p.seqlens.size() * 4);
  void* meta = alloc(meta_n * 4);
  void* ws = alloc(ws_bytes ? ws_bytes : 256);
  void* out = alloc(size_t(kBatch) * kSq * kHq * kDimV * 2);
  void* lse = alloc(size_t(kBatch) * kHq * kSq * 4);

  DLTensor tq = tensor(q, dev, bf16, 4, q_shape), tc = tensor(cache, dev, bf16, 3, c_shape),
           tbt = tensor(bt, dev, i32, 2, bt_shape), tsl = tensor(sl, dev, i32, 1, sl_shape),
           tmeta = tensor(meta, dev, i32, 1, meta_shape), tws = tensor(ws, dev, u8, 1, ws_shape),
           tout = tensor(out, dev, bf16, 4, o_shape), tlse = tensor(lse, dev, f32, 3, lse_shape);
  CHECK_KF(kf_mla_metadata_for_format(&tsl, kHq, kSq, workers, KF_KV_BF16, &tmeta, stream));
  CHECK_KF(kf_mla_decode(&tq, &tc, KF_KV_BF16, &tbt, &tsl, &tmeta, kScale, &tout, &tlse, &tws,
                         nullptr, stream));
  std::vector<uint16_t> result(size_t(kBatch) * kSq * kHq * kDimV);
  get(result.data(), out, result.size() * 2);
  return result;
}

}  // namespace

int main() {
  std::printf("KernelFlow %s (%s)\n", kf_version(), kf_build_info());
  Problem p = make_problem();
  int failures = 0;

  // 256-byte aligned, as the C API asks of a workspace (and as cudaMalloc gives on the GPU).
  std::vector<std::unique_ptr<void, decltype(&std::free)>> host_buffers;
  auto host_alloc = [&](size_t n) {
    host_buffers.emplace_back(std::aligned_alloc(256, (n + 255) / 256 * 256), &std::free);
    return host_buffers.back().get();
  };
  auto host_put = [&](const void* src, size_t n) {
    void* d = host_alloc(n);
    std::memcpy(d, src, n);
    return d;
  };
  auto host_get = [](void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); };
  double cpu_err = check(p, run_decode(p, DLDevice{kDLCPU, 0}, -1, host_alloc, host_put,
                                       host_get, nullptr));
  std::printf("cpu backend: worst-row cosine distance %.3g\n", cpu_err);
  failures += !(cpu_err < 1e-5);

#ifdef EXAMPLE_WITH_CUDA
  if (kf_cuda_device_count() > 0) {
    std::vector<void*> dev_buffers;
    auto dev_alloc = [&](size_t n) {
      void* d = nullptr;
      if (cudaMalloc(&d, n) != cudaSuccess) std::exit(1);
      dev_buffers.push_back(d);
      return d;
    };
    auto dev_put = [&](const void* src, size_t n) {
      void* d = dev_alloc(n);
      cudaMemcpy(d, src, n, cudaMemcpyHostToDevice);
      return d;
    };
    auto dev_get = [](void* dst, const void* src, size_t n) {
      cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
    };
    double gpu_err =
        check(p, run_decode(p, DLDevice{kDLCUDA, 0}, 0, dev_alloc, dev_put, dev_get, nullptr));
    std::printf("gpu backend: worst-row cosine distance %.3g\n", gpu_err);
    failures += !(gpu_err < 1e-5);
    for (void* d : dev_buffers) cudaFree(d);
  } else {
    std::printf("gpu backend: skipped (no CUDA device)\n");
  }
#else
  std::printf("gpu backend: skipped (example built without the CUDA toolkit)\n");
#endif
  std::printf(failures ? "FAIL\n" : "PASS\n");
  return failures ? 1 : 0;
}
