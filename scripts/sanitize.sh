#!/usr/bin/env bash
# compute-sanitizer over the GPU tests' representative subset: memcheck, racecheck, initcheck and
# synccheck each run the C++ binary's GpuSanitize* tests (small shapes, every device buffer
# initialized, NaN in page padding) and the layer GEMMs' cases (GpuLayerGemm.MatchesCpuLoop: the
# split sums within clusters and through global memory); memcheck also runs the out-of-range contents tests
# (GpuContents.*), the error-buffer, graph, append and thread tests, the 8-bit decode and the
# fused layer's graph. One line per tool, e.g.
# "memcheck: 0 errors (27 tests passed, 0 failed, 1 skipped, 41 s)", and a summary line last.
# Exit 0 only when every tool ran, reported 0 errors, and no test failed.
#
#   usage: bash scripts/sanitize.sh [memcheck] [racecheck] [initcheck] [synccheck]   (default: all)
#   env:   KF_SANITIZE_BUILD (build/gpu)   KF_SANITIZE_TIMEOUT (seconds per tool, 300)
#          KF_SANITIZE_PADDING (memcheck red zone after each allocation, bytes; 1048576; 0 = off)
#          KF_SANITIZE_FILTER_<TOOL> (a gtest filter replacing that tool's subset)
#          COMPUTE_SANITIZER (path of the binary)   OUT (logs, /tmp/kf-out)
# Configures and builds the tests like scripts/gpu_check.sh (incremental when that ran first).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kf-out}
mkdir -p "$OUT"
BUILD=${KF_SANITIZE_BUILD:-build/gpu}
BIN=$BUILD/cpp_tests/kf_cpp_tests
TIMEOUT=${KF_SANITIZE_TIMEOUT:-300}
PADDING=${KF_SANITIZE_PADDING:-1048576}
tools=${*:-memcheck racecheck initcheck synccheck}
t_start=$(date +%s)

# What every tool runs: the sanitizer subset (all small shapes).
SUBSET='*GpuSanitize*:GpuLayerGemm.MatchesCpuLoop'
# memcheck is cheap enough for more: the out-of-range contents, the error buffer, graphs, the
# 16-bit append, host threads on several streams, two of the GpuDecode cases, the 8-bit decode
# (16 to 128 rows, both formats) and the fused layer's graph (replays with bad values written into
# its static buffers between them).
MEMCHECK_EXTRA='GpuContents.*:GpuErrorBuffer.*:GpuCacheAppend.*:GpuDecodeGraph.*:GpuDecodeDeterminism.*:GpuThreads.*:Gpu/GpuDecode.*/Bf16Hq16Sq2Page16:Gpu/GpuDecode.*/Bf16ManyShortRequests:GpuKv8Decode.*:GpuLayerGraph.*'

filter_for() {
  local var="KF_SANITIZE_FILTER_$(echo "$1" | tr a-z A-Z)"
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  if [ "$1" = memcheck ]; then echo "$SUBSET:$MEMCHECK_EXTRA"; else echo "$SUBSET"; fi
}

fail_early() {
  echo "$1"
  echo "FAIL: $2"
  exit 1
}

# ---- the sanitizer binary ----
CS=${COMPUTE_SANITIZER:-}
if [ -z "$CS" ]; then
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then CS=$c; break; fi
  done
fi
[ -n "$CS" ] || fail_early "compute-sanitizer: not found (set COMPUTE_SANITIZER)" "no compute-sanitizer"
echo "## $("$CS" --version 2>/dev/null | grep -i version | head -1) ($CS)"

# ---- the test binary (sm_90 SASS: no JIT under the sanitizer) ----
if [ -d .deps/googletest ]; then export KF_GTEST_SOURCE_DIR=$PWD/.deps/googletest; fi
export KF_CUDA_ARCHS=${KF_CUDA_ARCHS:-90}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKF_BUILD_TESTS=ON \
         >"$OUT/sanitize_build.log" 2>&1 &&
       cmake --build "$BUILD" --target kf_cpp_tests >>"$OUT/sanitize_build.log" 2>&1; }; then
  tail -30 "$OUT/sanitize_build.log"
  fail_early "build: FAILED (see $OUT/sanitize_build.log)" "the tests did not build"
fi
echo "## built $BIN ($(( $(date +%s) - t_start )) s)"

pad_opt=()
if [ "$PADDING" != 0 ] && "$CS" --help 2>&1 | grep -q -- '--padding'; then pad_opt=(--padding "$PADDING"); fi

# ---- one run per tool ----
lines=()
bad=()
total_errors=0
for tool in $tools; do
  case $tool in memcheck|racecheck|initcheck|synccheck) ;; *) fail_early "unknown tool $tool" "usage";; esac
  log=$OUT/sanitize_$tool.log
  opts=(--tool "$tool" --error-exitcode 1 --print-limit 50)
  [ "$tool" = memcheck ] && opts+=("${pad_opt[@]}")
  t0=$(date +%s)
  timeout "$TIMEOUT" "$CS" "${opts[@]}" "$BIN" --gtest_filter="$(filter_for "$tool")" --gtest_color=no \
    >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$log" | tail -1 | grep -oE '[0-9]+')
  # racecheck closes with "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)" instead;
  # its errors count (warnings are benign hazards compute-sanitizer does not call errors).
  if [ -z "$errors" ]; then
    errors=$(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?' "$log" |
             tail -1 | grep -oE '\([0-9]+' | tr -d '(')
  fi
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+')
  failed=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+')
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+')
  ran=$(grep -cE '^\[ RUN      \]' "$log")
  passed=${passed:-0} failed=${failed:-0} skipped=${skipped:-0}
  counts="$passed tests passed, $failed failed, $skipped skipped, $secs s"
  if [ "$rc" = 124 ]; then
    line="$tool: TIMED OUT after ${TIMEOUT} s ($ran tests started; raise KF_SANITIZE_TIMEOUT)"
    bad+=("$tool timed out")
  elif [ -z "$errors" ]; then
    why=$(grep -m1 -iE 'not supported|error:|unrecognized|unknown option|terminated' "$log")
    line="$tool: DID NOT RUN (rc $rc, no error summary${why:+: $why})"
    bad+=("$tool did not run")
  else
    line="$tool: $errors errors ($counts)"
    total_errors=$(( total_errors + errors ))
    [ "$errors" = 0 ] || bad+=("$tool $errors errors")
    [ "$failed" = 0 ] || bad+=("$tool: $failed tests failed")
    if [ "$passed" = 0 ]; then bad+=("$tool: no test ran (all skipped: no GPU?)"); fi
    if [ "$rc" != 0 ] && [ "$errors" = 0 ] && [ "$failed" = 0 ]; then bad+=("$tool exit code $rc"); fi
  fi
  echo "$line"
  lines+=("$line")
  # Show what went wrong right away: the first sanitizer reports and the failed tests.
  if [ "${errors:-1}" != 0 ]; then grep -m12 -E '^========= (Invalid|Race|Uninitialized|Barrier|Error|Program hit)' "$log"; fi
  grep -E '^\[  FAILED  \] [^0-9]' "$log" | grep -vE '\([0-9]+ ms\)$' | sort -u | head -20
  grep -E '^\[  SKIPPED \] [^0-9]' "$log" | grep -vE '\([0-9]+ ms\)$' | sort -u | head -10
done

echo
echo "==== compute-sanitizer ($(( $(date +%s) - t_start )) s, logs in $OUT/sanitize_*.log) ===="
printf '%s\n' "${lines[@]}"
if [ ${#bad[@]} -eq 0 ]; then
  echo "PASS: 0 errors from $(echo $tools | sed 's/ /, /g'); no test failed ($(( $(date +%s) - t_start )) s)"
  exit 0
fi
echo "FAIL: $(printf '%s; ' "${bad[@]}" | sed 's/; $//') ($total_errors sanitizer errors)"
exit 1
