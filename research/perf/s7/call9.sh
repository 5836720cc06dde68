#!/usr/bin/env bash
# Seventh session, device call 9: the decode's split partials stored with an L2 evict-last
# policy (variant evl, so the KV stream does not push them out before the combine reads them)
# against main, and the decode alone (nocomb, timing only) as the floor.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  for v in main evl nocomb main evl; do
    echo "== $v"
    for m in KF_ONLY_H16 KF_ONLY_H32 KF_ONLY_H128; do
      env $m=1 build/variant-$v/kv8_check --time-only 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
    done
  done
} 2>&1 | tee "$OUT/evict_last.txt"
