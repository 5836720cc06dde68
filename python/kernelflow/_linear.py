"""The fused decode layer's weight-streaming GEMM as an operation of its own (kf_linear).

    out = kernelflow.linear(x, weight)        # out[m, n] = x[m, k] @ weight[n, k].T

bf16 in and out, fp32 accumulation, for 1..128 rows of x (a decoding step's batch) and k a
multiple of 64, each array's rows contiguous (those of x and weight 16-byte aligned); weight is
a torch.nn.Linear weight (no bias). The weight is read once at close to the memory's read bandwidth, which is
what a projection of a decoding step waits for. A rerun gives the same bits; against a dense
GEMM the result may differ in the last bf16 bit (the order of the fp32 sums).
"""

from __future__ import annotations

from . import _C
from . import _frameworks as fw
from ._errors import call

def linear_workspace_size(m: int, n: int, k: int) -> int:
    """Bytes of workspace linear needs for x [m, k] and weight [n, k] (0: none)."""
    return call(_C.linear_workspace_size, m, n, k)


def new_linear_workspace(x, weight):
    """A zero-filled workspace for linear(x, weight, ...) on x's device, in x's framework, or
    None when the sizes need none. Every call leaves it zero again, so one workspace serves
    every call of those sizes (or smaller) in turn; calls that may run concurrently (other
    streams) need one each."""
    home = fw.framework(x, "x")
    fw.check_home(x, home, "x")
    m, k, n = sizes(x, weight)
    nbytes = linear_workspace_size(m, n, k)
    return fw.zeros_bytes(x, home, nbytes) if nbytes else None


def sizes(x, weight) -> tuple[int, int, int]:
    """(m, k, n) of x [m, k] and weight [n, k]; ValueError naming the array of another rank."""
    if len(x.shape) != 2:
        raise ValueError(f"x: expected shape [m, k], got {tuple(x.shape)}")
    if len(weight.shape) != 2:
        raise ValueError(f"weight: expected shape [n, k], got {tuple(weight.shape)}")
    return x.shape[0], x.shape[1], weight.shape[0]  # as given: symbolic under torch.compile


def linear(x, weight, out=None, workspace=None, stream=None):
    """out[m, n] = x[m, k] weight[n, k]^T (bfloat16). out, when given, is written in place;
    otherwise a new array is made in x's framework. workspace: from new_linear_workspace, or
    None to have a zero-filled one made for this call (the sizes that need one: more than 32
    rows or k above 2048, when the GEMM splits k). stream: a CUDA stream handle, or None for
    the current stream. Returns out."""
    home = fw.framework(x, "x")
    fw.framework(weight, "weight")
    m, k, n = sizes(x, weight)
    if out is None:
        fw.check_home(x, home, "x")
        out = fw.empty(x, home, (m, n))
    else:
        fw.framework(out, "out")
        fw.check_writable(out, "out")
    if workspace is None:
        try:
            nbytes = linear_workspace_size(m, n, k)
        except ValueError:
            nbytes = 0  # sizes the call below rejects, naming the array they came from
        if nbytes:
            fw.check_home(x, home, "x")
            workspace = fw.zeros_bytes(x, home, nbytes)
    else:
        fw.framework(workspace, "workspace")
    call(_C.linear, fw.export(x), fw.export(weight), fw.export(out, home),
         None if workspace is None else fw.export(workspace, home),
         fw.stream_handle(stream, x, home))
    return fw.to_home(out, home)
