#!/usr/bin/env bash
# Time research-harness variants in turn, in one device call: for each variant name v (repeat a
# name to rerun it), build/variant-v/kv8_check --time-only once per row set in MODES (default:
# KF_ONLY_H16 KF_ONLY_H32 KF_ONLY_H128), printing "== v" and the timing rows. Compare the
# output's rows side by side with research/perf/tools/variant_table.py.
#   usage: MODES="KF_ONLY_B1 KF_ONLY_H16" bash research/perf/time_variants.sh main cand main cand
set -uo pipefail
cd "$(dirname "$0")/../.."
for v in "$@"; do
  echo "== $v"
  for m in ${MODES:-KF_ONLY_H16 KF_ONLY_H32 KF_ONLY_H128}; do
    env "$m=1" "build/variant-$v/kv8_check" --time-only 2>&1 | sed -n '/^h_q/,$p' | grep -v '^h_q'
  done
done
