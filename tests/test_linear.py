"""kernelflow.linear (out = x @ weight.T, the fused layer's skinny GEMM as an operation): NumPy
(ml_dtypes) and PyTorch on the CPU backend against float64, errors in Python terms, and on a GPU
the kernels against the CPU backend with reruns, explicit workspaces and CUDA graph capture."""

from __future__ import annotations

import numpy as np
import pytest

import kernelflow as kf
from inputs import numpy_dtype


def _operands(rng, m, n, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    return x, w


def _close_to_float64(out, x, w):
    """out (float) against the float64 product of the bf16 inputs: one bf16 rounding plus the
    fp32 sum's error."""
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    tol = np.abs(ref) * 2.0**-8 + 1e-6 * x.shape[1]
    assert np.all(np.abs(out - ref) <= tol), float(np.max(np.abs(out - ref) - tol))


@pytest.mark.parametrize("m,n,k", [(1, 1, 64), (5, 300, 128), (32, 577, 2048), (64, 96, 512)])
def test_numpy_cpu_matches_float64(rng, m, n, k):
    bf16 = numpy_dtype("bfloat16")
    x, w = _operands(rng, m, n, k)
    xb, wb = x.astype(bf16), w.astype(bf16)
    out = kf.linear(xb, wb)
    assert out.shape == (m, n) and out.dtype == bf16
    _close_to_float64(out.astype(np.float64), xb.astype(np.float32), wb.astype(np.float32))


@pytest.mark.needs_torch
def test_torch_cpu_out_and_workspace(rng):
    import torch

    x, w = _operands(rng, 64, 256, 2048)  # splits k: needs a workspace
    xt, wt = torch.from_numpy(x).bfloat16(), torch.from_numpy(w).bfloat16()
    assert kf.linear_workspace_size(64, 256, 2048) > 0
    ws = kf.new_linear_workspace(xt, wt)
    assert ws is not None and int(ws.sum()) == 0
    out = torch.full((64, 256), float("nan"), dtype=torch.bfloat16)
    assert kf.linear(xt, wt, out=out, workspace=ws) is out
    _close_to_float64(out.double().numpy(), xt.float().numpy(), wt.float().numpy())
    assert kf.new_linear_workspace(xt[:8], wt) is None  # the narrow kernel's sizes need none


@pytest.mark.needs_torch
@pytest.mark.parametrize(
    "case,message",
    [
        ("m_129", "x.shape[0] (m): expected 1..128, got 129"),
        ("k_100", "x.shape[1] (k): expected a multiple of 64, got 100"),
        ("weight_k", "weight: expected shape[1] (k (x.shape[1])) = 64, got 128"),
        ("x_float32", "x: expected dtype bfloat16, got float32"),
        ("x_3d", "x: expected shape [m, k], got (8, 64, 1)"),
        ("out_shape", "out: expected shape[1] (n (weight.shape[0])) = 8, got 9"),
        ("workspace_small", "workspace: expected at least"),
    ],
)
def test_errors_name_the_python_argument(case, message):
    import torch

    x, w, out, ws = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16), None, None
    if case == "m_129":
        x = torch.zeros(129, 64, dtype=torch.bfloat16)
    elif case == "k_100":
        x, w = torch.zeros(8, 100, dtype=torch.bfloat16), torch.zeros(8, 100, dtype=torch.bfloat16)
    elif case == "weight_k":
        w = torch.zeros(8, 128, dtype=torch.bfloat16)
    elif case == "x_float32":
        x = torch.zeros(8, 64)
    elif case == "x_3d":
        x = torch.zeros(8, 64, 1, dtype=torch.bfloat16)
    elif case == "out_shape":
        out = torch.zeros(8, 9, dtype=torch.bfloat16)
    elif case == "workspace_small":
        x, w = torch.zeros(64, 2048, dtype=torch.bfloat16), torch.zeros(256, 2048, dtype=torch.bfloat16)
        ws = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=None) as e:
        kf.linear(x, w, out=out, workspace=ws)
    assert message in str(e.value), str(e.value)
    assert "kf_linear" not in str(e.value)


def test_workspace_size_errors_in_python_terms():
    with pytest.raises(ValueError, match=r"^m: expected 1\.\.128, got 0"):
        kf.linear_workspace_size(0, 8, 64)
    with pytest.raises(ValueError, match="k: expected a multiple of 64, got 96"):
        kf.linear_workspace_size(8, 8, 96)


@pytest.mark.gpu
@pytest.mark.needs_torch
@pytest.mark.parametrize("m,n,k", [(1, 3648, 2048), (8, 300, 2048), (32, 2048, 128), (33, 577, 2048),
                                   (64, 2048, 2048), (128, 576, 512), (1, 1536, 7168)])
@pytest.mark.parametrize("family", ["default", "sm80"])
def test_gpu_matches_cpu_backend_reruns_and_graph(rng, monkeypatch, m, n, k, family):
    """On the device's default kernel family (the sm_90a family's wgmma kernel for the wide
    launches on an H100 / H200) and on the portable one (KF_KERNEL_FAMILY=sm80)."""
    import torch

    if family != "default":
        monkeypatch.setenv("KF_KERNEL_FAMILY", family)

    x, w = _operands(rng, m, n, k)
    xc, wc = torch.from_numpy(x).bfloat16(), torch.from_numpy(w).bfloat16()
    cpu = kf.linear(xc, wc).double()
    xg, wg = xc.cuda(), wc.cuda()
    ws = kf.new_linear_workspace(xg, wg)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    kf.linear(xg, wg, out=out, workspace=ws)
    gpu = out.double().cpu()
    # One bf16 rounding of the larger of the two apart (the fp32 sums run in another order).
    tol = torch.maximum(gpu.abs(), cpu.abs()) * 2.0**-7 + 1e-6 * k
    assert bool(((gpu - cpu).abs() <= tol).all())
    first = out.clone()
    kf.linear(xg, wg, out=out, workspace=ws)
    assert torch.equal(out.view(torch.int16), first.view(torch.int16)), "rerun bits differ"
    if ws is not None:
        assert int(ws.count_nonzero()) == 0, "workspace not left zero"
    # Captured in a CUDA graph (workspace made outside the capture), replayed with new x.
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kf.linear(xg, wg, out=out, workspace=ws)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        kf.linear(xg, wg, out=out, workspace=ws)
    xg.copy_(torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).bfloat16())
    g.replay()
    torch.cuda.synchronize()
    eager = kf.linear(xg, wg, workspace=ws)
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16)), "replay differs from eager"
