"""KernelFlow-ops: MLA decode attention (DeepSeek latent attention over a paged cache).

    import kernelflow as kf
    metadata = kf.get_mla_metadata(cache_seqlens, num_heads_q=16, s_q=1)
    out, lse = kf.mla_decode(q, kv_cache, block_table, cache_seqlens, metadata,
                             softmax_scale=0.114721)

The fused decode layer (the attention blocks of L layers in one CUDA graph per step):

    cfg = kf.LayerConfig.deepseek_v2_lite(max_batch=8, max_pages_per_seq=64, max_position=4096)
    graph = kf.DecodeGraph(cfg, layers, hidden=..., output=..., positions=...,
                           cache_seqlens=..., block_table=..., cos_sin=...)
    graph.launch()

Arrays from NumPy, PyTorch, CuPy and JAX (CPU) are accepted through DLPack; CPU arrays run the
reference CPU backend, CUDA arrays the GPU kernels. `python -m kernelflow info` prints the build.
kernelflow.reference is the float64 NumPy reference of the same math (docs/spec.md) that the
tests, the demo and the benchmarks check the library against.
"""

from . import _C
from .layer import DecodeGraph, LayerConfig, layer_workspace_size
from ._linear import linear, linear_workspace_size, new_linear_workspace
from .mla import (
    DEVERR_METADATA,
    DEVERR_PAGE_RANGE,
    DEVERR_SEQLEN_RANGE,
    DEVERR_SLOT_RANGE,
    ERROR_BUFFER_LEN,
    KV_FORMATS,
    cache_append,
    cache_bytes_per_page,
    cache_bytes_per_token,
    convert_cache,
    default_num_workers,
    get_mla_metadata,
    metadata_size,
    mla_decode,
    new_error_buffer,
    new_workspace,
    workspace_size,
)

version = _C.version()
__version__ = version


def build_info() -> str:
    """One line: version, CUDA architectures compiled in (or 'cpu-only'), CUDA runtime."""
    return _C.build_info()


def cuda_device_count() -> int:
    """CUDA devices visible to the library (0 without a driver, a GPU or a CUDA build)."""
    return _C.cuda_device_count()


def has_cuda() -> bool:
    """Whether this build has the CUDA backend compiled in."""
    return "cpu-only" not in _C.build_info()


__all__ = [
    "DEVERR_METADATA",
    "DEVERR_PAGE_RANGE",
    "DEVERR_SEQLEN_RANGE",
    "DEVERR_SLOT_RANGE",
    "DecodeGraph",
    "ERROR_BUFFER_LEN",
    "KV_FORMATS",
    "LayerConfig",
    "__version__",
    "build_info",
    "cache_append",
    "cache_bytes_per_page",
    "cache_bytes_per_token",
    "convert_cache",
    "cuda_device_count",
    "default_num_workers",
    "get_mla_metadata",
    "has_cuda",
    "layer_workspace_size",
    "linear",
    "linear_workspace_size",
    "metadata_size",
    "mla_decode",
    "new_error_buffer",
    "new_linear_workspace",
    "new_workspace",
    "version",
    "workspace_size",
]
