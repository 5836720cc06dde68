"""Markers: gpu (a usable CUDA device through PyTorch or CuPy, and a build with CUDA),
needs_torch, needs_jax, needs_cupy (skip when the framework is missing)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import zlib

import numpy as np
import pytest


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None and importlib.import_module(name) is not None
    except Exception:  # a broken install counts as missing
        return False


@functools.lru_cache(maxsize=None)
def have(name: str) -> bool:
    return _importable(name)


@functools.lru_cache(maxsize=None)
def gpu_skip_reason():
    import kernelflow as kf

    if not kf.has_cuda():
        return "this kernelflow build has no CUDA backend (cpu-only)"
    found = False
    if have("torch"):
        import torch

        found = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not found and have("cupy"):
        import cupy

        try:
            found = cupy.cuda.runtime.getDeviceCount() > 0
        except Exception:
            found = False
    if not found:
        return "no CUDA device usable through PyTorch or CuPy"
    if kf.cuda_device_count() == 0:
        return "the library sees no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in ("torch", "jax", "cupy"):
            if item.get_closest_marker(f"needs_{name}") and not have(name):
                item.add_marker(pytest.mark.skip(reason=f"{name} is not installed"))
        if item.get_closest_marker("gpu"):
            reason = gpu_skip_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def rng(request):
    """Fresh random inputs per test, seeded from the test id (a failure reruns the same);
    KF_TEST_SEED=<int> draws another set."""
    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("KF_TEST_SEED", "0"))
    return np.random.default_rng(seed)
