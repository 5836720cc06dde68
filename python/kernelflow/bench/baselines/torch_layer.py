"""The unfused PyTorch DeepSeek MLA attention layer (docs/spec.md section 3), the baseline of the
fused decode layer, with the builders of its weights and of one decoding step's inputs.

One layer for a batch of b requests, each adding one token (x is the layer's input row):
  1. q = x W_q^T, or with query compression q = rmsnorm(x W_q_a^T) * q_a_norm W_q_b^T;
     per head q_nope (128) and q_pe (64);
  2. kv = x W_kv_a^T; c = rmsnorm(kv[:512]) * kv_a_norm, k_pe = kv[512:];
  3. RoPE at positions[b] on q_pe and k_pe: interleaved pairs (x[2i], x[2i+1]) rotated by the
     caller's table cos_sin[pos, 0, i], cos_sin[pos, 1, i];
  4. the cache row [c | k_pe] written at t = cache_seqlens[b] - 1 of request b (page
     block_table[b, t // page_size], offset t % page_size): bf16 caches by index_copy_, 8-bit
     caches through kernelflow.cache_append (the bytes the library writes everywhere);
  5. q_lat[h] = q_nope[h] W_UK[h] with W_UK[h] = w_kv_b rows [h*256, h*256+128) (torch.bmm);
  6. attention over positions 0 .. cache_seqlens[b]-1 with q = [q_lat | q_pe], by default the
     library's kernel (kernelflow.mla_decode, the metadata made once per step);
  7. o[h] = W_UV[h] o_lat[h] with W_UV[h] = w_kv_b rows [h*256+128, h*256+256); y = o W_o^T.

Plain torch ops in bf16 with fp32 accumulation (F.linear, torch.bmm), RMSNorm and RoPE computed
in fp32 and rounded to bf16: the layer a user would write. Static shapes and no host
synchronization, so a whole step of L layers can be captured in one torch.cuda.CUDAGraph. Runs on
the CPU too (the library's CPU backend does the attention), and `attention=` swaps the kernel for
another attention, e.g. attention_float64.

Weights are a dict per layer with the keys of kernelflow.DecodeGraph's layers ("w_q", or "w_q_a",
"q_a_norm", "w_q_b"; "w_kv_a", "kv_a_norm", "w_kv_b", "w_o"), each bf16 [out_features,
in_features]; a layer dict for torch_layers also holds its "kv_cache".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import kernelflow as kf

LATENT_DIM = 512
HEAD_DIM = 576
BF16 = torch.bfloat16
SCALE_V2_LITE = 0.114721  # 192**-0.5 (docs/spec.md section 1)
SCALE_V3 = 0.135234       # 192**-0.5 times YaRN's mscale**2
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class LayerShape:
    """The dimensions of one attention layer; the field names are kernelflow.LayerConfig's, so
    either can be passed where a `cfg` is asked for."""

    hidden_size: int
    num_heads: int
    q_lora_rank: int
    softmax_scale: float
    kv_lora_rank: int = LATENT_DIM
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rms_norm_eps: float = 1e-6

    @classmethod
    def deepseek_v2_lite(cls, **kw) -> "LayerShape":
        return cls(**{"hidden_size": 2048, "num_heads": 16, "q_lora_rank": 0,
                      "softmax_scale": SCALE_V2_LITE, **kw})

    @classmethod
    def deepseek_v3(cls, num_heads: int = 128, **kw) -> "LayerShape":
        return cls(**{"hidden_size": 7168, "num_heads": num_heads, "q_lora_rank": 1536,
                      "softmax_scale": SCALE_V3, **kw})


def weight_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Each weight's shape, [out_features, in_features] (norms: [features])."""
    q_head = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    shapes = {}
    if cfg.q_lora_rank == 0:
        shapes["w_q"] = (cfg.num_heads * q_head, cfg.hidden_size)
    else:
        shapes["w_q_a"] = (cfg.q_lora_rank, cfg.hidden_size)
        shapes["q_a_norm"] = (cfg.q_lora_rank,)
        shapes["w_q_b"] = (cfg.num_heads * q_head, cfg.q_lora_rank)
    shapes["w_kv_a"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.hidden_size)
    shapes["kv_a_norm"] = (cfg.kv_lora_rank,)
    shapes["w_kv_b"] = (cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    shapes["w_o"] = (cfg.hidden_size, cfg.num_heads * cfg.v_head_dim)
    return shapes


def layer_weight_bytes(cfg) -> int:
    """Bytes of one layer's bf16 weights (27.5 MB for DeepSeek-V2-Lite)."""
    return sum(2 * math.prod(s) for s in weight_shapes(cfg).values())


def make_layer_weights(cfg, generator: torch.Generator, device) -> dict[str, torch.Tensor]:
    """Random bf16 weights of one layer: matrices N(0, 1/in_features) (unit-variance inputs give
    unit-variance outputs), norm weights 1 + N(0, 0.1^2)."""
    weights = {}
    for name, shape in weight_shapes(cfg).items():
        w = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        if len(shape) == 2:
            w.mul_(1.0 / math.sqrt(shape[1]))
        else:
            w.mul_(0.1).add_(1.0)
        weights[name] = w.to(BF16)
    return weights


def rope_cos_sin(max_position: int, rope_dim: int = 64, theta: float = ROPE_THETA,
                 device=None) -> torch.Tensor:
    """float32 [max_position, 2, rope_dim / 2]: cos then sin of pos * theta^(-2i / rope_dim)."""
    inv_freq = theta ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    angle = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.stack((angle.cos(), angle.sin()), dim=1).to(torch.float32).to(device)


@dataclass
class Step:
    """The static inputs of one decoding step and each layer's bf16 cache."""

    hidden: torch.Tensor         # bf16 [b, hidden]: layer 0's input
    positions: torch.Tensor      # int32 [b]: cache_seqlens - 1
    cache_seqlens: torch.Tensor  # int32 [b]: lengths after this step's append
    block_table: torch.Tensor    # int32 [b, max_pages_per_seq], pages scattered over the pool
    cos_sin: torch.Tensor        # float32 [max_position, 2, rope / 2]
    caches: list = field(default_factory=list)  # per layer bf16 [num_pages, page_size, 576]

    @property
    def batch(self) -> int:
        return int(self.hidden.shape[0])

    @property
    def page_size(self) -> int:
        return int(self.caches[0].shape[1])

    @property
    def num_pages(self) -> int:
        return int(self.caches[0].shape[0])


def make_step(cfg, seqlens, num_layers: int, generator: torch.Generator, device,
              page_size: int = 64, max_pages_per_seq: int | None = None,
              max_position: int | None = None, spare_pages: int = 2,
              theta: float = ROPE_THETA) -> Step:
    """One step for requests of lengths `seqlens` (after the append, each >= 1): hidden N(0, 1);
    positions = seqlens - 1; every request's pages drawn at random from one pool of
    sum(ceil(n / page_size)) + spare_pages pages (unused block_table columns hold page 0); one
    cache per layer over that pool, N(0, 1) everywhere (the row at seqlens - 1 is the layer's
    to write); the RoPE table of real angles (theta 10000) for max_position positions."""
    seqlens = [int(n) for n in seqlens]
    if not seqlens or min(seqlens) < 1:
        raise ValueError(f"seqlens: expected lengths >= 1 (after the append), got {seqlens}")
    need = [math.ceil(n / page_size) for n in seqlens]
    if max_pages_per_seq is None:
        max_pages_per_seq = max(need)
    if max_pages_per_seq < max(need):
        raise ValueError(f"max_pages_per_seq: {max_pages_per_seq} pages hold fewer than "
                         f"{max(seqlens)} tokens of {page_size}")
    if max_position is None:
        max_position = max_pages_per_seq * page_size
    if max_position < max(seqlens):
        raise ValueError(f"max_position: expected >= {max(seqlens)}, got {max_position}")
    num_pages = sum(need) + spare_pages
    perm = torch.randperm(num_pages, generator=generator, device=device).to(torch.int32)
    block_table = torch.zeros(len(seqlens), max_pages_per_seq, dtype=torch.int32, device=device)
    used = 0
    for r, n in enumerate(need):
        block_table[r, :n] = perm[used:used + n]
        used += n
    lengths = torch.tensor(seqlens, dtype=torch.int32, device=device)
    hidden = torch.randn(len(seqlens), cfg.hidden_size, generator=generator, device=device,
                         dtype=torch.float32).to(BF16)
    caches = [torch.randn(num_pages, page_size, HEAD_DIM, generator=generator, device=device,
                          dtype=torch.float32).to(BF16) for _ in range(num_layers)]
    return Step(hidden=hidden, positions=lengths - 1, cache_seqlens=lengths,
                block_table=block_table,
                cos_sin=rope_cos_sin(max_position, cfg.qk_rope_head_dim, theta, device),
                caches=caches)


# ---- the layer -----------------------------------------------------------------------------------

def rmsnorm(v: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """v / sqrt(mean(v^2) + eps) * weight over the last dim, in fp32, rounded to v's dtype."""
    vf = v.float()
    return (vf * torch.rsqrt(vf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(v.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., 2n] rotated in interleaved pairs (x[2i], x[2i+1]) by cos, sin [..., n] (broadcast),
    in fp32, rounded to x's dtype."""
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)


def query(cfg, w: dict, x: torch.Tensor) -> torch.Tensor:
    """Step 1: [b, heads * (nope + rope)]."""
    if cfg.q_lora_rank == 0:
        return F.linear(x, w["w_q"])
    qa = rmsnorm(F.linear(x, w["w_q_a"]), w["q_a_norm"], cfg.rms_norm_eps)
    return F.linear(qa, w["w_q_b"])


def cache_slots(cache_seqlens: torch.Tensor, block_table: torch.Tensor, page_size: int):
    """int64 [b]: the slot page * page_size + offset of position cache_seqlens[b] - 1."""
    t = cache_seqlens.long() - 1
    pages = block_table.long().gather(1, (t // page_size)[:, None])[:, 0]
    return pages * page_size + t % page_size


def write_cache_rows(kv_cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                     kv_format: str) -> None:
    """Step 4: rows [b, 576] into the paged cache at `slots`; 8-bit formats quantize on write
    through kernelflow.cache_append."""
    if kv_format == "bf16":
        kv_cache.view(-1, HEAD_DIM).index_copy_(0, slots, rows.to(kv_cache.dtype))
    else:
        kf.cache_append(rows, kv_cache, slots, kv_format=kv_format)


def torch_layer(cfg, w: dict, kv_cache: torch.Tensor, x: torch.Tensor, positions: torch.Tensor,
                cache_seqlens: torch.Tensor, block_table: torch.Tensor, cos_sin: torch.Tensor,
                attention, kv_format: str = "bf16") -> torch.Tensor:
    """One layer (the module docstring's steps 1-7): x bf16 [b, hidden] -> y bf16 [b, hidden];
    writes request b's new cache row. attention(q [b, 1, heads, 576], kv_cache, block_table,
    cache_seqlens, softmax_scale, kv_format) returns o_lat [b, 1, heads, 512]."""
    b, heads = x.shape[0], cfg.num_heads
    nope, v_dim, lat = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    q = query(cfg, w, x).view(b, heads, nope + cfg.qk_rope_head_dim)
    kv = F.linear(x, w["w_kv_a"])
    c = rmsnorm(kv[:, :lat], w["kv_a_norm"], cfg.rms_norm_eps)
    table = cos_sin[positions.long()]  # [b, 2, rope / 2]
    cos, sin = table[:, 0], table[:, 1]
    k_pe = rope(kv[:, lat:], cos, sin)
    q_pe = rope(q[..., nope:], cos[:, None], sin[:, None])
    slots = cache_slots(cache_seqlens, block_table, kv_cache.shape[1])
    write_cache_rows(kv_cache, torch.cat((c, k_pe), dim=-1), slots, kv_format)
    w_kv_b = w["w_kv_b"].view(heads, nope + v_dim, lat)  # per head [W_UK (nope rows) | W_UV]
    q_lat = torch.bmm(q[..., :nope].transpose(0, 1), w_kv_b[:, :nope])  # [heads, b, 512]
    q_attn = torch.cat((q_lat.transpose(0, 1), q_pe), dim=-1).unsqueeze(1)  # [b, 1, heads, 576]
    o_lat = attention(q_attn, kv_cache, block_table, cache_seqlens, cfg.softmax_scale, kv_format)
    o_lat = o_lat.reshape(b, heads, lat).to(x.dtype).transpose(0, 1)  # [heads, b, 512]
    o = torch.bmm(o_lat, w_kv_b[:, nope:].transpose(1, 2))  # [heads, b, v]
    return F.linear(o.transpose(0, 1).reshape(b, heads * v_dim), w["w_o"])


def torch_layers(cfg, layers: list, hidden: torch.Tensor, positions: torch.Tensor,
                 cache_seqlens: torch.Tensor, block_table: torch.Tensor, cos_sin: torch.Tensor,
                 attention=None, kv_format: str = "bf16") -> torch.Tensor:
    """One step through every layer (a dict of weights and its "kv_cache" each): layer l's output
    is layer l+1's input; returns the last layer's output. attention defaults to a
    KernelflowAttention made for this step; one that has new_step gets it called once first."""
    if attention is None:
        attention = KernelflowAttention(cache_seqlens, cfg.num_heads, kv_format)
    elif hasattr(attention, "new_step"):
        attention.new_step(cache_seqlens)
    x = hidden
    for w in layers:
        x = torch_layer(cfg, w, w["kv_cache"], x, positions, cache_seqlens, block_table, cos_sin,
                        attention, kv_format)
    return x


# ---- attention -----------------------------------------------------------------------------------

class KernelflowAttention:
    """kernelflow.mla_decode with its buffers made once (metadata, out, lse, workspace) for a
    batch and head count, so a step can be captured in a CUDA graph: new_step() recomputes the
    schedule on the device (once per step, shared by every layer), each call decodes one layer.
    The output buffer is reused by the next call: use it before then."""

    def __init__(self, cache_seqlens: torch.Tensor, num_heads: int, kv_format: str = "bf16",
                 num_workers: int | None = None):
        batch, device = int(cache_seqlens.shape[0]), cache_seqlens.device
        self.num_heads, self.kv_format = num_heads, kv_format
        if num_workers is None:
            num_workers = kf.default_num_workers(cache_seqlens, num_heads, 1, kv_format)
        self.num_workers = int(num_workers)
        self.metadata = kf.get_mla_metadata(cache_seqlens, num_heads, num_workers=self.num_workers,
                                            kv_format=kv_format)
        self.out = torch.empty(batch, 1, num_heads, LATENT_DIM, dtype=BF16, device=device)
        self.lse = torch.empty(batch, num_heads, 1, dtype=torch.float32, device=device)
        q_like = torch.empty(batch, 1, num_heads, HEAD_DIM, dtype=BF16, device=device)
        nbytes = kf.workspace_size(batch, num_heads, 1, self.num_workers)
        self.workspace = kf.new_workspace(q_like, self.metadata) if nbytes else None

    def new_step(self, cache_seqlens: torch.Tensor) -> None:
        kf.get_mla_metadata(cache_seqlens, self.num_heads, out=self.metadata,
                            kv_format=self.kv_format)

    def __call__(self, q, kv_cache, block_table, cache_seqlens, softmax_scale, kv_format="bf16"):
        kw = {} if self.workspace is None else {"workspace": self.workspace}
        kf.mla_decode(q, kv_cache, block_table, cache_seqlens, self.metadata, softmax_scale,
                      kv_format=None if kv_format == "bf16" else kv_format, out=self.out,
                      lse=self.lse, **kw)
        return self.out


def attention_float64(q, kv_cache, block_table, cache_seqlens, softmax_scale, kv_format="bf16"):
    """The attention of docs/spec.md section 1 (s_q = 1) in float64 torch ops, one request at a
    time (host loop: tests only); o_lat [b, 1, heads, 512] rounded to q's dtype."""
    if kv_format != "bf16":
        raise ValueError(f"kv_format: attention_float64 reads bf16 caches, got {kv_format!r}")
    page_size = kv_cache.shape[1]
    kv = kv_cache.reshape(kv_cache.shape[0], page_size, HEAD_DIM)
    out = torch.zeros(q.shape[0], 1, q.shape[2], LATENT_DIM, dtype=torch.float64)
    for r, n in enumerate(cache_seqlens.tolist()):
        pages = block_table[r, : math.ceil(n / page_size)].long()
        rows = kv[pages].reshape(-1, HEAD_DIM)[:n].double().cpu()
        p = torch.softmax(softmax_scale * (q[r, 0].double().cpu() @ rows.T), dim=-1)
        out[r, 0] = p @ rows[:, :LATENT_DIM]
    return out.to(device=q.device, dtype=q.dtype)
