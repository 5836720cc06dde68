// Merging split partials by log-sum-exp, shared by the CPU backend and the combine kernel so
// both merge in the same order with the same arithmetic.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace kf {

// Pieces carry (o_k, lse_k) with o_k already normalized by its own sum. The merged row is
// sum_k w_k o_k with w_k = exp(lse_k - lse), lse = log sum_k exp(lse_k). An empty piece has
// lse_k = -inf and weight 0; if every piece is empty the row is 0 and lse = -inf.
KF_HD float merged_lse(float max_lse, float sum_exp) {
  return (sum_exp == 0.f || max_lse == -INFINITY) ? -INFINITY : max_lse + logf(sum_exp);
}
KF_HD float piece_weight(float lse_k, float lse) {
  return lse == -INFINITY ? 0.f : expf(lse_k - lse);
}

}  // namespace kf
