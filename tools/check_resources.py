#!/usr/bin/env python3
"""Check the CUDA kernels of the built libkernelflow against sm_86's limits, without a GPU.

Runs `cuobjdump --dump-resource-usage` on the library and, for every kernel compiled for the
chosen architecture (sm_86 by default), requires no stack and no local memory (register spills
show up there) and static shared memory within 101376 bytes, the per-block opt-in limit of sm_86.
Dynamic shared memory of the decode kernel is checked at compile time (static_assert in
src/cuda/decode/sm80/mla_decode_traits.h), so a library that built also fits.

Usage: check_resources.py [LIBRARY] [--arch 86] [--quiet]
LIBRARY defaults to $KF_LIBRARY, then the installed kernelflow package, then build*/ folders.
Exit status: 0 ok, 1 a kernel breaks a limit, 2 library, cuobjdump or sm_XX code not found.
"""
import argparse
import glob
import importlib.util
import os
import re
import sys

SM86_MAX_SMEM_PER_BLOCK = 101376
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_library():
    env = os.environ.get("KF_LIBRARY")
    if env:
        return env if os.path.isfile(env) else None
    spec = importlib.util.find_spec("kernelflow")
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            candidates += glob.glob(os.path.join(d, "**", "libkernelflow*.so*"), recursive=True)
    for pattern in ("build*/libkernelflow.so*", "build*/**/libkernelflow.so*", "/tmp/build*/libkernelflow.so*"):
        root = "" if pattern.startswith("/") else REPO
        candidates += glob.glob(os.path.join(root, pattern), recursive=True)
    candidates = [c for c in candidates if os.path.isfile(c) and not os.path.islink(c)]
    return max(candidates, key=os.path.getmtime) if candidates else None


def _load_sass_reader():
    """python/kernelflow/estimate_sass.py (cuobjdump's finder and readers), loaded by path: it
    needs neither the built package nor an installed one."""
    path = os.path.join(REPO, "python", "kernelflow", "estimate_sass.py")
    spec = importlib.util.spec_from_file_location("kf_estimate_sass", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_sass = _load_sass_reader()
find_cuobjdump = _sass.find_cuobjdump
demangle = _sass.demangle
resource_usage = _sass.resource_usage


def check(library, cuobjdump, arch="86"):
    """(violations, rows of the arch); raises FileNotFoundError if nothing was built for it."""
    rows = [r for r in resource_usage(cuobjdump, library) if r[0] == "sm_" + arch]
    if not rows:
        raise FileNotFoundError(f"no sm_{arch} kernels in {library}")
    violations = []
    for _, func, f in rows:
        if f.get("STACK", 0) or f.get("LOCAL", 0):
            violations.append(f"{func}: stack {f.get('STACK', 0)} B, local {f.get('LOCAL', 0)} B (spills)")
        if f.get("SHARED", 0) > SM86_MAX_SMEM_PER_BLOCK:
            violations.append(f"{func}: static shared memory {f['SHARED']} B > {SM86_MAX_SMEM_PER_BLOCK}")
    return violations, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("library", nargs="?")
    ap.add_argument("--arch", default="86")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    library = args.library or find_library()
    cuobjdump = find_cuobjdump()
    if not library or not os.path.isfile(library):
        print("libkernelflow not found (pass it, or set KF_LIBRARY)", file=sys.stderr)
        return 2
    if not cuobjdump:
        print("cuobjdump not found (CUDA toolkit, or pip install nvidia-cuda-cuobjdump)", file=sys.stderr)
        return 2
    try:
        violations, rows = check(library, cuobjdump, args.arch)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    if not args.quiet:
        names = demangle([r[1] for r in rows])
        print(f"{library} (sm_{args.arch}):")
        print(f"{'REG':>4} {'STACK':>5} {'LOCAL':>5} {'SHARED':>6}  kernel")
        for _, func, f in rows:
            print(f"{f.get('REG', 0):>4} {f.get('STACK', 0):>5} {f.get('LOCAL', 0):>5} "
                  f"{f.get('SHARED', 0):>6}  {names[func][:140]}")
    for v in violations:
        print("VIOLATION:", v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
