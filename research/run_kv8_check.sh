#!/usr/bin/env bash
# Build research/kv8_check.cu with the CUDA backend's sources and the CPU backend (nvcc, sm_90 by
# default) and run it: 8-bit checks, then timings (pass --no-time to skip them). A binary built
# beforehand (e.g. on a machine without a GPU) is used as is when BIN names it. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
OUT=${OUT:-/tmp/kf_kv8_check}
mkdir -p "$OUT"
ARCH=${ARCH:-sm_90}
B=${BUILD_DIR:-build/kv8-$ARCH}
BIN=${BIN:-$B/kv8_check}
if [ ! -x "$BIN" ]; then
  bash research/build_harness.sh research/kv8_check.cu "$B" || exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
"$BIN" "$@" 2>&1 | tee "$OUT/kv8_check.log"
exit "${PIPESTATUS[0]}"
