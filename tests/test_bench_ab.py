"""bench/ab.py without a GPU: the timings it reads from the benchmarks' JSON, the table, the
export of revisions, and a whole run over two stand-in builds whose benchmark module writes
known times."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("bench_ab", os.path.join(ROOT, "bench", "ab.py"))
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)

LAYER_DOC = {
    "rows": [
        {"model": "v2_lite", "b": 1, "s_k": 4096, "layers": 27, "floor_us": {"bf16": 7.3},
         "fused": {"bf16": {"format": "bf16", "us": 23.1, "us_min": 22.9,
                            "check": {"us": 99.0}},
                   "fp8_e4m3": {"format": "fp8_e4m3", "us": 26.5}}},
        {"model": "v2_lite", "b": 64, "s_k": 4096, "layers": 27,
         "fused": {"bf16": {"format": "bf16", "us": 105.4}}},
    ],
    "v3_rows": [{"model": "v3", "b": 1, "s_k": 4096, "layers": 2, "fused": {"us": 152.0}}],
    "peaks": {"us": 1.0},
}
DECODE_DOC = {"rows": [
    {"kernel": "kernelflow", "format": "bf16", "h_q": 16, "b": 64, "s_k": 4096, "s_q": 1,
     "us": 80.2, "GBps": 3793.0},
    {"kernel": "kernelflow", "format": "bf16", "h_q": 16, "b": 1, "s_k": 4096, "s_q": 1,
     "error": "not timed"},
]}


def test_timings_label_each_us_by_row_identity_and_path():
    t = ab.timings(LAYER_DOC)
    assert t == {
        "model=v2_lite,b=1,s_k=4096,layers=27 fused bf16": 23.1,
        "model=v2_lite,b=1,s_k=4096,layers=27 fused fp8_e4m3": 26.5,
        "model=v2_lite,b=64,s_k=4096,layers=27 fused bf16": 105.4,
        "v3_rows model=v3,b=1,s_k=4096,layers=2 fused": 152.0,
    }
    assert ab.timings(DECODE_DOC) == {
        "kernel=kernelflow,format=bf16,h_q=16,b=64,s_q=1,s_k=4096": 80.2}


def test_table_medians_and_speed_against_the_first_build():
    rounds = {"base": [{"x": 10.0, "y": 4.0}, {"x": 12.0, "y": 4.0}, {"x": 11.0, "y": 4.0}],
              "v": [{"x": 10.0, "y": 5.0}, {"x": 10.0, "y": 5.0}, {"x": 9.0, "y": 5.0}]}
    rows = ab.table(["base", "v"], rounds)
    assert [r["case"] for r in rows] == ["x", "y"]
    assert rows[0]["median"] == {"base": 11.0, "v": 10.0}
    assert rows[0]["speed_vs_base"]["v"] == pytest.approx(1.1)
    assert rows[1]["speed_vs_base"]["v"] == pytest.approx(0.8)
    text = ab.format_table(["base", "v"], rows, {"v": "pytest FAILED"})
    assert "| x | 11.0 (10.0; 12.0; 11.0) | 10.0 (10.0; 10.0; 9.0) | 1.100x |" in text
    assert "v (pytest FAILED) us" in text


def test_table_keeps_only_cases_every_round_of_every_build_timed():
    rounds = {"base": [{"x": 1.0, "y": 2.0}], "v": [{"x": 1.0}]}
    assert [r["case"] for r in ab.table(["base", "v"], rounds)] == ["x"]


def test_export_writes_each_revision_tree_and_what_base_is(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (repo / "CMakeLists.txt").write_text("one\n")
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    subprocess.run(git + ["branch", "exp/one"], check=True)
    (repo / "CMakeLists.txt").write_text("two\n")
    subprocess.run(git + ["commit", "-qam", "two"], check=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ab.py"), "export", "exp/one"],
                   cwd=repo, check=True, capture_output=True)
    tree = repo / ".ab" / "exp-one"
    assert (tree / "CMakeLists.txt").read_text() == "one\n"
    assert (tree / "AB_REV").read_text().startswith("exp/one ")
    assert (repo / ".ab" / "AB_REV").read_text().startswith("base ")


def fake_build(path, us):
    """A folder importable as kernelflow whose layer benchmark writes one row of `us`."""
    bench = path / "kernelflow" / "bench"
    bench.mkdir(parents=True)
    (path / "kernelflow" / "__init__.py").write_text("")
    (bench / "__init__.py").write_text("")
    (bench / "layer.py").write_text(textwrap.dedent(f"""\
        import json, sys
        out = sys.argv[sys.argv.index("--json") + 1]
        assert "--batch" in sys.argv
        json.dump({{"rows": [{{"model": "v2_lite", "b": 64,
                               "fused": {{"bf16": {{"us": {us}}}}}}}]}}, open(out, "w"))
        """))
    return str(path)


def test_run_times_given_builds_in_rounds_and_writes_the_record(tmp_path, capsys):
    a = fake_build(tmp_path / "a", 100.0)
    b = fake_build(tmp_path / "b", 80.0)
    out = tmp_path / "out"
    rc = ab.main(["run", "--build", f"base={a}", "--build", f"v={b}", "--rounds", "2",
                  "--out", str(out), "--", "--batch", "64"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| model=v2_lite,b=64 fused bf16 | 100.0 (100.0; 100.0) | 80.0 (80.0; 80.0) | 1.250x |" \
        in text
    rec = json.loads((out / "ab.json").read_text())
    assert rec["bench_args"] == ["--batch", "64"]
    assert [len(rec["rounds"][n]) for n in ("base", "v")] == [2, 2]
    assert sorted(p.name for p in out.glob("*.json")) == [
        "ab.json", "base.r1.json", "base.r2.json", "v.r1.json", "v.r2.json"]
    assert ab.main(["compare", str(out / "ab.json")]) == 0
    assert "1.250x" in capsys.readouterr().out


def test_run_stops_on_a_benchmark_without_output_naming_build_and_round(tmp_path):
    a = fake_build(tmp_path / "a", 100.0)
    with pytest.raises(RuntimeError, match="base, round 1"):
        ab.main(["run", "--build", f"base={a}", "--rounds", "1", "--out", str(tmp_path / "o"),
                 "--", "--no-batch-flag"])


def test_run_flags_a_benchmark_that_wrote_its_json_and_failed(tmp_path, capsys):
    a = fake_build(tmp_path / "a", 100.0)
    b = fake_build(tmp_path / "b", 90.0)
    layer = tmp_path / "b" / "kernelflow" / "bench" / "layer.py"
    layer.write_text(layer.read_text() + "sys.exit(1)\n")
    rc = ab.main(["run", "--build", f"base={a}", "--build", f"v={b}", "--rounds", "1",
                  "--out", str(tmp_path / "o"), "--", "--batch", "64"])
    assert rc == 1
    assert "v (benchmark exited 1 in round 1) us" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["run", "--rounds", "-1"], ["run", "--build", "nodir"]])
def test_run_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit):
        ab.main(argv)


def fake_tree(path, us, test_passes):
    """A source tree with a stand-in build in build/ab and one pytest file."""
    path.mkdir(parents=True)
    (path / "CMakeLists.txt").write_text("")
    fake_build(path / "build" / "ab" / "python", us)
    (path / "tests").mkdir()
    (path / "tests" / "test_ok.py").write_text(f"def test_ok():\n    assert {test_passes}\n")


def test_run_over_exported_trees_runs_their_tests_and_flags_a_failure(tmp_path, monkeypatch,
                                                                     capsys):
    base = tmp_path / "base"
    fake_tree(base, 100.0, True)
    fake_tree(base / ".ab" / "exp", 90.0, False)
    (base / ".ab" / "AB_REV").write_text("base 1234\n")
    (base / ".ab" / "exp" / "AB_REV").write_text("exp 5678\n")
    monkeypatch.chdir(base)
    rc = ab.main(["run", "--no-build", "--pytest", "tests/test_ok.py -q", "--rounds", "1",
                  "--out", str(tmp_path / "out")])
    assert rc == 1  # a build failed its tests
    text = capsys.readouterr().out
    assert "exp (pytest FAILED) us" in text and "1.111x" in text
    rec = json.loads((tmp_path / "out" / "ab.json").read_text())
    assert rec["revisions"] == {"base": "base 1234", "exp": "exp 5678"}
    assert rec["status"] == {"exp": "pytest FAILED"}


def test_run_with_no_rounds_builds_and_tests_only(tmp_path, monkeypatch, capsys):
    base = tmp_path / "base"
    fake_tree(base, 100.0, True)
    monkeypatch.chdir(base)
    out = tmp_path / "out"
    assert ab.main(["run", "--no-build", "--pytest", "tests/test_ok.py", "--rounds", "0",
                    "--out", str(out)]) == 0
    assert "base: ok" in capsys.readouterr().out
    assert not list(out.glob("*.json"))
