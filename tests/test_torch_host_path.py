"""The torch path of the plain API (kernelflow.mla): plain torch tensors go straight to the C API,
whose checks stand in for the Python ones; a refused call is made again through the checked
path, which names what is wrong. Valid calls never take the checked path and give its bits (and
the reference's); invalid ones raise exactly what the checked path raises, including the checks
only Python makes (a workspace of another dtype, a bool scale, a buffer-protocol object)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kernelflow as kf  # noqa: E402
from kernelflow import mla  # noqa: E402
from inputs import check_decode, make_case  # noqa: E402
from test_torch_ops import bits_equal  # noqa: E402

pytestmark = pytest.mark.needs_torch

H_Q, S_Q, PAGE = 16, 1, 16


@pytest.fixture
def case(rng):
    return make_case(rng, [5, 37], H_Q, S_Q, PAGE, np.float16)


def tensors(case):
    """(q, cache, block_table, seqlens) as torch CPU tensors."""
    return tuple(torch.from_numpy(np.ascontiguousarray(a))
                 for a in (case.q, case.cache, case.block_table, case.seqlens))


@pytest.fixture
def no_checked_path(monkeypatch):
    """Fail any call that reaches the checked path."""
    def refuse(*args, **kwargs):
        raise AssertionError("the call took the checked path")

    for name in ("_decode_checked", "_metadata_checked", "_append_checked"):
        monkeypatch.setattr(mla, name, refuse)


def checked_decode(q, cache, bt, sl, meta, scale, **kw):
    args = {"kv_format": None, "out": None, "lse": None, "workspace": None,
            "error_buffer": None, "stream": None, **kw}
    return mla._decode_checked(q, cache, bt, sl, meta, scale, args["kv_format"], args["out"],
                               args["lse"], args["workspace"], args["error_buffer"],
                               args["stream"])


def test_valid_calls_skip_the_checked_path(case, no_checked_path):
    q, cache, bt, sl = tensors(case)
    meta = kf.get_mla_metadata(sl, H_Q, S_Q)
    assert meta.dtype == torch.int32
    assert meta.shape[0] == kf.metadata_size(2, kf.default_num_workers("cpu", H_Q, S_Q))
    kf.get_mla_metadata(sl, H_Q, S_Q, num_workers=3, kv_format="fp8_e4m3")
    again = torch.empty_like(meta)
    assert kf.get_mla_metadata(sl, H_Q, S_Q, out=again) is again and torch.equal(again, meta)
    out, lse = kf.mla_decode(q, cache, bt, sl, meta, case.scale)
    check_decode(case, out.float().numpy(), lse.numpy(), "allocated")
    given_out, given_lse = torch.empty_like(out), torch.empty_like(lse)
    ws = kf.new_workspace(q, meta)
    errors = kf.new_error_buffer(q)
    got = kf.mla_decode(q, cache, bt, sl, meta, case.scale, kv_format="fp16", out=given_out,
                        lse=given_lse, workspace=ws, error_buffer=errors, stream=0)
    assert got[0] is given_out and got[1] is given_lse
    assert bits_equal(given_out, out) and bits_equal(given_lse, lse)
    assert errors.tolist() == [0, -1, 0, 0]
    kv = torch.randn(2, 576).half()
    slots = torch.tensor([0, -1], dtype=torch.int64)
    assert kf.cache_append(kv, cache, slots) is cache
    assert bits_equal(cache[0, 0], kv[0])  # slot 0: page 0, offset 0


def test_same_bits_as_the_checked_path(case):
    q, cache, bt, sl = tensors(case)
    meta = kf.get_mla_metadata(sl, H_Q, S_Q)
    assert torch.equal(meta, mla._metadata_checked(sl, H_Q, S_Q, None, None, None, "bf16"))
    out, lse = kf.mla_decode(q, cache, bt, sl, meta, case.scale)
    want_out, want_lse = checked_decode(q, cache, bt, sl, meta, case.scale)
    assert bits_equal(out, want_out) and bits_equal(lse, want_lse)


def test_subclasses_and_grad_take_a_working_path(case):
    """Parameters (a tensor subclass) take the checked path; tensors that require grad work."""
    q, cache, bt, sl = tensors(case)
    meta = kf.get_mla_metadata(sl, H_Q, S_Q)
    want_out, want_lse = kf.mla_decode(q, cache, bt, sl, meta, case.scale)
    for q_like in (torch.nn.Parameter(q.clone(), requires_grad=False),
                   q.float().requires_grad_().half()):
        out, lse = kf.mla_decode(q_like, cache, bt, sl, meta, case.scale)
        assert bits_equal(out, want_out) and bits_equal(lse, want_lse)


def refusals(case):
    """(what, keyword overrides of the call, exception, message start) the checked path raises."""
    q, cache, bt, sl = tensors(case)
    return [
        ("workspace of float32", {"workspace": torch.zeros(4096, dtype=torch.float32)},
         ValueError, "workspace: expected dtype uint8"),
        ("bool scale", {"softmax_scale": True}, TypeError, "softmax_scale: expected a float"),
        ("uint8 cache without kv_format",
         {"kv_cache": torch.zeros((4, 16, 644), dtype=torch.uint8)}, ValueError,
         "kv_format: required for a uint8 kv_cache"),
        ("q of another batch", {"q": q[:1]}, ValueError, "q: expected shape[0] (batch) = 2"),
        ("q laid out [b, h_q, s_q, 576]", {"q": q.transpose(1, 2).contiguous()}, ValueError,
         "q: shape (2, 16, 1, 576) has s_q = 16, h_q = 1"),
        ("a list as out", {"out": [0.0]}, TypeError, "out: expected an array"),
        ("a bytearray as workspace", {"workspace": bytearray(4096)}, TypeError,
         "workspace: expected an array"),
        ("an unknown format", {"kv_format": "fp4"}, ValueError, "kv_format: expected one of"),
        ("an fp16 cache named bf16", {"kv_format": "bf16"}, ValueError, "kv_format: 'bf16'"),
        ("a bad stream", {"stream": -1}, ValueError, "stream: expected a handle"),
        ("lse of float16", {"lse": torch.zeros((2, H_Q, S_Q), dtype=torch.float16)},
         ValueError, "lse:"),
        ("block_table of int64", {"block_table": bt.long()}, ValueError, "block_table:"),
    ]


def test_refusals_are_named_as_the_checked_path_names_them(case):
    q, cache, bt, sl = tensors(case)
    meta = kf.get_mla_metadata(sl, H_Q, S_Q)
    base = {"q": q, "kv_cache": cache, "block_table": bt, "cache_seqlens": sl,
            "metadata": meta, "softmax_scale": case.scale}
    for what, override, exc, start in refusals(case):
        kw = {**base, **override}
        with pytest.raises(exc) as info:
            kf.mla_decode(**kw)
        assert str(info.value).startswith(start), f"{what}: {info.value}"
        args = [kw.pop(k) for k in ("q", "kv_cache", "block_table", "cache_seqlens", "metadata",
                                    "softmax_scale")]
        with pytest.raises(exc) as checked:
            checked_decode(*args, **kw)
        assert str(checked.value) == str(info.value), what


def test_metadata_and_append_refusals(case):
    q, cache, bt, sl = tensors(case)
    with pytest.raises(ValueError, match=r"^num_heads_q: expected 1\.\.128, got 0"):
        kf.get_mla_metadata(sl, 0, S_Q)
    with pytest.raises(TypeError, match=r"^num_heads_q: expected an int, got bool"):
        kf.get_mla_metadata(sl, True, S_Q)
    with pytest.raises(ValueError, match=r"^cache_seqlens: expected shape \[batch\]"):
        kf.get_mla_metadata(sl[None], H_Q, S_Q)
    with pytest.raises(ValueError, match=r"^out: shape \(7,\) fits no worker count"):
        kf.get_mla_metadata(sl, H_Q, S_Q, out=torch.zeros(7, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^slot_mapping"):
        kf.cache_append(torch.zeros(2, 576).half(), cache, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^kv_format: required for a uint8 kv_cache"):
        kf.cache_append(torch.zeros(2, 576).half(), torch.zeros((4, 16, 644), dtype=torch.uint8),
                        torch.zeros(2, dtype=torch.int64))
