"""The PyTorch MLA decode baseline, and the benchmarks' checks against the float64 reference.

mla_decode_torch: the simple baseline a user would write: gather the request's pages into a dense
  K [b, S, 576] (S = pages * page_size), scores = q . K^T with fp32 output, mask positions beyond
  cache_seqlens, fp32 softmax, o = p . K[..., :512] in the input dtype. Static shapes and no host
  sync, so it can be captured in a CUDA graph.
reference: kernelflow.reference.mla_decode_ref (NumPy, float64) fed from torch tensors.
check: worst-row cosine distance and lse error against it (docs/spec.md section 4).
"""
from __future__ import annotations

import math

import torch
from kernelflow import reference as kf_ref

D_LATENT = 512
D_HEAD = 576

_BMM_OUT_FP32 = {}  # device type -> whether torch.bmm(..., out_dtype=float32) works there


def _scores_fp32(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [b, h, 576] x k [b, S, 576] -> fp32 [b, h, S]; 16-bit inputs, fp32 accumulate and output
    where torch offers it (bf16 scores would cost the softmax ~3 significant digits)."""
    kt = k.transpose(1, 2)
    dev = q.device.type
    if _BMM_OUT_FP32.get(dev, True):
        try:
            s = torch.bmm(q, kt, out_dtype=torch.float32)
            _BMM_OUT_FP32[dev] = True
            return s
        except (TypeError, RuntimeError, NotImplementedError):
            _BMM_OUT_FP32[dev] = False
    return torch.bmm(q.float(), kt.float())


def mla_decode_torch(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     cache_seqlens: torch.Tensor, softmax_scale: float):
    """q [b, 1, h_q, 576]; kv_cache [num_pages, page, 576] (or [.., 1, 576]); block_table int32
    [b, pages]; cache_seqlens int32 [b]. Returns (o [b, 1, h_q, 512] q.dtype, lse fp32 [b, h_q, 1])."""
    b, s_q, h_q, _ = q.shape
    assert s_q == 1, "the torch baseline covers s_q = 1"
    page_size = kv_cache.shape[1]
    kv = kv_cache.reshape(kv_cache.shape[0], page_size, D_HEAD)
    k = kv[block_table.long()].reshape(b, -1, D_HEAD)  # [b, S, 576]
    pos = torch.arange(k.shape[1], device=q.device)
    valid = pos[None, :] < cache_seqlens[:, None].long()  # [b, S]
    # Zero what lies beyond the length: NaN there would survive p = 0 in p . V.
    k = torch.where(valid[:, :, None], k, torch.zeros((), dtype=k.dtype, device=k.device))
    scores = _scores_fp32(q[:, 0], k) * softmax_scale  # [b, h, S]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, h]; -inf for an empty request
    p = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[:, :, None])
    o = torch.bmm(p.to(q.dtype), k[:, :, :D_LATENT])  # [b, h, 512]
    return o[:, None], lse[:, :, None]


class _RequestRows:
    """Request r's cache rows [cache_seqlens[r], 576] as float64 NumPy, gathered from a paged
    cache on any device one request at a time (the whole cache in float64 would not fit)."""

    def __init__(self, kv_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor):
        self.kv = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], D_HEAD)
        self.block_table = block_table
        self.seqlens = cache_seqlens.tolist()

    def __getitem__(self, r: int):
        n, page_size = self.seqlens[r], self.kv.shape[1]
        pages = self.block_table[r, : math.ceil(n / page_size)].long()
        return self.kv[pages].reshape(-1, D_HEAD)[:n].double().cpu().numpy()


def reference(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
              cache_seqlens: torch.Tensor, softmax_scale: float):
    """kernelflow.reference.mla_decode_ref on torch tensors (any device): (o [b, s_q, h_q, 512],
    lse [b, h_q, s_q]) as float64 NumPy arrays."""
    rows = _RequestRows(kv_cache, block_table, cache_seqlens)
    return kf_ref.mla_decode_ref(q.double().cpu().numpy(), rows, rows.seqlens, softmax_scale)


def check(out: torch.Tensor, lse: torch.Tensor, ref_o, ref_lse) -> dict:
    """docs/spec.md section 4 for 16-bit caches, by kernelflow.reference.agreement: out
    [b, s_q, h_q, 512] and lse [b, h_q, s_q] against the reference's (NumPy) arrays."""
    result = kf_ref.agreement(out.double().cpu().numpy(), lse.double().cpu().numpy(), ref_o,
                              ref_lse)
    return {"worst_row_cos_dist": result.worst_row_cos_dist,
            "lse_max_abs_err": result.max_lse_err, "finite": result.finite,
            "empty_rows_exact": result.empty_rows_exact, "ok": result.ok}


def fmt_check(res: dict) -> str:
    s = f"cos_dist {res['worst_row_cos_dist']:.2e}, lse_err {res['lse_max_abs_err']:.2e}"
    if not res["finite"]:
        s += ", non-finite values"
    if not res["empty_rows_exact"]:
        s += ", rows that see nothing are not 0 and -inf"
    return ("PASS " if res["ok"] else "FAIL ") + s
