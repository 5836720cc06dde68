"""kernelflow.torch_ops.launch_layer_graph: the fused decode layer (kernelflow.DecodeGraph) as a
torch op. Against graph.launch() on twin graphs over the same problem (bits of the output and of
every cache, step by step); torch.compile(fullgraph=True) over a step that writes the static
buffers and launches, with no graph break and the same bits; opcheck; errors naming the
argument. CPU (the CPU backend runs the same layer) and GPU (marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kernelflow as kf  # noqa: E402
import kernelflow.torch_ops as kft  # noqa: E402
from test_layer import V3_SMALL, Runner, make_problem, to_numpy, to_torch  # noqa: E402

pytestmark = pytest.mark.needs_torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
STEPS = 3


def problem(seed=0):
    return make_problem(np.random.default_rng(seed), V3_SMALL, "bf16", history=[5, 21],
                        steps=STEPS)


def step_inputs(runner, step):
    """This step's values of the buffers a step writes before launching, as torch tensors."""
    p, device = runner.p, runner.hidden.device
    lens = np.zeros(p.config.max_batch, np.int32)
    lens[: p.batch] = p.seqlens(step)
    pos = np.where(lens > 0, lens - 1, 0).astype(np.int32)
    return to_torch(p.hidden[step], device), to_torch(pos, device), to_torch(lens, device)


def decode_step(graph, hidden, positions, cache_seqlens):
    graph.hidden.copy_(hidden)
    graph.positions.copy_(positions)
    graph.cache_seqlens.copy_(cache_seqlens)
    kft.launch_layer_graph(graph)
    return graph.output.clone()


def launched_step(graph, hidden, positions, cache_seqlens):
    """The same step through DecodeGraph.launch."""
    graph.hidden.copy_(hidden)
    graph.positions.copy_(positions)
    graph.cache_seqlens.copy_(cache_seqlens)
    graph.launch()
    return graph.output.clone()


def same_bits(a, b) -> bool:
    a, b = to_numpy(a), to_numpy(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_steps(fn, device):
    """fn over STEPS steps on one graph against DecodeGraph.launch on a twin graph: output,
    caches and error buffer bit for bit after every step (tests/test_layer.py checks launch
    itself against the float64 layer)."""
    p = problem()
    mine, twin = Runner(p, device), Runner(p, device)
    for step in range(STEPS):
        inputs = step_inputs(mine, step)
        got = fn(mine.graph, *inputs)
        want = launched_step(twin.graph, *inputs)
        assert same_bits(got, want), f"output of step {step}"
        assert float(torch.count_nonzero(want[: p.batch].float())) > 0
        for layer, (a, b) in enumerate(zip(mine.caches, twin.caches)):
            assert same_bits(a, b), f"cache of layer {layer} after step {step}"
        assert mine.errors() == twin.errors() == [0, -1, 0, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_op_matches_launch(device):
    check_steps(decode_step, device)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_same_bits(device):
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    check_steps(torch.compile(decode_step, fullgraph=True, backend=backend), device)


@pytest.mark.parametrize("device", DEVICES)
def test_no_graph_break(device):
    torch._dynamo.reset()
    runner = Runner(problem(), device)
    explanation = torch._dynamo.explain(decode_step)(runner.graph, *step_inputs(runner, 0))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    runner = Runner(problem(), device)
    runner.set_step(0)
    g = runner.graph
    args = (g.id, g.hidden, g.positions, g.cache_seqlens, g.block_table, g.output, g.kv_caches,
            g.error_buffer)
    torch.library.opcheck(torch.ops.kernelflow.launch_layer_graph.default, args)
    # Copies of the buffers (what a compiled graph may hand the op) give the same results.
    copies = tuple(a.clone() if isinstance(a, torch.Tensor) else
                   [c.clone() for c in a] if isinstance(a, list) else a for a in args)
    torch.ops.kernelflow.launch_layer_graph.default(*copies)
    torch.ops.kernelflow.launch_layer_graph.default(*args)
    assert same_bits(copies[5], g.output)


def test_errors_name_the_argument():
    runner = Runner(problem(), "cpu")
    g = runner.graph
    op = torch.ops.kernelflow.launch_layer_graph.default
    args = [g.id, g.hidden, g.positions, g.cache_seqlens, g.block_table, g.output, g.kv_caches,
            g.error_buffer]
    bad = list(args)
    bad[1] = g.hidden[:1]
    with pytest.raises(ValueError, match=r"^hidden: expected the graph's hidden"):
        op(*bad)
    bad = list(args)
    bad[6] = g.kv_caches[:1]
    with pytest.raises(ValueError, match=r"^kv_caches: expected 2 caches"):
        op(*bad)
    bad = list(args)
    bad[7] = None
    with pytest.raises(ValueError, match=r"^error_buffer:"):
        op(*bad)
    with pytest.raises(TypeError, match=r"^graph: expected a kernelflow.DecodeGraph"):
        kft.launch_layer_graph("graph")
    numpy_graph = Runner(problem(), "numpy").graph
    with pytest.raises(TypeError, match=r"^graph: made from numpy arrays"):
        kft.launch_layer_graph(numpy_graph)
    g.close()
    with pytest.raises(ValueError, match=r"^graph: no open DecodeGraph has id"):
        op(*args)
