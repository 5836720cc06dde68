#!/usr/bin/env bash
# Build a research harness with the CUDA backend's sources and the CPU backend, in parallel.
#   usage: bash research/build_harness.sh research/<name>.cu <build dir> [link flags]
# nvcc -arch=$ARCH (sm_90 by default); EXTRA_FLAGS go to every compile (e.g. -Xcompiler -fopenmp,
# -D switches for experiments). SRC_ROOT (default: this checkout) names the tree whose src/ and
# include/ are built, e.g. a git worktree of a branch, to compare variants in one device call. The
# binary is <build dir>/<name>; the resource report (-Xptxas -v) goes to <build dir>/ptxas.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${ARCH:-sm_90}
src=$(realpath "$1")
B=$(realpath -m "$2")
R=$(realpath "${SRC_ROOT:-.}")
link=${3:-}
mkdir -p "$B/dlpack_include/dlpack"
# DLPack's header as the CMake build finds it (system, KF_DLPACK_INCLUDE_DIR, or a Python
# package's copy, e.g. torch's ATen/dlpack.h).
dl=${KF_DLPACK_INCLUDE_DIR:-}
if [ -z "$dl" ] && [ ! -f /usr/include/dlpack/dlpack.h ]; then
  found=$(python3 cmake/find_dlpack.py 2>/dev/null)
  if [[ "$found" == *.h ]]; then cp "$found" "$B/dlpack_include/dlpack/dlpack.h"; else dl=$found; fi
fi
INC="-I$R/src -I$R/include -I$B/dlpack_include ${dl:+-I$dl}"
FLAGS="-std=c++17 -O3 --expt-relaxed-constexpr -arch=$ARCH $INC -lineinfo ${EXTRA_FLAGS:-}"
pids=()
for f in $(find "$R/src/cuda" -name '*.cu' ! -name deverr_check.cu) "$src"; do
  o="$B/$(echo "$f" | tr / _).o"
  "$NVCC" $FLAGS -Xptxas -v -c "$f" -o "$o" > "$o.log" 2>&1 &
  pids+=($!)
done
for f in "$R"/src/cpu/*.cpp; do
  o="$B/$(echo "$f" | tr / _).o"
  g++ -std=c++17 -O3 $INC -c "$f" -o "$o" > "$o.log" 2>&1 &
  pids+=($!)
done
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
cat "$B"/*.log > "$B/ptxas.txt"
if [ $ok = 0 ]; then grep -B2 -A5 error "$B/ptxas.txt" | head -60; exit 1; fi
"$NVCC" -arch=$ARCH ${EXTRA_FLAGS:-} "$B"/*.o -o "$B/$(basename "$src" .cu)" -lpthread $link
