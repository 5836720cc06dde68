# Hand-written stubs of the nanobind module (its tensor arguments are untyped handles that the
# binding converts itself, which generated stubs would show as `object`).
from typing import Any, Optional

# Anything the binding converts to a DLTensor: a NumPy/PyTorch/CuPy/JAX array, an object with
# __dlpack__, or a DLPack capsule.
ArrayLike = Any

def version() -> str: ...
def build_info() -> str: ...
def last_error() -> str: ...
def status_string(status: int) -> str: ...
def cuda_device_count() -> int: ...
def cache_bytes_per_token(kv_format: int) -> int: ...
def cache_bytes_per_page(kv_format: int, page_size: int) -> int: ...
def default_num_workers(device_id: int, h_q: int, s_q: int, kv_format: int = 0, batch: int = 0) -> int: ...
def metadata_size(batch: int, num_workers: int) -> int: ...
def workspace_size(batch: int, h_q: int, s_q: int, num_workers: int) -> int: ...
def mla_metadata(
    cache_seqlens: ArrayLike,
    h_q: int,
    s_q: int,
    num_workers: int,
    kv_format: int,
    metadata: ArrayLike,
    stream: int = 0,
) -> None: ...
def mla_decode(
    q: ArrayLike,
    kv_cache: ArrayLike,
    kv_format: int,
    block_table: ArrayLike,
    cache_seqlens: ArrayLike,
    metadata: ArrayLike,
    softmax_scale: float,
    out: ArrayLike,
    lse: ArrayLike,
    workspace: Optional[ArrayLike] = None,
    error_buffer: Optional[ArrayLike] = None,
    stream: int = 0,
) -> None: ...
def cache_append(
    kv: ArrayLike,
    kv_cache: ArrayLike,
    kv_format: int,
    slot_mapping: ArrayLike,
    error_buffer: Optional[ArrayLike] = None,
    stream: int = 0,
) -> None: ...
def cache_convert(src: ArrayLike, dst: ArrayLike, kv_format: int, stream: int = 0) -> None: ...
def linear_workspace_size(m: int, n: int, k: int) -> int: ...
def linear(
    x: ArrayLike, weight: ArrayLike, out: ArrayLike, workspace: ArrayLike | None, stream: int = 0
) -> None: ...
def describe(array: ArrayLike) -> dict[str, Any]: ...

class _LayerGraph:  # private: kernelflow.DecodeGraph wraps it
    def launch(self, stream: int = 0) -> None: ...
    @property
    def kernel_nodes(self) -> int: ...
    def close(self) -> None: ...

# config: kf_layer_config's fields by name (kv_format as its code); weights: LAYER_FIELDS
# entries per layer, None for an absent tensor.
def layer_graph_create(
    config: dict[str, Any],
    weights: list[Optional[ArrayLike]],
    hidden: ArrayLike,
    output: ArrayLike,
    positions: ArrayLike,
    cache_seqlens: ArrayLike,
    block_table: ArrayLike,
    cos_sin: ArrayLike,
    error_buffer: Optional[ArrayLike],
    batch: int,
    num_workers: int,
    workspace: Optional[ArrayLike],
) -> _LayerGraph: ...
def layer_workspace_size(
    config: dict[str, Any], batch: int, num_workers: int, device_id: int
) -> int: ...

KV_BF16: int
KV_FP16: int
KV_FP8_E4M3: int
KV_INT8: int
HEAD_DIM: int
LATENT_DIM: int
ROPE_DIM: int
MAX_HEADS: int
MAX_SQ: int
BYTES_PER_TOKEN_8BIT: int
ERROR_BUFFER_LEN: int
DEVERR_SEQLEN_RANGE: int
DEVERR_PAGE_RANGE: int
DEVERR_METADATA: int
DEVERR_SLOT_RANGE: int
LAYER_MAX_BATCH: int
LAYER_FIELDS: tuple[str, ...]
