// The sm_90a wide skinny GEMM (skinny_gemm_sm90a.h). A stage holds the weight tile (64 rows n of
// 64 k) and the X tile (8 MT rows m of 64 k), rows of 128 bytes whose 16-byte chunks are stored
// at chunk ^ (row % 8) (gemm_layout.h): wgmma's 128-byte-swizzled K-major layout, in 1024-byte
// atoms of 8 rows once the stage starts 1024-aligned. So per 64-k stage the block's warpgroup
// issues four m64n(8 MT)k16 wgmmas (A: the weight tile, B: the X tile, both from shared memory)
// and reads each operand once, where the portable block's four warps each read the whole X tile
// by ldmatrix. wgmma's accumulator layout is mma.sync's m16n8 layout stacked over the warps
// (d[4 j + e] is acc[j][e]: column 16 w + lane / 4 + 8 (e / 2), row 8 j + 2 (lane % 4) + e % 2),
// so the epilogues are the portable block's.
#include <cstdint>

#include "cuda/common/mma_sm80.cuh"
#include "cuda/decode/sm90a/wgmma_sm90a.cuh"
#include "cuda/layer/skinny_gemm.cuh"
#include "cuda/layer/sm90a/skinny_gemm_sm90a.h"

namespace kf::cuda {
namespace {

constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes

static_assert(GemmShape<1>::kWBytes % kSwizzleAtomBytes == 0 &&
                  GemmShape<1>::kStageBytes % kSwizzleAtomBytes == 0,
              "every stage tile starts on a swizzle atom");

// acc (+)= W tile x X tile^T over the stage's 64 k: four k16 steps, each advancing both
// descriptors' start by 32 bytes within the swizzled rows; waited for before returning, so the
// ring may refill the stage after its next barrier.
struct GemmWgmma {
  template <int MT, WeightLayout L>
  __device__ __forceinline__ static void multiply(float (&acc)[MT][4], const uint8_t* stage,
                                                  int /*warp*/, int /*lane*/) {
    static_assert(L == WeightLayout::kNK, "the weight tile is wgmma's K-major A");
    constexpr int N = 8 * MT;
    float(&d)[N / 2] = reinterpret_cast<float(&)[N / 2]>(acc);
    const uint64_t da = sm90a::smem_desc_sw128(smem_u32(stage), 16, kSwizzleAtomBytes);
    const uint64_t db =
        sm90a::smem_desc_sw128(smem_u32(stage + GemmShape<MT>::kWBytes), 16, kSwizzleAtomBytes);
    sm90a::wgmma_fence();  // acc was last written by ordinary instructions or the last stage
#pragma unroll
    for (int ks = 0; ks < kLayerGemmTileK / 16; ++ks)
      sm90a::wgmma_ss_bf16_acc<N>(d, da + ((ks * 32) >> 4), db + ((ks * 32) >> 4));
    sm90a::wgmma_commit();
    sm90a::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sm90a::reg_fence(d[i]);
  }
  // The stage arrived through cp.async (the generic proxy); wgmma reads it through the async one.
  __device__ __forceinline__ static void landed() { sm90a::fence_proxy_async_smem(); }
};

__device__ __forceinline__ uint8_t* atom_aligned(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kSwizzleAtomBytes - 1) &
                                    ~uintptr_t(kSwizzleAtomBytes - 1));
}

template <int MT, bool kCluster>
__global__ void __launch_bounds__(kGemmThreads)
    skinny_gemm_sm90a_kernel(const __grid_constant__ GemmLaunch g) {
  extern __shared__ __align__(128) uint8_t smem[];
  gemm_block<MT, WeightLayout::kNK, kCluster, GemmWgmma>(g, blockIdx.x, atom_aligned(smem));
}

}  // namespace

cudaError_t launch_wide_gemm_sm90a(const GemmLaunch& g, bool cluster, cudaStream_t stream) {
  return with_gemm_mt(g.m, [&](auto mt) {
    constexpr int MT = decltype(mt)::value;
    constexpr int smem = GemmShape<MT>::kSmemBytes + kSwizzleAtomBytes;  // room to align up
    auto kernel =
        cluster ? skinny_gemm_sm90a_kernel<MT, true> : skinny_gemm_sm90a_kernel<MT, false>;
    const cudaError_t err = allow_smem(kernel, smem);
    if (err != cudaSuccess) return err;
    return launch_kernel(kernel, dim3(g.tiles * g.splits), dim3(kGemmThreads), smem, stream,
                         cluster ? g.splits : 0, !g.stream_order, g);
  });
}

}  // namespace kf::cuda
