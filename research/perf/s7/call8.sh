#!/usr/bin/env bash
# Seventh session, device call 8: the combine's many-requests path with kRows rows per block
# (-DKF_COMBINE_ROWS=2/4/8: fewer, larger blocks; each row still one thread per float4) against
# main, and the decode alone (nocomb, timing only) as the floor.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  bash research/perf/time_variants.sh main r2 r4 r8 nocomb main r4 r8
} 2>&1 | tee "$OUT/combine_rows.txt"
