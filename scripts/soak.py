#!/usr/bin/env python3
"""Soak: one decode step captured in a CUDA graph and replayed many times with changing inputs.

The step is what a serving loop runs per token: kf.cache_append (one new token per request, s_q
with speculative decoding), kf.get_mla_metadata, kf.mla_decode, all with one error buffer. It is
captured once; before each replay the lengths, slot mapping, new rows, block table and q are
changed in place in the captured input tensors (requests grow by one token per step, sit idle
now and then, and restart on fresh pages when full, with NaN left in the pages they give back).

Every --check-every replays (and after the last):
  * the error buffer is still [0, -1, 0, 0];
  * the GPU cache holds the same bytes as a host mirror that the CPU backend appended to;
  * out/lse match the CPU backend run on the mirror (worst row cosine distance < 1e-5, lse
    within 1e-4, rows that see nothing exactly 0 and -inf), and the metadata bytes are equal;
  * the same step run eagerly, and a second replay, give the graph's bits.
Prints one summary line; exits 1 on any failure (2 when no CUDA device is usable).

    python scripts/soak.py                  # 10,000 replays, bf16 cache, b=16, h_q=16
    python scripts/soak.py --format fp8_e4m3 --s-q 2 --iters 2000
    python scripts/soak.py --device cpu --iters 50 --check-every 10   # the script's own self-test
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

try:
    import kernelflow as kf
    from kernelflow import reference as ref
except ImportError as e:  # pragma: no cover
    print(f"soak: FAIL: kernelflow not importable: {e}")
    sys.exit(1)

HEAD, LATENT, BYTES_8BIT = ref.HEAD_DIM, ref.LATENT_DIM, 644
EIGHT_BIT = ("fp8_e4m3", "int8")
CLEAN = [0, -1, 0, 0]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=10_000, help="graph replays")
    ap.add_argument("--check-every", type=int, default=500, help="replays between CPU checks")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--h-q", type=int, default=16)
    ap.add_argument("--s-q", type=int, default=1, help="new tokens per request per step")
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--max-pages", type=int, default=32, help="block_table columns per request")
    ap.add_argument("--format", default="bf16", choices=["bf16", "fp16", "fp8_e4m3", "int8"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                    help="q and row dtype for the 8-bit formats")
    ap.add_argument("--workers", type=int, default=None, help="default: the device's")
    ap.add_argument("--scale", type=float, default=0.114721)
    ap.add_argument("--idle", type=float, default=0.03, help="chance a request skips a step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: no graph, the CPU backend on both sides (tests this script)")
    return ap.parse_args(argv)


class Failure(Exception):
    pass


def compare(g_out, g_lse, c_out, c_lse, lens, s_q, what):
    """GPU vs CPU backend, rows as docs/spec.md section 4 says; returns (worst cos dist, worst lse
    err)."""
    c_lse_np = c_lse.cpu().numpy()
    # Rows that see nothing, from the lengths alone (the causal rule of docs/spec.md section 1).
    if not np.array_equal(np.isneginf(c_lse_np).any(axis=1), ~ref.sees_any(lens, s_q)):
        raise Failure(f"{what}: CPU backend's empty rows disagree with the lengths")
    result = ref.agreement(g_out.float().cpu().numpy(), g_lse.cpu().numpy(),
                           c_out.float().cpu().numpy(), c_lse_np)
    if not result.ok:
        raise Failure(f"{what}: {result}")
    return result.worst_row_cos_dist, result.max_lse_err


def _bytes(t):
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    elif t.dtype == torch.float32:
        t = t.view(torch.int32)
    return t.numpy().tobytes()


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    dev = a.device
    if dev == "cuda" and not (torch.cuda.is_available() and kf.has_cuda() and kf.cuda_device_count()):
        print("soak: SKIPPED: no usable CUDA device (torch or kernelflow sees none); "
              "--device cpu runs the script's self-test")
        return 2
    t_start = time.time()
    rng = np.random.default_rng(a.seed)
    torch.manual_seed(a.seed)
    eight = a.format in EIGHT_BIT
    dtype = getattr(torch, a.dtype if eight else {"bf16": "bfloat16", "fp16": "float16"}[a.format])
    kv_format = a.format if eight else None
    b, h_q, s_q, page, mp = a.batch, a.h_q, a.s_q, a.page, a.max_pages
    cap = mp * page
    num_pages = (b + 1) * mp  # every request's pages plus one request's worth of spares
    if s_q > cap:
        raise SystemExit("--s-q larger than a request's capacity")

    def blank(shape_pages):
        if eight:
            return torch.full((shape_pages, page, BYTES_8BIT), 0xFF, dtype=torch.uint8)
        return torch.full((shape_pages, page, HEAD), float("nan"), dtype=dtype)

    mirror = blank(num_pages)           # the host mirror: appended to by the CPU backend only
    cache = blank(num_pages).to(dev)     # the device cache
    fill_value = 0xFF if eight else float("nan")

    perm = rng.permutation(num_pages)
    owned = [list(perm[r * mp : (r + 1) * mp]) for r in range(b)]
    spare = list(perm[b * mp :])
    lens = np.zeros(b, np.int64)

    def slots_of(r, lo, hi):
        t = np.arange(lo, hi)
        pages = np.array(owned[r], np.int64)[t // page]
        return pages * page + t % page

    def random_rows(n):
        return torch.from_numpy(rng.standard_normal((n, HEAD), dtype=np.float32)).to(dtype)

    def append_both(rows, slots):
        """Eager append outside the graph: the device cache and the host mirror."""
        if len(slots) == 0:
            return
        s = torch.from_numpy(np.asarray(slots, np.int64))
        kf.cache_append(rows.to(dev), cache, s.to(dev), kv_format=kv_format, error_buffer=err)
        kf.cache_append(rows, mirror, s, kv_format=kv_format)

    # Captured inputs and outputs (fixed addresses).
    workers = a.workers or kf.default_num_workers(0 if dev == "cuda" else -1, h_q, s_q,
                                                  kv_format or "bf16")
    q = torch.empty(b, s_q, h_q, HEAD, dtype=dtype, device=dev)
    kv = torch.zeros(b * s_q, HEAD, dtype=dtype, device=dev)
    slot_mapping = torch.full((b * s_q,), -1, dtype=torch.int64, device=dev)
    cache_seqlens = torch.zeros(b, dtype=torch.int32, device=dev)
    block_table = torch.from_numpy(np.array(owned, np.int32)).to(dev)
    meta = torch.zeros(kf.metadata_size(b, workers), dtype=torch.int32, device=dev)
    workspace = kf.new_workspace(q, meta)
    out = torch.zeros(b, s_q, h_q, LATENT, dtype=dtype, device=dev)
    lse = torch.zeros(b, h_q, s_q, dtype=torch.float32, device=dev)
    err = kf.new_error_buffer(q)
    # The eager step's own outputs.
    meta_e, out_e, lse_e = torch.zeros_like(meta), torch.zeros_like(out), torch.zeros_like(lse)

    def step(meta_, out_, lse_):
        kf.cache_append(kv, cache, slot_mapping, kv_format=kv_format, error_buffer=err)
        kf.get_mla_metadata(cache_seqlens, h_q, s_q, out=meta_, kv_format=kv_format or "bf16")
        kf.mla_decode(q, cache, block_table, cache_seqlens, meta_, softmax_scale=a.scale,
                      kv_format=kv_format, out=out_, lse=lse_, workspace=workspace,
                      error_buffer=err)

    # Initial requests: random lengths, written eagerly.
    for r in range(b):
        n = int(rng.integers(0, cap - s_q + 1))
        append_both(random_rows(n), slots_of(r, 0, n))
        lens[r] = n

    if dev == "cuda":
        q.normal_()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture, with nothing to append
            step(meta_e, out_e, lse_e)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(meta, out, lse)
        replay = graph.replay
    else:
        def replay():
            step(meta, out, lse)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    stats = dict(checks=0, resets=0, idle=0, worst=0.0, worst_lse=0.0, max_len=0, appended=0)

    def check(i):
        sync()
        what = f"replay {i}"
        if err.tolist() != CLEAN:
            raise Failure(f"{what}: error buffer {err.tolist()} on valid inputs")
        if _bytes(cache) != _bytes(mirror):
            diff = (cache.cpu().view(torch.uint8) != mirror.view(torch.uint8)).reshape(num_pages, -1)
            raise Failure(f"{what}: device cache differs from the CPU-appended mirror "
                          f"(pages {torch.nonzero(diff.any(1)).flatten()[:8].tolist()})")
        lens_i32 = torch.from_numpy(lens.astype(np.int32))
        c_meta = kf.get_mla_metadata(lens_i32, h_q, s_q, num_workers=workers,
                                     kv_format=kv_format or "bf16")
        if _bytes(c_meta) != _bytes(meta):
            raise Failure(f"{what}: device metadata differs from the CPU scheduler's")
        c_out, c_lse = kf.mla_decode(q.cpu(), mirror, block_table.cpu(), lens_i32, c_meta,
                                     softmax_scale=a.scale, kv_format=kv_format)
        w, wl = compare(out, lse, c_out, c_lse, lens, s_q, what)
        stats["worst"] = max(stats["worst"], w)
        stats["worst_lse"] = max(stats["worst_lse"], wl)
        g_out, g_lse, g_meta = out.clone(), lse.clone(), meta.clone()
        step(meta_e, out_e, lse_e)  # eagerly: the append rewrites the same bytes
        replay()                    # and once more through the graph
        sync()
        if not (_bytes(out_e) == _bytes(g_out) and _bytes(lse_e) == _bytes(g_lse)
                and _bytes(meta_e) == _bytes(g_meta)):
            raise Failure(f"{what}: eager step differs from the graph replay (bits)")
        if not (_bytes(out) == _bytes(g_out) and _bytes(lse) == _bytes(g_lse)):
            raise Failure(f"{what}: a second replay on the same inputs differs (bits)")
        if _bytes(cache) != _bytes(mirror) or err.tolist() != CLEAN:
            raise Failure(f"{what}: rerunning the step changed the cache or reported an error")
        stats["checks"] += 1

    failure = None
    i = 0
    try:
        for i in range(1, a.iters + 1):
            slots = np.full(b * s_q, -1, np.int64)
            for r in range(b):
                if lens[r] + s_q > cap:  # full: the request ends, a new one starts on fresh pages
                    old = owned[r]
                    owned[r], spare[:] = spare[:mp], spare[mp:] + old
                    idx = torch.tensor(old)
                    cache[idx.to(dev)] = fill_value
                    mirror[idx] = fill_value
                    n0 = int(rng.integers(0, 2 * page))
                    append_both(random_rows(n0), slots_of(r, 0, n0))
                    lens[r] = n0
                    stats["resets"] += 1
                if rng.random() < a.idle:
                    stats["idle"] += 1
                    continue
                slots[r * s_q : (r + 1) * s_q] = slots_of(r, lens[r], lens[r] + s_q)
                lens[r] += s_q
            rows = random_rows(b * s_q)
            kv.copy_(rows)
            slot_mapping.copy_(torch.from_numpy(slots))
            cache_seqlens.copy_(torch.from_numpy(lens.astype(np.int32)))
            block_table.copy_(torch.from_numpy(np.array(owned, np.int32)))
            q.normal_()
            kf.cache_append(rows, mirror, torch.from_numpy(slots), kv_format=kv_format)
            stats["appended"] += int((slots >= 0).sum())
            stats["max_len"] = max(stats["max_len"], int(lens.max()))
            replay()
            if i % a.check_every == 0 or i == a.iters:
                check(i)
    except Failure as e:
        failure = str(e)
    except Exception as e:  # a library error (ValueError, RuntimeError) is a failure too
        failure = f"replay {i}: {type(e).__name__}: {e}"

    secs = time.time() - t_start
    cfg = (f"{a.format}{'/' + a.dtype if eight else ''}, b={b}, h_q={h_q}, s_q={s_q}, "
           f"page {page}, {mp} pages/request, {workers} workers, {dev}")
    body = (f"{i if failure else a.iters} replays ({cfg}), {stats['checks']} checks vs CPU backend "
            f"(worst row cos dist {stats['worst']:.2e}, worst lse err {stats['worst_lse']:.2e}), "
            f"{stats['checks']} eager==graph and replay==replay bit checks, "
            f"{stats['appended']} tokens appended, {stats['resets']} request restarts, "
            f"{stats['idle']} idle steps, max len {stats['max_len']}, {secs:.1f} s")
    if failure:
        print(f"soak: FAIL: {failure} | {body}")
        return 1
    print(f"soak: PASS: {body}; error buffer clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
