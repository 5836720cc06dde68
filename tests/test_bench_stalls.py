"""kernelflow.bench.stalls and `profile decode --stalls` on the CPU: ncu's source page (CSV) into
the stall reasons' shares and the hottest instructions, and the two ncu commands."""

import csv
import io

import pytest

from kernelflow.bench import profile, stalls

REASONS = ("barrier", "long_sb", "wait", "no_inst")
HEADER = (["Address", "Source", stalls.SAMPLES, "Warp Stall Sampling (Not-issued Samples)",
           "# Samples", "Instructions Executed"]
          + [f"stall_{r}" for r in REASONS] + [f"stall_{r} (Not Issued)" for r in REASONS])


def page(rows) -> str:
    """ncu's source page as CSV: the kernel-name line, the header, one row per instruction."""
    out = io.StringIO()
    out.write('"Kernel Name","void k(int)",\n')
    w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(HEADER)
    for i, (sass, by_reason) in enumerate(rows):
        n = sum(by_reason.values())
        all_cols = [str(by_reason.get(r, 0)) for r in REASONS]
        w.writerow([hex(0x7000 + 16 * i), f"      {sass}", str(n), str(n), str(n), "64"]
                   + all_cols + ["0"] * len(REASONS))
    return out.getvalue()


TEXT = page([("LDC R1, c[0x0][0x28]", {"wait": 2}),
             ("@!P0  BRA 0x7f00", {"long_sb": 60, "wait": 1}),
             ("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8], RZ, !UPT", {"wait": 7}),
             ("LDS R231, [R223+0x38000]", {"barrier": 28, "no_inst": 2}),
             ("EXIT", {})])


def test_shares_and_hottest_instructions():
    s = stalls.stall_summary(TEXT, top=2)
    assert s["samples"] == 100
    assert s["reasons"][0] == ("long_sb", pytest.approx(0.60))
    assert dict(s["reasons"]) == pytest.approx({"long_sb": 0.6, "barrier": 0.28, "wait": 0.10,
                                                "no_inst": 0.02})
    first, second = s["hot"]
    assert (first["index"], first["sass"], first["share"]) == (1, "@!P0  BRA 0x7f00",
                                                              pytest.approx(0.61))
    assert first["reasons"] == [("long_sb", 60.0), ("wait", 1.0)]
    assert second["index"] == 3 and second["reasons"][0] == ("barrier", 28.0)
    lines = stalls.summary_lines(s)
    assert lines[0] == "warp-stall samples: 100" and "long_sb 60.0%" in lines[1]
    assert "61.0%" in lines[3] and "BRA" in lines[3]


def test_not_a_source_page_is_named():
    with pytest.raises(ValueError, match="Address"):
        stalls.stall_summary("==PROF== nothing profiled\n")
    with pytest.raises(ValueError, match="no warp-stall samples"):
        stalls.stall_summary(page([("EXIT", {})]))


def test_the_ncu_commands():
    args = profile.build_parser().parse_args(["decode", "--h-q", "128", "--batch", "64",
                                              "--stalls", "30"])
    record, export = profile.stalls_commands(args, "/opt/ncu", "/tmp/r", python="/usr/bin/python3")
    assert record[:2] == ["/opt/ncu", "--target-processes"]
    assert record[record.index("--launch-skip") + 1] == str(profile.WARMUPS)
    assert "WarpStateStats" in record and "SourceCounters" in record
    assert record[record.index("-o") + 1] == "/tmp/r"
    assert record[record.index("/usr/bin/python3"):][:4] == ["/usr/bin/python3", "-m",
                                                              "kernelflow.bench.profile", "run-one"]
    assert export == ["/opt/ncu", "-i", "/tmp/r.ncu-rep", "--page", "source", "--csv",
                      "--print-source", "sass"]


def test_print_command_shows_both(capsys):
    assert profile.main(["decode", "--stalls", "10", "--print-command", "--ncu", "/opt/ncu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "SourceCounters" in out[0] and "--page source" in out[1]
