"""kernelflow.jax: the XLA FFI custom calls under jax.jit, eagerly and inside lax.scan, on the CPU
backend (bits equal to the eager library on NumPy arrays, close to kernelflow.reference), the
aliased cache append, the error buffer, and bad input named by argument. On a GPU (skipped
without one): the same against the eager library on PyTorch CUDA tensors, and inside XLA's
command buffers. The whole file skips when JAX is missing or this build has no JAX entry."""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

# JAX takes most of a GPU's memory when its GPU backend starts; the PyTorch tests in the same
# pytest process need some too. JAX reads this when its backend starts, so it is set before.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

jax = pytest.importorskip("jax", reason="jax is not installed")
import jax.numpy as jnp  # noqa: E402

import kernelflow as kf  # noqa: E402
from inputs import BF16, HEAD, LATENT, Case, bits, check_decode, make_case, numpy_dtype  # noqa: E402

try:
    import kernelflow.jax as kfj
except ImportError as e:  # a build without JAX's FFI headers
    pytest.skip(f"kernelflow.jax is absent from this build: {e}", allow_module_level=True)

SCALE = 0.114721
CPU = jax.devices("cpu")[0]
CLEAN = [0, -1, 0, 0]


@pytest.fixture(autouse=True)
def on_cpu():
    """CPU tests run on JAX's CPU backend also where a GPU is JAX's default device (the GPU tests
    pick theirs inside)."""
    with jax.default_device(CPU):
        yield


def put(*arrays, device=CPU):
    return tuple(jax.device_put(a, device) for a in arrays)


def eager_decode(case, kv_format=None, cache=None, num_workers=None):
    """(metadata, out, lse) of the eager library on the case's NumPy arrays."""
    cache = case.cache if cache is None else cache
    fmt = kv_format or "bf16"
    meta = kf.get_mla_metadata(case.seqlens, case.h_q, case.s_q, num_workers=num_workers,
                               kv_format=fmt)
    out, lse = kf.mla_decode(case.q, cache, case.block_table, case.seqlens, meta,
                             softmax_scale=case.scale, kv_format=kv_format)
    return meta, out, lse


def jax_decode(case, kv_format=None, cache=None, jit=True):
    """(metadata, out, lse) of kernelflow.jax on the case's arrays, eagerly or under jax.jit."""
    cache = case.cache if cache is None else cache
    fmt = kv_format or "bf16"

    def step(q, cache, bt, sl):
        meta = kfj.get_mla_metadata(sl, q.shape[2], q.shape[1], kv_format=fmt)
        out, lse = kfj.mla_decode(q, cache, bt, sl, meta, softmax_scale=case.scale,
                                  kv_format=kv_format)
        return meta, out, lse

    run = jax.jit(step) if jit else step
    return run(*put(case.q, cache, case.block_table, case.seqlens))


def assert_bits(got, want, what):
    for g, w, name in zip(got, want, ("metadata", "out", "lse")):
        assert bits(g) == bits(w), f"{what}: {name} differs from the eager library"


# ---- decode -----------------------------------------------------------------------------------

@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("h_q,s_q,page", [(16, 1, 64), (32, 2, 16)])
def test_decode_bits_equal_eager_and_close_to_reference(rng, jit, dtype, h_q, s_q, page):
    case = make_case(rng, [500, 0, 65, 1], h_q, s_q, page, numpy_dtype(dtype))
    got = jax_decode(case, jit=jit)
    assert isinstance(got[1], jax.Array) and got[1].dtype == case.q.dtype
    assert got[1].shape == (4, s_q, h_q, LATENT) and got[2].shape == (4, h_q, s_q)
    assert_bits(got, eager_decode(case), f"{dtype} h_q={h_q} s_q={s_q}")
    check_decode(case, np.asarray(got[1]), np.asarray(got[2]), "kernelflow.jax")


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_convert_and_decode_8bit_bits_equal_eager(rng, fmt):
    case = make_case(rng, [300, 17], 16, 1, 16, np.float16)
    want8 = kf.convert_cache(case.cache, kv_format=fmt)
    got8 = jax.jit(lambda c: kfj.convert_cache(c, fmt))(*put(case.cache))
    assert got8.dtype == jnp.uint8 and bits(got8) == bits(want8)
    assert_bits(jax_decode(case, fmt, cache=want8), eager_decode(case, fmt, cache=want8), fmt)


def test_num_workers_given_is_used(rng):
    case = make_case(rng, [200, 90], 16, 1, 32, np.float16)
    meta = kfj.get_mla_metadata(*put(case.seqlens), 16, num_workers=3)
    assert bits(meta) == bits(kf.get_mla_metadata(case.seqlens, 16, num_workers=3))


# ---- a decode step over layers ------------------------------------------------------------------

def layer_problem(rng, layers, seqlens, h_q, page, dtype, extra_columns=None):
    """Caches of `layers` layers sharing one block table, this step's new row per request and
    layer, and its slots: (case of layer 0, caches [L, ...], q [L, ...], kv [L, b, 576], slots,
    lengths after the append). extra_columns: unused block table columns (random by default; a
    fixed number keeps the shapes, and so one compilation, over several problems)."""
    dt = numpy_dtype(dtype)
    case = make_case(rng, [n + 1 for n in seqlens], h_q, 1, page, dt, extra_columns=extra_columns)
    shape = (layers,) + case.cache.shape
    caches = np.where(np.isnan(case.cache), np.float32(np.nan),
                      rng.standard_normal(shape, dtype=np.float32)).astype(dt)
    qs = rng.standard_normal((layers,) + case.q.shape, dtype=np.float32).astype(dt)
    kvs = rng.standard_normal((layers, len(seqlens), HEAD), dtype=np.float32).astype(dt)
    slots = np.array([case.block_table[b, n // page] * page + n % page
                      for b, n in enumerate(seqlens)], np.int32)
    return case, caches, qs, kvs, slots


def eager_layers(case, caches, qs, kvs, slots):
    """Per layer: append this step's rows, then decode; returns (outs, lses, caches)."""
    outs, lses, new_caches = [], [], []
    meta = kf.get_mla_metadata(case.seqlens, case.h_q, 1)
    for cache, q, kv in zip(caches, qs, kvs):
        cache = cache.copy()
        kf.cache_append(kv, cache, slots.astype(np.int64))
        out, lse = kf.mla_decode(q, cache, case.block_table, case.seqlens, meta,
                                 softmax_scale=case.scale)
        outs.append(out), lses.append(lse), new_caches.append(cache)
    return outs, lses, new_caches


def scan_step(h_q, scale):
    """One decode step: metadata once, then lax.scan over the layers (append, decode)."""

    def step(qs, caches, kvs, bt, sl, slots):
        meta = kfj.get_mla_metadata(sl, h_q)

        def layer(carry, xs):
            q, cache, kv = xs
            cache = kfj.cache_append(kv, cache, slots)
            out, lse = kfj.mla_decode(q, cache, bt, sl, meta, softmax_scale=scale)
            return carry, (out, lse, cache)

        return jax.lax.scan(layer, None, (qs, caches, kvs))[1]

    return step


def check_layers(got, want):
    """Per layer: the appended cache, out and lse bit-equal to the eager library's."""
    for l, (g_out, g_lse, g_cache, w_out, w_lse, w_cache) in enumerate(zip(*got, *want)):
        assert bits(g_cache) == bits(w_cache), f"layer {l}: the appended cache differs"
        assert bits(g_out) == bits(w_out) and bits(g_lse) == bits(w_lse), f"layer {l}"


def test_scan_over_three_layers_bits_equal_eager(rng):
    case, caches, qs, kvs, slots = layer_problem(rng, 3, [37, 20, 0], 16, 16, "bfloat16")
    want = eager_layers(case, caches, qs, kvs, slots)
    step = jax.jit(scan_step(16, case.scale), donate_argnums=1)
    got = step(*put(qs, caches, kvs, case.block_table, case.seqlens, slots))
    check_layers(got, want)
    for l in range(3):
        layer = Case(qs[l], want[2][l], case.block_table, case.seqlens, case.scale)
        check_decode(layer, np.asarray(got[0][l]), np.asarray(got[1][l]), f"layer {l}")


# ---- cache append ------------------------------------------------------------------------------

def append_problem(rng, dtype=np.float16, pages=4, page=16):
    cache = np.full((pages, page, HEAD), np.nan, dtype)
    kv = rng.standard_normal((5, HEAD), dtype=np.float32).astype(dtype)
    slots = np.array([3, 17, -1, 40, pages * page - 1], np.int32)
    want = cache.copy()
    kf.cache_append(kv, want, slots.astype(np.int64))
    return cache, kv, slots, want


def test_append_aliases_the_cache_and_lands_in_place(rng):
    cache, kv, slots, want = append_problem(rng)
    step = jax.jit(lambda kv, c, s: kfj.cache_append(kv, c, s), donate_argnums=1)
    kv_j, cache_j, slots_j = put(kv, cache, slots)
    # A buffer XLA owns: device_put may wrap the NumPy array's memory, which XLA cannot donate.
    cache_j = cache_j.copy()
    hlo = step.lower(kv_j, cache_j, slots_j).compile().as_text()
    call = [l for l in hlo.splitlines() if 'custom_call_target="kernelflow_cache_append"' in l]
    assert call and "output_to_operand_aliasing={{}: (1, {})}" in call[0], call
    address = cache_j.unsafe_buffer_pointer()
    got = step(kv_j, cache_j, slots_j)
    assert cache_j.is_deleted(), "the donated cache must be consumed"
    assert got.unsafe_buffer_pointer() == address, "the rows must land in the donated buffer"
    assert bits(got) == bits(want)


def test_append_without_donation_leaves_the_input(rng):
    cache, kv, slots, want = append_problem(rng)
    before = cache.copy()
    cache_j = put(cache)[0]
    got = kfj.cache_append(*put(kv), cache_j, *put(slots))
    assert bits(got) == bits(want)
    assert bits(cache_j) == bits(before) and bits(cache) == bits(before)


def test_append_int64_slots(rng):
    cache, kv, slots, want = append_problem(rng)
    with jax.enable_x64(True):
        slots64 = jax.device_put(slots.astype(np.int64), CPU)
        assert slots64.dtype == jnp.int64
        got = jax.jit(kfj.cache_append)(*put(kv, cache), slots64)
    assert bits(got) == bits(want)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_append_8bit_bits_equal_eager(rng, fmt):
    cache = np.zeros((2, 16, kf._C.BYTES_PER_TOKEN_8BIT), np.uint8)
    kv = rng.standard_normal((3, HEAD), dtype=np.float32).astype(BF16 or np.float16)
    slots = np.array([0, 31, 7], np.int32)
    want = cache.copy()
    kf.cache_append(kv, want, slots.astype(np.int64), kv_format=fmt)
    got = jax.jit(lambda *a: kfj.cache_append(*a, kv_format=fmt))(*put(kv, cache, slots))
    assert bits(got) == bits(want)


# ---- the error buffer --------------------------------------------------------------------------

def test_error_buffer_clean_on_good_input(rng):
    case = make_case(rng, [70, 3], 16, 1, 16, np.float16)
    cache, kv, slots, _ = append_problem(rng)
    err = put(kfj.new_error_buffer())[0]
    assert err.dtype == jnp.int32 and np.asarray(err).tolist() == CLEAN

    @jax.jit
    def step(q, c, bt, sl, kv, cache, slots, err):
        meta = kfj.get_mla_metadata(sl, 16)
        out, lse, err = kfj.mla_decode(q, c, bt, sl, meta, softmax_scale=SCALE, error_buffer=err)
        cache, err = kfj.cache_append(kv, cache, slots, error_buffer=err)
        return out, lse, cache, err

    out, lse, new_cache, err = step(*put(case.q, case.cache, case.block_table, case.seqlens,
                                         kv, cache, slots, err))
    assert np.asarray(err).tolist() == CLEAN
    kfj.check_errors(err)
    want = kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens,
                         kf.get_mla_metadata(case.seqlens, 16), softmax_scale=SCALE)
    assert bits(out) == bits(want[0]) and bits(lse) == bits(want[1])


def test_check_errors_names_the_flags():
    flags = kf.DEVERR_PAGE_RANGE | kf.DEVERR_SLOT_RANGE
    with pytest.raises(ValueError, match=r"block_table entry.*slot_mapping.*row 2, value 99"):
        kfj.check_errors(jnp.array([flags, 2, 99, 0], jnp.int32))


def test_cpu_backend_raises_on_bad_values(rng):
    case = make_case(rng, [40, 30], 16, 1, 16, np.float16, extra_columns=0)
    case.seqlens[1] = case.block_table.shape[1] * 16 + 1
    with pytest.raises((ValueError, RuntimeError), match=r"mla_decode: cache_seqlens\[1\]"):
        jax.block_until_ready(jax_decode(case))
    cache, kv, slots, _ = append_problem(rng)
    slots[1] = cache.shape[0] * cache.shape[1]
    with pytest.raises((ValueError, RuntimeError), match=r"cache_append: slot_mapping\[1\]"):
        jax.block_until_ready(jax.jit(kfj.cache_append)(*put(kv, cache, slots)))


# ---- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["softmax_scale", "num_heads_q", "s_q", "num_workers"])
def test_traced_static_value_is_named(rng, name):
    case = make_case(rng, [20], 16, 1, 16, np.float16)
    static = {"softmax_scale": SCALE, "num_heads_q": 16, "s_q": 1, "num_workers": 2}

    @jax.jit
    def step(value, q, c, bt, sl):
        kw = dict(static, **{name: value})
        meta = kfj.get_mla_metadata(sl, kw["num_heads_q"], kw["s_q"], kw["num_workers"])
        return kfj.mla_decode(q, c, bt, sl, meta, softmax_scale=kw["softmax_scale"])

    with pytest.raises(TypeError, match=rf"^{name}: expected a static value, got a traced"):
        step(static[name], *put(case.q, case.cache, case.block_table, case.seqlens))


def decode_args(rng):
    case = make_case(rng, [20, 5], 16, 1, 16, np.float16)
    meta = kf.get_mla_metadata(case.seqlens, 16)
    return dict(q=case.q, kv_cache=case.cache, block_table=case.block_table,
                cache_seqlens=case.seqlens, metadata=meta, softmax_scale=SCALE)


@pytest.mark.parametrize("arg,value,exc,match", [
    ("q", [[1.0]], TypeError, r"^q: expected a JAX or NumPy array, got builtins.list"),
    ("q", np.zeros((2, 1, 16, HEAD), np.float32), ValueError, r"^q: expected dtype bfloat16 or float16"),
    ("q", np.zeros((2, 16, HEAD), np.float16), ValueError, r"^q: expected shape \[b, s_q, h_q, 576\]"),
    ("q", np.zeros((2, 1, 32, HEAD), np.float16), ValueError, r"^q: .*metadata was made by get_mla_metadata for num_heads_q = 16"),
    ("q", np.zeros((3, 1, 16, HEAD), np.float16), ValueError, r"^q: expected shape\[0\] \(batch\) = 2"),
    ("kv_cache", np.zeros((4, 16, HEAD), BF16 or np.float32), ValueError, r"^kv_cache: expected dtype float16"),
    ("kv_cache", np.zeros((4, 16, 644), np.uint8), ValueError, r"^kv_format: required for a uint8 kv_cache"),
    ("block_table", np.zeros((2, 3), np.float32), ValueError, r"^block_table: expected dtype int32"),
    ("metadata", np.zeros(7, np.int32), ValueError, r"^metadata: shape \(7,\) fits no worker count"),
    ("softmax_scale", "0.1", TypeError, r"^softmax_scale: expected a float"),
    ("kv_format", "fp4", ValueError, r"^kv_format: expected one of bf16, fp16, fp8_e4m3, int8"),
    ("error_buffer", np.zeros(3, np.int32), ValueError, r"^error_buffer: expected shape \(4,\)"),
])
def test_decode_bad_input_named(rng, arg, value, exc, match):
    args = decode_args(rng)
    args[arg] = value
    with pytest.raises(exc, match=match):
        kfj.mla_decode(**args)


@pytest.mark.parametrize("arg,value,exc,match", [
    ("kv", np.zeros((5, 512), np.float16), ValueError, r"^kv: expected shape \[n, 576\]"),
    ("kv", np.zeros((5, HEAD), np.float32), ValueError, r"^kv: expected dtype bfloat16 or float16"),
    ("slot_mapping", np.zeros(4, np.int32), ValueError, r"^slot_mapping: expected shape \[n\] with n = 5"),
    ("slot_mapping", np.zeros(5, np.float32), ValueError, r"^slot_mapping: expected dtype int32 or int64"),
    ("kv_cache", "cache", TypeError, r"^kv_cache: expected a JAX or NumPy array"),
])
def test_append_bad_input_named(rng, arg, value, exc, match):
    cache, kv, slots, _ = append_problem(rng)
    args = dict(kv=kv, kv_cache=cache, slot_mapping=slots)
    args[arg] = value
    with pytest.raises(exc, match=match):
        kfj.cache_append(**args)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(num_heads_q=0), ValueError, r"^num_heads_q: expected 1\.\.128"),
    (dict(s_q=17), ValueError, r"^s_q: expected 1\.\.16"),
    (dict(num_workers=0), ValueError, r"^num_workers: expected 1\.\."),
    (dict(kv_format="fp4"), ValueError, r"^kv_format: expected one of"),
    (dict(cache_seqlens=np.zeros((2, 2), np.int32)), ValueError, r"^cache_seqlens: expected shape \[batch\]"),
    (dict(cache_seqlens=np.zeros(2, np.float32)), ValueError, r"^cache_seqlens: expected dtype int32"),
])
def test_metadata_bad_input_named(kw, exc, match):
    args = dict(cache_seqlens=np.array([3, 4], np.int32), num_heads_q=16)
    args.update(kw)
    with pytest.raises(exc, match=match):
        kfj.get_mla_metadata(**args)


def test_convert_bad_input_named():
    with pytest.raises(ValueError, match=r"^kv_format: expected 'fp8_e4m3' or 'int8'"):
        kfj.convert_cache(np.zeros((2, 16, HEAD), np.float16), "bf16")
    with pytest.raises(ValueError, match=r"^src: expected shape \[num_pages, page_size, 576\]"):
        kfj.convert_cache(np.zeros((16, HEAD), np.float16))


def test_absent_extension_says_how_to_rebuild(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernelflow._jax_ffi", None)  # a build without the extension
    monkeypatch.delattr(kf, "_jax_ffi")
    monkeypatch.delitem(sys.modules, "kernelflow.jax")
    with pytest.raises(ImportError, match=r"has no JAX entry.*rebuild.*KF_JAX_FFI_INCLUDE_DIR"):
        importlib.import_module("kernelflow.jax")


# ---- GPU ---------------------------------------------------------------------------------------

def jax_gpu():
    """JAX's first GPU, or a skip (the gpu marker has checked the library's side)."""
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU (a CPU-only jaxlib, or no CUDA plugin)")


def torch_cuda(a):
    """A NumPy array (bfloat16 included) as a PyTorch CUDA tensor of the same bits."""
    import torch

    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.uint16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(a).cuda()


def torch_layers(case, caches, qs, kvs, slots):
    """eager_layers on the GPU through PyTorch tensors; results as NumPy arrays."""
    import torch

    bt, sl = torch_cuda(case.block_table), torch_cuda(case.seqlens)
    slots = torch_cuda(slots.astype(np.int64))
    meta = kf.get_mla_metadata(sl, case.h_q, 1)
    outs, lses, new_caches = [], [], []
    for cache, q, kv in zip(caches, qs, kvs):
        cache = torch_cuda(cache)
        kf.cache_append(torch_cuda(kv), cache, slots)
        out, lse = kf.mla_decode(torch_cuda(q), cache, bt, sl, meta, softmax_scale=case.scale)
        torch.cuda.synchronize()
        outs.append(host(out)), lses.append(host(lse)), new_caches.append(host(cache))
    return outs, lses, new_caches


def host(t):
    """A PyTorch tensor's bits as a NumPy array of its dtype (bfloat16 through ml_dtypes)."""
    import torch

    if t.dtype == torch.bfloat16:
        return t.cpu().view(torch.int16).numpy().view(BF16)
    return t.cpu().numpy()


@pytest.mark.gpu
@pytest.mark.needs_torch
def test_gpu_jit_scan_bits_equal_eager(rng):
    gpu = jax_gpu()
    case, caches, qs, kvs, slots = layer_problem(rng, 3, [1000, 37, 0, 4097], 16, 64, "bfloat16")
    want = torch_layers(case, caches, qs, kvs, slots)
    with jax.default_device(gpu):
        args = put(qs, caches, kvs, case.block_table, case.seqlens, slots, device=gpu)
        got = jax.jit(scan_step(16, case.scale), donate_argnums=1)(*args)
    assert got[0].devices() == {gpu}
    check_layers(got, want)
    for l in range(3):
        layer = Case(qs[l], want[2][l], case.block_table, case.seqlens, case.scale)
        check_decode(layer, np.asarray(got[0][l]), np.asarray(got[1][l]), f"layer {l}")


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("s_q,h_q", [(1, 128), (2, 16)])
def test_gpu_eager_jax_bits_equal_eager(rng, s_q, h_q):
    gpu = jax_gpu()
    case = make_case(rng, [700, 1, 0, 129], h_q, s_q, 32, np.float16)
    meta = kf.get_mla_metadata(torch_cuda(case.seqlens), h_q, s_q)
    out, lse = kf.mla_decode(torch_cuda(case.q), torch_cuda(case.cache),
                             torch_cuda(case.block_table), torch_cuda(case.seqlens), meta,
                             softmax_scale=case.scale)
    with jax.default_device(gpu):
        q, c, bt, sl = put(case.q, case.cache, case.block_table, case.seqlens, device=gpu)
        g_meta = kfj.get_mla_metadata(sl, h_q, s_q)
        g_out, g_lse = kfj.mla_decode(q, c, bt, sl, g_meta, softmax_scale=case.scale)
    assert bits(g_meta) == bits(host(meta))
    assert bits(g_out) == bits(host(out)) and bits(g_lse) == bits(host(lse))
    check_decode(case, np.asarray(g_out), np.asarray(g_lse), "GPU")


# Command buffers for fusions, custom calls (the FFI handlers marked compatible) and the
# dynamic-slice fusions XLA wraps around a call whose operands are slices (here each layer's
# cache, q and kv of the stacked arrays), even for a single command.
COMMAND_BUFFERS = {"xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL,DYNAMIC_SLICE_FUSION",
                   "xla_gpu_graph_min_graph_size": 1}


def unrolled_step(h_q, scale, layers):
    """A decode step with the layers unrolled (no while loop): metadata, then append and decode
    per layer (on slices of the stacked per-layer arrays)."""

    def step(qs, caches, kvs, bt, sl, slots):
        meta = kfj.get_mla_metadata(sl, h_q)
        outs, lses, new_caches = [], [], []
        for l in range(layers):
            cache = kfj.cache_append(kvs[l], caches[l], slots)
            out, lse = kfj.mla_decode(qs[l], cache, bt, sl, meta, softmax_scale=scale)
            outs.append(out), lses.append(lse), new_caches.append(cache)
        return outs, lses, new_caches

    return step


@pytest.mark.gpu
@pytest.mark.needs_torch
def test_gpu_command_buffers_bits_equal_eager(rng):
    gpu = jax_gpu()
    step = jax.jit(unrolled_step(16, SCALE, 3), compiler_options=COMMAND_BUFFERS)
    for _ in range(4):  # one shape: XLA's warm-up run, recorded, then replayed with new values
        case, caches, qs, kvs, slots = layer_problem(rng, 3, [500, 64, 3], 16, 64, "bfloat16",
                                                     extra_columns=1)
        want = torch_layers(case, caches, qs, kvs, slots)
        with jax.default_device(gpu):
            args = put(qs, caches, kvs, case.block_table, case.seqlens, slots, device=gpu)
            got = step(*args)
        check_layers(got, want)


# XLA records a command-buffer-compatible custom call by capturing its stream: the handlers
# count the calls they get while the stream is capturing (kernelflow.jax.cuda_call_counts). The
# first execution of a compiled step runs its custom calls one by one (XLA's warm-up); the next
# records them, and a later one records again where buffer addresses changed. One shape, so one
# compilation, over three executions with new arrays.
@pytest.mark.gpu
def test_gpu_custom_calls_recorded_in_command_buffers(rng):
    gpu = jax_gpu()
    step = jax.jit(unrolled_step(16, SCALE, 3), compiler_options=COMMAND_BUFFERS)
    targets = ("kernelflow_mla_metadata", "kernelflow_cache_append", "kernelflow_mla_decode")
    before = kfj.cuda_call_counts()
    for _ in range(3):
        case, caches, qs, kvs, slots = layer_problem(rng, 3, [500, 64, 3], 16, 64, "bfloat16",
                                                     extra_columns=1)
        with jax.default_device(gpu):
            args = put(qs, caches, kvs, case.block_table, case.seqlens, slots, device=gpu)
            jax.block_until_ready(step(*args))
    cache_size = getattr(step, "_cache_size", None)  # a private jax.jit method (jax 0.10, 0.11)
    if cache_size is not None:
        assert cache_size() == 1, "the step compiled more than once"
    after = kfj.cuda_call_counts()
    recorded = {t: after[t][1] - before[t][1] for t in targets}
    assert all(n > 0 for n in recorded.values()), f"calls recorded into command buffers: {recorded}"


def test_cuda_call_counts_are_pairs():
    counts = kfj.cuda_call_counts()
    assert {"kernelflow_mla_metadata", "kernelflow_mla_decode", "kernelflow_cache_append"} <= set(counts)
    for calls, recorded in counts.values():
        assert 0 <= recorded <= calls


@pytest.mark.gpu
def test_gpu_error_buffer_flags_under_jit(rng):
    gpu = jax_gpu()
    case = make_case(rng, [100, 60, 80], 16, 1, 32, BF16 or np.float16, extra_columns=1)
    bad = case.cache.shape[0]
    case.block_table[0, 1] = bad
    cache, kv, slots, _ = append_problem(rng)
    slots[1] = cache.shape[0] * cache.shape[1]

    @jax.jit
    def step(q, c, bt, sl, kv, cache, slots, err_decode, err_append):
        meta = kfj.get_mla_metadata(sl, 16)
        out, lse, err_decode = kfj.mla_decode(q, c, bt, sl, meta, softmax_scale=SCALE,
                                              error_buffer=err_decode)
        _, err_append = kfj.cache_append(kv, cache, slots, error_buffer=err_append)
        return out, err_decode, err_append

    with jax.default_device(gpu):
        out, err_decode, err_append = step(*put(
            case.q, case.cache, case.block_table, case.seqlens, kv, cache, slots,
            kfj.new_error_buffer(), kfj.new_error_buffer(), device=gpu))
    assert np.asarray(err_decode).tolist() == [kf.DEVERR_PAGE_RANGE, 0, bad, 0]
    assert np.asarray(err_append).tolist() == [kf.DEVERR_SLOT_RANGE, 1, int(slots[1]), 0]
    assert np.isfinite(np.asarray(out[0], np.float32)).all(), "the masked request stays finite"
    with pytest.raises(ValueError, match=r"block_table entry in use outside"):
        kfj.check_errors(err_decode)


# ---- the skinny GEMM ------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(8, 300, 2048), (64, 96, 1024)])  # narrow; split k (workspace)
def test_linear_jit_bits_equal_eager(rng, m, n, k):
    x = rng.standard_normal((m, k)).astype(BF16)
    w = (rng.standard_normal((n, k)) * 0.05).astype(BF16)
    want = kf.linear(x, w)
    got = jax.jit(kfj.linear)(*put(x, w))
    assert got.shape == (m, n) and got.dtype == jnp.bfloat16
    assert bits(got) == bits(want)
    with pytest.raises(Exception, match=r"x\.shape\[1\] \(k\): expected a multiple of 64"):
        kfj.linear(*put(x[:, :100], w[:, :100]))
    with pytest.raises(ValueError, match=r"x: expected shape \[m, k\]"):
        kfj.linear(*put(x[None], w))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(8, 300, 2048), (64, 2048, 2048)])
def test_linear_gpu_jit_equals_eager_gpu(rng, m, n, k):
    import torch

    gpu = jax.devices("gpu")[0]
    x = rng.standard_normal((m, k)).astype(BF16)
    w = (rng.standard_normal((n, k)) * 0.05).astype(BF16)
    want = kf.linear(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda(),
                     torch.from_numpy(w.view(np.int16)).view(torch.bfloat16).cuda())
    run = jax.jit(kfj.linear)
    for _ in range(2):
        got = run(*put(x, w, device=gpu))
        assert bits(got) == bits(want.cpu().view(torch.int16).numpy().view(BF16))
