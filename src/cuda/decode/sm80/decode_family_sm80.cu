// The portable decode family (sm_80 and newer, mma.sync): the configuration a call runs
// (decode_config.h), how many of its blocks fit an SM, and its launch.
#include "cuda/common/device_flag.h"
#include "cuda/common/switches.h"
#include "cuda/decode/decode_config.h"
#include "cuda/decode/decode_family.h"
#include "cuda/decode/sm80/mla_decode_sm80.h"

namespace kf::cuda {
namespace {

// Largest batch whose default worker count takes one block per SM on the 16-row configuration.
constexpr int kOneBlockPerSmMaxBatch16 = 2;

// The configuration on `device`: decode_config with whether two 32-row blocks fit an SM, asked
// once per device. KF_DECODE_64_ROW_TILES=1 in the environment keeps the 64-row tiles everywhere
// (the GPU tests run the GeForce Ampere design on the H200 with it).
DecodeConfig device_decode_config(int device, int num_rows, KvFormat kv_format) {
  return decode_config(num_rows, kv_format, [device] {
    static DeviceFlag two_fit;  // once per device, not per launch
    return !switch_decode_64_row_tiles() && two_fit.get(device, [device] {
      return mla_decode_sm80_blocks_per_sm<MlaTraitsM32, __nv_bfloat16>(device) >= 2;
    });
  });
}

int row_tiles(int device, int num_rows, KvFormat kv_format, int /*batch: one kernel per shape*/) {
  return decode_config_row_tiles(device_decode_config(device, num_rows, kv_format), num_rows);
}

// Counted for bf16 q (the fp16 instantiation has the same shared memory and block size). A call
// of one or two requests on the 16-row configuration (16-bit cache) gets one block per SM
// though two fit: the same pieces or fewer, longer ones, on a grid half the size. On the H200 (h_q 16,
// 132 against 264 workers) b 1 / 2 took 9.0 / 8.9 us against 10.6 / 10.8 at s_k 1024, 9.9 /
// 11.3 against 9.9 / 12.6 at 4096, 16.4 / 21.0 against 18.3 / 21.7 at 16384; from b 4 at
// s_k 16384 and from b 6 at every length the second block per SM is faster
// (docs/optimization/decode.md, workers-small-batch-16).
int blocks_per_sm(int device, int num_rows, KvFormat kv_format, int batch) {
  const DecodeConfig c = device_decode_config(device, num_rows, kv_format);
  if (c == DecodeConfig::k16Rows16 && batch >= 1 && batch <= kOneBlockPerSmMaxBatch16) return 1;
  return with_instance(c, [&](auto in) {
    using In = decltype(in);
    return mla_decode_sm80_blocks_per_sm<typename In::Traits, __nv_bfloat16, In::kFmt>(device);
  });
}

template <typename T>
cudaError_t run_dtype(const MlaDecodeParams& p, cudaStream_t stream) {
  const DecodeConfig c = device_decode_config(current_device(), p.num_rows, p.kv_format);
  return with_instance(c, [&](auto in) {
    using In = decltype(in);
    return run_mla_decode_sm80<typename In::Traits, T, In::kFmt>(p, stream);
  });
}

cudaError_t run(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.dtype == DType::kBF16 ? run_dtype<__nv_bfloat16>(p, stream)
                                 : run_dtype<__half>(p, stream);
}

// The portable kernels keep every worker: half of them on the even ones was 4-7% slower at
// h_q 32 to 128, b 1 to 4 on the H200 (docs/optimization/decode.md, sched-spread-half).
bool spread_small_batch(int, int, KvFormat) { return false; }

}  // namespace

const DecodeFamily kDecodeSm80 = {row_tiles, blocks_per_sm, run, spread_small_batch};

}  // namespace kf::cuda
