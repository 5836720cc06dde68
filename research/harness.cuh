// What the standalone GPU harnesses in research/ share (llm.c style: one binary, a CPU
// reference, checks, then timings): error checks, counted expectations, a seeded RNG and a
// device buffer. A harness may set KF_HARNESS_SEED before including this.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "cuda/launch.h"

#ifndef KF_HARNESS_SEED
#define KF_HARNESS_SEED 20261130
#endif

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                           \
    }                                                                                    \
  } while (0)

static int g_failures = 0, g_checks = 0;
#define EXPECT(cond, ...)             \
  do {                                \
    ++g_checks;                       \
    if (!(cond)) {                    \
      ++g_failures;                   \
      printf("  FAIL: " __VA_ARGS__); \
      printf("\n");                   \
    }                                 \
  } while (0)

static std::mt19937_64 g_rng(KF_HARNESS_SEED);
static float randn() {
  static std::normal_distribution<float> d(0.f, 1.f);
  return d(g_rng);
}
static int randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_rng); }

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
  void up(const std::vector<X>& h) {
    CK(cudaMemcpy(p, h.data(), n * sizeof(X), cudaMemcpyHostToDevice));
  }
  std::vector<X> down() const {
    std::vector<X> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(X), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_bytes(int v) { CK(cudaMemset(p, v, n * sizeof(X))); }
};

// The library's default worker count on device 0 for num_rows query rows of a kv_format cache.
static int default_workers(int num_rows, kf::KvFormat kv_format = kf::KvFormat::kBF16) {
  int w = 0;
  CK(kf::cuda::mla_default_num_workers(0, num_rows, kv_format, &w));
  return w;
}

static int num_sms() {
  int dev, n;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}
