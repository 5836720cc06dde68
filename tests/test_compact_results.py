"""tools/compact_results.py bench: a decode run compacted for docs/results/, FlashMLA's matrix
(kernelflow.bench.decode --flashmla-matrix) kept with its count."""

import argparse
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
compact_results = pytest.importorskip("compact_results")


def args(**kw):
    base = dict(log=None, cuda="13.0", what="w", driver="580.159.04", date=None, commit="abc1234",
                command=None)
    base.update(kw)
    return argparse.Namespace(**base)


def raw_run(**extra):
    row = {"kernel": "kernelflow", "h_q": 128, "s_q": 2, "b": 128, "s_k": 4096, "us": 652.4567,
           "check": {"ok": True, "worst_row_cos_dist": 3.123456e-06, "tried": [1]}, "us_min": 1.0}
    return dict({"device": "NVIDIA H200", "date": "2026-12-01 22:29:46", "torch": "2.11.0+cu130",
                 "triton": "3.6.0", "argv": ["--flashmla-matrix", "--json", "/o/m.json"],
                 "rows": [row]}, **extra)


def test_the_matrix_is_kept_with_its_count():
    cells = [{"s_q": 2, "h_q": 128, "s_k": 4096, "b": 128, "kf_us": 652.4567,
              "flashmla_us": 432.1987, "ratio": 432.1987 / 652.4567, "kf_check_ok": True}]
    run = compact_results.bench_run(raw_run(flashmla_matrix=cells, flashmla_matrix_not_slower=0),
                                    args())
    (cell,) = run["flashmla_matrix"]
    assert cell["kf_us"] == 652.5 and cell["flashmla_us"] == 432.2  # 4 significant digits
    assert cell["ratio"] == pytest.approx(0.662418, abs=1e-6)  # 6: the printed 3 decimals hold
    assert cell["kf_check_ok"] is True and run["flashmla_matrix_not_slower"] == 0
    assert run["command"] == "python3 -m kernelflow.bench.decode --flashmla-matrix --json /o/m.json"
    assert run["checks"] == {"run": 1, "failed": 0}
    assert "us_min" not in run["rows"][0] and "tried" not in run["rows"][0]["check"]


def test_a_run_without_the_matrix_has_no_matrix_keys():
    run = compact_results.bench_run(raw_run(), args())
    assert "flashmla_matrix" not in run and "flashmla_matrix_not_slower" not in run
