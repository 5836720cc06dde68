"""PyTorch MLA decode baselines and the float64 reference the benchmarks check against.

mla_decode_torch: the simple baseline a user would write: gather the request's pages into a dense
  K [b, S, 576] (S = pages * page_size), scores = q . K^T with fp32 output, mask positions beyond
  cache_seqlens, fp32 softmax, o = p . K[..., :512] in the input dtype. Static shapes and no host
  sync, so it can be captured in a CUDA graph.
mla_decode_ref64: float64, one request at a time, only positions < cache_seqlens touched.
check: worst-row cosine distance and lse error against the reference (SPEC.md section 4).
"""
from __future__ import annotations

import math

import torch

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


def mla_decode_ref64(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     cache_seqlens: torch.Tensor, softmax_scale: float):
    """float64 reference: o [b, s_q, h_q, 512] float64, lse [b, h_q, s_q] float64. With s_q > 1
    the causal rule of SPEC.md section 1: query i sees positions < seqlen - s_q + i + 1."""
    b, s_q, h_q, _ = q.shape
    page_size = kv_cache.shape[1]
    kv = kv_cache.reshape(kv_cache.shape[0], page_size, D_HEAD)
    o = torch.zeros(b, s_q, h_q, D_LATENT, dtype=torch.float64, device=q.device)
    lse = torch.full((b, h_q, s_q), float("-inf"), dtype=torch.float64, device=q.device)
    seqlens = cache_seqlens.tolist()
    for i in range(b):
        n = seqlens[i]
        if n <= 0:
            continue
        pages = block_table[i, : math.ceil(n / page_size)].long()
        k = kv[pages].reshape(-1, D_HEAD)[:n].double()
        for j in range(s_q):
            m = n - s_q + j + 1  # positions this query sees
            if m <= 0:
                continue
            s = (q[i, j].double() @ k[:m].T) * softmax_scale  # [h, m]
            l = torch.logsumexp(s, dim=-1)
            o[i, j] = torch.exp(s - l[:, None]) @ k[:m, :D_LATENT]
            lse[i, :, j] = l
    return o, lse


def check(out: torch.Tensor, lse: torch.Tensor | None, ref_o: torch.Tensor,
          ref_lse: torch.Tensor, cos_tol: float = 1e-5, lse_tol: float = 1e-4) -> dict:
    """SPEC.md section 4 for 16-bit caches. out [b, s_q, h_q, 512]; lse [b, h_q, s_q] or None."""
    x = out.double().reshape(-1, D_LATENT)
    y = ref_o.double().reshape(-1, D_LATENT)
    num = 2.0 * (x * y).sum(-1)
    den = (x * x).sum(-1) + (y * y).sum(-1)
    empty = den == 0
    cos = torch.where(empty, torch.zeros_like(den), 1.0 - num / torch.where(empty, 1.0, den))
    cos = torch.where(torch.isnan(cos), torch.full_like(cos, float("inf")), cos)
    res = {"worst_row_cos_dist": float(cos.max()), "nan": bool(torch.isnan(x).any())}
    ok = res["worst_row_cos_dist"] < cos_tol and not res["nan"]
    ref_empty = torch.isinf(ref_lse.reshape(-1))
    if lse is not None:
        a = lse.double().reshape(-1)
        r = ref_lse.double().reshape(-1)
        fin = ~ref_empty
        err = (a[fin] - r[fin]).abs().max().item() if fin.any() else 0.0
        res["lse_max_abs_err"] = err if not math.isnan(err) else float("inf")
        ok = ok and res["lse_max_abs_err"] < lse_tol
        if ref_empty.any():
            # rows that see nothing: lse exactly -inf (FlashMLA's +inf is reported, not failed)
            e = a[ref_empty]
            res["empty_rows_lse_neg_inf"] = bool(torch.all(e == float("-inf")))
            ok = ok and res["empty_rows_lse_neg_inf"]
    if ref_empty.any():
        rows_empty = ref_empty.reshape(ref_lse.shape[0], ref_lse.shape[1], -1).permute(0, 2, 1)
        res["empty_rows_o_zero"] = bool(torch.all(x[rows_empty.reshape(-1)] == 0))
        ok = ok and res["empty_rows_o_zero"]
    res["ok"] = bool(ok)
    return res


def fmt_check(res: dict) -> str:
    s = f"cos_dist {res['worst_row_cos_dist']:.2e}"
    if "lse_max_abs_err" in res:
        s += f", lse_err {res['lse_max_abs_err']:.2e}"
    return ("PASS " if res["ok"] else "FAIL ") + s
