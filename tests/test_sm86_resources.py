"""The decode kernels fit sm_86 (RTX 3090) with no register spills: checked on the built library's
resource report (cuobjdump), so no GPU is needed. Skips when the library, cuobjdump or sm_86 code
is missing, unless KF_REQUIRE_RESOURCE_CHECK=1 (CI sets it): then a missing piece fails."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import check_resources  # noqa: E402


def _missing(reason):
    if os.environ.get("KF_REQUIRE_RESOURCE_CHECK") == "1":
        pytest.fail(f"resource check required but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sm86_report():
    library = check_resources.find_library()
    if library is None:
        _missing("libkernelflow not built (set KF_LIBRARY or build the package)")
    cuobjdump = check_resources.find_cuobjdump()
    if cuobjdump is None:
        _missing("cuobjdump not found (CUDA toolkit or pip nvidia-cuda-cuobjdump)")
    try:
        return check_resources.check(library, cuobjdump, "86")
    except FileNotFoundError as e:
        _missing(f"no sm_86 code: {e}")


def test_decode_kernels_are_built_for_sm86(sm86_report):
    _, rows = sm86_report
    names = [func for _, func, _ in rows]
    assert any("mla_decode_sm80_kernel" in n for n in names), names
    assert any("mla_combine_rows_kernel" in n for n in names), names
    assert any("mla_combine_pieces_kernel" in n for n in names), names


def test_no_spills_and_shared_memory_fits(sm86_report):
    violations, _ = sm86_report
    assert violations == []


def test_registers_within_the_hardware_limit(sm86_report):
    _, rows = sm86_report
    for _, func, f in rows:
        assert 0 < f["REG"] <= 255, func
