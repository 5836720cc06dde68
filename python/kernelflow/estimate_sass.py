"""Read the GPU code of a built CUDA binary: find cuobjdump, list its kernels with their resource
usage, and parse the SASS of chosen kernels into instructions.

Standard library only and no import of the package, so tools/check_resources.py loads this file
by path in a checkout where the package is not built.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass


def find_cuda_tool(name):
    """Path of a CUDA binary tool (cuobjdump, nvdisasm): PATH, then $CUDA_HOME / $CUDA_PATH /
    /usr/local/cuda, then the pip wheel nvidia-cuda-<name> (nvidia/cu*/bin); None when none is
    found."""
    found = shutil.which(name)
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "bin", name)):
            return os.path.join(root, "bin", name)
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            hits = sorted(glob.glob(os.path.join(d, "cu*", "bin", name)))
            if hits:
                return hits[-1]
    return None


def find_cuobjdump():
    """Path of cuobjdump (find_cuda_tool), or None."""
    return find_cuda_tool("cuobjdump")


def find_nvdisasm():
    """Path of nvdisasm, which `cuobjdump -sass` runs (find_cuda_tool), or None."""
    return find_cuda_tool("nvdisasm")


def demangle(names):
    """{mangled: readable} through c++filt when it is installed, else the names unchanged."""
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def resource_usage(cuobjdump, binary):
    """[(arch, mangled name, {REG, STACK, SHARED, LOCAL, ...})] for every kernel in the binary."""
    run = subprocess.run([cuobjdump, "--dump-resource-usage", binary], capture_output=True,
                         text=True)
    if run.returncode != 0:  # a CPU-only build holds no device code at all
        raise FileNotFoundError(f"no device code in {binary}: {run.stderr.strip()}")
    rows, arch, func = [], None, None
    for line in run.stdout.splitlines():
        m = re.match(r"\s*arch = (sm_\d+\w*)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            func = m.group(1)
            continue
        if func and "REG:" in line:
            fields = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line)}
            rows.append((arch, func, fields))
            func = None
    return rows


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: byte address, guard predicate ('' when none, '@P0', '@!P1', ...),
    opcode with its modifiers ('HMMA.16816.F32.BF16') and operand text."""

    addr: int
    guard: str
    opcode: str
    operands: str

    @property
    def op(self):
        """The opcode without modifiers: 'HMMA'."""
        return self.opcode.split(".", 1)[0]


_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_ARCH = re.compile(r"^\s*code for (sm_\d+\w*)")


def parse_sass(text):
    """{(arch, mangled name): [Instr, ...]} from `cuobjdump -sass` output."""
    kernels, arch, current = {}, None, None
    for line in text.splitlines():
        m = _ARCH.match(line)
        if m:
            arch, current = m.group(1), None
            continue
        m = _FUNCTION.match(line)
        if m:
            current = kernels.setdefault((arch, m.group(1)), [])
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            current.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3),
                                 m.group(4)))
    return kernels


def dump_sass(cuobjdump, binary, arch, names):
    """The SASS of the named kernels (mangled) for one architecture ('sm_86'), parsed. cuobjdump
    disassembles with nvdisasm, which it looks for on PATH or in NVDISASM_PATH: the folder of
    find_nvdisasm's answer is passed as NVDISASM_PATH (a pip wheel's bin folder is not on PATH)."""
    env = dict(os.environ)
    nvdisasm = find_nvdisasm()
    if nvdisasm and "NVDISASM_PATH" not in env:
        env["NVDISASM_PATH"] = os.path.dirname(nvdisasm)
    run = subprocess.run([cuobjdump, "-sass", "-arch", arch, "-fun", ",".join(names), binary],
                         capture_output=True, text=True, env=env)
    # cuobjdump warns for each cubin that lacks a listed kernel; only a failure matters.
    if run.returncode != 0:
        raise FileNotFoundError(f"cuobjdump -sass failed on {binary}: {run.stderr.strip()[:300]}")
    return parse_sass(run.stdout)
