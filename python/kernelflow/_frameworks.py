"""Which framework an array comes from, and how to allocate in it, export it and pick its stream.

A framework module is only touched when an argument's type comes from it, so it is already
imported by the caller: nothing here imports torch, CuPy or JAX on its own.
"""

from __future__ import annotations

import sys

import numpy as np

NUMPY = "numpy"
TORCH = "torch"
CUPY = "cupy"
JAX = "jax"

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13
STREAM_MAX = 2**64 - 1  # a cudaStream_t as an unsigned pointer-sized int

_JAX_IMMUTABLE = (
    "JAX arrays are immutable: pass a NumPy, PyTorch or CuPy array, or use kernelflow.jax, "
    "whose cache_append updates the cache through input/output aliasing"
)


# The framework of each array type seen so far: every answer of _framework_of depends on the type
# alone, so it is looked up once per type.
_FRAMEWORK_OF_TYPE: dict[type, str] = {}


def framework(x, name: str) -> str:
    """The framework of array `x`; TypeError naming the argument if `x` is no array."""
    try:
        return _FRAMEWORK_OF_TYPE[type(x)]
    except KeyError:
        pass
    found = _framework_of(x, name)
    if found != "dlpack":  # other producers are recognized by their instance's attributes
        _FRAMEWORK_OF_TYPE[type(x)] = found
    return found


def _framework_of(x, name: str) -> str:
    root = type(x).__module__.partition(".")[0]
    if root == "numpy" and isinstance(x, np.ndarray):
        return NUMPY
    if root == "torch" and isinstance(x, sys.modules["torch"].Tensor):
        return TORCH
    if root == "cupy" and isinstance(x, sys.modules["cupy"].ndarray):
        return CUPY
    if root in ("jax", "jaxlib"):
        jax = sys.modules.get("jax")
        if jax is not None and isinstance(x, jax.core.Tracer):
            raise TypeError(
                f"{name}: kernelflow cannot be called on traced JAX values (inside jax.jit, "
                "grad or vmap); use kernelflow.jax, whose functions run under jax.jit"
            )
        return JAX
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__") and hasattr(x, "shape"):
        return "dlpack"  # any other array-API object: usable as an input, outputs go to NumPy
    raise TypeError(
        f"{name}: expected an array (NumPy, PyTorch, CuPy, JAX or any object with __dlpack__), "
        f"got {type(x).__module__}.{type(x).__qualname__}"
    )


def device(x) -> tuple[int, int]:
    """(DLPack device type, device id) of an array."""
    dev_type, dev_id = x.__dlpack_device__()
    return int(dev_type), int(dev_id)


def is_cuda(x) -> bool:
    return device(x)[0] in (KDL_CUDA, KDL_CUDA_MANAGED)


_DTYPE_NAMES: dict = {}


def dtype_name(x) -> str:
    """'bfloat16', 'float16', 'uint8', ... for any framework's dtype ('torch.bfloat16' too)."""
    dtype = x.dtype
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):  # TypeError: a dtype object that cannot be hashed
        name = str(dtype).rpartition(".")[2]
    try:
        _DTYPE_NAMES[dtype] = name
    except TypeError:
        pass
    return name


def host_view(x):
    """A NumPy view of an array in host memory, or None for one on a device (or one NumPy
    cannot view)."""
    if isinstance(x, np.ndarray):
        return x
    if device(x)[0] != KDL_CPU:
        return None
    try:
        return np.from_dlpack(x)
    except (TypeError, ValueError, RuntimeError, BufferError):
        return None


def check_home(x, fw: str, name: str) -> None:
    """Raise where results cannot be made in the framework of `x`."""
    if fw == JAX and is_cuda(x):
        raise NotImplementedError(
            f"{name}: the plain API does not take JAX arrays on a GPU; use kernelflow.jax (XLA "
            "FFI, GPU and CPU, under jax.jit), or convert with torch.from_dlpack(x) or "
            "cupy.from_dlpack(x)"
        )


def check_writable(x, name: str) -> None:
    """Raise ValueError for an array that cannot receive results."""
    if framework(x, name) == JAX:
        raise ValueError(f"{name}: {_JAX_IMMUTABLE}")


def empty(like, fw: str, shape, dtype: str | None = None):
    """An uninitialized array of `shape` on the device of `like`, in its framework.

    dtype is a NumPy-style name ('int32', 'float32', 'uint8'), or None for the dtype of `like`.
    JAX and other DLPack producers get NumPy arrays (CPU only): the caller converts at the end.
    """
    shape = tuple(int(s) for s in shape)
    if fw == TORCH:
        torch = sys.modules["torch"]
        dt = like.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=like.device)
    if fw == CUPY:
        cupy = sys.modules["cupy"]
        dt = like.dtype if dtype is None else np.dtype(dtype)
        with like.device:
            return cupy.empty(shape, dtype=dt)
    if fw != NUMPY and is_cuda(like):
        raise NotImplementedError(
            "results for a GPU array of this framework cannot be allocated: pass out=, lse= "
            "and workspace= as PyTorch or CuPy arrays"
        )
    dt = np.dtype(like.dtype) if dtype is None else np.dtype(dtype)
    return np.empty(shape, dtype=dt)


def _data_ptr(x, fw: str) -> int:
    if fw == TORCH:
        return int(x.data_ptr())
    if fw == CUPY:
        return int(x.data.ptr)
    return int(x.__array_interface__["data"][0])


def empty_bytes(like, fw: str, nbytes: int, align: int = 256):
    """uint8[nbytes] starting on an `align`-byte boundary (the workspace rule of the C API):
    NumPy and PyTorch CPU allocations only promise 16 or 64 bytes."""
    raw = empty(like, fw, (nbytes + align,), "uint8")
    offset = (-_data_ptr(raw, fw)) % align
    return raw[offset : offset + nbytes]


def zeros_bytes(like, fw: str, nbytes: int, align: int = 256):
    """empty_bytes, zero-filled."""
    raw = empty_bytes(like, fw, nbytes, align)
    if fw == TORCH:
        raw.zero_()
    elif fw == CUPY:
        with like.device:
            raw.fill(0)
    else:
        raw[:] = 0
    return raw


def error_buffer(like, fw: str):
    """A fresh device error buffer int32[4] = [0, -1, 0, 0] next to `like`."""
    init = np.array([0, -1, 0, 0], dtype=np.int32)
    if fw == TORCH:
        return sys.modules["torch"].tensor(init, device=like.device)
    if fw == CUPY:
        with like.device:
            return sys.modules["cupy"].asarray(init)
    return init


def to_home(x, fw: str):
    """Convert a result made in NumPy back to the caller's framework (JAX)."""
    if fw == JAX:
        return sys.modules["jax"].numpy.asarray(x)
    return x


def export(x, fw: str | None = None):
    """What to hand to the binding for array `x`.

    PyTorch and CuPy GPU arrays go as DLPack capsules made without stream synchronization:
    their __dlpack__ would otherwise order the legacy default stream after the current one,
    which breaks CUDA graph capture. The library runs on the stream it is given.
    """
    if fw is None:
        fw = framework(x, "array")
    if fw == TORCH:
        return _torch().capsule(x)
    if fw == CUPY:
        return x.toDlpack()
    return x


def stream_handle(stream, like, fw: str) -> int:
    """The CUDA stream as an int: an explicit one, else the current stream of the framework."""
    if stream is None:
        if fw == TORCH:
            return _torch().current_stream(like)
        if fw == CUPY:
            cupy = sys.modules["cupy"]
            with like.device:
                return int(cupy.cuda.get_current_stream().ptr)
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream: expected an int handle or a stream object, got bool")
    if isinstance(stream, int):
        if not 0 <= stream <= STREAM_MAX:
            raise ValueError(f"stream: expected a handle in 0..2**64 - 1, got {stream}")
        return stream
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return handle
    raise TypeError(
        f"stream: expected an int handle, a torch.cuda.Stream or a cupy.cuda.Stream, got "
        f"{type(stream).__module__}.{type(stream).__qualname__}"
    )


class TorchKit:
    """The pieces of torch a call uses, looked up once: the tensor type, the DLPack capsule
    maker (torch's __dlpack__ is Python code that also orders streams, which the library does
    not want) and the current stream as an int (torch.cuda.current_stream builds a Stream
    object on every call)."""

    def __init__(self, torch):
        self.tensor = torch.Tensor
        self.capsule = torch._C._to_dlpack
        self.uint8 = torch.uint8
        self.float32 = torch.float32
        self.int32 = torch.int32
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._torch = torch

    def current_stream(self, like) -> int:
        """The current stream of the device of tensor `like` (0 off CUDA). It is looked up on
        every call: torch.cuda.stream(...) changes it, a CUDA graph capture too."""
        if not like.is_cuda:
            return 0
        if self._raw_stream is not None:
            return self._raw_stream(like.get_device())
        return int(self._torch.cuda.current_stream(like.device).cuda_stream)


_TORCH_KIT: TorchKit | None = None


def _torch() -> TorchKit:
    """The TorchKit (torch is imported: a torch tensor was seen)."""
    global _TORCH_KIT
    if _TORCH_KIT is None:
        _TORCH_KIT = TorchKit(sys.modules["torch"])
    return _TORCH_KIT


def torch_kit(x) -> TorchKit | None:
    """The TorchKit when `x` is a torch.Tensor (exactly: subclasses such as parameters and the
    tensors of torch.compile's tracing take the general path), None otherwise."""
    kit = _TORCH_KIT
    if kit is None:
        torch = sys.modules.get("torch")
        if torch is None or type(x) is not torch.Tensor:
            return None
        kit = _torch()
    return kit if type(x) is kit.tensor else None
