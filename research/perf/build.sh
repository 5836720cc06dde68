#!/usr/bin/env bash
# Build the research/perf harness: every vN.cu + the snapshot combine/metadata + perf_check.cu.
# ARCH=sm_90 (default) or sm_86 (resource check only: RESOURCE_ONLY=1). Output: build/perf_check.
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
ARCH=${ARCH:-sm_90}
B=build/$ARCH
mkdir -p "$B"
FLAGS="-std=c++17 -O3 --expt-relaxed-constexpr -arch=$ARCH -Isnap -I. -lineinfo"
srcs="v0.cu v1.cu v2.cu v3.cu v4.cu v5.cu v6.cu ${EXTRA_SRCS:-}"
[ "${RESOURCE_ONLY:-0}" = 1 ] || srcs="$srcs snap/cuda/combine/mla_combine.cu snap/cuda/sched/mla_metadata.cu perf_check.cu"
pids=()
for f in $srcs; do
  o="$B/$(basename "$f" .cu).o"
  nvcc $FLAGS -Xcompiler -fopenmp -Xptxas -v -c "$f" -o "$o" > "$o.log" 2>&1 &
  pids+=($!)
done
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
for f in $srcs; do
  o="$B/$(basename "$f" .cu).o"
  grep -E "error" "$o.log" | head -20 || true
  case $f in v*.cu) echo "$ARCH $(basename $f): $(grep -E 'registers|spill' "$o.log" | sed -E 's/ptxas info *: //' | paste -sd' ' | sed -E 's/ +/ /g')";; esac
done
[ $ok = 1 ] || exit 1
[ "${RESOURCE_ONLY:-0}" = 1 ] && exit 0
nvcc $FLAGS "$B"/*.o -o build/perf_check -lgomp
echo built build/perf_check
