// v0: the shipped kernel as of 2026-11-30 (snapshot), M16 x5 stages 2/SM, M64 x3 stages 1/SM.
#define VNS v0
#include "v0_kernel.cuh"
#include "perf_version.h"
namespace kf::cuda::v0 {
using TrA = MlaTraitsM16;
using TrB = MlaTraitsM64;
}
#include "version_glue.inc"
