"""The unfused PyTorch layer of the benchmarks (kernelflow.bench.baselines.torch_layer) on the CPU
against a float64 NumPy loop of docs/spec.md section 3, for both model shapes (without and with
query compression), with the library's attention (CPU backend) and with a float64 torch
attention."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kernelflow as kf
from kernelflow import reference as ref

pytestmark = pytest.mark.needs_torch

PAGE = 16
SEQLENS = [1, 5, 16, 70, 130]  # one token, a partial page, a full page, several pages
MAX_LAYER_COS_DIST = 1e-4  # the fused layer's bound (docs/spec.md section 3), bf16 intermediates


@pytest.fixture(scope="module")
def tl():
    import torch  # noqa: F401  (skipped by the needs_torch marker when missing)

    from kernelflow.bench.baselines import torch_layer

    return torch_layer


def small_shape(tl, q_lora):
    return tl.LayerShape(hidden_size=256, num_heads=4, q_lora_rank=q_lora, softmax_scale=0.1147)


def f64(t):
    return t.double().numpy()


# ---- the float64 loop of docs/spec.md section 3 -------------------------------------------------

def rmsnorm64(v, weight, eps):
    return v / math.sqrt(np.mean(v * v) + eps) * weight


def rope64(x, cos, sin):
    out = np.empty_like(x)
    out[0::2] = x[0::2] * cos - x[1::2] * sin
    out[1::2] = x[0::2] * sin + x[1::2] * cos
    return out


def layer_reference(cfg, w, cache, x, positions, seqlens, block_table, cos_sin):
    """y [b, hidden] and the new cache rows [b, 576], all in float64, request by request and
    head by head; y = x W^T is W @ x for one row."""
    nope, rope_d, v_dim, lat = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                cfg.kv_lora_rank)
    q_head, kv_head = nope + rope_d, nope + v_dim
    eps = cfg.rms_norm_eps
    ys, rows = [], []
    for r, xr in enumerate(x):
        if cfg.q_lora_rank == 0:
            q = w["w_q"] @ xr
        else:
            q = w["w_q_b"] @ rmsnorm64(w["w_q_a"] @ xr, w["q_a_norm"], eps)
        kv = w["w_kv_a"] @ xr
        cos, sin = cos_sin[positions[r], 0], cos_sin[positions[r], 1]
        row = np.concatenate([rmsnorm64(kv[:lat], w["kv_a_norm"], eps), rope64(kv[lat:], cos, sin)])
        keys = ref.paged_rows(cache, block_table, r, int(seqlens[r])).copy()
        keys[-1] = row  # the row this step writes at cache_seqlens - 1
        heads = []
        for h in range(cfg.num_heads):
            qh = q[h * q_head:(h + 1) * q_head]
            w_uk = w["w_kv_b"][h * kv_head:h * kv_head + nope]  # [nope, 512]
            w_uv = w["w_kv_b"][h * kv_head + nope:(h + 1) * kv_head]  # [v, 512]
            q_attn = np.concatenate([qh[:nope] @ w_uk, rope64(qh[nope:], cos, sin)])
            o_lat, _ = ref.attend(q_attn[None], keys, cfg.softmax_scale)
            heads.append(w_uv @ o_lat[0])
        ys.append(w["w_o"] @ np.concatenate(heads))
        rows.append(row)
    return np.stack(ys), np.stack(rows)


# ---- fixtures ------------------------------------------------------------------------------------

def one_layer(tl, q_lora, seed):
    import torch

    cfg = small_shape(tl, q_lora)
    gen = torch.Generator().manual_seed(seed)
    step = tl.make_step(cfg, SEQLENS, 1, gen, "cpu", page_size=PAGE, spare_pages=3)
    weights = tl.make_layer_weights(cfg, gen, "cpu")
    return cfg, step, weights


def run(tl, cfg, step, weights, cache, attention=None, kv_format="bf16"):
    return tl.torch_layers(cfg, [dict(weights, kv_cache=cache)], step.hidden, step.positions,
                           step.cache_seqlens, step.block_table, step.cos_sin,
                           attention=attention, kv_format=kv_format)


def slots_of(step):
    table = step.block_table.numpy()
    return np.array([table[r, (n - 1) // PAGE] * PAGE + (n - 1) % PAGE
                     for r, n in enumerate(SEQLENS)])


# ---- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("attention", ["kernelflow", "float64"])
@pytest.mark.parametrize("q_lora", [0, 96])
def test_layer_matches_float64_loop(tl, q_lora, attention):
    cfg, step, weights = one_layer(tl, q_lora, seed=q_lora + 1)
    before = step.caches[0].clone()
    y = run(tl, cfg, step, weights, step.caches[0],
            attention=tl.attention_float64 if attention == "float64" else None)
    want_y, want_rows = layer_reference(
        cfg, {k: f64(v) for k, v in weights.items()}, f64(before), f64(step.hidden),
        step.positions.numpy(), step.cache_seqlens.numpy(), step.block_table.numpy(),
        step.cos_sin.double().numpy())

    assert y.dtype == before.dtype and tuple(y.shape) == (len(SEQLENS), cfg.hidden_size)
    dist = float(ref.cosine_distance(f64(y), want_y, axis=None))
    assert dist < MAX_LAYER_COS_DIST, f"layer output: cosine distance {dist:.2e}"

    # The new rows sit at cache_seqlens - 1 of each request; no other slot changed.
    after = step.caches[0].view(-1, tl.HEAD_DIM)
    slots = slots_of(step)
    row_dist = ref.cosine_distance(f64(after[slots]), want_rows)
    assert row_dist.max() < MAX_LAYER_COS_DIST, f"cache rows: cosine distance {row_dist}"
    untouched = np.ones(after.shape[0], bool)
    untouched[slots] = False
    assert (after[untouched] == before.view(-1, tl.HEAD_DIM)[untouched]).all()


@pytest.mark.parametrize("kv_format", ["fp8_e4m3", "int8"])
def test_8bit_cache_gets_the_quantized_row(tl, kv_format):
    import torch

    cfg, step, weights = one_layer(tl, 0, seed=7)
    cache8 = kf.convert_cache(step.caches[0], kv_format=kv_format)
    before8 = cache8.clone()
    y16 = run(tl, cfg, step, weights, step.caches[0])
    y8 = run(tl, cfg, step, weights, cache8, kv_format=kv_format)

    # The whole cache holds the bytes the library gives the bf16 cache the bf16 layer wrote
    # (8-bit pages are laid out in sections, docs/formats.md: compared whole), and the pages of
    # the new rows changed.
    assert torch.equal(cache8, kf.convert_cache(step.caches[0], kv_format=kv_format))
    pages = np.unique(slots_of(step) // PAGE)
    assert all(not torch.equal(cache8[p], before8[p]) for p in pages)

    # The 8-bit attention only perturbs the output by its quantization error.
    dist = float(ref.cosine_distance(f64(y8), f64(y16), axis=None))
    assert 0 < dist < ref.MAX_WHOLE_COS_DIST_8BIT[kv_format], dist


def test_weight_bytes_of_the_model_shapes(tl):
    assert tl.layer_weight_bytes(tl.LayerShape.deepseek_v2_lite()) == 27_526_144  # 27.5 MB
    v3 = tl.LayerShape.deepseek_v3()
    assert round(tl.layer_weight_bytes(v3) / 1e6) == 374  # docs/spec.md section 3
    shapes = tl.weight_shapes(v3)
    assert "w_q" not in shapes and shapes["w_q_b"] == (128 * 192, 1536)
    assert shapes["w_o"] == (7168, 128 * 128) and shapes["w_kv_b"] == (128 * 256, 512)


def test_step_inputs(tl):
    import torch

    cfg = small_shape(tl, 0)
    step = tl.make_step(cfg, SEQLENS, 2, torch.Generator().manual_seed(3), "cpu", page_size=PAGE,
                        spare_pages=3)
    assert step.positions.tolist() == [n - 1 for n in SEQLENS]
    assert step.cache_seqlens.dtype == step.block_table.dtype == torch.int32
    used = [p for r, n in enumerate(SEQLENS) for p in step.block_table[r, :math.ceil(n / PAGE)]
            .tolist()]
    assert len(set(used)) == len(used) and 0 <= min(used) and max(used) < step.num_pages
    assert len(step.caches) == 2 and not torch.equal(step.caches[0], step.caches[1])
    # cos_sin[pos, :, i] = cos, sin of pos * 10000^(-2i / 64)
    pos, i = 77, 5
    angle = pos * 10000.0 ** (-2 * i / 64)
    assert step.cos_sin.shape == (math.ceil(max(SEQLENS) / PAGE) * PAGE, 2, 32)
    assert np.allclose(step.cos_sin[pos, :, i].double().numpy(), [math.cos(angle),
                                                                   math.sin(angle)], atol=1e-6)
