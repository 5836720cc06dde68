"""The package around the binding: version, build info, stubs, command line."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import kernelflow as kf

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_version_matches_header_and_pyproject():
    header = (ROOT / "include/kernelflow/kernelflow.h").read_text()
    parts = [re.search(rf"#define KF_VERSION_{p} (\d+)", header).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    assert kf.__version__ == kf.version == ".".join(parts)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == kf.__version__


def test_build_info():
    info = kf.build_info()
    assert kf.__version__ in info
    assert ("cpu-only" in info) != kf.has_cuda()
    assert kf.cuda_device_count() >= 0
    if not kf.has_cuda():
        assert kf.cuda_device_count() == 0


def test_constants():
    assert kf.ERROR_BUFFER_LEN == 4
    flags = [kf.DEVERR_SEQLEN_RANGE, kf.DEVERR_PAGE_RANGE, kf.DEVERR_METADATA,
             kf.DEVERR_SLOT_RANGE]
    assert sorted(flags) == [1, 2, 4, 8]
    assert kf._C.HEAD_DIM == 576 and kf._C.LATENT_DIM == 512 and kf._C.ROPE_DIM == 64
    assert kf.KV_FORMATS == {"bf16": 0, "fp16": 1, "fp8_e4m3": 2, "int8": 3}
    buf = kf.new_error_buffer(np.zeros(1))
    assert buf.tolist() == [0, -1, 0, 0] and str(buf.dtype) == "int32"


def test_public_names_exist():
    for name in kf.__all__:
        assert hasattr(kf, name), name


def test_stub_matches_module():
    """_C.pyi (hand-written) declares exactly what the module exports."""
    stub = pathlib.Path(kf.__file__).with_name("_C.pyi")
    assert stub.exists(), "the package ships _C.pyi"
    assert stub.with_name("py.typed").exists(), "the package ships py.typed"
    tree = ast.parse(stub.read_text())
    declared = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    declared |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    exported = {n for n in dir(kf._C) if not n.startswith("_")}
    assert declared == exported
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            params = [a.arg for a in node.args.args]
            doc_sig = getattr(kf._C, node.name).__nb_signature__[0][0]
            # "def name(a: int, b: object | None = None) -> T": the parameter names in order.
            bound = re.search(r"\((.*)\)\s*->", doc_sig).group(1)
            names = re.findall(r"(?:^|,\s*)(\w+)\s*:", bound)
            assert params == names, f"{node.name}: stub {params}, module {doc_sig}"


def _run_cli(*args, timeout=300):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "kernelflow", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_cli_info():
    r = _run_cli("info")
    assert r.returncode == 0, r.stderr
    assert f"kernelflow {kf.__version__}" in r.stdout
    assert kf.build_info() in r.stdout
    assert "CUDA devices visible to the library" in r.stdout


def test_cli_demo_passes():
    r = _run_cli("demo")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "PASS", r.stdout
    assert "worst-row cosine distance" in r.stdout and "decode:" in r.stdout
    if not (kf.has_cuda() and kf.cuda_device_count()):
        assert "CPU backend" in r.stdout
    header = next(line for line in lines if line.startswith("DeepSeek-V2-Lite decode step"))
    ran_gpu = "CPU backend" not in r.stdout
    ran = "bf16" if ran_gpu else _demo_cpu_dtype()
    assert f"dtype {ran}" in header, header


def _demo_cpu_dtype() -> str:
    """The 16-bit format the demo's CPU arrays are in, read from the arrays themselves."""
    from kernelflow import _demo
    from kernelflow._frameworks import dtype_name

    q, cache, _, label = _demo._cpu_arrays(np.zeros((1, 1, 1, 576), np.float32),
                                           np.zeros((1, 64, 576), np.float32))
    name = {"bfloat16": "bf16", "float16": "fp16"}[dtype_name(q)]
    assert dtype_name(cache) == dtype_name(q) and label.startswith(name)
    return name


def test_cli_usage_error():
    r = _run_cli("nonsense")
    assert r.returncode != 0 and "usage" in r.stderr


@pytest.mark.parametrize("device,expected", [("cpu", -1), (-1, -1)])
def test_default_num_workers_devices(device, expected):
    assert kf.default_num_workers(device, 16) == kf._C.default_num_workers(expected, 16, 1)
    assert kf.default_num_workers(device, 16, 2, "int8") == kf._C.default_num_workers(expected, 16, 2, 3)
