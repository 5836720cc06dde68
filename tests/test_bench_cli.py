"""`python -m kernelflow bench` and `profile` on the CPU: the options --help documents, the
no-GPU line and exit status, the run record of a run on synthetic timings (the measurements are
injected in place of the GPU's), the figures drawn from that record, and the ncu command line
built for a configuration."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from kernelflow.bench import cli, profile, results

PEAKS = {"read_GBps": 4000.0, "mma_sync_bf16_TFLOPS": 600.0, "source": "synthetic"}
OPTIONS = ("--quick", "--json", "--log", "--verbose", "--sections", "--families",
           "--no-baselines", "--peaks-json", "--peaks-from-spec", "--decode-args",
           "--formats-args", "--layer-args", "--figures", "--progress", "--summary",
           "--estimate")


def traffic(h_q, b, s_k, fmt=None):
    """(bytes, flops) of a decode call, as kernelflow.bench.decode counts them."""
    per_token = 1152 if fmt in (None, "bf16") else 644
    return b * s_k * per_token + b * h_q * (576 + 512) * 2, 2 * b * h_q * s_k * (576 + 512)


def roof_us(h_q, b, s_k, fmt=None):
    nbytes, flops = traffic(h_q, b, s_k, fmt)
    return max(nbytes / PEAKS["read_GBps"] / 1e3, flops / PEAKS["mma_sync_bf16_TFLOPS"] / 1e6)


def decode_row(kernel, family, h_q, b, s_k, us, fmt=None):
    """A row as kernelflow.bench.decode writes it, from a synthetic time."""
    nbytes, flops = traffic(h_q, b, s_k, fmt)
    gbps, tflops = nbytes / us / 1e3, flops / us / 1e6
    row = {"kernel": kernel, "h_q": h_q, "b": b, "s_k": s_k, "us": us, "GBps": gbps,
           "TFLOPS": tflops, "frac_read_peak": gbps / PEAKS["read_GBps"],
           "frac_mma_peak": tflops / PEAKS["mma_sync_bf16_TFLOPS"], "check": {"ok": True}}
    if fmt:
        row["format"] = fmt
    return row


class SyntheticSections:
    """The measurements of cli.GpuSections with made-up times: each kernel at a fixed fraction
    of the bounding roof."""

    calls: list

    def __init__(self):
        self.calls = []

    def gpu(self):
        return {"name": "Synthetic GPU", "sm": "90", "num_sms": 132, "l2_bytes": 60 << 20,
                "memory_GiB": 140.0, "clocks": {"source": "test", "sm_MHz": 1980, "mem_MHz": 2619}}

    def clocks(self):
        return {"source": "test", "sm_MHz": 1980}

    def peaks(self, opts):
        return dict(PEAKS)

    def decode(self, argv, peaks, family, on_step):
        self.calls.append((family, argv))
        rows = []
        formats = cli.flag_values(argv, "--formats", None)
        for s_k in map(int, cli.flag_values(argv, "--s-k", [])):
            for h_q in map(int, cli.flag_values(argv, "--h-q", [])):
                for b in map(int, cli.flag_values(argv, "--batch", [])):
                    on_step(f"decode {family} h_q={h_q} b={b} s_k={s_k}")
                    if formats:
                        for fmt in formats:
                            us = roof_us(h_q, b, s_k, fmt) / 0.9
                            row = decode_row("kernelflow", family, h_q, b, s_k, us, fmt)
                            if fmt != "bf16":
                                row["speedup_vs_bf16"] = roof_us(h_q, b, s_k) / 0.9 / us
                            rows.append(row)
                        continue
                    roof = roof_us(h_q, b, s_k)
                    for kernel, frac in (("kernelflow", 0.9), ("triton", 0.6), ("torch", 0.3),
                                         ("flashmla_spec", 0.8)):
                        rows.append(decode_row(kernel, family, h_q, b, s_k, roof / frac))
        return {"rows": rows, "errors": [], "failures": 0, "flashmla_measured": False}

    def layer(self, argv, peaks, on_step):
        rows = []
        for b in (1, 64):
            on_step(f"layer b={b}")
            floor16, floor8 = 10.0 + b * 1.0, 10.0 + b * 0.56
            rows.append({"model": "v2_lite", "b": b, "s_k": 4096, "layers": 27,
                         "floor_us": {"bf16": floor16, "fp8_e4m3": floor8, "int8": floor8},
                         "unfused": {"eager_us": 200.0, "graph_us": 60.0 + b},
                         "fused": {f: {"us": (floor16 if f == "bf16" else floor8) / 0.8,
                                       "nodes_per_layer": 7.04} for f in cli.FORMATS}})
        v3 = [{"model": "v3", "b": 64, "layers": 4, "floor_us": 100.0, "fused": {"us": 125.0}}]
        gemm = [{"projection": "w_o", "b": 64, "torch_us": 5.0, "torch_frac_read_peak": 0.5,
                 "kf_us": 2.5, "kf_frac_read_peak": 1.0}]
        return {"rows": rows, "gemm_rows": gemm, "v3_rows": v3, "failures": 0}


def run_synthetic(tmp_path, capsys, *extra):
    path = tmp_path / "run.json"
    rc = cli.main(["--quick", "--json", str(path), "--progress", "plain", "--families", "sm90a",
                   "sm80", *extra],
                  sections=SyntheticSections())
    return rc, json.loads(path.read_text()), capsys.readouterr()


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    declared = {s for a in cli.build_parser()._actions for s in a.option_strings}
    assert declared == set(OPTIONS) | {"-h", "--help"}
    for option in OPTIONS:
        assert option in text, option
    helps = [a.help for a in cli.build_parser()._actions]
    assert all(h and len(h) > 10 for h in helps)


def test_top_level_help_lists_bench_and_profile():
    res = subprocess.run([sys.executable, "-m", "kernelflow", "--help"], capture_output=True,
                         text=True)
    assert res.returncode == 0
    assert "bench" in res.stdout and "profile" in res.stdout


def test_without_a_gpu_one_line_and_nonzero_exit():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, "-m", "kernelflow", "bench", "--quick"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode != 0
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("no GPU"), res.stdout
    assert "Traceback" not in res.stderr


def test_record_of_a_synthetic_run(tmp_path, capsys):
    rc, rec, out = run_synthetic(tmp_path, capsys)
    assert rc == 0
    assert rec["schema"] == results.SCHEMA
    assert rec["command"].startswith("python -m kernelflow bench --quick --json ")
    assert rec["gpu"]["name"] == "Synthetic GPU" and rec["gpu"]["clocks"]["sm_MHz"] == 1980
    assert rec["clocks_after"]["source"] == "test"
    assert rec["versions"]["python"] and "kernelflow" in rec["versions"]
    assert rec["families"] == ["sm90a", "sm80"]
    assert rec["peaks"] == PEAKS
    assert rec["anchors"]["source"] == cli.ANCHOR_LABEL and rec["anchors"]["rows"]
    # The quick grid: h_q 16/128 x b 1/64 x s_k 4096, four kernels, for each family.
    dec = rec["decode"]["rows"]
    assert len(dec) == 2 * 2 * 1 * 4 * 2
    assert {r["family"] for r in dec} == {"sm90a", "sm80"}
    for r in dec:
        for key in ("kernel", "h_q", "b", "s_k", "us", "GBps", "TFLOPS", "frac_read_peak",
                    "frac_mma_peak"):
            assert key in r, key
    fmt = rec["formats"]["rows"]
    assert sorted({r["s_k"] for r in fmt}) == [1024, 8192, 65536]
    assert {r["format"] for r in fmt} == set(cli.FORMATS)
    for r in fmt:
        if r["format"] != "bf16":
            assert r["speedup_vs_bf16"] == pytest.approx(
                traffic(16, 64, r["s_k"])[0] / traffic(16, 64, r["s_k"], "int8")[0])
    assert [r["b"] for r in rec["layer"]["rows"]] == [1, 64]
    assert set(rec["seconds"]) == {"peaks", "decode", "formats", "layer", "total"}
    assert rec["failures"] == 0
    assert os.path.exists(rec["log"])
    # Every step of the plan advanced the bar once.
    steps = [ln for ln in out.err.splitlines() if ln.startswith("[")]
    assert len(steps) == cli.plan_steps(cli.build_parser().parse_args(["--quick"]),
                                        ["sm90a", "sm80"]) == 1 + 8 + 3 + 2
    assert steps[-1].startswith(f"[{len(steps)}/{len(steps)}]")


def test_printed_figures_carry_the_fraction_of_the_bounding_peak(tmp_path, capsys):
    rc, rec, out = run_synthetic(tmp_path, capsys)
    text = out.out
    # h_q 16 sits below the ridge (read-bound), h_q 128 above it (mma-bound); kernelflow runs at
    # 90% of the roof, Triton 60%, PyTorch 30%, FlashMLA's figure 80%.
    assert "| sm90a | 16 | 4096 | 64 |" in text
    line16 = next(ln for ln in text.splitlines() if ln.startswith("| sm90a | 16 | 4096 | 64 |"))
    assert "(90% read)" in line16 and "(60% read)" in line16 and "(30% read)" in line16
    line128 = next(ln for ln in text.splitlines() if ln.startswith("| sm80 | 128 | 4096 | 64 |"))
    assert "(90% mma)" in line128 and "(80% mma)" in line128
    assert "flashmla_spec: FlashMLA's figures from docs/spec.md" in text
    sweep = next(ln for ln in text.splitlines() if ln.startswith("| 65536 | 64 |"))
    assert "(90% read)" in sweep and "(90% read, 1.79x)" in sweep
    layer = next(ln for ln in text.splitlines() if ln.startswith("| 64 |"))
    assert "(80% read)" in layer  # fused: floor / time
    assert "V3 shape (4 layers), b 64: fused bf16 125.0 us per layer (80% read)" in text
    assert ("GEMM alone, us per GEMM (% read), torch.matmul / kernelflow.linear: w_o b 64 5.00 "
            "(50%) / 2.50 (100%)") in text
    assert "Synthetic GPU" in text and rec["command"] in text


def test_summary_reprints_a_run_without_a_gpu(tmp_path, capsys):
    rc, rec, out = run_synthetic(tmp_path, capsys)
    assert cli.main(["--summary", str(tmp_path / "run.json")]) == 0
    again = capsys.readouterr().out
    assert again.strip() and again.strip() in out.out  # the run's own tables, line for line


def test_sections_and_families_options(tmp_path, capsys):
    sections = SyntheticSections()
    path = tmp_path / "d.json"
    rc = cli.main(["--quick", "--sections", "decode", "--families", "sm80", "--no-baselines",
                   "--decode-args", "--batch 8", "--json", str(path), "--progress", "none"],
                  sections=sections)
    assert rc == 0
    rec = json.loads(path.read_text())
    assert "formats" not in rec and "layer" not in rec
    (family, argv), = sections.calls
    assert family == "sm80"
    assert "--no-triton" in argv and cli.flag_values(argv, "--batch", None) == ["8"]
    assert {r["b"] for r in rec["decode"]["rows"]} == {8}


def test_default_families():
    info = "kernelflow 0.1.0; cuda archs 80 86 89 90; cuda runtime 13.0"
    hopper = "kernelflow 0.1.0; cuda archs 86 90 90a; cuda runtime 13.0"
    assert cli.built_archs(info) == ["80", "86", "89", "90"]
    assert cli.built_families(info) == ["sm80"]
    assert cli.built_families(hopper) == ["sm80", "sm90a"]
    assert cli.built_families("kernelflow 0.1.0; cpu-only; cuda runtime none") == []
    # 9.0 with the sm90a family: the default (sm90a) family runs here, the portable one in a
    # child; without it (or on another device) the portable family alone.
    assert cli.default_families(hopper, "90", "") == ["sm90a", "sm80"]
    assert cli.default_families(hopper, "90", "auto") == ["sm90a", "sm80"]
    assert cli.process_family(hopper, "90", "") == "sm90a"
    assert cli.default_families(hopper, "90", "sm90a") == ["sm90a"]
    assert cli.process_family(hopper, "86", "sm90a") == "sm80"
    assert cli.default_families(info, "90", "") == ["sm80"]
    assert cli.default_families(hopper, "86", "") == ["sm80"]
    assert cli.default_families(hopper, "90", "sm80") == ["sm80"]
    assert cli.process_family(hopper, "90", "sm80") == "sm80"
    assert cli.process_family(hopper, "89", "") == "sm80"


def test_clock_line_parsing():
    got = results.parse_smi("1980, 1980, 2619, 2619, 580.95.05, 700.00")
    assert got == {"source": "nvidia-smi", "sm_MHz": 1980.0, "sm_max_MHz": 1980.0,
                   "mem_MHz": 2619.0, "mem_max_MHz": 2619.0, "driver": "580.95.05",
                   "power_limit_W": 700.0}
    assert results.parse_smi("[N/A], 1980")["sm_MHz"] == "[N/A]"


def test_compact_json_one_row_per_line():
    text = results.dumps({"rows": [{"a": 1, "b": 2.5}, {"a": 2, "b": 3.5}]})
    assert json.loads(text) == {"rows": [{"a": 1, "b": 2.5}, {"a": 2, "b": 3.5}]}
    assert '  {"a": 1, "b": 2.5},' in text.splitlines()


def test_figures_from_a_synthetic_record(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from kernelflow.bench import plots

    rc, rec, _ = run_synthetic(tmp_path, capsys)
    paths = plots.draw_all(rec, str(tmp_path / "fig"))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["decode_bandwidth.png", "layer_time.png", "roofline.png", "sk_speedup.png"]
    for p in paths:
        with open(p, "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", head[16:24])
        assert width > 400 and height > 300
    cap = plots.caption(rec).replace("\n", " ")
    assert "Synthetic GPU" in cap and rec["date"] in cap and rec["command"] in cap


def test_bench_figures_option(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc, rec, out = run_synthetic(tmp_path, capsys, "--figures", str(tmp_path / "f"))
    assert rc == 0 and len(os.listdir(tmp_path / "f")) == 4


def test_ncu_command_for_a_config():
    args = profile.build_parser().parse_args(["decode", "--h-q", "16", "--batch", "8",
                                              "--s-k", "16384", "--format", "int8",
                                              "--family", "sm80"])
    cmd = profile.ncu_command(args, "/opt/ncu", python="/usr/bin/python3")
    assert cmd[0] == "/opt/ncu"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:mla_decode"
    assert cmd[cmd.index("--launch-skip") + 1] == str(profile.WARMUPS)
    assert cmd[cmd.index("--launch-count") + 1] == "1"
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert metrics == list(profile.METRICS)
    for needed in ("dram__throughput", "sm__warps_active", "sm__pipe_tensor_op_hmma_cycles_active",
                   "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld", "sm__inst_issued"):
        assert any(m.startswith(needed + ".") for m in metrics), needed
    target = cmd[cmd.index("/usr/bin/python3"):]
    assert target == ["/usr/bin/python3", "-m", "kernelflow.bench.profile", "run-one", "--h-q",
                      "16", "--batch", "8", "--s-k", "16384", "--format", "int8", "--page", "64"]
    env = profile.ncu_env(args)
    assert env["KF_KERNEL_FAMILY"] == "sm80" and env["KF_NVTX"] == "1"


def test_ncu_csv_parsing():
    text = "\n".join([
        "==PROF== Connected to process 1",
        '"ID","Kernel Name","gpu__time_duration.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed"',
        '"","","usecond","%"',
        '"0","mla_decode_sm80_kernel","12.5","91.2"',
    ])
    got = profile.parse_ncu_csv(text)
    assert got["Kernel Name"][0] == "mla_decode_sm80_kernel"
    assert got["gpu__time_duration.sum"] == ("12.5", "usecond")
    assert got["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == ("91.2", "%")
    assert profile.parse_ncu_csv("no csv here") == {}


def test_ncu_command_for_a_layer_kernel():
    args = profile.build_parser().parse_args(["layer-kernel", "--kernel", "regex:q_absorb",
                                              "--batch", "64", "--layers", "9"])
    cmd = profile.ncu_command(args, "/opt/ncu", python="/usr/bin/python3")
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:q_absorb"
    # the middle layer of the last of WARMUPS + 1 graph launches, the caches not flushed
    assert cmd[cmd.index("--launch-skip") + 1] == str(profile.WARMUPS * 9 + 4)
    assert cmd[cmd.index("--cache-control") + 1] == "none"
    assert cmd[cmd.index("/usr/bin/python3"):] == [
        "/usr/bin/python3", "-m", "kernelflow.bench.profile", "run-layer", "--batch", "64",
        "--layers", "9", "--s-k", "4096", "--format", "bf16"]
    args = profile.build_parser().parse_args(["layer-kernel", "--kernel", "regex:skinny_gemm",
                                              "--skip", "7", "--stalls", "20"])
    record, export = profile.stalls_commands(args, "/opt/ncu", "/tmp/r", python="/usr/bin/python3")
    assert record[record.index("--launch-skip") + 1] == "7" and "WarpStateStats" in record
    assert export[:3] == ["/opt/ncu", "-i", "/tmp/r.ncu-rep"]
    assert "after 7 launches matching regex:skinny_gemm" in profile.describe(args)
    assert profile.ncu_env(args)["KF_NVTX"] == "1"  # no --family here: the environment's


def test_profile_print_command_needs_no_gpu(capsys):
    assert profile.main(["decode", "--print-command", "--ncu", "ncu"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("ncu --target-processes all") and "run-one" in line
    assert profile.main(["layer-kernel", "--kernel", "regex:q_absorb", "--print-command",
                         "--ncu", "ncu"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("ncu --target-processes all") and "run-layer" in line


def test_a_failing_section_is_recorded_and_the_others_run(tmp_path, capsys):
    class LayerBreaks(SyntheticSections):
        def layer(self, argv, peaks, on_step):
            raise RuntimeError("layer graph capture failed")

    path = tmp_path / "r.json"
    rc = cli.main(["--quick", "--json", str(path), "--progress", "none"], sections=LayerBreaks())
    assert rc == 1
    rec = json.loads(path.read_text())
    assert rec["layer"]["error"] == "RuntimeError: layer graph capture failed"
    assert rec["failures"] == 1 and rec["decode"]["rows"] and rec["formats"]["rows"]
    assert "Traceback" in open(rec["log"]).read()
    assert "layer: FAILED RuntimeError" in capsys.readouterr().err


def test_compact_json_writes_numpy_scalars():
    np = pytest.importorskip("numpy")
    text = results.dumps({"ok": np.bool_(True), "x": np.float32(0.5), "n": np.int64(3),
                          "a": np.arange(3), "t": ValueError("x")})
    assert json.loads(text) == {"ok": True, "x": 0.5, "n": 3, "a": [0, 1, 2], "t": "x"}


@pytest.mark.gpu
@pytest.mark.needs_torch
def test_bench_on_the_gpu(tmp_path, capsys):
    """The real measurements, small: the decode with every family the build has for this device
    and the 8-bit formats, each row checked against the float64 reference inside the run."""
    import kernelflow as kf

    families = cli.default_families(kf.build_info(), results.gpu_info(0)["sm"],
                                    os.environ.get("KF_KERNEL_FAMILY", ""))
    path = tmp_path / "gpu.json"
    rc = cli.main(["--sections", "decode", "formats", "--no-baselines", "--peaks-from-spec",
                   "--progress", "none", "--json", str(path), "--decode-args",
                   "--h-q 16 128 --batch 1 4 --s-k 1024 --replays 5",
                   "--formats-args", "--s-k 1024 --batch 4 --replays 5"])
    rec = json.loads(path.read_text())
    assert rc == 0, open(rec["log"]).read()[-3000:]
    assert rec["families"] == families
    assert rec["gpu"]["name"] and rec["gpu"]["num_sms"] > 0
    assert rec["gpu"]["clocks"]["source"] in ("NVML (nvidia-ml-py)", "nvidia-smi")
    ours = [r for r in rec["decode"]["rows"] if r["kernel"] == "kernelflow"]
    assert sorted((r["family"], r["h_q"], r["b"]) for r in ours) == sorted(
        (f, h, b) for f in families for h in (16, 128) for b in (1, 4))
    for r in ours:
        assert r["check"]["ok"], r
        assert r["timing"] == "graph" and 0 < r["us"] < 1e4
        assert 0 < r["frac_read_peak"] < 1.5 and 0 < r["frac_mma_peak"] < 1.5
    fmts = {r["format"]: r for r in rec["formats"]["rows"]}
    assert set(fmts) == set(cli.FORMATS)
    assert all(r["check"]["ok"] and r["us"] > 0 for r in fmts.values())
    assert 0.3 < fmts["fp8_e4m3"]["speedup_vs_bf16"] < 3
    assert "kernelflow bench" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.needs_torch
def test_forced_family_in_a_child_process_on_the_gpu(tmp_path):
    """A family other than the process's runs in a child with KF_KERNEL_FAMILY set: its rows
    come back checked and timed, the child's printout goes to the log."""
    from kernelflow.bench import peaks as peaks_mod

    log = tmp_path / "child.log"
    steps = []
    with open(log, "w") as stream:
        res = cli.GpuSections(stream).decode_child(
            ["--h-q", "16", "--batch", "2", "--s-k", "512", "--replays", "3"],
            dict(peaks_mod.SPEC_PEAKS), "sm80", steps.append)
    rows = [r for r in res["rows"] if r["kernel"] == "kernelflow"]
    assert len(rows) == 1 and rows[0]["check"]["ok"] and rows[0]["us"] > 0
    assert not any(r["kernel"] in ("triton", "torch") for r in res["rows"])
    assert steps == ["decode sm80 h_q=16 b=2 s_k=512 page=64 bf16"]
    text = open(log).read()
    assert "== family sm80: " in text and "[h_q=16 b=2 s_k=512 page=64 bf16]" in text


@pytest.mark.gpu
@pytest.mark.needs_torch
def test_profile_layer_kernel_count_on_the_gpu(capsys):
    rc = profile.main(["layer", "--batch", "1", "--layers", "27", "--s-k", "256"])
    out = capsys.readouterr().out
    assert rc == 0, out
    per_layer = float(out.split(" per layer")[0].rsplit(" ", 1)[-1])
    assert 1 <= per_layer <= 8


def test_decode_table_keeps_s_q_rows_apart():
    peaks = {"read_GBps": 4600.0, "mma_sync_bf16_TFLOPS": 630.0, "source": "measured"}

    def row(s_q, us, **extra):
        r = {"kernel": "kernelflow", "family": "sm90a", "h_q": 64, "s_k": 4096, "b": 128,
             "us": us, "GBps": 3000.0, "TFLOPS": 350.0, "frac_read_peak": 0.65,
             "frac_mma_peak": 0.55}
        return dict(r, **({} if s_q is None else {"s_q": s_q}), **extra)

    one = cli.decode_table({"decode": {"rows": [row(None, 205.0)]}, "peaks": peaks})
    assert one[2] == "| family | h_q | s_k | b | kernelflow |" and "s_q 1" in one[0]
    both = cli.decode_table({"decode": {"rows": [row(1, 205.0), row(2, 345.0)]}, "peaks": peaks})
    assert both[2] == "| family | h_q | s_q | s_k | b | kernelflow |"
    assert [ln.split(" | ")[2:4] for ln in both[4:6]] == [["1", "4096"], ["2", "4096"]]
    assert "205.0" in both[4] and "345.0" in both[5]


def test_plot_series_takes_one_s_q():
    from kernelflow.bench import plots

    rows = [{"kernel": "kernelflow", "h_q": 64, "s_k": 4096, "b": b, "us": us, **extra}
            for b, us, extra in ((64, 117.0, {}), (128, 205.0, {"s_q": 1}),
                                 (128, 345.0, {"s_q": 2}))]
    assert plots.series(rows, "kernelflow", 64, 4096, "us") == ([64, 128], [117.0, 205.0])
    assert plots.series(rows, "kernelflow", 64, 4096, "us", s_q=2) == ([128], [345.0])
