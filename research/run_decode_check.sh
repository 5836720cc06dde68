#!/usr/bin/env bash
# Build research/mla_decode_check.cu with the CUDA backend's sources (nvcc, sm_90 by default) and
# run it: correctness checks, then timings (pass --no-time to skip them). SANITIZE=1 also runs the
# checks under compute-sanitizer memcheck. Logs go to $OUT (the device tool's folder) or /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
OUT=${OUT:-/tmp/kf_decode_check}
mkdir -p "$OUT"
ARCH=${ARCH:-sm_90}
B=${BUILD_DIR:-/tmp/kf_decode_build}
EXTRA_FLAGS="${EXTRA_FLAGS:-} -Xcompiler -fopenmp" bash research/build_harness.sh \
  research/mla_decode_check.cu "$B" -lgomp || exit 1
cp "$B/ptxas.txt" "$OUT/ptxas.txt"
grep -E "spill|registers" "$OUT/ptxas.txt" | sort | uniq -c | sort -rn | head -20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
"$B/mla_decode_check" "$@" 2>&1 | tee "$OUT/decode_check.log"
rc=${PIPESTATUS[0]}
if [ "${SANITIZE:-0}" = 1 ]; then
  # memcheck over every check; racecheck (shared memory hazards) on an M16 and an M64 case.
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$B/mla_decode_check" --no-time 2>&1 | tail -30 > "$OUT/sanitizer.log"
  for i in 0 3; do
    timeout 60 compute-sanitizer --tool racecheck --print-limit 20 "$B/mla_decode_check" --only $i 2>&1 | tail -15 >> "$OUT/sanitizer.log"
  done
  cat "$OUT/sanitizer.log"
fi
exit $rc
