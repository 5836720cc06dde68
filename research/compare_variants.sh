#!/usr/bin/env bash
# Build the research harnesses (research/kv8_check.cu: 8-bit checks and bf16/fp8/int8 timings;
# research/mla_decode_check.cu: 16-bit checks, with CHECKS16=1) against several source trees in
# parallel and run each one's checks and timings, for comparing variants in one device call.
#   usage: bash research/compare_variants.sh main=. defer=.snap/wt-defer ...
# Each tree needs src/ and include/ (a git worktree of a branch, e.g. `git worktree add
# .snap/wt-defer next/kv8-defer-pv`; .snap/ is git-ignored here, so name it in the device tool's
# carry list). ARGS (default: none) go to every timing run, e.g. ARGS=--timeline with
# EXTRA_FLAGS=-DKF_TIMELINE. PREBUILT=1 skips the builds and runs the binaries already in
# build/variant-<name>/ and build/variant16-<name>/ (e.g. built on a machine without a GPU and
# carried to the device, which saves its time).
set -uo pipefail
cd "$(dirname "$0")/.."
pids=()
skip_build=${PREBUILT:-0}
for v in "$@"; do
  [ $skip_build = 1 ] && continue
  name=${v%%=*} root=${v#*=}
  (SRC_ROOT=$root timeout 300 bash research/build_harness.sh research/kv8_check.cu \
     "build/variant-$name" > "/tmp/variant-$name.build.log" 2>&1 || echo "$name: build FAILED") &
  pids+=($!)
  if [ "${CHECKS16:-0}" = 1 ]; then
    (SRC_ROOT=$root EXTRA_FLAGS="${EXTRA_FLAGS:-} -Xcompiler -fopenmp" timeout 300 \
       bash research/build_harness.sh research/mla_decode_check.cu "build/variant16-$name" -lgomp \
       > "/tmp/variant16-$name.build.log" 2>&1 || echo "$name: 16-bit build FAILED") &
    pids+=($!)
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
for v in "$@"; do
  name=${v%%=*}
  bin=build/variant-$name/kv8_check
  [ -x "$bin" ] || { tail -20 "/tmp/variant-$name.build.log"; continue; }
  echo "==== $name: $(timeout 120 "$bin" --no-time 2>&1 | grep -E '^CHECKS')"
  if [ -x "build/variant16-$name/mla_decode_check" ]; then
    echo "     16-bit: $(timeout 180 "build/variant16-$name/mla_decode_check" --no-time 2>&1 |
      grep -E '^CHECKS|checks' | tail -1)"
  fi
  timeout 240 "$bin" ${ARGS:-} 2>&1 | sed -n '/^Timings/,$p'
done
