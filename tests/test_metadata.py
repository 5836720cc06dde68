"""The split scheduler, seen through the metadata it writes (layout of src/core/scheduler.h):
every KV tile is covered exactly once, pieces are numbered per request in KV order, each
worker's cost stays within the bound, and the same lengths give the same bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelflow as kf

HEADER, WORKER_LEN, BLOCK_N = 16, 8, 64
MAGIC, VERSION = 0x4B464D44, 3
# The scheduler's fixed cost per piece, by the cache format the metadata is made for.
FIXED_COST = {"bf16": 1, "fp16": 1, "fp8_e4m3": 1, "int8": 1}


def tiles(n):
    return 0 if n <= 0 else math.ceil(n / BLOCK_N)


def active_workers(seqlens, workers, fixed):
    """The workers the line is cut for (src/core/scheduler.h, "Whole requests"): fewer than
    `workers` only when a count >= 19/20 of it gives every worker whole requests."""
    batch = len(seqlens)
    if batch < 1 or workers < 2:
        return workers
    q = -(-batch // workers)
    cand = -(-batch // q)
    if not (cand < workers and 20 * cand >= 19 * workers):
        return workers
    segs = [tiles(n) + fixed for n in seqlens]
    starts = np.concatenate([[0], np.cumsum(segs)])
    total = int(starts[-1])
    for w in range(1, cand):
        c = total * w // cand
        r = int(np.searchsorted(starts, c, side="right")) - 1
        if r < batch and c - starts[r] > fixed:
            return workers
    return cand


def spread_half(seqlens, workers, fixed, allowed):
    """Whether the line is cut for workers / 2 workers placed on the even ones (src/core/
    scheduler.h, "Half the workers"): allowed by the call (header word 9: the CUDA decode
    family's choice, never the CPU backend's), workers even, W / 4 < T < W, and the
    whole-request rule not taken."""
    line = sum(tiles(n) + fixed for n in seqlens)
    return (allowed and workers >= 4 and workers % 2 == 0 and line < workers
            and 4 * line > workers and active_workers(seqlens, workers, fixed) == workers)


def decode_metadata(meta, seqlens):
    """-> header dict, piece_offset, and per worker the pieces (req, begin, end, piece)."""
    meta = np.asarray(meta).astype(np.int64)
    header = dict(magic=meta[0], version=meta[1], batch=meta[2], h_q=meta[3], s_q=meta[4],
                  workers=meta[5], block_n=meta[6], total=meta[7], fixed_cost=meta[8],
                  spread=meta[9])
    batch, workers = int(meta[2]), int(meta[5])
    w = meta[HEADER : HEADER + workers * WORKER_LEN].reshape(workers, WORKER_LEN)
    piece_offset = meta[HEADER + workers * WORKER_LEN : HEADER + workers * WORKER_LEN + batch + 1]
    pieces = []
    for k in range(workers):
        sr, stile, er, etile, first = (int(v) for v in w[k, :5])
        mine = []
        if (sr, stile) != (er, etile):
            piece = first
            r = sr
            while r < batch and (r < er or (r == er and etile > 0)):
                n = int(seqlens[r])
                lo = stile if r == sr else 0
                hi = etile if r == er else tiles(n)
                if r != sr:
                    piece = int(piece_offset[r])
                mine.append((r, lo * BLOCK_N, min(hi * BLOCK_N, n), piece))
                r += 1
        pieces.append(mine)
    return header, piece_offset, pieces


def check_schedule(meta, seqlens, h_q, s_q, workers, kv_format="bf16"):
    seqlens = [int(n) for n in seqlens]
    batch = len(seqlens)
    assert len(meta) == kf.metadata_size(batch, workers)
    header, piece_offset, pieces = decode_metadata(meta, seqlens)
    assert (header["magic"], header["version"]) == (MAGIC, VERSION)
    assert (header["batch"], header["h_q"], header["s_q"]) == (batch, h_q, s_q)
    assert (header["workers"], header["block_n"]) == (workers, BLOCK_N)
    fixed = FIXED_COST[kv_format]
    assert header["fixed_cost"] == fixed
    total = int(header["total"])
    m = np.asarray(meta).astype(np.int64)
    assert header["spread"] in (0, 1)
    assert not m[10:HEADER].any(), "reserved header words are zero"
    w = m[HEADER : HEADER + workers * WORKER_LEN].reshape(workers, WORKER_LEN)
    assert not w[:, 5:].any(), "reserved worker words are zero"
    assert tuple(w[0, :2]) == (0, 0) and tuple(w[-1, 2:4]) == (batch, 0)
    assert np.array_equal(w[1:, 0:2], w[:-1, 2:4]), "each worker starts where the last ended"
    assert piece_offset[0] == 0 and piece_offset[batch] == total
    assert np.all(np.diff(piece_offset) >= 1), "every request has at least one piece"
    assert total <= batch + workers, "at most one extra piece per cut"

    # Coverage: each request's pieces, in piece order, tile [0, len) without gap or overlap.
    by_request = {r: [] for r in range(batch)}
    for mine in pieces:
        for r, lo, hi, piece in mine:
            by_request[r].append((piece, lo, hi))
    seen_pieces = sorted(p for r in by_request for p, _, _ in by_request[r])
    assert seen_pieces == list(range(total)), "each piece index used exactly once"
    for r, plist in by_request.items():
        plist.sort()
        assert [p for p, _, _ in plist] == list(range(piece_offset[r], piece_offset[r + 1]))
        pos = 0
        for _, lo, hi in plist:
            assert lo == pos and (hi > lo or seqlens[r] == 0), f"request {r}: {plist}"
            assert lo % BLOCK_N == 0
            pos = hi
        assert pos == seqlens[r], f"request {r} covered up to {pos} of {seqlens[r]}"

    # Workers in order: each starts where the previous ended (lexicographic (req, tile)).
    flat = [(r, lo) for mine in pieces for r, lo, _, _ in mine]
    assert flat == sorted(flat)

    # Bound: cost = tiles + fixed cost per piece, at most ceil(T / W_a) + one fixed cost.
    line = sum(tiles(n) + fixed for n in seqlens)
    active = active_workers(seqlens, workers, fixed)
    if spread_half(seqlens, workers, fixed, header["spread"] == 1):
        active = workers // 2
        assert all(not mine for mine in pieces[1::2]), "spread: odd workers get nothing"
    elif active < workers:
        assert total == batch, "whole requests: one piece each"
        assert all(not mine for mine in pieces[active:]), "workers past W_a get nothing"
    bound = math.ceil(line / active) + fixed
    for k, mine in enumerate(pieces):
        cost = sum(tiles(hi - lo) + fixed for _, lo, hi, _ in mine)
        assert cost <= bound, f"worker {k}: cost {cost} > bound {bound}"


@settings(max_examples=150, deadline=None)
@given(
    seqlens=st.lists(st.one_of(st.integers(0, 300), st.integers(0, 70000)), min_size=1,
                     max_size=40),
    workers=st.integers(1, 160),
    h_q=st.integers(1, 128),
    s_q=st.integers(1, 16),
    kv_format=st.sampled_from(sorted(FIXED_COST)),
)
def test_schedule_properties(seqlens, workers, h_q, s_q, kv_format):
    sl = np.array(seqlens, np.int32)
    meta = kf.get_mla_metadata(sl, h_q, s_q, num_workers=workers, kv_format=kv_format)
    assert meta.dtype == np.int32
    check_schedule(meta, seqlens, h_q, s_q, workers, kv_format)
    again = kf.get_mla_metadata(sl.copy(), h_q, s_q, num_workers=workers, kv_format=kv_format)
    assert np.array_equal(meta, again), "same lengths, same metadata"


def test_default_workers_and_size():
    sl = np.array([10, 20000, 0], np.int32)
    workers = kf.default_num_workers("cpu", 16, 1)
    assert workers >= 1
    assert kf.default_num_workers(-1, 16, 1) == workers
    assert kf.default_num_workers(sl, 16, 1) == workers
    for fmt in ("bf16", "fp16", "fp8_e4m3", "int8"):
        assert kf.default_num_workers("cpu", 16, 2, kv_format=fmt) == workers
        for b in (1, 64, 4096):  # the CPU backend runs one kernel at every batch
            assert kf.default_num_workers("cpu", 16, 2, kv_format=fmt, batch=b) == workers
    with pytest.raises(ValueError, match="batch"):
        kf.default_num_workers("cpu", 16, batch=0)
    meta = kf.get_mla_metadata(sl, 16)
    assert meta.shape == (kf.metadata_size(3, workers),)
    from kernelflow import mla
    assert (int(meta[0]), int(meta[1])) == (mla._META_MAGIC, mla._META_VERSION)
    check_schedule(meta, sl, 16, 1, workers)


@pytest.mark.parametrize("batch,workers,active", [(64, 66, 64), (128, 66, 64), (128, 132, 128),
                                                  (60, 66, 66), (127, 66, 66)])
def test_whole_requests_when_they_line_up(batch, workers, active):
    """Equal requests, b = q W' with W' >= 19/20 of the workers: W' workers get q whole requests
    each and the rest nothing (no request split, nothing to combine). 60 of 66 is below 19/20
    and 127 requests do not line up on 64 workers: all workers, requests split."""
    seqlens = [4096] * batch
    meta = kf.get_mla_metadata(np.array(seqlens, np.int32), 128, 1, num_workers=workers)
    check_schedule(meta, seqlens, 128, 1, workers)
    assert active_workers(seqlens, workers, 1) == active
    header, _, pieces = decode_metadata(meta, seqlens)
    busy = sum(1 for mine in pieces if mine)
    if active < workers:
        assert header["total"] == batch and busy == active
        assert all(len(mine) == batch // active for mine in pieces[:active])
    else:
        assert header["total"] > batch and busy == workers
    # One request a tile longer: the cuts no longer line up, all workers run.
    longer = list(seqlens)
    longer[3] += 64
    meta = kf.get_mla_metadata(np.array(longer, np.int32), 128, 1, num_workers=workers)
    check_schedule(meta, longer, 128, 1, workers)
    assert sum(1 for mine in decode_metadata(meta, longer)[2] if mine) == workers


def test_cpu_metadata_keeps_every_worker():
    """The CPU backend never asks for the half-the-workers placement (header word 9 is 0): one
    4096-token request at 128 rows on 66 workers is cut for all of them."""
    seqlens = [4096]
    meta = kf.get_mla_metadata(np.array(seqlens, np.int32), 128, 1, num_workers=66)
    check_schedule(meta, seqlens, 128, 1, 66)
    header, piece_offset, _ = decode_metadata(meta, seqlens)
    assert header["spread"] == 0 and piece_offset[1] == 64


def test_balanced_split_of_one_long_request():
    """One 64k-token request over 32 workers: every worker gets a share."""
    meta = kf.get_mla_metadata(np.array([65536], np.int32), 16, 1, num_workers=32)
    _, piece_offset, pieces = decode_metadata(meta, [65536])
    assert piece_offset[1] == 32
    sizes = [hi - lo for mine in pieces for _, lo, hi, _ in mine]
    assert len(sizes) == 32 and max(sizes) - min(sizes) <= 6 * BLOCK_N


def test_kv_format_sets_the_fixed_cost():
    """Metadata records the fixed cost per piece of the cache format it is made for."""
    sl = np.full(8, 4096, np.int32)
    for fmt in FIXED_COST:
        meta = kf.get_mla_metadata(sl, 16, num_workers=64, kv_format=fmt)
        check_schedule(meta, sl, 16, 1, 64, fmt)
    with pytest.raises(ValueError, match="kv_format"):
        kf.get_mla_metadata(sl, 16, num_workers=64, kv_format="fp8")


def test_metadata_is_written_entirely():
    sl = np.array([100, 5], np.int32)
    meta = kf.get_mla_metadata(sl, 16, num_workers=4)
    fresh = np.full_like(meta, -7)
    assert kf.get_mla_metadata(sl, 16, out=fresh) is fresh  # worker count from out's length
    assert np.array_equal(meta, fresh)
    with pytest.raises(ValueError, match="out"):
        kf.get_mla_metadata(sl, 16, out=fresh[:-1])


def test_workspace_size_grows_with_work():
    small = kf.workspace_size(1, 16, 1, 4)
    assert kf.workspace_size(8, 16, 1, 4) > small
    assert kf.workspace_size(1, 128, 1, 4) > small
    assert kf.workspace_size(1, 16, 1, 64) > small
    assert kf.workspace_size(4, 16, 2, 8) % 256 == 0


@pytest.mark.parametrize("fmt,per_token", [("bf16", 1152), ("fp16", 1152), ("int8", 644),
                                           ("fp8_e4m3", 644)])
def test_cache_sizes(fmt, per_token):
    assert kf.cache_bytes_per_token(fmt) == per_token
    assert kf.cache_bytes_per_page(fmt, 64) == 64 * per_token
