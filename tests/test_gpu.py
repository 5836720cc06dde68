"""GPU decode through PyTorch (and CuPy): against the float64 reference and the CPU backend,
bit-identical reruns, CUDA graph replay with new lengths, arrays reaching the C API as they are,
device-side error reporting. Skips without a usable CUDA device or a CUDA build."""

from __future__ import annotations

import numpy as np
import pytest

import kernelflow as kf
from graph_util import capture_graph
from inputs import HEAD, LATENT, check_decode, make_case
from kernel_family import kernel_family  # noqa: F401  (the fixture)
from test_metadata import check_schedule
from kernelflow import reference as ref

# Every test runs with both decode kernel families (kernel_family.py).
pytestmark = [pytest.mark.gpu, pytest.mark.needs_torch, pytest.mark.usefixtures("kernel_family")]

KDL_CUDA = 2


def torch_mod():
    import torch

    return torch


def to_gpu(case, dtype):
    """Move a float32 case to the GPU in `dtype`; the case keeps the rounded values (what the
    reference must see)."""
    torch = torch_mod()
    dt = getattr(torch, dtype)
    q = torch.from_numpy(case.q).to("cuda", dt)
    cache = torch.from_numpy(case.cache).to("cuda", dt)
    case.q, case.cache = q.float().cpu().numpy(), cache.float().cpu().numpy()
    return (q, cache, torch.from_numpy(case.block_table).cuda(),
            torch.from_numpy(case.seqlens).cuda())


def host(t):
    return t.float().cpu().numpy() if t.dtype != torch_mod().float32 else t.cpu().numpy()


def bits_equal(a, b):
    torch = torch_mod()
    if a.dtype in (torch.bfloat16, torch.float16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def gpu_decode(q, cache, bt, sl, scale, num_workers=None, **kw):
    meta = kf.get_mla_metadata(sl, q.shape[2], q.shape[1], num_workers=num_workers)
    return kf.mla_decode(q, cache, bt, sl, meta, softmax_scale=scale, **kw)


MIXED = [0, 1, 63, 64, 65, 1000, 4097, 2]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page", [16, 32, 64])
@pytest.mark.parametrize("h_q", [16, 32, 64, 128])
def test_decode_vs_reference_and_cpu(rng, dtype, page, h_q):
    torch = torch_mod()
    s_q = 1 + (page // 16 + h_q // 16) % 4  # every s_q 1..4 across the grid
    seqlens = rng.permutation(MIXED)[: int(rng.integers(3, len(MIXED) + 1))]
    case = make_case(rng, seqlens, h_q, s_q, page, np.float32)
    q, cache, bt, sl = to_gpu(case, dtype)
    b = len(seqlens)
    out = torch.full((b, s_q, h_q, LATENT), float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full((b, h_q, s_q), float("nan"), device="cuda")
    err = kf.new_error_buffer(q)
    gpu_decode(q, cache, bt, sl, case.scale, out=out, lse=lse, error_buffer=err)
    torch.cuda.synchronize()
    what = f"{dtype} page={page} h_q={h_q} s_q={s_q} {list(seqlens)}"
    check_decode(case, host(out), host(lse), what)
    assert err.tolist() == [0, -1, 0, 0], what
    # The CPU backend on the same stored values.
    cpu_out, cpu_lse = gpu_decode(q.cpu(), cache.cpu(), bt.cpu(), sl.cpu(), case.scale)
    vs_cpu = ref.agreement(host(out), host(lse), host(cpu_out), host(cpu_lse))
    assert vs_cpu.ok, f"{what}: GPU vs CPU backend: {vs_cpu}"


@pytest.mark.parametrize("h_q,s_q,seqlens", [
    (16, 1, [65536, 1, 0, 4097, 30000, 64]),
    (128, 2, [65536, 513]),
])
def test_long_sequences(rng, h_q, s_q, seqlens):
    case = make_case(rng, seqlens, h_q, s_q, 64, np.float32)
    q, cache, bt, sl = to_gpu(case, "bfloat16")
    out, lse = gpu_decode(q, cache, bt, sl, case.scale)
    check_decode(case, host(out), host(lse), f"h_q={h_q} s_q={s_q} {seqlens}")


@pytest.mark.parametrize("h_q", [16, 128])
def test_bit_identical_reruns(rng, h_q):
    torch = torch_mod()
    case = make_case(rng, [20000, 3000, 1, 0, 7777], h_q, 2, 64, np.float32)
    q, cache, bt, sl = to_gpu(case, "bfloat16")
    runs = []
    for _ in range(3):
        out = torch.full((5, 2, h_q, LATENT), float("nan"), dtype=q.dtype, device="cuda")
        runs.append(gpu_decode(q, cache, bt, sl, case.scale, out=out))
    for out, lse in runs[1:]:
        assert bits_equal(out, runs[0][0]) and bits_equal(lse, runs[0][1])


def test_metadata_matches_cpu(rng):
    torch = torch_mod()
    sl = rng.integers(0, 70000, 33).astype(np.int32)
    workers = kf.default_num_workers(0, 16, 1)
    assert workers >= 1
    gpu_meta = kf.get_mla_metadata(torch.from_numpy(sl).cuda(), 16, 1)
    assert gpu_meta.is_cuda and gpu_meta.shape == (kf.metadata_size(33, workers),)
    cpu_meta = kf.get_mla_metadata(sl, 16, 1, num_workers=workers)
    assert np.array_equal(gpu_meta.cpu().numpy(), cpu_meta)


def test_default_workers_one_block_per_sm_for_one_or_two_requests():
    """The 16-row configuration with a 16-bit cache: a call of one or two requests gets one
    worker per SM by default (decode_family_sm80.cu, blocks_per_sm), three or more the format's
    count; other row counts keep the format's count at every batch. get_mla_metadata's default
    follows it, and the GPU metadata equals the CPU walk's for that count."""
    torch = torch_mod()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for fmt in ("bf16", "fp16"):
        for h_q, s_q in ((16, 1), (8, 2)):
            for b in (1, 2):
                assert kf.default_num_workers(0, h_q, s_q, fmt, batch=b) == sms, (fmt, h_q, s_q, b)
            assert kf.default_num_workers(0, h_q, s_q, fmt, batch=3) == \
                kf.default_num_workers(0, h_q, s_q, fmt)
        assert kf.default_num_workers(0, 32, 1, fmt, batch=1) == kf.default_num_workers(0, 32, 1, fmt)
    sl = np.array([4096, 0], np.int32)
    gpu_meta = kf.get_mla_metadata(torch.from_numpy(sl).cuda(), 16, 1)
    assert gpu_meta.shape == (kf.metadata_size(2, sms),)
    cpu_meta = kf.get_mla_metadata(sl, 16, 1, num_workers=sms)
    assert np.array_equal(gpu_meta.cpu().numpy(), cpu_meta)


def expect_cpu_bytes(gpu, cpu, seqlens, h_q, s_q, workers, family, what):
    """The GPU metadata equals the CPU's, except where the sm_90a family asked for the
    half-the-workers placement at small batch (header word 9), which the CPU backend never does:
    then it is a valid schedule with that placement (tests/test_metadata.py's checks; the exact
    bytes against the CPU walk given the flag: GpuSm90aMetadata.SpreadFollowsTheFamily)."""
    gpu = gpu.cpu().numpy()
    if gpu[9] == 1:
        assert family == "sm90a" and h_q * s_q > 16, f"{what}: placement word set by {family}"
        check_schedule(gpu, [int(n) for n in np.maximum(seqlens, 0)], h_q, s_q, workers)
    else:
        assert np.array_equal(gpu, cpu), what


def test_metadata_matches_cpu_random_batches(rng, kernel_family):
    """The GPU's parallel (closed-form) scheduler writes the CPU walk's bytes: random batches and
    worker counts (more workers than tiles included), lengths 0, 1, ordinary and near INT32_MAX,
    batches too large for its shared memory (the walk on the GPU), and equal lengths that line up
    on fewer workers (whole requests)."""
    torch = torch_mod()
    for trial in range(200):
        batch = int(rng.choice([1, 2, 7, 33, 128, 500, 2000]))
        if trial >= 195:
            batch = 6000 + trial  # past the closed form's shared memory: the fallback
        workers = int(rng.integers(1, 1200))
        kind = rng.integers(0, 5, batch)
        sl = np.where(kind == 0, 0, np.where(kind == 1, 1, rng.integers(1, 70000, batch)))
        if trial % 7 == 0:
            sl = np.where(kind == 2, 2**31 - 1 - rng.integers(0, 1000, batch), sl)
        sl = sl.astype(np.int32)
        h_q, s_q = int(rng.choice([1, 16, 128])), int(rng.integers(1, 5))
        gpu = kf.get_mla_metadata(torch.from_numpy(sl).cuda(), h_q, s_q, num_workers=workers)
        cpu = kf.get_mla_metadata(sl, h_q, s_q, num_workers=workers)
        expect_cpu_bytes(gpu, cpu, sl, h_q, s_q, workers, kernel_family,
                         f"trial {trial}: b={batch} W={workers}")
    # Equal lengths on slightly more workers than requests line up on (the scheduler's whole
    # requests, or not when one request is longer): the same bytes too.
    for batch, workers in ((64, 66), (128, 66), (128, 132), (96, 100), (60, 66)):
        for longer in (False, True):
            sl = np.full(batch, int(rng.integers(1, 20000)), np.int32)
            if longer:
                sl[batch // 2] += 64
            gpu = kf.get_mla_metadata(torch.from_numpy(sl).cuda(), 128, 1, num_workers=workers)
            cpu = kf.get_mla_metadata(sl, 128, 1, num_workers=workers)
            expect_cpu_bytes(gpu, cpu, sl, 128, 1, workers, kernel_family,
                             f"b={batch} W={workers} {longer}")


def test_cuda_graph_replay_equals_eager(rng):
    """Metadata + decode captured once; replays with new lengths and new block tables give
    the bits of eager calls."""
    torch = torch_mod()
    h_q, s_q, page, b, max_pages = 16, 1, 64, 4, 40
    num_pages = b * max_pages + 8
    pool = torch.randn(num_pages, page, HEAD, device="cuda").to(torch.bfloat16)
    q = torch.randn(b, s_q, h_q, HEAD, device="cuda").to(torch.bfloat16)
    static_bt = torch.zeros(b, max_pages, dtype=torch.int32, device="cuda")
    static_sl = torch.ones(b, dtype=torch.int32, device="cuda")
    workers = kf.default_num_workers(q, h_q, s_q)
    meta = torch.empty(kf.metadata_size(b, workers), dtype=torch.int32, device="cuda")
    workspace = kf.new_workspace(q, meta)
    out = torch.empty(b, s_q, h_q, LATENT, dtype=q.dtype, device="cuda")
    lse = torch.empty(b, h_q, s_q, device="cuda")

    def step():
        kf.get_mla_metadata(static_sl, h_q, s_q, out=meta)
        kf.mla_decode(q, pool, static_bt, static_sl, meta, softmax_scale=0.114721, out=out,
                      lse=lse, workspace=workspace)

    graph = capture_graph(torch, step)

    for trial in range(4):
        lens = rng.integers(0, max_pages * page + 1, b).astype(np.int32)
        lens[trial % b] = int(rng.choice([0, 1, max_pages * page]))
        tables = np.stack([rng.permutation(num_pages)[:max_pages] for _ in range(b)])
        static_sl.copy_(torch.from_numpy(lens))
        static_bt.copy_(torch.from_numpy(tables.astype(np.int32)))
        graph.replay()
        torch.cuda.synchronize()
        eager_meta = kf.get_mla_metadata(static_sl.clone(), h_q, s_q, num_workers=workers)
        eager_out, eager_lse = kf.mla_decode(q, pool, static_bt.clone(), static_sl.clone(),
                                             eager_meta, softmax_scale=0.114721)
        torch.cuda.synchronize()
        assert torch.equal(meta, eager_meta), f"trial {trial}: metadata"
        assert bits_equal(out, eager_out) and bits_equal(lse, eager_lse), f"trial {trial}"


def test_torch_arrays_reach_c_api_as_they_are(rng):
    """Device, shape and strides of a non-contiguous CUDA tensor reach the C API unchanged, and
    the result proves the strides were used."""
    torch = torch_mod()
    case = make_case(rng, [500, 33, 7], 16, 2, 32, np.float32)
    q, cache, bt, sl = to_gpu(case, "bfloat16")
    q_view = q.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # [b, s, h] over [b, h, s]
    d = kf._C.describe(torch.utils.dlpack.to_dlpack(q_view))
    assert d["device_type"] == KDL_CUDA and d["device_id"] == q.device.index
    assert d["shape"] == tuple(q_view.shape) and d["strides"] == tuple(q_view.stride())
    assert d["data"] == q_view.data_ptr()
    wide = torch.full((3, 2, 16, 2 * LATENT), float("nan"), dtype=q.dtype, device="cuda")
    out_view = wide[..., LATENT:]
    got_out, got_lse = gpu_decode(q_view, cache, bt, sl, case.scale, out=out_view)
    want_out, want_lse = gpu_decode(q, cache, bt, sl, case.scale)
    assert bits_equal(got_out.contiguous(), want_out) and bits_equal(got_lse, want_lse)
    assert torch.isnan(wide[..., :LATENT]).all(), "wrote outside the out view"
    check_decode(case, host(want_out), host(want_lse))


@pytest.mark.parametrize("h_q", [16, 64])
def test_out_view_with_row_gaps(rng, h_q):
    """out given as a view whose rows are 16-byte aligned but not adjacent (the sm_90a kernel
    stores a row as one bulk copy): the same bits as a fresh out, nothing written outside the
    view. Lengths split over many pieces, so o_accum and the combine run too."""
    torch = torch_mod()
    case = make_case(rng, [3000, 70, 0, 1025], h_q, 2, 64, np.float32)
    q, cache, bt, sl = to_gpu(case, "bfloat16")
    wide = torch.full(tuple(q.shape[:3]) + (2 * LATENT,), float("nan"), dtype=q.dtype,
                      device="cuda")
    view = wide[..., LATENT:]
    got_out, got_lse = gpu_decode(q, cache, bt, sl, case.scale, out=view)
    want_out, want_lse = gpu_decode(q, cache, bt, sl, case.scale)
    assert got_out.data_ptr() == view.data_ptr()
    assert bits_equal(got_out.contiguous(), want_out) and bits_equal(got_lse, want_lse)
    assert torch.isnan(wide[..., :LATENT]).all(), "wrote outside the out view"
    check_decode(case, host(want_out), host(want_lse))


def test_explicit_stream(rng):
    torch = torch_mod()
    case = make_case(rng, [900, 3], 16, 1, 64, np.float32)
    q, cache, bt, sl = to_gpu(case, "float16")
    want = gpu_decode(q, cache, bt, sl, case.scale)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the default is the current stream
        got_cur = gpu_decode(q, cache, bt, sl, case.scale)
    got_arg = gpu_decode(q, cache, bt, sl, case.scale, stream=stream)  # a torch.cuda.Stream
    stream.synchronize()
    torch.cuda.synchronize()
    for got in (got_cur, got_arg):
        assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])


def test_device_error_buffer(rng):
    """Bad device-side values are masked and reported, never read out of bounds."""
    torch = torch_mod()
    case = make_case(rng, [100, 50, 70], 16, 1, 16, np.float32, extra_columns=0)
    q, cache, bt, sl = to_gpu(case, "bfloat16")
    capacity = bt.shape[1] * 16
    bad_sl = sl.clone()
    bad_sl[1] = capacity + 1000
    err = kf.new_error_buffer(q)
    gpu_decode(q, cache, bt, bad_sl, case.scale, error_buffer=err)
    torch.cuda.synchronize()
    flags, req, value = err.tolist()[:3]
    assert flags & kf.DEVERR_SEQLEN_RANGE and req == 1 and value == capacity + 1000

    bad_bt = bt.clone()
    bad_bt[2, 0] = cache.shape[0] + 5
    err = kf.new_error_buffer(q)
    out, lse = gpu_decode(q, cache, bad_bt, sl, case.scale, error_buffer=err)
    torch.cuda.synchronize()
    flags, req, value = err.tolist()[:3]
    assert flags & kf.DEVERR_PAGE_RANGE and req == 2 and value == cache.shape[0] + 5
    # The good requests are still right.
    o_ref, lse_ref = case.expected()
    good = ref.agreement(host(out)[:2], host(lse)[:2], o_ref[:2], lse_ref[:2])
    assert good.ok, str(good)

    err = kf.new_error_buffer(q)
    other = kf.get_mla_metadata(sl, 32, 1)  # made for another head count
    kf.mla_decode(q, cache, bt, sl, other, softmax_scale=case.scale, error_buffer=err,
                  workspace=kf.new_workspace(q, other))
    torch.cuda.synchronize()
    assert err.tolist()[0] & kf.DEVERR_METADATA


def test_cache_append_matches_cpu(rng):
    torch = torch_mod()
    cache = torch.full((6, 32, HEAD), float("nan"), dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(50, HEAD, device="cuda").to(torch.bfloat16)
    slots = torch.from_numpy(rng.choice(6 * 32, 50, replace=False).astype(np.int64)).cuda()
    slots[::7] = -1
    cpu_cache = cache.cpu()
    kf.cache_append(kv, cache, slots)
    kf.cache_append(kv.cpu(), cpu_cache, slots.cpu())
    torch.cuda.synchronize()
    assert bits_equal(cache.cpu(), cpu_cache)
    err = kf.new_error_buffer(kv)
    kf.cache_append(kv[:2], cache, torch.tensor([5, 6 * 32 + 3], device="cuda"),
                    error_buffer=err)
    torch.cuda.synchronize()
    assert err.tolist()[:3] == [kf.DEVERR_SLOT_RANGE, 1, 6 * 32 + 3]


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_8bit_gpu_matches_cpu(rng, fmt):
    """docs/spec.md section 4: the same 8-bit cache (same bytes from GPU and CPU append) decoded
    on the GPU and by the CPU backend: worst row below 1e-5, lse within 1e-4."""
    torch = torch_mod()
    page, seqlens = 64, [1024, 2000, 1]
    case = make_case(rng, seqlens, 16, 1, page, np.float32, spare_pages=0, extra_columns=0)
    q, cache16, bt, sl = to_gpu(case, "bfloat16")
    flat = cache16.view(-1, HEAD)
    ok = ~torch.isnan(flat).any(dim=1)
    slots = torch.where(ok, torch.arange(flat.shape[0], device="cuda"), -1)
    cache8 = torch.zeros(cache16.shape[0], page, 644, dtype=torch.uint8, device="cuda")
    cpu8 = cache8.cpu()
    kf.cache_append(torch.nan_to_num(flat), cache8, slots, kv_format=fmt)
    kf.cache_append(torch.nan_to_num(flat).cpu(), cpu8, slots.cpu(), kv_format=fmt)
    torch.cuda.synchronize()
    assert torch.equal(cache8.cpu(), cpu8), "GPU and CPU append write the same bytes"
    gpu_out, gpu_lse = gpu_decode(q, cache8, bt, sl, case.scale, kv_format=fmt)
    cpu_out, cpu_lse = gpu_decode(q.cpu(), cpu8, bt.cpu(), sl.cpu(), case.scale, kv_format=fmt)
    vs_cpu = ref.agreement(host(gpu_out), host(gpu_lse), host(cpu_out), host(cpu_lse))
    assert vs_cpu.ok, str(vs_cpu)
