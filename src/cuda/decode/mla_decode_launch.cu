// launch_mla_decode: pick the configuration by the number of query rows, run the decode kernel
// over (num_workers x row tiles) blocks, then the combine for split requests, on one stream.
#include <cstdint>
#include <cstdlib>

#include "cuda/combine/mla_combine.h"
#include "cuda/common/device_flag.h"
#include "cuda/decode/sm80/mla_decode_sm80.h"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// 16-bit caches, more than 32 rows: 32-row tiles (4 warps) where two such blocks fit an SM, else
// 64-row tiles (8 warps, one block per SM, row group 1's P V deferred a tile). Two 32-row blocks
// fit on sm_90 (228 KB of shared memory per SM), not on sm_80 (164 KB) or sm_86/89 (100 KB), so
// GeForce Ampere keeps the 64-row design. Measured on the H200 (research harness, bf16, h_q 128,
// s_k 4096, one wave either way): b=64 355.0 -> 328.9 us, b=8 60.7 -> 57.9 us
// (research/perf/s6/bf16rows.txt). KF_DECODE_64_ROW_TILES=1 in the environment keeps the 64-row
// tiles everywhere (the GPU tests run the Ampere design on the H200 with it).
bool many_rows_in_32_row_tiles(int device) {
  static const bool forced_64 = [] {
    const char* v = std::getenv("KF_DECODE_64_ROW_TILES");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  if (forced_64) return false;
  static DeviceFlag two_fit;  // once per device, not per launch
  return two_fit.get(device, [device] {
    return mla_decode_sm80_blocks_per_sm<MlaTraitsM32, __nv_bfloat16>(device) >= 2;
  });
}

template <typename T, int kFmt, class Tr16, class Tr32, class Tr64>
cudaError_t run_decode_rows(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.num_rows <= Tr16::kBlockM) return run_mla_decode_sm80<Tr16, T, kFmt>(p, stream);
  if (p.num_rows <= Tr32::kBlockM || many_rows_in_32_row_tiles(current_device()))
    return run_mla_decode_sm80<Tr32, T, kFmt>(p, stream);
  return run_mla_decode_sm80<Tr64, T, kFmt>(p, stream);
}

// 8-bit caches: 16-row tiles for every row count (more rows, more row tiles). A 32-row block of
// two row groups converted each tile once per group anyway, and its 8 warps at 241 registers
// fit once per SM; two 16-row blocks per SM run independently. Measured (H200, research
// harness, worker count matched to one wave): fp8 32 rows b=64 s_k 4096 131.5 -> 115.6 us,
// h_q 128 b=64 442.8 -> 391.5 us (research/perf/s6/rows.txt).
template <typename T, int kFmt>
cudaError_t run_decode_rows8(const MlaDecodeParams& p, cudaStream_t stream) {
  return run_mla_decode_sm80<MlaTraits8M16, T, kFmt>(p, stream);
}

template <typename T>
cudaError_t run_decode(const MlaDecodeParams& p, cudaStream_t stream) {
  switch (p.kv_format) {
    case KvFormat::kFP8E4M3:
      return run_decode_rows8<T, kKvFmtE4M3>(p, stream);
    case KvFormat::kINT8:
      return run_decode_rows8<T, kKvFmtInt8>(p, stream);
    default:
      return run_decode_rows<T, kKvFmt16, MlaTraitsM16, MlaTraitsM32, MlaTraitsM64>(p, stream);
  }
}

}  // namespace

int mla_row_tiles(int device, int num_rows, KvFormat kv_format) {
  if (is_8bit(kv_format)) return ceil_div(num_rows, MlaTraits8M16::kBlockM);
  if (num_rows <= MlaTraitsM32::kBlockM) return 1;
  if (many_rows_in_32_row_tiles(device)) return ceil_div(num_rows, MlaTraitsM32::kBlockM);
  return ceil_div(num_rows, MlaTraitsM64::kBlockM);
}

int mla_default_num_workers(int device, int num_rows, KvFormat kv_format) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  int per_sm = 1;
  if (kv_format == KvFormat::kINT8)
    per_sm = mla_decode_sm80_blocks_per_sm<MlaTraits8M16, __nv_bfloat16, kKvFmtInt8>(device);
  else if (kv_format == KvFormat::kFP8E4M3)
    per_sm = mla_decode_sm80_blocks_per_sm<MlaTraits8M16, __nv_bfloat16, kKvFmtE4M3>(device);
  else if (num_rows <= MlaTraitsM16::kBlockM)
    per_sm = mla_decode_sm80_blocks_per_sm<MlaTraitsM16, __nv_bfloat16>(device);
  else if (num_rows <= MlaTraitsM32::kBlockM || many_rows_in_32_row_tiles(device))
    per_sm = mla_decode_sm80_blocks_per_sm<MlaTraitsM32, __nv_bfloat16>(device);
  else
    per_sm = mla_decode_sm80_blocks_per_sm<MlaTraitsM64, __nv_bfloat16>(device);
  const int w = sms * per_sm / mla_row_tiles(device, num_rows, kv_format);
  return w < 1 ? 1 : w;
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
