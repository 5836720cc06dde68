// CPU y = x W^T (kf_linear): for every output, the fp32 sum of the bf16 products over k in
// order, rounded to bf16 once. Columns are shared out over threads by a fixed stride
// (run_threads), so the result does not depend on the thread count.
#include "core/half_convert.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_util.h"

#include <vector>

namespace kf::cpu {

void linear(const LinearParams& p) {
  // x converted once: [m][k] floats.
  std::vector<float> x(size_t(p.m) * p.k);
  for (int i = 0; i < p.m; ++i)
    for (int j = 0; j < p.k; ++j) x[size_t(i) * p.k + j] = bf16_to_float(p.x[i * p.ldx + j]);
  run_threads(p.n, [&](int t, int threads) {
    std::vector<float> w(p.k);
    for (int n = t; n < p.n; n += threads) {
      const uint16_t* wr = p.w + n * p.ldw;
      for (int j = 0; j < p.k; ++j) w[j] = bf16_to_float(wr[j]);
      for (int i = 0; i < p.m; ++i) {
        const float* xr = x.data() + size_t(i) * p.k;
        float acc = 0.f;
        for (int j = 0; j < p.k; ++j) acc += xr[j] * w[j];
        p.y[i * p.ldy + n] = float_to_bf16(acc);
      }
    }
  });
}

}  // namespace kf::cpu
