"""Input builders and checks shared by the tests. The float64 reference itself is
kernelflow.reference (docs/spec.md sections 1, 2 and 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kernelflow import reference as ref

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bf16 CPU tests skip
    ml_dtypes = None
    BF16 = None

SCALE_V2_LITE = 0.114721
HEAD, LATENT = ref.HEAD_DIM, ref.LATENT_DIM


def numpy_dtype(name: str):
    if name == "float16":
        return np.dtype(np.float16)
    if name == "bfloat16":
        if BF16 is None:
            import pytest

            pytest.skip("bfloat16 NumPy arrays need ml_dtypes")
        return BF16
    raise ValueError(name)


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
        """The reference's (out, lse) on the stored (rounded) q and cache."""
        return ref.mla_decode_ref(self.q, self.cache, self.seqlens, self.scale,
                                  block_table=self.block_table)


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
    """Rows that see positions within docs/spec.md section 4's bounds of the reference; rows that
    see nothing exactly 0 and -inf."""
    o_ref, lse_ref = case.expected()
    assert np.shape(out) == o_ref.shape and np.shape(lse) == lse_ref.shape, what
    # The reference's empty rows are those the causal rule leaves empty.
    assert np.array_equal(np.isneginf(lse_ref).any(axis=1),
                          ~ref.sees_any(case.seqlens, case.s_q)), what
    result = ref.agreement(out, lse, o_ref, lse_ref)
    assert result.ok, f"{what}: {result}"


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
