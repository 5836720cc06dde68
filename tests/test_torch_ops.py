"""kernelflow.torch_ops: the custom ops pass torch.library.opcheck (schema, fake implementation,
autograd registration), and torch.compile(fullgraph=True) over a two-layer decode step
(metadata, cache append and decode per layer) traces with no graph break and gives the same bits
as eager (aot_eager; on the GPU also inductor); on the GPU also under CUDA graphs
(mode="reduce-overhead"). Every test runs on the CPU and, marked gpu, on CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kernelflow as kf  # noqa: E402
import kernelflow.torch_ops as kft  # noqa: E402

pytestmark = pytest.mark.needs_torch

HEAD, LATENT = kf._C.HEAD_DIM, kf._C.LATENT_DIM
SCALE = 0.114721
H_Q, S_Q, PAGE, LAYERS = 16, 1, 16, 2
SEQLENS = [5, 37]  # before the step appends one token per request

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Step:
    """Inputs of one decode step over LAYERS layers: per layer a query, the new token's latent
    row per request and a paged bf16 cache; the block table, the lengths after the append and
    the slots the new tokens go to."""

    def __init__(self, device, seed=0):
        gen = torch.Generator().manual_seed(seed)
        batch = len(SEQLENS)
        pages = [(n + 1 + PAGE - 1) // PAGE for n in SEQLENS]
        num_pages = sum(pages) + 1
        table = torch.zeros((batch, max(pages)), dtype=torch.int32)
        first = 0
        for r, n in enumerate(pages):
            table[r, :n] = torch.arange(first, first + n, dtype=torch.int32)
            first += n
        slots = [int(table[r, n // PAGE]) * PAGE + n % PAGE for r, n in enumerate(SEQLENS)]

        def randn(*shape):
            return torch.randn(shape, generator=gen).to(device, torch.bfloat16)

        self.qs = [randn(batch, S_Q, H_Q, HEAD) for _ in range(LAYERS)]
        self.kvs = [randn(batch, HEAD) for _ in range(LAYERS)]
        self.caches = [randn(num_pages, PAGE, HEAD) for _ in range(LAYERS)]
        self.block_table = table.to(device)
        self.seqlens = torch.tensor([n + 1 for n in SEQLENS], dtype=torch.int32, device=device)
        self.slots = torch.tensor(slots, dtype=torch.int64, device=device)

    def args(self):
        """The step's arguments with fresh copies of the caches (the step writes them)."""
        return ([q for q in self.qs], [kv for kv in self.kvs], [c.clone() for c in self.caches],
                self.block_table, self.seqlens, self.slots)


def decode_step(qs, kvs, caches, block_table, seqlens, slots):
    metadata = kft.get_mla_metadata(seqlens, H_Q, S_Q)
    results = []
    for q, kv, cache in zip(qs, kvs, caches):
        kft.cache_append(kv, cache, slots)
        out, lse = kft.mla_decode(q, cache, block_table, seqlens, metadata, SCALE)
        results += [out, lse]
    return results


def bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check_same_bits(got, want, got_caches, want_caches):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert bits_equal(g, w), f"result {i} ({'out' if i % 2 == 0 else 'lse'} of layer {i // 2})"
    for layer, (g, w) in enumerate(zip(got_caches, want_caches)):
        assert bits_equal(g, w), f"cache of layer {layer}"


def run_eager(step):
    args = step.args()
    return decode_step(*args), args[2]


@pytest.mark.parametrize("device", DEVICES)
def test_ops_match_plain_api(device):
    step = Step(device)
    q, kv, cache = step.qs[0], step.kvs[0], step.caches[0]
    meta = kft.get_mla_metadata(step.seqlens, H_Q, S_Q)
    want_meta = kf.get_mla_metadata(step.seqlens, H_Q, S_Q)
    assert meta.dtype == torch.int32 and torch.equal(meta, want_meta)
    mine, plain = cache.clone(), cache.clone()
    kft.cache_append(kv, mine, step.slots)
    kf.cache_append(kv, plain, step.slots)
    assert bits_equal(mine, plain) and not bits_equal(mine, cache)
    out, lse = kft.mla_decode(q, mine, step.block_table, step.seqlens, meta, SCALE)
    want_out, want_lse = kf.mla_decode(q, plain, step.block_table, step.seqlens, want_meta, SCALE)
    assert out.shape == (2, S_Q, H_Q, LATENT) and out.dtype == torch.bfloat16
    assert lse.shape == (2, H_Q, S_Q) and lse.dtype == torch.float32
    assert bits_equal(out, want_out) and bits_equal(lse, want_lse)
    given_out, given_lse = torch.empty_like(out), torch.empty_like(lse)
    kft.mla_decode_out(q, mine, step.block_table, step.seqlens, meta, SCALE, given_out, given_lse)
    assert bits_equal(given_out, out) and bits_equal(given_lse, lse)
    converted = kft.convert_cache(cache, "fp8_e4m3")
    assert converted.shape == (cache.shape[0], PAGE, kf._C.BYTES_PER_TOKEN_8BIT)
    assert bits_equal(converted, kf.convert_cache(cache, kv_format="fp8_e4m3"))


@pytest.mark.parametrize("device", DEVICES)
def test_eager_fast_path_equals_dispatcher(device):
    """kft's eager calls skip the dispatcher only where nothing could tell: the same bits and
    version bumps as the registered ops, and the dispatcher under a profiler, a fake-tensor mode
    or with a tensor that requires grad."""
    step = Step(device)
    q, cache = step.qs[0], step.caches[0]
    meta = kft.get_mla_metadata(step.seqlens, H_Q, S_Q)
    assert torch.equal(meta, torch.ops.kernelflow.get_mla_metadata(step.seqlens, H_Q, S_Q, None,
                                                                   "bf16"))
    args = (q, cache, step.block_table, step.seqlens, meta, SCALE)
    out, lse = kft.mla_decode(*args)
    want_out, want_lse = torch.ops.kernelflow.mla_decode(*args, None, None)
    assert bits_equal(out, want_out) and bits_equal(lse, want_lse)
    given_out, given_lse = torch.empty_like(out), torch.empty_like(lse)
    versions = (given_out._version, given_lse._version)
    kft.mla_decode_out(*args, given_out, given_lse)
    assert bits_equal(given_out, out) and bits_equal(given_lse, lse)
    assert (given_out._version, given_lse._version) > versions
    assert kft._dispatch_free(q, cache, None)
    with torch.profiler.profile() as prof:
        assert not kft._dispatch_free(q)
        kft.mla_decode(*args)
    assert any(e.name == "kernelflow::mla_decode" for e in prof.events())
    grad_q = q.detach().clone().requires_grad_()
    assert not kft._dispatch_free(grad_q)
    with torch.no_grad():
        assert kft._dispatch_free(grad_q)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        assert not kft._dispatch_free(q)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_every_op(device):
    step = Step(device)
    q, kv, cache = step.qs[0], step.kvs[0], step.caches[0]
    bt, sl = step.block_table, step.seqlens
    ops = torch.ops.kernelflow
    workers = kf.default_num_workers(sl.device, H_Q, S_Q)
    meta = kft.get_mla_metadata(sl, H_Q, S_Q)
    workspace = kf.new_workspace(q, meta)
    out = torch.empty((2, S_Q, H_Q, LATENT), dtype=q.dtype, device=device)
    lse = torch.empty((2, H_Q, S_Q), dtype=torch.float32, device=device)
    cases = [
        (ops.get_mla_metadata, (sl, H_Q, S_Q, None, "bf16")),
        (ops.get_mla_metadata, (sl, H_Q, S_Q, workers + 3, "fp8_e4m3")),
        (ops.cache_append, (kv, cache.clone(), step.slots, None)),
        (ops.mla_decode, (q, cache, bt, sl, meta, SCALE, None, None)),
        (ops.mla_decode, (q, cache, bt, sl, meta, SCALE, "bf16", workspace)),
        (ops.mla_decode_out, (q, cache, bt, sl, meta, SCALE, None, workspace, out, lse)),
        (ops.convert_cache, (cache, "fp8_e4m3")),
        (ops.convert_cache, (cache, "int8")),
    ]
    x = torch.randn(64, 2048, device=device).bfloat16()
    w = torch.randn(96, 2048, device=device).bfloat16()
    cases += [(ops.linear, (x[:8], w, None)),  # the narrow kernel: no workspace
              (ops.linear, (x, w, kf.new_linear_workspace(x, w)))]  # split k
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_shapes(device):
    """The fake implementations' shapes and dtypes are those of the real outputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    step = Step(device)
    real_meta = kft.get_mla_metadata(step.seqlens, H_Q, S_Q, num_workers=7)
    real = kft.mla_decode(step.qs[0], step.caches[0], step.block_table, step.seqlens, real_meta,
                          SCALE)
    real_conv = kft.convert_cache(step.caches[0], "int8")
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fq, fc, fbt, fsl = (mode.from_tensor(t) for t in
                            (step.qs[0], step.caches[0], step.block_table, step.seqlens))
        meta = kft.get_mla_metadata(fsl, H_Q, S_Q, num_workers=7)
        out, lse = kft.mla_decode(fq, fc, fbt, fsl, meta, SCALE)
        conv = kft.convert_cache(fc, "int8")
    for fake, want in ((meta, real_meta), (out, real[0]), (lse, real[1]), (conv, real_conv)):
        assert (fake.shape, fake.dtype, fake.device) == (want.shape, want.dtype, want.device)
    assert real_meta.shape[0] == kf.metadata_size(len(SEQLENS), 7)


@pytest.mark.parametrize("device", DEVICES)
def test_no_graph_break(device):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(decode_step)(*Step(device).args())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("device,backend", [
    ("cpu", "aot_eager"),
    pytest.param("cuda", "aot_eager", marks=pytest.mark.gpu),
    pytest.param("cuda", "inductor", marks=pytest.mark.gpu),
])
def test_compile_fullgraph_same_bits(device, backend):
    torch._dynamo.reset()
    step = Step(device)
    want, want_caches = run_eager(step)
    compiled = torch.compile(decode_step, fullgraph=True, backend=backend)
    for _ in range(2):  # the first call compiles, the second runs the cached graph
        args = step.args()
        got = compiled(*args)
        check_same_bits(got, want, args[2], want_caches)


def test_fake_rejects_bad_q_by_name():
    torch._dynamo.reset()
    step = Step("cpu")
    bad_q = step.qs[0][..., :LATENT]
    meta = kf.get_mla_metadata(step.seqlens, H_Q, S_Q)

    def decode(q):
        return kft.mla_decode(q, step.caches[0], step.block_table, step.seqlens, meta, SCALE)

    with pytest.raises(Exception, match=r"q: expected shape \[b, s_q, h_q, 576\]"):
        torch.compile(decode, fullgraph=True, backend="aot_eager")(bad_q)
    with pytest.raises(ValueError, match=r"q: expected shape \[b, s_q, h_q, 576\]"):
        decode(bad_q)


@pytest.mark.gpu
def test_cuda_graphs_same_bits():
    """mode="reduce-overhead" records the step in a CUDA graph and replays it. The caches keep
    their addresses across steps (mark_static_address), as a serving engine's do: CUDA graphs
    are skipped for a graph that writes an input of changing address, which the skip counter
    would show. The compiled ops keep no workspace: their first calls run with allocations
    routed to the CUDA graph trees' private pool, whose blocks the trees hand out again."""
    from torch._dynamo.utils import counters

    from kernelflow._workspace_cache import WORKSPACES

    torch._dynamo.reset()
    counters.clear()
    step = Step("cuda")
    want, want_caches = run_eager(step)
    kept = {key: id(tensor) for key, (_, tensor) in WORKSPACES._buffers.items()}
    caches = [c.clone() for c in step.caches]
    for cache in caches:
        torch._dynamo.mark_static_address(cache)
    compiled = torch.compile(decode_step, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay
        for cache, start in zip(caches, step.caches):
            cache.copy_(start)
        got = [t.clone() for t in compiled(step.qs, step.kvs, caches, step.block_table,
                                             step.seqlens, step.slots)]
        torch.cuda.synchronize()
        check_same_bits(got, want, caches, want_caches)
    assert counters["inductor"]["cudagraph_skips"] == 0, "the step did not run as a CUDA graph"
    assert {key: id(tensor) for key, (_, tensor) in WORKSPACES._buffers.items()} == kept, \
        "a compiled op kept a workspace"


def test_import_kernelflow_leaves_torch_alone():
    """`import kernelflow` does not import torch; kernelflow.torch_ops does."""
    import subprocess
    import sys

    code = ("import sys, kernelflow; assert 'torch' not in sys.modules; "
            "import kernelflow.torch_ops; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_op_same_bits_eager_and_compiled(device):
    """kernelflow::linear gives kernelflow.linear's bits eagerly and under torch.compile
    (fullgraph), its workspace left zero, and its fake the real output's shape and dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, 1024, generator=gen).bfloat16().to(device)
    w = torch.randn(80, 1024, generator=gen).bfloat16().to(device)
    ws = kf.new_linear_workspace(x, w)
    want = kf.linear(x, w)
    assert bits_equal(kft.linear(x, w), want) and bits_equal(kft.linear(x, w, ws), want)
    assert int(ws.count_nonzero()) == 0

    def project(a, b, workspace):
        return kft.linear(a, b, workspace) * 2

    compiled = torch.compile(project, fullgraph=True, backend="aot_eager")
    assert bits_equal(compiled(x, w, ws), want * 2)
    assert int(ws.count_nonzero()) == 0
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = kft.linear(mode.from_tensor(x), mode.from_tensor(w))
    assert (fake.shape, fake.dtype, fake.device) == (want.shape, want.dtype, want.device)
    with pytest.raises(ValueError, match=r"x: expected shape \[m, k\], got \(64, 1024, 1\)"):
        kft.linear(x[..., None], w)
