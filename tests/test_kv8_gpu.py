"""8-bit KV caches (fp8_e4m3, int8) on the GPU against the CPU backend: quantize-on-write bytes,
canary (no byte outside the written tokens' slots changes), bulk conversion bytes, decode on the
same 8-bit cache (worst row < 1e-5, lse < 1e-4), bit-identical reruns, CUDA graph replay ==
eager. The CPU-only tests at the top (conversion, canary on every section, validation) run in CI;
the GPU ones skip without a usable CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

import kernelflow as kf
from graph_util import capture_graph
from inputs import HEAD, LATENT, make_case, numpy_dtype
from kernel_family import kernel_family_8bit  # noqa: F401  (the fixture)
from kernelflow import reference as ref

BYTES_8BIT = 644
FORMATS = ["fp8_e4m3", "int8"]


def tricky_rows(rng, n, dtype):
    """N(0,1) rows plus what makes quantization interesting: zero latents, huge and tiny
    magnitudes (e4m3 subnormals after scaling), a few large channels, exact ties."""
    x = rng.standard_normal((n, HEAD)).astype(np.float32)
    x[1::6, :LATENT] = 0.0
    x[2::6] *= 1000.0
    x[3::6, :LATENT] *= 1e-4
    x[4::6, 3:LATENT:64] *= 40.0
    x[5::6] = np.round(x[5::6] * 4) / 4
    return x if dtype == "float32" else x.astype(numpy_dtype(dtype))


def section_mask(page_size, num_pages, slots):
    """bool [num_pages, page_size * 644]: the bytes of the tokens at `slots` (latent, rope,
    scale sections of core/kv_format8.h)."""
    m = np.zeros((num_pages, page_size * BYTES_8BIT), bool)
    for s in slots:
        if s < 0:
            continue
        page, t = divmod(int(s), page_size)
        m[page, t * 512:(t + 1) * 512] = True
        m[page, page_size * 512 + t * 128:page_size * 512 + (t + 1) * 128] = True
        m[page, page_size * 640 + t * 4:page_size * 640 + (t + 1) * 4] = True
    return m


# ---- CPU: conversion, canary, validation ---------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("page", [16, 64])
def test_cpu_convert_equals_append_of_every_slot(rng, fmt, dtype, page):
    num_pages = 5
    src = tricky_rows(rng, num_pages * page, dtype).reshape(num_pages, page, HEAD)
    got = kf.convert_cache(src, kv_format=fmt)
    assert got.dtype == np.uint8 and got.shape == (num_pages, page, BYTES_8BIT)
    want = np.full_like(got, 0x33)
    kf.cache_append(src.reshape(-1, HEAD), want, np.arange(num_pages * page, dtype=np.int64),
                    kv_format=fmt)
    assert np.array_equal(got, want)
    # In place into a given cache (4-D source too).
    dst = np.full_like(got, 0x77)
    assert kf.convert_cache(src[:, :, None, :], dst, kv_format=fmt) is dst
    assert np.array_equal(dst, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_append_canary_every_section(rng, fmt):
    page, num_pages, n = 32, 4, 23
    cache = rng.integers(0, 256, (num_pages, page, BYTES_8BIT), dtype=np.uint8)
    before = cache.copy()
    slots = rng.choice(num_pages * page, n, replace=False).astype(np.int64)
    slots[::5] = -1
    kf.cache_append(tricky_rows(rng, n, "float16"), cache, slots, kv_format=fmt)
    outside = ~section_mask(page, num_pages, slots)
    flat, flat0 = cache.reshape(num_pages, -1), before.reshape(num_pages, -1)
    assert np.array_equal(flat[outside], flat0[outside])


def test_cpu_convert_validation(rng):
    src = np.zeros((3, 16, HEAD), np.float16)
    with pytest.raises(ValueError, match="kv_format"):
        kf.convert_cache(src, kv_format="bf16")
    with pytest.raises(ValueError, match="page_size"):
        kf.convert_cache(np.zeros((3, 8, HEAD), np.float16), kv_format="int8")
    with pytest.raises(ValueError, match="num_pages"):
        kf.convert_cache(src, np.zeros((2, 16, BYTES_8BIT), np.uint8), kv_format="int8")
    with pytest.raises(ValueError, match="^dst: "):
        kf.convert_cache(src, np.zeros((3, 16, BYTES_8BIT), np.int8), kv_format="int8")
    buf = np.zeros(3 * 16 * HEAD * 2, np.uint8)  # the 8-bit cache inside the source's bytes
    with pytest.raises(ValueError, match="overlap"):
        kf.convert_cache(buf.view(np.float16).reshape(3, 16, HEAD),
                         buf[: 3 * 16 * BYTES_8BIT].reshape(3, 16, BYTES_8BIT), kv_format="int8")


# ---- GPU -----------------------------------------------------------------------------------


def torch_mod():
    import torch

    return torch


def tdtype(name):
    return getattr(torch_mod(), name)


def to_torch(x, dtype):
    torch = torch_mod()
    return torch.from_numpy(np.asarray(x, np.float32)).to(tdtype(dtype))


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("page", [16, 64, 256])
def test_gpu_append_bytes_equal_cpu_and_canary(rng, fmt, dtype, page):
    torch = torch_mod()
    num_pages, n = 5, 2 * page + 7
    kv = to_torch(tricky_rows(rng, n, "float32"), dtype)
    cache = torch.from_numpy(rng.integers(0, 256, (num_pages, page, BYTES_8BIT), dtype=np.uint8))
    slots = torch.from_numpy(rng.choice(num_pages * page, n, replace=False).astype(np.int64))
    slots[::7] = -1
    gcache = cache.cuda()
    err = kf.new_error_buffer(gcache)
    bad = slots.clone()
    bad[1] = num_pages * page + 3  # reported and skipped
    kf.cache_append(kv.cuda(), gcache, bad.cuda(), kv_format=fmt, error_buffer=err)
    ccache = cache.clone()
    ccache_slots = bad.clone()
    ccache_slots[1] = -1  # the CPU API refuses out-of-range slots: skip it there
    kf.cache_append(kv, ccache, ccache_slots, kv_format=fmt)
    got = gcache.cpu()
    assert torch.equal(got, ccache), "GPU bytes differ from the CPU backend's"
    outside = torch.from_numpy(~section_mask(page, num_pages, ccache_slots.numpy()))
    assert torch.equal(got.reshape(num_pages, -1)[outside], cache.reshape(num_pages, -1)[outside])
    assert err.tolist()[:2] == [kf.DEVERR_SLOT_RANGE, 1]


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_convert_bytes_equal_cpu(rng, fmt, dtype):
    torch = torch_mod()
    src = to_torch(tricky_rows(rng, 7 * 32, "float32"), dtype).reshape(7, 32, HEAD)
    got = kf.convert_cache(src.cuda(), kv_format=fmt)
    assert got.is_cuda and got.dtype == torch.uint8
    assert torch.equal(got.cpu(), kf.convert_cache(src, kv_format=fmt))


def decode(q, cache8, bt, sl, scale, fmt, **kw):
    meta = kf.get_mla_metadata(sl, q.shape[2], q.shape[1], num_workers=kw.pop("num_workers", None),
                               kv_format=fmt)
    return kf.mla_decode(q, cache8, bt, sl, meta, softmax_scale=scale, kv_format=fmt, **kw)


def case8(rng, seqlens, h_q, s_q, page, dtype, fmt):
    """A case whose cache is converted to `fmt` (NaN in unused rows stays out of the 8-bit cache:
    those slots get 0xFF bytes, NaN in every section)."""
    torch = torch_mod()
    case = make_case(rng, seqlens, h_q, s_q, page, np.float32)
    flat = case.cache.reshape(-1, HEAD)
    used = ~np.isnan(flat).any(axis=1)
    cache8 = np.full((case.cache.shape[0], page, BYTES_8BIT), 0xFF, np.uint8)
    kv = to_torch(np.nan_to_num(flat), "bfloat16")
    kf.cache_append(kv, torch.from_numpy(cache8),
                    torch.from_numpy(np.where(used, np.arange(flat.shape[0]), -1).astype(np.int64)),
                    kv_format=fmt)
    q = to_torch(case.q, dtype)
    return case, q, torch.from_numpy(cache8), torch.from_numpy(case.block_table), \
        torch.from_numpy(case.seqlens)


@pytest.mark.usefixtures("kernel_family_8bit")
@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page,h_q,s_q", [(16, 16, 1), (32, 128, 1), (64, 16, 2), (128, 64, 2),
                                          (256, 8, 4)])
def test_gpu_decode_matches_cpu_backend(rng, fmt, dtype, page, h_q, s_q):
    torch = torch_mod()
    seqlens = [0, 1, 63, 64, 65, 1000, 4097, 2]
    case, q, cache8, bt, sl = case8(rng, seqlens, h_q, s_q, page, dtype, fmt)
    out_g, lse_g = decode(q.cuda(), cache8.cuda(), bt.cuda(), sl.cuda(), case.scale, fmt)
    out_c, lse_c = decode(q, cache8, bt, sl, case.scale, fmt)
    out_g, lse_g = out_g.float().cpu().numpy(), lse_g.cpu().numpy()
    out_c, lse_c = out_c.float().numpy(), lse_c.numpy()
    what = f"{fmt} {dtype} page={page} h_q={h_q} s_q={s_q}"
    assert np.array_equal(np.isneginf(lse_c).any(axis=1), ~ref.sees_any(seqlens, s_q)), what
    vs_cpu = ref.agreement(out_g, lse_g, out_c, lse_c)
    assert vs_cpu.ok, f"{what}: {vs_cpu}"


@pytest.mark.usefixtures("kernel_family_8bit")
@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype,mag", [("bfloat16", 2.0**20), ("bfloat16", 2.0**-30),
                                       ("float16", 2.0**8), ("float16", 2.0**-10)])
def test_gpu_decode_8bit_q_magnitudes(rng, fmt, dtype, mag):
    """The 8-bit path runs the latent mma in fp16 with q scaled by a power of two per row: q far
    outside fp16's range (bf16) or near its subnormals, and rows of different magnitudes."""
    torch = torch_mod()
    seqlens, h_q, page = [700, 64, 3001], 16, 64
    case, _, cache8, bt, sl = case8(rng, seqlens, h_q, 1, page, dtype, fmt)
    row_mag = mag * 2.0 ** (np.arange(h_q) % 5)[None, None, :, None]  # 1x .. 16x across heads
    q = to_torch(case.q * row_mag, dtype)
    assert torch.isfinite(q.float()).all(), "the test's own q must be finite in its dtype"
    scale = case.scale / mag
    out_g, lse_g = decode(q.cuda(), cache8.cuda(), bt.cuda(), sl.cuda(), scale, fmt)
    out_c, lse_c = decode(q, cache8, bt, sl, scale, fmt)
    what = f"{fmt} {dtype} |q| ~ {mag:g}"
    vs_cpu = ref.agreement(out_g.float().cpu().numpy(), lse_g.cpu().numpy(),
                           out_c.float().numpy(), lse_c.numpy())
    assert vs_cpu.ok, f"{what}: {vs_cpu}"


@pytest.mark.usefixtures("kernel_family_8bit")
@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_decode_8bit_reruns_bit_identical(rng, fmt):
    torch = torch_mod()
    case, q, cache8, bt, sl = case8(rng, [20000, 3000, 1, 0, 777], 16, 1, 64, "bfloat16", fmt)
    args = (q.cuda(), cache8.cuda(), bt.cuda(), sl.cuda(), case.scale, fmt)
    runs = [decode(*args) for _ in range(3)]
    for out, lse in runs[1:]:
        assert torch.equal(out.view(torch.int16), runs[0][0].view(torch.int16))
        assert torch.equal(lse.view(torch.int32), runs[0][1].view(torch.int32))


@pytest.mark.usefixtures("kernel_family_8bit")
@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt,dtype", [("fp8_e4m3", "bfloat16"), ("int8", "float16")])
def test_gpu_graph_replay_equals_eager_8bit(rng, fmt, dtype):
    """Append + metadata + decode captured once; replays with new rows, lengths and block
    tables give the bits of eager calls."""
    torch = torch_mod()
    h_q, page, b, max_pages = 16, 64, 4, 24
    num_pages = b * max_pages + 4
    pool = kf.convert_cache(torch.randn(num_pages, page, HEAD, device="cuda").to(torch.bfloat16),
                            kv_format=fmt)
    q = torch.randn(b, 1, h_q, HEAD, device="cuda").to(tdtype(dtype))
    new_rows = torch.zeros(b, HEAD, device="cuda", dtype=torch.bfloat16)
    slots = torch.zeros(b, dtype=torch.int64, device="cuda")
    static_bt = torch.zeros(b, max_pages, dtype=torch.int32, device="cuda")
    static_sl = torch.ones(b, dtype=torch.int32, device="cuda")
    workers = kf.default_num_workers(q, h_q, 1, kv_format=fmt)
    meta = torch.empty(kf.metadata_size(b, workers), dtype=torch.int32, device="cuda")
    workspace = kf.new_workspace(q, meta)
    out = torch.empty(b, 1, h_q, LATENT, dtype=q.dtype, device="cuda")
    lse = torch.empty(b, h_q, 1, device="cuda")

    def step():
        kf.cache_append(new_rows, pool, slots, kv_format=fmt)
        kf.get_mla_metadata(static_sl, h_q, 1, out=meta, kv_format=fmt)
        kf.mla_decode(q, pool, static_bt, static_sl, meta, softmax_scale=0.114721, out=out,
                      lse=lse, workspace=workspace, kv_format=fmt)

    graph = capture_graph(torch, step)
    for _ in range(3):
        lens = torch.from_numpy(rng.integers(1, max_pages * page, b).astype(np.int32)).cuda()
        perm = torch.randperm(num_pages, device="cuda")[: b * max_pages].int().reshape(b, max_pages)
        static_sl.copy_(lens)
        static_bt.copy_(perm)
        new_rows.copy_(torch.randn(b, HEAD, device="cuda").to(torch.bfloat16))
        last = (lens.long() - 1)
        slots.copy_(perm.long().gather(1, (last // page)[:, None])[:, 0] * page + last % page)
        snapshot = pool.clone()
        graph.replay()
        torch.cuda.synchronize()
        g_out, g_lse, g_pool = out.clone(), lse.clone(), pool.clone()
        pool.copy_(snapshot)
        step()
        torch.cuda.synchronize()
        assert torch.equal(g_pool, pool)
        assert torch.equal(g_out.view(torch.int16), out.view(torch.int16))
        assert torch.equal(g_lse.view(torch.int32), lse.view(torch.int32))
