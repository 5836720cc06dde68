"""python -m kernelflow.bench.layer on the CPU (--device cpu: the same code on small shapes, the
CPU backend's layer graph): the correctness check of every fused run is per layer (a one-layer
fused graph against the one-layer torch layer, bound 1e-4) and decides the run's verdict; the
whole output of the timed graph of all the layers is reported as the drift, without a bound.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.needs_torch

ARGS = ["--device", "cpu", "--batch", "2", "--s-k", "80", "--no-gemm"]


def run_bench(tmp_path, *extra):
    """(exit status, the JSON record) of one CPU run."""
    from kernelflow.bench import layer

    path = tmp_path / "layer.json"
    rc = layer.main(ARGS + ["--json", str(path), *extra])
    return rc, json.loads(path.read_text())


def fused_runs(record) -> list:
    return ([res for row in record["rows"] for res in row["fused"].values()]
            + [row["fused"] for row in record["v3_rows"]])


def with_torch_output(monkeypatch, perturbed_layers):
    """The bench's torch reference with its output mixed with a shifted copy of itself (cosine
    distance about 1e-3) when it runs `perturbed_layers(n)` is true of its n layers."""
    from kernelflow.bench import layer

    real = layer.torch_output

    def torch_output(shape, weights, caches, step, kv_format):
        y = real(shape, weights, caches, step, kv_format)
        return y + 0.05 * y.roll(1, dims=-1) if perturbed_layers(len(weights)) else y

    monkeypatch.setattr(layer, "torch_output", torch_output)


def test_cpu_run_checks_each_layer(tmp_path, capsys):
    rc, rec = run_bench(tmp_path)
    text = capsys.readouterr().out
    assert rc == 0 and rec["failures"] == 0, text[-3000:]
    runs = fused_runs(rec)
    assert len(runs) == 3 * 1 + 2  # three formats at b = 2; V3 at b = 1 and 3
    for res in runs:
        check = res["check"]
        assert check["layers"] == 1 and check["bound"] == 1e-4
        assert 0 <= check["cos_dist_vs_torch"] < 1e-4 and check["error_buffer_clean"]
        assert check["ok"] and res["ok"] and res["error_buffer_clean"]
        assert res["drift_layers"] == 2 and res["cos_dist_vs_torch"] >= 0 and res["us"] > 0
    v2 = rec["rows"][0]["fused"]
    assert "cache_rows_cos_dist" in v2["bf16"]["check"]
    for fmt in ("fp8_e4m3", "int8"):  # each 8-bit layer against the bf16 one, reported
        assert 0 < v2[fmt]["check"]["cos_dist_vs_fused_bf16"] < 0.05
    assert "drift" in rec["method"] and "per layer" in rec["method"]["check"]
    assert "drift over the layers (cos dist)" in text
    assert "(information, no bound)" in text


def test_a_wrong_layer_fails_the_check(tmp_path, monkeypatch, capsys):
    """A reference one layer away from the fused layer fails every run's check."""
    with_torch_output(monkeypatch, lambda n: n == 1)
    rc, rec = run_bench(tmp_path, "--formats", "bf16", "int8", "--v3-layers", "0")
    assert rc == 1 and rec["failures"] == 2
    for res in fused_runs(rec):
        assert res["check"]["cos_dist_vs_torch"] > 1e-4
        assert not res["check"]["ok"] and not res["ok"]
    assert "FAIL one layer" in capsys.readouterr().out


def test_the_drift_has_no_bound(tmp_path, monkeypatch, capsys):
    """A whole output over the layers beyond 1e-4 of the torch layers' is reported, and the run
    passes on its per-layer checks."""
    with_torch_output(monkeypatch, lambda n: n > 1)
    rc, rec = run_bench(tmp_path, "--formats", "bf16", "--v3-layers", "0")
    assert rc == 0 and rec["failures"] == 0
    (res,) = fused_runs(rec)
    assert res["check"]["ok"] and res["ok"]
    assert res["cos_dist_vs_torch"] > 1e-4
    assert "drift over the graph's layers (information, no bound): worst" in capsys.readouterr().out
