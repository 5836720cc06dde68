// v1: h_q=16 tile of 32 tokens (2 stages, 2 blocks/SM on sm_90): half the barriers, softmax
// passes and loop overhead per token; M64 = v0's configuration through the same source.
#define VNS v1
#include "vx_kernel.cuh"
#include "perf_version.h"
namespace kf::cuda::v1 {
using TrA = PerfTraits<1, 1, 32, 2>;
using TrB = PerfTraits<2, 2, 16, 3>;
}
#include "version_glue.inc"
