#!/usr/bin/env bash
# Seventh session, device call 13: the combine's many-requests path as a warp per row (4 rows
# per block, pieces in rounds of 4 (rows4) or 2 (rows2) loads in flight) against main's block
# per row (ncu in situ: 6.2 us at h_q 16 b=128, 64 registers, two waves). Correctness: the
# harness's checks (they compare decode + combine with the CPU backend).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  echo "== checks rows4: $(timeout 120 build/variant-rows4/kv8_check --no-time 2>&1 | grep -E '^CHECKS')"
  bash research/perf/time_variants.sh main rows4 rows2 main rows4 rows2
} 2>&1 | tee "$OUT/combine_warp_rows.txt"
