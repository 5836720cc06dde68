// Merging split partials by log-sum-exp, shared by the CPU backend and the combine kernel so
// both merge in the same order with the same arithmetic.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace kf {

// max that returns NaN when either argument is NaN (fmaxf drops a NaN operand): a non-finite
// piece must make the merged row NaN, not vanish from it.
KF_HD inline float nan_max(float a, float b) {
#ifdef __CUDA_ARCH__
  float m;  // one instruction on the GPU (sm_80 and later)
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(m) : "f"(a), "f"(b));
  return m;
#else
  return (a != a || b != b) ? NAN : fmaxf(a, b);
#endif
}

// Pieces carry (o_k, lse_k) with o_k already normalized by its own sum. The merged row is
// sum_k w_k o_k with w_k = exp(lse_k - lse), lse = log sum_k exp(lse_k). An empty piece has
// lse_k = -inf and weight 0; if every piece is empty the row is 0 and lse = -inf. A NaN lse_k
// (a piece that met a NaN or Inf, docs/spec.md section 6) makes the maximum, the merged lse and
// every weight NaN, so the merged row is NaN.
KF_HD inline float merged_lse(float max_lse, float sum_exp) {
  return (sum_exp == 0.f || max_lse == -INFINITY) ? -INFINITY : max_lse + logf(sum_exp);
}
KF_HD inline float piece_weight(float lse_k, float lse) {
  return lse == -INFINITY ? 0.f : expf(lse_k - lse);
}

}  // namespace kf
