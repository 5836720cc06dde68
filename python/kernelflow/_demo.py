"""`python -m kernelflow demo`: one DeepSeek-V2-Lite-shaped decode step, checked and timed.

h_q = 16, s_q = 1, four requests of a few thousand cached tokens (mixed lengths), page 64, bf16,
softmax_scale = 0.114721, N(0, 1) data. Pages are scattered and the padding of each request's last
page holds NaN, which must not reach the result. The check is an independent NumPy float64
reference: worst-row cosine distance < 1e-5 and lse within 1e-4 (SPEC.md section 4).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import kernelflow as kf

H_Q, S_Q, PAGE = 16, 1, 64
SEQLENS = [4096, 1337, 3000, 2049]
SOFTMAX_SCALE = 0.114721
MAX_COS_DIST, MAX_LSE_ERR = 1e-5, 1e-4


def reference(q, cache, block_table, seqlens, scale):
    """float64 MLA decode: q [b, s_q, h, 576], cache [pages, page, 576] -> o, lse [b, h, s_q]."""
    b, s_q, h, _ = q.shape
    page = cache.shape[1]
    o = np.zeros((b, s_q, h, 512))
    lse = np.full((b, h, s_q), -np.inf)
    for r in range(b):
        n = int(seqlens[r])
        pages = block_table[r, : -(-n // page)]
        kv = cache[pages].reshape(-1, cache.shape[-1])[:n]
        for s in range(s_q):
            visible = min(max(n - s_q + s + 1, 0), n)
            if visible == 0:
                continue
            scores = scale * (q[r, s] @ kv[:visible].T)  # [h, visible]
            m = scores.max(axis=1, keepdims=True)
            p = np.exp(scores - m)
            total = p.sum(axis=1, keepdims=True)
            o[r, s] = (p @ kv[:visible, :512]) / total
            lse[r, :, s] = (m + np.log(total))[:, 0]
    return o, lse


def cosine_distance_rows(x, y):
    """1 - 2<x,y> / (|x|^2 + |y|^2) per row of the last axis."""
    num = 2.0 * np.sum(x * y, axis=-1)
    den = np.sum(x * x, axis=-1) + np.sum(y * y, axis=-1)
    return np.where(den > 0, 1.0 - num / np.where(den > 0, den, 1.0), 0.0)


def _inputs(rng):
    batch = len(SEQLENS)
    pages_per_seq = [-(-n // PAGE) for n in SEQLENS]
    max_pages = max(pages_per_seq)
    num_pages = sum(pages_per_seq) + 8
    perm = rng.permutation(num_pages)  # scattered: no request's pages are adjacent in memory
    block_table = np.zeros((batch, max_pages), np.int32)
    cache = rng.standard_normal((num_pages, PAGE, 576), dtype=np.float32)
    used = 0
    for r, n in enumerate(SEQLENS):
        block_table[r, : pages_per_seq[r]] = perm[used : used + pages_per_seq[r]]
        used += pages_per_seq[r]
        last = block_table[r, pages_per_seq[r] - 1]
        cache[last, n - (pages_per_seq[r] - 1) * PAGE :] = np.nan  # padding past the length
    q = rng.standard_normal((batch, S_Q, H_Q, 576), dtype=np.float32)
    return q, cache, block_table, np.array(SEQLENS, np.int32)


def _median_us(fn, sync, repeats):
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(times))


def _run_torch_gpu(q32, cache32, block_table, seqlens):
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    q = torch.from_numpy(q32).to(dev, torch.bfloat16)
    cache = torch.from_numpy(cache32).to(dev, torch.bfloat16)
    bt = torch.from_numpy(block_table).to(dev)
    sl = torch.from_numpy(seqlens).to(dev)
    metadata = kf.get_mla_metadata(sl, H_Q, S_Q)
    out, lse = kf.mla_decode(q, cache, bt, sl, metadata, softmax_scale=SOFTMAX_SCALE)
    torch.cuda.synchronize()

    def step():
        kf.mla_decode(q, cache, bt, sl, metadata, softmax_scale=SOFTMAX_SCALE, out=out, lse=lse)

    for _ in range(3):
        step()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 50
    start.record()
    for _ in range(iters):
        step()
    stop.record()
    torch.cuda.synchronize()
    gpu_us = start.elapsed_time(stop) * 1e3 / iters
    host_us = _median_us(step, torch.cuda.synchronize, 20)
    meta_us = _median_us(lambda: kf.get_mla_metadata(sl, H_Q, S_Q), torch.cuda.synchronize, 20)
    timings = [
        f"decode: {gpu_us:.1f} us/call on the GPU (CUDA events, {iters} back-to-back calls), "
        f"{host_us:.1f} us/call including Python and sync",
        f"metadata: {meta_us:.1f} us/call including Python and sync",
    ]
    return (q.float().cpu().numpy(), cache.float().cpu().numpy(), out.float().cpu().numpy(),
            lse.cpu().numpy(), timings, gpu_us)


def _run_cpu(q32, cache32, block_table, seqlens):
    """The CPU backend in bf16 through PyTorch or ml_dtypes when present, else fp16."""
    try:
        import torch

        q = torch.from_numpy(q32).to(torch.bfloat16)
        cache = torch.from_numpy(cache32).to(torch.bfloat16)
        to_np = lambda t: t.float().numpy()  # noqa: E731
        dtype = "bf16 (PyTorch CPU tensors)"
    except ImportError:
        try:
            import ml_dtypes

            q, cache = q32.astype(ml_dtypes.bfloat16), cache32.astype(ml_dtypes.bfloat16)
            dtype = "bf16 (NumPy + ml_dtypes)"
        except ImportError:
            q, cache = q32.astype(np.float16), cache32.astype(np.float16)
            dtype = "fp16 (NumPy has no bf16 without ml_dtypes or PyTorch)"
        to_np = lambda a: np.asarray(a, np.float32)  # noqa: E731
    metadata = kf.get_mla_metadata(seqlens, H_Q, S_Q)
    out, lse = kf.mla_decode(q, cache, block_table, seqlens, metadata, softmax_scale=SOFTMAX_SCALE)

    def step():
        kf.mla_decode(q, cache, block_table, seqlens, metadata, softmax_scale=SOFTMAX_SCALE,
                      out=out, lse=lse)

    us = _median_us(step, lambda: None, 5)
    timings = [f"decode: {us / 1e3:.2f} ms/call on the CPU backend (median of 5), {dtype}"]
    return to_np(q), to_np(cache), to_np(out), np.asarray(lse), timings, us


def main() -> int:
    rng = np.random.default_rng(2026)
    q32, cache32, block_table, seqlens = _inputs(rng)
    use_gpu, why = False, "this build has no CUDA"
    if kf.has_cuda():
        try:
            import torch

            use_gpu = torch.cuda.is_available()
            why = "no CUDA device via PyTorch"
        except ImportError:
            why = "the GPU path runs through PyTorch, which is not installed"
    print(f"kernelflow {kf.__version__}: {kf.build_info()}")
    print(f"DeepSeek-V2-Lite decode step: b={len(SEQLENS)}, s_q={S_Q}, h_q={H_Q}, "
          f"seqlens={SEQLENS}, page={PAGE}, bf16, softmax_scale={SOFTMAX_SCALE}")
    if use_gpu:
        import torch

        print(f"device: {torch.cuda.get_device_name()} (through PyTorch)")
        q, cache, out, lse, timings, us = _run_torch_gpu(q32, cache32, block_table, seqlens)
    else:
        print(f"device: CPU backend ({why})")
        q, cache, out, lse, timings, us = _run_cpu(q32, cache32, block_table, seqlens)

    # The reference sees the stored (rounded) q and cache, in float64.
    o_ref, lse_ref = reference(q.astype(np.float64), cache.astype(np.float64), block_table,
                               seqlens, SOFTMAX_SCALE)
    out64 = out.astype(np.float64)
    worst = float(cosine_distance_rows(out64, o_ref).max())
    lse_err = float(np.abs(lse.astype(np.float64) - lse_ref).max())
    finite = bool(np.isfinite(out64).all() and np.isfinite(lse).all())
    ok = finite and worst < MAX_COS_DIST and lse_err < MAX_LSE_ERR
    cache_bytes = sum(SEQLENS) * 576 * 2
    for line in timings:
        print(line)
    print(f"  cache read: {cache_bytes / 1e6:.1f} MB -> {cache_bytes / us / 1e3:.1f} GB/s")
    print(f"check vs NumPy float64 reference: worst-row cosine distance {worst:.2e} "
          f"(< {MAX_COS_DIST:g}), max |lse error| {lse_err:.2e} (< {MAX_LSE_ERR:g}), "
          f"all finite: {finite}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
