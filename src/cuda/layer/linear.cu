// kf_linear on the GPU: one job of the fused layer's skinny GEMM (skinny_gemm.cu picks the
// narrow or the wide kernel and the split), with the caller's workspace as its split scratch,
// launched in plain stream order (GemmLaunch::stream_order says why).
#include "cuda/common/switches.h"
#include "cuda/common/timeline.cuh"
#include "cuda/launch.h"
#include "cuda/layer/layer_kernels.h"

namespace kf::cuda {

cudaError_t launch_linear(const LinearParams& p, cudaStream_t stream) {
  GemmLaunch g{};
  GemmJob& j = g.job[0];
  j.w = p.w;
  j.ldw = p.ldw;
  j.x = p.x;
  j.ldx = p.ldx;
  j.y = p.y;
  j.ldy = p.ldy;
  j.n_cols = p.n;
  j.num_z = 1;
  g.num_jobs = 1;
  g.m = p.m;
  g.k = p.k;
  g.scratch = p.scratch;
  g.counters = p.counters;
  g.stream_order = true;  // the previous kernel in the caller's stream may write the weight
  g.timeline = switch_timeline_buffer();  // null but in the timeline build
  g.timeline_kernel = kTlGemmOther;
  return launch_skinny_gemm(g, WeightLayout::kNK, stream);
}

}  // namespace kf::cuda
