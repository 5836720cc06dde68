"""kernelflow.flash_mla, FlashMLA's API (commit 9edee0c) over the library, on the CPU backend:
the shapes of FlashMLA's own test (tests/test_flash_mla.py there: h_kv 1, d 576, dv 512, page 64,
s_q 1 and 2, h_q 16..128) at small lengths, against the float64 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernelflow import reference as ref

torch = pytest.importorskip("torch")
from kernelflow.flash_mla import (  # noqa: E402  (needs torch)
    MlaMetadata,
    Schedule,
    flash_mla_with_kvcache,
    get_mla_metadata,
)

D, DV, PAGE = 576, 512, 64
FLASH_MLA_SCALE = D ** -0.5  # FlashMLA's default softmax_scale

# (seqlens, s_q, h_q): every s_q * h_q within the 128 query rows of one request; lengths of 0,
# shorter than s_q, one page, across pages.
SHAPES = [
    ([100, 0, 65], 1, 16),
    ([130, 1, 64], 2, 16),
    ([70, 200], 1, 32),
    ([1, 129, 0], 2, 32),
    ([64, 190], 1, 64),
    ([3, 77], 2, 64),
    ([150, 0], 1, 128),
]


def flash_mla_inputs(seqlens, s_q, h_q, dtype=torch.bfloat16, seed=0):
    """FlashMLA's test layout: q [b, s_q, h_q, 576], k_cache [blocks, 64, 1, 576] with each
    request's pages (here shuffled) listed in block_table, NaN past every request's length."""
    gen = torch.Generator().manual_seed(seed)
    b = len(seqlens)
    pages_per_seq = max(1, math.ceil(max(seqlens) / PAGE))
    num_blocks = b * pages_per_seq
    block_table = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(b, pages_per_seq)
    k_cache = torch.randn(num_blocks, PAGE, 1, D, generator=gen).to(dtype)
    for r, n in enumerate(seqlens):
        rows = k_cache[block_table[r].long()].view(-1, D)
        rows[n:] = float("nan")
        k_cache[block_table[r].long()] = rows.view(pages_per_seq, PAGE, 1, D)
    q = torch.randn(b, s_q, h_q, D, generator=gen).to(dtype)
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32)
    return q, k_cache, block_table, cache_seqlens


def expected(q, k_cache, block_table, cache_seqlens, causal, scale=FLASH_MLA_SCALE):
    """The reference's (out, lse) with the library's -inf lse for rows that see nothing.
    Without causality every row sees the whole cache: the rows of a request are computed as
    s_q * h_q heads of one query token."""
    b, s_q, h_q, _ = q.shape
    qf = q.float().numpy()
    kv = k_cache.float().numpy()
    table, seqlens = block_table.numpy(), cache_seqlens.numpy()
    if causal:
        return ref.mla_decode_ref(qf, kv, seqlens, scale, block_table=table)
    out, lse = ref.mla_decode_ref(qf.reshape(b, 1, s_q * h_q, D), kv, seqlens, scale,
                                  block_table=table)
    return out.reshape(b, s_q, h_q, DV), lse.reshape(b, s_q, h_q).transpose(0, 2, 1)


def check_against_reference(out, lse, want_out, want_lse, dtype=torch.bfloat16):
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert tuple(lse.shape) == want_lse.shape and lse.is_contiguous()
    empty = np.isneginf(want_lse)
    lse = lse.numpy()
    assert np.all(np.isposinf(lse[empty])), "FlashMLA reports +inf for rows that see nothing"
    assert not np.isneginf(lse).any()
    ours = np.where(np.isposinf(lse), -np.inf, lse)  # the reference's convention, to compare
    result = ref.agreement(out.float().numpy(), ours, want_out, want_lse)
    assert result.ok, str(result)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seqlens,s_q,h_q", SHAPES)
def test_matches_reference(seqlens, s_q, h_q, causal):
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs(seqlens, s_q, h_q)
    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // 1, 1)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV,
                                      tile_scheduler_metadata, num_splits, causal=causal)
    assert tuple(out.shape) == (len(seqlens), s_q, h_q, DV)
    check_against_reference(out, lse, *expected(q, k_cache, block_table, cache_seqlens, causal))


def test_causal_and_full_attention_differ_for_two_query_tokens():
    """With s_q = 2 the first row of a request sees one position fewer under causal=True."""
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs([40], 2, 16)
    meta = get_mla_metadata(cache_seqlens, 32, 1)
    causal_out, _ = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV, *meta,
                                           causal=True)
    full_out, _ = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV, *meta)
    assert not torch.equal(causal_out[:, 0], full_out[:, 0])
    assert torch.equal(causal_out[:, 1], full_out[:, 1])  # the last row sees everything either way


@pytest.mark.parametrize("causal", [True, False])
def test_float16_with_deepseek_scale(causal):
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs([90, 5], 2, 16, torch.float16)
    meta = get_mla_metadata(cache_seqlens, 32, 1)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV, *meta,
                                      softmax_scale=0.114721, causal=causal)
    want = expected(q, k_cache, block_table, cache_seqlens, causal, scale=0.114721)
    check_against_reference(out, lse, *want, dtype=torch.float16)


def test_empty_rows_are_zero_with_plus_inf_lse():
    """A request of length 0, and under causal=True the first row of a request of length 1."""
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs([0, 1], 2, 16)
    meta = get_mla_metadata(cache_seqlens, 32, 1)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV, *meta,
                                      causal=True)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == math.inf)
    assert torch.all(out[1, 0] == 0) and torch.all(lse[1, :, 0] == math.inf)
    assert torch.isfinite(lse[1, :, 1]).all()


def test_metadata_is_a_pair():
    cache_seqlens = torch.tensor([10, 0, 300], dtype=torch.int32)
    pair = get_mla_metadata(cache_seqlens, 64, 1)
    assert isinstance(pair, tuple) and isinstance(pair, MlaMetadata) and len(pair) == 2
    tile_scheduler_metadata, num_splits = pair
    assert isinstance(tile_scheduler_metadata, Schedule)
    assert tile_scheduler_metadata.num_heads_per_head_k == 64
    assert tile_scheduler_metadata.cache_seqlens is cache_seqlens
    assert pair.tile_scheduler_metadata is tile_scheduler_metadata
    assert pair.num_splits is num_splits
    assert isinstance(num_splits, torch.Tensor) and num_splits.dtype == torch.int32


def test_causal_schedule_is_made_once_per_layout():
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs([50, 20], 2, 16)
    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, 32, 1)
    first = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV,
                                   tile_scheduler_metadata, num_splits, causal=True)
    made = tile_scheduler_metadata.metadata(16, 2)
    second = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV,
                                    tile_scheduler_metadata, num_splits, causal=True)
    assert tile_scheduler_metadata.metadata(16, 2) is made
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


# ---- bad input: every message names FlashMLA's argument ----------------------------------------

@pytest.fixture
def good():
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs([30, 70], 1, 16)
    return dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=cache_seqlens,
                head_dim_v=DV, meta=get_mla_metadata(cache_seqlens, 16, 1))


def call(args, **changes):
    a = {**args, **changes}
    tile_scheduler_metadata, num_splits = a.pop("meta")
    tile_scheduler_metadata = a.pop("tile_scheduler_metadata", tile_scheduler_metadata)
    num_splits = a.pop("num_splits", num_splits)
    return flash_mla_with_kvcache(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"],
                                  a["head_dim_v"], tile_scheduler_metadata, num_splits)


@pytest.mark.parametrize("num_heads_k", [2, 8])
def test_metadata_refuses_several_kv_heads(num_heads_k):
    with pytest.raises(ValueError, match=r"^num_heads_k: expected 1"):
        get_mla_metadata(torch.zeros(2, dtype=torch.int32), 16, num_heads_k)


@pytest.mark.parametrize("rows", [0, 2049])
def test_metadata_refuses_rows_out_of_range(rows):
    with pytest.raises(ValueError, match=r"^num_heads_per_head_k: .*1\.\.2048"):
        get_mla_metadata(torch.zeros(2, dtype=torch.int32), rows, 1)


def test_metadata_needs_a_tensor():
    with pytest.raises(TypeError, match=r"^cache_seqlens: expected a torch.Tensor"):
        get_mla_metadata([3, 4], 16, 1)


def test_several_kv_heads_in_the_cache(good):
    k_cache = good["k_cache"].expand(-1, -1, 2, -1)
    with pytest.raises(ValueError, match=r"^k_cache: num_heads_k \(shape\[2\]\) must be 1"):
        call(good, k_cache=k_cache)


def test_cache_without_head_axis(good):
    with pytest.raises(ValueError, match=r"^k_cache: expected shape \[num_blocks"):
        call(good, k_cache=good["k_cache"][:, :, 0])


@pytest.mark.parametrize("head_dim_v", [576, 128, True])
def test_head_dim_v(good, head_dim_v):
    with pytest.raises(ValueError, match=r"^head_dim_v: expected 512"):
        call(good, head_dim_v=head_dim_v)


def test_q_head_dim(good):
    with pytest.raises(ValueError, match=r"^q: expected shape \[batch_size, seq_len_q"):
        call(good, q=good["q"][..., :512])


def test_causal_beyond_128_rows():
    """FlashMLA's test runs h_q 128 with s_q 2 (256 rows per request), causal: decoded with the
    library's schedule for (h_q, s_q)."""
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs([40, 7, 0], 2, 128)
    tile, splits = get_mla_metadata(cache_seqlens, 2 * 128, 1)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV, tile, splits,
                                      causal=True)
    check_against_reference(out, lse, *expected(q, k_cache, block_table, cache_seqlens, True))


def test_full_attention_rows_over_the_limit():
    """causal=False decodes the s_q * h_q rows as heads of one token: at most 128."""
    q, k_cache, block_table, cache_seqlens = flash_mla_inputs([40, 7], 2, 128)
    tile, splits = get_mla_metadata(cache_seqlens, 2 * 128, 1)
    with pytest.raises(ValueError, match=r"^causal: False with s_q \* h_q = 256"):
        flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, DV, tile, splits,
                               causal=False)


def test_q_heads_over_the_limit(good):
    q = torch.zeros(2, 1, 129, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^q: expected num_heads_q in 1\.\.128"):
        call(good, q=q)


def test_batch_mismatch(good):
    with pytest.raises(ValueError, match=r"^cache_seqlens: expected shape \[batch_size\]"):
        call(good, q=good["q"][:1])


def test_metadata_from_elsewhere(good):
    with pytest.raises(TypeError, match=r"^tile_scheduler_metadata: expected the first value"):
        call(good, tile_scheduler_metadata=torch.zeros(4, 8, dtype=torch.int32))


def test_metadata_for_other_heads(good):
    with pytest.raises(ValueError, match=r"^tile_scheduler_metadata: made by get_mla_metadata "
                                         r"for num_heads_per_head_k = 16, but q has .* 32"):
        call(good, q=torch.zeros(2, 1, 32, D, dtype=torch.bfloat16))


def test_cache_dtype_named_k_cache(good):
    with pytest.raises((ValueError, TypeError), match=r"k_cache"):
        call(good, k_cache=good["k_cache"].float())


def test_block_table_dtype(good):
    with pytest.raises((ValueError, TypeError), match=r"block_table"):
        call(good, block_table=good["block_table"].long())
