#!/usr/bin/env bash
# Seventh session, device call 10: the final code (16-bit split partials stored evict-last, the
# 8-bit fixed cost 1): GPU tests, benchmark grid, compute-sanitizer, format tables, soaks.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
X=$OUT/x; mkdir -p "$X"
BENCH_ARGS="--tune quick" bash scripts/gpu_check.sh tests bench sanitize 2>&1 | tail -14
python3 bench/bench_decode.py --formats bf16 fp8_e4m3 int8 --h-q 16 128 --batch 1 8 64 128 \
  --s-k 4096 16384 --json "$X/formats.json" > "$X/bench_formats.txt" 2>&1
python3 bench/bench_decode.py --sk-sweep --json "$X/sweep.json" > "$X/bench_sweep.txt" 2>&1
{
  python3 scripts/soak.py --iters 10000 --batch 4
  python3 scripts/soak.py --iters 10000 --h-q 128 --s-q 2
  python3 scripts/soak.py --iters 10000 --batch 64 --max-pages 64 --check-every 1000
} > "$X/soak.txt" 2>&1
cat "$X/soak.txt"
sed -n '/^| h_q/,/^(speedup/p' "$X/bench_formats.txt" | head -20
sed -n '/^| /,$p' "$X/bench_sweep.txt" | head -10
(cd "$X" && tar czf "$OUT/extras.tgz" . ) && rm -rf "$X"
