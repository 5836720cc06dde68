"""The library's calls for JAX: XLA FFI custom calls that work under jax.jit, inside lax.scan,
on CPU and GPU arrays, and inside XLA's command buffers (CUDA graphs) on a GPU.

    import kernelflow.jax as kfj
    metadata = kfj.get_mla_metadata(cache_seqlens, num_heads_q=16, s_q=1)
    kv_cache = kfj.cache_append(kv, kv_cache, slot_mapping)     # returns the updated cache
    out, lse = kfj.mla_decode(q, kv_cache, block_table, cache_seqlens, metadata,
                              softmax_scale=0.114721)

Shapes, dtypes and semantics are kernelflow.mla_decode's. What differs, because JAX arrays are
immutable and traced under jit:

- Every result is a new array. cache_append returns the cache: the custom call aliases its
  result to the cache argument, so under jax.jit with the cache donated (donate_argnums) the
  rows are written in place; without donation XLA copies the cache first.
- Static values (softmax_scale, num_heads_q, s_q, num_workers, kv_format) are FFI attributes
  fixed when the function is traced: a traced value there is an error naming the argument.
- The decode's workspace is an extra result of the custom call, owned by XLA (so it has a
  fixed address inside a command buffer); nothing to pass.
- Bad device-side values (a cache_seqlens beyond the block table, a page index outside the
  cache, metadata of another shape, a slot beyond the cache) cannot raise inside a compiled
  computation on a GPU: the kernels clamp or mask them, never touching memory outside the
  arrays, and flag them in an error buffer when one is passed (error_buffer=, made by
  new_error_buffer; the updated buffer is returned as the last result, so it accumulates over
  layers and steps). check_errors reads it on the host. On the CPU backend the library checks
  those values before it computes and the call raises (a JaxRuntimeError naming the argument).
- slot_mapping may be int32 (JAX's default integer) or int64.
- num_workers defaults to the library's default for the device cache_seqlens lives on; a traced
  cache_seqlens is taken to live on JAX's default device (pass num_workers to pin it).

Importing this module imports JAX and registers the custom-call targets for the "cpu" and
"CUDA" platforms; `import kernelflow` does not.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from . import _C
from . import _frameworks as fw
from . import _linear
from . import mla as _mla

try:
    from . import _jax_ffi
except ImportError as e:
    raise ImportError(
        "kernelflow.jax: this kernelflow build has no JAX entry (the extension "
        "kernelflow._jax_ffi was not built: CMake found no JAX FFI headers when it configured, "
        "or KF_WITH_JAX was OFF). "
        "Install jax into the Python that builds kernelflow and rebuild: `pip install jax` then "
        "`pip install --no-build-isolation .`, or rerun CMake with -DKF_JAX_FFI_INCLUDE_DIR="
        "<the folder jax.ffi.include_dir() prints>"
    ) from e

__all__ = [
    "cache_append",
    "check_errors",
    "convert_cache",
    "cuda_call_counts",
    "get_mla_metadata",
    "linear",
    "mla_decode",
    "new_error_buffer",
]

for _platform, _targets in _jax_ffi.targets().items():
    for _name, _capsule in _targets.items():
        jax.ffi.register_ffi_target(_name, _capsule, platform=_platform)



def cuda_call_counts() -> dict:
    """{custom-call target: (calls, recorded)} of this process's CUDA handlers: how often XLA
    called each, and how many of those calls it made while recording a command buffer (its
    stream capturing into a CUDA graph). A replayed command buffer runs the kernels without
    calling the handler, so neither count moves then. A diagnostic: it shows whether XLA put
    the calls into its CUDA graphs (XLA_FLAGS or compiler_options
    xla_gpu_enable_command_buffer with CUSTOM_CALL, and DYNAMIC_SLICE_FUSION for calls on
    slices of a larger array) or ran them one by one. The first execution of a compiled step
    runs its custom calls one by one (XLA's warm-up); recording happens on the next."""
    return dict(_jax_ffi.cuda_call_counts())


_SIXTEEN_BIT = ("bfloat16", "float16")
# Spare bytes of the workspace result: the handler starts the workspace at its first 256-byte
# aligned byte (the C API's rule; XLA aligns buffers less).
_WORKSPACE_SLACK = 256
# Stands in for a traced metadata array where mla's checks read its header: a traced array has
# no values, and the library checks the header when it runs.
_NO_HEADER = np.zeros(0, np.int32)


# ---- argument checks (the shape rules shared with the eager API live in kernelflow.mla) ----

def _array(x, name: str):
    """x as a JAX array (NumPy arrays are converted); TypeError naming the argument otherwise."""
    if isinstance(x, jax.Array):  # concrete or traced
        return x
    if isinstance(x, np.ndarray):
        return jnp.asarray(x)
    raise TypeError(
        f"{name}: expected a JAX or NumPy array, got {type(x).__module__}.{type(x).__qualname__}"
    )


def _expect_dtype(x, name: str, allowed) -> None:
    got = fw.dtype_name(x)
    if got not in allowed:
        raise ValueError(f"{name}: expected dtype {' or '.join(allowed)}, got {got}")


def _static(value, name: str):
    """value, refused when it is traced: static values become FFI attributes at trace time."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{name}: expected a static value, got a traced JAX value; under jax.jit pass it "
            f"as a Python value (close over it, or list it in static_argnames)"
        )
    return value


def _softmax_scale(value) -> float:
    value = _static(value, "softmax_scale")
    if isinstance(value, jax.Array) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            "softmax_scale: expected a float (there is no default: DeepSeek-V2-Lite uses "
            f"0.114721, V3 0.135234), got {type(value).__name__}"
        )
    return float(value)


def _format(kv_format, kv_cache) -> int:
    return _mla._format_code(_static(kv_format, "kv_format"), kv_cache)


def _header_source(metadata):
    """What kernelflow.mla may read metadata's header from: the array, unless it is traced."""
    return _NO_HEADER if isinstance(metadata, jax.core.Tracer) else metadata


def _default_device():
    device = jax.config.jax_default_device
    if isinstance(device, jax.Device):
        return device
    return jax.devices(device)[0] if isinstance(device, str) else jax.devices()[0]


def _device_id(x) -> int:
    """-1 for the CPU, else the CUDA ordinal of the device x lives on (JAX's default device for
    a traced x, which jit places there unless told otherwise)."""
    devices = None if isinstance(x, jax.core.Tracer) else x.devices()
    device = next(iter(devices)) if devices and len(devices) == 1 else _default_device()
    if device.platform == "cpu":
        return -1
    ordinal = getattr(device, "local_hardware_id", None)
    return device.id if ordinal is None else ordinal


def _int64_pairs(slot_mapping):
    """int32 [n, 2] little-endian word pairs of the int64 slots (the C API's dtype), made from
    int32 or int64 slots: JAX has no int64 arrays unless jax_enable_x64 is set."""
    if fw.dtype_name(slot_mapping) == "int64":
        return jax.lax.bitcast_convert_type(slot_mapping, jnp.int32)
    return jnp.stack([slot_mapping, jnp.right_shift(slot_mapping, 31)], axis=-1)


def _error_buffer(error_buffer):
    error_buffer = _array(error_buffer, "error_buffer")
    if tuple(error_buffer.shape) != (_C.ERROR_BUFFER_LEN,):
        raise ValueError(f"error_buffer: expected shape ({_C.ERROR_BUFFER_LEN},) as "
                         f"new_error_buffer makes, got {tuple(error_buffer.shape)}")
    _expect_dtype(error_buffer, "error_buffer", ("int32",))
    return error_buffer


def _ffi(target: str, results, args, error_buffer, aliases: dict, **attrs):
    """ffi_call of `target`, or of its _checked variant with the error buffer as the last
    argument and (aliased) the last result; returns the list of results."""
    results, args, aliases = list(results), list(args), dict(aliases)
    if error_buffer is not None:
        aliases[len(args)] = len(results)
        args.append(_error_buffer(error_buffer))
        results.append(jax.ShapeDtypeStruct((_C.ERROR_BUFFER_LEN,), jnp.int32))
        target += "_checked"
    call = jax.ffi.ffi_call(target, results, input_output_aliases=aliases or None)
    return call(*args, **attrs)


# ---- the calls ---------------------------------------------------------------------------

def get_mla_metadata(cache_seqlens, num_heads_q: int, s_q: int = 1, num_workers=None,
                     kv_format: str = "bf16"):
    """Split schedule for a decode step: int32 [metadata_size(b, num_workers)], computed on the
    device of cache_seqlens (int32 [b]) by the custom call. All layers of a step share it.
    num_workers defaults to kernelflow.default_num_workers for that device and batch."""
    cache_seqlens = _array(cache_seqlens, "cache_seqlens")
    h_q = _mla._h_q(_static(num_heads_q, "num_heads_q"), "num_heads_q")
    s_q = _mla._s_q(_static(s_q, "s_q"))
    fmt = _format(kv_format, None)
    if cache_seqlens.ndim != 1 or cache_seqlens.shape[0] < 1:
        raise ValueError(f"cache_seqlens: expected shape [batch] with batch >= 1, got "
                         f"{tuple(cache_seqlens.shape)}")
    _expect_dtype(cache_seqlens, "cache_seqlens", ("int32",))
    if num_workers is None:
        num_workers = _mla.default_num_workers(_device_id(cache_seqlens), h_q, s_q, kv_format,
                                               batch=int(cache_seqlens.shape[0]))
    num_workers = _mla._int(_static(num_workers, "num_workers"), "num_workers", 1)
    size = _mla.metadata_size(int(cache_seqlens.shape[0]), num_workers)
    (metadata,) = _ffi("kernelflow_mla_metadata", [jax.ShapeDtypeStruct((size,), jnp.int32)],
                       [cache_seqlens], None, {}, h_q=np.int32(h_q), s_q=np.int32(s_q),
                       num_workers=np.int32(num_workers), kv_format=np.int32(fmt))
    return metadata


def mla_decode(q, kv_cache, block_table, cache_seqlens, metadata, softmax_scale: float,
               kv_format=None, error_buffer=None):
    """MLA decode attention over a paged latent cache: (out [b, s_q, h_q, 512] in q's dtype,
    lse float32 [b, h_q, s_q]), plus the updated error buffer when error_buffer is given.

    softmax_scale is required (DeepSeek-V2-Lite 0.114721, V3 0.135234). kv_format is inferred
    from a bfloat16/float16 cache and required ('fp8_e4m3' or 'int8') for a uint8 one."""
    q = _array(q, "q")
    kv_cache = _array(kv_cache, "kv_cache")
    block_table = _array(block_table, "block_table")
    cache_seqlens = _array(cache_seqlens, "cache_seqlens")
    metadata = _array(metadata, "metadata")
    scale = _softmax_scale(softmax_scale)
    fmt = _format(kv_format, kv_cache)
    dims = _mla._q_dims(q)
    _expect_dtype(q, "q", _SIXTEEN_BIT)
    eight_bit = fmt in (_C.KV_FP8_E4M3, _C.KV_INT8)
    _expect_dtype(kv_cache, "kv_cache", ("uint8",) if eight_bit else (fw.dtype_name(q),))
    for arr, name in ((block_table, "block_table"), (cache_seqlens, "cache_seqlens"),
                      (metadata, "metadata")):
        _expect_dtype(arr, name, ("int32",))
    _mla._check_q_fits(dims, q, cache_seqlens, _header_source(metadata))
    batch, s_q, h_q = dims
    workspace = _mla.workspace_size(batch, h_q, s_q, _mla._num_workers_of(metadata, batch))
    results = [jax.ShapeDtypeStruct((batch, s_q, h_q, _C.LATENT_DIM), q.dtype),
               jax.ShapeDtypeStruct((batch, h_q, s_q), jnp.float32),
               jax.ShapeDtypeStruct((workspace + _WORKSPACE_SLACK,), jnp.uint8)]
    got = _ffi("kernelflow_mla_decode", results,
               [q, kv_cache, block_table, cache_seqlens, metadata], error_buffer, {},
               softmax_scale=np.float32(scale), kv_format=np.int32(fmt))
    return (got[0], got[1]) if error_buffer is None else (got[0], got[1], got[3])


def cache_append(kv, kv_cache, slot_mapping, kv_format=None, error_buffer=None):
    """The cache with rows kv[n, 576] written at slot_mapping[i] = page * page_size + offset
    (int32 or int64; negative means skip); 8-bit formats quantize on the fly. Returns the new
    cache (aliased to kv_cache: in place when the caller donates it under jax.jit), and the
    updated error buffer when error_buffer is given."""
    kv = _array(kv, "kv")
    kv_cache = _array(kv_cache, "kv_cache")
    slot_mapping = _array(slot_mapping, "slot_mapping")
    fmt = _format(kv_format, kv_cache)
    _expect_dtype(kv, "kv", _SIXTEEN_BIT)
    if kv.ndim != 2 or kv.shape[1] != _C.HEAD_DIM:
        raise ValueError(f"kv: expected shape [n, {_C.HEAD_DIM}], got {tuple(kv.shape)}")
    if slot_mapping.ndim != 1 or slot_mapping.shape[0] != kv.shape[0]:
        raise ValueError(f"slot_mapping: expected shape [n] with n = {kv.shape[0]} (rows of kv), "
                         f"got {tuple(slot_mapping.shape)}")
    _expect_dtype(slot_mapping, "slot_mapping", ("int32", "int64"))
    got = _ffi("kernelflow_cache_append", [jax.ShapeDtypeStruct(kv_cache.shape, kv_cache.dtype)],
               [kv, kv_cache, _int64_pairs(slot_mapping)], error_buffer, {1: 0},
               kv_format=np.int32(fmt))
    return got[0] if error_buffer is None else (got[0], got[1])


def convert_cache(src, kv_format: str = "fp8_e4m3"):
    """A new 8-bit cache uint8 [num_pages, page_size, 644] ('fp8_e4m3' or 'int8') holding, for
    every slot of the bf16/fp16 cache src [num_pages, page_size, 576] (or [.., 1, 576]), the
    bytes cache_append would write for the same row."""
    src = _array(src, "src")
    kv_format = _static(kv_format, "kv_format")
    if kv_format not in ("fp8_e4m3", "int8"):
        raise ValueError(f"kv_format: expected 'fp8_e4m3' or 'int8', got {kv_format!r}")
    if src.ndim not in (3, 4):
        raise ValueError(f"src: expected shape [num_pages, page_size, 576] (or [.., 1, 576]), "
                         f"got {tuple(src.shape)}")
    _expect_dtype(src, "src", _SIXTEEN_BIT)
    shape = (src.shape[0], src.shape[1], _C.BYTES_PER_TOKEN_8BIT)
    (dst,) = _ffi("kernelflow_cache_convert", [jax.ShapeDtypeStruct(shape, jnp.uint8)], [src],
                  None, {}, kv_format=np.int32(_format(kv_format, None)))
    return dst


def linear(x, weight):
    """kernelflow.linear under jax.jit: x [m, k] @ weight[n, k].T (bfloat16, fp32 accumulation;
    1 to 128 rows, k a multiple of 64). The workspace the sizes need is an XLA-owned result,
    zero-filled by the call."""
    x = _array(x, "x")
    weight = _array(weight, "weight")
    _expect_dtype(x, "x", ("bfloat16",))
    _expect_dtype(weight, "weight", ("bfloat16",))
    if x.ndim != 2:
        raise ValueError(f"x: expected shape [m, k], got {tuple(x.shape)}")
    if weight.ndim != 2:
        raise ValueError(f"weight: expected shape [n, k], got {tuple(weight.shape)}")
    (m, k), n = x.shape, weight.shape[0]
    try:
        nbytes = _linear.linear_workspace_size(m, n, k)
    except ValueError:
        nbytes = 0  # sizes the call rejects, naming the array they came from
    results = [jax.ShapeDtypeStruct((m, n), x.dtype),
               jax.ShapeDtypeStruct((nbytes + _WORKSPACE_SLACK,), jnp.uint8)]
    return _ffi("kernelflow_linear", results, [x, weight], None, {})[0]


# ---- the device error buffer ---------------------------------------------------------------

_ERROR_FLAGS = (
    (_C.DEVERR_SEQLEN_RANGE, "a cache_seqlens value below 0 or beyond what block_table addresses"),
    (_C.DEVERR_PAGE_RANGE, "a block_table entry in use outside [0, num_pages)"),
    (_C.DEVERR_METADATA, "metadata made for another batch, head count or s_q"),
    (_C.DEVERR_SLOT_RANGE, "a slot_mapping value beyond the cache"),
)


def new_error_buffer():
    """A fresh error buffer int32[4] = [0, -1, 0, 0] for error_buffer= (on the default device)."""
    return jnp.asarray(_mla.new_error_buffer(_NO_HEADER))


def check_errors(error_buffer) -> None:
    """Raise ValueError when the kernels flagged bad device-side values in error_buffer. It
    reads the buffer on the host (a synchronization): call it outside jax.jit, for instance
    once per step."""
    error_buffer = _static(error_buffer, "error_buffer")
    words = np.asarray(_error_buffer(error_buffer))
    flags = int(words[0])
    if flags == 0:
        return
    seen = [what for bit, what in _ERROR_FLAGS if flags & bit]
    raise ValueError(
        f"error_buffer: the kernels saw {'; '.join(seen)} (clamped or masked; first in request "
        f"or row {int(words[1])}, value {int(words[2])})"
    )
