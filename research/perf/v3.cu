// v3: h_q=16 three blocks per SM (3 stages of 16 tokens, <= 168 registers): more warps to hide
// the per-tile latency chain; M64 = v0's configuration.
#define VNS v3
#include "vx_kernel.cuh"
#include "perf_version.h"
namespace kf::cuda::v3 {
using TrA = PerfTraits<1, 1, 16, 3, 3>;
using TrB = PerfTraits<2, 2, 16, 3>;
}
#include "version_glue.inc"
