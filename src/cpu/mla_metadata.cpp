// CPU metadata: the shared scheduler (core/scheduler.h) on clamped lengths, so the bytes equal the
// GPU metadata kernel's for the same cache_seqlens.
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_util.h"

namespace kf::cpu {

void mla_metadata(const MlaMetadataParams& p) {
  std::vector<int32_t> seqlens(p.batch);
  for (int r = 0; r < p.batch; ++r) {
    int32_t s = p.cache_seqlens[r];
    if (s < 0) {
      report_device_error(p.error_buffer, KF_DEVERR_SEQLEN_RANGE, r, s);
      s = 0;
    }
    seqlens[r] = s;
  }
  build_schedule(seqlens.data(), p.batch, p.h_q, p.s_q, p.num_workers, p.fixed_cost, p.spread,
                 p.metadata);
}

}  // namespace kf::cpu
