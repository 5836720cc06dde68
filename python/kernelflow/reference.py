"""Float64 reference of MLA decode, in NumPy alone: what the library is checked against.

Independent of the library's compiled code (nothing here calls kernelflow._C), so the tests, the
demo, the benchmark's checks and the 8-bit accuracy script all judge the kernels by the same
math, stated in docs/spec.md:

  section 1  score = softmax_scale * <q, k> over all 576 dims, softmax over the positions a query
             row sees, out = p @ v with v the first 512 dims of the same cache rows,
             lse = natural-log log-sum-exp; query row s of s_q sees the positions
             < seqlen - s_q + s + 1 (causal); a row that sees nothing gives out = 0, lse = -inf.
  section 2  the 8-bit cache formats: one fp32 scale per token over its 512 latent values, codes
             RNE and saturated to +-qmax, rope part in bf16.
  section 4  cosine distance 1 - 2<x,y> / (|x|^2 + |y|^2) and the accuracy thresholds.

Shapes: q [b, s_q, h_q, 576], out [b, s_q, h_q, 512], lse [b, h_q, s_q].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HEAD_DIM, LATENT_DIM, ROPE_DIM = 576, 512, 64

# docs/spec.md section 4. bf16 / fp16 caches (and one 8-bit cache decoded by two backends): the
# worst row, one (b, s_q, h) output of 512 values, and the largest absolute lse error.
MAX_ROW_COS_DIST = 1e-5
MAX_LSE_ABS_ERR = 1e-4
# 8-bit caches against the reference on the unquantized cache, over the whole output, for q and
# cache drawn from N(0, 1), softmax_scale 0.114721 and s_k >= 1024.
MAX_WHOLE_COS_DIST_8BIT = {"fp8_e4m3": 3e-3, "int8": 5e-4}

# docs/spec.md section 2: the largest code of each 8-bit format.
QMAX_8BIT = {"fp8_e4m3": 448.0, "int8": 127.0}


# ---- section 1: the attention ------------------------------------------------------------------

def visible_len(seqlen: int, s_q: int, s: int) -> int:
    """Positions query row s (0-based, of s_q new tokens) sees in a cache of seqlen tokens: the
    causal rule, positions < seqlen - s_q + s + 1, clipped to 0..seqlen."""
    return min(max(seqlen - s_q + s + 1, 0), seqlen)


def sees_any(cache_seqlens, s_q: int) -> np.ndarray:
    """bool [b, s_q]: whether query row s of request r sees at least one position."""
    return np.array([[visible_len(int(n), s_q, s) > 0 for s in range(s_q)]
                     for n in np.asarray(cache_seqlens).reshape(-1)], dtype=bool).reshape(-1, s_q)


def paged_rows(kv_cache, block_table, r: int, seqlen: int) -> np.ndarray:
    """The first `seqlen` cache rows [seqlen, 576] of request r: block_table[r, j] names the page
    holding positions j * page_size .. (j + 1) * page_size - 1."""
    page_size = kv_cache.shape[1]
    pages = np.asarray(block_table[r, : math.ceil(seqlen / page_size)], dtype=np.int64)
    return np.asarray(kv_cache)[pages].reshape(-1, HEAD_DIM)[:seqlen]


def attend(q_rows, kv, softmax_scale: float):
    """Softmax attention of q_rows [h, 576] over kv [n, 576], in float64: (out [h, 512], lse [h]);
    n = 0 gives out 0 and lse -inf."""
    q_rows = np.asarray(q_rows, dtype=np.float64)
    kv = np.asarray(kv, dtype=np.float64)
    h = q_rows.shape[0]
    if kv.shape[0] == 0:
        return np.zeros((h, LATENT_DIM)), np.full(h, -np.inf)
    scores = softmax_scale * (q_rows @ kv.T)  # [h, n]
    top = scores.max(axis=1, keepdims=True)
    p = np.exp(scores - top)
    total = p.sum(axis=1, keepdims=True)
    out = (p @ kv[:, :LATENT_DIM]) / total
    return out, (top + np.log(total))[:, 0]


def mla_decode_ref(q, kv, cache_seqlens, softmax_scale: float, block_table=None):
    """MLA decode in float64: (out [b, s_q, h_q, 512], lse [b, h_q, s_q]).

    q is [b, s_q, h_q, 576]. kv is either the paged cache [num_pages, page_size, 576] (or
    [.., 1, 576]) with block_table [b, max_pages_per_seq], or, without block_table, the requests'
    own rows: kv[r] is request r's cache rows [>= cache_seqlens[r], 576] (a list of arrays, an
    array [b, s_k, 576], or any object indexable by request that gives rows NumPy can read).
    Only the rows each query row sees are read: whatever lies beyond a length does not matter.
    """
    q = np.asarray(q, dtype=np.float64)
    b, s_q, h_q, _ = q.shape
    seqlens = [int(n) for n in np.asarray(cache_seqlens).reshape(-1)]
    out = np.zeros((b, s_q, h_q, LATENT_DIM))
    lse = np.full((b, h_q, s_q), -np.inf)
    for r, n in enumerate(seqlens):
        if n <= 0:
            continue
        rows = paged_rows(kv, block_table, r, n) if block_table is not None else kv[r]
        rows = np.asarray(rows[:n], dtype=np.float64)
        for s in range(s_q):
            out[r, s], lse[r, :, s] = attend(q[r, s], rows[: visible_len(n, s_q, s)],
                                             softmax_scale)
    return out, lse


# ---- section 4: how close is close enough ------------------------------------------------------

def cosine_distance(x, y, axis=-1):
    """1 - 2<x,y> / (|x|^2 + |y|^2) along `axis` (None: over all elements), in float64; 0 where
    both are zero."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    num = 2.0 * np.sum(x * y, axis=axis)
    den = np.sum(x * x, axis=axis) + np.sum(y * y, axis=axis)
    zero = den == 0
    return np.where(zero, 0.0, 1.0 - num / np.where(zero, 1.0, den))


@dataclass(frozen=True)
class Agreement:
    """How a decode's (out, lse) compare with the reference's, row by row. A row is one
    (b, s_q, h) output of 512 values and its lse."""

    worst_row_cos_dist: float  # over the rows the reference gives finite values (0 if none)
    max_lse_err: float         # absolute, over the same rows
    finite: bool               # those rows are finite in out and lse
    empty_rows_exact: bool     # rows that see no position are exactly 0 and -inf
    nan_rows_nan: bool         # rows the reference gives NaN (non-finite inputs) are NaN

    @property
    def ok(self) -> bool:
        """Within docs/spec.md section 4's bounds for a 16-bit cache."""
        return (self.finite and self.empty_rows_exact and self.nan_rows_nan
                and self.worst_row_cos_dist < MAX_ROW_COS_DIST
                and self.max_lse_err < MAX_LSE_ABS_ERR)

    def __str__(self) -> str:
        text = (f"worst-row cosine distance {self.worst_row_cos_dist:.2e} "
                f"(< {MAX_ROW_COS_DIST:g}), max |lse error| {self.max_lse_err:.2e} "
                f"(< {MAX_LSE_ABS_ERR:g})")
        for flag, what in ((self.finite, "non-finite values"),
                           (self.empty_rows_exact, "rows that see nothing are not 0 and -inf"),
                           (self.nan_rows_nan, "rows with non-finite inputs are not NaN")):
            if not flag:
                text += f"; {what}"
        return text


def agreement(out, lse, ref_out, ref_lse) -> Agreement:
    """Compare out [b, s_q, h, 512] and lse [b, h, s_q] with the reference's (any array type
    NumPy can read). Rows whose reference lse is -inf see nothing and must be exactly 0 and -inf;
    rows whose reference lse is NaN must be NaN in lse and in every out element; the others are
    measured."""
    out = np.asarray(out, dtype=np.float64)
    ref_out = np.asarray(ref_out, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64).transpose(0, 2, 1)  # [b, s_q, h], rows as out
    ref_lse = np.asarray(ref_lse, dtype=np.float64).transpose(0, 2, 1)
    if out.shape != ref_out.shape or lse.shape != ref_lse.shape:
        raise ValueError(f"shapes differ: out {out.shape} vs {ref_out.shape}, "
                         f"lse {lse.shape} vs {ref_lse.shape}")
    empty = np.isneginf(ref_lse)
    nan = np.isnan(ref_lse)
    seen = ~(empty | nan)
    exact = bool(np.all(out[empty] == 0.0) and np.all(np.isneginf(lse[empty])))
    nan_ok = bool(np.all(np.isnan(out[nan])) and np.all(np.isnan(lse[nan])))
    if not seen.any():
        return Agreement(0.0, 0.0, True, exact, nan_ok)
    finite = bool(np.isfinite(out[seen]).all() and np.isfinite(lse[seen]).all())
    if not finite:
        return Agreement(math.inf, math.inf, False, exact, nan_ok)
    worst = float(cosine_distance(out[seen], ref_out[seen]).max())
    err = float(np.abs(lse[seen] - ref_lse[seen]).max())
    return Agreement(worst, err, True, exact, nan_ok)


# ---- section 2: the 8-bit cache formats ---------------------------------------------------------

def round_to_bf16(x) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even), as float32."""
    return bf16_from_bits(bf16_bits(x))


def bf16_bits(x) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of float32 values, rounded to nearest even; NaN stays
    a quiet NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, (u >> 16) | 0x0040, rounded).astype(np.uint16)


def bf16_from_bits(bits) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _e4m3_round(y) -> np.ndarray:
    """float32 values already within +-448, rounded to the nearest e4m3 value (ties to even):
    3 mantissa bits, exponents -6..8, subnormal step 2**-9."""
    a = np.abs(np.asarray(y, dtype=np.float64))
    _, e = np.frexp(np.maximum(a, 2.0**-6))  # a = m * 2**e, m in [0.5, 1)
    step = np.ldexp(1.0, e - 4)              # 3 mantissa bits below the leading one
    return np.copysign(np.rint(a / step) * step, y)


def e4m3_bits(v) -> np.ndarray:
    """uint8 e4m3 (the fn variant: no infinities, 0x7F / 0xFF are NaN) codes of values that are
    exactly representable (from _e4m3_round)."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    m, e = np.frexp(a)
    normal = a >= 2.0**-6
    exponent = np.where(normal, e - 1 + 7, 0)
    mantissa = np.where(normal, np.rint((2.0 * m - 1.0) * 8.0), np.rint(a / 2.0**-9))
    sign = np.signbit(v).astype(np.int64) << 7
    return (sign | (exponent.astype(np.int64) << 3) | mantissa.astype(np.int64)).astype(np.uint8)


def e4m3_values(codes) -> np.ndarray:
    """float64 values of uint8 e4m3 (fn) codes; 0x7F and 0xFF are NaN."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exponent, mantissa = (c >> 3) & 0xF, c & 0x7
    magnitude = np.where(exponent == 0, mantissa * 2.0**-9,
                         (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0))
    return np.where((c & 0x7F) == 0x7F, np.nan, sign * magnitude)


@dataclass(frozen=True)
class Quantized:
    """Tokens in an 8-bit format, by section: what a page stores for each of them."""

    codes: np.ndarray      # uint8 [n, 512]: e4m3 codes or int8 two's complement
    rope_bits: np.ndarray  # uint16 [n, 64]: the rope part in bfloat16
    scale: np.ndarray      # float32 [n]: amax / qmax, 0 for an all-zero latent


def quantize_8bit(rows, kv_format: str) -> Quantized:
    """Quantize finite token rows [n, 576] (the float32 values of 16-bit rows) per docs/spec.md
    section 2: amax = max |latent|, codes = RNE(x * (qmax / amax)) saturated to +-qmax with
    qmax / amax computed in float32, scale = amax / qmax (float32); amax = 0 stores zeros and
    scale 0."""
    x = np.asarray(rows, dtype=np.float32).reshape(-1, HEAD_DIM)
    latent = x[:, :LATENT_DIM]
    qmax = np.float32(QMAX_8BIT[kv_format])
    amax = np.abs(latent).max(axis=1)
    zero = amax == 0
    inv = (qmax / np.where(zero, np.float32(1), amax)).astype(np.float32)
    y = np.clip((latent * inv[:, None]).astype(np.float32), -qmax, qmax)
    if kv_format == "fp8_e4m3":
        codes = e4m3_bits(_e4m3_round(y))
    else:
        codes = np.rint(y).astype(np.int8).view(np.uint8)
    codes[zero] = 0
    scale = np.where(zero, np.float32(0), (amax / qmax).astype(np.float32)).astype(np.float32)
    return Quantized(codes, bf16_bits(x[:, LATENT_DIM:]), scale)


def dequantize_8bit(tokens: Quantized, kv_format: str) -> np.ndarray:
    """float64 rows [n, 576] that an 8-bit cache holds: codes * scale, then the bf16 rope."""
    if kv_format == "fp8_e4m3":
        values = e4m3_values(tokens.codes)
    else:
        values = tokens.codes.view(np.int8).astype(np.float64)
    latent = values * tokens.scale.astype(np.float64)[:, None]
    rope = bf16_from_bits(tokens.rope_bits).astype(np.float64)
    return np.concatenate([latent, rope], axis=1)
