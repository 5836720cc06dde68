#!/usr/bin/env bash
# Seventh session, device call 2: more workers than resident blocks (the hardware block scheduler
# then balances the tail: a worker's second-wave block starts on whichever SM frees first), and
# fewer workers at b = 1 (fewer, longer pieces: less to combine). Research harness, main's code.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/kf-out}; mkdir -p "$OUT"
tar xzf build/carry/cmp.tgz -C build
B=build/variant-main/kv8_check
run() {  # run <workers or ""> <env> <args...>
  local w=$1; shift
  if [ -n "$w" ]; then export KF_W16=$w KF_W8=$w; else unset KF_W16 KF_W8; fi
  echo "== workers ${w:-default}: $*"
  env "$@" 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
}
{
  for w in "" 396 528 "" 396 528; do run "$w" KF_ONLY_H16=1 $B --time-only; done
  for w in "" 32 16; do run "$w" KF_ONLY_B1=1 $B --time-only; done
  for w in "" 528; do
    if [ -n "$w" ]; then export KF_W16=$w KF_W8=$w; else unset KF_W16 KF_W8; fi
    echo "== timeline, workers ${w:-default}"; build/tl-main/kv8_check --timeline 2>&1 | grep -E "^\[timeline|exit|first|pieces|combine" | head -60
  done
} 2>&1 | tee "$OUT/workers.txt"
