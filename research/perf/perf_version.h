// The interface every version exposes to the harness: decode(+combine) for <= 16 rows (h_q=16)
// and for more rows (h_q=128: 64-row tiles), and the worker counts it wants.
#pragma once
#include <cuda_runtime.h>
#include "core/params.h"

namespace kf::perf {
typedef cudaError_t (*DecodeFn)(const MlaDecodeParams&, cudaStream_t);
struct Version {
  const char* name;
  DecodeFn small;        // rows <= 16: decode + combine
  DecodeFn large;        // rows > 16: decode + combine
  DecodeFn small_only;   // decode kernel alone (timing)
  DecodeFn large_only;
  int (*workers)(int device, int rows);
  // Workspace the version needs beyond core's (counters, ...), bytes; 0 if none.
  int64_t (*extra_ws)(int batch, int rows, int workers);
};
}  // namespace kf::perf
