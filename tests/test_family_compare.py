"""tools/family_compare.py: two kernel families' decode runs into one comparison (the file behind
docs/results/sm90a_h200.json), with FlashMLA's figure labelled by where it came from."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import family_compare  # noqa: E402

SHAPE = {"h_q": 128, "b": 64, "s_k": 4096, "page": 64, "dtype": "bf16"}


def bench_row(kernel, us, **extra):
    return dict(SHAPE, kernel=kernel, us=us, GBps=1000.0, check={"ok": True, "tried": [1]}, **extra)


def bench_run(rows, argv=("--h-q", "128", "--json", "/root/out/x.json")):
    return {"device": "NVIDIA H200", "num_sms": 132, "date": "2026-12-01 19:53:30",
            "torch": "2.11.0+cu130", "argv": list(argv), "rows": rows,
            "peaks": {"read_GBps": 4429.1, "mma_sync_bf16_TFLOPS": 639.0, "source": "spec"}}


def run_tool(tmp_path, a, b, *extra):
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    family_compare.main([f"sm90a={pa}", f"sm80={pb}", "--commit", "463f4e0", "--out", str(out),
                         *extra])
    return json.loads(out.read_text())


def test_pairs_the_families_and_flashmla_of_the_same_run(tmp_path):
    a = bench_run([bench_row("kernelflow", 290.0), bench_row("flashmla", 116.0)])
    b = bench_run([bench_row("kernelflow", 319.0), bench_row("flashmla_spec", 123.8)])
    out = run_tool(tmp_path, a, b, "--env", "sm80=KF_KERNEL_FAMILY=sm80",
                   "--matmul-tflops", "741", "--matmul-source", "spec section 5")
    assert out["commit"] == "463f4e0" and out["device"] == "NVIDIA H200"
    assert out["commands"] == {
        "sm90a": "python3 -m kernelflow.bench.decode --h-q 128 --json $OUT/x.json",
        "sm80": "KF_KERNEL_FAMILY=sm80 python3 -m kernelflow.bench.decode --h-q 128 --json $OUT/x.json"}
    assert out["written_by"].startswith(
        "python3 tools/family_compare.py sm90a=$OUT/a.json sm80=$OUT/b.json --commit 463f4e0 ")
    (row,) = out["rows"]
    flops = 2 * 64 * 128 * 4096 * (576 + 512)
    assert row["sm90a"]["us"] == 290.0 and row["sm80"]["us"] == 319.0
    assert row["sm90a"]["TFLOPS"] == round(flops / 290.0 / 1e6, 1)
    assert row["sm90a"]["frac_matmul_peak"] == round(row["sm90a"]["TFLOPS"] / 741, 3)
    assert row["sm90a"]["check"] == {"ok": True}
    assert row["sm90a_speed_over_sm80"] == 1.1
    assert row["flashmla"]["us"] == 116.0 and row["flashmla"]["source"] == "measured in the sm90a run"
    assert row["flashmla"]["TFLOPS"] == round(flops / 116.0 / 1e6, 1)
    assert row["sm90a_speed_over_flashmla"] == 0.4


def test_flashmla_from_the_spec_is_labelled_so(tmp_path):
    a = bench_run([bench_row("kernelflow", 290.0)])
    spec = {k: v for k, v in bench_row("flashmla_spec", 123.8).items() if k != "check"}
    b = bench_run([bench_row("kernelflow", 319.0), spec])
    (row,) = run_tool(tmp_path, a, b)["rows"]
    assert row["flashmla"]["us"] == 123.8 and "check" not in row["flashmla"]
    assert row["flashmla"]["source"] == "docs/spec.md section 5, not measured in these runs"


def test_a_shape_missing_from_the_second_run_is_named(tmp_path):
    a = bench_run([bench_row("kernelflow", 290.0)])
    b = bench_run([dict(bench_row("kernelflow", 30.0), b=1)])
    with pytest.raises(SystemExit, match="the sm80 run has no kernelflow row for .*'b': 64"):
        run_tool(tmp_path, a, b)


def test_runs_on_different_gpus_are_refused(tmp_path):
    b = dict(bench_run([bench_row("kernelflow", 319.0)]), device="NVIDIA A100")
    with pytest.raises(SystemExit, match="different GPUs"):
        run_tool(tmp_path, bench_run([bench_row("kernelflow", 290.0)]), b)


def test_a_run_without_a_name_is_named(tmp_path):
    with pytest.raises(SystemExit, match="run 'a.json' is not NAME=VALUE"):
        family_compare.main(["a.json", "sm80=b.json", "--commit", "c", "--out", str(tmp_path / "o")])


def test_two_runs_of_one_name_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        family_compare.main(["sm80=a.json", "sm80=b.json", "--commit", "c", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "both runs are named 'sm80'" in capsys.readouterr().err


def test_not_a_bench_file_is_named(tmp_path):
    (tmp_path / "a.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="has no 'rows'"):
        family_compare.main([f"x={tmp_path / 'a.json'}", f"y={tmp_path / 'a.json'}",
                             "--commit", "c", "--out", str(tmp_path / "o.json")])


def test_committed_comparison_holds_what_the_docs_cite():
    with open(os.path.join(ROOT, "docs", "results", "sm90a_h200.json")) as f:
        out = json.load(f)
    assert out["commit"] == "52a9013" and out["device"] == "NVIDIA H200" and out["date"]
    assert set(out["commands"]) == {"sm90a", "sm80"}
    us = {(r["h_q"], r["b"]): (r["sm90a"]["us"], r["sm80"]["us"], r["flashmla"]["us"])
          for r in out["rows"]}
    # docs/optimization/sm90a.md, README.md and docs/status.md cite these
    assert us[(128, 64)] == (188.7, 323.65, 112.62)
    assert us[(128, 128)] == (349.59, 619.93, 226.94)
    assert us[(32, 128)] == (199.12, 175.35, 145.19)
    assert all(r["sm90a"]["check"]["ok"] and r["sm80"]["check"]["ok"] for r in out["rows"])


def test_rows_without_s_q_pair_with_s_q_1_rows(tmp_path):
    a = bench_run([bench_row("kernelflow", 290.0, s_q=1)])
    b = bench_run([bench_row("kernelflow", 319.0)])  # a run from before the grid took --s-q
    (row,) = run_tool(tmp_path, a, b)["rows"]
    assert row["sm90a"]["us"] == 290.0 and row["sm80"]["us"] == 319.0
