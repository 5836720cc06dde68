"""`python -m kernelflow demo`: one DeepSeek-V2-Lite-shaped decode step, checked and timed.

h_q = 16, s_q = 1, four requests of a few thousand cached tokens (mixed lengths), page 64,
softmax_scale = 0.114721, N(0, 1) data, in bf16 (fp16 on the CPU when neither PyTorch nor
ml_dtypes is there to make bf16 arrays). Pages are scattered and the padding of each request's
last page holds NaN, which must not reach the result. The check is the NumPy float64 reference
(kernelflow.reference): worst-row cosine distance < 1e-5 and lse within 1e-4 (docs/spec.md
section 4).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import kernelflow as kf
from kernelflow import reference as ref

H_Q, S_Q, PAGE = 16, 1, 64
SEQLENS = [4096, 1337, 3000, 2049]
SOFTMAX_SCALE = 0.114721


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


def _cpu_arrays(q32, cache32):
    """q and cache as the CPU backend's 16-bit arrays: bf16 through PyTorch or ml_dtypes when
    present, else fp16. Returns (q, cache, to_numpy, dtype label)."""
    try:
        import torch

        return (torch.from_numpy(q32).to(torch.bfloat16),
                torch.from_numpy(cache32).to(torch.bfloat16),
                lambda t: t.float().numpy(), "bf16 (PyTorch CPU tensors)")
    except ImportError:
        pass
    to_numpy = lambda a: np.asarray(a, np.float32)  # noqa: E731
    try:
        import ml_dtypes

        bf16 = ml_dtypes.bfloat16
        return q32.astype(bf16), cache32.astype(bf16), to_numpy, "bf16 (NumPy + ml_dtypes)"
    except ImportError:
        return (q32.astype(np.float16), cache32.astype(np.float16), to_numpy,
                "fp16 (NumPy has no bf16 without ml_dtypes or PyTorch)")


def _run_cpu(q, cache, to_numpy, block_table, seqlens):
    metadata = kf.get_mla_metadata(seqlens, H_Q, S_Q)
    out, lse = kf.mla_decode(q, cache, block_table, seqlens, metadata, softmax_scale=SOFTMAX_SCALE)

    def step():
        kf.mla_decode(q, cache, block_table, seqlens, metadata, softmax_scale=SOFTMAX_SCALE,
                      out=out, lse=lse)

    us = _median_us(step, lambda: None, 5)
    timings = [f"decode: {us / 1e3:.2f} ms/call on the CPU backend (median of 5)"]
    return to_numpy(q), to_numpy(cache), to_numpy(out), np.asarray(lse), timings, us


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
    if use_gpu:
        import torch

        dtype = "bf16"
        device = f"{torch.cuda.get_device_name()} (through PyTorch)"
    else:
        q_cpu, cache_cpu, to_numpy, dtype = _cpu_arrays(q32, cache32)
        device = f"CPU backend ({why})"
    print(f"kernelflow {kf.__version__}: {kf.build_info()}")
    print(f"DeepSeek-V2-Lite decode step: b={len(SEQLENS)}, s_q={S_Q}, h_q={H_Q}, "
          f"seqlens={SEQLENS}, page={PAGE}, dtype {dtype}, softmax_scale={SOFTMAX_SCALE}")
    print(f"device: {device}")
    if use_gpu:
        q, cache, out, lse, timings, us = _run_torch_gpu(q32, cache32, block_table, seqlens)
    else:
        q, cache, out, lse, timings, us = _run_cpu(q_cpu, cache_cpu, to_numpy, block_table,
                                                   seqlens)

    # The reference sees the stored (rounded) q and cache.
    o_ref, lse_ref = ref.mla_decode_ref(q, cache, seqlens, SOFTMAX_SCALE, block_table=block_table)
    result = ref.agreement(out, lse, o_ref, lse_ref)
    cache_bytes = sum(SEQLENS) * 576 * 2
    for line in timings:
        print(line)
    print(f"  cache read: {cache_bytes / 1e6:.1f} MB -> {cache_bytes / us / 1e3:.1f} GB/s")
    print(f"check vs the NumPy float64 reference: {result}")
    print("PASS" if result.ok else "FAIL")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
