#!/usr/bin/env bash
# sass_compare.sh TREE_A TREE_B [ARCH...]: is a change host-only? Compiles every CUDA file of
# src/cuda in both trees to a cubin per architecture (default 90 86, the library's flags without
# -lineinfo), disassembles it and compares the SASS with addresses and the hash in anonymous
# namespaces' names removed. Prints one line per file that differs; exit 1 if any does. The FP8
# loop's speed depends on its code placement, so "identical" here is the test for landing a
# change that has not run on a GPU.
set -euo pipefail
a=$(cd "$1" && pwd); b=$(cd "$2" && pwd); shift 2
archs=("$@"); [ ${#archs[@]} -gt 0 ] || archs=(90 86)
cuobjdump=$(command -v cuobjdump || python3 -c "import glob,site,sys
hits=[h for d in site.getsitepackages() for h in glob.glob(d+'/nvidia/cu*/bin/cuobjdump')]
print(hits[0] if hits else '')")
[ -n "$cuobjdump" ] || { echo "cuobjdump not found (pip install nvidia-cuda-cuobjdump)"; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

sass() {  # sass TREE FILE ARCH -> normalized SASS on stdout
  (cd "$1" && nvcc -DKF_BUILDING_LIBRARY=1 -DKF_WITH_CUDA=1 -Iinclude -Isrc -O3 -DNDEBUG \
     --expt-relaxed-constexpr -std=c++17 -gencode "arch=compute_$3,code=sm_$3" -cubin \
     -o "$work/x.cubin" "$2")
  "$cuobjdump" -sass "$work/x.cubin" | grep -v '^\s*//' | sed -E 's@/\*[0-9a-f]*\*/@@g;
    s/_GLOBAL__N__[0-9a-f]+_/_GLOBAL__N__/g'
}

status=0; n=0
files=$(cd "$a" && find src/cuda -name '*.cu' | sort; cd "$b" && find src/cuda -name '*.cu' | sort)
for f in $(echo "$files" | sort -u); do
  for arch in "${archs[@]}"; do
    n=$((n + 1))
    if [ ! -f "$a/$f" ] || [ ! -f "$b/$f" ]; then echo "only in one tree: $f"; status=1; continue; fi
    sass "$a" "$f" "$arch" > "$work/a.sass"; sass "$b" "$f" "$arch" > "$work/b.sass"
    cmp -s "$work/a.sass" "$work/b.sass" || { echo "differs: $f sm_$arch"; status=1; }
  done
done
[ $status = 0 ] && echo "identical SASS: $n (file, arch) pairs"
exit $status
