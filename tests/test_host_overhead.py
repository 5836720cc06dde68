"""bench/host_overhead.py runs on the CPU backend (a smoke test of the measurement CI can run):
every case measured, the four decode entries agreeing (the script checks their bits before
timing), the JSON in tools/compact_results.py's layout with the run's context; --host-only
times the same cases with the library's launches as no-ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.needs_torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {"decode_given", "decode_allocated", "op_decode_given", "op_decode_allocated",
         "dispatcher_decode_allocated",
         "metadata", "op_metadata", "torch_add"}


def run_bench(tmp_path, *extra):
    """The script's run on the CPU backend with these extra arguments: (stdout, its JSON)."""
    path = tmp_path / "host.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "host_overhead.py"), "--device", "cpu",
           "--calls", "3", "--repeats", "1", "--s-k", "64", *extra, "--json", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads(path.read_text())


def test_runs_on_cpu(tmp_path):
    stdout, run = run_bench(tmp_path)
    assert "| kernelflow.mla_decode, out/lse/workspace given |" in stdout
    assert run["benchmark"] == "host_overhead" and run["device"].startswith("cpu")
    assert run["command"].startswith("python3 bench/host_overhead.py --device cpu")
    assert {"torch", "kernelflow", "python"} <= set(run["versions"]) and run["date"]
    assert {row["case"] for row in run["rows"]} >= CASES
    assert all(row["us"] > 0 and row["us_min"] <= row["us"] for row in run["rows"])
    if "flashmla_decode" not in {row["case"] for row in run["rows"]}:
        assert run["flash_mla"].startswith("absent") and run["targets"] == []
    assert run["host_only"] is False


def test_host_only(tmp_path):
    """--host-only times every case with the library's launches as no-ops, after the bits
    check, and leaves FlashMLA out."""
    stdout, run = run_bench(tmp_path, "--host-only")
    assert "--host-only: the library's decode and metadata entries are no-ops" in stdout
    assert run["host_only"] is True and run["flash_mla"] == "left out (--host-only)"
    assert {row["case"] for row in run["rows"]} == CASES and run["targets"] == []
    assert all(row["us"] > 0 for row in run["rows"])
