// v5 = v4 + lazy rescale (the running max moves only when a score exceeds it by 2^8), both configs.
#define VNS v5
#include "vx_kernel.cuh"
#include "perf_version.h"
namespace kf::cuda::v5 {
using TrA = PerfTraits<1, 1, 32, 2, 1, false, true, true>;
using TrB = PerfTraits<2, 2, 16, 3, 1, true, true, true>;
}
#include "version_glue.inc"
