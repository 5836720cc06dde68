"""tools/compact_results.py: a decode run compacted for docs/results/, FlashMLA's matrix
(kernelflow.bench.decode --flashmla-matrix) kept with its count, a timeline run's block rows
reduced to the exits by piece count and per SM."""

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


def test_a_timeline_run_keeps_summaries_and_reduces_the_block_rows():
    events = {"decode": {"exit": {"n": 4, "min": 7.0, "median": 8.123456, "max": 9.0}},
              "combine": {"entry": {"n": 1, "min": 9.5, "median": 9.5, "max": 9.5}},
              "pieces_per_block": {"n": 4, "min": 1, "median": 1.5, "max": 2}}
    # block, SM, piece count, then the seven events (exit last)
    rows = [[0, 3, 1] + [0.0] + [None] * 5 + [9.0], [1, 3, 2] + [0.1] + [None] * 5 + [7.0],
            [2, 5, 1] + [0.2] + [None] * 5 + [8.0], [3, 5, 2] + [0.3] + [None] * 5 + [8.5],
            [4, None, 0] + [0.4] + [None] * 5 + [1.0]]  # a block without work
    raw = {"what": "w", "gpu": "NVIDIA H200", "date": "2026-12-02", "command": "c",
           "unit": "us", "rows": [{"format": "bf16", "h_q": 16, "s_q": 1, "b": 64, "s_k": 4096,
                                   "page": 64, "workers": 264, "calls_per_graph": 2,
                                   "us_per_call": 80.4321, "events": events,
                                   "decode_blocks": {"columns": ["block", "sm", "n_pieces",
                                                                 "entry", "waited", "pieces",
                                                                 "first_tile", "first_epilogue",
                                                                 "last_epilogue", "exit"],
                                                     "rows": rows}}]}
    run = compact_results.timeline_run(raw, args(what=None))
    (row,) = run["rows"]
    assert run["commit"] == "abc1234" and run["device"] == "NVIDIA H200" and run["what"] == "w"
    assert row["us_per_call"] == 80.43 and row["events"]["decode"]["exit"]["median"] == 8.12
    assert "decode_blocks" not in row
    assert row["exit_by_pieces"] == {"1": {"n": 2, "min": 8.0, "median": 8.5, "max": 9.0},
                                     "2": {"n": 2, "min": 7.0, "median": 7.75, "max": 8.5}}
    assert row["sm_pair_exit_diff"] == {"n": 2, "min": 0.5, "median": 1.25, "max": 2.0}


def test_a_layer_timeline_keeps_every_launch():
    events = {"decode": {"exit": {"n": 264, "min": 83.4, "median": 94.03, "max": 97.47}},
              "combine": {"exit": {"n": 256, "min": 99.5, "median": 100.5, "max": 100.99}},
              "gemm_proj": {"stored": {"n": 228, "min": 12.4, "median": 15.744, "max": 16.5}},
              "q_absorb": {"exit": {"n": 192, "min": 19.5, "median": 22.24, "max": 22.34}},
              "pieces_per_block": {"n": 264, "min": 1, "median": 1.0, "max": 2}}
    raw = {"what": "w", "gpu": "NVIDIA H200", "date": "2026-12-02", "command": "c", "unit": "us",
           "rows": [{"model": "v2_lite", "format": "bf16", "b": 64, "s_k": 4096, "page": 64,
                     "layers": 27, "us_per_layer": 109.19, "events": events}]}
    (row,) = compact_results.timeline_run(raw, args(what=None))["rows"]
    assert list(row["events"]) == ["decode", "combine", "gemm_proj", "q_absorb"]
    assert row["events"]["gemm_proj"]["stored"]["median"] == 15.74
    assert row["us_per_layer"] == 109.19 and row["pieces_per_block"]["max"] == 2
