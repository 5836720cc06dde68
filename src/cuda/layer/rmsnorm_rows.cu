// The compressed query's normalization in place (docs/spec.md section 3 step 1, q_lora > 0):
// x[b, :] = bf16(x[b, :] * inv_rms(x[b, :]) * weight) in fp32. One block of 128 threads per row:
// thread i takes columns i, i + 128, ...; the sum of squares is reduced in a fixed order
// (layer_prologue.cuh's block_sum_128), so reruns give the same bits. No shared memory beyond
// the 4 warp sums.
#include <cstdint>

#include "core/half_convert.h"
#include "cuda/common/pdl.cuh"
#include "cuda/layer/layer_kernels.h"
#include "cuda/layer/layer_prologue.cuh"

namespace kf::cuda {
namespace {

struct RmsNormRows {
  uint16_t* x;
  int64_t ldx;
  int cols;
  const uint16_t* weight;
  float eps;
};

__global__ void __launch_bounds__(kPrologueThreads)
    rmsnorm_rows_kernel(const __grid_constant__ RmsNormRows p) {
  __shared__ float red[kPrologueThreads / 32];
  pdl_wait();  // the projection that wrote x
  uint16_t* x = p.x + int64_t(blockIdx.x) * p.ldx;
  float ss = 0.f;
  for (int c = threadIdx.x; c < p.cols; c += kPrologueThreads) {
    const float v = bf16_to_float(x[c]);
    ss += v * v;
  }
  const float inv = 1.f / sqrtf(block_sum_128(ss, red) / float(p.cols) + p.eps);
  pdl_launch_dependents();
  for (int c = threadIdx.x; c < p.cols; c += kPrologueThreads)
    x[c] = float_to_bf16(bf16_to_float(x[c]) * inv * bf16_to_float(p.weight[c]));
}

}  // namespace

cudaError_t launch_rmsnorm_rows(uint16_t* x, int64_t ldx, int rows, int cols,
                                const uint16_t* weight, float eps, cudaStream_t stream) {
  if (x == nullptr || weight == nullptr || rows < 1 || cols < 1 || ldx < cols)
    return cudaErrorInvalidValue;
  const RmsNormRows p{x, ldx, cols, weight, eps};
  return launch_pdl(rmsnorm_rows_kernel, dim3(rows), dim3(kPrologueThreads), 0, stream, p);
}

}  // namespace kf::cuda
