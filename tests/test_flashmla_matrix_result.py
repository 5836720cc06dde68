"""docs/results/flashmla_matrix_h200.json (kernelflow.bench.decode --flashmla-matrix, compacted by
tools/compact_results.py) is one complete, checked run, and the matrix docs/optimization/sm90a.md
shows is the one kernelflow.bench.decode prints from it."""

import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT = os.path.join(ROOT, "docs", "results", "flashmla_matrix_h200.json")
PAGE = os.path.join(ROOT, "docs", "optimization", "sm90a.md")

decode = pytest.importorskip("kernelflow.bench.decode")


@pytest.fixture(scope="module")
def run():
    with open(RESULT) as f:
        return json.load(f)


def test_the_run_is_complete_and_checked(run):
    cells = run["flashmla_matrix"]
    grid = decode.FLASHMLA_MATRIX
    assert [(c["s_q"], c["h_q"], c["s_k"]) for c in cells] == [
        (s_q, h_q, s_k) for s_q in grid["s_q"] for h_q in grid["h_q"] for s_k in grid["s_k"]]
    assert all(c["b"] == 128 and c["kf_check_ok"] for c in cells)
    assert run["checks"] == {"run": 32, "failed": 0}
    for c in cells:  # FlashMLA's time over kernelflow's, both measured in this run
        assert c["ratio"] == pytest.approx(c["flashmla_us"] / c["kf_us"], rel=2e-3)
    assert run["flashmla_matrix_not_slower"] == decode.not_slower(cells)
    for key in ("device", "date", "commit", "command", "versions", "peaks"):
        assert run[key], key


def test_the_page_shows_the_printed_matrix(run):
    with open(PAGE) as f:
        text = f.read()
    start, end = "<!-- flashmla-matrix -->\n", "<!-- /flashmla-matrix -->"
    shown = text[text.index(start) + len(start):text.index(end)].strip().splitlines()
    printed = decode.matrix_lines(run["flashmla_matrix"], flashmla_measured=True)
    table = [ln for ln in printed if ln.startswith("|")]
    assert shown == table
