#!/usr/bin/env bash
# Seventh session, device call 3: the 8-bit scheduler's fixed cost per piece (F8, 5 on main)
# at 5/3/2/1/0, research harness builds with -DKF_FIXED_COST8=N (bf16 rows: unchanged code,
# the run's noise control). The timeline of call 2 had FP8 blocks with two pieces (~830 tokens)
# exiting 8 us before blocks with one (1088 tokens) at b=64, s_k 4096: F8 = 5 overcharges.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  for f in 5 3 2 1 0 5 2 1; do
    B=build/variant-f$f/kv8_check
    echo "== F8=$f h16"; KF_ONLY_H16=1 $B --time-only 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
    echo "== F8=$f b1/b8"; KF_ONLY_B1=1 $B --time-only 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
    echo "== F8=$f h128"; KF_ONLY_H128=1 $B --time-only 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
  done
  echo "== F8=1 sweep (s_k 1K..64K, b=64)"
  build/variant-f1/kv8_check --time-only 2>&1 | sed -n '/^s_k sweep/,$p'
  echo "== F8=5 sweep"
  build/variant-f5/kv8_check --time-only 2>&1 | sed -n '/^s_k sweep/,$p'
} 2>&1 | tee "$OUT/fixed_cost8.txt"
