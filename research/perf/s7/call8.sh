#!/usr/bin/env bash
# Seventh session, device call 8: the combine's many-requests path with kRows rows per block
# (-DKF_COMBINE_ROWS=2/4/8: fewer, larger blocks; each row still one thread per float4) against
# main, and the decode alone (nocomb, timing only) as the floor.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  for v in main r2 r4 r8 nocomb main r4 r8; do
    echo "== $v"
    for m in KF_ONLY_H16 KF_ONLY_H32 KF_ONLY_H128; do
      env $m=1 build/variant-$v/kv8_check --time-only 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
    done
  done
} 2>&1 | tee "$OUT/combine_rows.txt"
