// The fused layer's prologue for one request, run by one block of 128 threads (docs/spec.md
// section 3 steps 2-4; what it computes: layer_kernels.h's PrologueParams):
//   thread i holds latent values 4 i .. 4 i + 3 of kv_proj[b]: the sum of squares is reduced in
//   a fixed order (warp butterfly, then the 4 warps' sums in warp order), c = bf16(v * inv_rms *
//   kv_a_norm) goes to the shared row; warp 0 rotates k_pe's 32 pairs into the row; all threads
//   rotate the heads' q_pe pairs straight into q_attn. The row [c | k_pe] (576 bf16, 1152 bytes
//   of shared memory) is then copied to the cache slot (16-bit: 72 16-byte stores) or quantized
//   by warp 0 (8-bit: cache_row.cuh, the bytes kf_cache_append writes for this bf16 row).
// Guards (values the caller changes between replays): a position outside [0, max_position) is
// flagged and clamped for the rotation; a length outside [1, max_pages_per_seq * page_size] or
// a page outside [0, num_pages) is flagged and the cache row is not written.
#pragma once

#include <cstdint>

#include "core/half_convert.h"
#include "core/mla_shape.h"
#include "cuda/cache/cache_row.cuh"
#include "cuda/common/device_error.cuh"
#include "cuda/layer/layer_kernels.h"

namespace kf::cuda {

constexpr int kPrologueThreads = 128;

// Sum of v over the block's 128 threads, the same bits on every thread (fixed order).
__device__ __forceinline__ float block_sum_128(float v, float* red /* shared [4] */) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const float total = ((red[0] + red[1]) + red[2]) + red[3];
  __syncthreads();  // red may be reused
  return total;
}

// (x0, x1) rotated by the angle whose cosine and sine are c, s.
__device__ __forceinline__ void rope_pair(float x0, float x1, float c, float s, uint16_t* out) {
  out[0] = float_to_bf16(x0 * c - x1 * s);
  out[1] = float_to_bf16(x0 * s + x1 * c);
}

// What request b's prologue reads besides the projections: the step's inputs (positions,
// cache_seqlens, the block table, the RoPE table) and the norm's weights, none of which a kernel of
// the layer graph writes. They are read before the dependency wait (the launch starts while the
// projections run), so only kv_proj and q_proj are read after it; the guards' flags are raised
// after it, in the order the checks are listed in PrologueParams.
struct PrologueInputs {
  int position;   // positions[b] as read
  int len;        // cache_seqlens[b] as read
  int page;       // the block-table entry of slot len - 1 (read only for a length in range)
  float norm[4];  // kv_a_norm[4 tid .. 4 tid + 3]
  float cs[2];    // cos and sin of pair tid % 32 at the position clamped into [0, max_position)
};

__device__ __forceinline__ bool prologue_len_ok(const PrologueParams& p, int len) {
  return len >= 1 && len <= p.max_pages_per_seq * p.page_size;
}

__device__ __forceinline__ PrologueInputs prologue_inputs(const PrologueParams& p, int b) {
  constexpr int kPairs = kRopeDim / 2;
  static_assert(kPrologueThreads % kPairs == 0, "a thread rotates the same pair in every head");
  const int tid = threadIdx.x;
  PrologueInputs in;
  in.position = p.positions[b];
  in.len = p.cache_seqlens[b];
  in.page = prologue_len_ok(p, in.len)
                ? p.block_table[int64_t(b) * p.block_table_stride + ((in.len - 1) >> p.page_shift)]
                : -1;
#pragma unroll
  for (int e = 0; e < 4; ++e) in.norm[e] = bf16_to_float(p.kv_a_norm[4 * tid + e]);
  const int pos = in.position < 0 ? 0 : in.position >= p.max_position ? p.max_position - 1
                                                                       : in.position;
  const float* cs = p.cos_sin + int64_t(pos) * kRopeDim;  // [2][32]: cos then sin
  in.cs[0] = cs[tid % kPairs];
  in.cs[1] = cs[kPairs + tid % kPairs];
  return in;
}

// The cache slot of the new row as (page, offset), or page -1 when the row must not be written;
// a length or page out of range is flagged here (after the wait).
__device__ __forceinline__ int prologue_slot(const PrologueParams& p, int b,
                                             const PrologueInputs& in, int* offset) {
  if (!prologue_len_ok(p, in.len)) {
    if (threadIdx.x == 0) report_device_error(p.error_buffer, kDevErrSeqlenRange, b, in.len);
    return -1;
  }
  if (in.page < 0 || in.page >= p.num_pages) {
    if (threadIdx.x == 0) report_device_error(p.error_buffer, kDevErrPageRange, b, in.page);
    return -1;
  }
  *offset = (in.len - 1) & (p.page_size - 1);
  return in.page;
}

// The 576-value row in shared memory into the cache slot (every thread of the block calls it).
__device__ __forceinline__ void prologue_store_row(const PrologueParams& p, const uint16_t* row,
                                                   int page, int offset) {
  if (!is_8bit(p.kv_format)) {
    uint16_t* dst = static_cast<uint16_t*>(p.cache) + int64_t(page) * p.page_stride +
                    int64_t(offset) * p.token_stride;
    if (threadIdx.x < kHeadDim / 8)
      reinterpret_cast<uint4*>(dst)[threadIdx.x] = reinterpret_cast<const uint4*>(row)[threadIdx.x];
    return;
  }
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  float x[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) x[k] = bf16_to_float(row[16 * lane + k]);
  const uint4 rope = lane < 8 ? reinterpret_cast<const uint4*>(row + kLatentDim)[lane]
                              : make_uint4(0u, 0u, 0u, 0u);
  store_row8_warp(x, rope, p.kv_format == KvFormat::kFP8E4M3, p.page_size,
                  static_cast<uint8_t*>(p.cache) + int64_t(page) * p.page_stride, offset, lane);
}

// Request b's prologue (b < p.batch) from its inputs (prologue_inputs, read before the wait);
// the caller has waited for the projections.
__device__ __forceinline__ void layer_prologue_row(const PrologueParams& p, int b,
                                                   const PrologueInputs& in) {
  __shared__ __align__(16) uint16_t row[kHeadDim];
  __shared__ float red[kPrologueThreads / 32];
  const int tid = threadIdx.x;
  const uint16_t* kv = p.kv_proj + int64_t(b) * kHeadDim;

  // c = rmsnorm(latent) * kv_a_norm: 4 values per thread.
  const uint2 raw = reinterpret_cast<const uint2*>(kv)[tid];
  const float v[4] = {bf16_to_float(uint16_t(raw.x & 0xffffu)), bf16_to_float(uint16_t(raw.x >> 16)),
                      bf16_to_float(uint16_t(raw.y & 0xffffu)), bf16_to_float(uint16_t(raw.y >> 16))};
  const float ss = ((v[0] * v[0] + v[1] * v[1]) + v[2] * v[2]) + v[3] * v[3];
  const float inv = 1.f / sqrtf(block_sum_128(ss, red) / float(kLatentDim) + p.eps);
#pragma unroll
  for (int e = 0; e < 4; ++e) row[4 * tid + e] = float_to_bf16(v[e] * inv * in.norm[e]);

  // RoPE at the (guarded) position: k_pe into the row, every head's q_pe into q_attn.
  if ((in.position < 0 || in.position >= p.max_position) && tid == 0)
    report_device_error(p.error_buffer, kDevErrSeqlenRange, b, in.position);
  constexpr int kPairs = kRopeDim / 2;
  if (tid < kPairs)
    rope_pair(bf16_to_float(kv[kLatentDim + 2 * tid]), bf16_to_float(kv[kLatentDim + 2 * tid + 1]),
              in.cs[0], in.cs[1], row + kLatentDim + 2 * tid);
  const int q_head = p.nope + kRopeDim;
  const uint16_t* q = p.q_proj + int64_t(b) * p.heads * q_head + p.nope;
  uint16_t* qa = p.q_attn + int64_t(b) * p.heads * kHeadDim + kLatentDim;
  for (int e = tid; e < p.heads * kPairs; e += kPrologueThreads) {
    const int h = e / kPairs, i = e % kPairs;  // i == tid % kPairs: in.cs is its rotation
    const uint16_t* x = q + h * q_head + 2 * i;
    rope_pair(bf16_to_float(x[0]), bf16_to_float(x[1]), in.cs[0], in.cs[1],
              qa + h * kHeadDim + 2 * i);
  }
  __syncthreads();  // the row is complete

  int offset = 0;
  const int page = prologue_slot(p, b, in, &offset);
  if (page >= 0) prologue_store_row(p, row, page, offset);
}

}  // namespace kf::cuda
