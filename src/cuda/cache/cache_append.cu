// Cache writes: append (row i of kv [n, 576] to slot slot_mapping[i] = page * page_size + offset)
// and the bulk conversion of a 16-bit cache into an 8-bit one. One warp per row, no shared
// memory. Negative slots are skipped; slots past the cache are reported (KF_DEVERR_SLOT_RANGE)
// and skipped.
//   16-bit caches: 16-byte copies (72 per row); a 2-byte path serves rows not 16-byte aligned.
//   8-bit caches (quantize-on-write): lane l loads latent values 16 l .. 16 l + 15 and lanes
//   0..7 the rope; cache_row.cuh's store_row8_warp quantizes and stores them (the bytes the
//   CPU backend writes, and the fused layer's prologue).
#include <cstdint>

#include "core/half_convert.h"
#include "core/kv_format8.h"
#include "core/mla_shape.h"
#include "core/quant.h"
#include "cuda/cache/cache_row.cuh"
#include "cuda/common/device_error.cuh"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

constexpr int kAppendWarps = 8;

// The cache slot of row i (one warp per row), or a negative value when the warp has nothing to
// write: past the rows, a negative slot (skipped), or a slot past the cache (reported, skipped).
__device__ __forceinline__ int64_t append_slot(const CacheAppendParams& p, int i, int lane) {
  if (i >= p.num_tokens) return -1;
  const int64_t slot = p.slot_mapping[i];
  if (slot >= (int64_t(p.num_pages) << p.page_shift)) {
    if (lane == 0) report_device_error(p.error_buffer, kDevErrSlotRange, i, slot);
    return -1;
  }
  return slot;
}

template <typename Vec>
__global__ void __launch_bounds__(kAppendWarps * 32)
    cache_append_kernel(const __grid_constant__ CacheAppendParams p) {
  constexpr int kPerRow = kHeadDim * 2 / int(sizeof(Vec));
  const int i = blockIdx.x * kAppendWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t slot = append_slot(p, i, lane);
  if (slot < 0) return;
  const int64_t page = slot >> p.page_shift, offset = slot & ((1 << p.page_shift) - 1);
  const uint16_t* src = static_cast<const uint16_t*>(p.kv) + int64_t(i) * p.kv_row_stride;
  uint16_t* dst = static_cast<uint16_t*>(p.cache) + page * p.cache_page_stride +
                  offset * p.cache_token_stride;
  const Vec* s = reinterpret_cast<const Vec*>(src);
  Vec* d = reinterpret_cast<Vec*>(dst);
  for (int c = lane; c < kPerRow; c += 32) d[c] = s[c];
}

// One warp: the 576-value row `src` (16-byte aligned) into token `offset` of the 8-bit page.
__device__ __forceinline__ void quantize_row_warp(const uint16_t* __restrict__ src, DType dtype,
                                                  bool e4m3, int page_size,
                                                  uint8_t* __restrict__ page_base, int offset,
                                                  int lane) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  const uint4 a = __ldg(s + 2 * lane), b = __ldg(s + 2 * lane + 1);
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float x[16];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    x[2 * k] = load_16(uint16_t(w[k] & 0xffffu), dtype);
    x[2 * k + 1] = load_16(uint16_t(w[k] >> 16), dtype);
  }
  uint4 rope = make_uint4(0u, 0u, 0u, 0u);
  if (lane < 8) {  // rope: 64 values, 8 per lane, bf16 (an fp16 row is rounded, RNE)
    rope = __ldg(s + kLatentDim / 8 + lane);
    if (dtype == DType::kFP16) {
      uint32_t* rw = reinterpret_cast<uint32_t*>(&rope);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        rw[k] = uint32_t(float_to_bf16(half_to_float(uint16_t(rw[k] & 0xffffu)))) |
                (uint32_t(float_to_bf16(half_to_float(uint16_t(rw[k] >> 16)))) << 16);
    }
  }
  store_row8_warp(x, rope, e4m3, page_size, page_base, offset, lane);
}

__global__ void __launch_bounds__(kAppendWarps * 32)
    cache_append_8bit_kernel(const __grid_constant__ CacheAppendParams p) {
  const int i = blockIdx.x * kAppendWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t slot = append_slot(p, i, lane);
  if (slot < 0) return;
  const int64_t page = slot >> p.page_shift;
  const int offset = int(slot & ((1 << p.page_shift) - 1));
  quantize_row_warp(static_cast<const uint16_t*>(p.kv) + int64_t(i) * p.kv_row_stride, p.dtype,
                    p.kv_format == KvFormat::kFP8E4M3, p.page_size,
                    static_cast<uint8_t*>(p.cache) + page * p.cache_page_stride, offset, lane);
}

// Grid-stride over every slot of the cache: a cache may hold more rows than a grid has blocks.
__global__ void __launch_bounds__(kAppendWarps * 32)
    cache_convert_kernel(const __grid_constant__ CacheConvertParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t num_slots = int64_t(p.num_pages) << p.page_shift;
  for (int64_t slot = int64_t(blockIdx.x) * kAppendWarps + (threadIdx.x >> 5); slot < num_slots;
       slot += int64_t(gridDim.x) * kAppendWarps) {
    const int64_t page = slot >> p.page_shift;
    const int offset = int(slot & ((1 << p.page_shift) - 1));
    quantize_row_warp(static_cast<const uint16_t*>(p.src) + page * p.src_page_stride +
                          int64_t(offset) * p.src_token_stride,
                      p.src_dtype, p.dst_format == KvFormat::kFP8E4M3, p.page_size,
                      static_cast<uint8_t*>(p.dst) + page * p.dst_page_stride, offset, lane);
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

cudaError_t launch_cache_append(const CacheAppendParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  const dim3 grid(ceil_div(p.num_tokens, kAppendWarps));
  if (is_8bit(p.kv_format)) {
    // The C API guarantees 16-byte aligned kv rows and pages (16-byte loads and stores here).
    if (!aligned16(p.kv) || !aligned16(p.cache) || p.kv_row_stride % 8 != 0 ||
        p.cache_page_stride % 16 != 0 || p.page_size % 16 != 0)
      return cudaErrorInvalidValue;
    cache_append_8bit_kernel<<<grid, kAppendWarps * 32, 0, stream>>>(p);
    return cudaGetLastError();
  }
  const bool aligned = aligned16(p.kv) && aligned16(p.cache) && p.kv_row_stride % 8 == 0 &&
                       p.cache_page_stride % 8 == 0 && p.cache_token_stride % 8 == 0;
  if (aligned)
    cache_append_kernel<uint4><<<grid, kAppendWarps * 32, 0, stream>>>(p);
  else
    cache_append_kernel<uint16_t><<<grid, kAppendWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_cache_convert(const CacheConvertParams& p, cudaStream_t stream) {
  if (!is_8bit(p.dst_format) || !aligned16(p.src) || !aligned16(p.dst) ||
      p.src_page_stride % 8 != 0 || p.src_token_stride % 8 != 0 || p.dst_page_stride % 16 != 0 ||
      p.page_size % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t num_slots = int64_t(p.num_pages) * p.page_size;
  if (num_slots == 0) return cudaSuccess;
  const int64_t blocks = (num_slots + kAppendWarps - 1) / kAppendWarps;
  const dim3 grid(unsigned(blocks < 65536 ? blocks : 65536));
  cache_convert_kernel<<<grid, kAppendWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kf::cuda
