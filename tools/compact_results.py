#!/usr/bin/env python3
"""Turn a benchmark run's output into the compact JSON kept in docs/results/.

The benchmark modules write everything they know (python3 -m kernelflow.bench.decode --json keeps
each Triton configuration tried, unrounded floats, indented one value per line). docs/results/
keeps one file per benchmark, the latest run, with the GPU, date, versions, commit and command
inside and one row per line, so a reader can diff two runs and the figures can be regenerated from
it (kernelflow.bench.plots). The one-row-per-line writer is kernelflow.bench.results.dumps, which
`python -m kernelflow bench` uses too (so this tool needs kernelflow importable).

    # decode grid (kernelflow.bench.decode --json), into docs/results/decode_h200.json
    python3 tools/compact_results.py bench $OUT/bench.json docs/results/decode_h200.json \\
        --commit $(git rev-parse --short HEAD) --driver 580.159.04 \\
        --command "python3 -m kernelflow.bench.decode --tune quick --json \\$OUT/bench.json"
    # the format runs go under one key each of docs/results/formats_h200.json
    python3 tools/compact_results.py bench $OUT/formats.json docs/results/formats_h200.json \\
        --key grid --log $OUT/formats.txt --commit ... --command "..."
    # FlashMLA's matrix (kernelflow.bench.decode --flashmla-matrix --json): rows and the matrix
    python3 tools/compact_results.py bench $OUT/matrix.json docs/results/flashmla_matrix_h200.json \\
        --commit ... --driver 580.159.04 --command "..."
    # per-block timelines (python3 -m kernelflow.bench.timeline --json [--raw]), one run per key
    python3 tools/compact_results.py timeline $OUT/tl_h16.json docs/results/timeline_h200.json \
        --key h16 --commit ... --driver 580.159.04
    # bench/accuracy_8bit.py prints a markdown table; its printed output goes in
    python3 tools/compact_results.py accuracy $OUT/accuracy.txt docs/results/accuracy_8bit.json \\
        --commit ... --command "python3 bench/accuracy_8bit.py"

`--log` reads the device, versions and date from the header that kernelflow.bench.decode prints (its
--formats and --sk-sweep JSON do not carry them). Nothing here needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from kernelflow.bench.results import dumps

# Keys of a kernelflow.bench.decode row that a reader or the figures use; everything else is dropped
# (the Triton search's "tried" list, us_min, the number of cache copies).
ROW_KEYS = ("kernel", "format", "h_q", "s_q", "b", "s_k", "page", "dtype", "workers", "us",
            "GBps", "TFLOPS", "frac_read_peak", "frac_mma_peak", "metadata_us", "timing",
            "config", "note", "check", "error", "speedup_vs_bf16", "family")
CHECK_KEYS = ("ok", "worst_row_cos_dist", "lse_max_abs_err", "whole_output_cos_dist", "nan")
DIGITS = {"us": 2, "metadata_us": 2, "GBps": 1, "TFLOPS": 2, "frac_read_peak": 4,
          "frac_mma_peak": 4}


def round_sig(x, sig=3):
    return float(f"{x:.{sig}g}") if isinstance(x, float) else x


def compact_check(check):
    return {k: round_sig(check[k]) for k in CHECK_KEYS if k in check}


def compact_row(row):
    out = {}
    for k in ROW_KEYS:
        if k not in row or row[k] is None:
            continue
        v = row[k]
        if k == "check":
            v = compact_check(v)
        elif k in DIGITS and isinstance(v, float):
            v = round(v, DIGITS[k])
        out[k] = v
    return out


def compact_peaks(peaks):
    if not peaks:
        return None
    read = peaks.get("read_GBps") or peaks.get("read", {}).get("GBps")
    mma = peaks.get("mma_sync_bf16_TFLOPS") or peaks.get("mma_sync", {}).get("TFLOPS")
    out = {"read_GBps": round(read, 1) if read else None,
           "mma_sync_bf16_TFLOPS": round(mma, 1) if mma else None}
    if peaks.get("source"):
        out["source"] = re.sub(r" \(/[^)]*\)$", "", peaks["source"])  # drop the device's path
    return out


def header_from_log(path):
    """device, versions and date from the first line kernelflow.bench.decode prints."""
    with open(path) as f:
        first = f.readline()
    m = re.match(r"device: (.*?), \d+ SMs.*?; torch (\S+), triton (\S+); (.*)$", first.strip())
    if not m:
        sys.exit(f"{path}: no 'device: ...' header on the first line")
    return {"device": m.group(1), "torch": m.group(2), "triton": m.group(3), "date": m.group(4)}


def bench_run(raw, args):
    log = header_from_log(args.log) if args.log else {}
    versions = {k: raw.get(k) or log.get(k) for k in ("torch", "triton")}
    if args.cuda:
        versions["cuda"] = args.cuda
    run = {
        "benchmark": "kernelflow.bench.decode",
        "what": args.what,
        "device": raw.get("device") or log.get("device"),
        "driver": args.driver,
        "date": args.date or raw.get("date") or log.get("date"),
        "commit": args.commit,
        "versions": versions,
        "command": args.command or ("python3 -m kernelflow.bench.decode "
                                    + " ".join(raw.get("argv", []))),
        "peaks": compact_peaks(raw.get("peaks")),
    }
    rows = [compact_row(r) for r in raw["rows"]]
    checked = [r for r in rows if "check" in r]
    if checked:
        run["checks"] = {"run": len(checked), "failed": sum(not r["check"]["ok"] for r in checked)}
    if raw.get("errors"):
        run["errors"] = raw["errors"]
    if raw.get("flashmla_matrix"):  # --flashmla-matrix: FlashMLA's time / kernelflow's per cell
        run["flashmla_matrix"] = [{k: round_sig(v, 6 if k == "ratio" else 4)
                                   if isinstance(v, float) else v for k, v in cell.items()}
                                  for cell in raw["flashmla_matrix"]]
        run["flashmla_matrix_not_slower"] = raw.get("flashmla_matrix_not_slower")
    run["rows"] = rows
    return {k: v for k, v in run.items() if v is not None}


def spread_of(values):
    """n, min, median, max of a list (the timeline summaries' form)."""
    v = sorted(values)
    if not v:
        return {"n": 0}
    n = len(v)
    med = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {"n": n, "min": round(v[0], 2), "median": round(med, 2), "max": round(v[-1], 2)}


def timeline_row(row):
    """A kernelflow.bench.timeline row: its summaries rounded to 0.01 us; from the raw per-block
    rows (--raw), when present, the decode blocks' exit by piece count and the difference between
    the exits of the two blocks that shared an SM, instead of the rows themselves."""
    out = {k: row[k] for k in ("model", "format", "h_q", "s_q", "b", "s_k", "page", "layers",
                               "workers", "calls_per_graph") if k in row}
    for k in ("us_per_call", "us_per_layer"):  # decode calls; a layer graph (--layer)
        if k in row:
            out[k] = round(row[k], 2)
    ev = row["events"]
    # Every launch's events (decode and combine; with --layer also the GEMM and prologue
    # launches), in the timeline's order; the piece counts separately below.
    out["events"] = {kernel: {name: {k: (round(v, 2) if isinstance(v, float) else v)
                                     for k, v in r.items()}
                              for name, r in events.items()}
                     for kernel, events in ev.items() if kernel != "pieces_per_block"}
    if ev.get("pieces_per_block", {}).get("n"):
        out["pieces_per_block"] = ev["pieces_per_block"]
    raw = row.get("decode_blocks")
    if raw:
        # The rows' fixed layout (kernelflow.bench.timeline.decode_blocks): block, SM, piece
        # count, then the events; "exit" is the seventh event.
        assert len(raw["columns"]) == 10 and raw["columns"][-1] == "exit", raw["columns"]
        sm, pieces, exit_ = 1, 2, 9
        live = [r for r in raw["rows"] if r[pieces] and r[exit_] is not None]
        by_pieces = {}
        for r in live:
            by_pieces.setdefault(r[pieces], []).append(r[exit_])
        out["exit_by_pieces"] = {str(k): spread_of(v) for k, v in sorted(by_pieces.items())}
        by_sm = {}
        for r in live:
            by_sm.setdefault(r[sm], []).append(r[exit_])
        pairs = [abs(v[0] - v[1]) for v in by_sm.values() if len(v) == 2]
        if pairs:
            out["sm_pair_exit_diff"] = spread_of(pairs)
    return out


def timeline_run(raw, args):
    run = {"benchmark": "kernelflow.bench.timeline", "what": args.what or raw.get("what"),
           "device": raw.get("gpu"), "driver": args.driver, "date": args.date or raw.get("date"),
           "commit": args.commit, "command": args.command or raw.get("command"),
           "unit": raw.get("unit"), "rows": [timeline_row(r) for r in raw["rows"]]}
    return {k: v for k, v in run.items() if v is not None}


ACC_ROW = re.compile(r"^\| (.+?) \| (\S+) \| (\d+) \| (\S+) \| (\S+) \| (.+?) \| (\S+) \|$")


def accuracy_run(path, args):
    """bench/accuracy_8bit.py's printed table -> rows."""
    with open(path) as f:
        lines = [ln.rstrip("\n") for ln in f]
    rows = []
    for ln in lines:
        m = ACC_ROW.match(ln)
        if not m or m.group(3) == "s_k":
            continue
        setup, fmt, s_k, mean, worst, bound, row = m.groups()
        gated = bound != "(report)"
        r = {"setup": setup, "format": fmt, "s_k": int(s_k), "whole_output_mean": float(mean),
             "whole_output_worst": float(worst), "worst_single_row": float(row)}
        if gated:
            limit, verdict = bound.split()
            r.update(bound=float(limit), ok=verdict == "PASS")
        rows.append(r)
    if not rows:
        sys.exit(f"{path}: no accuracy table found")
    run = {"benchmark": "bench/accuracy_8bit.py", "what": lines[0], "device": args.device,
           "date": args.date, "commit": args.commit, "command": args.command,
           "gated_ok": all(r["ok"] for r in rows if "ok" in r), "rows": rows}
    return {k: v for k, v in run.items() if v is not None}


def write(out_path, run, key):
    if key:
        data = {}
        if os.path.exists(out_path):
            with open(out_path) as f:
                data = json.load(f)
        data[key] = run
    else:
        data = run
    with open(out_path, "w") as f:
        f.write(dumps(data) + "\n")
    print(f"wrote {out_path}" + (f" [{key}]" if key else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["bench", "accuracy", "timeline"])
    ap.add_argument("raw", help="kernelflow.bench.decode or kernelflow.bench.timeline --json "
                    "output, or accuracy_8bit.py's printout")
    ap.add_argument("out", help="the docs/results/ file to write")
    ap.add_argument("--key", help="write the run under this key of OUT (other keys are kept)")
    ap.add_argument("--commit", required=True, help="the library commit that was measured")
    ap.add_argument("--command", help="the command as run (default: rebuilt from the JSON's argv)")
    ap.add_argument("--date", help="when the JSON does not say")
    ap.add_argument("--driver", help="NVIDIA driver version (nvidia-smi)")
    ap.add_argument("--cuda", help="CUDA toolkit version the library was built with")
    ap.add_argument("--device", help="accuracy: the backend or GPU it ran on")
    ap.add_argument("--log", help="bench: the printed output, for device/versions/date")
    ap.add_argument("--what", help="one line saying what the run is")
    args = ap.parse_args()
    if args.kind in ("bench", "timeline"):
        with open(args.raw) as f:
            raw = json.load(f)
        run = bench_run(raw, args) if args.kind == "bench" else timeline_run(raw, args)
    else:
        run = accuracy_run(args.raw, args)
    write(args.out, run, args.key)


if __name__ == "__main__":
    main()
