// Device-side reporting into the optional error buffer (int32[4], see kernelflow.h): word 0 ORs
// the flags, word 1 keeps the first request seen with a bad value (CAS from -1), word 2 its value.
// The flag values mirror KF_DEVERR_* (checked by common/deverr_check.cu against the C header), so
// kernels need not include the DLPack-based public header.
#pragma once

#include <cstdint>

namespace kf::cuda {

constexpr int32_t kDevErrSeqlenRange = 1;
constexpr int32_t kDevErrPageRange = 2;
constexpr int32_t kDevErrMetadata = 4;
constexpr int32_t kDevErrSlotRange = 8;

__device__ __forceinline__ void report_device_error(int32_t* eb, int32_t flag, int req,
                                                    int64_t value) {
  if (eb == nullptr) return;
  atomicOr(eb, flag);
  if (atomicCAS(eb + 1, -1, req) == -1) eb[2] = int32_t(value);
}

}  // namespace kf::cuda
