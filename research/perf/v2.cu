// v2: h_q=128 ping-pong: row group 1 runs P V one tile late, so each SM sub-partition has one
// warp in mma while the other is in softmax. 3 stages, refill of tile t-2 (one tile ahead).
#define VNS v2
#include "vx_kernel.cuh"
#include "perf_version.h"
namespace kf::cuda::v2 {
using TrA = PerfTraits<1, 1, 16, 5>;
using TrB = PerfTraits<2, 2, 16, 3, 1, true>;
}
#include "version_glue.inc"
