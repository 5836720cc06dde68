// A yes/no property of a CUDA device, computed on first use and remembered per device (host
// code). Threads that race on the first use each compute it and store the same answer.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace kf::cuda {

// The calling thread's current CUDA device, or -1 if the runtime cannot say (a property of
// device -1 is then computed, fails its own query and reads as "no").
inline int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return dev;
}

constexpr int kMaxFlagDevices = 64;

// One table per property: a function-local `static DeviceFlag f;` at the call site.
class DeviceFlag {
 public:
  template <typename Compute>
  bool get(int device, Compute compute) {
    if (device < 0 || device >= kMaxFlagDevices) return compute();
    const signed char k = known_[device].load(std::memory_order_relaxed);
    if (k != 0) return k == 2;
    const bool yes = compute();
    known_[device].store(yes ? 2 : 1, std::memory_order_relaxed);
    return yes;
  }

 private:
  std::atomic<signed char> known_[kMaxFlagDevices] = {};  // 0 unknown, 1 no, 2 yes
};

}  // namespace kf::cuda
