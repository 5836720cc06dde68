"""Print where an installed Python package ships the DLPack header, if any: a folder holding
dlpack/dlpack.h, or else the path of the header itself (torch ships include/ATen/dlpack.h,
recent CuPy cupy/_core/include/cupy/_dlpack/dlpack.h), which dlpack.cmake copies into a
dlpack/ folder of the build tree."""
import importlib.util
import os

CANDIDATES = {
    "torch": ["include/dlpack/dlpack.h", "include/ATen/dlpack.h"],
    "cupy": ["_core/include/cupy/dlpack/dlpack.h", "_core/include/dlpack/dlpack.h",
             "_core/include/cupy/_dlpack/dlpack.h"],
}
for pkg, files in CANDIDATES.items():
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        continue
    root = list(spec.submodule_search_locations)[0]
    for rel in files:
        path = os.path.join(root, rel)
        if os.path.isfile(path):
            folder = os.path.dirname(os.path.dirname(path))
            print(folder if rel.endswith("dlpack/dlpack.h") else path)
            raise SystemExit(0)
