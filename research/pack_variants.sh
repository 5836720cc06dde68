#!/usr/bin/env bash
# Build the research harnesses for several source trees here (no GPU needed) and pack the
# binaries into build/carry/cmp.tgz for the device tool's `carry`, so the device call only runs
# them (a variant then costs ~30 s of device time instead of ~90 with the builds).
#   usage: bash research/pack_variants.sh main=. cand=/path/to/tree ...
# CHECKS16=1 also builds research/mla_decode_check.cu (16-bit checks); TIMELINE=1 also builds a
# KF_TIMELINE kv8_check per tree. Then, on the device (carry build/carry):
#   tar xzf build/carry/cmp.tgz -C build && PREBUILT=1 CHECKS16=1 \
#     bash research/compare_variants.sh main=x cand=x     (tree paths are not used with PREBUILT)
# and, with TIMELINE=1: build/tl-<name>/kv8_check --timeline.
set -uo pipefail
cd "$(dirname "$0")/.."
files=()
for v in "$@"; do
  name=${v%%=*} root=${v#*=}
  SRC_ROOT=$root bash research/build_harness.sh research/kv8_check.cu "build/variant-$name" \
    > "/tmp/variant-$name.build.log" 2>&1 || { echo "$name: build FAILED"; tail -20 "/tmp/variant-$name.build.log"; exit 1; }
  files+=("variant-$name/kv8_check")
  if [ "${CHECKS16:-0}" = 1 ]; then
    SRC_ROOT=$root EXTRA_FLAGS="-Xcompiler -fopenmp" bash research/build_harness.sh \
      research/mla_decode_check.cu "build/variant16-$name" -lgomp > "/tmp/variant16-$name.build.log" 2>&1 ||
      { echo "$name: 16-bit build FAILED"; exit 1; }
    files+=("variant16-$name/mla_decode_check")
  fi
  if [ "${TIMELINE:-0}" = 1 ]; then
    SRC_ROOT=$root EXTRA_FLAGS=-DKF_TIMELINE bash research/build_harness.sh research/kv8_check.cu \
      "build/tl-$name" > "/tmp/tl-$name.build.log" 2>&1 || { echo "$name: timeline build FAILED"; exit 1; }
    files+=("tl-$name/kv8_check")
  fi
  # Spills in any decode instantiation are worth knowing before the device call.
  grep -h "spill stores" "build/variant-$name/ptxas.txt" | grep -v " 0 bytes spill stores" |
    sed "s/^/$name: /" | sort -u
done
mkdir -p build/carry
(cd build && tar czf carry/cmp.tgz "${files[@]}")
ls -la build/carry/cmp.tgz
