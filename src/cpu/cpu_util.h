// Small helpers of the CPU backend: device-error reporting (the same words the kernels set) and a
// fixed thread split whose results do not depend on which thread ran what.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "kernelflow/kernelflow.h"  // KF_DEVERR_* flags

namespace kf::cpu {

// Same contract as the kernels' atomics (kernelflow.h): word 0 ORs flags, words 1-2 keep the
// first offender. Called from serial code only, so plain stores suffice.
inline void report_device_error(int32_t* error_buffer, int32_t flag, int32_t index,
                                int64_t value) {
  if (error_buffer == nullptr) return;
  error_buffer[0] |= flag;
  if (error_buffer[1] == -1) {
    error_buffer[1] = index;
    error_buffer[2] = int32_t(std::max<int64_t>(INT32_MIN, std::min<int64_t>(INT32_MAX, value)));
  }
}

// Runs f(thread, num_threads) on up to 8 threads; f picks its items by a fixed stride, and every
// item writes only its own outputs, so results are bit-identical whatever the thread count.
template <typename F>
void run_threads(int num_items, F&& f) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const int n = std::max(1, std::min({num_items, hw, 8}));
  if (n == 1) {
    f(0, 1);
    return;
  }
  // An exception (bad_alloc of a scratch buffer) must reach the C API's guard, not terminate.
  std::vector<std::exception_ptr> errors(n);
  auto body = [&f, &errors, n](int t) {
    try {
      f(t, n);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(n - 1);
  int started = 1;
  try {
    for (; started < n; ++started) pool.emplace_back(body, started);
  } catch (...) {  // no thread to be had: run the rest here
  }
  body(0);
  for (int t = started; t < n; ++t) body(t);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace kf::cpu
