"""The binding's error messages in the Python API's terms.

The C API words its messages for C callers: its entry points (kf_mla_metadata_for_format), its
enumerators (KF_KV_BF16) and its parameter names (dst_cache). A Python caller knows
get_mla_metadata, 'bf16' and dst. Every call into kernelflow._C goes through `call`, which
rewrites the message of a failure with TERMS and raises the same exception type.
"""

from __future__ import annotations

import re

# C name -> the name a Python caller uses. Whole words only: "kf_mla_metadata" does not touch
# "kf_mla_metadata_size", and a rewritten word is not rewritten again.
TERMS = {
    # entry points (the library's messages and the binding's fallback when there is none)
    "kf_mla_metadata_for_format": "get_mla_metadata",
    "kf_mla_metadata": "get_mla_metadata",
    "kf_mla_metadata_size": "metadata_size",
    "kf_mla_workspace_size": "workspace_size",
    "kf_mla_default_num_workers_for_format": "default_num_workers",
    "kf_mla_default_num_workers_for_batch": "default_num_workers",
    "kf_mla_default_num_workers": "default_num_workers",
    "kf_mla_decode": "mla_decode",
    "kf_cache_append": "cache_append",
    "kf_cache_convert": "convert_cache",
    "kf_cache_bytes_per_token": "cache_bytes_per_token",
    "kf_cache_bytes_per_page": "cache_bytes_per_page",
    "kf_linear": "linear",
    "kf_linear_workspace_size": "linear_workspace_size",
    # the operation names of CUDA errors
    "mla_metadata": "get_mla_metadata",
    "cache_convert": "convert_cache",
    # cache formats
    "KF_KV_BF16": "'bf16'",
    "KF_KV_FP16": "'fp16'",
    "KF_KV_FP8_E4M3": "'fp8_e4m3'",
    "KF_KV_INT8": "'int8'",
    # parameters named differently in Python
    "src_cache": "src",
    "dst_cache": "dst",
    "dst_format": "kv_format",
    "device_id": "device",
}

_WORD = re.compile(r"\b(" + "|".join(sorted(map(re.escape, TERMS), key=len, reverse=True)) + r")\b")

_TRANSLATED = (ValueError, TypeError, NotImplementedError, RuntimeError)


def python_terms(message: str) -> str:
    """`message` with every C name of TERMS replaced by its Python name."""
    return _WORD.sub(lambda m: TERMS[m.group(1)], message)


def call(fn, *args):
    """fn(*args) for a function of kernelflow._C; its errors come back in Python terms."""
    try:
        return fn(*args)
    except _TRANSLATED as e:
        raise type(e)(python_terms(str(e))) from None
