"""kernelflow.bench.timeline on the CPU: the stamp buffer's layout (src/cuda/common/timeline.cuh)
read back into per-event spreads, on synthetic stamps."""

import json

import numpy as np
import pytest

from kernelflow.bench import timeline as tl


def buffer(decode_blocks, combine_blocks=None, *others):
    """A stamp buffer with the given blocks' events: {block: {event index: ns}}, per kernel in
    tl.KERNELS order."""
    words = np.zeros(tl.BUFFER_WORDS, dtype=np.uint64)
    for k, blocks in enumerate((decode_blocks, combine_blocks or {}) + others):
        for b, events in blocks.items():
            for e, v in events.items():
                words[(k * tl.MAX_BLOCKS + b) * tl.EVENTS_PER_BLOCK + e] = v
    return words


def test_layout_matches_the_device_header():
    src = open(__file__.replace("tests/test_bench_timeline.py",
                                "src/cuda/common/timeline.cuh")).read()
    assert f"kTimelineMaxBlocks = {tl.MAX_BLOCKS};" in src
    assert f"kTimelineEvents = {tl.EVENTS_PER_BLOCK};" in src
    assert f"kTimelineKernels = {len(tl.KERNELS)};" in src
    assert f"kTlPiecesDone = {tl.PIECES_SLOT}," in src
    for i, name in enumerate(("kTlEntry", "kTlWaited", "kTlPieces", "kTlFirstTile", "kTlFirstEpi",
                              "kTlLastEpi", "kTlExit")):
        assert f"{name} = {i}," in src
    for i, name in enumerate(("kTlDecode", "kTlCombine", "kTlGemmProj", "kTlQAbsorb", "kTlGemmUv",
                              "kTlGemmO", "kTlGemmQb", "kTlGemmOther")):
        assert f"{name} = {i}," in src


def test_spreads_in_us_from_the_first_decode_entry():
    t0 = 5_000_000_000
    words = buffer({0: {0: t0 + 1000, 6: t0 + 9000, 7: (5 << 32) | 2},
                    3: {0: t0, 1: t0 + 500, 6: t0 + 7000, 7: 1},
                    9: {0: t0 + 2000, 6: t0 + 8000, 7: (131 << 32) | 3}},
                   {0: {0: t0 + 9500, 6: t0 + 11000}, 1: {0: t0 + 9700}})
    s = tl.summarize(words)
    assert s["decode"]["entry"] == {"n": 3, "min": 0.0, "median": 1.0, "max": 2.0}
    assert s["decode"]["waited"] == {"n": 1, "min": 0.5, "median": 0.5, "max": 0.5}
    assert s["decode"]["exit"] == {"n": 3, "min": 7.0, "median": 8.0, "max": 9.0}
    assert "pieces" not in s["decode"]  # no block stamped it
    assert s["combine"]["entry"]["n"] == 2 and s["combine"]["entry"]["max"] == 9.7
    assert s["combine"]["exit"] == {"n": 1, "min": 11.0, "median": 11.0, "max": 11.0}
    assert s["pieces_per_block"] == {"n": 3, "min": 1, "median": 2, "max": 3}
    text = tl.format_summary("bf16 h_q 16 b 1", s, 12.5)
    assert "12.50 us per call" in text and "| decode | exit | 3 | 7.00 | 8.00 | 9.00 |" in text
    rows = tl.decode_blocks(words)
    assert [r[:4] for r in rows] == [[0, 5, 2, 1.0], [3, 0, 1, 0.0], [9, 131, 3, 2.0]]
    assert rows[1][4] == 0.5 and rows[0][4] is None and rows[2][3 + 6] == 8.0


def test_no_stamps_is_none():
    assert tl.summarize(buffer({})) is None


def test_a_layer_reads_from_its_first_launch_and_lists_the_launches_it_ran():
    t0 = 7_000_000_000
    words = buffer({0: {0: t0 + 9000, 6: t0 + 20000}}, {0: {0: t0 + 20500}},
                   {0: {0: t0, 1: t0 + 800, 3: t0 + 1500, 4: t0 + 3000, 6: t0 + 3500}})
    s = tl.summarize(words, origin="first")
    assert s["gemm_proj"]["first_tile"]["median"] == 1.5 and s["decode"]["entry"]["min"] == 9.0
    assert "gemm_o" not in s and "q_absorb" not in s  # no stamps: not listed
    assert "gemm_proj" not in tl.summarize(words)  # before the decode's entry: not counted
    assert "| gemm_proj | first_epilogue | 1 | 3.00 |" in tl.format_summary("layer", s, 30.0)


def test_a_gemm_blocks_epilogue_slots_are_named_for_it():
    t0 = 7_000_000_000
    gemm = {0: {0: t0, 1: t0 + 800, 3: t0 + 1500, 4: t0 + 3000, 2: t0 + 3600, 5: t0 + 4100,
                6: t0 + 4200}}
    words = buffer({0: {0: t0 + 9000, 2: t0 + 9400, 6: t0 + 20000}}, {}, gemm)
    s = tl.summarize(words, origin="first")
    assert s["gemm_proj"]["partials"]["max"] == 3.6 and s["gemm_proj"]["stored"]["max"] == 4.1
    assert "pieces" not in s["gemm_proj"] and "last_epilogue" not in s["gemm_proj"]
    assert s["decode"]["pieces"]["max"] == 9.4  # the decode's slot 2 keeps its own name
    text = tl.format_summary("layer", s, 30.0).splitlines()
    gemm_rows = [line.split(" | ")[1] for line in text if line.startswith("| gemm_proj")]
    assert gemm_rows == ["entry", "waited", "first_tile", "first_epilogue", "partials", "stored",
                         "exit"]
    src = open(__file__.replace("tests/test_bench_timeline.py",
                                "src/cuda/common/timeline.cuh")).read()
    assert "kTlGemmPartials = kTlPieces;" in src and "kTlGemmStored = kTlLastEpi;" in src


def test_layer_steps_link_each_launch_to_the_one_before():
    ev = lambda w, x, **more: {"waited": {"n": 1, "min": w, "median": w, "max": w},  # noqa: E731
                               "exit": {"n": 1, "min": x - 0.5, "median": x - 0.2, "max": x},
                               **{k: {"n": 1, "min": v, "median": v, "max": v}
                                  for k, v in more.items()}}
    s = {"gemm_proj": ev(5.0, 13.0, entry=1.0, first_epilogue=10.0, partials=11.0, stored=12.5),
         "q_absorb": ev(13.5, 19.0, first_epilogue=16.0, stored=18.0),
         "decode": ev(20.0, 90.0), "combine": ev(91.0, 93.0),
         "gemm_uv": ev(93.5, 97.0, entry=93.25), "gemm_o": ev(97.5, 102.0),
         "pieces_per_block": {"n": 0}}
    steps = tl.layer_steps(s, 100.0)
    assert [r["kernel"] for r in steps] == ["gemm_proj", "q_absorb", "decode", "combine",
                                            "gemm_uv", "gemm_o"]
    # the first launch follows the previous layer's W_o, one period (100 us) earlier: 102 - 100
    assert steps[0] == {"kernel": "gemm_proj", "link": 3.0, "wait_to_last_exit": 8.0,
                        "entry_lead": 1.0, "epilogue": 2.5, "sums": 1.5}
    assert steps[1] == {"kernel": "q_absorb", "link": 0.5, "wait_to_last_exit": 5.5,
                        "epilogue": 2.0}
    assert steps[2] == {"kernel": "decode", "link": 1.0, "wait_to_last_exit": 70.0}
    assert steps[4]["entry_lead"] == -0.25  # W_UV's blocks entered after the combine's exit
    text = tl.format_layer_steps(steps)
    assert "| gemm_proj | 3.00 | 8.00 | 1.00 | 2.50 | 1.50 |" in text
    assert "| decode | 1.00 | 70.00 | - | - | - |" in text


def test_a_stored_layer_run_prints_its_tables_without_a_gpu(tmp_path, capsys):
    t0 = 7_000_000_000
    words = buffer({0: {0: t0 + 9000, 1: t0 + 9500, 6: t0 + 20000}}, {},
                   {0: {0: t0, 1: t0 + 800, 6: t0 + 3500}})
    s = tl.summarize(words, origin="first")
    del s["pieces_per_block"]  # compacted files do not keep it
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(
        {"my_run": {"rows": [{"model": "v2_lite", "b": 64, "us_per_layer": 30.0,
                              "events": s}]}}))
    assert tl.main(["--from", str(path), "--key", "my_run"]) == 0
    out = capsys.readouterr().out
    assert "## model v2_lite b 64: 30.00 us per call" in out
    # wait 9.5 after gemm_proj's exit 3.5; entered at 9.0, 5.5 us after that exit
    assert "| decode | 6.00 | 10.50 | -5.50 | - | - |" in out
    with pytest.raises(SystemExit, match="my_run"):  # an unknown key names the file's keys
        tl.main(["--from", str(path), "--key", "other"])
