"""Triton MLA decode over a paged cache: our own two-stage split-KV baseline.

What it computes (docs/spec.md section 1, s_q = 1): for request b and head h,
    o[b, 0, h] = softmax(scale * q[b, 0, h] . cache[t]) @ cache[t][:512]   over t < cache_seqlens[b]
    lse[b, h, 0] = natural-log log-sum-exp of the scaled scores (-inf when the request is empty).

Shape of the computation (the vLLM / SGLang decode_attention structure, written here from scratch):
  stage 1, grid (b, head blocks, num_splits): a program holds BLOCK_H query heads ([BLOCK_H, 576],
    one KV head shared by all of them, so every loaded cache row feeds BLOCK_H heads) and walks its
    split of the request's positions in BLOCK_N tiles: it gathers the tile's rows through the
    block table (per token, so BLOCK_N and page size are independent), scores them with two dots
    (512 latent + 64 rope dims), keeps an online softmax in base 2, and multiplies p by the first
    512 columns of the same tile (v is never loaded twice). It writes the split's normalized
    partial o [512] and its lse (fp32) to scratch.
  stage 2, grid (b, h_q): merges the splits of a row in split order (deterministic):
    o = sum_i exp(lse_i - m) o_i / sum_i exp(lse_i - m), lse = m + log(sum).
Tuned per shape by `autotune` over BLOCK_N, BLOCK_H, num_splits, num_warps, num_stages.

Positions beyond cache_seqlens are never loaded (masked loads), so NaN there cannot leak; empty
splits write lse = -inf and o = 0, and the merge gives o = 0, lse = -inf for an empty request.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import torch
import triton
import triton.language as tl

D_LATENT = 512
D_ROPE = 64
D_HEAD = D_LATENT + D_ROPE
LOG2E = 1.4426950408889634


@triton.jit
def _mla_split_kernel(
    Q, KV, BlockTable, SeqLens, OPart, LsePart,
    scale_log2,
    stride_q_b, stride_q_h,
    stride_kv_row,
    stride_bt_b,
    stride_op_b, stride_op_h, stride_op_s,
    stride_lp_b, stride_lp_h,
    num_heads, num_splits, page_shift, max_len,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    D_LAT: tl.constexpr, D_PE: tl.constexpr,
):
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)

    seqlen = tl.load(SeqLens + b)
    # Out-of-range lengths are clamped to what the block table addresses: never read beyond it.
    seqlen = tl.minimum(tl.maximum(seqlen, 0), max_len)
    # Splits own whole BLOCK_N tiles so that only the request's last tile is partial.
    num_tiles = tl.cdiv(seqlen, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seqlen)

    offs_h = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_lat = tl.arange(0, D_LAT)
    offs_pe = tl.arange(0, D_PE)
    q_row = Q + b * stride_q_b + offs_h[:, None] * stride_q_h
    q_lat = tl.load(q_row + offs_lat[None, :], mask=mask_h[:, None], other=0.0)
    q_pe = tl.load(q_row + D_LAT + offs_pe[None, :], mask=mask_h[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_LAT], dtype=tl.float32)
    page_mask = (1 << page_shift) - 1
    bt_row = BlockTable + b * stride_bt_b

    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        page = tl.load(bt_row + (offs_n >> page_shift), mask=mask_n, other=0)
        row = (page.to(tl.int64) << page_shift) + (offs_n & page_mask)
        kv_row = KV + row[:, None] * stride_kv_row
        k_lat = tl.load(kv_row + offs_lat[None, :], mask=mask_n[:, None], other=0.0)
        k_pe = tl.load(kv_row + D_LAT + offs_pe[None, :], mask=mask_n[:, None], other=0.0)

        qk = tl.dot(q_lat, tl.trans(k_lat))
        qk = tl.dot(q_pe, tl.trans(k_pe), qk)
        qk = tl.where(mask_n[None, :], qk * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(k_lat.dtype), k_lat, acc)
        m_i = m_new

    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, (m_i + tl.math.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    op = OPart + b * stride_op_b + offs_h[:, None] * stride_op_h + split * stride_op_s
    tl.store(op + offs_lat[None, :], o, mask=mask_h[:, None])
    tl.store(LsePart + b * stride_lp_b + offs_h * stride_lp_h + split, lse, mask=mask_h)


@triton.jit
def _mla_merge_kernel(
    OPart, LsePart, Out, Lse,
    stride_op_b, stride_op_h, stride_op_s,
    stride_lp_b, stride_lp_h,
    stride_o_b, stride_o_h,
    stride_lse_b, stride_lse_h,
    num_splits,
    D_LAT: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.arange(0, D_LAT)
    op = OPart + b * stride_op_b + h * stride_op_h
    lp = LsePart + b * stride_lp_b + h * stride_lp_h

    m = float("-inf")
    denom = 0.0
    acc = tl.zeros([D_LAT], dtype=tl.float32)
    for s in range(0, num_splits):
        lse_s = tl.load(lp + s)
        m_new = tl.maximum(m, lse_s)
        # While every split so far is empty m_new is -inf; shift by 0 then so no inf - inf.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - shift)
        w = tl.exp(lse_s - shift)
        o_s = tl.load(op + s * stride_op_s + offs)
        acc = acc * alpha + w * o_s
        denom = denom * alpha + w
        m = m_new

    has = denom > 0.0
    o = acc / tl.where(has, denom, 1.0)
    lse = tl.where(has, m + tl.log(tl.where(has, denom, 1.0)), float("-inf"))
    tl.store(Out + b * stride_o_b + h * stride_o_h + offs, o.to(Out.dtype.element_ty))
    tl.store(Lse + b * stride_lse_b + h * stride_lse_h, lse)


@dataclasses.dataclass(frozen=True)
class Config:
    block_n: int = 32
    block_h: int = 16
    num_splits: int = 8
    num_warps: int = 4
    num_stages: int = 2

    def short(self) -> str:
        return (f"N{self.block_n}/H{self.block_h}/S{self.num_splits}/"
                f"w{self.num_warps}/st{self.num_stages}")


def default_config(batch: int, h_q: int, max_seqlen: int, num_sms: int = 132) -> Config:
    """A config that is valid everywhere and not bad; `autotune` finds better ones."""
    block_h = 16 if h_q <= 16 else 32
    block_n = 32
    programs = batch * triton.cdiv(h_q, block_h)
    tiles = max(1, triton.cdiv(max_seqlen, block_n))
    num_splits = max(1, min(tiles, triton.cdiv(2 * num_sms, programs), 64))
    return Config(block_n=block_n, block_h=block_h, num_splits=num_splits,
                  num_warps=8, num_stages=2)


def _page_shift(page_size: int) -> int:
    shift = page_size.bit_length() - 1
    if page_size <= 0 or (1 << shift) != page_size:
        raise ValueError(f"page size must be a power of two, got {page_size}")
    return shift


class Scratch:
    """Split partials sized for up to max_splits; reused across calls (graph-capturable)."""

    def __init__(self, batch: int, h_q: int, max_splits: int, device):
        self.o_part = torch.empty(batch, h_q, max_splits, D_LATENT, dtype=torch.float32,
                                  device=device)
        self.lse_part = torch.empty(batch, h_q, max_splits, dtype=torch.float32, device=device)

    @property
    def max_splits(self) -> int:
        return self.o_part.shape[2]


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
               cache_seqlens: torch.Tensor, softmax_scale: float, config: Config | None = None,
               out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
               scratch: Scratch | None = None, max_seqlen: int | None = None):
    """q [b, 1, h_q, 576], kv_cache [num_pages, page, 576] (or [.., 1, 576]), same 16-bit dtype;
    block_table int32 [b, pages]; cache_seqlens int32 [b]. Returns (out [b,1,h_q,512], lse
    fp32 [b,h_q,1]). max_seqlen only sizes the default config (avoids a host sync)."""
    b, s_q, h_q, d = q.shape
    if s_q != 1 or d != D_HEAD:
        raise ValueError(f"q must be [b, 1, h_q, {D_HEAD}], got {tuple(q.shape)}")
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.view(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[3])
    num_pages, page_size, dk = kv_cache.shape
    if dk != D_HEAD or kv_cache.dtype != q.dtype or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError("kv_cache must be [num_pages, page, 576] with q's 16-bit dtype")
    if kv_cache.stride(2) != 1 or kv_cache.stride(0) != page_size * kv_cache.stride(1):
        raise ValueError("kv_cache rows must be evenly strided inside and across pages")
    if q.stride(3) != 1:
        raise ValueError("q's last dim must be contiguous")
    if block_table.dtype != torch.int32 or cache_seqlens.dtype != torch.int32:
        raise ValueError("block_table and cache_seqlens must be int32")
    if config is None:
        if max_seqlen is None:
            max_seqlen = block_table.shape[1] * page_size
        config = default_config(b, h_q, max_seqlen)
    if out is None:
        out = torch.empty(b, 1, h_q, D_LATENT, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(b, h_q, 1, dtype=torch.float32, device=q.device)
    if scratch is None or scratch.max_splits < config.num_splits or \
            scratch.o_part.shape[0] < b or scratch.o_part.shape[1] < h_q:
        scratch = Scratch(b, h_q, config.num_splits, q.device)
    op, lp = scratch.o_part, scratch.lse_part

    grid1 = (b, triton.cdiv(h_q, config.block_h), config.num_splits)
    _mla_split_kernel[grid1](
        q, kv_cache, block_table, cache_seqlens, op, lp,
        float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(2),
        kv_cache.stride(1),
        block_table.stride(0),
        op.stride(0), op.stride(1), op.stride(2),
        lp.stride(0), lp.stride(1),
        h_q, config.num_splits, _page_shift(page_size), block_table.shape[1] * page_size,
        BLOCK_H=config.block_h, BLOCK_N=config.block_n, D_LAT=D_LATENT, D_PE=D_ROPE,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    _mla_merge_kernel[(b, h_q)](
        op, lp, out, lse,
        op.stride(0), op.stride(1), op.stride(2),
        lp.stride(0), lp.stride(1),
        out.stride(0), out.stride(2),
        lse.stride(0), lse.stride(1),
        config.num_splits,
        D_LAT=D_LATENT, num_warps=4,
    )
    return out, lse


# ---- tuning ---------------------------------------------------------------------------------

def _kernel_candidates(h_q: int, level: str) -> list[tuple[int, int, int, int]]:
    """(block_n, block_h, num_warps, num_stages) to try; 'quick' keeps the compile bill small."""
    # Lists pruned with ptxas -v (sm_90): the BLOCK_H=16 x BLOCK_N=64 x 4-warp tile spills heavily.
    if h_q <= 16:
        full = [(32, 16, 8, 2), (32, 16, 8, 3), (64, 16, 8, 2), (16, 16, 4, 3), (32, 16, 4, 2),
                (16, 16, 4, 4), (64, 16, 8, 3)]
        quick = [(32, 16, 8, 2), (64, 16, 8, 2), (16, 16, 4, 3)]
    else:
        full = [(32, 32, 8, 2), (32, 32, 8, 3), (16, 32, 8, 3), (32, 64, 8, 2), (64, 64, 8, 2),
                (16, 64, 8, 3), (64, 32, 8, 2)]
        quick = [(32, 32, 8, 2), (16, 32, 8, 3), (32, 64, 8, 2)]
    return quick if level == "quick" else full


def _split_candidates(batch: int, h_q: int, block_h: int, block_n: int, max_seqlen: int,
                      num_sms: int, level: str) -> list[int]:
    programs = batch * triton.cdiv(h_q, block_h)
    tiles = max(1, triton.cdiv(max_seqlen, block_n))
    out = set()
    waves = (1, 2, 4) if level == "quick" else (0.5, 1, 2, 3, 4, 8)
    for w in waves:
        s = max(1, round(w * num_sms / programs))
        out.add(int(min(s, tiles, 128)))
    return sorted(out)


def autotune(run_for: Callable[[Config], Callable[[], None]], batch: int, h_q: int,
             max_seqlen: int, num_sms: int, time_fn: Callable[[Callable[[], None]], float],
             level: str = "quick", log: Callable[[str], None] | None = None) -> tuple[Config, list]:
    """Pick the fastest Config. run_for(config) returns a zero-argument callable that runs the
    timing unit (e.g. N calls over rotated caches); time_fn(fn) returns its time (ms). Configs
    that fail to compile or launch (shared memory, registers) are skipped."""
    results = []
    best = None
    for block_n, block_h, warps, stages in _kernel_candidates(h_q, level):
        for splits in _split_candidates(batch, h_q, block_h, block_n, max_seqlen, num_sms, level):
            cfg = Config(block_n, block_h, splits, warps, stages)
            try:
                ms = time_fn(run_for(cfg))
            except Exception as e:  # noqa: BLE001 - a config that does not fit is skipped
                msg = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                results.append((cfg, None, msg))
                if log:
                    log(f"    triton {cfg.short()}: skipped ({msg})")
                break  # same kernel with other splits fails the same way
            results.append((cfg, ms, ""))
            if best is None or ms < best[1]:
                best = (cfg, ms)
    if best is None:
        raise RuntimeError("no Triton config ran: " + "; ".join(r[2] for r in results))
    return best[0], results


def iter_configs(h_q: int, level: str = "quick") -> Iterable[tuple[int, int, int, int]]:
    return _kernel_candidates(h_q, level)
