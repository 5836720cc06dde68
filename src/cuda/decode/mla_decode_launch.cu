// launch_mla_decode: pick the configuration by the number of query rows, run the decode kernel
// over (num_workers x row tiles) blocks, then the combine for split requests, on one stream.
#include <cstdint>

#include "cuda/combine/mla_combine.h"
#include "cuda/common/device_flag.h"
#include "cuda/common/env_flag.h"
#include "cuda/decode/decode_config.h"
#include "cuda/decode/sm80/mla_decode_sm80.h"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// The configuration on `device`: decode_config with whether two 32-row blocks fit an SM, asked
// once per device. KF_DECODE_64_ROW_TILES=1 in the environment keeps the 64-row tiles everywhere
// (the GPU tests run the Ampere design on the H200 with it).
DecodeConfig device_decode_config(int device, int num_rows, KvFormat kv_format) {
  return decode_config(num_rows, kv_format, [device] {
    static const bool forced_64 = env_flag("KF_DECODE_64_ROW_TILES");
    static DeviceFlag two_fit;  // once per device, not per launch
    return !forced_64 && two_fit.get(device, [device] {
      return mla_decode_sm80_blocks_per_sm<MlaTraitsM32, __nv_bfloat16>(device) >= 2;
    });
  });
}

template <typename T>
cudaError_t run_decode(const MlaDecodeParams& p, cudaStream_t stream) {
  const DecodeConfig c = device_decode_config(current_device(), p.num_rows, p.kv_format);
  return with_instance(c, [&](auto in) {
    using In = decltype(in);
    return run_mla_decode_sm80<typename In::Traits, T, In::kFmt>(p, stream);
  });
}

}  // namespace

int mla_row_tiles(int device, int num_rows, KvFormat kv_format) {
  return decode_config_row_tiles(device_decode_config(device, num_rows, kv_format), num_rows);
}

cudaError_t mla_default_num_workers(int device, int num_rows, KvFormat kv_format,
                                    int* num_workers) {
  int sms = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const DecodeConfig c = device_decode_config(device, num_rows, kv_format);
  // Resident blocks per SM, counted for bf16 q (the fp16 build has the same shared memory).
  const int per_sm = with_instance(c, [&](auto in) {
    using In = decltype(in);
    return mla_decode_sm80_blocks_per_sm<typename In::Traits, __nv_bfloat16, In::kFmt>(device);
  });
  const int w = sms * per_sm / decode_config_row_tiles(c, num_rows);
  *num_workers = w < 1 ? 1 : w;
  return cudaSuccess;
}

cudaError_t launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream) {
  // 8-bit caches take either q dtype; their pages are byte-addressed, sectioned (kv_format8.h).
  const bool q8 = is_8bit(p.kv_format);
  const bool fmt_ok = q8 ? p.page_size % 16 == 0 && p.kv_page_stride % 16 == 0
                         : (p.dtype == DType::kBF16 && p.kv_format == KvFormat::kBF16) ||
                               (p.dtype == DType::kFP16 && p.kv_format == KvFormat::kFP16);
  // What the kernels' vector accesses need (the C API guarantees it; checked again here because
  // a violation would be a misaligned access, not a wrong result).
  const bool layout_ok =
      fmt_ok && p.h_q >= 1 && p.h_q <= kMaxHeads && p.s_q >= 1 && p.s_q <= kMaxSq &&
      p.num_rows == p.s_q * p.h_q && p.num_workers >= 1 && p.page_size == (1 << p.page_shift) &&
      p.num_pages >= 1 && aligned(p.kv, 16) && p.kv_page_stride % 8 == 0 &&
      (q8 || p.kv_token_stride % 8 == 0) && aligned(p.q, 4) && p.q_batch_stride % 2 == 0 &&
      p.q_seq_stride % 2 == 0 && p.q_head_stride % 2 == 0 && aligned(p.out, 4) &&
      p.o_batch_stride % 2 == 0 && p.o_seq_stride % 2 == 0 && p.o_head_stride % 2 == 0 &&
      aligned(p.o_accum, 16);
  if (!layout_ok) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const cudaError_t err = p.dtype == DType::kBF16 ? run_decode<__nv_bfloat16>(p, stream)
                                                  : run_decode<__half>(p, stream);
  if (err != cudaSuccess) return err;
  return launch_mla_combine(p, stream);
}

}  // namespace kf::cuda
