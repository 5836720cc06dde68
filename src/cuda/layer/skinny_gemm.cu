// The skinny GEMM as a launch of its own (the projections and the output absorption), and the
// launch plan every GEMM of the layer shares. Two kernels: up to kGemmNarrowMaxM rows of a W[n][k]
// weight over at most kGemmNarrowMaxK k, skinny_gemm_narrow.cuh's block (16 columns over all of K); otherwise skinny_gemm.cuh's
// (64 columns x all M rows over a share of K; its splits added within a thread-block cluster on
// sm_90+; on a device of the sm_90a family its stages multiplied by wgmma,
// sm90a/skinny_gemm_sm90a.h). Both: 4 warps, cp.async stages in shared memory.
#include <cstdint>

#include "cuda/common/cluster.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/layer/layer_kernels.h"
#include "cuda/layer/skinny_gemm.cuh"
#include "cuda/layer/skinny_gemm_narrow.cuh"
#include "cuda/launch.h"
#if KF_SM90A_FAMILY
#include "cuda/layer/sm90a/skinny_gemm_sm90a.h"
#endif

namespace kf::cuda {
namespace {

template <int MT, WeightLayout L>
__global__ void __launch_bounds__(kGemmThreads)
    skinny_gemm_kernel(const __grid_constant__ GemmLaunch g) {
  extern __shared__ __align__(128) uint8_t smem[];
  gemm_block<MT, L>(g, blockIdx.x, smem);
}

// The same GEMM launched in clusters of `splits` blocks, one tile per cluster (sm_90+).
template <int MT, WeightLayout L>
__global__ void __launch_bounds__(kGemmThreads)
    skinny_gemm_cluster_kernel(const __grid_constant__ GemmLaunch g) {
  extern __shared__ __align__(128) uint8_t smem[];
  gemm_block<MT, L, true>(g, blockIdx.x, smem);
}

template <int MT>
__global__ void __launch_bounds__(kGemmThreads)
    skinny_gemm_narrow_kernel(const __grid_constant__ GemmLaunch g) {
  extern __shared__ __align__(128) uint8_t smem[];
  narrow_block<MT>(g, blockIdx.x, smem);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// W and X rows start 16-byte aligned for every z (cp.async of 16 bytes).
bool job_ok(const GemmJob& j, WeightLayout layout) {
  return j.w != nullptr && j.x != nullptr && j.y != nullptr && j.n_cols >= 1 && j.num_z >= 1 &&
         aligned16(j.w) && aligned16(j.x) && j.ldw % 8 == 0 && j.ldx % 8 == 0 &&
         j.w_z % 8 == 0 && j.x_z % 8 == 0 && (layout == WeightLayout::kNK || j.n_cols % 8 == 0);
}

cudaError_t launch_narrow(const GemmLaunch& g, cudaStream_t stream) {
  auto run = [&](auto kernel, int smem) {
    const cudaError_t err = allow_smem(kernel, smem);
    if (err != cudaSuccess) return err;
    return launch_kernel(kernel, dim3(g.tiles), dim3(kGemmThreads), smem, stream, 0,
                         !g.stream_order, g);
  };
  if (g.m <= 8) return run(skinny_gemm_narrow_kernel<1>, NarrowShape<1>::kSmemBytes);
  if (g.m <= 16) return run(skinny_gemm_narrow_kernel<2>, NarrowShape<2>::kSmemBytes);
  return run(skinny_gemm_narrow_kernel<4>, NarrowShape<4>::kSmemBytes);
}

#if KF_SM90A_FAMILY
// Whether the current device runs the sm_90a family (family.h).
bool device_runs_sm90a() {
  KernelFamily f = KernelFamily::kSm80;
  return device_family(current_device(), &f) == cudaSuccess && f == KernelFamily::kSm90a;
}
#endif

// A split launch adds its splits within clusters where the device has them (at most
// kMaxPortableClusterBlocks splits then), through global memory otherwise. A W[n][k] weight on
// a device of the sm_90a family: that family's kernel (wgmma), else the portable one.
template <WeightLayout L>
cudaError_t launch_layout(GemmLaunch g, cudaStream_t stream) {
  const bool cluster = g.splits > 1 && !g.global_reduce && device_has_clusters();
  if (cluster && g.splits > kMaxPortableClusterBlocks) g.splits = kMaxPortableClusterBlocks;
#if KF_SM90A_FAMILY
  if (L == WeightLayout::kNK && device_runs_sm90a())
    return launch_wide_gemm_sm90a(g, cluster, stream);
#endif
  return with_gemm_mt(g.m, [&](auto mt) {
    constexpr int MT = decltype(mt)::value;
    constexpr int smem = GemmShape<MT>::kSmemBytes;
    auto kernel = cluster ? skinny_gemm_cluster_kernel<MT, L> : skinny_gemm_kernel<MT, L>;
    const cudaError_t err = allow_smem(kernel, smem);
    if (err != cudaSuccess) return err;
    return launch_kernel(kernel, dim3(g.tiles * g.splits), dim3(kGemmThreads), smem, stream,
                         cluster ? g.splits : 0, !g.stream_order, g);
  });
}

}  // namespace

bool plan_gemm(GemmLaunch& g, WeightLayout layout) {
  if (g.m < 1 || g.m > kGemmMaxM || g.k < kLayerGemmTileK || g.k % kLayerGemmTileK != 0 ||
      g.num_jobs < 1 || g.num_jobs > 2)
    return false;
  g.narrow = layout == WeightLayout::kNK && gemm_runs_narrow(g.m, g.k);
  const int tile_n = g.narrow ? kGemmNarrowTileN : kLayerGemmTileN;
  int64_t tiles = 0;
  for (int j = 0; j < g.num_jobs; ++j) {
    GemmJob& job = g.job[j];
    if (!job_ok(job, layout)) return false;
    job.tiles_n = ceil_div(job.n_cols, tile_n);
    job.tiles = job.tiles_n * job.num_z;
    tiles += job.tiles;
  }
  if (tiles > (int64_t(1) << 24)) return false;
  g.tiles = int(tiles);
  if (g.narrow) {
    g.splits = 1;
    return true;
  }
  g.splits = layer_gemm_splits(tiles, g.k, g.m);
  return g.splits == 1 || (g.scratch != nullptr && g.counters != nullptr);
}

cudaError_t launch_skinny_gemm(const GemmLaunch& g, WeightLayout layout, cudaStream_t stream) {
  GemmLaunch planned = g;
  if (!plan_gemm(planned, layout)) return cudaErrorInvalidValue;
  if (planned.narrow) return launch_narrow(planned, stream);
  return layout == WeightLayout::kNK ? launch_layout<WeightLayout::kNK>(planned, stream)
                                     : launch_layout<WeightLayout::kKN>(planned, stream);
}

}  // namespace kf::cuda
