"""DLPack interop on the CPU: NumPy, PyTorch and JAX arrays reach the C API as the same DLTensor
(device, dtype, shape, strides in elements) and results come back in the caller's framework."""

from __future__ import annotations

import numpy as np
import pytest

import kernelflow as kf
from inputs import BF16, HEAD, LATENT, bits, check_decode, make_case

KDL_CPU, KDL_FLOAT, KDL_BFLOAT, KDL_INT = 1, 2, 4, 0


def test_numpy_view_reaches_c_api_as_is():
    base = np.zeros((4, 6, 8), np.float16)
    view = base[1:, ::2, 3:]
    d = kf._C.describe(view)
    assert d["device_type"] == KDL_CPU
    assert d["dtype"] == (KDL_FLOAT, 16, 1)
    assert d["shape"] == (3, 3, 5)
    assert d["strides"] == (48, 16, 1)  # elements, not bytes
    assert d["data"] == view.ctypes.data  # the slice offset is in the pointer


@pytest.mark.skipif(BF16 is None, reason="needs ml_dtypes")
def test_numpy_bfloat16_is_labelled_bfloat16():
    d = kf._C.describe(np.zeros((2, 3), BF16))
    assert d["dtype"] == (KDL_BFLOAT, 16, 1)


class DLPackOnly:
    """An array known only through the DLPack protocol."""

    def __init__(self, a):
        self._a = a
        self.shape = a.shape
        self.dtype = a.dtype

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_any_dlpack_producer_as_input(rng):
    case = make_case(rng, [77, 5], 4, 1, 16, np.float16)
    meta = kf.get_mla_metadata(case.seqlens, 4)
    want = kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens, meta,
                         softmax_scale=case.scale)
    got = kf.mla_decode(DLPackOnly(case.q), DLPackOnly(case.cache),
                        DLPackOnly(case.block_table), DLPackOnly(case.seqlens), DLPackOnly(meta),
                        softmax_scale=case.scale)
    assert isinstance(got[0], np.ndarray)
    assert bits(got[0]) == bits(want[0]) and bits(got[1]) == bits(want[1])


# ---- PyTorch (CPU) ----------------------------------------------------------------------------

@pytest.mark.needs_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_cpu_decode(rng, dtype):
    import torch

    tdt = getattr(torch, dtype)
    case = make_case(rng, [700, 64, 0], 16, 2, 32, np.float32)
    q = torch.from_numpy(case.q).to(tdt)
    cache = torch.from_numpy(case.cache).to(tdt)
    bt = torch.from_numpy(case.block_table)
    sl = torch.from_numpy(case.seqlens)
    meta = kf.get_mla_metadata(sl, 16, 2)
    assert isinstance(meta, torch.Tensor) and meta.dtype == torch.int32
    out, lse = kf.mla_decode(q, cache, bt, sl, meta, softmax_scale=case.scale)
    assert isinstance(out, torch.Tensor) and out.dtype == tdt and out.device.type == "cpu"
    assert out.shape == (3, 2, 16, LATENT) and lse.dtype == torch.float32
    case.q, case.cache = q.float().numpy(), cache.float().numpy()  # what was stored
    check_decode(case, out.float().numpy(), lse.numpy())


@pytest.mark.needs_torch
def test_torch_strided_q_and_grad(rng):
    """A transposed (non-contiguous) q that requires grad: same bits as a contiguous copy."""
    import torch

    case = make_case(rng, [300, 20], 8, 3, 16, np.float16)
    q_bhs = torch.from_numpy(case.q).permute(0, 2, 1, 3).contiguous()  # memory [b, h, s, 576]
    q_bhs.requires_grad_(True)
    q = q_bhs.permute(0, 2, 1, 3)  # logical [b, s, h, 576], strides (h*s*576, 576, s*576, 1)
    assert not q.is_contiguous() and q.requires_grad
    d = kf._C.describe(torch.utils.dlpack.to_dlpack(q.detach()))
    assert d["shape"] == (2, 3, 8, HEAD)
    assert d["strides"] == tuple(q.stride())
    cache, bt = torch.from_numpy(case.cache), torch.from_numpy(case.block_table)
    sl = torch.from_numpy(case.seqlens)
    meta = kf.get_mla_metadata(sl, 8, 3)
    out, lse = kf.mla_decode(q, cache, bt, sl, meta, softmax_scale=case.scale)
    ref_out, ref_lse = kf.mla_decode(torch.from_numpy(case.q), cache, bt, sl, meta,
                                     softmax_scale=case.scale)
    assert torch.equal(out.view(torch.int16), ref_out.view(torch.int16))
    assert torch.equal(lse, ref_lse)


@pytest.mark.needs_torch
def test_torch_cache_append_in_place(rng):
    import torch

    cache = torch.zeros(4, 16, HEAD, dtype=torch.bfloat16)
    kv = torch.randn(5, HEAD).to(torch.bfloat16)
    slots = torch.tensor([3, -1, 17, 63, 0], dtype=torch.int64)
    assert kf.cache_append(kv, cache, slots) is cache
    flat = cache.view(-1, HEAD)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[s], kv[i])
    assert flat[1].abs().sum() == 0


@pytest.mark.needs_torch
def test_torch_and_numpy_agree(rng):
    import torch

    case = make_case(rng, [1000, 3], 16, 1, 64, np.float16)
    meta = kf.get_mla_metadata(case.seqlens, 16)
    np_out, np_lse = kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens, meta,
                                   softmax_scale=case.scale)
    t = [torch.from_numpy(a) for a in (case.q, case.cache, case.block_table, case.seqlens, meta)]
    t_out, t_lse = kf.mla_decode(*t, softmax_scale=case.scale)
    assert bits(np_out) == bits(t_out.numpy()) and bits(np_lse) == bits(t_lse.numpy())


# ---- JAX (CPU) --------------------------------------------------------------------------------

@pytest.mark.needs_jax
def test_jax_cpu_decode(rng):
    import jax
    import jax.numpy as jnp

    case = make_case(rng, [500, 0, 65], 16, 1, 64, BF16 if BF16 is not None else np.float16)
    q, cache = jnp.asarray(case.q), jnp.asarray(case.cache)
    bt, sl = jnp.asarray(case.block_table), jnp.asarray(case.seqlens)
    assert q.devices().pop().platform == "cpu"
    assert kf._C.describe(q)["dtype"] == kf._C.describe(case.q)["dtype"]
    meta = kf.get_mla_metadata(sl, 16)
    assert isinstance(meta, jax.Array)
    out, lse = kf.mla_decode(q, cache, bt, sl, meta, softmax_scale=case.scale)
    assert isinstance(out, jax.Array) and out.dtype == q.dtype and out.shape == (3, 1, 16, LATENT)
    check_decode(case, np.asarray(out), np.asarray(lse))


@pytest.mark.needs_jax
def test_jax_outputs_are_refused(rng):
    import jax.numpy as jnp

    case = make_case(rng, [50], 4, 1, 16, np.float16)
    meta = kf.get_mla_metadata(case.seqlens, 4)
    with pytest.raises(ValueError, match="out: JAX arrays are immutable"):
        kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens, meta,
                      softmax_scale=case.scale, out=jnp.zeros((1, 1, 4, LATENT), jnp.float16))
    with pytest.raises(ValueError, match="kv_cache: JAX arrays are immutable"):
        kf.cache_append(jnp.zeros((1, HEAD), jnp.float16), jnp.asarray(case.cache),
                        np.zeros(1, np.int64))


@pytest.mark.needs_jax
def test_jax_inside_jit_is_refused(rng):
    import jax
    import jax.numpy as jnp

    @jax.jit
    def f(sl):
        return kf.get_mla_metadata(sl, 16)

    with pytest.raises(TypeError, match="traced JAX"):
        f(jnp.array([5, 6], jnp.int32))
