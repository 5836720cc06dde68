// Cache append for 16-bit caches: row i of kv [n, 576] is copied to slot slot_mapping[i] =
// page * page_size + offset of the paged cache. One warp per row, 16-byte copies (72 per row);
// a 2-byte path serves rows that are not 16-byte aligned. Negative slots are skipped; slots past
// the cache are reported (KF_DEVERR_SLOT_RANGE) and skipped. No shared memory.
#include <cstdint>

#include "core/mla_shape.h"
#include "cuda/common/device_error.cuh"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

constexpr int kAppendWarps = 8;

template <typename Vec>
__global__ void __launch_bounds__(kAppendWarps * 32)
    cache_append_kernel(const __grid_constant__ CacheAppendParams p) {
  constexpr int kPerRow = kHeadDim * 2 / int(sizeof(Vec));
  const int i = blockIdx.x * kAppendWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= p.num_tokens) return;
  const int64_t slot = p.slot_mapping[i];
  if (slot < 0) return;
  if (slot >= (int64_t(p.num_pages) << p.page_shift)) {
    if (lane == 0) report_device_error(p.error_buffer, kDevErrSlotRange, i, slot);
    return;
  }
  const int64_t page = slot >> p.page_shift, offset = slot & ((1 << p.page_shift) - 1);
  const uint16_t* src = static_cast<const uint16_t*>(p.kv) + int64_t(i) * p.kv_row_stride;
  uint16_t* dst = static_cast<uint16_t*>(p.cache) + page * p.cache_page_stride +
                  offset * p.cache_token_stride;
  const Vec* s = reinterpret_cast<const Vec*>(src);
  Vec* d = reinterpret_cast<Vec*>(dst);
  for (int c = lane; c < kPerRow; c += 32) d[c] = s[c];
}

}  // namespace

cudaError_t launch_cache_append(const CacheAppendParams& p, cudaStream_t stream) {
  if (is_8bit(p.kv_format)) return cudaErrorNotSupported;  // 8-bit formats: a later issue
  if (p.num_tokens <= 0) return cudaSuccess;
  const bool aligned = (reinterpret_cast<uintptr_t>(p.kv) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(p.cache) % 16 == 0) && p.kv_row_stride % 8 == 0 &&
                       p.cache_page_stride % 8 == 0 && p.cache_token_stride % 8 == 0;
  const dim3 grid(ceil_div(p.num_tokens, kAppendWarps));
  if (aligned)
    cache_append_kernel<uint4><<<grid, kAppendWarps * 32, 0, stream>>>(p);
  else
    cache_append_kernel<uint16_t><<<grid, kAppendWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kf::cuda
