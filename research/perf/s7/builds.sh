#!/usr/bin/env bash
# Seventh session: how each device call's binaries were built here (no GPU) and packed into
# build/carry/cmp.tgz for the device tool's `carry`. One function per call; run from the repo root
# on the commit named (the variants are worktrees or -D switches of that tree).
#   usage: bash research/perf/s7/builds.sh <call number>
set -euo pipefail
cd "$(dirname "$0")/../../.."
H=research/build_harness.sh
pack() { (cd build && tar czf carry/cmp.tgz "$@"); }
wt() {  # wt <dir> <rev>: a detached worktree of <rev> at <dir>
  rm -rf "$1"; git worktree prune; git worktree add -q --detach "$1" "$2"
}
case "${1:-}" in
  1)  # lazy 16-bit max (research/perf/s7/lazy16.patch) vs main, + the 16-bit checks; at c376ee0
      wt .snap/wt-main c376ee0; wt .snap/wt-lazy c376ee0
      git -C .snap/wt-lazy apply -p1 "$PWD/research/perf/s7/lazy16.patch"
      CHECKS16=1 bash research/pack_variants.sh main=.snap/wt-main lazy=.snap/wt-lazy ;;
  2)  # workers (KF_W16/KF_W8 at run time) and the timeline build; at c376ee0 + the harness's KF_W16
      TIMELINE=1 bash research/pack_variants.sh main=. ;;
  3)  # the 8-bit fixed cost: -DKF_FIXED_COST8=N (the override core/scheduler.h had until the
      # eighth session; build from a tree at c376ee0..3ac28d8)
      for f in 5 3 2 1 0; do EXTRA_FLAGS=-DKF_FIXED_COST8=$f bash $H research/kv8_check.cu build/variant-f$f; done
      pack variant-f*/kv8_check ;;
  6)  # the 8-bit q-load reorder (research/perf/s7/qload.patch) at placements K; main = c10e021
      wt .snap/wt-main c10e021; wt .snap/wt-q c10e021
      git -C .snap/wt-q apply -p1 "$PWD/research/perf/s7/qload.patch"
      for v in "main 0 .snap/wt-main" "main 4 .snap/wt-main" "q 0 .snap/wt-q" "q 7 .snap/wt-q" "q 3 .snap/wt-q"; do
        set -- $v
        SRC_ROOT=$3 EXTRA_FLAGS=-DKF_PLACEMENT_PAD=$2 bash $H research/kv8_check.cu build/variant-$1-k$2
      done
      pack variant-*/kv8_check ;;
  7)  # the decode alone: main (d765ac7) with the combine launch removed (timing only)
      wt .snap/wt-nocomb d765ac7
      sed -i 's|  return launch_mla_combine(p, stream);|  return cudaSuccess;  // research: decode alone (no combine), timing only|' \
        .snap/wt-nocomb/src/cuda/decode/mla_decode_launch.cu
      SRC_ROOT=.snap/wt-nocomb bash $H research/kv8_check.cu build/variant-nocomb
      SRC_ROOT=. bash $H research/kv8_check.cu build/variant-main
      pack variant-*/kv8_check ;;
  8)  # rows per combine block (-DKF_COMBINE_ROWS=N on research/perf/s7/combine-rows.patch),
      # main = 34d5eb6, nocomb as in 7
      wt .snap/wt-main 34d5eb6; wt .snap/wt-r 34d5eb6
      git -C .snap/wt-r apply -p1 "$PWD/research/perf/s7/combine-rows.patch"
      SRC_ROOT=.snap/wt-main bash $H research/kv8_check.cu build/variant-main
      for r in 2 4 8; do
        SRC_ROOT=.snap/wt-r EXTRA_FLAGS=-DKF_COMBINE_ROWS=$r bash $H research/kv8_check.cu build/variant-r$r
      done
      pack variant-*/kv8_check ;;
  9)  # 16-bit partials evict-last as measured: 2a4adce with the 8-bit epilogue's stores marked
      # too (research/perf/s7/evl-8bit.patch; that part was dropped), main = 34d5eb6
      wt .snap/wt-main 34d5eb6; wt .snap/wt-evl 2a4adce
      git -C .snap/wt-evl apply -p1 "$PWD/research/perf/s7/evl-8bit.patch"
      SRC_ROOT=.snap/wt-main bash $H research/kv8_check.cu build/variant-main
      SRC_ROOT=.snap/wt-evl bash $H research/kv8_check.cu build/variant-evl
      pack variant-*/kv8_check ;;
  11|12)  # Nsight Compute of the combine at h_q 16 b=128 (KF_PROFILE_B128 in the harness), main = a032160
      bash $H research/kv8_check.cu build/variant-main; pack variant-main/kv8_check ;;
  13) # the warp-per-row combine: main = a032160, rows4 = d1052d9, rows2 = d1052d9 with kRound 2
      wt .snap/wt-main a032160; wt .snap/wt-rows d1052d9
      SRC_ROOT=.snap/wt-main bash $H research/kv8_check.cu build/variant-main
      SRC_ROOT=.snap/wt-rows bash $H research/kv8_check.cu build/variant-rows4
      sed -i 's/^constexpr int kRound = 4; /constexpr int kRound = 2; /' .snap/wt-rows/src/cuda/combine/mla_combine.cu
      SRC_ROOT=.snap/wt-rows bash $H research/kv8_check.cu build/variant-rows2
      pack variant-*/kv8_check ;;
  *)  echo "calls 4, 5, 10 and 14 build the library on the device (scripts/gpu_check.sh) or reuse 2's"
      echo "usage: $0 <call number>"; exit 1 ;;
esac
