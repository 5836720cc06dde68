"""Both decode kernel families in one test process: the `kernel_family` fixture runs a test once
with KF_KERNEL_FAMILY=sm80 (the portable kernels) and once with KF_KERNEL_FAMILY=sm90a (the sm_90a
kernels on an H200 with a build for 90, the default there; the portable kernels on other
devices). The library reads KF_KERNEL_FAMILY at every CUDA call (src/cuda/common/switches.h), so setting it
between calls switches the family. A module uses it with
`pytestmark = [..., pytest.mark.usefixtures("kernel_family")]` after importing it.

`kernel_family_8bit` adds a third run for the 8-bit tests: the sm_90a family with KF_SM90A_KV8=1,
its 8-bit wgmma kernel at every batch (without the switch it runs large batches only; the library
reads the switch at every call too)."""

from __future__ import annotations

import pytest

FAMILIES = ["sm80", "sm90a"]


@pytest.fixture(params=FAMILIES)
def kernel_family(request, monkeypatch):
    monkeypatch.setenv("KF_KERNEL_FAMILY", request.param)
    return request.param


FAMILIES_8BIT = ["sm80", "sm90a", "sm90a-kv8"]


@pytest.fixture(params=FAMILIES_8BIT)
def kernel_family_8bit(request, monkeypatch):
    family, _, kv8 = request.param.partition("-")
    monkeypatch.setenv("KF_KERNEL_FAMILY", family)
    if kv8:
        monkeypatch.setenv("KF_SM90A_KV8", "1")
    else:
        monkeypatch.delenv("KF_SM90A_KV8", raising=False)
    return request.param
