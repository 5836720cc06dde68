// The sm_90a family's wide skinny GEMM: skinny_gemm.cuh's block (64 weight columns x all M rows
// over a share of K, the same cp.async stages, split sums and epilogues) with each stage
// multiplied by wgmma instead of ldmatrix and mma.sync. A W[n][k] weight only (the projections,
// W_UV and W_o); the query absorption's W[k][n] and the narrow kernel keep mma.sync. Built only
// with the sm_90a family (KF_SM90A_FAMILY); skinny_gemm.cu launches it on a device whose family
// is sm_90a (src/cuda/family.h: KF_KERNEL_FAMILY=sm80 keeps the portable kernel).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/layer/layer_kernels.h"

namespace kf::cuda {

// A planned wide kNK launch (plan_gemm: not narrow); cluster: its splits are added within
// thread-block clusters of `splits` blocks, else through the scratch and counters.
cudaError_t launch_wide_gemm_sm90a(const GemmLaunch& g, bool cluster, cudaStream_t stream);

}  // namespace kf::cuda
