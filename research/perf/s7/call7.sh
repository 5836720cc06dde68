#!/usr/bin/env bash
# Seventh session, device call 7: (1) the decode alone, without its combine (research build,
# outputs wrong, timing only): the most a combine folded into the decode could save; (2) the
# final code's benchmark grid and compute-sanitizer.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  MODES="KF_ONLY_B1 KF_ONLY_H16 KF_ONLY_H128" bash research/perf/time_variants.sh main nocomb main nocomb
} 2>&1 | tee "$OUT/nocombine.txt"
BENCH_ARGS="--tune quick" bash scripts/gpu_check.sh bench sanitize 2>&1 | tail -45
