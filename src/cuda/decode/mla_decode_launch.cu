// launch_mla_decode: the device's kernel family (src/cuda/family.h) picks the decode kernels, the
// family picks its configuration by the query rows and the cache format; the decode runs over
// (num_workers x row tiles) blocks, then the combine merges split requests, on one stream.
#include <cstdint>

#include "cuda/combine/mla_combine.h"
#include "cuda/common/device_flag.h"
#include "cuda/common/switches.h"
#include "cuda/decode/decode_family.h"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// The decode kernels of each family. A build without the sm_90a family never picks it
// (pick_family); the portable kernels are the answer there all the same.
const DecodeFamily& decode_family(KernelFamily f) {
  switch (f) {
    case KernelFamily::kSm80:
      return kDecodeSm80;
    case KernelFamily::kSm90a:
#if KF_SM90A_FAMILY
      return kDecodeSm90a;
#else
      return kDecodeSm80;
#endif
  }
  return kDecodeSm80;
}

// The decode family of `device` (the current device), or why the build cannot run there.
cudaError_t device_decode_family(int device, const DecodeFamily** family) {
  KernelFamily f = KernelFamily::kSm80;
  const cudaError_t err = device_family(device, &f);
  if (err != cudaSuccess) return err;
  *family = &decode_family(f);
  return cudaSuccess;
}

// What every decode kernel's vector accesses need (the C API guarantees it; checked again here
// because a violation would be a misaligned access, not a wrong result).
bool decode_layout_ok(const MlaDecodeParams& p) {
  // 8-bit caches take either q dtype; their pages are byte-addressed, sectioned (kv_format8.h).
  const bool q8 = is_8bit(p.kv_format);
  const bool fmt_ok = q8 ? p.page_size % 16 == 0 && p.kv_page_stride % 16 == 0
                         : (p.dtype == DType::kBF16 && p.kv_format == KvFormat::kBF16) ||
                               (p.dtype == DType::kFP16 && p.kv_format == KvFormat::kFP16);
  return fmt_ok && p.h_q >= 1 && p.h_q <= kMaxHeads && p.s_q >= 1 && p.s_q <= kMaxSq &&
         p.num_rows == p.s_q * p.h_q && p.num_workers >= 1 &&
         p.page_size == (1 << p.page_shift) && p.num_pages >= 1 && aligned(p.kv, 16) &&
         p.kv_page_stride % 8 == 0 && (q8 || p.kv_token_stride % 8 == 0) && aligned(p.q, 4) &&
         p.q_batch_stride % 2 == 0 && p.q_seq_stride % 2 == 0 && p.q_head_stride % 2 == 0 &&
         aligned(p.out, 4) && p.o_batch_stride % 2 == 0 && p.o_seq_stride % 2 == 0 &&
         p.o_head_stride % 2 == 0 && aligned(p.o_accum, 16);
}

}  // namespace

cudaError_t mla_default_num_workers(int device, int num_rows, KvFormat kv_format, int batch,
                                    int* num_workers) {
  const DecodeFamily* family = nullptr;
  cudaError_t err = device_decode_family(device, &family);
  if (err != cudaSuccess) return err;
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int w = sms * family->blocks_per_sm(device, num_rows, kv_format, batch) /
                family->row_tiles(device, num_rows, kv_format, batch);
  *num_workers = w < 1 ? 1 : w;
  return cudaSuccess;
}

cudaError_t mla_metadata_spread(int device, int num_rows, KvFormat kv_format, bool* spread) {
  const DecodeFamily* family = nullptr;
  const cudaError_t err = device_decode_family(device, &family);
  if (err != cudaSuccess) return err;
  *spread = family->spread_small_batch(device, num_rows, kv_format);
  return cudaSuccess;
}

cudaError_t launch_mla_decode(const MlaDecodeParams& call, cudaStream_t stream) {
  if (!decode_layout_ok(call)) return cudaErrorInvalidValue;
  if (call.batch == 0) return cudaSuccess;
  MlaDecodeParams p = call;
  p.timeline = switch_timeline_buffer();  // null but in the timeline build
  const DecodeFamily* family = nullptr;
  cudaError_t err = device_decode_family(current_device(), &family);
  if (err != cudaSuccess) return err;
  err = family->run(p, stream);
  if (err != cudaSuccess) return err;
  return launch_mla_combine(p, stream);
}

}  // namespace kf::cuda
