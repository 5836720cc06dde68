// NVTX ranges around the C API's entry points (decode, metadata, cache append and convert, layer
// graph launch), named after the function ("kf_mla_decode", ...), so that Nsight Systems shows
// each call and Nsight Compute can filter by it (--nvtx --nvtx-include "kf_mla_decode/"). Compiled
// in with the CUDA backend (NVTX3 is header-only, in the toolkit), off unless KF_NVTX=1 is in the
// environment (src/cuda/common/switches.h): when off, a range costs one cached flag test.
#pragma once

#if KF_WITH_CUDA
#include <nvtx3/nvToolsExt.h>

#include "cuda/common/switches.h"
#endif

namespace kf::capi {

class NvtxRange {
 public:
  explicit NvtxRange([[maybe_unused]] const char* name) {
#if KF_WITH_CUDA
    if (kf::cuda::switch_nvtx()) {
      nvtxRangePushA(name);
      pushed_ = true;
    }
#endif
  }
  ~NvtxRange() {
#if KF_WITH_CUDA
    if (pushed_) nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  [[maybe_unused]] bool pushed_ = false;
};

}  // namespace kf::capi
