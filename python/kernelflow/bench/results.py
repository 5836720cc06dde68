"""The run record of `python -m kernelflow bench`: the GPU and the clocks seen, the versions and
the command, and the compact JSON writer (one row per line) that docs/results/ uses too
(tools/compact_results.py imports dumps from here)."""
from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time

SCHEMA = "kernelflow-bench/1"


def plain(x):
    """A value json cannot write: a NumPy or torch scalar as a Python number, an array or tensor
    as a list, anything else as its text."""
    for name in ("item", "tolist"):
        convert = getattr(x, name, None)
        if callable(convert):
            try:
                return convert()
            except (ValueError, RuntimeError, TypeError):  # item() of a multi-element array
                continue
    return str(x)


def _inline(x):
    return json.dumps(x, ensure_ascii=False, default=plain)


def _flat(x):
    """A dict or list of scalars (or of short flat values): written on one line."""
    if isinstance(x, dict):
        return all(not isinstance(v, (dict, list)) or (_flat(v) and len(_inline(v)) <= 160)
                   for v in x.values())
    if isinstance(x, list):
        return all(not isinstance(v, (dict, list)) for v in x)
    return True


def dumps(x, indent=0):
    """JSON with one row (a flat dict) per line: short enough to read, diffable by line."""
    pad, inner = " " * indent, " " * (indent + 1)
    if not isinstance(x, (dict, list)) or (_flat(x) and len(_inline(x)) <= 120):
        return _inline(x)
    if isinstance(x, list):
        items = [_inline(v) if _flat(v) and len(_inline(v)) <= 260 else dumps(v, indent + 1)
                 for v in x]
        return "[\n" + ",\n".join(inner + s for s in items) + "\n" + pad + "]"
    lines, line = [], ""
    for k, v in x.items():
        item = f"{_inline(k)}: {dumps(v, indent + 1)}"
        short = not isinstance(v, (dict, list)) and len(item) <= 60
        if short and line and len(line) + len(item) + 2 <= 100:
            line += ", " + item  # short scalars share a line
            continue
        if line:
            lines.append(line)
        line = item
    lines.append(line)
    return "{\n" + ",\n".join(inner + s for s in lines) + "\n" + pad + "}"


def module_version(name: str) -> str | None:
    """`name.__version__` when the module imports, else None (a missing optional baseline)."""
    try:
        return str(getattr(importlib.import_module(name), "__version__", "unknown"))
    except Exception:  # noqa: BLE001  (a broken install counts as missing)
        return None


def versions() -> dict:
    """Python, torch (and its CUDA), triton, cupy, kernelflow and its build, the baselines'."""
    out = {"python": platform.python_version()}
    for name in ("torch", "triton", "cupy", "flash_mla", "flashinfer", "matplotlib"):
        out[name] = module_version(name)
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda
    except ImportError:
        pass
    try:
        import kernelflow as kf

        out["kernelflow"] = kf.__version__
        out["kernelflow_build"] = kf.build_info()
    except Exception as e:  # noqa: BLE001
        out["kernelflow"] = f"not importable: {e}"
    return out


NVML_CLOCKS = (("sm_MHz", "NVML_CLOCK_SM"), ("mem_MHz", "NVML_CLOCK_MEM"))


def clocks_nvml(index: int) -> dict:
    """Current and maximum SM and memory clocks, driver, power limit through nvidia-ml-py."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out = {"source": "NVML (nvidia-ml-py)"}
        for key, clock in NVML_CLOCKS:
            kind = getattr(pynvml, clock)
            out[key] = pynvml.nvmlDeviceGetClockInfo(h, kind)
            out[key.replace("_MHz", "_max_MHz")] = pynvml.nvmlDeviceGetMaxClockInfo(h, kind)
        driver = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        out["power_limit_W"] = pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000
        return out
    finally:
        pynvml.nvmlShutdown()


SMI_FIELDS = ("clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "driver_version",
              "power.limit")
SMI_KEYS = ("sm_MHz", "sm_max_MHz", "mem_MHz", "mem_max_MHz", "driver", "power_limit_W")


def parse_smi(line: str) -> dict:
    """One line of `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`."""
    out = {"source": "nvidia-smi"}
    for key, value in zip(SMI_KEYS, (v.strip() for v in line.split(","))):
        try:
            out[key] = value if key == "driver" else float(value)
        except ValueError:
            out[key] = value  # "[N/A]" and the like, kept as written
    return out


def clocks_smi(index: int) -> dict:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise RuntimeError("nvidia-smi not on PATH")
    text = subprocess.run([smi, f"--id={index}", f"--query-gpu={','.join(SMI_FIELDS)}",
                           "--format=csv,noheader,nounits"], check=True, capture_output=True,
                          text=True, timeout=20).stdout
    return parse_smi(text.strip().splitlines()[0])


def clocks(index: int = 0) -> dict:
    """The clocks seen now: NVML when nvidia-ml-py imports, else nvidia-smi, else why neither."""
    errors = []
    for probe in (clocks_nvml, clocks_smi):
        try:
            return probe(index)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{probe.__name__}: {type(e).__name__}: {e}")
    return {"source": None, "unavailable": errors}


def gpu_info(index: int = 0) -> dict:
    """Name, compute capability, SMs, L2 and memory of the device (torch)."""
    import torch

    p = torch.cuda.get_device_properties(index)
    return {"index": index, "name": p.name, "sm": f"{p.major}{p.minor}",
            "num_sms": p.multi_processor_count,
            "l2_bytes": int(getattr(p, "L2_cache_size", 0)),
            "memory_GiB": round(p.total_memory / 2**30, 1)}


def command_line(argv) -> str:
    return "python -m kernelflow bench" + "".join(f" {a}" for a in argv)


def run_header(argv) -> dict:
    """The fields every run record starts with (the GPU's are added when there is one)."""
    return {"schema": SCHEMA, "command": command_line(argv), "argv": list(argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "python_executable": sys.executable}


def write(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(dumps(record) + "\n")
