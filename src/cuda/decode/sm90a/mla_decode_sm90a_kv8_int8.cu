#include "cuda/decode/sm90a/mla_decode_sm90a_kv8.cuh"

namespace kf::cuda {
KF_DECODE_SM90A_KV8_INSTANTIATE(kKvFmtInt8)
}  // namespace kf::cuda
