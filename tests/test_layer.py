"""The fused decode layer (docs/spec.md section 3; kernelflow.DecodeGraph).

CPU: the CPU backend's layer against a float64 NumPy version of the layer written here
(reference_layer), over several steps of appends with variable lengths in the batch, for the
DeepSeek-V2-Lite shape and a small V3-like shape with query compression, with a bf16 cache (the
float64 version keeps its own cache) and 8-bit caches (the float64 version attends over the
library's 8-bit cache, dequantized); bit-identical reruns; the guards of the static buffers;
argument errors named in Python terms.

GPU (marked gpu): the CUDA graph against the CPU layer with the same cache format, per layer
(each layer a one-layer graph fed the same input as the CPU layer), for V2-Lite and V3 (whole,
a 16-head shard and a small one); replays against a second graph, the kernel node count, and bad
values written between replays.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest

import kernelflow as kf
from inputs import BF16, bits
from kernelflow import reference as ref

pytestmark = pytest.mark.skipif(BF16 is None, reason="bfloat16 NumPy arrays need ml_dtypes")

HEAD, LATENT, ROPE, NOPE, V = 576, 512, 64, 128, 128
QK = NOPE + ROPE
EPS = 1e-6
MAX_COS_DIST = 1e-4  # the layer's acceptance bound: cosine distance of the whole output
FORMATS = ["bf16", "fp8_e4m3", "int8"]
FIELDS = ("w_q", "w_q_a", "q_a_norm", "w_q_b", "w_kv_a", "kv_a_norm", "w_kv_b", "w_o")
SENTINEL = 7.0  # output rows past the batch must keep it


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    heads: int
    q_lora: int
    scale: float


V2_LITE = Shape("v2_lite", 2048, 16, 0, 0.114721)
V3_SMALL = Shape("v3_small", 1024, 8, 256, 0.135234)  # query compression, kept small for the CPU
V3_SHARD = Shape("v3_shard", 7168, 16, 1536, 0.135234)  # V3 with 16 of its 128 heads
V3 = Shape("v3", 7168, 128, 1536, 0.135234)  # all of V3's heads: the benchmark's V3 layer


# ---- inputs ----------------------------------------------------------------------------------

def random_weights(rng, shape: Shape) -> dict:
    """bf16 weights [out, in] drawn N(0, 1 / in), norm weights near 1."""
    def linear(out, inn):  # drawn in float32: the V3 shape's matrices hold 10^8 values
        scale = np.float32(1 / math.sqrt(inn))
        return (rng.standard_normal((out, inn), dtype=np.float32) * scale).astype(BF16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(BF16)

    w = {}
    if shape.q_lora:
        w["w_q_a"] = linear(shape.q_lora, shape.hidden)
        w["q_a_norm"] = norm(shape.q_lora)
        w["w_q_b"] = linear(shape.heads * QK, shape.q_lora)
    else:
        w["w_q"] = linear(shape.heads * QK, shape.hidden)
    w["w_kv_a"] = linear(LATENT + ROPE, shape.hidden)
    w["kv_a_norm"] = norm(LATENT)
    w["w_kv_b"] = linear(shape.heads * (NOPE + V), LATENT)
    w["w_o"] = linear(shape.hidden, shape.heads * V)
    return w


def cos_sin_table(max_position: int, base: float = 10000.0) -> np.ndarray:
    """float32 [max_position, 2, 32]: cos and sin of position * base^(-2i / 64)."""
    inv_freq = base ** (-np.arange(0, ROPE, 2) / ROPE)
    angles = np.arange(max_position)[:, None] * inv_freq[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


@dataclass
class Problem:
    shape: Shape
    fmt: str
    config: kf.LayerConfig
    weights: list            # per layer: dict of bf16 arrays (no cache)
    caches: list             # per layer: the cache before step 0
    block_table: np.ndarray  # int32 [max_batch, max_pages_per_seq]
    history: np.ndarray      # int32 [batch]: cached positions before step 0
    hidden: list             # per step: bf16 [max_batch, hidden]
    cos_sin: np.ndarray

    @property
    def batch(self) -> int:
        return len(self.history)

    def seqlens(self, step: int) -> np.ndarray:
        """Lengths after step `step`'s append: one new row per request and step."""
        return (self.history + step + 1).astype(np.int32)

    def layer(self, index: int) -> Problem:
        """The same problem with layer `index` alone."""
        return dataclasses.replace(self, weights=[self.weights[index]],
                                   caches=[self.caches[index]])


def make_problem(rng, shape: Shape, fmt: str, history, steps=3, num_layers=2, page_size=16,
                 spare_rows=1, spare_pages=3) -> Problem:
    """Each request's pages scattered over the pool in random order (the same pages in every
    layer's cache), random N(0, 1) rows at its cached positions, NaN in every other slot; block
    table entries past a request's pages hold INT32_MAX (never read); one more row in the static
    buffers than the batch uses."""
    history = np.array(history, np.int32)
    batch = len(history)
    max_batch = batch + spare_rows
    need = [math.ceil((int(n) + steps) / page_size) for n in history]
    max_pages = max(need) + 1
    num_pages = sum(need) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    block_table = np.full((max_batch, max_pages), np.iinfo(np.int32).max, np.int32)
    used = 0
    for r, n in enumerate(need):
        block_table[r, :n] = perm[used : used + n]
        used += n
    cached = np.array([int(block_table[r, t // page_size]) * page_size + t % page_size
                       for r, n in enumerate(history) for t in range(int(n))], np.int64)
    caches = []
    for _ in range(num_layers):
        cache = np.full((num_pages * page_size, HEAD), np.nan, np.float32)
        cache[cached] = rng.standard_normal((len(cached), HEAD))
        cache = cache.reshape(num_pages, page_size, HEAD).astype(BF16)
        caches.append(cache if fmt == "bf16" else kf.convert_cache(cache, kv_format=fmt))
    max_position = int(history.max()) + steps + 5
    config = kf.LayerConfig(hidden_size=shape.hidden, num_heads=shape.heads,
                            q_lora_rank=shape.q_lora, softmax_scale=shape.scale, kv_format=fmt,
                            page_size=page_size, max_batch=max_batch,
                            max_pages_per_seq=max_pages, max_position=max_position)
    return Problem(
        shape=shape, fmt=fmt, config=config,
        weights=[random_weights(rng, shape) for _ in range(num_layers)], caches=caches,
        block_table=block_table, history=history,
        hidden=[rng.standard_normal((max_batch, shape.hidden)).astype(BF16)
                for _ in range(steps)],
        cos_sin=cos_sin_table(max_position))


# ---- running the library ---------------------------------------------------------------------

def to_torch(a, device):
    import torch

    a = np.array(a, copy=True)  # never shares memory with the problem's arrays
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def to_numpy(a):
    if isinstance(a, np.ndarray):
        return a.copy()
    import torch

    a = a.detach().cpu()
    if a.dtype == torch.bfloat16:
        return a.view(torch.int16).numpy().view(BF16)
    return a.numpy()


class Runner:
    """A DecodeGraph over copies of a problem's caches and its own static buffers: NumPy arrays
    (device "numpy"), or PyTorch tensors on `device` ("cpu", "cuda")."""

    def __init__(self, p: Problem, device="numpy", num_workers=None):
        self.p = p
        put = (lambda a: np.array(a, copy=True)) if device == "numpy" else (
            lambda a: to_torch(a, device))
        mb, hidden = p.config.max_batch, p.shape.hidden
        self.caches = [put(c) for c in p.caches]
        self.layers = [{**{k: put(v) for k, v in w.items()}, "kv_cache": c}
                       for w, c in zip(p.weights, self.caches)]
        self.hidden = put(np.zeros((mb, hidden), BF16))
        self.output = put(np.full((mb, hidden), SENTINEL, BF16))
        self.positions = put(np.zeros(mb, np.int32))
        self.seqlens = put(np.zeros(mb, np.int32))
        self.block_table = put(p.block_table)
        self.cos_sin = put(p.cos_sin)
        self.error_buffer = kf.new_error_buffer(self.hidden)
        self.graph = kf.DecodeGraph(
            p.config, self.layers, hidden=self.hidden, output=self.output,
            positions=self.positions, cache_seqlens=self.seqlens, block_table=self.block_table,
            cos_sin=self.cos_sin, batch=p.batch, num_workers=num_workers,
            error_buffer=self.error_buffer)

    def write(self, dst, values):
        if isinstance(dst, np.ndarray):
            dst[...] = values
        else:
            dst.copy_(to_torch(values, dst.device))

    def set_step(self, step: int, seqlens=None, positions=None, block_table=None, hidden=None):
        """The static buffers of step `step` (positions = lengths - 1 unless given; `hidden`
        replaces the step's input rows of the batch)."""
        p = self.p
        lens = np.zeros(p.config.max_batch, np.int32)
        lens[: p.batch] = p.seqlens(step) if seqlens is None else seqlens
        pos = np.zeros(p.config.max_batch, np.int32)
        pos[: p.batch] = lens[: p.batch] - 1 if positions is None else positions
        x = p.hidden[step].copy()
        if hidden is not None:
            x[: p.batch] = hidden
        self.write(self.hidden, x)
        self.write(self.seqlens, lens)
        self.write(self.positions, pos)
        self.write(self.block_table, p.block_table if block_table is None else block_table)

    def step(self, step: int, **kw) -> np.ndarray:
        """Run step `step`; the output rows of the batch as bf16 (NumPy)."""
        self.set_step(step, **kw)
        self.graph.launch()
        out = to_numpy(self.output)
        assert (out[self.p.batch :].astype(np.float32) == SENTINEL).all(), \
            "rows past the batch must not be written"
        return out[: self.p.batch]

    def errors(self) -> list:
        return to_numpy(self.error_buffer).tolist()


# ---- the float64 layer (docs/spec.md section 3) ---------------------------------------------------

def rms_norm(v, weight):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + EPS) * weight


def rope(x, cos, sin):
    """Interleaved pairs (x[2i], x[2i+1]) rotated by (cos[i], sin[i])."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def f64(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def reference_layer(x, w, cache, seqlens, positions, block_table, cos_sin, shape, write):
    """One layer in float64 for the batch: x [b, hidden] -> (y [b, hidden], new cache rows
    [b, 576]). `cache` is float64 [num_pages, page_size, 576]: with `write` the new rows, rounded
    to bf16 as a bf16 cache stores them, go into it first; without, it holds them already (the
    library's 8-bit cache, dequantized)."""
    b, page_size = x.shape[0], cache.shape[1]
    w = {k: f64(v) for k, v in w.items()}
    if shape.q_lora:
        q = rms_norm(x @ w["w_q_a"].T, w["q_a_norm"]) @ w["w_q_b"].T
    else:
        q = x @ w["w_q"].T
    q = q.reshape(b, shape.heads, QK)
    cs = cos_sin[positions].astype(np.float64)  # [b, 2, 32]
    cos, sin = cs[:, 0], cs[:, 1]
    q_pe = rope(q[..., NOPE:], cos[:, None], sin[:, None])
    kv = x @ w["w_kv_a"].T
    rows = np.concatenate([rms_norm(kv[:, :LATENT], w["kv_a_norm"]), rope(kv[:, LATENT:], cos, sin)],
                          axis=1)
    if write:
        for r in range(b):
            t = int(seqlens[r]) - 1
            cache[block_table[r, t // page_size], t % page_size] = ref.round_to_bf16(rows[r])
    w_kv_b = w["w_kv_b"].reshape(shape.heads, NOPE + V, LATENT)
    q_lat = np.einsum("bhi,hij->bhj", q[..., :NOPE], w_kv_b[:, :NOPE])
    q_attn = np.concatenate([q_lat, q_pe], axis=-1)
    o_lat = np.stack([
        ref.attend(q_attn[r], ref.paged_rows(cache, block_table, r, int(seqlens[r])),
                   shape.scale)[0]
        for r in range(b)])
    o = np.einsum("hij,bhj->bhi", w_kv_b[:, NOPE:], o_lat).reshape(b, shape.heads * V)
    return o @ w["w_o"].T, rows


def dequantized(cache8, fmt):
    """float64 [num_pages, page_size, 576]: what an 8-bit cache holds (docs/formats.md's map)."""
    n, ps, _ = cache8.shape
    raw = cache8.reshape(n, -1)
    codes = np.ascontiguousarray(raw[:, : ps * LATENT]).reshape(n * ps, LATENT)
    rope_bits = np.ascontiguousarray(raw[:, ps * LATENT : ps * 640]).view(np.uint16)
    scale = np.ascontiguousarray(raw[:, ps * 640 : ps * 644]).view(np.float32)
    q = ref.Quantized(codes, rope_bits.reshape(n * ps, ROPE), scale.reshape(n * ps))
    return ref.dequantize_8bit(q, fmt).reshape(n, ps, HEAD)


class Reference:
    """The float64 layers over the steps of a problem, next to a Runner's results."""

    def __init__(self, p: Problem):
        self.p = p
        self.caches = [f64(c) for c in p.caches] if p.fmt == "bf16" else None

    def step(self, step: int, library_caches=None):
        """(output [b, hidden], per layer the new cache rows [b, 576]) of step `step`; 8-bit
        formats attend over library_caches (the library's caches after the step)."""
        p = self.p
        seqlens = p.seqlens(step)
        positions = seqlens - 1
        x = f64(p.hidden[step][: p.batch])
        new_rows = []
        for layer, w in enumerate(p.weights):
            if p.fmt == "bf16":
                cache, write = self.caches[layer], True
            else:
                cache, write = dequantized(to_numpy(library_caches[layer]), p.fmt), False
            y, rows = reference_layer(x, w, cache, seqlens, positions, p.block_table,
                                      p.cos_sin, p.shape, write)
            new_rows.append(rows)
            x = f64(y.astype(np.float32).astype(BF16))  # a layer's output is bf16
        return x, new_rows


def slots_of(p: Problem, step: int) -> list:
    """(page, offset) of each request's new row at step `step`."""
    ps = p.config.page_size
    return [(int(p.block_table[r, (n - 1) // ps]), (n - 1) % ps)
            for r, n in enumerate(p.seqlens(step))]


def slot_values(cache, fmt):
    """float64 [num_pages, page_size, 576]: every slot's row (8-bit ones dequantized)."""
    return f64(cache) if fmt == "bf16" else dequantized(cache, fmt)


def check_against_reference(p: Problem, runner: Runner, steps: int):
    reference = Reference(p)
    for step in range(steps):
        before = [to_numpy(c) for c in runner.caches]
        out = runner.step(step)
        want, new_rows = reference.step(step, runner.caches)
        dist = float(ref.cosine_distance(f64(out), want, axis=None))
        assert np.isfinite(f64(out)).all(), f"step {step}: non-finite output"
        assert dist < MAX_COS_DIST, f"{p.shape.name} {p.fmt} step {step}: cosine distance {dist:.3g}"
        slots = slots_of(p, step)
        for layer, cache in enumerate(runner.caches):
            after = slot_values(to_numpy(cache), p.fmt)
            old = slot_values(before[layer], p.fmt)
            got = np.stack([after[page, offset] for page, offset in slots])
            bound = MAX_COS_DIST if p.fmt == "bf16" else ref.MAX_WHOLE_COS_DIST_8BIT[p.fmt]
            row_dist = float(ref.cosine_distance(got, new_rows[layer], axis=None))
            assert row_dist < bound, f"layer {layer} step {step}: new cache rows {row_dist:.3g}"
            # Only the new rows' slots changed.
            for page, offset in slots:
                old[page, offset] = after[page, offset]
            assert bits(after) == bits(old), f"layer {layer} step {step}: other slots changed"
    assert runner.errors() == [0, -1, 0, 0]


class Chain:
    """A graph of a problem's L layers next to L one-layer graphs of the same layers (their own
    copies of the caches) applied in turn, each fed the previous one's output, and optionally a
    one-layer CPU graph per layer fed the same input as the one-layer graph on `device`."""

    def __init__(self, p: Problem, device, with_cpu=False):
        self.p = p
        self.full = Runner(p, device=device)
        self.single = [Runner(p.layer(l), device=device) for l in range(len(p.weights))]
        self.cpu = [Runner(p.layer(l)) for l in range(len(p.weights))] if with_cpu else []
        self.per_layer = []

    def step(self, step: int):
        """(the full graph's output, per layer the cosine distance between the one-layer graph
        on the device and the CPU one on the same input)."""
        out = self.full.step(step)
        x = self.p.hidden[step][: self.p.batch]
        self.per_layer, dists = [], []
        for layer, single in enumerate(self.single):
            y = single.step(step, hidden=x)
            if self.cpu:
                want = self.cpu[layer].step(step, hidden=x)
                assert np.isfinite(f64(y)).all(), f"layer {layer} step {step}: non-finite output"
                dists.append(float(ref.cosine_distance(f64(y), f64(want), axis=None)))
            self.per_layer.append(y)
            x = y
        return out, dists


# ---- CPU: the layer against the float64 version ---------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [V2_LITE, V3_SMALL], ids=lambda s: s.name)
def test_cpu_layer_matches_float64(rng, shape, fmt):
    """Three steps, two layers, lengths 37, 130 and 5 growing by one each step (crossing page
    boundaries at different steps)."""
    p = make_problem(rng, shape, fmt, history=[37, 130, 5], steps=3)
    check_against_reference(p, Runner(p), steps=3)


@pytest.mark.parametrize("num_workers", [1, 3, 16])
def test_cpu_layer_worker_counts(rng, num_workers):
    """The split of the attention over workers does not change the layer beyond rounding."""
    p = make_problem(rng, V3_SMALL, "bf16", history=[200, 1, 64, 90], steps=2, num_layers=1)
    check_against_reference(p, Runner(p, num_workers=num_workers), steps=2)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_cpu_reruns_bit_identical(rng, fmt):
    """Two graphs on fresh copies of the same inputs, and one graph run twice from the same
    cache state, give the same bits (outputs and caches)."""
    p = make_problem(rng, V3_SMALL, fmt, history=[70, 3, 150], steps=3)
    a, b = Runner(p), Runner(p)
    for step in range(3):
        assert bits(a.step(step)) == bits(b.step(step)), f"step {step}"
    for ca, cb in zip(a.caches, b.caches):
        assert bits(ca) == bits(cb)
    saved = [c.copy() for c in a.caches]
    first = a.step(2)
    for c, s in zip(a.caches, saved):
        c[...] = s
    assert bits(a.step(2)) == bits(first)


def test_cpu_graph_is_its_layers_in_turn(rng):
    """A graph of three layers gives the bits of three one-layer graphs, each fed the previous
    one's bf16 output (the contract's composition)."""
    p = make_problem(rng, V3_SMALL, "int8", history=[70, 3, 150], steps=2, num_layers=3)
    chain = Chain(p, device="numpy")
    for step in range(2):
        out, _ = chain.step(step)
        assert bits(out) == bits(chain.per_layer[-1])


@pytest.mark.needs_torch
def test_cpu_torch_arrays_match_numpy(rng):
    """PyTorch CPU tensors reach the same layer through DLPack: the same bits as NumPy."""
    p = make_problem(rng, V3_SMALL, "fp8_e4m3", history=[20, 33], steps=2, num_layers=1)
    a, b = Runner(p), Runner(p, device="cpu")
    for step in range(2):
        assert bits(a.step(step)) == bits(b.step(step))


def test_cpu_graph_surface(rng):
    p = make_problem(rng, V3_SMALL, "bf16", history=[5], steps=1, num_layers=3)
    r = Runner(p)
    assert r.graph.kernel_nodes == 0 and r.graph.num_layers == 3 and r.graph.batch == 1
    assert r.graph.workspace is None  # the CPU backend needs none
    assert kf.layer_workspace_size(p.config, 1, device="cpu") == 0
    with r.graph as g:
        g.launch()
    with pytest.raises(ValueError, match="DecodeGraph: closed"):
        r.graph.launch()
    r.graph.close()  # idempotent


def test_workspace_size_for_cuda_grows_with_batch():
    """With an explicit worker count the CUDA size needs no device: the shared layout's total."""
    cfg = kf.LayerConfig.deepseek_v2_lite(max_batch=64, max_pages_per_seq=64, max_position=4096)
    sizes = [kf.layer_workspace_size(cfg, b, 32, device="cuda:0") for b in (1, 8, 64)]
    assert 0 < sizes[0] < sizes[1] < sizes[2]
    assert all(s % 256 == 0 for s in sizes)


def test_presets():
    v2 = kf.LayerConfig.deepseek_v2_lite(max_pages_per_seq=8, max_position=512)
    assert (v2.hidden_size, v2.num_heads, v2.q_lora_rank, v2.softmax_scale) == (2048, 16, 0, 0.114721)
    v3 = kf.LayerConfig.deepseek_v3(num_heads=16, max_pages_per_seq=8, max_position=512,
                                    kv_format="int8")
    assert (v3.hidden_size, v3.num_heads, v3.q_lora_rank, v3.kv_format) == (7168, 16, 1536, "int8")
    assert v3.softmax_scale == 0.135234 and v3.rms_norm_eps == 1e-6 and v3.kv_lora_rank == 512


# ---- CPU: the guards of the static buffers -------------------------------------------------------

BAD_VALUES = {
    # name: (which buffer, how to break request 1, the flag)
    "position_negative": ("positions", lambda p, v: -1, kf.DEVERR_SEQLEN_RANGE),
    "position_past_table": ("positions", lambda p, v: p.config.max_position,
                            kf.DEVERR_SEQLEN_RANGE),
    "seqlen_zero": ("seqlens", lambda p, v: 0, kf.DEVERR_SEQLEN_RANGE),
    "seqlen_past_table": ("seqlens",
                          lambda p, v: p.config.max_pages_per_seq * p.config.page_size + 1,
                          kf.DEVERR_SEQLEN_RANGE),
    "page_negative": ("page", lambda p, v: -3, kf.DEVERR_PAGE_RANGE),
    "page_past_cache": ("page", lambda p, v: p.caches[0].shape[0], kf.DEVERR_PAGE_RANGE),
}


@pytest.mark.parametrize("kind", list(BAD_VALUES))
def test_cpu_guards_flag_bad_values(rng, kind):
    """A bad value of request 1 is flagged with its index and value; nothing outside the cache is
    touched, a row whose length or page is bad is not written, and request 0 is computed as
    without it."""
    p = make_problem(rng, V3_SMALL, "bf16", history=[40, 20], steps=1, num_layers=1)
    clean = Runner(p).step(0)
    r = Runner(p)
    what, bad, flag = BAD_VALUES[kind]
    seqlens, positions = p.seqlens(0), p.seqlens(0) - 1
    table = p.block_table.copy()
    value = bad(p, None)
    if what == "positions":
        positions[1] = value
    elif what == "seqlens":
        seqlens[1] = value
        positions[1] = 0
    else:
        table[1, (int(seqlens[1]) - 1) // p.config.page_size] = value
    before = to_numpy(r.caches[0])
    out = r.step(0, seqlens=seqlens, positions=positions, block_table=table)
    # The first offender is request 1 with its value; a length clamped to what the block table
    # addresses may also reach entries no request uses (KF_DEVERR_PAGE_RANGE).
    errors = r.errors()
    assert errors[0] & flag and errors[1:3] == [1, value], errors
    dist = float(ref.cosine_distance(f64(out[0]), f64(clean[0]), axis=None))
    assert dist < 1e-6, f"request 0 changed: {dist:.3g}"
    after = to_numpy(r.caches[0])
    page0, offset0 = slots_of(p, 0)[0]
    before[page0, offset0] = after[page0, offset0]  # request 0's row
    if what == "positions":  # the row is still written, at the clamped position's rotation
        page1, offset1 = slots_of(p, 0)[1]
        before[page1, offset1] = after[page1, offset1]
    assert bits(after) == bits(before)


# ---- argument errors, named as a Python caller spells them -------------------------------------

@pytest.fixture
def valid(rng):
    """A valid DecodeGraph call: (config, layers, io) as keyword arguments."""
    p = make_problem(rng, V3_SMALL, "bf16", history=[10, 30], steps=1, num_layers=2)
    r = Runner(p)
    r.graph.close()
    io = dict(hidden=r.hidden, output=r.output, positions=r.positions,
              cache_seqlens=r.seqlens, block_table=r.block_table, cos_sin=r.cos_sin)
    return p, r.layers, io


def call_graph(config, layers, io, **kw):
    return kf.DecodeGraph(config, layers, **io, **kw)


def replaced(layers, index, **fields):
    out = [dict(layer) for layer in layers]
    for key, value in fields.items():
        if value is None:
            del out[index][key]
        else:
            out[index][key] = value
    return out


def test_error_wrong_weight_shape(valid):
    p, layers, io = valid
    bad = replaced(layers, 1, w_kv_b=np.zeros((8 * 256, 256), BF16))
    with pytest.raises(ValueError, match=r'^layers\[1\]\["w_kv_b"\]: expected shape \[2048, 512\]'):
        call_graph(p.config, bad, io)


def test_error_cache_of_another_format(valid):
    p, layers, io = valid
    int8 = kf.LayerConfig(**{**p.config.__dict__, "kv_format": "int8"})
    with pytest.raises(ValueError, match=r'^layers\[0\]\["kv_cache"\]: expected dtype uint8 for '
                                         r"kv_format 'int8', got bfloat16"):
        call_graph(int8, layers, io)
    cache8 = kf.convert_cache(layers[1]["kv_cache"], kv_format="int8")
    with pytest.raises(ValueError, match=r'^layers\[1\]\["kv_cache"\]: expected dtype bfloat16 '):
        call_graph(p.config, replaced(layers, 1, kv_cache=cache8), io)


def test_error_cache_page_size(valid):
    p, layers, io = valid
    other = np.zeros((4, 32, HEAD), BF16)
    with pytest.raises(ValueError, match=r'^layers\[0\]\["kv_cache"\]: expected page_size 16 '
                                         r"\(config.page_size\)"):
        call_graph(p.config, replaced(layers, 0, kv_cache=other), io)


def test_error_batch_above_max(valid):
    p, layers, io = valid
    with pytest.raises(ValueError, match=r"^batch: expected 1\.\.3 \(config.max_batch\), got 4"):
        call_graph(p.config, layers, io, batch=4)


def test_error_missing_weight(valid):
    p, layers, io = valid
    with pytest.raises(ValueError, match=r'^layers\[1\]\["w_o"\]: expected a tensor, got None'):
        call_graph(p.config, replaced(layers, 1, w_o=None), io)
    with pytest.raises(ValueError, match=r'^layers\[0\]\["kv_cache"\]: expected a tensor'):
        call_graph(p.config, replaced(layers, 0, kv_cache=None), io)


def test_error_q_lora_mismatch(valid):
    p, layers, io = valid
    w_q = np.zeros((8 * QK, 1024), BF16)
    with pytest.raises(ValueError, match=r'^layers\[0\]\["w_q"\]: expected None when '
                                         r"config.q_lora_rank = 256"):
        call_graph(p.config, replaced(layers, 0, w_q=w_q), io)
    no_lora = kf.LayerConfig(**{**p.config.__dict__, "q_lora_rank": 0})
    with pytest.raises(ValueError, match=r'^layers\[0\]\["w_q"\]: expected a tensor '
                                         r"\(config.q_lora_rank = 0"):
        call_graph(no_lora, layers, io)
    with pytest.raises(ValueError, match=r'^layers\[1\]\["q_a_norm"\]: expected a tensor'):
        call_graph(p.config, replaced(layers, 1, q_a_norm=None), io)


@pytest.mark.parametrize("name, value, pattern", [
    ("positions", np.zeros(3, np.int64), r"^positions: expected dtype int32, got int64"),
    ("cache_seqlens", np.zeros(2, np.int32), r"^cache_seqlens: expected shape \[3\]"),
    ("block_table", np.zeros((3, 2), np.int32), r"^block_table: expected shape \[3, "),
    ("cos_sin", np.zeros((10, 64), np.float32), r"^cos_sin: expected shape \["),
    ("output", np.zeros((3, 1024), np.float32), r"^output: expected dtype bfloat16, got float32"),
])
def test_error_static_buffers(valid, name, value, pattern):
    p, layers, io = valid
    with pytest.raises(ValueError, match=pattern):
        call_graph(p.config, layers, {**io, name: value})


@pytest.mark.parametrize("field, value, error, pattern", [
    ("num_heads", 0, ValueError, r"^config.num_heads: expected 1\.\.128, got 0"),
    ("hidden_size", 1000, ValueError, r"^config.hidden_size: expected a multiple of 64"),
    ("q_lora_rank", 100, ValueError, r"^config.q_lora_rank: expected 0 "),
    ("kv_lora_rank", 256, NotImplementedError, r"^config.kv_lora_rank: only 512 is supported"),
    ("v_head_dim", 64, NotImplementedError, r"^config.v_head_dim: only 128 is supported"),
    ("kv_format", "fp16", NotImplementedError, r"^config.kv_format: 'fp16' is not supported"),
    ("page_size", 24, ValueError, r"^config.page_size: expected a power of two"),
    ("max_batch", 129, ValueError, r"^config.max_batch: expected 1\.\.128, got 129"),
    ("softmax_scale", 0.0, ValueError, r"^config.softmax_scale: expected a finite value > 0"),
    ("rms_norm_eps", float("nan"), ValueError, r"^config.rms_norm_eps: expected a finite value"),
])
def test_error_config(valid, field, value, error, pattern):
    p, layers, io = valid
    config = kf.LayerConfig(**{**p.config.__dict__, field: value})
    with pytest.raises(error, match=pattern):
        call_graph(config, layers, io)
    with pytest.raises(error, match=pattern):
        kf.layer_workspace_size(config, 1, device="cpu")


def test_error_python_side(valid):
    p, layers, io = valid
    with pytest.raises(ValueError, match=r"^config.kv_format: expected one of"):
        kf.LayerConfig(**{**p.config.__dict__, "kv_format": "fp4"})
    with pytest.raises(TypeError, match=r"^config.num_heads: expected an int, got float"):
        kf.LayerConfig(**{**p.config.__dict__, "num_heads": 8.0})
    with pytest.raises(TypeError, match=r"^config: expected a kernelflow.LayerConfig"):
        call_graph(p.config.__dict__, layers, io)
    with pytest.raises(ValueError, match=r"^layers\[1\]: unexpected key 'w_qq'"):
        call_graph(p.config, replaced(layers, 1, w_qq=layers[1]["w_q_a"]), io)
    with pytest.raises(ValueError, match=r"^layers: expected at least one layer"):
        call_graph(p.config, [], io)
    with pytest.raises(TypeError, match=r'^layers\[0\]\["w_o"\]: expected an array'):
        call_graph(p.config, replaced(layers, 0, w_o=[1.0, 2.0]), io)


def test_error_workspace(valid):
    p, layers, io = valid
    with pytest.raises(ValueError, match=r"^workspace: expected dtype uint8, got float32"):
        call_graph(p.config, layers, io, workspace=np.zeros(64, np.float32))


def test_error_writes_nothing(valid):
    """A failed creation leaves the output, the caches and the error buffer as they were."""
    p, layers, io = valid
    error_buffer = kf.new_error_buffer(io["hidden"])
    snapshot = [bits(io["output"])] + [bits(layer["kv_cache"]) for layer in layers]
    with pytest.raises(ValueError):
        call_graph(p.config, replaced(layers, 1, w_o=None), io, error_buffer=error_buffer)
    assert snapshot == [bits(io["output"])] + [bits(layer["kv_cache"]) for layer in layers]
    assert error_buffer.tolist() == [0, -1, 0, 0]


# ---- GPU: the CUDA graph against the CPU layer ------------------------------------------------

GPU = "cuda"  # the PyTorch device of the GPU tests

def compare_devices(p: Problem, steps: int, gpu_workers=None):
    """The CUDA graph (with gpu_workers decode workers, None: the graph's default) and the CPU
    layer, same inputs and cache format: the output of every step within the acceptance bound."""
    cpu, gpu = Runner(p), Runner(p, device=GPU, num_workers=gpu_workers)
    dists = []
    for step in range(steps):
        want, got = cpu.step(step), gpu.step(step)
        assert np.isfinite(f64(got)).all(), f"step {step}: non-finite GPU output"
        dists.append(float(ref.cosine_distance(f64(got), f64(want), axis=None)))
    assert max(dists) < MAX_COS_DIST, f"{p.shape.name} {p.fmt}: cosine distances {dists}"
    assert gpu.errors() == [0, -1, 0, 0] and cpu.errors() == [0, -1, 0, 0]


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [V2_LITE, V3_SMALL, V3_SHARD, V3], ids=lambda s: s.name)
def test_gpu_layer_matches_cpu(rng, shape, fmt):
    """Three steps of appends with variable lengths through three layers, for both model shapes
    (V3 whole and as a 16-head shard). Each layer (a one-layer graph) against the CPU layer on
    the same input, within the acceptance bound; the graph of the three layers gives the bits of
    the one-layer graphs applied in turn.

    The bound holds per layer: the GPU stores q, the compressed query and kv in bf16 where the
    CPU keeps fp32, and a chain of attention blocks without the model's residuals compounds
    that difference from layer to layer."""
    p = make_problem(rng, shape, fmt, history=[300, 1000, 17, 64], steps=3, num_layers=3,
                     page_size=64)
    chain = Chain(p, device=GPU, with_cpu=True)
    for step in range(3):
        out, dists = chain.step(step)
        assert max(dists) < MAX_COS_DIST, f"{shape.name} {fmt} step {step}: per layer {dists}"
        assert bits(out) == bits(chain.per_layer[-1]), f"step {step}: the graph of 3 layers"
    assert chain.full.errors() == [0, -1, 0, 0]


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("batch,fmt", [(1, "bf16"), (8, "bf16"), (32, "bf16"), (33, "bf16"),
                                       (128, "bf16"), (64, "fp8_e4m3"), (128, "int8")])
def test_gpu_layer_batch_sizes(rng, batch, fmt):
    """The skinny GEMMs at every batch size class, V2-Lite, one layer. The 8-bit cases also run
    with the worker count a plain decode of that batch takes by default, which on an H200 picks
    the sm_90a family's 8-bit kernel (the graph's own default keeps the format's count)."""
    history = rng.integers(1, 600, size=batch)
    p = make_problem(rng, V2_LITE, fmt, history=history, steps=2, num_layers=1,
                     page_size=64, spare_rows=min(1, kf._C.LAYER_MAX_BATCH - batch))
    compare_devices(p, steps=2)
    if fmt != "bf16":
        compare_devices(p, steps=2, gpu_workers=kf.default_num_workers(GPU, 16, 1, fmt, batch=batch))


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_replays_match_second_graph(rng, fmt):
    """Replays of one graph give the same bits as a second graph built from the same inputs."""
    p = make_problem(rng, V2_LITE, fmt, history=[500, 77, 1200], steps=3, num_layers=2,
                     page_size=64)
    a, b = Runner(p, device=GPU), Runner(p, device=GPU)
    for step in range(3):
        assert bits(a.step(step)) == bits(b.step(step)), f"{fmt} step {step}"
    for ca, cb in zip(a.caches, b.caches):
        assert bits(to_numpy(ca)) == bits(to_numpy(cb))


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("num_layers", [1, 4])
def test_gpu_kernel_nodes(rng, num_layers):
    """At most 8 kernel nodes per layer, plus the scheduler metadata once per step."""
    p = make_problem(rng, V3_SMALL, "bf16", history=[30, 40], steps=1, num_layers=num_layers)
    nodes = Runner(p, device=GPU).graph.kernel_nodes
    assert 0 < nodes <= 8 * num_layers + 1, nodes


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("kind", list(BAD_VALUES))
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_gpu_bad_values_between_replays(rng, kind, fmt):
    """A bad position, length or block table entry written between replays is flagged in the
    error buffer (flag and request index), nothing crashes, and a replay with good values
    afterwards matches the CPU layer again."""
    import torch

    p = make_problem(rng, V2_LITE, fmt, history=[40, 20], steps=3, num_layers=2)
    gpu, cpu = Runner(p, device=GPU), Runner(p)
    gpu.step(0)
    cpu.step(0)
    what, bad, flag = BAD_VALUES[kind]
    seqlens, positions = p.seqlens(1), p.seqlens(1) - 1
    table = p.block_table.copy()
    if what == "positions":
        positions[1] = bad(p, None)
    elif what == "seqlens":
        seqlens[1] = bad(p, None)
        positions[1] = 0
    else:
        table[1, (int(seqlens[1]) - 1) // p.config.page_size] = bad(p, None)
    gpu.step(1, seqlens=seqlens, positions=positions, block_table=table)
    torch.cuda.synchronize()
    errors = gpu.errors()
    assert errors[0] & flag and errors[1] == 1, errors
    # Good values again: the same request 0 as the CPU layer (request 1's cache now differs).
    gpu.write(gpu.error_buffer, np.array([0, -1, 0, 0], np.int32))
    got = gpu.step(2)
    cpu.step(1)
    want = cpu.step(2)
    assert gpu.errors() == [0, -1, 0, 0], gpu.errors()
    dist = float(ref.cosine_distance(f64(got[0]), f64(want[0]), axis=None))
    assert dist < MAX_COS_DIST, dist
