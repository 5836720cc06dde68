#!/usr/bin/env bash
# Seventh session, device call 9: the decode's split partials stored with an L2 evict-last
# policy (variant evl, so the KV stream does not push them out before the combine reads them)
# against main, and the decode alone (nocomb, timing only) as the floor.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  bash research/perf/time_variants.sh main evl nocomb main evl
} 2>&1 | tee "$OUT/evict_last.txt"
