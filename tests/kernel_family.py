"""Both decode kernel families in one test process: the `kernel_family` fixture runs a test once
with KF_KERNEL_FAMILY=sm80 (the portable kernels) and once with KF_KERNEL_FAMILY=sm90a (the sm_90a
kernels on an H200 with a build for 90, the default there; the portable kernels on other
devices). The library reads KF_KERNEL_FAMILY at every CUDA call (src/cuda/common/switches.h), so setting it
between calls switches the family. A module uses it with
`pytestmark = [..., pytest.mark.usefixtures("kernel_family")]` after importing it."""

from __future__ import annotations

import pytest

FAMILIES = ["sm80", "sm90a"]


@pytest.fixture(params=FAMILIES)
def kernel_family(request, monkeypatch):
    monkeypatch.setenv("KF_KERNEL_FAMILY", request.param)
    return request.param
