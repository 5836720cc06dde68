// One launch for what follows the query and kv projections: the query absorption
// q_attn[b, h, 0:512] = q_nope[b, h] W_UK[h] (skinny_gemm.cuh's block with the weight stored
// [k][n]: W_UK[h] is rows h (nope + v) .. h (nope + v) + nope - 1 of w_kv_b, K = nope, 512
// columns, one z per head) in blocks 0 .. tiles x splits - 1, and the prologue
// (layer_prologue.cuh) in the following `batch` blocks, one request each. The two write disjoint
// parts of q_attn (0:512 and 512:576). 128 threads per block; shared memory: the GEMM's stages
// (dynamic) and the prologue's 1152-byte row (static).
#include <cstdint>

#include "cuda/common/pdl.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/layer/layer_kernels.h"
#include "cuda/layer/layer_prologue.cuh"
#include "cuda/layer/skinny_gemm.cuh"

namespace kf::cuda {
namespace {

static_assert(kPrologueThreads == kGemmThreads, "one block size for both parts of the launch");
// The largest stage set plus the prologue's static row within sm_86's 101376 bytes per block.
static_assert(GemmShape<16>::kSmemBytes + kHeadDim * 2 + 256 <= 101376, "sm_86 shared memory");

struct QAbsorbPrologue {
  GemmLaunch absorb;
  PrologueParams pro;
};

template <int MT>
__global__ void __launch_bounds__(kGemmThreads)
    q_absorb_prologue_kernel(const __grid_constant__ QAbsorbPrologue p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int gemm_blocks = p.absorb.tiles * p.absorb.splits;
  if (int(blockIdx.x) < gemm_blocks) {
    gemm_block<MT, WeightLayout::kKN>(p.absorb, blockIdx.x, smem);
    return;
  }
  KF_TIMELINE_STAMP(p.absorb.timeline, kTlQAbsorb, kTlEntry, threadIdx.x);
  const int b = blockIdx.x - gemm_blocks;
  const PrologueInputs in = prologue_inputs(p.pro, b);
  pdl_wait();  // the projections
  KF_TIMELINE_STAMP(p.absorb.timeline, kTlQAbsorb, kTlWaited, threadIdx.x);
  layer_prologue_row(p.pro, b, in);
  KF_TIMELINE_STAMP(p.absorb.timeline, kTlQAbsorb, kTlExit, threadIdx.x);
  pdl_launch_dependents();
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// What the prologue's vector accesses need: 8-byte kv_proj rows (compact 576-value rows),
// 16-byte cache rows, a power-of-two page size (a multiple of 16 for 8-bit caches).
bool prologue_ok(const PrologueParams& p) {
  const bool q8 = is_8bit(p.kv_format);
  const bool fmt = p.kv_format == KvFormat::kBF16 || q8;
  return fmt && p.batch >= 1 && p.batch <= kGemmMaxM && p.heads >= 1 && p.nope >= 0 &&
         p.q_proj && p.kv_proj && p.kv_a_norm && p.q_attn && p.positions && p.cache_seqlens &&
         p.block_table && p.cos_sin && p.cache && p.max_position >= 1 && p.num_pages >= 1 &&
         p.page_size == (1 << p.page_shift) && p.max_pages_per_seq >= 1 &&
         reinterpret_cast<uintptr_t>(p.kv_proj) % 8 == 0 && aligned16(p.cache) &&
         (q8 ? p.page_size % 16 == 0 && p.page_stride % 16 == 0
             : p.page_stride % 8 == 0 && p.token_stride % 8 == 0);
}

}  // namespace

cudaError_t launch_q_absorb_prologue(const GemmLaunch& absorb, const PrologueParams& pro,
                                     cudaStream_t stream) {
  QAbsorbPrologue p{absorb, pro};
  if (!plan_gemm(p.absorb, WeightLayout::kKN) || !prologue_ok(pro) || absorb.m != pro.batch)
    return cudaErrorInvalidValue;
  return with_gemm_mt(p.absorb.m, [&](auto mt) {
    constexpr int MT = decltype(mt)::value;
    auto kernel = q_absorb_prologue_kernel<MT>;
    const cudaError_t err = allow_smem(kernel, GemmShape<MT>::kSmemBytes);
    if (err != cudaSuccess) return err;
    const int blocks = p.absorb.tiles * p.absorb.splits + pro.batch;
    return launch_pdl(kernel, dim3(blocks), dim3(kGemmThreads), GemmShape<MT>::kSmemBytes, stream,
                      p);
  });
}

}  // namespace kf::cuda
