#!/usr/bin/env bash
# One call on the GPU machine (the device tool): one build for sm_90 (library, C++ tests and the
# Python module in place: build/gpu/python is importable, no pip install), then the GPU tests (C++
# and Python), the benchmarks and the sanitizers, and a short table last.
#   usage: bash scripts/gpu_check.sh [tests|bench|layer|sanitize|all]...   (default: tests bench)
#   env:   BENCH_ARGS (python -m kernelflow bench's options, default --quick), LAYER_ARGS
#          (python -m kernelflow.bench.layer's), OUT (/tmp/kf-out)
# Needs .deps/googletest carried along for the C++ tests (the GPU image has no packaged GTest).
# Exit status 1 when a step fails: the build, ctest (also when it finds no tests), the GPU pytest
# run, a benchmark's checks or the sanitizers.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kf-out}
mkdir -p "$OUT"
modes=${*:-tests bench}
export KF_CUDA_ARCHS=${KF_CUDA_ARCHS:-90}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
export PYTHONUNBUFFERED=1
summary=()
failed=0
note() { summary+=("$1"); echo "## $1"; }
fail() { note "$1"; failed=1; }
t0=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

if [ -d .deps/googletest ]; then export KF_GTEST_SOURCE_DIR=$PWD/.deps/googletest; fi
if cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKF_BUILD_TESTS=ON \
     -DKF_BUILD_PYTHON=ON >"$OUT/cmake.log" 2>&1 && cmake --build build/gpu >>"$OUT/cmake.log" 2>&1; then
  note "build (sm_$KF_CUDA_ARCHS, tests, Python module): ok ($(( $(date +%s) - t0 )) s)"
else
  tail -40 "$OUT/cmake.log"
  fail "build: FAILED (see cmake.log)"
  exit 1
fi
export PYTHONPATH=$PWD/build/gpu/python${PYTHONPATH:+:$PYTHONPATH}
python3 -m kernelflow info

if [[ " $modes " == *" tests "* || " $modes " == *" all "* ]]; then
  if ctest --test-dir build/gpu --output-on-failure --no-tests=error -j4 >"$OUT/ctest.log" 2>&1; then
    note "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  else
    fail "ctest: FAILED: $(grep -E 'tests passed|tests failed|No tests were found' "$OUT/ctest.log" | tail -1)"
  fi
  grep -E "Failed|FAILED|Skipped|No tests" "$OUT/ctest.log" | head -20
  python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
  if [ "${PIPESTATUS[0]}" = 0 ]; then note "pytest gpu: $(tail -1 "$OUT/pytest_gpu.log")"
  else fail "pytest gpu: FAILED: $(tail -1 "$OUT/pytest_gpu.log")"; fi
  python3 -m kernelflow demo 2>&1 | tail -8
fi

if [[ " $modes " == *" bench "* || " $modes " == *" all "* ]]; then
  # The whole benchmark (peaks, decode per family beside the baselines, 8-bit sweep, layer), its
  # record and figures; BENCH_ARGS="" runs the full one (under 10 min), the default the quick one.
  python3 -m kernelflow bench ${BENCH_ARGS---quick} --progress plain --json "$OUT/bench.json" \
    --log "$OUT/bench_detail.log" --figures "$OUT/figures" 2>&1 | tee "$OUT/bench.log" | tail -70
  if [ "${PIPESTATUS[0]}" = 0 ]; then note "bench: see tables above ($(( $(date +%s) - t0 )) s)"
  else fail "bench: a check FAILED or the run broke (see bench.log, bench_detail.log)"; fi
fi

if [[ " $modes " == *" layer "* || " $modes " == *" all "* ]]; then
  python3 -m kernelflow.bench.layer ${LAYER_ARGS:-} --json "$OUT/layer.json" 2>&1 | tee "$OUT/layer.log" | tail -70
  if [ "${PIPESTATUS[0]}" = 0 ]; then note "layer bench: see table above ($(( $(date +%s) - t0 )) s)"
  else fail "layer bench: a check FAILED or the run broke (see layer.log)"; fi
fi

if [[ " $modes " == *" sanitize "* || " $modes " == *" all "* ]]; then
  if [ -x scripts/sanitize.sh ]; then
    bash scripts/sanitize.sh 2>&1 | tee "$OUT/sanitize.log" | tail -20
    if [ "${PIPESTATUS[0]}" = 0 ]; then note "sanitize: $(tail -1 "$OUT/sanitize.log")"
    else fail "sanitize: $(tail -1 "$OUT/sanitize.log")"; fi
  fi
fi

# The device tool brings back at most 8 files: pack the logs into one.
(cd "$OUT" && tar czf logs.tgz ./*.log 2>/dev/null && rm -f ./*.log)
echo
echo "==== summary ($(cat "$OUT/gpu.txt"), $(( $(date +%s) - t0 )) s) ===="
printf '%s\n' "${summary[@]}"
exit $failed
