"""GPU decode through CuPy arrays: results in CuPy on the same device, strides honored."""

from __future__ import annotations

import numpy as np
import pytest

import kernelflow as kf
from inputs import LATENT, check_decode, make_case
from kernel_family import kernel_family  # noqa: F401  (the fixture)

# Every test runs with both decode kernel families (kernel_family.py).
pytestmark = [pytest.mark.gpu, pytest.mark.needs_cupy, pytest.mark.usefixtures("kernel_family")]

KDL_CUDA = 2


def test_cupy_arrays(rng):
    import cupy

    case = make_case(rng, [700, 0, 129], 16, 2, 64, np.float16)
    q, cache = cupy.asarray(case.q), cupy.asarray(case.cache)
    bt, sl = cupy.asarray(case.block_table), cupy.asarray(case.seqlens)
    meta = kf.get_mla_metadata(sl, 16, 2)
    assert isinstance(meta, cupy.ndarray) and meta.dtype == cupy.int32
    out, lse = kf.mla_decode(q, cache, bt, sl, meta, softmax_scale=case.scale)
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16
    assert out.device.id == q.device.id
    check_decode(case, cupy.asnumpy(out), cupy.asnumpy(lse))
    # A strided CuPy view reaches the C API with its strides (in elements).
    wide = cupy.full((3, 2, 16, 2 * LATENT), cupy.nan, dtype=cupy.float16)
    view = wide[..., :LATENT]
    d = kf._C.describe(view.toDlpack())
    assert d["device_type"] == KDL_CUDA and d["strides"] == (2 * 2 * 16 * LATENT, 2 * 16 * LATENT,
                                                             2 * LATENT, 1)
    kf.mla_decode(q, cache, bt, sl, meta, softmax_scale=case.scale, out=view)
    assert cupy.array_equal(view, out) and cupy.isnan(wide[..., LATENT:]).all()


def test_cupy_reference_long(rng):
    import cupy

    case = make_case(rng, [5000, 64], 128, 1, 32, np.float16)
    args = [cupy.asarray(a) for a in (case.q, case.cache, case.block_table, case.seqlens)]
    meta = kf.get_mla_metadata(args[3], 128)
    out, lse = kf.mla_decode(*args, meta, softmax_scale=case.scale)
    check_decode(case, cupy.asnumpy(out), cupy.asnumpy(lse))
