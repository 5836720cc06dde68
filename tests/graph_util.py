"""CUDA-graph capture for the GPU tests (PyTorch)."""

from __future__ import annotations


def capture_graph(torch, step, warmup=None):
    """Run `warmup` (default: `step`) once on a side stream, outside the capture, as a first
    call that may allocate must be; then capture `step` into a CUDA graph and return it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (warmup or step)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph
