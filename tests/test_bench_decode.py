"""kernelflow.bench.decode on the CPU: the options (--s-q as a list, --flashmla-matrix and what it
expands to, --formats with one --s-q), the grid's order, a problem's FLOPs and bytes at s_q > 1,
FlashMLA's arguments and the check of its s_q > 1 output (a stand-in flash_mla computing the
float64 reference), which kernels run at s_q > 1, FlashMLA's matrix built from made-up rows, the
printed table's s_q column, and a whole grid run with stand-in kernels and injected times."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

pytestmark = pytest.mark.needs_torch

MATRIX_ARGV = ["--flashmla-matrix"]


@pytest.fixture
def dec():
    from kernelflow.bench import decode

    return decode


@pytest.fixture
def on_cpu(dec, monkeypatch):
    """The module's problems on the CPU, and torch.cuda.synchronize a no-op (no GPU here)."""
    import torch

    monkeypatch.setattr(dec, "DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return dec


def parse_error(dec, capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        dec.parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


# ---- options --------------------------------------------------------------------------------------

def test_s_q_is_a_list_in_the_grid(dec, capsys):
    assert dec.parse_args([]).s_q == [1]
    args = dec.parse_args(["--s-q", "1", "2", "--h-q", "16", "--batch", "8"])
    assert args.s_q == [1, 2] and args.h_q == [16] and args.batch == [8]
    assert args.formats is None and not args.no_triton and not args.no_flashmla
    assert dec.parse_args(["--s-q", "3"]).s_q == [3]  # grid mode, s_q > 1 alone
    assert "--s-q" in parse_error(dec, capsys, ["--s-q", "1", "5"])


def test_workers_option(dec, capsys):
    assert dec.parse_args([]).workers is None
    assert dec.parse_args(["--workers", "132"]).workers == 132
    assert "--workers" in parse_error(dec, capsys, ["--workers", "0"])


def test_defaults_without_shape_options(dec):
    args = dec.parse_args([])
    assert (args.h_q, args.batch, args.s_k, args.s_q) == ([16, 128], [1, 8, 16, 32, 64, 128],
                                                          [4096, 16384], [1])
    assert (args.tune, args.replays) == ("full", 30)
    quick = dec.parse_args(["--quick"])
    assert (quick.h_q, quick.batch, quick.s_k, quick.s_q) == ([16, 128], [1, 32, 128], [4096],
                                                              [1])


def test_flashmla_matrix_expands_to_flashmlas_grid(dec):
    args = dec.parse_args(MATRIX_ARGV + ["--json", "m.json", "--replays", "20"])
    assert args.batch == [128] and args.s_k == [4096, 16384]
    assert args.h_q == [16, 32, 64, 128] and args.s_q == [1, 2]
    assert args.no_triton and args.no_torch and args.no_flashinfer
    assert not args.no_flashmla and not args.baselines_only and args.formats is None
    assert args.flashmla_matrix and args.replays == 20 and args.json == "m.json"
    order = dec.grid_order(args)
    assert len(order) == 16
    # s_k, then s_q, then h_q, then b.
    assert order[:5] == [(16, 128, 4096, 1), (32, 128, 4096, 1), (64, 128, 4096, 1),
                         (128, 128, 4096, 1), (16, 128, 4096, 2)]
    assert order[-1] == (128, 128, 16384, 2)
    assert not dec.parse_args([]).flashmla_matrix


@pytest.mark.parametrize("extra, named", [
    (["--batch", "64"], "--batch"),
    (["--s-q", "1"], "--s-q"),
    (["--h-q", "16", "--s-k", "4096"], "--h-q --s-k"),
    (["--quick"], "--quick"),
    (["--formats", "bf16"], "--formats"),
    (["--sk-sweep"], "--sk-sweep"),
    (["--baselines-only"], "--baselines-only"),
    (["--no-flashmla"], "--no-flashmla"),
])
def test_flashmla_matrix_refuses_what_it_sets_or_cannot_run(dec, capsys, extra, named):
    err = parse_error(dec, capsys, MATRIX_ARGV + extra)
    assert "--flashmla-matrix" in err and f"leave out {named}" in err


def test_formats_with_one_s_q_as_before(dec, capsys):
    args = dec.parse_args(["--formats", "bf16", "fp8_e4m3", "--s-q", "2", "--h-q", "16",
                           "--batch", "64", "--s-k", "4096"])
    assert args.formats == ["bf16", "fp8_e4m3"] and args.s_q == [2]
    assert dec.grid_order(args) == [(16, 64, 4096, 2)]
    sweep = dec.parse_args(["--sk-sweep", "--s-q", "4"])
    assert sweep.formats == ["bf16", "fp8_e4m3", "int8"] and sweep.s_q == [4]
    assert sweep.h_q == [16] and sweep.batch == [64] and len(sweep.s_k) == 7
    err = parse_error(dec, capsys, ["--formats", "bf16", "--s-q", "1", "2"])
    assert "--s-q" in err and "one value" in err


def test_max_copies_below_one_is_refused(dec, capsys):
    assert "--max-copies" in parse_error(dec, capsys, ["--max-copies", "0"])


def test_help_names_the_matrix_and_the_s_q_list(dec, capsys):
    with pytest.raises(SystemExit) as e:
        dec.parse_args(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--flashmla-matrix" in text and "--batch 128 --s-k 4096 16384" in text
    assert "--s-q {1,2,3,4} [{1,2,3,4} ...]" in text


# ---- problems and kernels at s_q > 1 --------------------------------------------------------------

def small_problem(dec, s_q, h_q=16, b=2, s_k=100):
    import torch

    return dec.Problem(h_q, b, s_k, 64, torch.bfloat16, rotate_bytes=0, max_copies=2, seed=1,
                       s_q=s_q)


def test_problem_flops_count_the_causal_positions_and_bytes_the_cache_once(on_cpu):
    dec = on_cpu
    one, two = small_problem(dec, 1), small_problem(dec, 2)
    assert one.flops == 2 * 2 * 16 * 100 * 1088
    assert two.flops == 2 * 2 * 16 * (99 + 100) * 1088  # row 0 sees 99 positions, row 1 all 100
    cache = 2 * 100 * 1152
    assert one.bytes == cache + 2 * 16 * (576 + 512) * 2
    assert two.bytes == cache + 2 * 2 * 16 * (576 + 512) * 2
    assert two.copies == 2 and tuple(two.qs.shape) == (2, 2, 2, 16, 576)
    assert tuple(two.block_tables.shape) == (2, 2, 2)


class StandInFlashMLA:
    """flash_mla's two calls as the benchmark makes them, recorded; the decode is the float64
    reference in FlashMLA's output layout (out [b, s_q, h_q, 512] in q's dtype, lse [b, h_q, s_q]
    fp32), causal as FlashMLA's causal=True, or every row seeing the whole cache when `causal`
    is False here (a wrong mask the check must catch at s_q > 1)."""

    def __init__(self, causal=True):
        self.causal, self.calls = causal, []

    def get_mla_metadata(self, cache_seqlens, num_heads_per_head_k, num_heads_k):
        self.calls.append(("metadata", num_heads_per_head_k, num_heads_k))
        return "tile_scheduler_metadata", "num_splits"

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits, softmax_scale=None,
                               causal=False):
        import torch
        from kernelflow import reference as ref

        self.calls.append(("decode", tuple(q.shape), tuple(k_cache.shape), head_dim_v,
                           tile_scheduler_metadata, num_splits, softmax_scale, causal))
        qn = q.double().numpy()
        kv = k_cache.double().numpy()[:, :, 0]
        bt, lens = block_table.numpy(), cache_seqlens.numpy()
        if self.causal and causal:
            o, lse = ref.mla_decode_ref(qn, kv, lens, softmax_scale, block_table=bt)
        else:
            per_row = [ref.mla_decode_ref(qn[:, s:s + 1], kv, lens, softmax_scale, block_table=bt)
                       for s in range(q.shape[1])]
            o = np.concatenate([r[0] for r in per_row], axis=1)
            lse = np.concatenate([r[1] for r in per_row], axis=2)
        return torch.from_numpy(o).to(q.dtype), torch.from_numpy(lse).float()


@pytest.mark.parametrize("s_q", [1, 2])
def test_flashmla_gets_s_q_times_h_q_rows_per_kv_head_and_its_output_is_checked(on_cpu, s_q):
    dec = on_cpu
    p = small_problem(dec, s_q)
    fm = StandInFlashMLA()
    runner = dec.FlashMLARunner(fm)
    runner.prepare(p)
    check = runner.check(p)
    assert check["ok"], check
    assert check["worst_row_cos_dist"] < 1e-5 and check["lse_max_abs_err"] < 1e-4
    assert fm.calls[0] == ("metadata", s_q * 16, 1)
    assert fm.calls[1] == ("decode", (2, s_q, 16, 576), (p.kv.shape[0], 64, 1, 576), 512,
                           "tile_scheduler_metadata", "num_splits", dec.SCALE, True)
    runner.release()
    assert vars(runner) == {"fm": fm}


def test_a_decode_without_the_causal_mask_fails_the_check_at_s_q_2(on_cpu):
    dec = on_cpu
    p = small_problem(dec, 2)
    runner = dec.FlashMLARunner(StandInFlashMLA(causal=False))
    runner.prepare(p)
    check = runner.check(p)
    assert not check["ok"] and check["lse_max_abs_err"] > 1e-4
    one = small_problem(dec, 1)  # at s_q = 1 the mask changes nothing
    runner.prepare(one)
    assert runner.check(one)["ok"]


def test_release_keeps_what_each_constructor_set(dec):
    """The grid reuses one runner per kernel across problems: release() drops the last problem's
    state and keeps every attribute the constructor set (a runner without one fails at the next
    problem's prepare)."""
    runners = [dec.KernelFlowRunner(None, workers=66), dec.TritonRunner("quick", 132),
               dec.TorchRunner(), dec.FlashMLARunner(None), dec.FlashInferRunner(None)]
    for r in runners:
        made = dict(vars(r))
        r.problem_state = object()
        r.release()
        assert vars(r) == made, r.name


def test_the_baselines_of_s_q_1_are_left_out_above_it(dec):
    runners = [dec.KernelFlowRunner(None), dec.TritonRunner("quick", 132), dec.TorchRunner(),
               dec.FlashMLARunner(None), dec.FlashInferRunner(None)]
    run, left = dec.split_by_s_q(runners, 1)
    assert run == runners and left == []
    run, left = dec.split_by_s_q(runners, 2)
    assert [r.name for r in run] == ["kernelflow", "flashmla"]
    assert left == ["triton", "torch", "flashinfer"]


# ---- FlashMLA's matrix and the table --------------------------------------------------------------

def timed_row(kernel, s_q, h_q, s_k, us, b=128, ok=True):
    return {"kernel": kernel, "h_q": h_q, "b": b, "s_k": s_k, "s_q": s_q, "us": us,
            "check": {"ok": ok}}


def matrix_rows(kf_us, fm_us):
    """kernelflow and FlashMLA rows over FlashMLA's matrix, times from the two functions of
    (s_q, h_q, s_k) (None: no row of that kernel)."""
    rows = []
    for s_q in (1, 2):
        for h_q in (16, 32, 64, 128):
            for s_k in (4096, 16384):
                for kernel, us in (("kernelflow", kf_us), ("flashmla", fm_us)):
                    t = us(s_q, h_q, s_k)
                    if t is not None:
                        rows.append(timed_row(kernel, s_q, h_q, s_k, t))
    return rows


def test_matrix_ratio_is_flashmlas_time_over_ours(dec):
    # kernelflow faster exactly where h_q is 16 or (s_q 1, h_q 32): 2 * 2 + 2 = 6 cells.
    def kf(s_q, h_q, s_k):
        return 100.0 if h_q == 16 or (s_q, h_q) == (1, 32) else 200.0

    rows = matrix_rows(kf, lambda s_q, h_q, s_k: 150.0)
    rows.append(timed_row("kernelflow", 1, 16, 4096, 1.0, b=64))  # another batch: not in it
    rows.append(timed_row("flashmla_spec", 1, 16, 4096, 1.0))  # not this run: never in it
    cells = dec.flashmla_matrix(rows)
    assert len(cells) == 16
    assert [(c["s_q"], c["h_q"], c["s_k"]) for c in cells[:3]] == [(1, 16, 4096), (1, 16, 16384),
                                                                   (1, 32, 4096)]
    first = cells[0]
    assert first["kf_us"] == 100.0 and first["flashmla_us"] == 150.0
    assert first["ratio"] == pytest.approx(1.5) and first["kf_check_ok"] and first["b"] == 128
    assert next(c for c in cells if (c["s_q"], c["h_q"]) == (2, 32))["ratio"] == pytest.approx(0.75)
    assert dec.not_slower(cells) == 6
    for c in cells:
        assert {"s_q", "h_q", "s_k", "kf_us", "flashmla_us", "ratio"} <= set(c)
    lines = dec.matrix_lines(cells, True)
    table = [ln for ln in lines if ln.startswith("| ")]
    assert table[0] == ("| s_q | h_q 16, s_k 4096 | h_q 16, s_k 16384 | h_q 32, s_k 4096 | "
                        "h_q 32, s_k 16384 | h_q 64, s_k 4096 | h_q 64, s_k 16384 | "
                        "h_q 128, s_k 4096 | h_q 128, s_k 16384 |")
    assert table[1] == "|" + " --- |" * 9
    assert table[2] == "| 1 | 1.500x | 1.500x | 1.500x | 1.500x | 0.750x | 0.750x | 0.750x | 0.750x |"
    assert table[3] == "| 2 | 1.500x | 1.500x | 0.750x | 0.750x | 0.750x | 0.750x | 0.750x | 0.750x |"
    assert lines[-1] == "kernelflow not slower than FlashMLA in 6 of 16 cells"
    assert any("> 1: kernelflow faster" in ln for ln in lines)
    json.dumps(cells)


def test_matrix_cells_without_both_times_or_with_a_failed_check_are_not_counted(dec):
    rows = matrix_rows(lambda s_q, h_q, s_k: None if (s_q, h_q, s_k) == (2, 128, 16384) else 100.0,
                       lambda s_q, h_q, s_k: 120.0)
    rows = [dict(r, check={"ok": False}) if (r["kernel"], r["s_q"], r["h_q"], r["s_k"]) ==
            ("kernelflow", 1, 64, 4096) else r for r in rows]
    rows.append({"kernel": "kernelflow", "h_q": 128, "b": 128, "s_k": 16384, "s_q": 2,
                 "error": "RuntimeError: out of memory"})
    cells = dec.flashmla_matrix(rows)
    last = cells[-1]
    assert (last["s_q"], last["h_q"], last["s_k"]) == (2, 128, 16384)
    assert last["kf_us"] is None and last["ratio"] is None and last["flashmla_us"] == 120.0
    failed = next(c for c in cells if (c["s_q"], c["h_q"], c["s_k"]) == (1, 64, 4096))
    assert failed["ratio"] == pytest.approx(1.2) and not failed["kf_check_ok"]
    assert dec.not_slower(cells) == 14
    lines = dec.matrix_lines(cells, True)
    assert lines[-1] == "kernelflow not slower than FlashMLA in 14 of 16 cells"
    row2 = next(ln for ln in lines if ln.startswith("| 2 |"))
    assert row2.endswith("| 1.200x | - |")
    row1 = next(ln for ln in lines if ln.startswith("| 1 |"))
    assert "1.200x !" in row1


def test_matrix_without_flashmla_says_so_and_shows_no_ratio(dec):
    rows = matrix_rows(lambda s_q, h_q, s_k: 100.0, lambda s_q, h_q, s_k: None)
    rows.append(timed_row("flashmla_spec", 1, 16, 4096, 150.0))  # the anchor's figure
    cells = dec.flashmla_matrix(rows)
    assert len(cells) == 16
    assert all(c["ratio"] is None and c["flashmla_us"] is None and c["kf_us"] == 100.0
               for c in cells)
    lines = dec.matrix_lines(cells, False)
    text = "\n".join(lines)
    assert "FlashMLA did not run in this call" in text and "no ratios" in text
    assert "x |" not in text and "not slower" not in text


def table_entry(s_q, h_q=16, b=128, s_k=4096):
    res = {"kernelflow": {"us": 100.0, "GBps": 4000.0, "TFLOPS": 50.0, "frac_read_peak": 0.9,
                          "frac_mma_peak": 0.08},
           "flashmla": {"us": 110.0}}
    return {"h_q": h_q, "b": b, "s_k": s_k, "s_q": s_q, "res": res,
            "ratios": {"kernelflow_speedup_vs_flashmla": 1.1}}


def test_the_table_has_an_s_q_column(dec):
    args = dec.parse_args(["--s-q", "1", "2"])
    pk = {"read_GBps": 4400.0, "mma_sync_bf16_TFLOPS": 630.0, "source": "measured here"}
    lines = dec.grid_table([table_entry(1), table_entry(2)], args, "Some GPU", pk, True)
    header = next(ln for ln in lines if ln.startswith("| h_q |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[:5] == ["h_q", "b", "s_k", "s_q", "KF us"] and "KF/FlashMLA" in cols
    sep = lines[lines.index(header) + 1]
    assert sep.count("---") == len(cols)
    body = [ln for ln in lines if ln.startswith("| 16 |")]
    assert [ln.split("|")[4].strip() for ln in body] == ["1", "2"]
    for ln in body:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == len(cols)
        assert cells[cols.index("KF us")] == "100.0" and cells[cols.index("FlashMLA us")] == "110.0"
        assert cells[cols.index("KF/FlashMLA")] == "1.10x" and cells[cols.index("torch us")] == "-"
    assert any("s_q 1 2 (causal above 1)" in ln for ln in lines)


# ---- a whole grid run with stand-in kernels -------------------------------------------------------

class StandIn:
    """A kernel of the grid that checks clean and whose unit carries its made-up time."""

    def __init__(self, name, multi_token, us):
        self.name, self.multi_token, self.us = name, multi_token, us
        self.release_calls = 0

    def prepare(self, p):
        self.problem = p

    def check(self, p):
        return {"ok": True, "worst_row_cos_dist": 0.0, "lse_max_abs_err": 0.0, "finite": True,
                "empty_rows_exact": True}

    def unit(self, p):
        def run():
            return None
        run.us = self.us(p)
        return run

    def release(self):
        self.release_calls += 1
        self.__dict__.pop("problem", None)


def grid_run(dec, monkeypatch, capsys, with_flashmla):
    import torch

    def kf_us(p):
        return 100.0 if p.h_q == 16 else 300.0

    runners = [StandIn("kernelflow", True, kf_us), StandIn("triton", False, lambda p: 400.0)]
    if with_flashmla:
        runners.append(StandIn("flashmla", True, lambda p: 200.0))
    monkeypatch.setattr(dec, "make_runners", lambda args, n: (runners, [], with_flashmla))
    monkeypatch.setattr(dec, "time_unit", lambda unit, calls, replays: {
        "us": unit.us, "us_min": unit.us, "timing": "graph"})
    args = dec.parse_args(["--flashmla-matrix", "--peaks-from-spec"])
    args.no_triton = False
    args.batch, args.s_k, args.h_q = [2], [64, 128], [16, 32]  # small shapes for the CPU
    pk = {"read_GBps": 4000.0, "mma_sync_bf16_TFLOPS": 600.0, "source": "synthetic"}
    ctx = {"device": "Stand-in GPU", "num_sms": 1, "l2_bytes": 0, "dtype": torch.bfloat16,
           "rotate_bytes": 0}
    out = dec.run_grid(args, pk, ctx)
    return out, runners, capsys.readouterr().out


def test_grid_run_with_s_q_1_and_2(on_cpu, monkeypatch, capsys):
    dec = on_cpu
    out, runners, text = grid_run(dec, monkeypatch, capsys, with_flashmla=True)
    rows = out["rows"]
    shapes = [(r["s_k"], r["s_q"], r["h_q"]) for r in rows if r["kernel"] == "kernelflow"]
    assert shapes == [(64, 1, 16), (64, 1, 32), (64, 2, 16), (64, 2, 32),
                      (128, 1, 16), (128, 1, 32), (128, 2, 16), (128, 2, 32)]
    assert {(r["kernel"], r["s_q"]) for r in rows} == {
        ("kernelflow", 1), ("kernelflow", 2), ("triton", 1), ("flashmla", 1), ("flashmla", 2)}
    for r in rows:
        assert r["check"]["ok"] and r["b"] == 2 and r["us"] > 0 and r["TFLOPS"] > 0
    assert text.count("triton: left out at s_q 2 (they decode s_q = 1 only)") == 4
    assert "[h_q=16 b=2 s_k=64 page=64 bf16]" in text  # s_q = 1: the line as before
    assert "[h_q=16 b=2 s_k=64 s_q=2 page=64 bf16]" in text
    assert all(r.release_calls == 8 and "problem" not in vars(r) for r in runners)
    # FLOPs at s_q 2 count the causal positions: (63 + 64) against 64 at s_q 1.
    kf = {(r["s_k"], r["s_q"], r["h_q"]): r for r in rows if r["kernel"] == "kernelflow"}
    assert kf[(64, 2, 16)]["TFLOPS"] / kf[(64, 1, 16)]["TFLOPS"] == pytest.approx(127 / 64)
    assert all("s_q" in t for t in out["ratios"])
    assert out["ratios"][0]["ratios"]["kernelflow_speedup_vs_flashmla"] == pytest.approx(2.0)
    cells = out["flashmla_matrix"]
    assert len(cells) == 8 and out["flashmla_matrix_not_slower"] == 4
    assert {c["ratio"] for c in cells} == {2.0, 200.0 / 300.0}
    assert "kernelflow not slower than FlashMLA in 4 of 8 cells" in text
    assert text.index("| h_q | b | s_k | s_q |") < text.index("## FlashMLA's matrix")
    assert text.index("## FlashMLA's matrix") < text.index("checks: 20 run, 0 failed")
    from kernelflow.bench.results import plain

    assert json.loads(json.dumps(out, default=plain))["flashmla_matrix"][0]["s_q"] == 1


def test_grid_run_without_flashmla_gives_no_ratio(on_cpu, monkeypatch, capsys):
    dec = on_cpu
    out, _, text = grid_run(dec, monkeypatch, capsys, with_flashmla=False)
    assert not out["flashmla_measured"] and out["flashmla_matrix_not_slower"] is None
    assert all(c["ratio"] is None and c["kf_us"] for c in out["flashmla_matrix"])
    assert "FlashMLA did not run in this call" in text
    assert not any(r["kernel"].startswith("flashmla") for r in out["rows"])


def test_problem_memory_is_released_between_shapes(on_cpu):
    """The runner's views of a problem's cache go with release(), so only one problem's caches
    are alive when the next is made."""
    dec = on_cpu
    import weakref

    p = small_problem(dec, 2)
    runner = dec.FlashMLARunner(types.SimpleNamespace(
        get_mla_metadata=lambda *a: ("md", "splits")))
    runner.prepare(p)
    kv = weakref.ref(p.kv)
    p.free()
    assert kv() is not None  # the runner's [pages, page, 1, 576] view of it still holds it
    runner.release()
    assert kv() is None
