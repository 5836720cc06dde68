"""CPU backend decode through the Python API against the float64 reference
(kernelflow.reference)."""

from __future__ import annotations

import numpy as np
import pytest

import kernelflow as kf
from inputs import (LATENT, aligned_empty, bits, check_decode, make_case, numpy_dtype,
                     poisoned)

DTYPES = ["float16", "bfloat16"]

# (page, h_q, s_q, seqlens, num_workers); None = the default worker count.
SHAPES = [
    (64, 16, 1, [4096, 1, 0, 777], None),         # V2-Lite decode, an empty request
    (16, 128, 1, [300, 17, 64], None),             # V2/V3 head count
    (32, 32, 4, [5, 0, 129, 1000, 2], 7),          # causal; requests shorter than s_q
    (1, 1, 2, [3, 1, 0], None),                    # page of one token, one head
    (128, 64, 3, [1000, 256, 129], 16),
    (256, 8, 1, [600], 5),                         # one request split over workers
    (4, 2, 4, [10, 3], 3),
    (2, 20, 1, [33, 0, 0, 7], 64),                 # more workers than work
    (8, 3, 2, [1], 1),
]


def decode(case, num_workers=None, **kwargs):
    metadata = kf.get_mla_metadata(case.seqlens, case.h_q, case.s_q, num_workers=num_workers)
    return kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens, metadata,
                         softmax_scale=case.scale, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page,h_q,s_q,seqlens,num_workers", SHAPES)
def test_decode_matches_reference(rng, dtype, page, h_q, s_q, seqlens, num_workers):
    dt = numpy_dtype(dtype)
    case = make_case(rng, seqlens, h_q, s_q, page, dt)
    b = len(seqlens)
    # Poisoned outputs: every element must be written.
    out = poisoned((b, s_q, h_q, LATENT), dt)
    lse = poisoned((b, h_q, s_q), np.float32)
    got_out, got_lse = decode(case, num_workers, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    check_decode(case, out, lse, f"{dtype} page={page} h_q={h_q} s_q={s_q} {seqlens}")


@pytest.mark.parametrize("seed", range(4))
def test_decode_random_shapes(seed):
    rng = np.random.default_rng(1000 + seed)
    page = int(rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256]))
    h_q = int(rng.choice([1, 5, 16, 31, 64, 128]))
    s_q = int(rng.integers(1, 5))
    batch = int(rng.integers(1, 6))
    seqlens = rng.integers(0, 2500, batch)
    seqlens[rng.random(batch) < 0.2] = 0
    case = make_case(rng, seqlens, h_q, s_q, page, np.float16)
    workers = int(rng.integers(1, 40))
    out, lse = decode(case, workers)
    check_decode(case, out, lse, f"seed {seed}: page={page} h_q={h_q} s_q={s_q} {seqlens}")


def test_allocated_outputs(rng):
    case = make_case(rng, [200, 65], 16, 2, 64, np.float16)
    out, lse = decode(case)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    assert out.shape == (2, 2, 16, LATENT)
    assert lse.dtype == np.float32 and lse.shape == (2, 16, 2)
    check_decode(case, out, lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bit_identical_reruns(rng, dtype):
    dt = numpy_dtype(dtype)
    case = make_case(rng, [3000, 1500, 64, 0, 2047], 16, 2, 32, dt)
    first = decode(case, 11, out=poisoned((5, 2, 16, LATENT), dt))
    second = decode(case, 11, out=poisoned((5, 2, 16, LATENT), dt))
    assert bits(first[0]) == bits(second[0])
    assert bits(first[1]) == bits(second[1])


def test_worker_count_changes_nothing_beyond_rounding(rng):
    """Splits only change the summation order: any worker count meets the same bounds."""
    case = make_case(rng, [4000, 3000, 100], 16, 1, 64, np.float16)
    for workers in (1, 2, 9, 100):
        out, lse = decode(case, workers)
        check_decode(case, out, lse, f"num_workers={workers}")


def test_nan_padding_does_not_leak(rng):
    """Same inputs with garbage instead of NaN past the lengths: the same bits come out."""
    case = make_case(rng, [100, 63, 1], 16, 1, 64, np.float16, spare_pages=2)
    out_nan, lse_nan = decode(case, 3)
    garbage = case.cache.copy()
    garbage[np.isnan(garbage)] = np.float16(6e4)
    case.cache = garbage
    out_big, lse_big = decode(case, 3)
    assert bits(out_nan) == bits(out_big) and bits(lse_nan) == bits(lse_big)
    check_decode(case, out_nan, lse_nan)


def test_unused_block_table_entries_are_ignored(rng):
    """Columns past a request's pages may hold anything (-1 here): never read, never flagged."""
    case = make_case(rng, [70, 1, 0], 4, 1, 16, np.float16, table_pad=-1, extra_columns=3)
    err = kf.new_error_buffer(case.q)
    out, lse = decode(case, error_buffer=err)
    check_decode(case, out, lse)
    assert err.tolist() == [0, -1, 0, 0]


def test_strided_q_and_out(rng):
    """q and out as views with non-compact batch/seq/head strides (last dim contiguous)."""
    case = make_case(rng, [300, 129, 5], 8, 2, 16, np.float16)
    big_q = rng.standard_normal((3, 3, 2 * 8, 576 + 64)).astype(np.float16)
    big_q[:, :2, ::2, :576] = case.q
    q_view = big_q[:, :2, ::2, :576]
    assert not q_view.flags.c_contiguous
    big_out = poisoned((3, 2, 8, 2 * LATENT), np.float16)
    out_view = big_out[..., :LATENT]
    metadata = kf.get_mla_metadata(case.seqlens, 8, 2)
    kf.mla_decode(q_view, case.cache, case.block_table, case.seqlens, metadata,
                  softmax_scale=case.scale, out=out_view, lse=poisoned((3, 8, 2), np.float32))
    ref_out, ref_lse = decode(case)
    assert bits(out_view) == bits(ref_out)
    assert np.isnan(big_out[..., LATENT:]).all(), "wrote outside the out view"


def test_cache_4d_layout(rng):
    """[num_pages, page, 1, 576] caches (FlashMLA's layout) give the same bits as 3-D."""
    case = make_case(rng, [500, 64], 16, 1, 64, np.float16)
    out3, lse3 = decode(case)
    case.cache = case.cache[:, :, None, :]
    out4, lse4 = decode(case)
    assert bits(out3) == bits(out4) and bits(lse3) == bits(lse4)


def test_explicit_workspace(rng):
    case = make_case(rng, [1000, 2000], 16, 1, 64, np.float16)
    workers = 8
    metadata = kf.get_mla_metadata(case.seqlens, 16, 1, num_workers=workers)
    size = kf.workspace_size(2, 16, 1, workers)
    assert size > 0
    workspace = aligned_empty(size)
    out, lse = kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens, metadata,
                             softmax_scale=case.scale, workspace=workspace)
    check_decode(case, out, lse)


def test_softmax_scale_is_used(rng):
    """Two scales give two different results, each matching its reference."""
    case = make_case(rng, [300], 4, 1, 64, np.float16, scale=0.135234)
    out_a, _ = decode(case)
    check_decode(case, out_a, decode(case)[1])
    case.scale = 0.05
    out_b, lse_b = decode(case)
    check_decode(case, out_b, lse_b)
    assert bits(out_a) != bits(out_b)


def test_gil_is_released_during_decode(rng):
    """Another Python thread keeps running while a long decode is in the C library."""
    import threading
    import time

    case = make_case(rng, [12000, 12000], 128, 1, 64, np.float16)
    metadata = kf.get_mla_metadata(case.seqlens, 128)
    done = threading.Event()
    spans = []

    def work():
        t0 = time.perf_counter()
        decode_args = (case.q, case.cache, case.block_table, case.seqlens, metadata)
        kf.mla_decode(*decode_args, softmax_scale=case.scale)
        spans.append(time.perf_counter() - t0)
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    last, max_gap = time.perf_counter(), 0.0
    while not done.is_set():
        now = time.perf_counter()
        max_gap, last = max(max_gap, now - last), now
    worker.join()
    call = spans[0]
    if call < 0.05:
        pytest.skip(f"decode too fast here ({call * 1e3:.1f} ms) to measure")
    assert max_gap < 0.5 * call, f"main thread stalled {max_gap:.3f}s during a {call:.3f}s call"
