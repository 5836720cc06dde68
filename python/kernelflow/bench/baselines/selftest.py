"""Correctness of the Triton and torch baselines against the float64 reference
(kernelflow.reference, through torch_mla.reference).

Covers bf16/fp16, page sizes 16/32/64, h_q 16 and 128, s_q = 1, requests of length 0, 1, a
partial last page and several pages, scattered pages, NaN in every slot beyond cache_seqlens,
and several split counts (the merge path). Fresh random inputs per case.

    python3 -m kernelflow.bench.baselines.selftest            # on the GPU
    TRITON_INTERPRET=1 python3 -m kernelflow.bench.baselines.selftest --device cpu --small   # no GPU
"""
from __future__ import annotations

import argparse
import sys

import torch

from kernelflow.bench.baselines import torch_mla, triton_mla

SCALE = 0.114721  # DeepSeek-V2-Lite softmax_scale


def make_case(b, h_q, page_size, seqlens, dtype, device, gen):
    pages_per_seq = max(1, max((n + page_size - 1) // page_size for n in seqlens))
    num_pages = b * pages_per_seq + 3
    cache = torch.randn(num_pages, page_size, 576, generator=gen).to(dtype)
    perm = torch.randperm(num_pages, generator=gen)[: b * pages_per_seq]
    block_table = perm.reshape(b, pages_per_seq).to(torch.int32)
    # Poison every slot beyond each request's length (and the pages nobody uses).
    used = torch.zeros(num_pages, page_size, dtype=torch.bool)
    for i, n in enumerate(seqlens):
        for t in range(n):
            used[block_table[i, t // page_size], t % page_size] = True
    cache[~used] = float("nan")
    # Entries past a request's last page are garbage, not -1: they must not be read.
    for i, n in enumerate(seqlens):
        first_unused = (n + page_size - 1) // page_size
        block_table[i, first_unused:] = 10**6
    q = torch.randn(b, 1, h_q, 576, generator=gen).to(dtype)
    seq = torch.tensor(seqlens, dtype=torch.int32)
    return (q.to(device), cache.to(device), block_table.to(device), seq.to(device))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="fewer, shorter cases (interpreter)")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(1234)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    dtypes = [torch.bfloat16, torch.float16]
    pages = [16, 32, 64]
    heads = [16, 128]
    seqlens = [0, 1, 37, 300, 1000, 64] if not args.small else [0, 1, 37, 70]
    if args.small:
        dtypes, pages, heads = [torch.float16], [16, 64], [16, 128]
    failures = 0
    for dtype in dtypes:
        for page_size in pages:
            for h_q in heads:
                q, cache, bt, seq = make_case(len(seqlens), h_q, page_size, seqlens, dtype,
                                              args.device, gen)
                # The torch baseline gathers whole pages: the garbage block-table entries beyond
                # a request are masked for it by pointing them at page 0 (it reads, then zeroes).
                bt_torch = torch.where(bt >= cache.shape[0], torch.zeros_like(bt), bt)
                ref_o, ref_lse = torch_mla.reference(q, cache, bt, seq, SCALE)
                max_len = max(seqlens)
                results = []
                o, l = torch_mla.mla_decode_torch(q, cache, bt_torch, seq, SCALE)
                results.append(("torch", torch_mla.check(o, l, ref_o, ref_lse)))
                for splits in (1, 3, 8):
                    base = triton_mla.default_config(len(seqlens), h_q, max_len)
                    cfg = triton_mla.Config(base.block_n, base.block_h, splits, base.num_warps,
                                            base.num_stages)
                    o = torch.full((len(seqlens), 1, h_q, 512), float("nan"), dtype=dtype,
                                   device=args.device)
                    l = torch.full((len(seqlens), h_q, 1), float("nan"), dtype=torch.float32,
                                   device=args.device)
                    triton_mla.mla_decode(q, cache, bt, seq, SCALE, cfg, out=o, lse=l)
                    results.append((f"triton {cfg.short()}", torch_mla.check(o, l, ref_o, ref_lse)))
                for name, r in results:
                    failures += not r["ok"]
                    print(f"{str(dtype)[6:]:8s} page={page_size:2d} h_q={h_q:3d} {name:28s} "
                          f"{torch_mla.fmt_check(r)}")
    print(f"selftest: {'PASS' if failures == 0 else f'{failures} FAILURES'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
