"""Print a folder holding dlpack/dlpack.h shipped by an installed Python package, if any."""
import importlib.util
import os

CANDIDATES = {
    "torch": ["include"],
    "cupy": ["_core/include/cupy", "_core/include"],
}
for pkg, subdirs in CANDIDATES.items():
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        continue
    root = list(spec.submodule_search_locations)[0]
    for sub in subdirs:
        d = os.path.join(root, sub)
        if os.path.isfile(os.path.join(d, "dlpack", "dlpack.h")):
            print(d)
            raise SystemExit(0)
