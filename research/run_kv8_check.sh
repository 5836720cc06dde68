#!/usr/bin/env bash
# Build research/kv8_check.cu with the CUDA backend's sources and the CPU backend (nvcc, sm_90 by
# default) and run it: 8-bit checks, then timings (pass --no-time to skip them). A binary built
# beforehand (e.g. on a machine without a GPU) is used as is when BIN names it. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
OUT=${OUT:-/tmp/kf_kv8_check}
mkdir -p "$OUT"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${ARCH:-sm_90}
B=${BUILD_DIR:-build/kv8-$ARCH}
BIN=${BIN:-$B/kv8_check}
if [ ! -x "$BIN" ]; then
  mkdir -p "$B/dlpack_include/dlpack"
  # DLPack's header as the CMake build finds it (system, KF_DLPACK_INCLUDE_DIR, or a Python
  # package's copy, e.g. torch's ATen/dlpack.h).
  dl=${KF_DLPACK_INCLUDE_DIR:-}
  if [ -z "$dl" ] && [ ! -f /usr/include/dlpack/dlpack.h ]; then
    found=$(python3 cmake/find_dlpack.py 2>/dev/null)
    if [[ "$found" == *.h ]]; then cp "$found" "$B/dlpack_include/dlpack/dlpack.h"; else dl=$found; fi
  fi
  FLAGS="-std=c++17 -O3 --expt-relaxed-constexpr -arch=$ARCH -Isrc -Iinclude -I$B/dlpack_include ${dl:+-I$dl} -lineinfo ${EXTRA_FLAGS:-}"
  pids=()
  for f in $(find src/cuda -name '*.cu' ! -name deverr_check.cu) research/kv8_check.cu; do
    o="$B/$(echo "$f" | tr / _).o"
    "$NVCC" $FLAGS -Xptxas -v -c "$f" -o "$o" > "$o.log" 2>&1 &
    pids+=($!)
  done
  for f in src/cpu/*.cpp; do
    o="$B/$(echo "$f" | tr / _).o"
    g++ -std=c++17 -O3 -Isrc -Iinclude -I$B/dlpack_include ${dl:+-I$dl} -c "$f" -o "$o" > "$o.log" 2>&1 &
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  cat "$B"/*.log > "$B/ptxas.txt"
  if [ $ok = 0 ]; then grep -B2 -A5 error "$B/ptxas.txt" | head -60; exit 1; fi
  "$NVCC" -arch=$ARCH "$B"/*.o -o "$BIN" -lpthread || exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv 2>/dev/null | tee "$OUT/gpu.txt"
"$BIN" "$@" 2>&1 | tee "$OUT/kv8_check.log"
exit "${PIPESTATUS[0]}"
