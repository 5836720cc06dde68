"""The fused decode layer: one decoding step of L MLA attention layers (DeepSeek-V2-Lite, V2, V3;
docs/spec.md section 3) as one object, replayed as one CUDA graph on a GPU and run in fp32 by
the CPU backend on CPU arrays.

    cfg = kf.LayerConfig.deepseek_v2_lite(max_batch=8, max_pages_per_seq=64, max_position=4096)
    layers = [{"w_q": ..., "w_kv_a": ..., "kv_a_norm": ..., "w_kv_b": ..., "w_o": ...,
               "kv_cache": ...} for each layer]
    graph = kf.DecodeGraph(cfg, layers, hidden=hidden, output=output, positions=positions,
                           cache_seqlens=cache_seqlens, block_table=block_table, cos_sin=cos_sin)
    # each step: write hidden, positions, cache_seqlens, block_table in place, then
    graph.launch()

Weights are bf16 [out_features, in_features] as checkpoints store them (a torch.nn.Linear's
weight); with q_lora_rank > 0 a layer has "w_q_a", "q_a_norm" and "w_q_b" instead of "w_q".
The static buffers (shapes from the config):

    hidden, output  bfloat16 [max_batch, hidden_size]: layer 0's input, the last layer's output
    positions       int32 [max_batch]: each new token's RoPE position
    cache_seqlens   int32 [max_batch]: lengths after this step's append (the new cache row goes
                    to position cache_seqlens[b] - 1)
    block_table     int32 [max_batch, max_pages_per_seq]
    cos_sin         float32 [max_position, 2, 32]: cos then sin of each rotary pair (so YaRN or
                    any other scaling stays with the caller)

Their contents may change between launches, never their memory. Bad values written there are
made safe on the device and flagged in error_buffer (see new_error_buffer).
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import _C
from . import _frameworks as fw
from ._errors import call
from .mla import KV_FORMATS, _device_id

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT_FIELDS = ("hidden_size", "num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "page_size", "max_batch", "max_pages_per_seq",
               "max_position")
_FLOAT_FIELDS = ("rms_norm_eps", "softmax_scale")


@dataclass(frozen=True, kw_only=True)
class LayerConfig:
    """The dimensions of a layer graph (kf_layer_config). The library checks every value when a
    graph is made or a workspace size asked for; kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim and v_head_dim are DeepSeek's and the only ones supported."""

    hidden_size: int
    num_heads: int  # query heads on this device (a tensor-parallel shard)
    softmax_scale: float  # explicit: 0.114721 (V2-Lite), 0.135234 (V3)
    max_pages_per_seq: int  # columns of block_table
    max_position: int  # rows of the cos/sin table
    q_lora_rank: int = 0  # 0: no query compression (V2-Lite); 1536 for V2/V3
    kv_format: str = "bf16"  # 'bf16', 'fp8_e4m3' or 'int8'
    page_size: int = 64
    max_batch: int = 64  # rows of the static buffers, 1..128
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"config.{name}: expected an int, got {type(value).__name__}")
            if not _INT32_MIN <= value <= _INT32_MAX:
                raise ValueError(f"config.{name}: expected a 32-bit int, got {value}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"config.{name}: expected a float, got {type(value).__name__}")
        if not isinstance(self.kv_format, str):
            raise TypeError(f"config.kv_format: expected a str, got {type(self.kv_format).__name__}")
        if self.kv_format not in KV_FORMATS:
            raise ValueError(f"config.kv_format: expected one of {', '.join(KV_FORMATS)}, got "
                             f"{self.kv_format!r}")

    @classmethod
    def deepseek_v2_lite(cls, **kw) -> LayerConfig:
        """DeepSeek-V2-Lite: hidden 2048, 16 heads, no query compression; pass at least
        max_pages_per_seq and max_position."""
        return cls(**{"hidden_size": 2048, "num_heads": 16, "q_lora_rank": 0,
                      "softmax_scale": 0.114721, **kw})

    @classmethod
    def deepseek_v3(cls, num_heads: int = 128, **kw) -> LayerConfig:
        """DeepSeek-V3: hidden 7168, q_lora_rank 1536; num_heads is the heads on this device (16
        for an 8-way tensor-parallel shard); pass at least max_pages_per_seq and max_position."""
        return cls(**{"hidden_size": 7168, "num_heads": num_heads, "q_lora_rank": 1536,
                      "softmax_scale": 0.135234, **kw})

    def _c_fields(self) -> dict:
        fields = dataclasses.asdict(self)
        fields["kv_format"] = KV_FORMATS[self.kv_format]
        return fields


# ---- messages in Python terms --------------------------------------------------------------

_LAYER_TERMS = (
    (re.compile(r"\blayers\[(\d+)\]\.(\w+)"), r'layers[\1]["\2"]'),
    (re.compile(r"\bio\.(\w+)"), r"\1"),
    (re.compile(r"\b(kf_)?layer_graph_create\b"), "DecodeGraph"),
    (re.compile(r"\b(kf_)?layer_graph_launch\b"), "DecodeGraph.launch"),
    (re.compile(r"\bkf_layer_graph_kernel_nodes\b"), "DecodeGraph.kernel_nodes"),
    (re.compile(r"\bkf_layer_workspace_size\b"), "layer_workspace_size"),
    (re.compile(r"\bNULL\b"), "None"),
)


def _layer_terms(message: str) -> str:
    for pattern, repl in _LAYER_TERMS:
        message = pattern.sub(repl, message)
    return message


def _call(fn, *args):
    """call() of _errors, with the layer's C names (layers[3].w_kv_b, io.positions) rewritten
    as a Python caller spells them (layers[3]["w_kv_b"], positions)."""
    try:
        return call(fn, *args)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as e:
        raise type(e)(_layer_terms(str(e))) from None


def _c_int(value, name: str) -> int:
    """An int the binding can take (the library checks the range it needs)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{name}: expected a 32-bit int, got {value}")
    return int(value)


def _check_config(config) -> LayerConfig:
    if not isinstance(config, LayerConfig):
        raise TypeError(f"config: expected a kernelflow.LayerConfig, got {type(config).__name__}")
    return config


def layer_workspace_size(config: LayerConfig, batch: int, num_workers=None, *, device) -> int:
    """Bytes of workspace a DecodeGraph of this config needs for `batch` requests on `device`
    ('cpu' or -1: 0 bytes; 'cuda:N', an int ordinal, a torch.device, or an array living there);
    num_workers None means the device's default decode worker count."""
    config = _check_config(config)
    workers = 0 if num_workers is None else _c_int(num_workers, "num_workers")
    return _call(_C.layer_workspace_size, config._c_fields(), _c_int(batch, "batch"), workers,
                 _device_id(device))


def _flat_weights(layers) -> list:
    """The layers' arrays in the binding's order (LAYER_FIELDS per layer, None where absent)."""
    if isinstance(layers, (str, bytes, Mapping)) or not isinstance(layers, Sequence):
        raise TypeError(f"layers: expected a list of dicts (one per layer), got "
                        f"{type(layers).__name__}")
    if not layers:
        raise ValueError("layers: expected at least one layer, got an empty list")
    fields = _C.LAYER_FIELDS
    flat = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, Mapping):
            raise TypeError(f"layers[{i}]: expected a dict of arrays, got {type(layer).__name__}")
        unknown = [key for key in layer if key not in fields]
        if unknown:
            raise ValueError(f"layers[{i}]: unexpected key {unknown[0]!r} (the keys are "
                             f"{', '.join(fields)})")
        for key in fields:
            arr = layer.get(key)
            if arr is not None:
                name = f'layers[{i}]["{key}"]'
                fw.framework(arr, name)
                if key == "kv_cache":
                    fw.check_writable(arr, name)
            flat.append(arr)
    return flat


# Open graphs by id: the torch op kernelflow::launch_layer_graph names its graph by this int.
_GRAPHS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_NEXT_ID = itertools.count(1)


def graph_by_id(graph_id: int) -> DecodeGraph:
    """The open DecodeGraph of this id; ValueError when it was closed or collected."""
    graph = _GRAPHS.get(graph_id)
    if graph is None:
        raise ValueError(f"graph: no open DecodeGraph has id {graph_id} (closed, or no longer "
                         "referenced)")
    return graph


class DecodeGraph:
    """L layers of one decoding step, built once and launched every step (kf_layer_graph).

    layers is a list of dicts, one per layer, of any DLPack arrays (PyTorch, CuPy, NumPy) on the
    device of `hidden`. batch (default config.max_batch) is how many rows of the static buffers
    the graph computes. The workspace (uint8, layer_workspace_size bytes) is allocated in the
    framework of `hidden` when not given. error_buffer (int32[4], see new_error_buffer) receives
    flags for bad positions, lengths and block_table entries. The graph reads and writes the
    arrays it was given, which it keeps alive until close().

    Its static buffers stay reachable as attributes: hidden, output, positions, cache_seqlens,
    block_table, cos_sin, kv_caches (one per layer), error_buffer and workspace (None when
    absent); id names it to the torch op kernelflow::launch_layer_graph
    (kernelflow.torch_ops.launch_layer_graph).
    """

    def __init__(self, config: LayerConfig, layers, *, hidden, output, positions, cache_seqlens,
                 block_table, cos_sin, batch=None, num_workers=None, workspace=None,
                 error_buffer=None):
        config = _check_config(config)
        flat = _flat_weights(layers)
        home = fw.framework(hidden, "hidden")
        fw.check_home(hidden, home, "hidden")
        io = {"output": output, "positions": positions, "cache_seqlens": cache_seqlens,
              "block_table": block_table, "cos_sin": cos_sin}
        for name, arr in io.items():
            fw.framework(arr, name)
        fw.check_writable(output, "output")
        for arr, name in ((error_buffer, "error_buffer"), (workspace, "workspace")):
            if arr is not None:
                fw.framework(arr, name)
                fw.check_writable(arr, name)
        batch = config.max_batch if batch is None else _c_int(batch, "batch")
        workers = 0 if num_workers is None else _c_int(num_workers, "num_workers")
        if workspace is None:
            nbytes = layer_workspace_size(config, batch, workers, device=hidden)
            workspace = fw.empty_bytes(hidden, home, nbytes) if nbytes else None
        export = fw.export
        self._graph = _call(
            _C.layer_graph_create, config._c_fields(),
            [None if a is None else export(a) for a in flat], export(hidden, home),
            export(output), export(positions), export(cache_seqlens), export(block_table),
            export(cos_sin), None if error_buffer is None else export(error_buffer), batch,
            workers, None if workspace is None else export(workspace))
        self.config = config
        self.batch = batch
        self.num_layers = len(flat) // len(_C.LAYER_FIELDS)
        self.workspace = workspace
        self.error_buffer = error_buffer
        self.hidden, self.output, self.positions = hidden, output, positions
        self.cache_seqlens, self.block_table, self.cos_sin = cache_seqlens, block_table, cos_sin
        self.kv_caches = [layer.get("kv_cache") for layer in layers]
        self._home = home
        self.id = next(_NEXT_ID)
        _GRAPHS[self.id] = self
        # The graph reads and writes these arrays' memory: they live as long as it does.
        self._arrays = (list(layers), flat, io, hidden, workspace, error_buffer)

    def _open(self):
        if self._graph is None:
            raise ValueError("DecodeGraph: closed (close() was called)")
        return self._graph

    def launch(self, stream=None) -> None:
        """One step of every layer: on `stream` for CUDA arrays (default: the current stream of
        their framework), or run now on the CPU."""
        graph = self._open()
        _call(graph.launch, fw.stream_handle(stream, self.hidden, self._home))

    @property
    def kernel_nodes(self) -> int:
        """Kernel nodes of the CUDA graph (0 on the CPU backend)."""
        return _call(lambda: self._open().kernel_nodes)

    def close(self) -> None:
        """Destroy the graph (idempotent). The arrays stay referenced by the attributes that
        name them (hidden, kv_caches, ...) as long as this object lives."""
        if self._graph is not None:
            self._graph.close()
            self._graph = None
            self._arrays = ()
            _GRAPHS.pop(self.id, None)

    def __enter__(self) -> DecodeGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
