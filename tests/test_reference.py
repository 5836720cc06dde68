"""The float64 reference (kernelflow.reference) on cases small enough to know the answer, and its
8-bit formats against ml_dtypes' independent implementation of e4m3 and bfloat16."""

from __future__ import annotations

import ast
import inspect
import math

import numpy as np
import pytest

from inputs import HEAD, LATENT, make_case
from kernelflow import reference as ref


def test_reference_needs_only_numpy():
    """Independent of the library: the module imports NumPy and the standard library alone."""
    tree = ast.parse(inspect.getsource(ref))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports (the library's own code)"
            imported.add(node.module.partition(".")[0])
    assert imported <= {"__future__", "dataclasses", "math", "numpy"}, imported


@pytest.mark.parametrize("seqlen,s_q,want", [
    (5, 1, [5]), (5, 3, [3, 4, 5]), (1, 3, [0, 0, 1]), (0, 2, [0, 0]), (2, 4, [0, 0, 1, 2]),
])
def test_causal_rule(seqlen, s_q, want):
    assert [ref.visible_len(seqlen, s_q, s) for s in range(s_q)] == want
    assert ref.sees_any([seqlen], s_q).tolist() == [[n > 0 for n in want]]


def test_attend_two_positions():
    """Scores 0 and log 3 (after scaling): weights 1/4, 3/4, lse = log 4."""
    kv = np.zeros((2, HEAD))
    kv[0, 0], kv[1, 0] = 1.0, 2.0   # values
    kv[1, LATENT] = 1.0             # the rope part carries the score
    q = np.zeros((1, HEAD))
    q[0, LATENT] = math.log(3.0) / 0.5
    out, lse = ref.attend(q, kv, 0.5)
    assert out[0, 0] == pytest.approx(0.25 * 1.0 + 0.75 * 2.0, rel=1e-15)
    assert lse[0] == pytest.approx(math.log(4.0), rel=1e-15)
    out, lse = ref.attend(q, kv[:0], 0.5)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_paged_cache_and_rows_agree(rng):
    """The paged form reads only the pages and rows in use (NaN lies beyond every length)."""
    case = make_case(rng, [40, 0, 17, 3], 4, 3, 16, np.float32)
    o_paged, lse_paged = case.expected()
    rows = [ref.paged_rows(case.cache, case.block_table, r, int(n)) if n else np.zeros((0, HEAD))
            for r, n in enumerate(case.seqlens)]
    o_rows, lse_rows = ref.mla_decode_ref(case.q, rows, case.seqlens, case.scale)
    assert np.array_equal(o_paged, o_rows) and np.array_equal(lse_paged, lse_rows)
    seen = ref.sees_any(case.seqlens, 3)
    assert np.isfinite(o_paged).all() and np.isfinite(lse_paged.transpose(0, 2, 1)[seen]).all()
    assert np.isneginf(lse_paged.transpose(0, 2, 1)[~seen]).all()
    assert (o_paged[~seen] == 0).all()


def test_nan_query_row_gives_nan():
    q = np.ones((1, 1, 2, HEAD))
    q[0, 0, 1, 7] = np.nan
    out, lse = ref.mla_decode_ref(q, [np.ones((3, HEAD))], [3], 0.1)
    assert np.isfinite(out[0, 0, 0]).all() and np.isnan(out[0, 0, 1]).all()
    assert np.isfinite(lse[0, 0, 0]) and np.isnan(lse[0, 1, 0])


def test_agreement_flags(rng):
    case = make_case(rng, [30, 0], 2, 2, 16, np.float32)
    o_ref, lse_ref = case.expected()
    assert ref.agreement(o_ref, lse_ref, o_ref, lse_ref).ok
    off = o_ref.copy()
    off[0, 1, 0, :8] += 0.5
    result = ref.agreement(off, lse_ref, o_ref, lse_ref)
    assert not result.ok and result.worst_row_cos_dist > ref.MAX_ROW_COS_DIST
    lse_off = lse_ref.copy()
    lse_off[0, 1, 0] += 2 * ref.MAX_LSE_ABS_ERR
    assert not ref.agreement(o_ref, lse_off, o_ref, lse_ref).ok
    empty = o_ref.copy()
    empty[1, 0, 0, 0] = 1e-30  # request 1 sees nothing: must be exactly 0
    result = ref.agreement(empty, lse_ref, o_ref, lse_ref)
    assert not result.ok and not result.empty_rows_exact
    nan = o_ref.copy()
    nan[0, 0, 1, 3] = np.nan
    result = ref.agreement(nan, lse_ref, o_ref, lse_ref)
    assert not result.ok and not result.finite


def test_cosine_distance():
    x = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    y = np.array([[0.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    assert ref.cosine_distance(x, y).tolist() == pytest.approx([1.0, 0.0, 1.0 - 8.0 / 10.0])
    assert float(ref.cosine_distance(x, x, axis=None)) == 0.0


# ---- 8-bit formats -------------------------------------------------------------------------------

@pytest.fixture
def ml_dtypes():
    return pytest.importorskip("ml_dtypes")


@pytest.fixture
def E4M3(ml_dtypes):  # noqa: N802
    return np.dtype(ml_dtypes.float8_e4m3fn)


def test_e4m3_values_of_every_code(E4M3):  # noqa: N803
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(ref.e4m3_values(codes), codes.view(E4M3).astype(np.float64),
                          equal_nan=True)


def test_e4m3_rounding_matches_ml_dtypes(rng, E4M3):  # noqa: N803
    """Random values, every representable value, the midpoints between neighbours (ties to
    even) and their float32 neighbours, signed zeros and values that round to zero."""
    exact = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float64)))
    exact = exact[np.isfinite(exact)]
    mid = ((exact[1:] + exact[:-1]) / 2).astype(np.float32)
    y = np.concatenate([
        rng.uniform(-448, 448, 50_000), rng.standard_normal(50_000) * 1e-2, exact, -exact,
        mid, -mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(500)),
        [0.0, -0.0, 1e-30, -1e-30, 448.0, -448.0],
    ]).astype(np.float32)
    got = ref.e4m3_bits(ref._e4m3_round(y))
    assert np.array_equal(got, y.astype(E4M3).view(np.uint8))


def test_bf16_bits_match_ml_dtypes(rng, ml_dtypes):
    x = np.concatenate([rng.standard_normal(50_000) * 1e3, rng.standard_normal(1000) * 1e-38,
                        [np.inf, -np.inf, 0.0, -0.0, 3.3895314e38]]).astype(np.float32)
    assert np.array_equal(ref.bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.isnan(ref.round_to_bf16(np.array([np.nan], np.float32))).all()


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_quantize_8bit(rng, fmt):
    x = rng.standard_normal((6, HEAD)).astype(np.float32)
    x[1, :LATENT] = 0.0   # amax 0: zero codes and scale 0
    x[2, 5] = -1e4        # saturates at -qmax
    t = ref.quantize_8bit(x, fmt)
    qmax = ref.QMAX_8BIT[fmt]
    assert t.codes.shape == (6, LATENT) and t.rope_bits.shape == (6, 64) and t.scale.shape == (6,)
    assert (t.codes[1] == 0).all() and t.scale[1] == 0
    assert t.scale[2] == np.float32(np.float32(1e4) / np.float32(qmax))
    deq = ref.dequantize_8bit(t, fmt)
    assert deq[2, 5] == pytest.approx(-1e4, rel=1e-6)
    assert (deq[1, :LATENT] == 0).all()
    assert np.array_equal(deq[:, LATENT:], ref.round_to_bf16(x[:, LATENT:]))
    # Codes within half a step of x / scale: 0.5 for int8, 2**-4 relative (2**-10 absolute for
    # subnormals) for e4m3's 3 mantissa bits.
    rows = [0, 2, 3, 4, 5]
    code = deq[rows, :LATENT] / t.scale[rows].astype(np.float64)[:, None]
    y = x[rows, :LATENT] / t.scale[rows].astype(np.float64)[:, None]
    bound = 0.5 if fmt == "int8" else np.abs(y) * 2.0**-4 + 2.0**-10
    assert (np.abs(code - np.clip(y, -qmax, qmax)) <= bound * (1 + 1e-6)).all()
