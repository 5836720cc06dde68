#!/usr/bin/env bash
# Seventh session, device call 14: the final code (the warp-per-row combine): GPU tests,
# compute-sanitizer, the benchmark at s_k 4096, a soak. Each step has a
# time limit (the session's device time is nearly spent): what finished comes back.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
X=$OUT/x; mkdir -p "$X"
timeout 170 bash scripts/gpu_check.sh tests sanitize 2>&1 | tail -12
timeout 50 python3 bench/bench_decode.py --h-q 16 128 --batch 1 64 128 --s-k 4096 --tune quick \
  --json "$X/bench.json" > "$X/bench.txt" 2>&1
sed -n '/^| h_q/,/^(speedups/p' "$X/bench.txt"; grep -E "checks:" "$X/bench.txt"
timeout 25 python3 scripts/soak.py --iters 3000 --batch 64 --max-pages 64 --check-every 500 2>&1 | tee "$X/soak.txt"
(cd "$X" && tar czf "$OUT/extras.tgz" . ) && rm -rf "$X"
