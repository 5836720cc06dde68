#!/usr/bin/env bash
# Seventh session, device call 1: lazy running max for the 16-bit path (variant "lazy") against
# main, in the research harness, then the library's GPU tests and soaks on the lazy tree.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
{
  echo "== 16-bit checks (lazy)"; timeout 150 build/variant16-lazy/mla_decode_check --no-time 2>&1 | tail -4
  echo "== 8-bit checks (lazy)"; timeout 120 build/variant-lazy/kv8_check --no-time 2>&1 | grep -E "^CHECKS|FAIL" | tail -4
  for v in main lazy main lazy; do
    echo "== $v h128"; KF_ONLY_H128=1 build/variant-$v/kv8_check --time-only 2>&1 | tail -2
  done
  for v in main lazy; do
    echo "== $v h32"; KF_ONLY_H32=1 build/variant-$v/kv8_check --time-only 2>&1 | tail -3
    echo "== $v h16"; KF_ONLY_H16=1 build/variant-$v/kv8_check --time-only 2>&1 | tail -4
  done
} 2>&1 | tee "$OUT/variants.txt"
bash scripts/gpu_check.sh tests 2>&1 | tail -30
{
  python3 scripts/soak.py --iters 10000 --batch 4
  python3 scripts/soak.py --iters 10000 --h-q 128 --s-q 2
  python3 scripts/soak.py --iters 10000 --h-q 32 --max-pages 256 --check-every 1000
  KF_DECODE_64_ROW_TILES=1 python3 scripts/soak.py --iters 10000 --h-q 64 --s-q 2 --format fp16
} 2>&1 | tee "$OUT/soak.txt"
