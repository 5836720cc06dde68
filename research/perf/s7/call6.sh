#!/usr/bin/env bash
# Seventh session, device call 6: the 8-bit piece start with every q load in flight first
# (variant q) against main, each at code placements K (-DKF_PLACEMENT_PAD=K; the FP8 loop's
# speed depends on where it lands: main K=0 -> loop head mod 8 = 2, q K=0 -> 3, K=7 -> 2,
# K=3 -> 6, main K=4 -> 6).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  echo "== checks q-k0: $(timeout 120 build/variant-q-k0/kv8_check --no-time 2>&1 | grep -E '^CHECKS')"
  for v in main-k0 q-k0 q-k7 main-k4 q-k3 main-k0 q-k7 q-k0; do
    B=build/variant-$v/kv8_check
    echo "== $v"
    for m in KF_ONLY_B1 KF_ONLY_H16 KF_ONLY_H128; do
      env $m=1 $B --time-only 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
    done
  done
} 2>&1 | tee "$OUT/qload.txt"
