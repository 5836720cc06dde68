"""The tests' own float64 MLA reference and input builders (independent of the library's code).

Math of SPEC.md section 1: score = scale * q . k over 576 dims, softmax over the positions a row
sees (causal for s_q > 1: query s sees positions < seqlen - s_q + s + 1), o = p @ v (first 512
dims), lse natural log, o = 0 and lse = -inf for a row that sees nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bf16 CPU tests skip
    ml_dtypes = None
    BF16 = None

SCALE_V2_LITE = 0.114721
HEAD, LATENT = 576, 512
MAX_COS_DIST, MAX_LSE_ERR = 1e-5, 1e-4


def numpy_dtype(name: str):
    if name == "float16":
        return np.dtype(np.float16)
    if name == "bfloat16":
        if BF16 is None:
            import pytest

            pytest.skip("bfloat16 NumPy arrays need ml_dtypes")
        return BF16
    raise ValueError(name)


def visible_len(seqlen: int, s_q: int, s: int) -> int:
    return min(max(seqlen - s_q + s + 1, 0), seqlen)


def reference(q, cache, block_table, seqlens, scale):
    """q [b, s_q, h, 576] and cache [pages, page, 576] as float64 -> (o [b, s_q, h, 512],
    lse [b, h, s_q])."""
    q = np.asarray(q, np.float64)
    b, s_q, h, _ = q.shape
    page = cache.shape[1]
    o = np.zeros((b, s_q, h, LATENT))
    lse = np.full((b, h, s_q), -np.inf)
    for r in range(b):
        n = int(seqlens[r])
        if n == 0:
            continue
        pages = np.asarray(block_table[r, : math.ceil(n / page)])
        kv = np.asarray(cache[pages], np.float64).reshape(-1, HEAD)[:n]
        for s in range(s_q):
            vis = visible_len(n, s_q, s)
            if vis == 0:
                continue
            scores = scale * (q[r, s] @ kv[:vis].T)
            m = scores.max(axis=1, keepdims=True)
            p = np.exp(scores - m)
            total = p.sum(axis=1, keepdims=True)
            o[r, s] = (p @ kv[:vis, :LATENT]) / total
            lse[r, :, s] = (m + np.log(total))[:, 0]
    return o, lse


def cosine_distance(x, y):
    """Per row of the last axis: 1 - 2<x,y> / (|x|^2 + |y|^2)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    num = 2.0 * np.sum(x * y, axis=-1)
    den = np.sum(x * x, axis=-1) + np.sum(y * y, axis=-1)
    return 1.0 - num / den


@dataclass
class Case:
    q: np.ndarray            # [b, s_q, h_q, 576] in the storage dtype
    cache: np.ndarray        # [num_pages, page, 576]
    block_table: np.ndarray  # int32 [b, max_pages]
    seqlens: np.ndarray      # int32 [b]
    scale: float

    @property
    def s_q(self):
        return self.q.shape[1]

    @property
    def h_q(self):
        return self.q.shape[2]

    def expected(self):
        return reference(self.q.astype(np.float64), self.cache.astype(np.float64),
                         self.block_table, self.seqlens, self.scale)


def make_case(rng, seqlens, h_q, s_q, page, dtype, scale=SCALE_V2_LITE, spare_pages=3,
              table_pad=0, extra_columns=None):
    """Random N(0,1) q and cache; the request's pages scattered over the pool in random order;
    NaN past each request's length in its last page and in every page nobody uses; unused
    block_table columns hold `table_pad`."""
    seqlens = [int(n) for n in seqlens]
    batch = len(seqlens)
    need = [math.ceil(n / page) for n in seqlens]
    if extra_columns is None:
        extra_columns = int(rng.integers(0, 3))
    max_pages = max(need + [1]) + extra_columns
    num_pages = sum(need) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    cache = np.full((num_pages, page, HEAD), np.nan, np.float32)
    block_table = np.full((batch, max_pages), table_pad, np.int32)
    used = 0
    for r, n in enumerate(seqlens):
        pages = perm[used : used + need[r]]
        used += need[r]
        block_table[r, : need[r]] = pages
        rows = rng.standard_normal((need[r] * page, HEAD), dtype=np.float32)
        rows[n:] = np.nan
        cache[pages] = rows.reshape(need[r], page, HEAD)
    q = rng.standard_normal((batch, s_q, h_q, HEAD), dtype=np.float32)
    return Case(q.astype(dtype), cache.astype(dtype), block_table,
                np.array(seqlens, np.int32), scale)


def check_decode(case: Case, out, lse, what=""):
    """Rows that see positions: cosine distance and lse error within SPEC section 4; rows that
    see nothing: exactly 0 and -inf."""
    o_ref, lse_ref = case.expected()
    out = np.asarray(out).astype(np.float64)
    lse = np.asarray(lse).astype(np.float64)
    assert out.shape == o_ref.shape, what
    assert lse.shape == lse_ref.shape, what
    b, s_q = out.shape[:2]
    seen = np.array([[visible_len(int(case.seqlens[r]), s_q, s) > 0 for s in range(s_q)]
                     for r in range(b)])  # [b, s_q]
    empty_o = out[~seen]           # [k, h, 512]
    assert np.all(empty_o == 0.0), f"{what}: rows that see nothing must be exactly 0"
    empty_lse = lse.transpose(0, 2, 1)[~seen]
    assert np.all(np.isneginf(empty_lse)), f"{what}: rows that see nothing must have lse -inf"
    if seen.any():
        dist = cosine_distance(out[seen], o_ref[seen])
        assert np.all(np.isfinite(dist)), f"{what}: non-finite output"
        worst = float(dist.max())
        assert worst < MAX_COS_DIST, f"{what}: worst-row cosine distance {worst:.3g}"
        lse_err = np.abs(lse.transpose(0, 2, 1)[seen] - lse_ref.transpose(0, 2, 1)[seen])
        assert float(lse_err.max()) < MAX_LSE_ERR, f"{what}: lse error {lse_err.max():.3g}"


def poisoned(shape, dtype):
    return np.full(shape, np.nan, dtype)


def bits(a):
    """The bytes of an array, for bit-identity checks."""
    a = np.ascontiguousarray(np.asarray(a))
    return a.view(np.uint8).tobytes()


def aligned_empty(nbytes, align=256, fill=0xFF):
    """uint8[nbytes] starting on an `align`-byte boundary, filled with garbage."""
    raw = np.full(nbytes + align, fill, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset : offset + nbytes]
