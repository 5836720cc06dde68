// v6 = v0's h_q=16 tile (16 tokens, 5 stages) + lazy rescale; h_q=128 as v5.
#define VNS v6
#include "vx_kernel.cuh"
#include "perf_version.h"
namespace kf::cuda::v6 {
using TrA = PerfTraits<1, 1, 16, 5, 1, false, true, true>;
using TrB = PerfTraits<2, 2, 16, 3, 1, true, true, true>;
}
#include "version_glue.inc"
