"""MLA decode: metadata, decode and cache append over any framework's arrays.

Arrays come from NumPy, PyTorch, CuPy or JAX (CPU) and reach the C API through DLPack without a
copy. Results are allocated in the framework of the first tensor argument (JAX callers get JAX
arrays back, computed through NumPy). Shapes are those of include/kernelflow/kernelflow.h:

    q              [b, s_q, h_q, 576]  bfloat16 or float16
    kv_cache       [num_pages, page_size, 576] (or [.., 1, 576]) of q's dtype, or uint8
                   [num_pages, page_size, 644] for the 8-bit formats
    block_table    int32 [b, max_pages_per_seq]
    cache_seqlens  int32 [b]
    out            [b, s_q, h_q, 512] of q's dtype;  lse float32 [b, h_q, s_q]
"""

from __future__ import annotations

import functools
import numbers
import operator

import numpy as np

from . import _C
from . import _frameworks as fw
from ._errors import call
from ._workspace_cache import WORKSPACES

KV_FORMATS = {
    "bf16": _C.KV_BF16,
    "fp16": _C.KV_FP16,
    "fp8_e4m3": _C.KV_FP8_E4M3,
    "int8": _C.KV_INT8,
}
_FORMAT_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}

DEVERR_SEQLEN_RANGE = _C.DEVERR_SEQLEN_RANGE
DEVERR_PAGE_RANGE = _C.DEVERR_PAGE_RANGE
DEVERR_METADATA = _C.DEVERR_METADATA
DEVERR_SLOT_RANGE = _C.DEVERR_SLOT_RANGE
ERROR_BUFFER_LEN = _C.ERROR_BUFFER_LEN

# The binding takes C ints: larger values are refused here, by name, and the library checks the
# tighter ranges it knows (num_workers, batch, page sizes).
INT32_MAX = 2**31 - 1

# The metadata header (docs/design.md): magic "KFMD", layout version, batch, h_q, s_q, ...
_META_MAGIC, _META_VERSION = 0x4B464D44, 3
_META_BATCH, _META_H_Q, _META_S_Q = 2, 3, 4
_Q_LAYOUT = "[b, s_q, h_q, 576]"


def _int(value, name: str, lo: int, hi: int = INT32_MAX) -> int:
    """`value` as an int in lo..hi; TypeError or ValueError naming the argument."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name}: expected {lo}..{hi}, got {value}")
    return value


def _h_q(value, name: str = "h_q") -> int:
    return _int(value, name, 1, _C.MAX_HEADS)


def _s_q(value) -> int:
    return _int(value, "s_q", 1, _C.MAX_SQ)


def _q_dims(q) -> tuple[int, int, int]:
    """(batch, s_q, h_q) of q [b, s_q, h_q, 576], each in the library's range."""
    shape = tuple(int(d) for d in q.shape)
    if len(shape) != 4:
        raise ValueError(f"q: expected shape {_Q_LAYOUT}, got {shape}")
    for axis, what, hi in ((0, "batch", None), (1, "s_q", _C.MAX_SQ), (2, "h_q", _C.MAX_HEADS)):
        if shape[axis] < 1 or (hi is not None and shape[axis] > hi):
            want = f"in 1..{hi}" if hi is not None else ">= 1"
            raise ValueError(f"q: expected shape[{axis}] ({what}) {want}, got {shape[axis]} "
                             f"(shape {shape}; q is {_Q_LAYOUT})")
    return shape[0], shape[1], shape[2]


def _format_code(kv_format, kv_cache) -> int:
    if kv_format is None:
        dtype = fw.dtype_name(kv_cache)
        if dtype in _FORMAT_OF_DTYPE:
            return KV_FORMATS[_FORMAT_OF_DTYPE[dtype]]
        if dtype == "uint8":
            raise ValueError(
                "kv_format: required for a uint8 kv_cache: 'fp8_e4m3' or 'int8'"
            )
        raise ValueError(
            f"kv_cache: dtype {dtype} is no cache format (bfloat16 or float16, or uint8 with "
            "kv_format='fp8_e4m3' or 'int8')"
        )
    if not isinstance(kv_format, str):
        raise TypeError(f"kv_format: expected a str, got {type(kv_format).__name__}")
    try:
        return KV_FORMATS[kv_format]
    except KeyError:
        raise ValueError(
            f"kv_format: expected one of {', '.join(KV_FORMATS)}, got {kv_format!r}"
        ) from None


def _device_id(device) -> int:
    """-1 for the CPU, the CUDA ordinal otherwise; `device` is an int, a str, a
    torch.device or an array."""
    if isinstance(device, bool):
        raise TypeError("device: expected an int, a str, a torch.device or an array, got bool")
    if isinstance(device, int):
        return _int(device, "device", -1)
    if isinstance(device, str) or type(device).__name__ == "device":
        text = str(device)
        if text == "cpu":
            return -1
        kind, _, index = text.partition(":")
        if kind == "cuda" and (not index or (index.isascii() and index.isdigit())):
            return _int(int(index), "device", 0) if index else 0
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {text!r}")
    fw.framework(device, "device")
    dev_type, dev_id = fw.device(device)
    return -1 if dev_type in (fw.KDL_CPU, fw.KDL_CUDA_HOST) else dev_id


def default_num_workers(device, h_q: int, s_q: int = 1, kv_format: str = "bf16",
                        batch=None) -> int:
    """Workers the scheduler splits a batch over by default on `device` (an int ordinal, -1
    or 'cpu' for the CPU backend, 'cuda:N', a torch.device, or an array living there), for
    decodes over a cache of kv_format (8-bit caches run 16 query rows per block, so more than
    16 rows take more row tiles and fewer workers). With `batch`, the count for a call of that
    many requests: on an H200 large 8-bit batches take the sm_90a 8-bit kernel's count (one
    block per SM); get_mla_metadata's default passes it. Metadata, workspace and decode of a
    call use one count."""
    b = 0 if batch is None else _int(batch, "batch", 1)
    return _default_workers(_device_id(device), _h_q(h_q), _s_q(s_q), _format_code(kv_format, None),
                            b)


def metadata_size(batch: int, num_workers: int) -> int:
    """int32 elements of the metadata for a batch and a worker count."""
    return call(_C.metadata_size, _int(batch, "batch", 1), _int(num_workers, "num_workers", 1))


def workspace_size(batch: int, h_q: int, s_q: int, num_workers: int) -> int:
    """Bytes of decode workspace for this shape and worker count (may be 0)."""
    return call(_C.workspace_size, _int(batch, "batch", 1), _h_q(h_q), _s_q(s_q),
                _int(num_workers, "num_workers", 1))


def cache_bytes_per_token(kv_format: str) -> int:
    """1152 for bf16/fp16, 644 for fp8_e4m3/int8."""
    return call(_C.cache_bytes_per_token, _format_code(kv_format, None))


def cache_bytes_per_page(kv_format: str, page_size: int) -> int:
    """Bytes of one cache page of `page_size` tokens in `kv_format`."""
    return call(_C.cache_bytes_per_page, _format_code(kv_format, None),
                _int(page_size, "page_size", 1))


def _num_workers_of(metadata, batch: int, name: str = "metadata") -> int:
    """The worker count a metadata array of this length was made for (its length encodes it)."""
    return _workers_of_shape(tuple(metadata.shape), batch, name)


@functools.lru_cache(maxsize=256)
def _workers_of_shape(shape: tuple, batch: int, name: str) -> int:
    n = int(shape[0]) if len(shape) == 1 else -1
    one = call(_C.metadata_size, batch, 1)
    per_worker = call(_C.metadata_size, batch, 2) - one
    extra, rest = divmod(n - one, per_worker)
    workers = extra + 1
    if n < 0 or rest or workers < 1:
        raise ValueError(
            f"{name}: shape {shape} fits no worker count for batch {batch} "
            f"(expected [metadata_size(batch, num_workers)] as made by get_mla_metadata)"
        )
    return workers


@functools.lru_cache(maxsize=256)
def _decode_workspace_bytes(batch: int, h_q: int, s_q: int, metadata_shape: tuple) -> int:
    """workspace_size for a decode of this shape with metadata of this shape."""
    workers = _workers_of_shape(metadata_shape, batch, "metadata")
    return call(_C.workspace_size, batch, h_q, s_q, workers)


@functools.lru_cache(maxsize=256)
def _default_workers(device_id: int, h_q: int, s_q: int, code: int, batch: int = 0) -> int:
    """default_num_workers, once per device, shape and batch (0: any): it depends on the
    device's SM count."""
    return call(_C.default_num_workers, device_id, h_q, s_q, code, batch)


@functools.lru_cache(maxsize=256)
def _metadata_elems(batch: int, num_workers: int) -> int:
    return call(_C.metadata_size, batch, num_workers)


def _made_for(metadata):
    """(batch, h_q, s_q) recorded in the header of a metadata array in host memory; None when
    reading it would take a device copy or it holds no header of this layout (the library
    reports those)."""
    view = fw.host_view(metadata)
    if view is None or view.dtype != np.int32 or view.ndim != 1 or view.shape[0] <= _META_S_Q:
        return None
    if int(view[0]) != _META_MAGIC or int(view[1]) != _META_VERSION:
        return None
    return int(view[_META_BATCH]), int(view[_META_H_Q]), int(view[_META_S_Q])


def _check_q_fits(dims, q, cache_seqlens, metadata) -> None:
    """q's batch against cache_seqlens and its s_q, h_q against what the metadata was made for,
    before the library checks the metadata: a q laid out [b, h_q, s_q, 576] is named as such."""
    batch, s_q, h_q = dims
    shape = tuple(int(d) for d in q.shape)
    if len(cache_seqlens.shape) == 1 and int(cache_seqlens.shape[0]) != batch:
        raise ValueError(
            f"q: expected shape[0] (batch) = {int(cache_seqlens.shape[0])}, the length of "
            f"cache_seqlens, got {batch} (shape {shape}; q is {_Q_LAYOUT})"
        )
    made_for = _made_for(metadata)
    if made_for is not None and made_for[0] == batch and made_for[1:] != (h_q, s_q):
        raise ValueError(
            f"q: shape {shape} has s_q = {s_q}, h_q = {h_q} (q is {_Q_LAYOUT}), but metadata was "
            f"made by get_mla_metadata for num_heads_q = {made_for[1]}, s_q = {made_for[2]}"
        )


# The torch paths (_metadata_torch, _decode_torch, _append_torch) hand plain torch tensors to
# the C API, which checks every argument, and skip the Python checks. When a call fails (these
# exception types), it is made again through the checked path, which raises the error in the
# caller's terms: the C API checks everything before it writes anything, so the second attempt
# sees the same state (a CUDA error is met, and reported, again).
_REFUSED = (ValueError, TypeError, RuntimeError)
_FORMAT_CODE_OF_DTYPE = {dtype: KV_FORMATS[fmt] for dtype, fmt in _FORMAT_OF_DTYPE.items()}


def _torch_first(kit, torch_path, checked_path, *args):
    """torch_path(kit, *args) when kit is not None (the call's main tensor is a plain torch
    tensor) and that path applies and succeeds; checked_path(*args) otherwise, which names the
    cause of a refusal in the caller's terms."""
    if kit is not None:
        try:
            done = torch_path(kit, *args)
        except _REFUSED:
            done = None
        if done is not None:
            return done
    return checked_path(*args)


def _torch_or_none(kit, *arrays) -> bool:
    tensor = kit.tensor
    return all(a is None or type(a) is tensor for a in arrays)


def _torch_format(kv_format, kv_cache):
    """The format code of a kv_format name, or of a bf16/fp16 cache's dtype; None otherwise."""
    if kv_format is None:
        return _FORMAT_CODE_OF_DTYPE.get(fw.dtype_name(kv_cache))
    return KV_FORMATS.get(kv_format) if type(kv_format) is str else None


def _torch_stream(kit, stream, like):
    """The stream handle, or None for a stream object (the checked path reads those)."""
    if stream is None:
        return kit.current_stream(like)
    if type(stream) is int and 0 <= stream <= fw.STREAM_MAX:
        return stream
    return None


def _scratch_workspace(q, stream, handle: int, nbytes: int):
    """The workspace of a decode that was given none: the buffer kept for the current stream
    (_workspace_cache states when reuse is safe), or a new one for an explicit stream."""
    if stream is None:
        return WORKSPACES.get(q, handle, nbytes)
    return WORKSPACES.fresh(q, nbytes)


def get_mla_metadata(cache_seqlens, num_heads_q: int, s_q: int = 1, num_workers=None,
                     stream=None, out=None, kv_format: str = "bf16"):
    """Split schedule for a decode step: int32 [metadata_size(b, num_workers)] on the device of
    `cache_seqlens`, in its framework (or written into `out`). Runs on the device without host
    synchronization, so it can be captured in a CUDA graph with the decode that uses it.
    num_workers defaults to default_num_workers(device, h_q, s_q, kv_format, batch=b); with `out` it defaults to
    the count out's length was made for. kv_format names the cache format of the decodes it
    serves ('bf16', 'fp16', 'fp8_e4m3', 'int8'): 8-bit pieces cost more to start, so their
    schedule splits less. Metadata made for another format is still correct, only less
    balanced."""
    return _torch_first(fw.torch_kit(cache_seqlens), _metadata_torch, _metadata_checked,
                        cache_seqlens, num_heads_q, s_q, num_workers, stream, out, kv_format)


def _metadata_checked(cache_seqlens, num_heads_q, s_q, num_workers, stream, out, kv_format):
    """get_mla_metadata for any framework, every argument checked here first."""
    home = fw.framework(cache_seqlens, "cache_seqlens")
    fw.check_home(cache_seqlens, home, "cache_seqlens")
    h_q = _h_q(num_heads_q, "num_heads_q")
    s_q = _s_q(s_q)
    if len(cache_seqlens.shape) != 1 or int(cache_seqlens.shape[0]) < 1:
        raise ValueError(
            f"cache_seqlens: expected shape [batch] with batch >= 1, got "
            f"{tuple(cache_seqlens.shape)}"
        )
    batch = int(cache_seqlens.shape[0])
    if out is not None:
        fw.check_writable(out, "out")
        if num_workers is None:
            num_workers = _num_workers_of(out, batch, "out")
    elif num_workers is None:
        num_workers = default_num_workers(cache_seqlens, h_q, s_q, kv_format, batch=batch)
    num_workers = _int(num_workers, "num_workers", 1)
    fmt = _format_code(kv_format, None)
    handle = fw.stream_handle(stream, cache_seqlens, home)
    metadata = out
    if metadata is None:
        size = call(_C.metadata_size, batch, num_workers)
        metadata = fw.empty(cache_seqlens, home, (size,), "int32")
    call(_C.mla_metadata, fw.export(cache_seqlens, home), h_q, s_q, num_workers, fmt,
         fw.export(metadata), handle)
    return out if out is not None else fw.to_home(metadata, home)




def _metadata_torch(kit, cache_seqlens, num_heads_q, s_q, num_workers, stream, out, kv_format):
    """get_mla_metadata of plain torch tensors with the argument checks left to the C API; None
    where this path does not apply."""
    if (type(num_heads_q) is not int or type(s_q) is not int
            or (num_workers is not None and type(num_workers) is not int)
            or (out is not None and type(out) is not kit.tensor)):
        return None
    code = KV_FORMATS.get(kv_format) if type(kv_format) is str else None
    handle = _torch_stream(kit, stream, cache_seqlens)
    if code is None or handle is None:
        return None
    (batch,) = cache_seqlens.shape
    if num_workers is None:
        if out is not None:
            num_workers = _workers_of_shape(tuple(out.shape), batch, "out")
        else:
            device_id = cache_seqlens.get_device() if cache_seqlens.is_cuda else -1
            num_workers = _default_workers(device_id, num_heads_q, s_q, code, batch)
    metadata = out
    if metadata is None:
        metadata = cache_seqlens.new_empty((_metadata_elems(batch, num_workers),),
                                           dtype=kit.int32)
    capsule = kit.capsule
    _C.mla_metadata(capsule(cache_seqlens), num_heads_q, s_q, num_workers, code,
                    capsule(metadata), handle)
    return metadata


def mla_decode(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale: float,
               kv_format=None, out=None, lse=None, workspace=None, error_buffer=None,
               stream=None):
    """MLA decode attention over a paged latent cache; returns (out, lse).

    softmax_scale is required: for DeepSeek-V2-Lite it is 0.114721 and for V3 0.135234
    (192**-0.5 times the YaRN mscale**2), not 576**-0.5.

    kv_format is inferred from a bfloat16/float16 cache and required ('fp8_e4m3' or 'int8')
    for a uint8 one. out, lse and workspace are allocated when not given; the workspace is
    workspace_size(b, h_q, s_q, num_workers) bytes, uint8 (for torch tensors on the current
    stream, one buffer per device, stream and thread is kept and reused outside CUDA graph
    captures: kernelflow.torch_ops.release_workspaces drops them). CUDA graph users pass all
    three (allocating inside a capture is not what you want). error_buffer (int32[4], see
    new_error_buffer) receives flags for bad device-side values. The stream defaults to the
    current stream of q's framework (0 otherwise).
    """
    return _torch_first(fw.torch_kit(q), _decode_torch, _decode_checked, q, kv_cache,
                        block_table, cache_seqlens, metadata, softmax_scale, kv_format, out, lse,
                        workspace, error_buffer, stream)


def _decode_checked(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale,
                    kv_format, out, lse, workspace, error_buffer, stream):
    """mla_decode for any framework, every argument checked here first."""
    home = fw.framework(q, "q")
    fw.check_home(q, home, "q")
    for arr, name in ((kv_cache, "kv_cache"), (block_table, "block_table"),
                      (cache_seqlens, "cache_seqlens"), (metadata, "metadata")):
        fw.framework(arr, name)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(
            "softmax_scale: expected a float (there is no default: DeepSeek-V2-Lite uses "
            f"0.114721, V3 0.135234), got {type(softmax_scale).__name__}"
        )
    softmax_scale = float(softmax_scale)
    code = _format_code(kv_format, kv_cache)
    dims = _q_dims(q)
    _check_q_fits(dims, q, cache_seqlens, metadata)
    batch, s_q, h_q = dims
    for arr, name in ((out, "out"), (lse, "lse"), (workspace, "workspace"),
                      (error_buffer, "error_buffer")):
        if arr is not None:
            fw.check_writable(arr, name)
    if workspace is not None and fw.dtype_name(workspace) != "uint8":
        raise ValueError(
            f"workspace: expected dtype uint8 (bytes, as new_workspace makes), got "
            f"{fw.dtype_name(workspace)}"
        )
    handle = fw.stream_handle(stream, q, home)
    if out is None:
        out = fw.empty(q, home, (batch, s_q, h_q, _C.LATENT_DIM))
    if lse is None:
        lse = fw.empty(q, home, (batch, h_q, s_q), "float32")
    if workspace is None:
        nbytes = call(_C.workspace_size, batch, h_q, s_q, _num_workers_of(metadata, batch))
        workspace = fw.empty_bytes(q, home, nbytes) if nbytes else None
    call(_C.mla_decode, fw.export(q, home), fw.export(kv_cache), code, fw.export(block_table),
         fw.export(cache_seqlens), fw.export(metadata), softmax_scale, fw.export(out),
         fw.export(lse), None if workspace is None else fw.export(workspace),
         None if error_buffer is None else fw.export(error_buffer), handle)
    return fw.to_home(out, home), fw.to_home(lse, home)




def _decode_torch(kit, q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale,
                  kv_format, out, lse, workspace, error_buffer, stream):
    """mla_decode of plain torch tensors with the argument checks left to the C API; None where
    this path does not apply."""
    tensor = kit.tensor
    if (type(kv_cache) is not tensor or type(block_table) is not tensor
            or type(cache_seqlens) is not tensor or type(metadata) is not tensor
            or type(softmax_scale) is not float
            or not _torch_or_none(kit, out, lse, workspace, error_buffer)
            or (workspace is not None and workspace.dtype is not kit.uint8)):
        return None
    code = _torch_format(kv_format, kv_cache)
    handle = _torch_stream(kit, stream, q)
    if code is None or handle is None:
        return None
    if out is None or lse is None or workspace is None:
        batch, s_q, h_q, _ = q.shape
        if out is None:
            out = q.new_empty((batch, s_q, h_q, _C.LATENT_DIM))
        if lse is None:
            lse = q.new_empty((batch, h_q, s_q), dtype=kit.float32)
        if workspace is None:
            workspace = _scratch_workspace(q, stream, handle, _decode_workspace_bytes(
                batch, h_q, s_q, tuple(metadata.shape)))
    capsule = kit.capsule
    _C.mla_decode(capsule(q), capsule(kv_cache), code, capsule(block_table),
                  capsule(cache_seqlens), capsule(metadata), softmax_scale, capsule(out),
                  capsule(lse), None if workspace is None else capsule(workspace),
                  None if error_buffer is None else capsule(error_buffer), handle)
    return out, lse


def cache_append(kv, kv_cache, slot_mapping, kv_format=None, error_buffer=None, stream=None):
    """Write rows kv[n, 576] into the paged cache in place: row i goes to slot
    slot_mapping[i] = page * page_size + offset (int64; negative means skip). 8-bit formats
    quantize on the fly; kv_format is inferred from a bfloat16/float16 cache."""
    return _torch_first(fw.torch_kit(kv_cache), _append_torch, _append_checked, kv, kv_cache,
                        slot_mapping, kv_format, error_buffer, stream)


def _append_checked(kv, kv_cache, slot_mapping, kv_format, error_buffer, stream):
    """cache_append for any framework, every argument checked here first."""
    home = fw.framework(kv_cache, "kv_cache")
    fw.framework(kv, "kv")
    fw.framework(slot_mapping, "slot_mapping")
    fw.check_writable(kv_cache, "kv_cache")
    if error_buffer is not None:
        fw.check_writable(error_buffer, "error_buffer")
    code = _format_code(kv_format, kv_cache)
    call(_C.cache_append, fw.export(kv), fw.export(kv_cache, home), code, fw.export(slot_mapping),
         None if error_buffer is None else fw.export(error_buffer),
         fw.stream_handle(stream, kv_cache, home))
    return kv_cache




def _append_torch(kit, kv, kv_cache, slot_mapping, kv_format, error_buffer, stream):
    """cache_append of plain torch tensors with the argument checks left to the C API; None
    where this path does not apply."""
    if (type(kv) is not kit.tensor or type(slot_mapping) is not kit.tensor
            or not _torch_or_none(kit, error_buffer)):
        return None
    code = _torch_format(kv_format, kv_cache)
    handle = _torch_stream(kit, stream, kv_cache)
    if code is None or handle is None:
        return None
    capsule = kit.capsule
    _C.cache_append(capsule(kv), capsule(kv_cache), code, capsule(slot_mapping),
                    None if error_buffer is None else capsule(error_buffer), handle)
    return kv_cache


def convert_cache(src, dst=None, kv_format="fp8_e4m3", stream=None):
    """Quantize a whole bf16/fp16 cache src [num_pages, page_size, 576] (or [.., 1, 576]) into
    an 8-bit cache: every slot gets the bytes cache_append would write for the same row.

    kv_format is 'fp8_e4m3' or 'int8'; dst, when given, is a uint8 [num_pages, page_size, 644]
    cache on src's device (page_size a multiple of 16), written in place; otherwise a new one is
    allocated in src's framework. Returns dst."""
    home = fw.framework(src, "src")
    if kv_format not in ("fp8_e4m3", "int8"):
        raise ValueError(f"kv_format: expected 'fp8_e4m3' or 'int8', got {kv_format!r}")
    code = _format_code(kv_format, None)
    if len(src.shape) not in (3, 4):
        raise ValueError(
            f"src: expected shape [num_pages, page_size, 576] (or [.., 1, 576]), got {tuple(src.shape)}"
        )
    if dst is None:
        fw.check_home(src, home, "src")
        num_pages, page_size = int(src.shape[0]), int(src.shape[1])
        dst = fw.empty(src, home, (num_pages, page_size, _C.BYTES_PER_TOKEN_8BIT), "uint8")
    else:
        fw.framework(dst, "dst")
        fw.check_writable(dst, "dst")
    handle = fw.stream_handle(stream, src, home)
    call(_C.cache_convert, fw.export(src), fw.export(dst, home), code, handle)
    return fw.to_home(dst, home)


def new_workspace(q, metadata):
    """A decode workspace for q's shape and the worker count `metadata` was made for: uint8,
    256-byte aligned, on q's device, in q's framework. Allocate it once (outside any CUDA graph
    capture) and pass it as workspace= to every mla_decode of that shape."""
    home = fw.framework(q, "q")
    fw.check_home(q, home, "q")
    fw.framework(metadata, "metadata")
    batch, s_q, h_q = _q_dims(q)
    nbytes = call(_C.workspace_size, batch, h_q, s_q, _num_workers_of(metadata, batch))
    return fw.empty_bytes(q, home, nbytes)


def new_error_buffer(like):
    """A device error buffer int32[4] = [0, -1, 0, 0] on the device of `like`."""
    home = fw.framework(like, "like")
    fw.check_home(like, home, "like")
    return fw.error_buffer(like, home)  # NumPy for JAX: the library must be able to write it
