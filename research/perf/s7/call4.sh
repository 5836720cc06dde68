#!/usr/bin/env bash
# Seventh session, device call 4: the 8-bit fixed cost 1 (was 5) in the library: GPU tests, the
# format tables of the benchmark (s_q 1 and 2, the s_k sweep), soaks, and the per-block timeline.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
X=$OUT/x; mkdir -p "$X"
tar xzf build/carry/cmp.tgz -C build
bash scripts/gpu_check.sh tests 2>&1 | tail -12
python3 bench/bench_decode.py --formats bf16 fp8_e4m3 int8 --h-q 16 128 --batch 1 8 64 128 \
  --s-k 4096 16384 --json "$X/formats.json" > "$X/bench_formats.txt" 2>&1
python3 bench/bench_decode.py --sk-sweep --json "$X/sweep.json" > "$X/bench_sweep.txt" 2>&1
python3 bench/bench_decode.py --formats bf16 fp8_e4m3 int8 --h-q 16 --s-q 2 --batch 1 64 128 \
  --s-k 4096 16384 --json "$X/sq2.json" > "$X/sq2.txt" 2>&1
{
  python3 scripts/soak.py --iters 10000 --format fp8_e4m3 --s-q 2
  python3 scripts/soak.py --iters 10000 --format int8 --h-q 128 --s-q 2
  python3 scripts/soak.py --iters 10000 --format fp8_e4m3 --batch 64 --max-pages 64 --check-every 1000
} > "$X/soak.txt" 2>&1
build/tl-main/kv8_check --timeline > "$X/timeline.txt" 2>&1
cat "$X/soak.txt"
sed -n '/^| h_q/,/^(speedup/p' "$X/bench_formats.txt" | head -30
sed -n '/^| /,$p' "$X/bench_sweep.txt" | head -24
(cd "$X" && tar czf "$OUT/extras.tgz" . ) && rm -rf "$X"
