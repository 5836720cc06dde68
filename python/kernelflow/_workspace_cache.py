"""Decode workspaces the torch path of kernelflow.mla keeps between calls, so that a decode with
its outputs allocated makes two allocations (out, lse) instead of three.

The workspace is scratch: a decode writes its partial results there and its combine reads them
back, and nothing of it is needed after the call. One buffer is kept per (device, stream, thread)
and reused by every decode with that key; it grows to the largest size asked for (the C API
takes a workspace of at least the size it needs). The rule that makes the reuse safe:

- work on one key is ordered. On a GPU the stream runs the kernels of one decode before those of
  the next; one thread issues all the kernels of a call before its next call (the binding lets
  go of the GIL while it launches, so two threads on one stream could interleave theirs: each
  thread has its own buffer). On the CPU a decode finishes inside the call.
- a buffer is allocated on its key's stream and used there only, so the caching allocator's
  stream-ordered reuse covers it when it is replaced by a larger one or dropped.
- inside a CUDA graph capture nothing is cached: a buffer from outside the capture would be
  baked into the graph, whose replays run on whatever stream is current then, concurrently with
  eager calls that use the same buffer. A capturing call allocates its workspace from the
  capture's memory pool (as any torch op does there) and that buffer is never kept. The same
  holds when the tensors are on another device than the current one, whose capture state the
  check cannot see.
- only eager calls ask for a kept buffer: kernelflow.mla_decode on the current stream and the
  Python functions of kernelflow.torch_ops outside torch.compile. The ops' implementations,
  which compiled graphs call, allocate their own (torch_ops says why).
- a buffer made by a dispatch mode (a fake tensor) is used once and never kept.

At most MAX_BUFFERS buffers are kept (the oldest key is dropped first); release() drops them all.
"""

from __future__ import annotations

import sys
import threading
from _thread import get_ident

from . import _frameworks as fw

WORKSPACE_ALIGN = 256  # bytes: the C API's workspace rule
MAX_BUFFERS = 8


class WorkspaceCache:
    """Workspaces by (device, stream, thread): see the module's docstring for the rule."""

    def __init__(self):
        self._buffers: dict = {}  # key -> (capacity in bytes, uint8 tensor)
        self._cuda_state = None  # (is the current stream capturing, current device), once needed
        self._changing = threading.Lock()  # for changes only: a lookup is one dict read

    def get(self, like, stream: int, nbytes: int):
        """A workspace of at least nbytes for a decode of `like` (a torch tensor) on `stream`;
        None for 0 bytes."""
        if not nbytes:
            return None
        if like.is_cuda and not self._may_keep(like):
            return _fresh(like, nbytes)
        key = (like.get_device(), stream, get_ident())
        kept = self._buffers.get(key)
        if kept is not None and kept[0] >= nbytes:
            return kept[1]
        workspace = _fresh(like, nbytes)
        if type(workspace) is type(like):  # not a tensor a dispatch mode made (a fake one)
            self._keep(key, nbytes, workspace)
        return workspace

    @staticmethod
    def fresh(like, nbytes: int):
        """A new workspace of nbytes, never kept; None for 0 bytes."""
        return _fresh(like, nbytes) if nbytes else None

    def release(self) -> None:
        with self._changing:
            self._buffers.clear()

    def __len__(self) -> int:
        return len(self._buffers)

    def _may_keep(self, like) -> bool:
        """Whether a CUDA tensor's decode may use a kept buffer: no capture is underway on the
        current stream, and the tensor is on the current device (whose stream that is)."""
        if self._cuda_state is None:
            torch = sys.modules["torch"]
            current = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
            self._cuda_state = (torch.cuda.is_current_stream_capturing, current)
        capturing, current_device = self._cuda_state
        return not capturing() and like.get_device() == current_device()

    def _keep(self, key, nbytes: int, workspace) -> None:
        with self._changing:
            buffers = self._buffers
            buffers.pop(key, None)  # a larger buffer replaces the key's, as its newest entry
            while len(buffers) >= MAX_BUFFERS:
                del buffers[next(iter(buffers))]
            buffers[key] = (nbytes, workspace)


def _fresh(like, nbytes: int):
    """uint8[nbytes] on like's device, 256-byte aligned (torch's CUDA allocator always is; a CPU
    allocation may need the slack of fw.empty_bytes). A factory call, not like.new_empty: what
    wraps `like` (a functorch transform) does not wrap the buffer."""
    torch = sys.modules["torch"]
    workspace = torch.empty((nbytes,), dtype=torch.uint8, device=like.device)
    if workspace.data_ptr() % WORKSPACE_ALIGN:
        workspace = fw.empty_bytes(like, fw.TORCH, nbytes, WORKSPACE_ALIGN)
    return workspace


# The process's cache: kernelflow.mla's torch path takes its workspaces from it.
WORKSPACES = WorkspaceCache()
