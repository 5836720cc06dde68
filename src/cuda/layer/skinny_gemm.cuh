// The weight-streaming skinny GEMM of the fused layer: Y[M, N] = X[M, K] W(N, K) with M the
// batch (1..128), bf16 in and out, fp32 accumulation, the weights read once from DRAM.
//
// Tiling. A block of 4 warps computes one output tile of 64 columns (n) for all M rows, over
// its share of K: the launch splits K across blocks (core/layer_workspace.h) so that the tiles
// of a launch give about 264 blocks. Block b is tile b % tiles, split b / tiles (launched in
// clusters: tile b / splits, split b % splits). The weight is
// the mma's A operand (mma.sync m16n8k16: 16 weight rows n x 16 k), the activations its B
// operand (8 rows m of X): warp w owns columns [16 w, 16 w + 16) of the tile and MT = M / 8
// (rounded up to a power of two) accumulator tiles of 16 x 8, 4 floats per thread each.
//
// Shared memory. Stages of 64 k: the weight tile (64 rows of 128 bytes: rows n of W[n][k], or
// rows k of W[k][n]) and the X tile (8 MT rows m of 128 bytes), each row's eight 16-byte chunks
// XOR-swizzled by (row & 7) so that ldmatrix reads 8 rows of one chunk conflict-free (the
// index functions are gemm_layout.h's, checked on the CPU against a model of the instructions).
// cp.async (16 bytes, zero-fill past N and M) fills kStages stages ahead: 6 for MT <= 2, else
// 4 (55 KB at M <= 8, 96 KB at M = 128; sm_86 allows 99 KB). Fragments: ldmatrix.x4
// (W[n][k]) or ldmatrix.x4.trans (W[k][n]) for A, ldmatrix.x4 of one X row group over 32 k for
// B (two k16 steps).
//
// Programmatic dependent launch: the weight stages are requested before pdl_wait (weights never
// depend on the previous kernel), X after; the next kernel may launch as soon as every block
// has requested its first stages, so its blocks become resident beside this launch's (all of
// whose blocks have started by then) and request their own weights while these stream: the
// weights of consecutive GEMMs stream without a gap at the kernel boundary. Every block waits,
// so a kernel's completion implies its predecessors'.
//
// Split K, two ways of adding the splits' fp32 partial tiles [M][64], both in split order (the
// same bits on every replay, and the same bits as each other for the same split):
// - in a cluster (sm_90+, the stand-alone launch, kCluster): the splits of a tile are the blocks
//   of one thread-block cluster (rank = split); each leaves its partial in its own shared memory,
//   and after a cluster barrier every block adds its share of the tile from all of them
//   (distributed shared memory) and writes bf16 Y. No scratch, counters or fences.
// - through global memory (earlier GPUs, the query absorption's launch): each split stores its
//   partial to the scratch; the block that brings a tile's counter to `splits` (the last to
//   arrive, after __threadfence) adds the partials, writes Y and resets the counter to zero for
//   the next launch.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "core/half_convert.h"
#include "cuda/common/cluster.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/layer/gemm_layout.h"
#include "cuda/layer/layer_kernels.h"

namespace kf::cuda {

constexpr int kGemmThreads = 128;  // 4 warps, 16 output columns each
constexpr int kGemmRowBytes = kGemmTileRowBytes;  // one 64-value row of a stage tile
static_assert(kGemmRowBytes == kLayerGemmTileK * 2 && kGemmRowBytes == kLayerGemmTileN * 2,
              "stage rows of 64 bf16 values");

template <int MT>
struct GemmShape {
  static_assert(MT == 1 || MT == 2 || MT == 4 || MT == 8 || MT == 16, "MT: 8-row groups of X");
  static constexpr int kStages = MT <= 2 ? 6 : 4;
  static constexpr int kWBytes = kLayerGemmTileN * kGemmRowBytes;  // 8 KB
  static constexpr int kXRows = 8 * MT;
  static constexpr int kXBytes = kXRows * kGemmRowBytes;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
};

// cp.async of 16 bytes without an L2 cache-policy operand, zero-filled when src_bytes is 0; for
// the weights and for X (which every block of the launch reads). The policy-hinted cp_async_16 of
// mma_sm80.cuh is not used here: in this kernel ptxas 13.0 (sm_90) emitted its LDGSTS with a
// descriptor register that nothing had set, and the H200 raised an illegal instruction on it.
__device__ __forceinline__ void cp_async_16_cg(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// Which job, z (head) and first column tile t of a launch is.
struct GemmTileId {
  int job, z, n0;
};
__device__ __forceinline__ GemmTileId gemm_tile_id(const GemmLaunch& g, int t,
                                                   int tile_n = kLayerGemmTileN) {
  const int j = (g.num_jobs > 1 && t >= g.job[0].tiles) ? 1 : 0;
  const int local = j ? t - g.job[0].tiles : t;
  const int tiles_n = j ? g.job[1].tiles_n : g.job[0].tiles_n;
  return {j, local / tiles_n, (local % tiles_n) * tile_n};
}

// The job's pointers for head z (selected field by field: no dynamic indexing of the
// parameter array).
struct GemmOperands {
  const uint16_t* w;
  const uint16_t* x;
  uint16_t* y;
  int64_t ldw, ldx, ldy;
  int n_cols;
};
__device__ __forceinline__ GemmOperands gemm_operands(const GemmLaunch& g, GemmTileId id) {
  const GemmJob& a = g.job[0];
  const GemmJob& b = g.job[1];
  const bool j = id.job != 0;
  GemmOperands o;
  o.w = (j ? b.w : a.w) + id.z * (j ? b.w_z : a.w_z);
  o.x = (j ? b.x : a.x) + id.z * (j ? b.x_z : a.x_z);
  o.y = (j ? b.y : a.y) + id.z * (j ? b.y_z : a.y_z);
  o.ldw = j ? b.ldw : a.ldw;
  o.ldx = j ? b.ldx : a.ldx;
  o.ldy = j ? b.ldy : a.ldy;
  o.n_cols = j ? b.n_cols : a.n_cols;
  return o;
}

// Stage loads: the weight tile (k from k0, columns from n0) and the X tile (rows 0 .. 8 MT).
template <WeightLayout L>
__device__ __forceinline__ void gemm_load_w(uint8_t* stage, const GemmOperands& op, int n0,
                                            int k0, int tid) {
#pragma unroll
  for (int i = 0; i < kLayerGemmTileN * 8 / kGemmThreads; ++i) {
    const auto [row, chunk] = gemm_copy_chunk(tid + i * kGemmThreads);
    const uint16_t* src;
    bool ok;
    if (L == WeightLayout::kNK) {  // row = n, chunk = 8 k
      ok = n0 + row < op.n_cols;
      src = op.w + int64_t(ok ? n0 + row : 0) * op.ldw + k0 + chunk * 8;
    } else {  // row = k, chunk = 8 n
      ok = n0 + chunk * 8 < op.n_cols;
      src = op.w + int64_t(k0 + row) * op.ldw + (ok ? n0 + chunk * 8 : 0);
    }
    cp_async_16_cg(smem_u32(stage + gemm_swizzle(row, chunk)), src, ok ? 16 : 0);
  }
}

template <int MT>
__device__ __forceinline__ void gemm_load_x(uint8_t* stage, const GemmOperands& op, int m,
                                            int k0, int tid) {
  uint8_t* xs = stage + GemmShape<MT>::kWBytes;
  for (int c = tid; c < GemmShape<MT>::kXRows * 8; c += kGemmThreads) {
    const auto [row, chunk] = gemm_copy_chunk(c);
    const bool ok = row < m;
    const uint16_t* src = op.x + int64_t(ok ? row : 0) * op.ldx + k0 + chunk * 8;
    cp_async_16_cg(smem_u32(xs + gemm_swizzle(row, chunk)), src, ok ? 16 : 0);
  }
}

// acc[j] += W tile (this warp's 16 columns) x X rows 8 j .. 8 j + 7 over the stage's 64 k.
template <int MT, WeightLayout L>
__device__ __forceinline__ void gemm_stage_mma(float (&acc)[MT][4], const uint8_t* stage,
                                               int warp, int lane) {
  const uint8_t* xs = stage + GemmShape<MT>::kWBytes;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {  // 32 k: two k16 steps
    uint32_t a[2][4];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      const int ks = 2 * kk + st;
      if (L == WeightLayout::kNK) {
        const TileChunk c = gemm_a_chunk_nk(warp, lane, ks);
        ldmatrix_x4(a[st], smem_u32(stage + gemm_swizzle(c.row, c.chunk)));
      } else {  // stored rows k, columns n: transposed on load
        const TileChunk c = gemm_a_chunk_kn(warp, lane, ks);
        ldmatrix_x4_trans(a[st], smem_u32(stage + gemm_swizzle(c.row, c.chunk)));
      }
    }
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      uint32_t b[4];  // (b0, b1) of step 2 kk, then of step 2 kk + 1
      const TileChunk c = gemm_b_chunk(j, lane, kk);
      ldmatrix_x4(b, smem_u32(xs + gemm_swizzle(c.row, c.chunk)));
      mma_16816<__nv_bfloat16>(acc[j], a[0], b[0], b[1]);
      mma_16816<__nv_bfloat16>(acc[j], a[1], b[2], b[3]);
    }
  }
}

// How a block multiplies a stage that has landed in shared memory: the portable way (ldmatrix
// and mma.sync on every architecture). The sm_90a family's policy (sm90a/skinny_gemm_sm90a.cu)
// issues wgmma from the same stage layout instead; its landed() makes the cp.async writes
// visible to the async proxy wgmma reads through.
struct GemmMmaSync {
  template <int MT, WeightLayout L>
  __device__ __forceinline__ static void multiply(float (&acc)[MT][4], const uint8_t* stage,
                                                  int warp, int lane) {
    gemm_stage_mma<MT, L>(acc, stage, warp, lane);
  }
  __device__ __forceinline__ static void landed() {}
};

// The last split of a tile to arrive adds the partials in split order and writes Y.
__device__ __forceinline__ bool gemm_last_arrival(int32_t* counter, int splits) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == splits - 1;
  __syncthreads();
  return last != 0;
}

// The last block of a tile: Y = the sum of the tile's split partials, added in split order (the
// same bits on every replay). Tiles of up to 16 rows: a thread takes one element at a time. Larger
// tiles: a thread takes kRun elements a pass with the loads of several splits for all of them in
// flight together (hoisted above the Y stores, which could alias them), so a pass costs about one
// L2 round trip instead of one per element.
template <int kRun>
__device__ __forceinline__ void gemm_reduce_tile(const GemmLaunch& g, const GemmOperands& op,
                                                 const float* tile_base, int64_t tile_floats,
                                                 int n0) {
  const int total = g.m * kLayerGemmTileN;
  if constexpr (kRun == 1) {
    for (int e = threadIdx.x; e < total; e += kGemmThreads) {
      const int row = e / kLayerGemmTileN, col = n0 + e % kLayerGemmTileN;
      if (col >= op.n_cols) continue;
      float sum = 0.f;
      for (int s = 0; s < g.splits; ++s) sum += __ldcg(tile_base + s * tile_floats + e);
      op.y[int64_t(row) * op.ldy + col] = float_to_bf16(sum);
    }
  } else {
    for (int e0 = threadIdx.x; e0 < total; e0 += kGemmThreads * kRun) {
      float sum[kRun];
#pragma unroll
      for (int u = 0; u < kRun; ++u) sum[u] = 0.f;
#pragma unroll 4
      for (int s = 0; s < g.splits; ++s) {
        const float* part = tile_base + s * tile_floats;
        float v[kRun];
#pragma unroll
        for (int u = 0; u < kRun; ++u) {
          const int e = e0 + u * kGemmThreads;
          v[u] = e < total ? __ldcg(part + e) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < kRun; ++u) sum[u] += v[u];
      }
#pragma unroll
      for (int u = 0; u < kRun; ++u) {
        const int e = e0 + u * kGemmThreads;
        const int row = e / kLayerGemmTileN, col = n0 + e % kLayerGemmTileN;
        if (e < total && col < op.n_cols) op.y[int64_t(row) * op.ldy + col] = float_to_bf16(sum[u]);
      }
    }
  }
}

// This thread's accumulators into a partial tile of rows `stride` floats apart (rows < m).
template <int MT>
__device__ __forceinline__ void store_partial_tile(float* dst, int stride, int m,
                                                   const float (&acc)[MT][4], int warp, int lane) {
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = gemm_acc_row(j, lane, e);
      if (row < m) dst[row * stride + gemm_acc_col(warp, lane, e)] = acc[j][e];
    }
}

// This thread's values of an unsplit tile (columns n0 ..) into Y as bf16. kWhole: every row and
// column of the tile is inside Y, so no value is tested and the conversions and stores form one
// straight block; with a test around each value, each becomes its own branch, run one after
// another (at 64 rows, 32 of them).
template <int MT, bool kWhole>
__device__ __forceinline__ void store_tile_bf16(const GemmOperands& op, int m, int n0,
                                                const float (&acc)[MT][4], int warp, int lane) {
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = gemm_acc_row(j, lane, e), col = n0 + gemm_acc_col(warp, lane, e);
      if (kWhole || (row < m && col < op.n_cols))
        op.y[int64_t(row) * op.ldy + col] = float_to_bf16(acc[j][e]);
    }
}

template <int MT>
__device__ __forceinline__ void gemm_epilogue(const GemmLaunch& g, const GemmOperands& op,
                                              int tile, int split, int n0,
                                              const float (&acc)[MT][4], int warp, int lane) {
  const int m = g.m;
  if (g.splits == 1) {
    if (m == 8 * MT && n0 + kLayerGemmTileN <= op.n_cols)
      store_tile_bf16<MT, true>(op, m, n0, acc, warp, lane);
    else
      store_tile_bf16<MT, false>(op, m, n0, acc, warp, lane);
    KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlGemmStored, threadIdx.x);
    return;
  }
  const int64_t tile_floats = int64_t(m) * kLayerGemmTileN;
  float* tile_base = g.scratch + int64_t(tile) * g.splits * tile_floats;
  store_partial_tile<MT>(tile_base + split * tile_floats, kLayerGemmTileN, m, acc, warp, lane);
  if (!gemm_last_arrival(g.counters + tile, g.splits)) return;
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlGemmPartials, threadIdx.x);
  __threadfence();
  gemm_reduce_tile<(MT >= 4 ? 16 : 1)>(g, op, tile_base, tile_floats, n0);
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlGemmStored, threadIdx.x);
  if (threadIdx.x == 0) g.counters[tile] = 0;
}

// The cluster way (see the top of this file): block `split` of the tile's cluster. The partial
// tile is stored with rows of kClusterPartStride floats (64 + 4: the four lanes of a quad hold
// four different rows and so land in different banks), over the stage buffers once every warp
// is done with them; a float4 group q of the tile (row q / 16, columns 4 (q % 16) ..) is added
// by block q / 128 % splits.
constexpr int kClusterPartStride = kLayerGemmTileN + 4;

template <int MT>
__device__ __forceinline__ void gemm_cluster_epilogue(const GemmLaunch& g, const GemmOperands& op,
                                                      int split, int n0, const float (&acc)[MT][4],
                                                      int warp, int lane, uint8_t* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(8 * MT * kClusterPartStride * 4 <= GemmShape<MT>::kSmemBytes, "partial tile fits");
  float* part = reinterpret_cast<float*>(smem);
  const int m = g.m;
  __syncthreads();  // every warp is done reading the stages
  store_partial_tile<MT>(part, kClusterPartStride, m, acc, warp, lane);
  cluster_arrive_release();  // every split's partial is in place ...
  cluster_wait();            // ... once all have arrived
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlGemmPartials, threadIdx.x);
  const int splits = g.splits;
  const int groups = m * (kLayerGemmTileN / 4);
  for (int q = split * kGemmThreads + threadIdx.x; q < groups; q += splits * kGemmThreads) {
    const int row = q / (kLayerGemmTileN / 4), c = 4 * (q % (kLayerGemmTileN / 4));
    const float* mine = part + row * kClusterPartStride + c;
    float4 v[kMaxPortableClusterBlocks];
#pragma unroll
    for (int s = 0; s < kMaxPortableClusterBlocks; ++s)
      if (s < splits) v[s] = ld_cluster_f32x4(mine, s);
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < kMaxPortableClusterBlocks; ++s)
      if (s < splits) {
        sum[0] += v[s].x;
        sum[1] += v[s].y;
        sum[2] += v[s].z;
        sum[3] += v[s].w;
      }
    uint16_t* y = op.y + int64_t(row) * op.ldy + n0 + c;
    if (n0 + c + 4 <= op.n_cols) {  // no bounds test per value (see gemm_epilogue)
#pragma unroll
      for (int u = 0; u < 4; ++u) y[u] = float_to_bf16(sum[u]);
    } else {
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (n0 + c + u < op.n_cols) y[u] = float_to_bf16(sum[u]);
    }
  }
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlGemmStored, threadIdx.x);
  // No block leaves while another may still read its shared memory; this block's reads have
  // returned (their values are in the sums), so the arrival need not order memory.
  cluster_arrive_relaxed();
  cluster_wait();
#else
  (void)g, (void)op, (void)split, (void)n0, (void)acc, (void)warp, (void)lane, (void)smem;
  __trap();  // launched in clusters only where the device has them (sm_90+)
#endif
}

// The cp.async ring every GEMM block runs over its nk stages of K: the weights of the first
// kStages - 1 stages are requested before pdl_wait (weights never depend on the previous kernel),
// their X after it; then per stage i: wait until it has landed for every thread (which also frees
// stage i - 1's buffer: multiply(i - 1) has finished reading it), request stage i + kStages - 1
// into that buffer, multiply stage i. landed() runs in every thread between its wait and the
// block's barrier. acc starts at zero. The kernel's dependents may launch once the first weights
// are requested (see the top of the file).
struct GemmNothingToFence {
  __device__ __forceinline__ void operator()() const {}
};
template <int kStages, int MT, typename LoadW, typename LoadX, typename Multiply,
          typename Landed = GemmNothingToFence>
__device__ __forceinline__ void gemm_ring(int nk, float (&acc)[MT][4], LoadW load_w, LoadX load_x,
                                          Multiply multiply, Landed landed = Landed{}) {
  constexpr int kAhead = kStages - 1;
  for (int i = 0; i < kAhead; ++i)
    if (i < nk) load_w(i);
  pdl_launch_dependents();
  pdl_wait();  // X is the previous kernel's output
  for (int i = 0; i < kAhead; ++i) {
    if (i < nk) load_x(i);
    cp_async_commit();
  }
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  for (int i = 0; i < nk; ++i) {
    cp_async_wait<kAhead - 1>();  // stage i has landed (groups 0 .. i)
    landed();
    __syncthreads();              // ... for every thread; stage i - 1's buffer is free
    const int next = i + kAhead;
    if (next < nk) {
      load_w(next);
      load_x(next);
    }
    cp_async_commit();
    multiply(i);
  }
  cp_async_wait<0>();
}

// Block `bid` of a launch (bid < tiles * splits). smem: GemmShape<MT>::kSmemBytes, 128-aligned
// (1024-aligned for wgmma's swizzled operands). kCluster: the launch is in clusters of `splits`
// blocks, one tile per cluster (block bid is split bid % splits of tile bid / splits); otherwise
// tile bid % tiles, split bid / tiles. Mma: how a stage is multiplied (GemmMmaSync or the sm_90a
// family's wgmma).
template <int MT, WeightLayout L, bool kCluster = false, typename Mma = GemmMmaSync>
__device__ __forceinline__ void gemm_block(const GemmLaunch& g, int bid, uint8_t* smem) {
  using Shape = GemmShape<MT>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tile = kCluster ? bid / g.splits : bid % g.tiles;
  const int split = kCluster ? bid % g.splits : bid / g.tiles;
  const GemmTileId id = gemm_tile_id(g, tile);
  const GemmOperands op = gemm_operands(g, id);
  const int stages = g.k / kLayerGemmTileK;
  const int kt0 = split * stages / g.splits, kt1 = (split + 1) * stages / g.splits;
  const int nk = kt1 - kt0;
  auto stage_ptr = [&](int i) { return smem + (i % Shape::kStages) * Shape::kStageBytes; };
  float acc[MT][4];
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlEntry, tid);
  gemm_ring<Shape::kStages>(
      nk, acc,
      [&](int i) { gemm_load_w<L>(stage_ptr(i), op, id.n0, (kt0 + i) * kLayerGemmTileK, tid); },
      [&](int i) {
        if (i == 0) KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlWaited, tid);
        gemm_load_x<MT>(stage_ptr(i), op, g.m, (kt0 + i) * kLayerGemmTileK, tid);
      },
      [&](int i) {
        if (i == 0) KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlFirstTile, tid);
        Mma::template multiply<MT, L>(acc, stage_ptr(i), warp, lane);
      },
      [] { Mma::landed(); });
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlFirstEpi, tid);
  if constexpr (kCluster)
    gemm_cluster_epilogue<MT>(g, op, split, id.n0, acc, warp, lane, smem);
  else
    gemm_epilogue<MT>(g, op, tile, split, id.n0, acc, warp, lane);
  KF_TIMELINE_STAMP(g.timeline, g.timeline_kernel, kTlExit, tid);
}

// f(std::integral_constant<int, MT>) for the smallest MT with 8 MT >= m (m in 1..128).
template <typename F>
cudaError_t with_gemm_mt(int m, F&& f) {
  if (m <= 8) return f(std::integral_constant<int, 1>{});
  if (m <= 16) return f(std::integral_constant<int, 2>{});
  if (m <= 32) return f(std::integral_constant<int, 4>{});
  if (m <= 64) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 16>{});
}

// The kernel's dynamic shared memory limit, set on every launch: without the opt-in attribute
// dynamic plus static shared memory must stay within 48 KB, and 48 KB of stages plus the
// kernels' few static bytes (MT = 4) would not.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

}  // namespace kf::cuda
