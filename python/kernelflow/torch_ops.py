"""The library's operations as PyTorch custom ops (namespace ``kernelflow``), traceable by
torch.compile without graph breaks and capturable in CUDA graphs.

    import kernelflow.torch_ops as kft
    metadata = kft.get_mla_metadata(cache_seqlens, num_heads_q=16, s_q=1)
    kft.cache_append(kv, kv_cache, slot_mapping)
    out, lse = kft.mla_decode(q, kv_cache, block_table, cache_seqlens, metadata,
                              softmax_scale=0.114721)

    kft.launch_layer_graph(graph)   # a kernelflow.DecodeGraph made from torch tensors
    y = kft.linear(x, weight)       # x @ weight.T, the layer's weight-streaming GEMM

The same ops are reachable as torch.ops.kernelflow.<name>. Each one is defined through
torch.library with a schema that names what it mutates (cache_append writes kv_cache;
mla_decode_out writes out and lse; a workspace passed to a decode is scratch it writes, as is
linear's, which it leaves zero;
launch_layer_graph writes the graph's output, caches and error buffer) and a fake implementation
that gives the exact output shapes and dtypes without touching data, so torch.compile traces
through them. The CPU and CUDA implementations are registered with the dispatcher directly and
call the framework-agnostic API of kernelflow.mla on the current torch stream, which is the
capture stream inside a CUDA graph: an eager call costs the dispatcher and the library's own
path, nothing more (docs/frameworks/pytorch.md, "Host overhead").

Importing this module imports torch; `import kernelflow` does not.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch
from torch import Tensor

from . import _C
from . import _frameworks as _fw
from . import _linear
from . import layer as _layer
from . import mla as _mla
from ._workspace_cache import WORKSPACE_ALIGN as _WORKSPACE_ALIGN
from ._workspace_cache import WORKSPACES as _WORKSPACES

__all__ = [
    "cache_append",
    "convert_cache",
    "get_mla_metadata",
    "launch_layer_graph",
    "linear",
    "mla_decode",
    "mla_decode_out",
    "release_workspaces",
]

_EIGHT_BIT = ("fp8_e4m3", "int8")
_LIB = torch.library.Library("kernelflow", "FRAGMENT")


# The frame-evaluation callback torch.compile installs while it may trace (None otherwise).
# Without this accessor every call takes the disabled path below.
_eval_frame_callback = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
_eval_frame_callback = getattr(_eval_frame_callback, "get_eval_frame_callback", lambda: True)


def _untraced(kernel):
    """kernel, run with torch.compile's frame evaluation off (as torch.library.custom_op does),
    so an eager call made while torch.compile is active never traces into the library's Python.
    When no frame-evaluation callback is installed (plain eager code) there is nothing to turn
    off, and the call skips the disabling wrapper's cost."""
    disabled = torch.compiler.disable(kernel, recursive=True)

    def run(*args):
        if _eval_frame_callback() is None:
            return kernel(*args)
        return disabled(*args)

    return run


# What the eager fast path below asks of torch; without an accessor the path is never taken.
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_function_modes = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: True)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
_profiling = getattr(torch.autograd, "_profiler_enabled", lambda: True)


def _dispatch_free(*tensors) -> bool:
    """Whether an eager call of an op on these arguments (None entries skipped) may run the op's
    implementation directly instead of through the dispatcher: nothing the dispatcher serves
    could see the call (no dispatch or function mode such as a fake-tensor mode, no functorch
    transform, no profiler, no torch.compile frame callback), every tensor is a plain
    torch.Tensor, and autograd has nothing to record (grad mode off, or no tensor requires
    grad). The implementation is then the very function the dispatcher would call, with the
    same checks, results and version-counter bumps, without the dispatcher's trip through C++
    and back (docs/frameworks/pytorch.md, "Host overhead")."""
    if (_dispatch_modes() or _function_modes() or _functorch_active() or _profiling()
            or _eval_frame_callback() is not None):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not Tensor or (grad and t.requires_grad)):
            return False
    return True


def _define(schema: str, kernel, fake):
    """kernelflow::<name> with this schema: `kernel` its CPU and CUDA implementation (run
    untraced), `fake` its fake one; returns the op's overload."""
    name = schema.partition("(")[0]
    _LIB.define(schema)
    kernel = _untraced(kernel)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, kernel, key)
    torch.library.register_fake(f"kernelflow::{name}", fake, lib=_LIB)
    return getattr(torch.ops.kernelflow, name).default


_increment_version = torch.autograd.graph.increment_version


def _written(*tensors) -> None:
    """Tell autograd that the op wrote these tensors (their version counters), as PyTorch's own
    in-place ops do; None entries are skipped."""
    _increment_version(tuple([t for t in tensors if t is not None]))


def _num_workers(cache_seqlens: Tensor, num_heads_q: int, s_q: int,
                 num_workers: Optional[int], kv_format: str) -> int:
    """num_workers, or the library's default for cache_seqlens' device when None: what the real
    implementation (kernelflow.get_mla_metadata) uses too, so the traced metadata length is the
    one the library writes."""
    if num_workers is not None:
        return num_workers
    return _mla.default_num_workers(cache_seqlens.device, num_heads_q, s_q, kv_format,
                                    batch=int(cache_seqlens.shape[0]))


def _metadata_len(batch, num_workers: int):
    """metadata_size(batch, num_workers) for a batch that may be symbolic: the size is the
    header, num_workers worker records and batch + 1 offsets, linear in batch with slope 1."""
    return _mla.metadata_size(1, num_workers) + (batch - 1)


def _check_q(q: Tensor) -> None:
    if q.dim() != 4 or q.shape[3] != _C.HEAD_DIM:
        raise ValueError(f"q: expected shape [b, s_q, h_q, {_C.HEAD_DIM}], got {tuple(q.shape)}")


# --- metadata -----------------------------------------------------------------------------------

def _metadata_kernel(cache_seqlens, num_heads_q, s_q, num_workers, kv_format):
    return _mla.get_mla_metadata(cache_seqlens, num_heads_q, s_q, num_workers=num_workers,
                                 kv_format=kv_format)


def _metadata_fake(cache_seqlens, num_heads_q, s_q, num_workers, kv_format):
    if cache_seqlens.dim() != 1:
        raise ValueError(
            f"cache_seqlens: expected shape [batch], got {tuple(cache_seqlens.shape)}"
        )
    workers = _num_workers(cache_seqlens, num_heads_q, s_q, num_workers, kv_format)
    size = _metadata_len(cache_seqlens.shape[0], workers)
    return cache_seqlens.new_empty((size,), dtype=torch.int32)


_METADATA = _define(
    "get_mla_metadata(Tensor cache_seqlens, SymInt num_heads_q, SymInt s_q, SymInt? num_workers, "
    "str kv_format) -> Tensor", _metadata_kernel, _metadata_fake)


def get_mla_metadata(cache_seqlens: Tensor, num_heads_q: int, s_q: int = 1,
                     num_workers: Optional[int] = None, kv_format: str = "bf16") -> Tensor:
    """kernelflow.get_mla_metadata as a custom op: int32 [metadata_size(b, num_workers)] on
    cache_seqlens' device; num_workers defaults to the library's default for that device and batch.
    An eager call runs the op's implementation directly when _dispatch_free allows."""
    if not torch.compiler.is_compiling() and _dispatch_free(cache_seqlens):
        return _metadata_kernel(cache_seqlens, num_heads_q, s_q, num_workers, kv_format)
    return _METADATA(cache_seqlens, num_heads_q, s_q, num_workers, kv_format)


# --- decode -------------------------------------------------------------------------------------

# A decode given no workspace takes the buffer kept for the current stream (kernelflow.mla's
# rule) only inside an eager call of mla_decode or mla_decode_out below. Otherwise the decode
# kernels name the current stream (kernelflow.mla_decode's stream=), which makes the decode
# allocate a workspace of its own: the kernels also run inside compiled graphs, and CUDA graph
# trees (mode="reduce-overhead") run a graph's first calls with every allocation routed to the
# graph's private memory pool, whose blocks the trees hand out again; a kept buffer must not come
# from there.


class _EagerCall(threading.local):
    """Whether this thread is inside an eager call of mla_decode or mla_decode_out below."""

    active = False


_EAGER = _EagerCall()


def _eagerly(op, args):
    """op(*args) with _EAGER.active set for the call."""
    _EAGER.active = True
    try:
        return op(*args)
    finally:
        _EAGER.active = False


def _decode_stream(q: Tensor):
    """The stream= of a decode kernel's call: None (the current stream, the kept workspace)
    inside an eager call; the current stream named, so that no kept workspace is used, else."""
    return None if _EAGER.active else _fw.stream_handle(None, q, _fw.TORCH)


def _scratch(workspace):
    """The workspace to decode with. It is scratch: where a compiled graph hands in a copy of
    the caller's (functionalization clones mutated inputs) that lost the C API's 256-byte
    alignment, the decode allocates an aligned one instead."""
    if workspace is not None and workspace.data_ptr() % _WORKSPACE_ALIGN:
        return None
    return workspace


def _decode_shapes(q: Tensor):
    _check_q(q)
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    return (b, s_q, h_q, _C.LATENT_DIM), (b, h_q, s_q)


def _decode_kernel(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale, kv_format,
                   workspace):
    try:
        result = _mla.mla_decode(q, kv_cache, block_table, cache_seqlens, metadata,
                                 softmax_scale, kv_format=kv_format, workspace=_scratch(workspace),
                                 stream=_decode_stream(q))
    except ValueError:
        _check_q(q)  # a q of the wrong layout gets the fake implementation's message
        raise
    if workspace is not None:
        _written(workspace)
    return result


def _decode_fake(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale, kv_format,
                 workspace):
    out_shape, lse_shape = _decode_shapes(q)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


_DECODE = _define(
    "mla_decode(Tensor q, Tensor kv_cache, Tensor block_table, Tensor cache_seqlens, "
    "Tensor metadata, float softmax_scale, str? kv_format, Tensor(a!)? workspace) "
    "-> (Tensor, Tensor)", _decode_kernel, _decode_fake)


def _decode_out_kernel(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale,
                       kv_format, workspace, out, lse):
    try:
        _mla.mla_decode(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale,
                        kv_format=kv_format, out=out, lse=lse, workspace=_scratch(workspace),
                        stream=_decode_stream(q))
    except ValueError:
        _check_q(q)  # a q of the wrong layout gets the fake implementation's message
        raise
    _written(out, lse, workspace)


def _decode_out_fake(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale,
                     kv_format, workspace, out, lse):
    out_shape, lse_shape = _decode_shapes(q)
    for arr, name, shape, dtype in ((out, "out", out_shape, q.dtype),
                                    (lse, "lse", lse_shape, torch.float32)):
        if tuple(arr.shape) != shape or arr.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype} {list(shape)}, got {arr.dtype} "
                             f"{list(arr.shape)}")


_DECODE_OUT = _define(
    "mla_decode_out(Tensor q, Tensor kv_cache, Tensor block_table, Tensor cache_seqlens, "
    "Tensor metadata, float softmax_scale, str? kv_format, Tensor(a!)? workspace, "
    "Tensor(b!) out, Tensor(c!) lse) -> ()", _decode_out_kernel, _decode_out_fake)


def mla_decode(q: Tensor, kv_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
               metadata: Tensor, softmax_scale: float, kv_format: Optional[str] = None,
               workspace: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """kernelflow.mla_decode as a custom op: returns new (out [b, s_q, h_q, 512] in q's dtype,
    lse float32 [b, h_q, s_q]). Without a workspace (uint8, kernelflow.new_workspace) an eager
    call uses the one kept for the current stream (release_workspaces), and a compiled one, or
    one inside a CUDA graph capture, allocates its own. An eager call runs the op's
    implementation directly when _dispatch_free allows."""
    args = (q, kv_cache, block_table, cache_seqlens, metadata, float(softmax_scale), kv_format,
            workspace)
    if torch.compiler.is_compiling():
        return _DECODE(*args)
    op = _decode_kernel if _dispatch_free(q, kv_cache, block_table, cache_seqlens, metadata,
                                          workspace) else _DECODE
    return op(*args) if workspace is not None else _eagerly(op, args)


def mla_decode_out(q: Tensor, kv_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                   metadata: Tensor, softmax_scale: float, out: Tensor, lse: Tensor,
                   kv_format: Optional[str] = None,
                   workspace: Optional[Tensor] = None) -> None:
    """kernelflow.mla_decode writing into the given out and lse (an eager call runs the op's
    implementation directly when _dispatch_free allows)."""
    args = (q, kv_cache, block_table, cache_seqlens, metadata, float(softmax_scale), kv_format,
            workspace, out, lse)
    if torch.compiler.is_compiling():
        _DECODE_OUT(*args)
        return
    op = _decode_out_kernel if _dispatch_free(q, kv_cache, block_table, cache_seqlens, metadata,
                                              workspace, out, lse) else _DECODE_OUT
    if workspace is not None:
        op(*args)
    else:
        _eagerly(op, args)


def release_workspaces() -> None:
    """Drop the decode workspaces kept for torch tensors: an eager decode given no workspace
    (kernelflow.mla_decode, mla_decode and mla_decode_out here, kernelflow.flash_mla) reuses one
    buffer per device, stream and thread, grown to the largest size asked for. Their memory goes
    back to torch's caching allocator; the next such decode allocates again."""
    _WORKSPACES.release()


# --- cache --------------------------------------------------------------------------------------

def _append_kernel(kv, kv_cache, slot_mapping, kv_format):
    _mla.cache_append(kv, kv_cache, slot_mapping, kv_format=kv_format)
    _written(kv_cache)


def _append_fake(kv, kv_cache, slot_mapping, kv_format):
    if kv.dim() != 2 or kv.shape[1] != _C.HEAD_DIM:
        raise ValueError(f"kv: expected shape [n, {_C.HEAD_DIM}], got {tuple(kv.shape)}")


_APPEND = _define(
    "cache_append(Tensor kv, Tensor(a!) kv_cache, Tensor slot_mapping, str? kv_format) -> ()",
    _append_kernel, _append_fake)


def cache_append(kv: Tensor, kv_cache: Tensor, slot_mapping: Tensor,
                 kv_format: Optional[str] = None) -> None:
    """kernelflow.cache_append as a custom op: writes rows kv[n, 576] into kv_cache in place at
    slot_mapping (int64; negative skips)."""
    _APPEND(kv, kv_cache, slot_mapping, kv_format)


def _converted_shape(src: Tensor, kv_format: str):
    if kv_format not in _EIGHT_BIT:
        raise ValueError(f"kv_format: expected 'fp8_e4m3' or 'int8', got {kv_format!r}")
    if src.dim() not in (3, 4):
        raise ValueError(
            f"src: expected shape [num_pages, page_size, 576] (or [.., 1, 576]), got "
            f"{tuple(src.shape)}"
        )
    return (src.shape[0], src.shape[1], _C.BYTES_PER_TOKEN_8BIT)


def _convert_kernel(src, kv_format):
    dst = src.new_empty(_converted_shape(src, kv_format), dtype=torch.uint8)
    _mla.convert_cache(src, dst, kv_format=kv_format)
    return dst


def _convert_fake(src, kv_format):
    return src.new_empty(_converted_shape(src, kv_format), dtype=torch.uint8)


_CONVERT = _define("convert_cache(Tensor src, str kv_format) -> Tensor", _convert_kernel,
                   _convert_fake)


def convert_cache(src: Tensor, kv_format: str = "fp8_e4m3") -> Tensor:
    """kernelflow.convert_cache as a custom op: a new uint8 [num_pages, page_size, 644] cache."""
    return _CONVERT(src, kv_format)


# --- the skinny GEMM ---------------------------------------------------------------------------

def _linear_shape(x: Tensor, weight: Tensor):
    m, _, n = _linear.sizes(x, weight)
    return (m, n)


def _linear_kernel(x, weight, workspace):
    out = x.new_empty(_linear_shape(x, weight))
    # A misaligned copy of the caller's workspace (see _scratch): a fresh zero-filled one.
    _linear.linear(x, weight, out=out, workspace=_scratch(workspace))
    _written(workspace)
    return out


def _linear_fake(x, weight, workspace):
    return x.new_empty(_linear_shape(x, weight))


_LINEAR = _define("linear(Tensor x, Tensor weight, Tensor(a!)? workspace) -> Tensor",
                  _linear_kernel, _linear_fake)


def linear(x: Tensor, weight: Tensor, workspace: Optional[Tensor] = None) -> Tensor:
    """kernelflow.linear as a custom op: x [m, k] @ weight[n, k].T, bf16, into a new tensor.
    workspace: kernelflow.new_linear_workspace(x, weight) (zero-filled; every call leaves it
    zero), or None for a fresh zero-filled one per call where the sizes need one."""
    return _LINEAR(x, weight, workspace)


# --- the layer graph ----------------------------------------------------------------------------

# The buffers a launch reads that change between steps, and those it writes, in the op's order.
_LAYER_READS = ("hidden", "positions", "cache_seqlens", "block_table")


def _same_memory(a: Tensor, b: Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def _check_like(given: Tensor, own, name: str) -> None:
    """`given` must have the shape, dtype and device of the graph's buffer `own`."""
    if (tuple(given.shape) != tuple(own.shape) or given.dtype != own.dtype
            or given.device != own.device):
        raise ValueError(f"{name}: expected the graph's {name} ({own.dtype} {list(own.shape)} on "
                         f"{own.device}), got {given.dtype} {list(given.shape)} on {given.device}")


def _layer_pairs(graph, hidden, positions, cache_seqlens, block_table, output, kv_caches,
                 error_buffer):
    """(tensor given to the op, the graph's own buffer, name) for every buffer of the launch:
    first those it reads, then those it writes (the caches are both)."""
    if len(kv_caches) != len(graph.kv_caches):
        raise ValueError(f"kv_caches: expected {len(graph.kv_caches)} caches (one per layer), got "
                         f"{len(kv_caches)}")
    if (error_buffer is None) != (graph.error_buffer is None):
        raise ValueError("error_buffer: expected the graph's error buffer"
                         + (" (it has none)" if graph.error_buffer is None else ", got None"))
    reads = [(t, getattr(graph, name), name) for t, name in
             zip((hidden, positions, cache_seqlens, block_table), _LAYER_READS)]
    caches = [(t, own, f"kv_caches[{i}]") for i, (t, own) in
              enumerate(zip(kv_caches, graph.kv_caches))]
    writes = [(output, graph.output, "output")]
    if error_buffer is not None:
        writes.append((error_buffer, graph.error_buffer, "error_buffer"))
    for given, own, name in reads + caches + writes:
        _check_like(given, own, name)
    return reads + caches, caches + writes


def _launch_layer_kernel(graph, hidden, positions, cache_seqlens, block_table, output, kv_caches,
                         error_buffer):
    """DecodeGraph.launch on the current stream. The graph reads and writes its own buffers; a
    compiled graph may hand the op copies of them (functionalization clones what an op
    mutates), so a copy is loaded into the graph's buffer before the launch and the results
    copied back to it after."""
    decode_graph = _layer.graph_by_id(graph)
    read, written = _layer_pairs(decode_graph, hidden, positions, cache_seqlens, block_table,
                                 output, kv_caches, error_buffer)
    for given, own, _ in read:
        if not _same_memory(given, own):
            own.copy_(given)
    decode_graph.launch()
    for given, own, _ in written:
        if not _same_memory(given, own):
            given.copy_(own)
    _written(output, error_buffer, *kv_caches)


def _launch_layer_fake(graph, hidden, positions, cache_seqlens, block_table, output, kv_caches,
                       error_buffer):
    _layer_pairs(_layer.graph_by_id(graph), hidden, positions, cache_seqlens, block_table,
                 output, kv_caches, error_buffer)


_LAUNCH_LAYER = _define(
    "launch_layer_graph(int graph, Tensor hidden, Tensor positions, Tensor cache_seqlens, "
    "Tensor block_table, Tensor(a!) output, Tensor(b!)[] kv_caches, Tensor(c!)? error_buffer) "
    "-> ()", _launch_layer_kernel, _launch_layer_fake)


def launch_layer_graph(graph: _layer.DecodeGraph) -> None:
    """graph.launch() as a custom op, on the current stream: one decoding step of every layer of
    a kernelflow.DecodeGraph made from torch tensors. The op reads the graph's hidden,
    positions, cache_seqlens and block_table and writes its output, kv_caches and error_buffer,
    so a compiled step orders it after the writes to its inputs and before the reads of its
    results. The weights and the cos/sin table are read as they are when it runs."""
    if not isinstance(graph, _layer.DecodeGraph):
        raise TypeError(f"graph: expected a kernelflow.DecodeGraph, got {type(graph).__name__}")
    if not isinstance(graph.hidden, Tensor):
        raise TypeError(f"graph: made from {type(graph.hidden).__module__} arrays; the torch op "
                        "needs one made from torch tensors")
    _LAUNCH_LAYER(graph.id, graph.hidden, graph.positions, graph.cache_seqlens,
                  graph.block_table, graph.output, graph.kv_caches, graph.error_buffer)
