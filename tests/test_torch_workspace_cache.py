"""The workspace kept by the torch path of kernelflow.mla for decodes with their outputs allocated
(python/kernelflow/_workspace_cache.py): one buffer per (device, stream, thread), reused by the
plain API and the torch ops, grown when a larger decode needs it, never used or kept inside a
CUDA graph capture, bounded in number. Every decode that uses a kept buffer gives the bits of a
decode with a workspace of its own, and the reference's values."""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kernelflow as kf  # noqa: E402
import kernelflow.torch_ops as kft  # noqa: E402
from kernelflow import _workspace_cache, mla  # noqa: E402
from graph_util import capture_graph  # noqa: E402
from inputs import check_decode, make_case  # noqa: E402
from test_torch_ops import bits_equal  # noqa: E402

pytestmark = pytest.mark.needs_torch

H_Q, S_Q, PAGE = 16, 1, 16
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
CACHE = _workspace_cache.WORKSPACES


class Decode:
    """A case's tensors on a device, its metadata, and decodes of it."""

    def __init__(self, rng, device, seqlens):
        self.case = make_case(rng, seqlens, H_Q, S_Q, PAGE, np.float16)
        self.q, self.cache, self.bt, self.sl = (
            torch.from_numpy(np.ascontiguousarray(a)).to(device)
            for a in (self.case.q, self.case.cache, self.case.block_table, self.case.seqlens))
        self.meta = kf.get_mla_metadata(self.sl, H_Q, S_Q)

    def args(self):
        return self.q, self.cache, self.bt, self.sl, self.meta, self.case.scale

    def allocated(self, **kw):
        return kf.mla_decode(*self.args(), **kw)

    def with_own_workspace(self):
        return kf.mla_decode(*self.args(), workspace=kf.new_workspace(self.q, self.meta))

    def check(self, out, lse, what):
        """The reference's values, and the bits of a decode with a workspace of its own."""
        want_out, want_lse = self.with_own_workspace()
        assert bits_equal(out, want_out) and bits_equal(lse, want_lse), what
        check_decode(self.case, out.float().cpu().numpy(), lse.cpu().numpy(), what)


@pytest.fixture
def used(monkeypatch):
    """The workspaces the torch path of kernelflow.mla takes for decodes given none, in call
    order; the cache starts empty and is emptied again after the test."""
    seen = []

    def spy(pick):
        def picked(*args):
            seen.append(pick(*args))
            return seen[-1]
        return picked

    monkeypatch.setattr(mla, "_scratch_workspace", spy(mla._scratch_workspace))
    CACHE.release()
    yield seen
    CACHE.release()


def kept():
    """The cache's buffers by key."""
    return {key: tensor for key, (_, tensor) in CACHE._buffers.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_allocated_decodes_share_one_workspace(rng, device, used):
    d = Decode(rng, device, [5, 37])
    first = d.allocated()
    d.check(*first, "first call")
    second = kft.mla_decode(*d.args())  # the torch op, called eagerly
    d.check(*second, "the torch op")
    third = d.allocated()
    assert len(used) == 3 and used[0] is used[1] is used[2] is not None
    assert len(CACHE) == 1 and next(iter(kept().values())) is used[0]
    assert bits_equal(first[0], third[0]) and bits_equal(first[1], third[1])
    assert used[0].data_ptr() % 256 == 0
    assert used[0].numel() >= kf.workspace_size(2, H_Q, S_Q, mla._num_workers_of(d.meta, 2))
    kft.release_workspaces()
    assert len(CACHE) == 0
    d.check(*d.allocated(), "after release_workspaces")
    assert len(CACHE) == 1 and next(iter(kept().values())) is used[-1]


@pytest.mark.parametrize("device", DEVICES)
def test_the_workspace_grows_for_a_larger_decode(rng, device, used):
    small, large = Decode(rng, device, [9]), Decode(rng, device, [9, 70, 33, 4])
    need = [kf.workspace_size(len(d.case.seqlens), H_Q, S_Q, mla._num_workers_of(d.meta, len(
        d.case.seqlens))) for d in (small, large)]
    assert need[1] > need[0]
    small.check(*small.allocated(), "small")
    large.check(*large.allocated(), "large, after small")
    small.check(*small.allocated(), "small, after large")
    assert used[1] is not used[0] and used[2] is used[1]
    assert len(CACHE) == 1 and used[1].numel() >= need[1]


@pytest.mark.parametrize("device", DEVICES)
def test_one_workspace_per_thread(rng, device, used):
    d = Decode(rng, device, [5, 37])
    here = d.allocated()
    there = []
    worker = threading.Thread(target=lambda: there.append(d.allocated()))
    worker.start()
    worker.join()
    assert len(there) == 1 and len(CACHE) == 2
    assert used[0].data_ptr() != used[1].data_ptr()
    for got, what in ((here, "this thread"), (there[0], "another thread")):
        d.check(*got, what)


def test_threads_at_once(rng, used):
    """Threads decoding at the same time, each with two shapes in turn (its buffer grows, and
    more threads than MAX_BUFFERS drop each other's), all give the bits of decodes with
    workspaces of their own."""
    shapes = [Decode(rng, "cpu", [9]), Decode(rng, "cpu", [9, 70, 33, 4])]
    want = [d.with_own_workspace() for d in shapes]
    wrong = []

    def decode_in_turn():
        for i in range(12):
            got = shapes[i % 2].allocated()
            if not all(bits_equal(g, w) for g, w in zip(got, want[i % 2])):
                wrong.append(i)

    workers = [threading.Thread(target=decode_in_turn)
               for _ in range(_workspace_cache.MAX_BUFFERS + 2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not wrong and len(used) == 12 * len(workers)
    assert len(CACHE) <= _workspace_cache.MAX_BUFFERS


def test_an_explicit_stream_keeps_nothing(rng, used):
    d = Decode(rng, "cpu", [5, 37])
    d.check(*d.allocated(stream=0), "stream=0")
    assert len(used) == 1 and used[0] is not None and len(CACHE) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_the_op_itself_keeps_nothing(rng, device, used):
    """Called through torch.ops.kernelflow (as a compiled graph calls it) and compiled, the op
    allocates its own workspace; only the eager Python functions take the kept one."""
    d = Decode(rng, device, [5, 37])
    ops = torch.ops.kernelflow
    d.check(*ops.mla_decode(*d.args(), None, None), "torch.ops.kernelflow.mla_decode")
    out = torch.empty((2, S_Q, H_Q, 512), dtype=d.q.dtype, device=device)
    lse = torch.empty((2, H_Q, S_Q), dtype=torch.float32, device=device)
    ops.mla_decode_out(*d.args(), None, None, out, lse)
    d.check(out, lse, "torch.ops.kernelflow.mla_decode_out")
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: kft.mla_decode(*a), fullgraph=True, backend="aot_eager")
    for _ in range(2):
        d.check(*compiled(*d.args()), "compiled")
    assert len(CACHE) == 0 and all(w is not None for w in used)
    kft.mla_decode_out(*d.args(), out, lse)
    d.check(out, lse, "kft.mla_decode_out")
    assert len(CACHE) == 1 and next(iter(kept().values())) is used[-1]


def test_bounded_and_released():
    """At most MAX_BUFFERS keys, the oldest dropped first; release() drops them all. The keys
    here differ by stream handle (CPU tensors: nothing is launched)."""
    cache = _workspace_cache.WorkspaceCache()
    like = torch.empty(4)
    limit = _workspace_cache.MAX_BUFFERS

    def streams():
        return [stream for _, stream, _ in cache._buffers]

    first = [cache.get(like, stream, 1000) for stream in range(limit)]
    assert streams() == list(range(limit)) and len({t.data_ptr() for t in first}) == limit
    assert all(cache.get(like, stream, 600) is first[stream] for stream in range(limit))
    assert cache.get(like, limit, 1000).numel() == 1000
    assert streams() == list(range(1, limit + 1))  # stream 0's buffer went first
    assert cache.get(like, 0, 1000) is not first[0]
    assert streams() == list(range(2, limit + 1)) + [0]
    assert cache.get(like, 2, 1500).numel() == 1500  # grown: now the newest entry
    assert streams() == list(range(3, limit + 1)) + [0, 2] and len(cache) == limit
    assert cache.get(like, 7, 0) is None
    cache.release()
    assert len(cache) == 0


@pytest.mark.gpu
def test_a_capture_neither_uses_nor_keeps_a_buffer(rng, used):
    """Inside torch.cuda.graph the workspace comes from the capture's pool: no kept buffer is
    baked into the graph, and the cache holds the same buffers after the capture as before.
    Replays give the eager bits, also after eager decodes that used the kept buffers."""
    d = Decode(rng, "cuda", [5, 37])
    want = d.allocated()  # keeps a buffer for the current stream
    results = []
    graph = capture_graph(torch, lambda: results.append(d.allocated()))
    before = kept()
    assert len(before) == 2  # the current stream's and the warm-up's side stream's
    captured = used[-1]
    assert captured is not None
    assert all(captured.data_ptr() != t.data_ptr() for t in before.values())
    for _ in range(2):
        graph.replay()
        again = d.allocated()
        torch.cuda.synchronize()
        out, lse = results[-1]
        assert bits_equal(out, want[0]) and bits_equal(lse, want[1])
        assert bits_equal(again[0], want[0]) and bits_equal(again[1], want[1])
    after = kept()
    assert after.keys() == before.keys()
    assert all(after[key] is before[key] for key in before)


@pytest.mark.gpu
def test_one_workspace_per_stream(rng, used):
    d = Decode(rng, "cuda", [5, 37])
    want = d.allocated()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        there = d.allocated()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert len(CACHE) == 2 and used[0].data_ptr() != used[1].data_ptr()
    d.check(*want, "current stream")
    d.check(*there, "side stream")
