// What the GPU tests share: the skip rule, device copies of host tensors, and a decode problem
// living on the device. Every GPU test skips with a reason where the build has no CUDA or no
// device is visible, so the binary builds and lists them on any machine.
#pragma once

#include "test_util.h"

#include <cstring>

#include "core/scheduler.h"

#if KF_TESTS_WITH_CUDA
#include <cuda_runtime_api.h>

#define KF_REQUIRE_GPU()                                                       \
  do {                                                                         \
    if (kf_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)
#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#else
#define KF_REQUIRE_GPU() GTEST_SKIP() << "built without CUDA (KF_WITH_CUDA=OFF)"
#endif

#if KF_TESTS_WITH_CUDA
namespace kft {

// An environment variable set to `value` for the scope of one check ("" unsets it); the previous
// value comes back at the end of the scope. For the switches the library reads at every call
// (KF_KERNEL_FAMILY, KF_SM90A_KV8: src/cuda/common/switches.h).
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    const char* prev = std::getenv(name);
    had_ = prev != nullptr;
    if (had_) prev_ = prev;
    set(value);
  }
  ~EnvScope() { set(had_ ? prev_.c_str() : ""); }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  void set(const char* value) const {
    if (value[0] == '\0')
      unsetenv(name_.c_str());
    else
      setenv(name_.c_str(), value, 1);
  }
  std::string name_;
  bool had_ = false;
  std::string prev_;
};

// A device copy of a HostTensor on cuda:0: same dtype, shape and strides, uploaded whole.
class DeviceTensor {
 public:
  explicit DeviceTensor(HostTensor& h) : bytes_(h.bytes()) {
    if (cudaMalloc(&ptr_, bytes_) != cudaSuccess) ptr_ = nullptr;
    if (ptr_) cudaMemcpy(ptr_, h.ptr<uint8_t>(), bytes_, cudaMemcpyHostToDevice);
    t_ = *h.dl();
    t_.data = ptr_;
    t_.device = DLDevice{kDLCUDA, 0};
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (ptr_) cudaFree(ptr_);
  }
  DLTensor* dl() { return &t_; }
  bool ok() const { return ptr_ != nullptr; }
  size_t bytes() const { return bytes_; }
  void* ptr() { return ptr_; }
  cudaError_t upload(HostTensor& h, cudaStream_t s = nullptr) {
    return cudaMemcpyAsync(ptr_, h.ptr<uint8_t>(), bytes_, cudaMemcpyHostToDevice, s);
  }
  cudaError_t download(HostTensor& h) {
    return cudaMemcpy(h.ptr<uint8_t>(), ptr_, bytes_, cudaMemcpyDeviceToHost);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
  DLTensor t_{};
};

// All decode tensors of a Built problem on the device; the host copies stay the CPU's inputs.
struct DeviceProblem {
  explicit DeviceProblem(Built& b)
      : q(b.q_t), cache(b.cache), block_table(b.block_table), cache_seqlens(b.cache_seqlens),
        metadata(b.metadata), out(b.out), lse(b.lse), workspace(b.workspace) {}
  bool ok() const {
    return q.ok() && cache.ok() && block_table.ok() && cache_seqlens.ok() && metadata.ok() &&
           out.ok() && lse.ok() && workspace.ok();
  }
  kf_status metadata_call(const Problem& pr, void* stream = nullptr) {
    return kf_mla_metadata_for_format(cache_seqlens.dl(), pr.h_q, pr.s_q, pr.num_workers,
                                      KF_KV_BF16, metadata.dl(), stream);
  }
  kf_status decode(const Problem& pr, kf_kv_format fmt, DLTensor* eb = nullptr,
                   void* stream = nullptr, DLTensor* kv_cache = nullptr) {
    return kf_mla_decode(q.dl(), kv_cache ? kv_cache : cache.dl(), fmt, block_table.dl(),
                         cache_seqlens.dl(), metadata.dl(), pr.scale, out.dl(), lse.dl(),
                         workspace.dl(), eb, stream);
  }
  // Metadata, then decode: one eager step as a caller makes it; the first failure is returned.
  kf_status step(const Problem& pr, kf_kv_format fmt, DLTensor* eb = nullptr, void* stream = nullptr) {
    const kf_status m = metadata_call(pr, stream);
    return m != KF_SUCCESS ? m : decode(pr, fmt, eb, stream);
  }
  // The results into the host problem (out and lse).
  cudaError_t download_results(Built& b) {
    const cudaError_t e = out.download(b.out);
    return e != cudaSuccess ? e : lse.download(b.lse);
  }
  DeviceTensor q, cache, block_table, cache_seqlens, metadata, out, lse, workspace;
};

// Worst row cosine distance and lse difference between two finished outputs of one problem.
inline void expect_close_to(Built& gpu, Built& cpu, double max_cos = 1e-5, double max_lse = 1e-4) {
  const Problem& pr = cpu.pr;
  double worst = 0, worst_lse = 0;
  for (int r = 0; r < pr.batch; ++r)
    for (int s = 0; s < pr.s_q; ++s)
      for (int h = 0; h < pr.h_q; ++h) {
        const auto x = out_row(gpu, r, s, h), y = out_row(cpu, r, s, h);
        const size_t li = (size_t(r) * pr.h_q + h) * pr.s_q + s;
        const float lg = gpu.lse.ptr<float>()[li], lc = cpu.lse.ptr<float>()[li];
        if (lc == -INFINITY) {
          ASSERT_EQ(lg, -INFINITY) << "r=" << r << " s=" << s << " h=" << h;
          for (int d = 0; d < 512; ++d) ASSERT_EQ(x[d], 0.0);
          continue;
        }
        for (int d = 0; d < 512; ++d) ASSERT_TRUE(std::isfinite(x[d]));
        worst = std::max(worst, cosine_distance(x, y.data(), 512));
        worst_lse = std::max(worst_lse, std::fabs(double(lg) - double(lc)));
      }
  EXPECT_LT(worst, max_cos);
  EXPECT_LT(worst_lse, max_lse);
}

// The metadata bytes a GPU call should have written for the problem whose CPU backend call wrote
// `cpu`. The CPU backend never spreads the workers (MlaMetadataParams::spread); where the GPU
// decode family asked for it (header word kMetaSpreadIdx of `gpu` is 1), the expected bytes are
// the same lengths scheduled with the spread, else the CPU bytes themselves.
inline std::vector<uint8_t> metadata_expected_on_gpu(const Problem& pr, std::vector<uint8_t> cpu,
                                                     const std::vector<uint8_t>& gpu) {
  const auto word = [](const std::vector<uint8_t>& m, int i) {
    int32_t v = 0;
    if (m.size() >= sizeof(int32_t) * size_t(i + 1)) std::memcpy(&v, m.data() + 4 * i, 4);
    return v;
  };
  if (word(gpu, kf::kMetaSpreadIdx) != 1) return cpu;
  const std::vector<int32_t> lens(pr.seqlens.begin(), pr.seqlens.end());
  std::vector<int32_t> want(cpu.size() / sizeof(int32_t), 0);
  kf::build_schedule(lens.data(), pr.batch, pr.h_q, pr.s_q, pr.num_workers,
                     word(cpu, kf::kMetaFixedCostIdx), true, want.data());
  std::memcpy(cpu.data(), want.data(), want.size() * sizeof(int32_t));
  return cpu;
}

}  // namespace kft
#endif  // KF_TESTS_WITH_CUDA
