// The split scheduler on the GPU. Graph-safe: one block, no host synchronization.
//
// Fast path (what fits in 48 KiB of shared memory: 8 B per request and 12 B per worker, e.g.
// b <= 4096 at 264 workers): the closed form of core/scheduler.h, one value per thread: a block
// scan of the requests' costs, each worker's cut by binary search over it, a scan of the piece
// boundaries, then every output word independently. The CPU backend's walk (build_schedule)
// writes the same bytes (cpp_tests/test_scheduler.cpp checks the closed form against the walk;
// the GPU tests compare the GPU's bytes with the CPU's). One thread walking the workers costs
// on the order of 200 ns per worker (tens of microseconds at 264 workers); this takes a few
// scans. Larger batches fall back to that walk on global memory (correct, slower).
#include "core/scheduler.h"
#include "cuda/common/device_error.cuh"
#include "cuda/launch.h"

namespace kf::cuda {
namespace {

constexpr int kMetaThreads = 1024;
constexpr size_t kMetaSmemBytes = 46 * 1024;  // + the static scan scratch: within 48 KiB

size_t closed_form_smem_bytes(int batch, int num_workers) {
  return (size_t(batch) + 1) * sizeof(int64_t) + (size_t(num_workers) + 1) * (sizeof(SchedCut) + 4);
}

// In-place inclusive scan of v[0, n) by the whole block (kMetaThreads threads): each thread
// scans a contiguous chunk, the chunk totals are scanned across lanes and warps, and each chunk
// adds the total before it. Integer sums: the result does not depend on the order.
template <typename V>
__device__ void block_inclusive_scan(V* v, int n, V* warp_tot) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (n + kMetaThreads - 1) / kMetaThreads;
  const int lo = tid * per, hi = lo + per < n ? lo + per : n;
  V run = 0;
  for (int i = lo; i < hi; ++i) v[i] = run += v[i];
  V incl = run;  // this thread's chunk total, scanned over the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const V x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    V t = lane < kMetaThreads / 32 ? warp_tot[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const V x = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += x;
    }
    if (lane < kMetaThreads / 32) warp_tot[lane] = t;
  }
  __syncthreads();
  const V before = incl - run + (warp > 0 ? warp_tot[warp - 1] : 0);
  for (int i = lo; i < hi; ++i) v[i] += before;
  __syncthreads();
}

__global__ void __launch_bounds__(kMetaThreads)
    mla_metadata_closed_form_kernel(const __grid_constant__ MlaMetadataParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int64_t warp_tot64[kMetaThreads / 32];
  __shared__ int warp_tot32[kMetaThreads / 32];
  const int batch = p.batch, W = p.num_workers, tid = threadIdx.x;
  int64_t* seg_prefix = reinterpret_cast<int64_t*>(smem);              // [batch + 1]
  SchedCut* cut = reinterpret_cast<SchedCut*>(seg_prefix + batch + 1);  // [W + 1]
  int* nb = reinterpret_cast<int*>(cut + W + 1);                        // [W + 1]

  // 1. seg_prefix[r] = the cost of the requests before r.
  if (tid == 0) seg_prefix[0] = 0;
  for (int r = tid; r < batch; r += kMetaThreads) {
    int32_t len = p.cache_seqlens[r];
    if (len < 0) {
      report_device_error(p.error_buffer, kDevErrSeqlenRange, r, len);
      len = 0;
    }
    seg_prefix[r + 1] = sched_seg_len(len, p.fixed_cost);
  }
  __syncthreads();
  block_inclusive_scan(seg_prefix + 1, batch, warp_tot64);
  // 2. W_a (sched_active_workers: the whole-request candidate when none of its cuts splits a
  // request; else sched_workers' half at small batch where p.spread allows it), the cut that starts each worker
  // (sched_cut_index); 3. nb[w] = piece boundaries among cuts 1..w.
  const int cand = sched_whole_candidate(batch, W);
  bool split = false;
  for (int w = 1 + tid; w < cand; w += kMetaThreads)
    split |= schedule_cut(seg_prefix, batch, cand, p.fixed_cost, w).tile > 0;
  const SchedWorkers sw =
      sched_workers(__syncthreads_or(split) ? W : cand, seg_prefix[batch], W, p.spread);
  for (int w = tid; w <= W; w += kMetaThreads)
    cut[w] = schedule_cut(seg_prefix, batch, sw.active, p.fixed_cost, sched_cut_index(w, sw.spread));
  __syncthreads();
  for (int w = tid; w <= W; w += kMetaThreads)
    nb[w] = w == 0 ? 0 : int(schedule_boundary(cut[w - 1], cut[w]));
  __syncthreads();
  block_inclusive_scan(nb, W + 1, warp_tot32);
  // 4. every output word.
  for (int w = tid; w < W; w += kMetaThreads)
    write_meta_worker(p.metadata, w, cut[w], cut[w + 1], cut[w].req + nb[w]);
  int32_t* piece_offset = p.metadata + kMetaHeaderLen + W * kMetaWorkerLen;
  for (int r = tid; r <= batch; r += kMetaThreads) {
    // Boundaries in requests before r: nb at the last cut with req < r (cuts are ordered).
    int lo = 0, hi = W + 1;  // the first w with cut[w].req >= r
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (cut[mid].req >= r)
        hi = mid;
      else
        lo = mid + 1;
    }
    piece_offset[r] = r + (lo == 0 ? 0 : nb[lo - 1]);
  }
  if (tid == 0)
    write_meta_header(p.metadata, batch, p.h_q, p.s_q, W, batch + nb[W], p.fixed_cost, p.spread);
}

// The walk, for batches whose arrays do not fit shared memory.
__global__ void mla_metadata_walk_kernel(const __grid_constant__ MlaMetadataParams p) {
  for (int r = threadIdx.x; r < p.batch; r += blockDim.x)
    if (p.cache_seqlens[r] < 0)
      report_device_error(p.error_buffer, kDevErrSeqlenRange, r, p.cache_seqlens[r]);
  if (threadIdx.x == 0)  // build_schedule treats a negative length as 0 too
    build_schedule(p.cache_seqlens, p.batch, p.h_q, p.s_q, p.num_workers, p.fixed_cost,
                   p.spread, p.metadata);
}

}  // namespace

cudaError_t launch_mla_metadata(const MlaMetadataParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.num_workers < 1 || p.metadata == nullptr || p.fixed_cost < 0 ||
      p.fixed_cost > kMaxFixedCost)
    return cudaErrorInvalidValue;
  const size_t need = closed_form_smem_bytes(p.batch, p.num_workers);
  if (need <= kMetaSmemBytes)
    mla_metadata_closed_form_kernel<<<1, kMetaThreads, need, stream>>>(p);
  else
    mla_metadata_walk_kernel<<<1, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kf::cuda
