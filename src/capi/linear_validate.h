// Validation of kf_linear's arguments (kernelflow.h): shapes, dtypes, devices, strides and
// alignment, with errors naming the argument; on success the call's params.
#pragma once

#include "capi/dispatch.h"
#include "core/params.h"
#include "kernelflow/kernelflow.h"

namespace kf::capi {

// m, n, k of a call or size query: 1..KF_LINEAR_MAX_ROWS rows, k a positive multiple of 64, n
// positive; all below 2^30 so every offset fits the kernels' index types.
kf_status check_linear_sizes(int64_t m, int64_t n, int64_t k, const char* m_name,
                             const char* n_name, const char* k_name);

kf_status validate_linear_call(const DLTensor* x, const DLTensor* weight, DLTensor* out,
                               DLTensor* workspace, Device* dev, LinearParams* p);

}  // namespace kf::capi
