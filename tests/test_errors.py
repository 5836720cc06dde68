"""Bad arguments raise ValueError / TypeError whose message names the argument; nothing runs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kernelflow as kf
from inputs import HEAD, LATENT, aligned_empty, make_case


@pytest.fixture
def case(rng):
    return make_case(rng, [100, 30], 16, 1, 16, np.float16)


def call(case, **override):
    args = dict(q=case.q, kv_cache=case.cache, block_table=case.block_table,
                cache_seqlens=case.seqlens, metadata=None, softmax_scale=case.scale)
    args.update(override)
    if args["metadata"] is None:
        args["metadata"] = kf.get_mla_metadata(case.seqlens, case.h_q, case.s_q, num_workers=4)
    return kf.mla_decode(**args)


def test_valid_call_passes(case):
    out, lse = call(case)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("name,make,match", [
    ("q", lambda c: c.q.astype(np.float32), "q"),
    ("q", lambda c: c.q[..., :575], "q"),
    ("q", lambda c: c.q[:, :, :, None, :], "q"),
    ("q", lambda c: np.zeros((2, 1, 129, HEAD), np.float16), "h_q|q"),
    ("q", lambda c: np.zeros((2, 17, 16, HEAD), np.float16), "s_q|q"),
    ("q", lambda c: np.asfortranarray(c.q), "q"),
    ("q", lambda c: c.q[:, :, ::-1], "q"),  # negative strides
    ("kv_cache", lambda c: c.cache[..., :575], "kv_cache"),
    ("kv_cache", lambda c: np.zeros((4, 48, HEAD), np.float16), "page|kv_cache"),
    ("block_table", lambda c: c.block_table.astype(np.int64), "block_table"),
    ("block_table", lambda c: c.block_table[:1], "block_table"),
    ("block_table", lambda c: c.block_table[:, 0], "block_table"),
    ("cache_seqlens", lambda c: c.seqlens.astype(np.int64), "cache_seqlens"),
    ("cache_seqlens", lambda c: np.array([100, 30, 5], np.int32), "cache_seqlens"),
    ("metadata", lambda c: np.zeros(7, np.int32), "metadata"),
    ("metadata", lambda c: kf.get_mla_metadata(c.seqlens, 16, 1, num_workers=4)
     .astype(np.int64), "metadata"),
])
def test_bad_tensor_raises_value_error(case, name, make, match):
    assert re.search(match, raised(ValueError, call, case, **{name: make(case)}))


def test_cache_dtype_must_match_q(case):
    with pytest.raises(ValueError, match="kv_cache|q"):
        call(case, kv_cache=case.cache.astype(np.float32))
    with pytest.raises(ValueError, match="kv_format"):
        call(case, kv_format="bf16")  # fp16 cache declared bf16


@pytest.mark.parametrize("name,make,match", [
    ("out", lambda c: np.zeros((2, 1, 16, LATENT + 1), np.float16), "out"),
    ("out", lambda c: np.zeros((2, 1, 16, LATENT), np.float32), "out"),
    ("out", lambda c: np.zeros((3, 1, 16, LATENT), np.float16), "out"),
    ("lse", lambda c: np.zeros((2, 16, 1), np.float16), "lse"),
    ("lse", lambda c: np.zeros((2, 1, 16), np.float32), "lse"),
    ("workspace", lambda c: np.zeros(64, np.uint8), "workspace"),
])
def test_bad_output_raises_value_error(case, name, make, match):
    assert re.search(match, raised(ValueError, call, case, **{name: make(case)}))


def test_wrong_metadata_size_is_named(case):
    meta = kf.get_mla_metadata(case.seqlens, 16, 1, num_workers=4)
    with pytest.raises(ValueError, match="metadata"):
        call(case, metadata=meta[:-1])
    # The C API's own checks, with a workspace given so Python does not look at the size: a
    # length that fits no worker count, and one that fits 5 workers for metadata made for 4.
    ws = kf.new_workspace(case.q, kf.get_mla_metadata(case.seqlens, 16, 1, num_workers=5))
    with pytest.raises(ValueError, match="metadata"):
        call(case, metadata=meta[:-1], workspace=ws)
    with pytest.raises(ValueError, match="metadata"):
        call(case, metadata=np.concatenate([meta, np.zeros(8, np.int32)]), workspace=ws)


def test_metadata_for_other_shape_is_caught(case):
    """Metadata made for another h_q: the CPU backend reads its header and refuses."""
    meta = kf.get_mla_metadata(case.seqlens, 32, 1, num_workers=4)
    with pytest.raises(ValueError, match="metadata"):
        call(case, metadata=meta)
    stale = kf.get_mla_metadata(case.seqlens + 64, 16, 1, num_workers=4)
    with pytest.raises(ValueError, match="metadata"):
        call(case, metadata=stale)


def test_bad_contents_on_cpu(case):
    """The CPU backend checks contents before running: lengths past the block table, pages
    outside the cache, negative lengths."""
    too_long = case.seqlens.copy()
    too_long[1] = case.block_table.shape[1] * 16 + 1
    with pytest.raises(ValueError, match="cache_seqlens"):
        call(case, cache_seqlens=too_long,
             metadata=kf.get_mla_metadata(too_long, 16, 1, num_workers=4))
    bad_table = case.block_table.copy()
    bad_table[0, 0] = case.cache.shape[0]
    with pytest.raises(ValueError, match="block_table"):
        call(case, block_table=bad_table)
    with pytest.raises(ValueError, match="cache_seqlens"):
        kf.get_mla_metadata(np.array([5, -1], np.int32), 16)


@pytest.mark.parametrize("bad,exc,match", [
    (None, TypeError, "softmax_scale"),
    ("0.1", TypeError, "softmax_scale"),
    (True, TypeError, "softmax_scale"),
])
def test_softmax_scale_type(case, bad, exc, match):
    with pytest.raises(exc, match=match):
        call(case, softmax_scale=bad)


def test_softmax_scale_has_no_default(case):
    meta = kf.get_mla_metadata(case.seqlens, 16)
    with pytest.raises(TypeError, match="softmax_scale"):
        kf.mla_decode(case.q, case.cache, case.block_table, case.seqlens, meta)


def test_kv_format_errors(case):
    with pytest.raises(ValueError, match="kv_format"):
        call(case, kv_format="fp32")
    with pytest.raises(TypeError, match="kv_format"):
        call(case, kv_format=1)
    u8 = np.zeros((4, 16, 644), np.uint8)
    with pytest.raises(ValueError, match="kv_format"):
        call(case, kv_cache=u8)
    with pytest.raises(ValueError, match="kv_format"):
        kf.cache_bytes_per_page("e5m2", 64)
    with pytest.raises(ValueError, match="page"):
        kf.cache_bytes_per_page("int8", 8)  # 8-bit pages are multiples of 16
    with pytest.raises(ValueError, match="page"):
        kf.cache_bytes_per_page("bf16", 48)


@pytest.mark.parametrize("name", ["q", "kv_cache", "block_table", "cache_seqlens", "metadata",
                                  "out", "lse", "workspace", "error_buffer"])
def test_non_arrays_raise_type_error(case, name):
    with pytest.raises(TypeError, match=name):
        call(case, **{name: [[1, 2], [3, 4]]})


def test_read_only_output_raises(case):
    out = np.zeros((2, 1, 16, LATENT), np.float16)
    out.flags.writeable = False
    with pytest.raises(TypeError, match="out"):
        call(case, out=out)


def test_scalar_types(case):
    with pytest.raises(TypeError, match="num_heads_q"):
        kf.get_mla_metadata(case.seqlens, 16.0)
    with pytest.raises(TypeError, match="num_workers"):
        kf.get_mla_metadata(case.seqlens, 16, num_workers=2.5)
    with pytest.raises(ValueError, match="num_workers"):
        kf.get_mla_metadata(case.seqlens, 16, num_workers=0)
    with pytest.raises(ValueError, match="h_q|num_heads_q"):
        kf.get_mla_metadata(case.seqlens, 0)
    with pytest.raises(ValueError, match="cache_seqlens"):
        kf.get_mla_metadata(case.seqlens[None, :], 16)
    with pytest.raises(TypeError, match="stream"):
        call(case, stream="default")
    with pytest.raises(ValueError, match="device"):
        kf.default_num_workers("tpu", 16)
    with pytest.raises(ValueError, match="kv_format"):
        kf.default_num_workers("cpu", 16, 1, kv_format="fp4")


def test_cache_append_errors(rng):
    cache = np.zeros((4, 16, HEAD), np.float16)
    kv = rng.standard_normal((3, HEAD)).astype(np.float16)
    slots = np.array([0, 1, 2], np.int64)
    kf.cache_append(kv, cache, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        kf.cache_append(kv, cache, slots.astype(np.int32))
    with pytest.raises(ValueError, match="slot_mapping"):
        kf.cache_append(kv, cache, slots[:2])
    with pytest.raises(ValueError, match="kv"):
        kf.cache_append(kv[:, :575], cache, slots)
    with pytest.raises(ValueError, match="kv"):
        kf.cache_append(kv.astype(np.float32), cache, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        kf.cache_append(kv, cache, np.array([0, 64, 1], np.int64))  # 64 slots in the cache
    with pytest.raises(TypeError, match="kv_cache"):
        kf.cache_append(kv, "cache", slots)
    with pytest.raises(TypeError, match="slot_mapping"):
        kf.cache_append(kv, cache, [0, 1, 2])
    ro = cache.copy()
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="kv_cache"):
        kf.cache_append(kv, ro, slots)


def test_errors_do_not_write_outputs(case):
    out = np.full((2, 1, 16, LATENT), 3.0, np.float16)
    with pytest.raises(ValueError):
        call(case, out=out, block_table=case.block_table.astype(np.int64))
    assert (out == 3.0).all()


def test_last_error_is_cleared_by_success(case):
    with pytest.raises(ValueError):
        call(case, q=case.q.astype(np.float32))
    assert "q" in kf._C.last_error()
    call(case)
    assert kf._C.last_error() == ""


# ---- messages in Python terms ------------------------------------------------------------------

C_NAMES = re.compile(r"\bkf_\w+|\bKF_\w+|\b(src_cache|dst_cache|dst_format|device_id)\b")


def raised(exc, fn, *args, **kwargs) -> str:
    """The message of the `exc` that fn raises, checked free of the C API's names."""
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert not C_NAMES.search(msg), f"a C name in a Python error: {msg}"
    return msg


def test_metadata_messages_name_get_mla_metadata(case):
    stale = kf.get_mla_metadata(case.seqlens + 64, 16, 1, num_workers=4)
    msg = raised(ValueError, call, case, metadata=stale)
    assert msg.startswith("metadata:") and "get_mla_metadata" in msg
    meta = kf.get_mla_metadata(case.seqlens, 16, 1, num_workers=4)
    ws = kf.new_workspace(case.q, meta)
    msg = raised(ValueError, call, case, metadata=np.zeros_like(meta), workspace=ws)
    assert msg.startswith("metadata:") and "made by get_mla_metadata" in msg
    msg = raised(ValueError, call, case, metadata=meta[:-1], workspace=ws)
    assert msg.startswith("metadata:") and "metadata_size(batch=2" in msg


def test_workspace_size_message_names_workspace_size(case):
    msg = raised(ValueError, call, case, workspace=np.zeros(64, np.uint8))
    assert msg.startswith("workspace:") and "workspace_size(batch=2, h_q=16" in msg


def test_formats_are_named_as_in_python(case):
    msg = raised(ValueError, call, case, kv_format="bf16")  # an fp16 cache declared bf16
    assert msg.startswith("kv_format: 'bf16'"), msg
    msg = raised(ValueError, kf.cache_bytes_per_page, "int8", 8)
    assert "'int8'" in msg and msg.startswith("page_size:"), msg
    msg = raised(ValueError, call, case, kv_cache=np.zeros((4, 16, 644), np.int8),
                 kv_format="fp8_e4m3")
    assert msg.startswith("kv_cache:") and "'fp8_e4m3'" in msg, msg


def test_convert_cache_names_src_and_dst():
    src = np.zeros((3, 16, HEAD), np.float16)
    msg = raised(ValueError, kf.convert_cache, src, np.zeros((3, 16, 644), np.int8),
                 kv_format="int8")
    assert msg.startswith("dst: expected dtype uint8 for kv_format 'int8'"), msg
    msg = raised(ValueError, kf.convert_cache, src, np.zeros((2, 16, 644), np.uint8),
                 kv_format="int8")
    assert msg.startswith("dst:") and "(of src)" in msg, msg
    msg = raised(ValueError, kf.convert_cache, np.zeros((3, 16, HEAD), np.float32),
                 kv_format="int8")
    assert msg.startswith("src:"), msg
    assert raised(TypeError, kf.convert_cache, src, "dst", kv_format="int8").startswith("dst:")
    assert raised(TypeError, kf.convert_cache, [1.0], kv_format="int8").startswith("src:")


def test_q_batch_is_checked_against_cache_seqlens(case):
    """A q for another batch is named as such, not blamed on the metadata's length."""
    msg = raised(ValueError, call, case, q=case.q[:1])
    assert msg.startswith("q: expected shape[0] (batch) = 2") and "cache_seqlens" in msg, msg


def test_q_heads_and_s_q_are_checked_against_the_metadata(case):
    """q laid out [b, h_q, s_q, 576] by mistake: the message names q and its layout, and what
    the metadata was made for."""
    swapped = np.ascontiguousarray(case.q.transpose(0, 2, 1, 3))  # [2, 16, 1, 576]
    msg = raised(ValueError, call, case, q=swapped)
    assert msg.startswith("q: shape (2, 16, 1, 576) has s_q = 16, h_q = 1"), msg
    assert "[b, s_q, h_q, 576]" in msg and "num_heads_q = 16, s_q = 1" in msg, msg
    msg = raised(ValueError, kf.mla_decode, swapped, case.cache, case.block_table,
                 case.seqlens, kf.get_mla_metadata(case.seqlens, 1, 16), case.scale,
                 out=np.zeros((2, 1, 16, LATENT), np.float16))
    assert msg.startswith("out:"), msg  # metadata made for the swapped shape: out is checked


@pytest.mark.parametrize("fn,name", [
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, 1, num_workers=2**31), "num_workers"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, 1, num_workers=2**40), "num_workers"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, 1, num_workers=100_000), "num_workers"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, 1, num_workers=-3), "num_workers"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 2**31, 1), "num_heads_q"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 129, 1), "num_heads_q"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, 2**31), "s_q"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, 17), "s_q"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, 0), "s_q"),
    (lambda c: kf.get_mla_metadata(c.seqlens[:0], 16, 1), "cache_seqlens"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, stream=2**64), "stream"),
    (lambda c: kf.get_mla_metadata(c.seqlens, 16, stream=-1), "stream"),
    (lambda c: kf.default_num_workers(2**31, 16), "device"),
    (lambda c: kf.default_num_workers(-2, 16), "device"),
    (lambda c: kf.default_num_workers(f"cuda:{2**40}", 16), "device"),
    (lambda c: kf.default_num_workers("cpu", 2**31), "h_q"),
    (lambda c: kf.default_num_workers("cpu", 16, 2**63), "s_q"),
    (lambda c: kf.metadata_size(2**31, 4), "batch"),
    (lambda c: kf.metadata_size(2, 2**31), "num_workers"),
    (lambda c: kf.workspace_size(2, 16, 1, 2**32), "num_workers"),
    (lambda c: kf.workspace_size(0, 16, 1, 4), "batch"),
    (lambda c: kf.workspace_size(2, 16, 99, 4), "s_q"),
    (lambda c: kf.cache_bytes_per_page("bf16", 2**40), "page_size"),
    (lambda c: kf.cache_bytes_per_page("bf16", 0), "page_size"),
    (lambda c: call(c, stream=2**64), "stream"),
])
def test_integer_arguments_are_range_checked_by_name(case, fn, name):
    """Out-of-range integers raise a ValueError naming the argument, never the binding's
    "incompatible function arguments"."""
    msg = raised(ValueError, fn, case)
    assert msg.startswith(f"{name}:"), msg


def test_float32_workspace_is_a_dtype_error(case):
    meta = kf.get_mla_metadata(case.seqlens, 16, 1, num_workers=4)
    nbytes = kf.workspace_size(2, 16, 1, 4)
    aligned = aligned_empty(nbytes + 256).view(np.float32)  # 256-byte aligned: not the problem
    for ws in (np.zeros(nbytes // 4 + 64, np.float32), aligned):
        msg = raised(ValueError, call, case, metadata=meta, workspace=ws)
        assert msg.startswith("workspace: expected dtype uint8") and "float32" in msg, msg


def test_python_terms_table():
    """Every C name the table knows becomes its Python name, whole words only."""
    from kernelflow._errors import TERMS, python_terms

    for c_name, py_name in TERMS.items():
        assert python_terms(f"x {c_name}: y") == f"x {py_name}: y"
    assert python_terms("kf_mla_metadata_size(batch=2) for KF_KV_INT8 in dst_cache") == \
        "metadata_size(batch=2) for 'int8' in dst"
    assert python_terms("get_mla_metadata and kf_mla_metadatax") == \
        "get_mla_metadata and kf_mla_metadatax"
