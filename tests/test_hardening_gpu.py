"""Hardening on the GPU (PyTorch): a random sweep of shapes, lengths, page sizes and formats
against the CPU backend on the same inputs, and the Python side of the device error buffer
(flags, first bad request and value, caller-owned reset, CUDA graphs). Skips without a usable
CUDA device, a CUDA build or PyTorch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kernelflow as kf
from graph_util import capture_graph
from kernel_family import kernel_family  # noqa: F401  (the fixture)
from test_metadata import check_schedule
from kernelflow import reference as ref

# Every test runs with both decode kernel families (kernel_family.py).
pytestmark = [pytest.mark.gpu, pytest.mark.needs_torch, pytest.mark.usefixtures("kernel_family")]

HEAD, LATENT, BYTES_8BIT = ref.HEAD_DIM, ref.LATENT_DIM, 644
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
CLEAN = [0, -1, 0, 0]


def torch_mod():
    import torch

    return torch


def bits_equal(a, b):
    torch = torch_mod()
    if a.dtype in (torch.bfloat16, torch.float16):
        return torch.equal(a.view(torch.int16).cpu(), b.view(torch.int16).cpu())
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32).cpu(), b.view(torch.int32).cpu())
    return torch.equal(a.cpu(), b.cpu())


# ---- problems built on the CPU, copied to the GPU ---------------------------------------------

def make_problem(rng, fmt, dtype, page, h_q, s_q, seqlens, extra_columns=1, table_pad=INT32_MAX,
                 spare_pages=2):
    """CPU torch tensors: q, cache (NaN / 0xff past every length and in spare pages), block
    table (pages scattered, `table_pad` in unused columns), lengths; plus the rows and slots
    that filled an 8-bit cache (the GPU appends the same)."""
    torch = torch_mod()
    dt = getattr(torch, dtype)
    batch = len(seqlens)
    need = [math.ceil(n / page) for n in seqlens]
    max_pages = max(need + [1]) + extra_columns
    num_pages = sum(need) + spare_pages
    perm = rng.permutation(num_pages)
    block_table = np.full((batch, max_pages), table_pad, np.int32)
    start = 0
    for r in range(batch):
        block_table[r, : need[r]] = perm[start : start + need[r]]
        start += need[r]
    q = torch.from_numpy(rng.standard_normal((batch, s_q, h_q, HEAD), dtype=np.float32)).to(dt)
    rows, slots = [], []
    for r, n in enumerate(seqlens):
        t = np.arange(n)
        slots.append(block_table[r, t // page].astype(np.int64) * page + t % page)
        rows.append(rng.standard_normal((n, HEAD), dtype=np.float32))
    kv = torch.from_numpy(np.concatenate(rows)).to(dt)
    slot_mapping = torch.from_numpy(np.concatenate(slots).astype(np.int64))
    if fmt in ("fp8_e4m3", "int8"):
        cache = torch.full((num_pages, page, BYTES_8BIT), 0xFF, dtype=torch.uint8)
        if len(slot_mapping):
            kf.cache_append(kv, cache, slot_mapping, kv_format=fmt)
    else:
        cache = torch.full((num_pages * page, HEAD), float("nan"), dtype=dt)
        cache[slot_mapping] = kv
        cache = cache.view(num_pages, page, HEAD)
    return dict(q=q, cache=cache, block_table=torch.from_numpy(block_table),
                seqlens=torch.tensor(seqlens, dtype=torch.int32), kv=kv, slots=slot_mapping,
                fmt=fmt, h_q=h_q, s_q=s_q)


def decode_on(p, device, num_workers, scale, **kw):
    metadata = kf.get_mla_metadata(p["seqlens"].to(device), p["h_q"], p["s_q"],
                                   num_workers=num_workers)
    fmt = p["fmt"] if p["fmt"] in ("fp8_e4m3", "int8") else None
    out, lse = kf.mla_decode(p["q"].to(device), p["cache"].to(device),
                             p["block_table"].to(device), p["seqlens"].to(device), metadata,
                             softmax_scale=scale, kv_format=fmt, **kw)
    return out, lse, metadata


def compare(gpu_out, gpu_lse, cpu_out, cpu_lse, what):
    """The GPU's (out, lse) against the CPU backend's on the same inputs: rows the CPU backend
    leaves empty (lse -inf) exactly 0 and -inf, the others within docs/spec.md section 4's
    bounds."""
    result = ref.agreement(gpu_out.float().cpu().numpy(), gpu_lse.cpu().numpy(),
                           cpu_out.float().numpy(), cpu_lse.numpy())
    assert result.ok, f"{what}: {result}"


# ---- the sweep ----------------------------------------------------------------------------------

# CPU time per case stays bounded: query rows x cached tokens.
SWEEP_WORK = 3_000_000


def sweep_case(seed):
    rng = np.random.default_rng(10_000 + seed)
    fmt = str(rng.choice(["bf16", "fp16", "bf16", "fp16", "fp8_e4m3", "int8"]))
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(fmt) or str(rng.choice(["bfloat16", "float16"]))
    if fmt in ("fp8_e4m3", "int8"):
        page = int(rng.choice([16, 32, 64, 64, 128]))
    else:
        page = int(rng.choice([16, 32, 64, 64, 1, 8, 128, 256]))
    h_q = int(rng.choice([16, 16, 128, 1, 8, 32, 64, 100]))
    s_q = int(rng.choice([1, 1, 1, 2, 3, 4, 8, 16]))
    batch = int(rng.choice([1, 2, 5, 16, 33, 64, 128]))
    max_len = max(1, min(16384, SWEEP_WORK // (h_q * s_q * batch)))
    seqlens = rng.integers(0, max_len + 1, batch)
    seqlens[rng.random(batch) < 0.1] = 0
    if batch > 1:
        seqlens[rng.integers(0, batch)] = max_len  # one long request among short ones
    workers = None if rng.random() < 0.5 else int(rng.integers(1, 300))
    scale = float(rng.choice([0.114721, 0.135234, 576**-0.5]))
    return dict(fmt=fmt, dtype=dtype, page=page, h_q=h_q, s_q=s_q,
                seqlens=[int(x) for x in seqlens], workers=workers, scale=scale,
                extra_columns=int(rng.integers(0, 3)),
                table_pad=int(rng.choice([0, -1, INT32_MAX, INT32_MIN])), seed=seed)


@pytest.mark.parametrize("seed", range(40))
def test_random_sweep_matches_cpu_backend(seed, kernel_family):
    """A random shape per seed: the GPU (metadata, append for 8-bit, decode) against the CPU
    backend on the same inputs; same metadata bytes (or, where the sm_90a family asked for the
    half-the-workers placement, header word 9, a valid schedule with it); the error buffer stays
    clean."""
    torch = torch_mod()
    c = sweep_case(seed)
    what = str(c)
    rng = np.random.default_rng(seed)
    p = make_problem(rng, c["fmt"], c["dtype"], c["page"], c["h_q"], c["s_q"], c["seqlens"],
                     extra_columns=c["extra_columns"], table_pad=c["table_pad"])
    workers = c["workers"] or kf.default_num_workers(0, c["h_q"], c["s_q"])
    gp = dict(p)
    if c["fmt"] in ("fp8_e4m3", "int8"):
        # The GPU writes its own 8-bit cache from the same rows: the CPU's bytes.
        gcache = torch.full(p["cache"].shape, 0xFF, dtype=torch.uint8, device="cuda")
        if len(p["slots"]):
            kf.cache_append(p["kv"].cuda(), gcache, p["slots"].cuda(), kv_format=c["fmt"])
        torch.cuda.synchronize()
        assert torch.equal(gcache.cpu(), p["cache"]), f"{what}: GPU append bytes differ"
        gp["cache"] = gcache
    err = kf.new_error_buffer(p["q"].cuda())
    out_gpu = torch.full((len(c["seqlens"]), c["s_q"], c["h_q"], LATENT), float("nan"),
                         dtype=p["q"].dtype, device="cuda")
    g_out, g_lse, g_meta = decode_on(gp, "cuda", workers, c["scale"], out=out_gpu,
                                     error_buffer=err)
    torch.cuda.synchronize()
    c_out, c_lse, c_meta = decode_on(p, "cpu", workers, c["scale"])
    if int(g_meta[9]) == 1:
        assert kernel_family == "sm90a" and c["h_q"] * c["s_q"] > 16, f"{what}: placement word"
        check_schedule(g_meta.cpu().numpy(), c["seqlens"], c["h_q"], c["s_q"], workers, c["fmt"])
    else:
        assert torch.equal(g_meta.cpu(), c_meta), f"{what}: metadata differs from the CPU scheduler"
    compare(g_out, g_lse, c_out, c_lse, what)
    assert err.tolist() == CLEAN, f"{what}: clean inputs reported {err.tolist()}"


# ---- the error buffer from Python ---------------------------------------------------------------

def gpu_problem(rng, seqlens, page=32, h_q=16, extra_columns=1):
    p = make_problem(rng, "bf16", "bfloat16", page, h_q, 1, seqlens, extra_columns=extra_columns)
    return {k: (v.cuda() if hasattr(v, "cuda") else v) for k, v in p.items()}


def run(p, err, workers=8, **kw):
    metadata = kf.get_mla_metadata(p["seqlens"], p["h_q"], p["s_q"], num_workers=workers)
    out, lse = kf.mla_decode(p["q"], p["cache"], p["block_table"], p["seqlens"], metadata,
                             softmax_scale=0.114721, error_buffer=err, **kw)
    torch_mod().cuda.synchronize()
    return out, lse


def test_new_error_buffer_is_clean_int32_on_the_device(rng):
    torch = torch_mod()
    p = gpu_problem(rng, [50])
    err = kf.new_error_buffer(p["q"])
    assert err.dtype == torch.int32 and err.is_cuda and err.shape == (kf.ERROR_BUFFER_LEN,)
    assert err.tolist() == CLEAN
    assert (kf.DEVERR_SEQLEN_RANGE, kf.DEVERR_PAGE_RANGE, kf.DEVERR_METADATA,
            kf.DEVERR_SLOT_RANGE) == (1, 2, 4, 8)


@pytest.mark.parametrize("bad", [-1, -100, INT32_MIN])
def test_negative_length_reported_and_empty(rng, bad):
    p = gpu_problem(rng, [100, 60, 80])
    p["seqlens"][1] = bad
    err = kf.new_error_buffer(p["q"])
    out, lse = run(p, err)
    assert err.tolist() == [kf.DEVERR_SEQLEN_RANGE, 1, bad, 0]
    assert (out[1] == 0).all() and bool(lse[1].isneginf().all())


def test_length_beyond_block_table_reported(rng):
    p = gpu_problem(rng, [100, 60, 80], extra_columns=0)
    cap = p["block_table"].shape[1] * 32
    p["seqlens"][2] = cap + 5
    err = kf.new_error_buffer(p["q"])
    out, lse = run(p, err)
    flags, req, value, spare = err.tolist()
    assert flags & kf.DEVERR_SEQLEN_RANGE and req == 2 and spare == 0
    # Request 2 is clamped to `cap`: positions past its length in its last page hold NaN and the
    # unused column holds INT32_MAX (a page report), so only the flag and request are pinned.
    assert value in (cap + 5, INT32_MAX)
    assert bool(out[:2].isfinite().all())


@pytest.mark.parametrize("which", ["num_pages", "-1", "INT32_MAX", "INT32_MIN"])
def test_bad_page_reported_others_right(rng, which):
    p = gpu_problem(rng, [100, 60, 80])
    num_pages = p["cache"].shape[0]
    bad = {"num_pages": num_pages, "-1": -1, "INT32_MAX": INT32_MAX, "INT32_MIN": INT32_MIN}[which]
    good_out, good_lse = run(p, None)
    p["block_table"][0, 1] = bad
    err = kf.new_error_buffer(p["q"])
    out, lse = run(p, err)
    assert err.tolist() == [kf.DEVERR_PAGE_RANGE, 0, bad, 0]
    assert bool(out[0].isfinite().all()), "the masked request must stay finite"
    assert bits_equal(out[1:], good_out[1:]) and bits_equal(lse[1:], good_lse[1:])


def test_slot_beyond_cache_reported_and_skipped(rng):
    torch = torch_mod()
    cache = torch.full((4, 16, HEAD), float("nan"), dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, HEAD, device="cuda").to(torch.bfloat16)
    for bad, word2 in ((64, 64), (2**40 + 7, 7), (2**63 - 1, -1)):
        before = cache.clone()
        slots = torch.tensor([5, bad, -1, 63], dtype=torch.int64, device="cuda")
        err = kf.new_error_buffer(kv)
        kf.cache_append(kv, cache, slots, error_buffer=err)
        torch.cuda.synchronize()
        assert err.tolist() == [kf.DEVERR_SLOT_RANGE, 1, word2, 0], "word 2 is the value as int32"
        assert bits_equal(cache.view(-1, HEAD)[5], kv[0]) and bits_equal(cache.view(-1, HEAD)[63], kv[3])
        mask = torch.ones(64, dtype=torch.bool)
        mask[[5, 63]] = False
        assert bits_equal(cache.view(-1, HEAD)[mask.cuda()], before.view(-1, HEAD)[mask.cuda()])


def test_flags_accumulate_until_the_caller_resets(rng):
    """The library ORs flags and keeps the first fault; only the caller clears the buffer."""
    torch = torch_mod()
    p = gpu_problem(rng, [100, 60, 80])
    err = kf.new_error_buffer(p["q"])
    run(p, err)
    assert err.tolist() == CLEAN
    bad_page = p["cache"].shape[0] + 2
    p["block_table"][2, 0] = bad_page
    run(p, err)
    assert err.tolist() == [kf.DEVERR_PAGE_RANGE, 2, bad_page, 0]
    kv = torch.randn(1, HEAD, device="cuda").to(torch.bfloat16)
    too_far = p["cache"].shape[0] * 32
    kf.cache_append(kv, p["cache"], torch.tensor([too_far], device="cuda"), error_buffer=err)
    torch.cuda.synchronize()
    assert err.tolist() == [kf.DEVERR_PAGE_RANGE | kf.DEVERR_SLOT_RANGE, 2, bad_page, 0]
    err.copy_(torch.tensor(CLEAN, dtype=torch.int32))  # the caller's reset
    p["block_table"][2, 0] = 0
    p["seqlens"][0] = -9
    run(p, err)
    assert err.tolist() == [kf.DEVERR_SEQLEN_RANGE, 0, -9, 0]


def test_longer_buffer_words_past_two_untouched(rng):
    torch = torch_mod()
    p = gpu_problem(rng, [100, 60])
    p["block_table"][1, 0] = -5
    err = torch.tensor([0, -1, 0] + [12345] * 5, dtype=torch.int32, device="cuda")
    run(p, err)
    assert err.tolist() == [kf.DEVERR_PAGE_RANGE, 1, -5] + [12345] * 5


@pytest.mark.parametrize("bad,exc,match", [
    ("cpu", ValueError, "error_buffer"),
    ("int64", ValueError, "error_buffer"),
    ("short", ValueError, "error_buffer"),
    ("strided", ValueError, "error_buffer"),
])
def test_error_buffer_validated(rng, bad, exc, match):
    torch = torch_mod()
    p = gpu_problem(rng, [40])
    err = {
        "cpu": torch.tensor(CLEAN, dtype=torch.int32),
        "int64": torch.tensor(CLEAN, dtype=torch.int64, device="cuda"),
        "short": torch.tensor(CLEAN[:3], dtype=torch.int32, device="cuda"),
        "strided": torch.tensor(CLEAN * 2, dtype=torch.int32, device="cuda")[::2],
    }[bad]
    with pytest.raises(exc, match=match):
        run(p, err)


def test_reported_inside_cuda_graph_replays(rng):
    """Lengths and block-table entries changed in place between replays are judged per replay;
    the buffer is the caller's to reset, in place, between replays."""
    torch = torch_mod()
    p = gpu_problem(rng, [100, 60, 80])
    workers = 8
    meta = torch.empty(kf.metadata_size(3, workers), dtype=torch.int32, device="cuda")
    ws = kf.new_workspace(p["q"], meta)
    out = torch.empty(3, 1, 16, LATENT, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(3, 16, 1, device="cuda")
    err = kf.new_error_buffer(p["q"])

    def step():
        kf.get_mla_metadata(p["seqlens"], 16, 1, out=meta)
        kf.mla_decode(p["q"], p["cache"], p["block_table"], p["seqlens"], meta,
                      softmax_scale=0.114721, out=out, lse=lse, workspace=ws, error_buffer=err)

    graph = capture_graph(torch, step)
    clean = torch.tensor(CLEAN, dtype=torch.int32, device="cuda")
    err.copy_(clean)
    graph.replay()
    torch.cuda.synchronize()
    assert err.tolist() == CLEAN
    good_out = out.clone()
    p["seqlens"][1] = -4
    graph.replay()
    torch.cuda.synchronize()
    assert err.tolist() == [kf.DEVERR_SEQLEN_RANGE, 1, -4, 0]
    p["seqlens"][1] = 60
    p["block_table"][2, 1] = 10**6
    err.copy_(clean)
    graph.replay()
    torch.cuda.synchronize()
    assert err.tolist() == [kf.DEVERR_PAGE_RANGE, 2, 10**6, 0]
    assert bits_equal(out[:2], good_out[:2])


def test_append_eager_and_graph_bit_identical(rng):
    torch = torch_mod()
    cache_e = torch.full((8, 32, HEAD), float("nan"), dtype=torch.float16, device="cuda")
    cache_g = cache_e.clone()
    kv = torch.randn(40, HEAD, device="cuda").to(torch.float16)
    slots = torch.from_numpy(rng.permutation(256)[:40].astype(np.int64)).cuda()
    slots[::9] = -1
    kf.cache_append(kv, cache_e, slots)
    graph = capture_graph(torch, lambda: kf.cache_append(kv, cache_g, slots),
                          warmup=lambda: kf.cache_append(kv, cache_g.clone(), slots))
    graph.replay()
    torch.cuda.synchronize()
    assert bits_equal(cache_e, cache_g)
