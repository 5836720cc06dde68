"""NaN and Inf in the inputs (docs/spec.md section 6), on the CPU backend and, marked `gpu`, on a
CUDA device through PyTorch:

- a NaN or +-Inf in a query row makes that row's out and lse NaN, at every worker count
  (1 to 132, so the row's request is split and merged) and for s_q 1 and 2;
- a NaN or +-Inf in a visible 16-bit cache row (latent or rope part) makes exactly the rows that
  see the position NaN; with s_q = 2 the causal row that does not see it stays finite;
- whatever lies past cache_seqlens (NaN, +-Inf) changes no bit;
- rows that see no position are exactly 0 and -inf, whatever their query holds;
- 8-bit caches: a token whose latent holds a NaN or an Inf is stored as 512 zero codes and the
  scale 0x7fc00000 (NaN), its rope part as bf16; rows that see it decode to NaN;
- every other row has the bits of a run without the bad value (rows of the same request on an
  8-bit cache on the GPU: within the accuracy bounds, since the kernel's per-tile scale unit
  sees the whole tile).

Outputs are poisoned with a finite garbage value before each call, so a row the call does not
write shows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kernelflow as kf
from inputs import BF16, HEAD, LATENT, make_case, numpy_dtype
from kernelflow.reference import MAX_LSE_ABS_ERR as MAX_LSE_ERR
from kernelflow.reference import MAX_ROW_COS_DIST as MAX_COS_DIST
from kernelflow.reference import cosine_distance, visible_len

BYTES_8BIT = 644
SCALE_NAN_BITS = 0x7FC00000  # the stored scale of a non-finite latent
GARBAGE = 3.0  # poison of out and lse: finite, neither 0 nor -inf nor NaN
BAD = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf}
WORKERS = [1, 2, 4, 8, 132]
FORMATS = ["fp8_e4m3", "int8"]
DTYPES = ["float16", "bfloat16"]
# "gpu": the default (portable) decode family; "gpu-sm90a": KF_KERNEL_FAMILY=sm90a, the sm_90a
# family where the device and build have it.
BACKENDS = [
    "cpu",
    pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.needs_torch]),
    pytest.param("gpu-sm90a", marks=[pytest.mark.gpu, pytest.mark.needs_torch]),
]

# Request 1 is long (split over workers from 2 on), request 2 is empty, request 3 has one
# position (with s_q = 2 its first query row sees nothing).
SEQLENS = [700, 1500, 0, 1]
H_Q, PAGE = 16, 64
LONG = 1


class Backend:
    """Moves NumPy arrays to the backend's device and back, bit for bit."""

    def __init__(self, name):
        self.gpu = name.startswith("gpu")

    def put(self, a):
        a = np.ascontiguousarray(a)
        if not self.gpu:
            return a
        import torch

        if BF16 is not None and a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
        return torch.from_numpy(a).cuda()

    def get(self, t):
        if not self.gpu:
            return np.asarray(t)
        import torch

        torch.cuda.synchronize()
        t = t.cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(BF16)
        return t.numpy()


@pytest.fixture(params=BACKENDS)
def be(request, monkeypatch):
    if request.param == "gpu-sm90a":
        monkeypatch.setenv("KF_KERNEL_FAMILY", "sm90a")
    else:
        monkeypatch.delenv("KF_KERNEL_FAMILY", raising=False)
    return Backend(request.param)


def new_case(rng, s_q, dtype):
    return make_case(rng, SEQLENS, H_Q, s_q, PAGE, numpy_dtype(dtype))


def copy_case(case):
    return dataclasses.replace(case, q=case.q.copy(), cache=case.cache.copy())


def decode(be, case, workers, cache=None, kv_format=None):
    """(out, lse, metadata) as NumPy arrays; `cache` is a backend array (8-bit) or None for the
    case's 16-bit cache."""
    b, s_q, h_q = case.q.shape[:3]
    seqlens = be.put(case.seqlens)
    meta = kf.get_mla_metadata(seqlens, h_q, s_q, num_workers=workers,
                               kv_format=kv_format or "bf16")
    out = be.put(np.full((b, s_q, h_q, LATENT), GARBAGE, case.q.dtype))
    lse = be.put(np.full((b, h_q, s_q), GARBAGE, np.float32))
    kf.mla_decode(be.put(case.q), be.put(case.cache) if cache is None else cache,
                  be.put(case.block_table), seqlens, meta, softmax_scale=case.scale,
                  kv_format=kv_format, out=out, lse=lse)
    return be.get(out), be.get(lse), be.get(meta)


def pieces_of(meta, r):
    """Pieces request r is split into (the metadata layout of src/core/scheduler.h: a 16-word
    header, 8 words per worker, then the piece offsets)."""
    workers = int(meta[5])
    offsets = meta[16 + 8 * workers:]
    return int(offsets[r + 1] - offsets[r])


def seen_rows(case):
    """bool [b, s_q]: the query rows that see at least one position."""
    b, s_q = case.q.shape[:2]
    return np.array([[visible_len(int(case.seqlens[r]), s_q, s) > 0 for s in range(s_q)]
                     for r in range(b)])


def check(case, got, clean, bad, near=None):
    """got and clean are (out, lse) of the poisoned and the clean run; bad: bool [b, s_q, h] rows
    that must be NaN; near: rows that must only match the clean run within the accuracy bounds;
    every other row must have the clean run's bits. Rows that see nothing are 0 and -inf."""
    out, lse = got[0], got[1].transpose(0, 2, 1)  # lse as [b, s_q, h]
    c_out, c_lse = clean[0], clean[1].transpose(0, 2, 1)
    near = np.zeros_like(bad) if near is None else near
    empty = ~seen_rows(case)
    assert not (bad & empty[:, :, None]).any(), "test setup: a NaN row must see a position"
    assert np.all(out[empty] == 0), "rows that see nothing: out must be exactly 0"
    assert np.all(np.isneginf(lse[empty])), "rows that see nothing: lse must be -inf"
    assert bad.any()
    assert np.isnan(out[bad].astype(np.float32)).all(), "rows that see the bad value: out NaN"
    assert np.isnan(lse[bad]).all(), "rows that see the bad value: lse NaN"
    exact = ~bad & ~near
    assert np.array_equal(out[exact].view(np.uint16), c_out[exact].view(np.uint16)), \
        "rows that do not see the bad value must keep their bits"
    assert np.array_equal(lse[exact].view(np.uint32), c_lse[exact].view(np.uint32))
    if near.any():
        o, c = out[near].astype(np.float64), c_out[near].astype(np.float64)
        assert np.isfinite(o).all() and np.isfinite(lse[near]).all()
        assert cosine_distance(o, c).max() < MAX_COS_DIST
        assert np.abs(lse[near] - c_lse[near]).max() < MAX_LSE_ERR


# ---- q ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("what", list(BAD))
def test_nonfinite_query_row(be, rng, what, workers, s_q, dtype):
    clean = new_case(rng, s_q, dtype)
    case = copy_case(clean)
    s, h, d = s_q - 1, int(rng.integers(H_Q)), int(rng.integers(HEAD))
    case.q[LONG, s, h, d] = BAD[what]
    # Rows that see nothing stay 0 / -inf whatever their query holds.
    case.q[2, 0, int(rng.integers(H_Q)), int(rng.integers(HEAD))] = BAD[what]
    if s_q == 2:
        case.q[3, 0, :, int(rng.integers(HEAD))] = BAD[what]
    got = decode(be, case, workers)
    if workers > 1:
        assert pieces_of(got[2], LONG) > 1, "the request must be split, or no merge is tested"
    bad = np.zeros((len(SEQLENS), s_q, H_Q), bool)
    bad[LONG, s, h] = True
    check(case, got, decode(be, clean, workers), bad)


# ---- 16-bit cache -------------------------------------------------------------------------------

def slot_of(case, r, t):
    """(page, offset) of position t of request r."""
    return int(case.block_table[r, t // PAGE]), t % PAGE


def rows_seeing(case, r, t):
    """bool [b, s_q, h]: the rows that see position t of request r."""
    b, s_q = case.q.shape[:2]
    rows = np.zeros((b, s_q, H_Q), bool)
    for s in range(s_q):
        rows[r, s] = t < visible_len(int(case.seqlens[r]), s_q, s)
    return rows


@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("workers", [1, 4, 132])
@pytest.mark.parametrize("part", ["latent", "rope"])
@pytest.mark.parametrize("what", list(BAD))
def test_nonfinite_cache_row_16bit(be, rng, what, part, workers, s_q):
    dtype = DTYPES[workers % 2]
    clean = new_case(rng, s_q, dtype)
    case = copy_case(clean)
    t = int(case.seqlens[LONG]) - 1  # the last position: with s_q = 2 row 0 does not see it
    d = int(rng.integers(LATENT)) if part == "latent" else LATENT + int(rng.integers(HEAD - LATENT))
    case.cache[slot_of(case, LONG, t)][d] = BAD[what]
    bad = rows_seeing(case, LONG, t)
    assert (s_q == 1) == bad[LONG].all()
    got, ref = decode(be, case, workers), decode(be, clean, workers)
    if be.gpu and part == "latent" and s_q > 1:
        # docs/spec.md section 6's GPU exception: in the earlier rows of the request, which do not
        # see position t, column d of out may be NaN (the tensor-core product 0 * Inf or 0 * NaN);
        # every other column and their lse keep their bits. Checked here, then the rest of the
        # batch as usual.
        hidden = np.zeros_like(bad)
        hidden[LONG] = ~bad[LONG]
        out, ref_out = got[0][hidden], ref[0][hidden]
        others = np.arange(LATENT) != d
        assert np.array_equal(out[:, others].view(np.uint16), ref_out[:, others].view(np.uint16))
        col, ref_col = out[:, d].astype(np.float32), ref_out[:, d].astype(np.float32)
        assert (np.isnan(col) | (col == ref_col)).all()
        assert np.array_equal(got[1].transpose(0, 2, 1)[hidden].view(np.uint32),
                              ref[1].transpose(0, 2, 1)[hidden].view(np.uint32))
        got = (np.where(hidden[..., None], ref[0], got[0]), got[1])
    check(case, got, ref, bad)


@pytest.mark.parametrize("workers", [1, 4, 132])
def test_nonfinite_cache_row_seen_by_all(be, rng, workers):
    """A bad position in the middle of a request: every row of the request sees it."""
    clean = new_case(rng, 2, "bfloat16")
    case = copy_case(clean)
    t = int(rng.integers(int(case.seqlens[LONG]) - 1))
    case.cache[slot_of(case, LONG, t)][int(rng.integers(HEAD))] = np.inf
    bad = rows_seeing(case, LONG, t)
    assert bad[LONG].all()
    check(case, decode(be, case, workers), decode(be, clean, workers), bad)


@pytest.mark.parametrize("workers", [1, 4, 132])
def test_nonfinite_padding_changes_nothing(be, rng, workers):
    """NaN, +Inf, -Inf or zeros past cache_seqlens (in the requests' last pages and in pages
    nobody uses): the same bits."""
    case = new_case(rng, 2, "float16")
    pad = np.isnan(case.cache)  # make_case leaves NaN exactly where nobody may look
    assert pad.any()
    results = []
    for fill in (np.nan, np.inf, -np.inf, 0.0):
        c = copy_case(case)
        c.cache[pad] = fill
        out, lse, _ = decode(be, c, workers)
        results.append((out.view(np.uint16).tobytes(), lse.view(np.uint32).tobytes()))
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("workers", [1, 4, 132])
@pytest.mark.parametrize("s_q", [1, 4])
def test_rows_that_see_nothing_are_zero_and_minus_inf(be, rng, workers, s_q):
    """All queries NaN: rows that see no position are exactly 0 and -inf, the others NaN."""
    case = make_case(rng, [0, 3, 0, 2], 8, s_q, 16, np.float16)
    case.q[:] = np.nan
    out, lse, _ = decode(be, case, workers)
    seen = seen_rows(case)
    assert (~seen).any()
    assert np.all(out[~seen] == 0)
    assert np.all(np.isneginf(lse.transpose(0, 2, 1)[~seen]))
    assert np.isnan(out[seen].astype(np.float32)).all()
    assert np.isnan(lse.transpose(0, 2, 1)[seen]).all()


# ---- 8-bit caches -------------------------------------------------------------------------------

def sections(cache, page):
    """(latent codes [pages, ps, 512], rope bf16 bits [pages, ps, 64], scale bits [pages, ps])
    of a uint8 [pages, ps, 644] cache (the byte map of docs/formats.md)."""
    raw = cache.reshape(cache.shape[0], -1)
    latent = raw[:, :page * 512].reshape(-1, page, 512)
    rope = raw[:, page * 512:page * 640].copy().view(np.uint16).reshape(-1, page, 64)
    scale = raw[:, page * 640:].copy().view(np.uint32).reshape(-1, page)
    return latent, rope, scale


def bf16_bits(x):
    return np.asarray(x, np.float32).astype(BF16).view(np.uint16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_token_bytes_8bit(be, rng, fmt, dtype):
    """Tokens with a NaN, +Inf or -Inf in the latent store zero codes and the NaN scale; in the
    rope they store the latent as usual and the rope value in bf16. Append and conversion write
    the same bytes, on either backend."""
    if BF16 is None:
        pytest.skip("bf16 bits need ml_dtypes")
    dt = numpy_dtype(dtype)
    page, num_pages = 16, 2
    rows = rng.standard_normal((page * num_pages, HEAD)).astype(np.float32)
    cases = []  # (row, value, part)
    for i, (what, part) in enumerate([(w, p) for w in BAD for p in ("latent", "rope")]):
        row = 3 + 2 * i
        d = int(rng.integers(LATENT)) if part == "latent" else LATENT + int(rng.integers(64))
        rows[row, d] = BAD[what]
        cases.append((row, d, part))
    rows[30, :LATENT] = np.inf  # every latent value Inf
    kv = rows.astype(dt)
    src = kv.reshape(num_pages, page, HEAD)
    appended = be.put(np.full((num_pages, page, BYTES_8BIT), 0x5A, np.uint8))
    kf.cache_append(be.put(kv), appended, be.put(np.arange(len(kv), dtype=np.int64)),
                    kv_format=fmt)
    appended = be.get(appended)
    converted = be.get(kf.convert_cache(be.put(src), kv_format=fmt))
    assert np.array_equal(appended, converted)
    latent, rope, scale = (x.reshape(len(kv), -1) for x in sections(appended, page))
    scale = scale.reshape(-1)

    # The same rows with every non-finite value replaced by 0: what a finite token stores.
    finite = np.where(np.isfinite(rows), rows, 0).astype(dt)
    ref = kf.convert_cache(finite.reshape(num_pages, page, HEAD), kv_format=fmt)
    ref_latent, ref_rope, ref_scale = (x.reshape(len(kv), -1) for x in sections(ref, page))
    ref_scale = ref_scale.reshape(-1)

    for row, d, part in cases + [(30, 0, "latent")]:
        assert np.array_equal(rope[row], bf16_bits(kv[row, LATENT:].astype(np.float32))), row
        if part == "latent":
            assert (latent[row] == 0).all(), f"row {row}: a non-finite latent stores zero codes"
            assert scale[row] == SCALE_NAN_BITS, f"row {row}: scale bits {scale[row]:#x}"
        else:
            assert np.array_equal(latent[row], ref_latent[row]), row
            assert scale[row] == ref_scale[row], row
            assert rope[row, d - LATENT] == bf16_bits(kv[row, d].astype(np.float32)), row
    others = np.setdiff1d(np.arange(len(kv)), [c[0] for c in cases] + [30])
    assert np.array_equal(latent[others], ref_latent[others])
    assert np.array_equal(scale[others], ref_scale[others])
    assert np.array_equal(rope[others], ref_rope[others])


@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("workers", [1, 4, 132])
@pytest.mark.parametrize("part", ["latent", "rope"])
@pytest.mark.parametrize("what", list(BAD))
@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_cache_row_8bit(be, rng, fmt, what, part, workers, s_q):
    """The bad token converted into an 8-bit cache: the rows that see it decode to NaN."""
    dtype = DTYPES[workers % 2]
    clean = new_case(rng, s_q, dtype)
    case = copy_case(clean)
    t = int(case.seqlens[LONG]) - 1
    d = int(rng.integers(LATENT)) if part == "latent" else LATENT + int(rng.integers(HEAD - LATENT))
    case.cache[slot_of(case, LONG, t)][d] = BAD[what]
    got = decode(be, case, workers, kf.convert_cache(be.put(case.cache), kv_format=fmt), fmt)
    ref = decode(be, clean, workers, kf.convert_cache(be.put(clean.cache), kv_format=fmt), fmt)
    bad = rows_seeing(case, LONG, t)
    # On the GPU the scale unit of a tile depends on every token loaded with it (docs/spec.md
    # section 2), so the request's other rows match the clean run within the bounds only.
    near = np.zeros_like(bad)
    if be.gpu:
        near[LONG] = ~bad[LONG]
    check(case, got, ref, bad, near)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_padding_changes_nothing_8bit(be, rng, fmt):
    """Padding tokens quantized from NaN or Inf rows (NaN scales) or left as 0xFF bytes decode
    to the same bits as zero padding."""
    case = new_case(rng, 2, "bfloat16")
    pad = np.isnan(case.cache)
    results = []
    for fill in (np.nan, np.inf, 0.0):
        c = copy_case(case)
        c.cache[pad] = fill
        cache8 = kf.convert_cache(be.put(c.cache), kv_format=fmt)
        out, lse, _ = decode(be, c, 7, cache8, fmt)
        results.append((out.view(np.uint16).tobytes(), lse.view(np.uint32).tobytes()))
    zeros = np.where(pad, 0, case.cache).astype(case.cache.dtype)
    raw = be.get(kf.convert_cache(be.put(zeros), kv_format=fmt))
    pad_tokens = pad.reshape(raw.shape[0], PAGE, HEAD).all(axis=2)
    ff = raw.reshape(raw.shape[0], -1).copy()
    for p, o in zip(*np.nonzero(pad_tokens)):
        ff[p, o * 512:(o + 1) * 512] = 0xFF
        ff[p, PAGE * 512 + o * 128:PAGE * 512 + (o + 1) * 128] = 0xFF
        ff[p, PAGE * 640 + o * 4:PAGE * 640 + (o + 1) * 4] = 0xFF
    out, lse, _ = decode(be, case, 7, be.put(ff.reshape(raw.shape)), fmt)
    results.append((out.view(np.uint16).tobytes(), lse.view(np.uint32).tobytes()))
    assert all(r == results[0] for r in results)
