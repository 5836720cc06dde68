"""cache_append on the CPU backend: 16-bit rows land bit-exact at their slots, nothing else moves;
8-bit formats quantize as docs/spec.md section 2 says, into the page map of docs/formats.md."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kernelflow as kf
from inputs import HEAD, LATENT, bits, make_case, numpy_dtype
from kernelflow import reference as ref

BYTES_8BIT = 644


def random_slots(rng, num_slots, n, skip_fraction=0.2):
    slots = rng.choice(num_slots, size=n, replace=False).astype(np.int64)
    slots[rng.random(n) < skip_fraction] = -1
    return slots


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("page", [1, 16, 64, 256])
def test_append_16bit_lands_at_slots(rng, dtype, page):
    dt = numpy_dtype(dtype)
    num_pages = 5
    cache = np.full((num_pages, page, HEAD), np.nan, dt)
    before = cache.copy()
    n = min(37, num_pages * page)
    kv = rng.standard_normal((n, HEAD)).astype(dt)
    slots = random_slots(rng, num_pages * page, n)
    result = kf.cache_append(kv, cache, slots)
    assert result is cache
    flat, flat_before = cache.reshape(-1, HEAD), before.reshape(-1, HEAD)
    written = slots[slots >= 0]
    assert bits(flat[written]) == bits(kv[slots >= 0])
    untouched = np.setdiff1d(np.arange(num_pages * page), written)
    assert bits(flat[untouched]) == bits(flat_before[untouched])


def test_append_into_4d_cache_and_strided_kv(rng):
    cache = np.zeros((3, 16, 1, HEAD), np.float16)
    big = rng.standard_normal((10, 2 * HEAD)).astype(np.float16)
    kv = big[:, :HEAD]  # row stride 1152 elements
    slots = np.array([0, 47, 16, -5, 3, 20, 21, 22, 30, 31], np.int64)
    kf.cache_append(kv, cache, slots)
    flat = cache.reshape(-1, HEAD)
    for i, s in enumerate(slots):
        if s >= 0:
            assert bits(flat[s]) == bits(kv[i])
    assert not flat[[1, 2, 4]].any()


def test_append_then_decode(rng):
    """Rows written through cache_append are what decode reads."""
    page, seqlens = 16, [40, 17]
    case = make_case(rng, seqlens, 16, 1, page, np.float16)
    cache = np.full_like(case.cache, np.nan)
    rows, slots = [], []
    for r, n in enumerate(seqlens):
        for t in range(n):
            slot = int(case.block_table[r, t // page]) * page + t % page
            rows.append(case.cache.reshape(-1, HEAD)[slot])
            slots.append(slot)
    kf.cache_append(np.stack(rows), cache, np.array(slots, np.int64))
    metadata = kf.get_mla_metadata(case.seqlens, 16, 1)
    got = kf.mla_decode(case.q, cache, case.block_table, case.seqlens, metadata,
                        softmax_scale=case.scale)
    want = kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens, metadata,
                         softmax_scale=case.scale)
    assert bits(got[0]) == bits(want[0]) and bits(got[1]) == bits(want[1])


# ---- 8-bit formats --------------------------------------------------------------------------

def _page_sections(cache, page_size, page):
    """(latent bytes [ps, 512], rope bf16 bits [ps, 64], scales fp32 [ps]) of one page."""
    raw = cache[page].reshape(-1)
    latent = raw[: page_size * 512].reshape(page_size, 512)
    rope = raw[page_size * 512 : page_size * 640].view(np.uint16).reshape(page_size, 64)
    scale = raw[page_size * 640 : page_size * 644].view(np.float32)
    return latent, rope, scale


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_append_8bit_bytes(rng, fmt, dtype):
    dt = numpy_dtype(dtype)
    page_size, num_pages = 16, 4
    cache = np.full((num_pages, page_size, BYTES_8BIT), 0xA5, np.uint8)
    n = 20
    kv32 = rng.standard_normal((n, HEAD)).astype(np.float32)
    kv32[3, :LATENT] = 0.0          # amax 0: zeros and scale 0
    kv32[5, 7] = 1e4                # one large channel
    kv = kv32.astype(dt)
    free = np.setdiff1d(np.arange(num_pages * page_size), [1, 2])
    slots = rng.permutation(free)[:n].astype(np.int64)  # distinct: no row overwrites another
    slots[rng.random(n) < 0.1] = -1
    slots[3], slots[5] = 1, 2
    kf.cache_append(kv, cache, slots, kv_format=fmt)
    want = ref.quantize_8bit(kv.astype(np.float32), fmt)
    for i, s in enumerate(slots):
        if s < 0:
            continue
        page, t = divmod(int(s), page_size)
        latent, rope, scale = _page_sections(cache, page_size, page)
        assert bits(latent[t]) == bits(want.codes[i]), f"row {i}: latent bytes"
        assert bits(scale[t]) == bits(want.scale[i]), f"row {i}: scale"
        assert bits(rope[t]) == bits(want.rope_bits[i]), f"row {i}: rope must be bf16 (RNE)"
    # Slots nobody wrote keep their bytes.
    written = {int(s) for s in slots if s >= 0}
    for s in set(range(num_pages * page_size)) - written:
        page, t = divmod(s, page_size)
        latent, _, _ = _page_sections(cache, page_size, page)
        assert (latent[t] == 0xA5).all()


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_decode_8bit_accuracy(rng, fmt):
    """docs/spec.md section 4: against the float64 reference on the unquantized cache, N(0,1) data,
    softmax_scale 0.114721, s_k >= 1024: whole-output cosine distance below the bound."""
    page = 64
    seqlens = [1024, 1500, 2048]
    case = make_case(rng, seqlens, 16, 1, page, np.float16, spare_pages=0, extra_columns=0)
    num_pages = case.cache.shape[0]
    cache8 = np.zeros((num_pages, page, BYTES_8BIT), np.uint8)
    flat = case.cache.reshape(-1, HEAD)
    ok = ~np.isnan(flat).any(axis=1)
    slots = np.where(ok, np.arange(flat.shape[0]), -1).astype(np.int64)
    kf.cache_append(np.nan_to_num(flat), cache8, slots, kv_format=fmt)
    metadata = kf.get_mla_metadata(case.seqlens, 16, 1)
    out, lse = kf.mla_decode(case.q, cache8, case.block_table, case.seqlens, metadata,
                             softmax_scale=case.scale, kv_format=fmt)
    o_ref, _ = case.expected()
    whole = float(ref.cosine_distance(out, o_ref, axis=None))
    bound = ref.MAX_WHOLE_COS_DIST_8BIT[fmt]
    assert whole < bound, f"{fmt}: whole-output cosine distance {whole:.3g}"
    assert np.isfinite(lse).all() and math.isfinite(whole)
