// v4 = v1's h_q=16 tile (32 tokens, 2 stages) + v2's h_q=128 ping-pong (deferred P V).
#define VNS v4
#include "vx_kernel.cuh"
#include "perf_version.h"
namespace kf::cuda::v4 {
using TrA = PerfTraits<1, 1, 32, 2>;
using TrB = PerfTraits<2, 2, 16, 3, 1, true>;
}
#include "version_glue.inc"
