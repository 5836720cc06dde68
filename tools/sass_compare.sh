#!/usr/bin/env bash
# tools/sass_compare.sh TREE_A TREE_B [ARCH...]
#
# Answers: does a change leave the GPU code exactly as it was? Use it before landing a change
# that is meant not to touch the kernels (host code, comments, a refactor into device functions
# that should inline to the same code) when no GPU is at hand, or to show that a refactor costs
# nothing. TREE_A and TREE_B are two checkouts of this repository (e.g. `git worktree add
# /tmp/base HEAD~1`). Every .cu file under src/cuda is compiled in both trees to a cubin per
# architecture (default: 90 86; the sm90a family's sources for sm_90a only, when 90 is asked
# for) with the library's compile flags (no -lineinfo), disassembled
# with cuobjdump, and compared with the addresses and the hash in anonymous namespaces' names
# removed. Prints one line per (file, arch) that differs or exists in one tree only, or
# "identical SASS: N (file, arch) pairs"; exit status 1 if anything differs, 2 if cuobjdump or
# nvdisasm (which cuobjdump runs) is missing. The bar is identical, not similar: the FP8 decode
# loop's speed depends on where its code sits (docs/optimization/decode.md), so a change that moves any
# instruction needs a timed A/B on a GPU instead.
# Needs nvcc on PATH, and cuobjdump and nvdisasm: from the CUDA toolkit, or pip install
# nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm into the python3 that runs here.
set -euo pipefail
a=$(cd "$1" && pwd); b=$(cd "$2" && pwd); shift 2
archs=("$@"); [ ${#archs[@]} -gt 0 ] || archs=(90 86)
find_tool() {  # find_tool NAME: on PATH, else from a pip-installed nvidia-cuda-NAME wheel
  command -v "$1" || python3 -c "import glob,site,sys
hits=[h for d in site.getsitepackages() for h in glob.glob(d+'/nvidia/cu*/bin/$1')]
print(hits[0] if hits else '')"
}
cuobjdump=$(find_tool cuobjdump); nvdisasm=$(find_tool nvdisasm)
[ -n "$cuobjdump" ] || { echo "cuobjdump not found (pip install nvidia-cuda-cuobjdump)"; exit 2; }
[ -n "$nvdisasm" ] || { echo "nvdisasm not found (pip install nvidia-cuda-nvdisasm)"; exit 2; }
export NVDISASM_PATH=${NVDISASM_PATH:-$(dirname "$nvdisasm")}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

sass() {  # sass TREE FILE ARCH -> normalized SASS on stdout (ARCH 90a: the sm90a family's flags)
  local family=()
  [ "$3" = 90a ] && family=(-DKF_SM90A_FAMILY=1)
  (cd "$1" && nvcc -DKF_BUILDING_LIBRARY=1 -DKF_WITH_CUDA=1 "-DKF_CUDA_ARCHS_STRING=\"$3\"" \
     "${family[@]}" -Iinclude -Isrc -O3 \
     -DNDEBUG --expt-relaxed-constexpr -std=c++17 -gencode "arch=compute_$3,code=sm_$3" -cubin \
     -o "$work/x.cubin" "$2")
  "$cuobjdump" -sass "$work/x.cubin" | grep -v '^\s*//' | sed -E 's@/\*[0-9a-f]*\*/@@g;
    s/_GLOBAL__N__[0-9a-f]+_/_GLOBAL__N__/g'
}

status=0; n=0
files=$(cd "$a" && find src/cuda -name '*.cu' | sort; cd "$b" && find src/cuda -name '*.cu' | sort)
for f in $(echo "$files" | sort -u); do
  # The sm90a family's sources build for sm_90a only: compared there when 90 is asked for.
  file_archs=("${archs[@]}")
  if [[ $f == src/cuda/decode/sm90a/* ]]; then
    file_archs=()
    for arch in "${archs[@]}"; do [ "$arch" = 90 ] && file_archs=(90a); done
  fi
  for arch in "${file_archs[@]}"; do
    n=$((n + 1))
    if [ ! -f "$a/$f" ] || [ ! -f "$b/$f" ]; then echo "only in one tree: $f"; status=1; continue; fi
    sass "$a" "$f" "$arch" > "$work/a.sass"; sass "$b" "$f" "$arch" > "$work/b.sass"
    cmp -s "$work/a.sass" "$work/b.sass" || { echo "differs: $f sm_$arch"; status=1; }
  done
done
[ $status = 0 ] && echo "identical SASS: $n (file, arch) pairs"
exit $status
