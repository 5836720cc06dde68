#include "cuda/decode/sm90a/mla_decode_sm90a.cuh"

namespace kf::cuda {
KF_DECODE_SM90A_INSTANTIATE(__half, false)
}  // namespace kf::cuda
