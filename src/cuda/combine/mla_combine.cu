// MLA combine: for each request split into pieces k = piece_offset[r] .. piece_offset[r+1]-1,
// out[row] = sum_k w_k o_accum[k][row], lse[row] = log sum_k exp(lse_accum[k][row]), with
// core/softmax_merge.h's merged_lse / piece_weight. Deterministic: the max and the sum of
// exponentials are reduced in a fixed tree, the weighted sum runs in piece order.
// Tiling: grid (batch, num_rows), 128 threads per row, thread t owns values 4t .. 4t+3; kUnroll
// pieces' loads are in flight at once (a request split over ~64 workers would otherwise pay one
// memory latency per piece). Shared memory: the weights of up to kChunk pieces + a reduction.
// On sm_90 it is launched as a programmatic dependent of the decode kernel and waits for it
// (griddepcontrol) before reading anything.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/scheduler.h"
#include "core/softmax_merge.h"
#include "cuda/combine/mla_combine.h"
#include "cuda/common/device_error.cuh"
#include "cuda/common/metadata_check.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/timeline.cuh"

namespace kf::cuda {
namespace {

constexpr int kThreads = kLatentDim / 4;  // one float4 of the row per thread
constexpr int kChunk = 256;                // piece weights staged in shared memory at once
constexpr int kUnroll = 16;

// Fixed-order block reduction (butterfly in each warp, then warps in order).
template <typename Op>
__device__ float block_reduce(float v, float* red, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // red may still be read by the previous reduction
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int i = 1; i < kThreads / 32; ++i) v = op(v, red[i]);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    mla_combine_kernel(const __grid_constant__ MlaDecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  __shared__ float w_s[kChunk];
  __shared__ float red[kThreads / 32];
#ifdef KF_TIMELINE
  if (p.timeline != nullptr && threadIdx.x == 0) atomicMin(&p.timeline[0], (unsigned long long)timeline_now());
#endif
  if (!metadata_matches(p)) return;  // decode wrote empty rows and reported
  const int r = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
  const int32_t* piece_offset = meta_piece_offset(p.metadata, p.num_workers);
  const int first = piece_offset[r], last = piece_offset[r + 1];
  if (last - first <= 1) return;
  if (first < 0 || last > max_pieces(p.batch, p.num_workers)) {
    if (tid == 0 && row == 0) report_device_error(p.error_buffer, kDevErrMetadata, r, last);
    return;
  }
  const int n = last - first;
  const float* lse_k = p.lse_accum + int64_t(first) * p.num_rows + row;

  float v = -INFINITY;
  for (int k = tid; k < n; k += kThreads) v = fmaxf(v, lse_k[int64_t(k) * p.num_rows]);
  const float max_lse = block_reduce(v, red, [](float a, float b) { return fmaxf(a, b); });
  v = 0.f;
  if (max_lse != -INFINITY)
    for (int k = tid; k < n; k += kThreads) v += expf(lse_k[int64_t(k) * p.num_rows] - max_lse);
  const float sum_exp = block_reduce(v, red, [](float a, float b) { return a + b; });
  const float lse = merged_lse(max_lse, sum_exp);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4* o_base = reinterpret_cast<const float4*>(
      p.o_accum + (int64_t(first) * p.num_rows + row) * kLatentDim) + tid;
  const int64_t piece_stride = int64_t(p.num_rows) * kLatentDim / 4;  // in float4
  for (int k0 = 0; k0 < n; k0 += kChunk) {
    const int m = n - k0 < kChunk ? n - k0 : kChunk;
    __syncthreads();
    for (int k = tid; k < m; k += kThreads)
      w_s[k] = piece_weight(lse_k[int64_t(k0 + k) * p.num_rows], lse);
    __syncthreads();
    for (int j0 = 0; j0 < m; j0 += kUnroll) {
      float w[kUnroll];
      float4 o[kUnroll];
      // All kUnroll loads are issued before the first use. Past the chunk's end the slots are
      // zeros with weight 0 and nothing is loaded (a request of 2 pieces reads 2 rows, not 16).
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        w[u] = 0.f;
        o[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (j0 + u < m) {
          w[u] = w_s[j0 + u];
          const float4* src = o_base + (k0 + j0 + u) * piece_stride;
          asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                       : "=f"(o[u].x), "=f"(o[u].y), "=f"(o[u].z), "=f"(o[u].w)
                       : "l"(src));
        }
      }
      // A fixed pairwise tree over the kUnroll products: deterministic, and no product waits
      // for the previous one, so all kUnroll loads go out before the first use.
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        o[u].x *= w[u];
        o[u].y *= w[u];
        o[u].z *= w[u];
        o[u].w *= w[u];
      }
#pragma unroll
      for (int step = 1; step < kUnroll; step <<= 1)
#pragma unroll
        for (int u = 0; u < kUnroll; u += 2 * step) {
          o[u].x += o[u + step].x;
          o[u].y += o[u + step].y;
          o[u].z += o[u + step].z;
          o[u].w += o[u + step].w;
        }
      acc.x += o[0].x;
      acc.y += o[0].y;
      acc.z += o[0].z;
      acc.w += o[0].w;
    }
  }
  const int s = row / p.h_q, h = row % p.h_q;
  T* out = static_cast<T*>(p.out) + int64_t(r) * p.o_batch_stride + int64_t(s) * p.o_seq_stride +
           int64_t(h) * p.o_head_stride + 4 * tid;
  // 4-byte stores: out rows need only 4-byte alignment.
  reinterpret_cast<uint32_t*>(out)[0] = pack2<T>(acc.x, acc.y);
  reinterpret_cast<uint32_t*>(out)[1] = pack2<T>(acc.z, acc.w);
  if (tid == 0) p.lse[(int64_t(r) * p.h_q + h) * p.s_q + s] = lse;
#ifdef KF_TIMELINE
  if (p.timeline != nullptr && tid == 0) atomicMax(&p.timeline[1], (unsigned long long)timeline_now());
#endif
}

template <typename T>
cudaError_t launch(const MlaDecodeParams& p, cudaStream_t stream, bool pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.batch, p.num_rows);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, mla_combine_kernel<T>, p);
}

// Programmatic dependent launch exists from sm_90 on.
bool device_has_pdl() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major >= 9;
}

}  // namespace

cudaError_t launch_mla_combine(const MlaDecodeParams& p, cudaStream_t stream) {
  const bool pdl = device_has_pdl();
  const cudaError_t err = p.dtype == DType::kBF16 ? launch<__nv_bfloat16>(p, stream, pdl)
                                                  : launch<__half>(p, stream, pdl);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace kf::cuda
