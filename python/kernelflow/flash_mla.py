"""FlashMLA's Python API (deepseek-ai/FlashMLA at commit 9edee0c) over kernelflow.

Code written for FlashMLA runs unchanged after changing its import:

    from kernelflow.flash_mla import get_mla_metadata, flash_mla_with_kvcache

    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512,
                                      tile_scheduler_metadata, num_splits, causal=True)

The names, argument order, defaults, shapes and dtypes of the results are FlashMLA's:

    q               [b, s_q, h_q, 576]  bfloat16 or float16, torch
    k_cache         [num_blocks, page_block_size, 1, 576]  dtype of q
    block_table     int32 [b, max_num_blocks_per_seq]
    cache_seqlens   int32 [b]
    out             [b, s_q, h_q, 512]  dtype of q
    softmax_lse     float32 [b, h_q, s_q], +inf for a row that sees no position

What differs from FlashMLA (docs/frameworks/flashmla.md says more):

- The pair get_mla_metadata returns is not FlashMLA's pair of int32 tensors.
  `tile_scheduler_metadata` is a Schedule: it keeps cache_seqlens and num_heads_per_head_k and
  makes the library's schedule for the (h_q, s_q, causal) of each flash_mla_with_kvcache call,
  once per such triple (FlashMLA's schedule does not know s_q, the library's causal rule needs
  it). `num_splits` is the library's metadata for the rows of one request flattened into
  s_q * h_q heads of one query token: the schedule of every s_q = 1 decode and of every
  causal=False one. Copying either into buffers of FlashMLA's shapes does not work.
- The library builds a schedule from the cache_seqlens values at the time it is built: the one
  in num_splits at get_mla_metadata, a causal s_q > 1 one at its first flash_mla_with_kvcache.
- num_heads_k (h_kv) must be 1 and head_dim_v 512; h_q up to 128 and s_q up to 16; full attention
  (causal=False with s_q > 1) up to 128 rows s_q * h_q per request.
- softmax_scale defaults to 576**-0.5 as in FlashMLA. That is not the DeepSeek models' scale:
  DeepSeek-V2 and V2-Lite use 0.114721, V3 0.135234 (docs/spec.md section 1). Pass it.
- Tensors on the CPU run the library's CPU backend; CUDA tensors run on sm_80 and newer.
"""

from __future__ import annotations

import re

import torch

from . import mla

HEAD_DIM = 576
HEAD_DIM_V = 512
MAX_HEADS = 128  # h_q, and the rows of one token decoded as heads (KF_MLA_MAX_HEADS)
MAX_SQ = 16  # the library's query tokens per request (KF_MLA_MAX_SQ)
MAX_ROWS = MAX_HEADS * MAX_SQ  # s_q * h_q

_KV_CACHE = re.compile(r"\bkv_cache\b")
_METADATA = re.compile(r"\bmetadata\b")


class Schedule:
    """FlashMLA's `tile_scheduler_metadata` here: what get_mla_metadata was given, and the
    library's schedules made from it, one per (h_q, s_q, causal) that decodes over it."""

    __slots__ = ("cache_seqlens", "num_heads_per_head_k", "_by_layout")

    def __init__(self, cache_seqlens, num_heads_per_head_k: int):
        self.cache_seqlens = cache_seqlens
        self.num_heads_per_head_k = num_heads_per_head_k
        self._by_layout = {}

    def flat(self):
        """The library's metadata for num_heads_per_head_k heads of one query token."""
        return self.metadata(self.num_heads_per_head_k, 1)

    def metadata(self, h_q: int, s_q: int):
        """The library's metadata for (h_q, s_q), made at the first request for it."""
        key = (h_q, s_q)
        if key not in self._by_layout:
            self._by_layout[key] = mla.get_mla_metadata(self.cache_seqlens, h_q, s_q)
        return self._by_layout[key]

    def __repr__(self) -> str:
        return (f"kernelflow.flash_mla.Schedule(batch={int(self.cache_seqlens.shape[0])}, "
                f"num_heads_per_head_k={self.num_heads_per_head_k}, "
                f"layouts={sorted(self._by_layout)})")


class MlaMetadata(tuple):
    """The pair (tile_scheduler_metadata, num_splits) returned by get_mla_metadata."""

    __slots__ = ()

    def __new__(cls, schedule: Schedule):
        # num_splits: the flat schedule where s_q * h_q rows fit one token's heads; beyond that
        # only the causal decode can run (its schedule is made per (h_q, s_q)), and num_splits
        # is an empty placeholder.
        if schedule.num_heads_per_head_k <= MAX_HEADS:
            flat = schedule.flat()
        else:
            flat = torch.empty(0, dtype=torch.int32, device=schedule.cache_seqlens.device)
        return super().__new__(cls, (schedule, flat))

    @property
    def tile_scheduler_metadata(self) -> Schedule:
        return self[0]

    @property
    def num_splits(self):
        return self[1]


def _check_tensor(value, name: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")


def get_mla_metadata(cache_seqlens, num_heads_per_head_k: int, num_heads_k: int) -> MlaMetadata:
    """FlashMLA's get_mla_metadata: (tile_scheduler_metadata, num_splits) for a decode step.

    cache_seqlens is int32 [b]; num_heads_per_head_k is s_q * h_q // h_kv (up to 128 for any
    decode, up to 2048 for a causal one);
    num_heads_k (h_kv) must be 1 (MLA's single latent head). The pair holds the library's
    schedules, not FlashMLA's tensors: pass it on to flash_mla_with_kvcache unchanged.
    """
    _check_tensor(cache_seqlens, "cache_seqlens")
    rows = mla._int(num_heads_per_head_k, "num_heads_per_head_k", 1, MAX_ROWS)
    heads_k = mla._int(num_heads_k, "num_heads_k", 1)
    if heads_k != 1:
        raise ValueError(
            f"num_heads_k: expected 1 (MLA's one latent key/value head), got {heads_k}"
        )
    return MlaMetadata(Schedule(cache_seqlens, rows))


def _check_shapes(q, k_cache, cache_seqlens, head_dim_v) -> tuple[int, int, int]:
    """(b, s_q, h_q) of q after FlashMLA's shape rules, each error naming FlashMLA's argument."""
    if len(q.shape) != 4 or int(q.shape[-1]) != HEAD_DIM:
        raise ValueError(
            f"q: expected shape [batch_size, seq_len_q, num_heads_q, {HEAD_DIM}], "
            f"got {tuple(q.shape)}"
        )
    if len(k_cache.shape) != 4 or int(k_cache.shape[-1]) != HEAD_DIM:
        raise ValueError(
            f"k_cache: expected shape [num_blocks, page_block_size, 1, {HEAD_DIM}], "
            f"got {tuple(k_cache.shape)}"
        )
    if int(k_cache.shape[2]) != 1:
        raise ValueError(
            f"k_cache: num_heads_k (shape[2]) must be 1 (MLA's one latent key/value head), "
            f"got {int(k_cache.shape[2])} (shape {tuple(k_cache.shape)})"
        )
    if isinstance(head_dim_v, bool) or head_dim_v != HEAD_DIM_V:
        raise ValueError(f"head_dim_v: expected {HEAD_DIM_V}, got {head_dim_v!r}")
    b, s_q, h_q = (int(d) for d in q.shape[:3])
    if h_q > MAX_HEADS or s_q > MAX_SQ:
        raise ValueError(
            f"q: expected num_heads_q in 1..{MAX_HEADS} and seq_len_q in 1..{MAX_SQ}, got "
            f"shape {tuple(q.shape)}"
        )
    if tuple(cache_seqlens.shape) != (b,):
        raise ValueError(
            f"cache_seqlens: expected shape [batch_size] = ({b},) as q's shape[0], "
            f"got {tuple(cache_seqlens.shape)}"
        )
    return b, s_q, h_q


def _check_schedule(tile_scheduler_metadata, num_splits, schedule_rows: int) -> Schedule:
    if not isinstance(tile_scheduler_metadata, Schedule):
        raise TypeError(
            "tile_scheduler_metadata: expected the first value returned by "
            "kernelflow.flash_mla.get_mla_metadata, got "
            f"{type(tile_scheduler_metadata).__name__}"
        )
    _check_tensor(num_splits, "num_splits")
    if tile_scheduler_metadata.num_heads_per_head_k != schedule_rows:
        raise ValueError(
            f"tile_scheduler_metadata: made by get_mla_metadata for num_heads_per_head_k = "
            f"{tile_scheduler_metadata.num_heads_per_head_k}, but q has s_q * h_q = "
            f"{schedule_rows}"
        )
    return tile_scheduler_metadata


def _decode(q, k_cache, block_table, cache_seqlens, metadata, metadata_name, softmax_scale):
    """kernelflow.mla_decode with its messages naming FlashMLA's arguments: k_cache for the
    library's kv_cache, `metadata_name` for the metadata it was given."""
    try:
        return mla.mla_decode(q, k_cache, block_table, cache_seqlens, metadata, softmax_scale)
    except (ValueError, TypeError) as e:
        message = _METADATA.sub(metadata_name, _KV_CACHE.sub("k_cache", str(e)))
        raise type(e)(message) from None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v: int,
                           tile_scheduler_metadata, num_splits, softmax_scale=None,
                           causal: bool = False):
    """FlashMLA's flash_mla_with_kvcache: (out [b, s_q, h_q, 512], softmax_lse [b, h_q, s_q]).

    softmax_scale defaults to 576**-0.5 as in FlashMLA; DeepSeek-V2/V2-Lite need 0.114721 and V3
    0.135234 (docs/spec.md section 1). With causal=True and s_q > 1, row i of a request of
    length n sees positions 0 .. n - s_q + i; otherwise every row sees the whole cache.
    softmax_lse is +inf for a row that sees no position (its out is 0).
    """
    for value, name in ((q, "q"), (k_cache, "k_cache"), (block_table, "block_table"),
                        (cache_seqlens, "cache_seqlens")):
        _check_tensor(value, name)
    b, s_q, h_q = _check_shapes(q, k_cache, cache_seqlens, head_dim_v)
    schedule = _check_schedule(tile_scheduler_metadata, num_splits, s_q * h_q)
    if softmax_scale is None:
        softmax_scale = HEAD_DIM ** -0.5
    if causal and s_q > 1:
        out, lse = _decode(q, k_cache, block_table, cache_seqlens,
                           schedule.metadata(h_q, s_q), "tile_scheduler_metadata", softmax_scale)
    else:
        if s_q * h_q > MAX_HEADS:
            raise ValueError(
                f"causal: False with s_q * h_q = {s_q * h_q} query rows per request is not "
                f"supported (full attention decodes the rows as heads of one token, at most "
                f"{MAX_HEADS}); causal=True decodes up to {MAX_ROWS}"
            )
        # Every row sees the whole cache: the s_q * h_q rows of a request are heads of one
        # query token over the shared latent head (MQA), decoded with num_splits.
        flat_q = q.reshape(b, 1, s_q * h_q, HEAD_DIM)
        out, lse = _decode(flat_q, k_cache, block_table, cache_seqlens, num_splits, "num_splits",
                           softmax_scale)
        out = out.view(b, s_q, h_q, HEAD_DIM_V)
        lse = lse.view(b, s_q, h_q).transpose(1, 2).contiguous()
    return out, lse.masked_fill_(lse == float("-inf"), float("inf"))
