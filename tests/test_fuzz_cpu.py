"""Property-based tests (hypothesis) of the CPU backend against the float64 reference
(kernelflow.reference): shapes, lengths, page sizes (powers of two), cache formats (bf16, fp16,
fp8_e4m3, int8), s_q 1..4, worker counts, garbage in unused block-table columns and NaN in page
padding. Bad device-side contents on the CPU are rejected with a ValueError naming the value,
before anything is written. Small shapes: the whole file runs in well under a minute on two cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
ml_dtypes = pytest.importorskip("ml_dtypes")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import kernelflow as kf  # noqa: E402
from kernelflow import reference as ref  # noqa: E402

HEAD, LATENT, ROPE, BYTES_8BIT = ref.HEAD_DIM, ref.LATENT_DIM, ref.ROPE_DIM, 644
BF16 = np.dtype(ml_dtypes.bfloat16)
NP_DTYPES = {"bfloat16": BF16, "float16": np.dtype(np.float16)}
EIGHT_BIT = ("fp8_e4m3", "int8")
PAGES_16 = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PAGES_8 = [16, 32, 64, 128, 256]
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
# The 8-bit caches are judged against the reference on their own dequantized values, so the
# 16-bit bounds of docs/spec.md section 4 apply to every format.
# Work per example (query rows x cached tokens) stays under this, so the file stays fast.
MAX_WORK = 200_000

FUZZ = settings(max_examples=250, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- the 8-bit page map of docs/formats.md ---------------------------------------------------

def page_sections(cache8: np.ndarray, page_size: int):
    """Views of the byte map of docs/formats.md: per page all latents, all rope parts, all
    scales. Returns latent [pages, ps, 512] u8, rope [pages, ps, 64] u16, scale [pages, ps] f32."""
    flat = cache8.reshape(cache8.shape[0], -1)
    ps = page_size
    latent = flat[:, : ps * LATENT].reshape(-1, ps, LATENT)
    rope = flat[:, ps * LATENT : ps * (LATENT + 2 * ROPE)].copy().view(np.uint16).reshape(-1, ps, ROPE)
    scale = flat[:, ps * (LATENT + 2 * ROPE) :].copy().view(np.float32).reshape(-1, ps)
    return latent, rope, scale


def check_against_reference(out, lse, b: "Built", p: "Problem", what):
    """Within docs/spec.md section 4's bounds of the reference on the rows the cache holds."""
    o_ref, lse_ref = ref.mla_decode_ref(b.q, b.rows, b.seqlens, p.softmax_scale)
    result = ref.agreement(out, lse, o_ref, lse_ref)
    assert result.ok, f"{what}: {result}"


# ---- random problems ---------------------------------------------------------------------------

@dataclass
class Problem:
    fmt: str
    dtype: str
    page: int
    s_q: int
    h_q: int
    seqlens: list
    num_workers: int
    extra_columns: int
    table_pad: int
    softmax_scale: float
    q_std: float
    cache_4d: bool
    seed: int


@st.composite
def problems(draw, formats=("bf16", "fp16", "fp8_e4m3", "int8")):
    fmt = draw(st.sampled_from(formats))
    if fmt in EIGHT_BIT:
        dtype = draw(st.sampled_from(["bfloat16", "float16"]))
        page = draw(st.sampled_from(PAGES_8))
    else:
        dtype = "bfloat16" if fmt == "bf16" else "float16"
        page = draw(st.sampled_from(PAGES_16))
    s_q = draw(st.integers(1, 4))
    h_q = draw(st.sampled_from([1, 2, 3, 8, 16, 31, 64, 128]))
    batch = draw(st.integers(1, 4))
    # Lengths: edge values (0, below s_q, page and tile boundaries) and random ones, within the
    # work budget.
    max_len = max(1, min(400, MAX_WORK // (h_q * s_q * batch)))
    edge = st.sampled_from([0, 1, 2, 3, 63, 64, 65, 128, page - 1, page, page + 1])
    lengths = st.one_of(edge, st.integers(0, max_len)).map(lambda n: max(0, min(n, max_len)))
    seqlens = draw(st.lists(lengths, min_size=batch, max_size=batch))
    return Problem(
        fmt=fmt, dtype=dtype, page=page, s_q=s_q, h_q=h_q, seqlens=seqlens,
        num_workers=draw(st.integers(1, 48)),
        extra_columns=draw(st.integers(0, 2)),
        table_pad=draw(st.sampled_from([0, -1, INT32_MAX, INT32_MIN, 77777])),
        softmax_scale=draw(st.sampled_from([0.114721, 0.135234, 576**-0.5, 0.0, -0.05])),
        q_std=draw(st.sampled_from([0.5, 1.0, 3.0])),
        cache_4d=fmt not in EIGHT_BIT and draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@dataclass
class Built:
    q: np.ndarray            # [b, s_q, h, 576] storage dtype
    cache: np.ndarray        # 16-bit [pages, ps, (1,) 576] or uint8 [pages, ps, 644]
    block_table: np.ndarray  # int32 [b, max_pages]
    seqlens: np.ndarray      # int32 [b]
    rows: list               # float64 [len, 576] per request: what the reference sees
    used_pages: list         # pages of request r in order


def build(p: Problem) -> Built:
    rng = np.random.default_rng(p.seed)
    dt = NP_DTYPES[p.dtype]
    batch = len(p.seqlens)
    need = [math.ceil(n / p.page) for n in p.seqlens]
    max_pages = max(need + [1]) + p.extra_columns
    num_pages = sum(need) + int(rng.integers(1, 4))  # spare pages keep the padding
    perm = rng.permutation(num_pages).astype(np.int32)
    block_table = np.full((batch, max_pages), p.table_pad, np.int32)
    q = (rng.standard_normal((batch, p.s_q, p.h_q, HEAD), dtype=np.float32) * p.q_std).astype(dt)
    used, start = [], 0
    for r in range(batch):
        pages = perm[start : start + need[r]]
        start += need[r]
        block_table[r, : need[r]] = pages
        used.append(pages)
    token_rows = [rng.standard_normal((n, HEAD), dtype=np.float32).astype(dt) for n in p.seqlens]
    if p.fmt in EIGHT_BIT:
        cache = np.full((num_pages, p.page, BYTES_8BIT), 0xFF, np.uint8)  # NaN codes and scales
        rows = []
        all_rows, all_slots = [], []
        for r, n in enumerate(p.seqlens):
            rows.append(ref.dequantize_8bit(ref.quantize_8bit(token_rows[r], p.fmt), p.fmt))
            t = np.arange(n)
            all_slots.append(used[r][t // p.page].astype(np.int64) * p.page + t % p.page)
            all_rows.append(token_rows[r])
        kv = np.concatenate(all_rows)
        slots = np.concatenate(all_slots).astype(np.int64)
        if len(slots):  # zero rows: test_append_of_zero_rows_is_a_no_op
            kf.cache_append(kv, cache, slots, kv_format=p.fmt)
            check_8bit_bytes(cache, p.page, kv, slots, p.fmt)
    else:
        cache = np.full((num_pages, p.page, HEAD), np.nan, np.float32).astype(dt)
        for r, n in enumerate(p.seqlens):
            flat = cache[used[r]].reshape(-1, HEAD)
            flat[:n] = token_rows[r]
            cache[used[r]] = flat.reshape(-1, p.page, HEAD)
        rows = [tr.astype(np.float64) for tr in token_rows]
        if p.cache_4d:
            cache = cache.reshape(num_pages, p.page, 1, HEAD)
    return Built(q, cache, block_table, np.array(p.seqlens, np.int32), rows, used)


def check_8bit_bytes(cache, page, kv, slots, fmt):
    """The bytes kf.cache_append wrote are docs/spec.md section 2's, by the reference quantizer."""
    if len(slots) == 0:
        return
    want = ref.quantize_8bit(kv, fmt)
    latent, rope, scales = page_sections(cache, page)
    pg, t = slots // page, slots % page
    assert np.array_equal(latent[pg, t], want.codes), f"{fmt}: latent codes differ from the spec's"
    assert np.array_equal(rope[pg, t], want.rope_bits), f"{fmt}: rope must be bf16 (RNE)"
    assert np.array_equal(scales[pg, t].view(np.uint32), want.scale.view(np.uint32)), \
        f"{fmt}: scales"


def decode(p: Problem, b: Built, **kw):
    metadata = kf.get_mla_metadata(b.seqlens, p.h_q, p.s_q, num_workers=p.num_workers)
    kv_format = p.fmt if p.fmt in EIGHT_BIT else None
    return kf.mla_decode(b.q, b.cache, b.block_table, b.seqlens, metadata,
                         softmax_scale=p.softmax_scale, kv_format=kv_format, **kw)


def poisoned_outputs(p: Problem, b: Built):
    dt = NP_DTYPES[p.dtype]
    batch = len(p.seqlens)
    out = np.full((batch, p.s_q, p.h_q, LATENT), np.nan, np.float32).astype(dt)
    lse = np.full((batch, p.h_q, p.s_q), np.nan, np.float32)
    return out, lse


# ---- properties --------------------------------------------------------------------------------

@FUZZ
@given(problems())
def test_decode_matches_float64_reference(p):
    """Every format, page size and shape: rows within docs/spec.md's bounds of the float64
    reference (for 8-bit caches, of the dequantized values), rows that see nothing exactly 0 and
    -inf, every output element written, and a rerun bit-identical."""
    b = build(p)
    out, lse = poisoned_outputs(p, b)
    decode(p, b, out=out, lse=lse)
    check_against_reference(out, lse, b, p, repr(p))
    out2, lse2 = poisoned_outputs(p, b)
    decode(p, b, out=out2, lse=lse2)
    assert out.view(np.uint16).tobytes() == out2.view(np.uint16).tobytes(), "rerun differs"
    assert lse.view(np.uint32).tobytes() == lse2.view(np.uint32).tobytes(), "rerun lse differs"


@settings(max_examples=80, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(formats=("bf16", "fp16")), st.integers(1, 48))
def test_worker_count_changes_only_rounding(p, other_workers):
    """The split schedule is an implementation detail: any worker count gives the reference."""
    b = build(p)
    p2 = Problem(**{**p.__dict__, "num_workers": other_workers})
    out1, lse1 = decode(p, b)
    out2, lse2 = decode(p2, b)
    check_against_reference(out1, lse1, b, p, repr(p))
    check_against_reference(out2, lse2, b, p, f"{other_workers} workers")


@FUZZ
@given(
    st.sampled_from(["bfloat16", "float16"]),
    st.sampled_from(PAGES_16),
    st.integers(1, 6),
    st.integers(1, 40),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_append_16bit_lands_exactly(dtype, page, num_pages, n, cache_4d, seed):
    """Rows land bit for bit at their slots; negative slots (any negative value) are skipped;
    every other byte keeps its value."""
    rng = np.random.default_rng(seed)
    dt = NP_DTYPES[dtype]
    num_slots = num_pages * page
    n = min(n, num_slots)
    kv = rng.standard_normal((n, HEAD), dtype=np.float32).astype(dt)
    slots = rng.permutation(num_slots)[:n].astype(np.int64)  # distinct
    skip = rng.random(n) < 0.25
    slots[skip] = rng.choice([-1, -2, -(2**40), np.iinfo(np.int64).min], skip.sum())
    cache = np.full((num_pages, page, HEAD), np.nan, np.float32).astype(dt)
    if cache_4d:
        cache = cache.reshape(num_pages, page, 1, HEAD)
    before = cache.copy()
    kf.cache_append(kv, cache, slots)
    flat, flat_before = cache.reshape(-1, HEAD), before.reshape(-1, HEAD)
    written = np.zeros(num_slots, bool)
    for i, s in enumerate(slots):
        if s >= 0:
            assert flat[s].view(np.uint16).tobytes() == kv[i].view(np.uint16).tobytes(), f"row {i}"
            written[s] = True
    assert flat[~written].view(np.uint16).tobytes() == flat_before[~written].view(np.uint16).tobytes()


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "int8"])
def test_append_of_zero_rows_is_a_no_op(fmt):
    """n = 0 rows straight from NumPy (np.empty((0, 576)), whose strides are 0): nothing to do."""
    dt = BF16 if fmt in ("bf16", "fp8_e4m3") else np.dtype(np.float16)
    if fmt in EIGHT_BIT:
        cache = np.full((2, 16, BYTES_8BIT), 0xA5, np.uint8)
    else:
        cache = np.full((2, 16, HEAD), np.nan, np.float32).astype(dt)
    before = cache.copy()
    kf.cache_append(np.empty((0, HEAD), dt), cache, np.empty((0,), np.int64),
                    kv_format=fmt if fmt in EIGHT_BIT else None)
    assert cache.tobytes() == before.tobytes()


BAD_KINDS = ["seqlen_negative", "seqlen_beyond_table", "page_negative", "page_too_big",
             "slot_beyond_cache"]


@settings(max_examples=120, deadline=None, database=None, print_blob=True)
@given(problems(formats=("bf16", "fp16")), st.sampled_from(BAD_KINDS), st.integers(0, 2**32 - 1))
def test_bad_contents_rejected_on_cpu(p, kind, seed):
    """What a kernel would have to mask on the GPU, the CPU backend sees and rejects: a
    ValueError naming the argument and index, and the outputs keep their poison."""
    rng = np.random.default_rng(seed)
    b = build(p)
    r = int(rng.integers(0, len(p.seqlens)))
    num_pages = b.cache.shape[0]
    if kind == "slot_beyond_cache":
        dt = NP_DTYPES[p.dtype]
        num_slots = num_pages * p.page
        bad = int(rng.choice([num_slots, num_slots + 1, 2**40, np.iinfo(np.int64).max]))
        kv = rng.standard_normal((3, HEAD), dtype=np.float32).astype(dt)
        slots = np.array([0, bad, -1], np.int64)
        before = b.cache.copy()
        with pytest.raises(ValueError, match=r"slot_mapping\[1\] = " + str(bad)):
            kf.cache_append(kv, b.cache, slots)
        assert b.cache.view(np.uint16).tobytes() == before.view(np.uint16).tobytes(), "wrote"
        return
    cap = b.block_table.shape[1] * p.page
    if kind == "seqlen_negative":
        b.seqlens[r] = int(rng.choice([-1, -7, INT32_MIN]))
        match = rf"cache_seqlens\[{r}\] = {b.seqlens[r]}"
    elif kind == "seqlen_beyond_table":
        b.seqlens[r] = int(rng.choice([cap + 1, cap + p.page, INT32_MAX]))
        match = rf"cache_seqlens\[{r}\] = {b.seqlens[r]}"
    else:
        if p.seqlens[r] == 0:
            b.seqlens[r] = 1
            b.block_table[r, 0] = 0
        j = int(rng.integers(0, math.ceil(int(b.seqlens[r]) / p.page)))
        bad = int(rng.choice([-1, INT32_MIN]) if kind == "page_negative"
                  else rng.choice([num_pages, num_pages + 5, INT32_MAX]))
        b.block_table[r, j] = bad
        match = rf"block_table\[{r}, {j}\] = {bad}"
    if kind == "seqlen_negative":  # the metadata call refuses it already
        with pytest.raises(ValueError, match=match):
            kf.get_mla_metadata(b.seqlens, p.h_q, p.s_q, num_workers=p.num_workers)
        good = np.array(p.seqlens, np.int32)
        metadata = kf.get_mla_metadata(good, p.h_q, p.s_q, num_workers=p.num_workers)
    else:
        metadata = kf.get_mla_metadata(b.seqlens, p.h_q, p.s_q, num_workers=p.num_workers)
    out, lse = poisoned_outputs(p, b)
    with pytest.raises(ValueError, match=match):
        kf.mla_decode(b.q, b.cache, b.block_table, b.seqlens, metadata,
                      softmax_scale=p.softmax_scale, out=out, lse=lse)
    assert np.isnan(out.astype(np.float32)).all() and np.isnan(lse).all(), "outputs written"
