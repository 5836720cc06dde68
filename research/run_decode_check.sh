#!/usr/bin/env bash
# Build research/mla_decode_check.cu with the CUDA backend's sources (nvcc, sm_90 by default) and
# run it: correctness checks, then timings (pass --no-time to skip them). SANITIZE=1 also runs the
# checks under compute-sanitizer memcheck. Logs go to $OUT (the device tool's folder) or /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
OUT=${OUT:-/tmp/kf_decode_check}
mkdir -p "$OUT"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${ARCH:-sm_90}
B=${BUILD_DIR:-/tmp/kf_decode_build}
mkdir -p "$B"
FLAGS="-std=c++17 -O3 --expt-relaxed-constexpr -arch=$ARCH -Isrc -Iinclude -lineinfo -Xcompiler -fopenmp"
pids=()
for f in $(find src/cuda -name '*.cu' ! -name deverr_check.cu) research/mla_decode_check.cu; do
  o="$B/$(echo "$f" | tr / _).o"
  "$NVCC" $FLAGS -Xptxas -v -c "$f" -o "$o" > "$o.log" 2>&1 &
  pids+=($!)
done
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
cat "$B"/*.log > "$OUT/ptxas.txt"
if [ $ok = 0 ]; then grep -B2 -A5 error "$OUT/ptxas.txt" | head -60; exit 1; fi
grep -E "spill|registers" "$OUT/ptxas.txt" | sort | uniq -c | sort -rn | head -20
"$NVCC" $FLAGS "$B"/*.o -o "$B/mla_decode_check" -lgomp || exit 1
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
