// The sm_80-class instructions the portable kernels are built from: cp.async (16 B, zero-fill),
// ldmatrix (plain and transposed), mma.sync.m16n8k16 with fp32 accumulation, named barriers, and
// ex2.approx. Valid on sm_80, sm_86, sm_89 and sm_90.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kf::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// src_bytes = 0 writes 16 zero bytes without reading: tokens past a piece or on a bad page never
// bring their (possibly NaN) bytes into shared memory.
//
// The KV cache is streamed once per call, so its lines are marked evict-first in L2: what stays
// there is what the call reads again (the split partials the combine reads back, q, block tables,
// metadata).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  uint64_t policy;  // (no side effects: the compiler hoists it out of the loops)
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes), "l"(policy));
}
// 16-bit split partials are read back once by the combine, after the rest of the call's KV
// stream has gone through L2: their stores are marked evict-last, so the stream does not push
// them out. (volatile: made where the stores are, not hoisted ahead of the tile loop, which
// would move the loop's code, and the FP8 loop's speed depends on where its code lands.)
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void st_global_keep(float* dst, float2 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(dst), "f"(v.x),
               "f"(v.y), "l"(policy)
               : "memory");
}
// 4 bytes (an 8-bit cache's per-token scale), zero-filled the same way.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile; T is __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Transpose a 4x4 of float4 across the 4 lanes of a quad (lanes 4 q .. 4 q + 3; t = lane & 3):
// on entry lane t holds a[j] = element (t, j), on return a[i] = element (i, t). Two xor-shuffle
// rounds; every lane of the warp must call it.
__device__ __forceinline__ void quad_transpose(float4 (&a)[4], int t) {
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j & m) continue;
      const int jj = j | m;
      const float4 send = (t & m) ? a[j] : a[jj];
      float4 recv;
      recv.x = __shfl_xor_sync(0xffffffffu, send.x, m);
      recv.y = __shfl_xor_sync(0xffffffffu, send.y, m);
      recv.z = __shfl_xor_sync(0xffffffffu, send.z, m);
      recv.w = __shfl_xor_sync(0xffffffffu, send.w, m);
      if (t & m)
        a[j] = recv;
      else
        a[jj] = recv;
    }
}

// Two floats -> one register of two 16-bit values (low half = a), round to nearest even.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// A barrier for `threads` threads (a multiple of 32) of the block, id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// threadIdx.x that the compiler cannot hoist: values derived from it are recomputed where used
// instead of occupying registers across a loop.
__device__ __forceinline__ int fresh_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace kf::cuda
