#!/usr/bin/env python3
"""Compare two kernel families' decode runs: two bench_decode JSONs into one compact file.

Each input is the --json output of one decode benchmark run (kernelflow.bench.decode, formerly
bench/bench_decode.py) made with one kernel family (KF_KERNEL_FAMILY), on the same GPU and in
the same device call. The output keeps, per shape, each family's time, throughput and check,
FlashMLA's time where a run measured it (else the figure the run labelled as FlashMLA's from
docs/spec.md, marked so), and the speed ratios, with the GPU, date, commit and the commands:

    python3 tools/family_compare.py sm90a=$OUT/bench_sm90a.json sm80=$OUT/bench_sm80.json \\
        --commit $(git rev-parse --short HEAD) --driver 580.159.04 \\
        --env sm90a=KF_KERNEL_FAMILY=sm90a --env sm80=KF_KERNEL_FAMILY=sm80 \\
        --matmul-tflops 741 --matmul-source "docs/spec.md section 5" \\
        --out docs/results/sm90a_h200.json

The first family named is the one compared (ratios are its speed over the second's and over
FlashMLA's). Nothing here needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compact_results import compact_check, compact_peaks, dumps  # noqa: E402

SHAPE_KEYS = ("h_q", "s_q", "b", "s_k", "page", "dtype", "format")
LATENT_DIMS = 576 + 512  # QK over the 576 latent + rope dims, PV over the 512 latent dims


def shape_of(row: dict) -> tuple:
    """A row's shape; a row without s_q (runs before the grid took --s-q) is an s_q 1 row."""
    return tuple(row.get(k, 1 if k == "s_q" else None) for k in SHAPE_KEYS)


def decode_flops(shape: dict) -> float:
    return 2.0 * shape["b"] * shape["h_q"] * (shape.get("s_q") or 1) * shape["s_k"] * LATENT_DIMS


def parse_named(text: str, what: str) -> tuple:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise SystemExit(f"family_compare.py: {what} {text!r} is not NAME=VALUE")
    return name, value


def load_run(path: str) -> dict:
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"family_compare.py: cannot read {path}: {e}")
    if not isinstance(run, dict) or not isinstance(run.get("rows"), list):
        raise SystemExit(f"family_compare.py: {path} has no 'rows' "
                         "(not a decode benchmark's --json file)")
    return run


def timing_cell(row: dict, shape: dict, matmul_tflops) -> dict:
    cell = {"us": round(row["us"], 2), "TFLOPS": round(decode_flops(shape) / row["us"] / 1e6, 1),
            "GBps": round(row["GBps"], 1) if row.get("GBps") is not None else None}
    if matmul_tflops:
        cell["frac_matmul_peak"] = round(cell["TFLOPS"] / matmul_tflops, 3)
    if row.get("check"):
        cell["check"] = compact_check(row["check"])
    return {k: v for k, v in cell.items() if v is not None}


def flashmla_cell(runs: dict, key: tuple, matmul_tflops) -> dict | None:
    """FlashMLA measured in one of the runs; else the figure a run labelled as from the spec."""
    for kernel, source in (("flashmla", "measured in the {} run"),
                           ("flashmla_spec", "docs/spec.md section 5, not measured in these runs")):
        for name, run in runs.items():
            for row in run["rows"]:
                if row.get("kernel") == kernel and shape_of(row) == key and row.get("us"):
                    shape = {k: v for k, v in zip(SHAPE_KEYS, key) if v is not None}
                    return dict(timing_cell(row, shape, matmul_tflops), source=source.format(name))
    return None


def compare_rows(runs: dict, matmul_tflops) -> list:
    first, second = list(runs)
    rows = []
    for row in runs[first]["rows"]:
        if row.get("kernel") != "kernelflow" or row.get("us") is None:
            continue
        key = shape_of(row)
        other = next((r for r in runs[second]["rows"] if r.get("kernel") == "kernelflow"
                      and shape_of(r) == key and r.get("us") is not None), None)
        if other is None:
            raise SystemExit(f"family_compare.py: the {second} run has no kernelflow row for "
                             f"{dict(zip(SHAPE_KEYS, key))}")
        shape = {k: v for k, v in zip(SHAPE_KEYS, key) if v is not None}
        out = dict(shape)
        out[first] = timing_cell(row, shape, matmul_tflops)
        out[second] = timing_cell(other, shape, matmul_tflops)
        out[f"{first}_speed_over_{second}"] = round(other["us"] / row["us"], 3)
        fm = flashmla_cell(runs, key, matmul_tflops)
        if fm:
            out["flashmla"] = fm
            for name in (first, second):
                out[f"{name}_speed_over_flashmla"] = round(fm["us"] / out[name]["us"], 3)
        rows.append(out)
    if not rows:
        raise SystemExit(f"family_compare.py: the {first} run has no kernelflow rows")
    return rows


def command_of(run: dict, env: str | None, program: str) -> str:
    """The run's command line, its output folder on the GPU machine written as $OUT."""
    argv = " ".join(re.sub(r"^/root/out/", "$OUT/", a) for a in run.get("argv", []))
    return (f"{env} " if env else "") + f"{program} {argv}".strip()


def written_by(args) -> str:
    """This tool's command line, the runs named by file name (they lived on the GPU machine)."""
    argv = [f"{n}=$OUT/{os.path.basename(p)}" for n, p in map(lambda r: parse_named(r, "run"),
                                                                args.runs)]
    argv += args.argv_rest
    return "python3 tools/family_compare.py " + " ".join(shlex.quote(a) if "$OUT" not in a else a
                                                         for a in argv)


def comparison(runs: dict, args) -> dict:
    first = next(iter(runs.values()))
    envs = dict(parse_named(e, "--env") for e in args.env)
    unknown = set(envs) - set(runs)
    if unknown:
        raise SystemExit(f"family_compare.py: --env names {sorted(unknown)}, not a family given")
    devices = {r.get("device") for r in runs.values()}
    if len(devices) != 1:
        raise SystemExit("family_compare.py: the runs are on different GPUs: "
                         f"{sorted(map(str, devices))}")
    out = {
        "what": args.what or f"decode by kernel family ({', '.join(runs)}) in one device call, "
                              "FlashMLA beside them",
        "device": first.get("device"), "num_sms": first.get("num_sms"), "driver": args.driver,
        "date": first.get("date"), "commit": args.commit,
        "versions": {k: first.get(k) for k in ("torch", "triton") if first.get(k)},
        "commands": {name: command_of(run, envs.get(name), args.program)
                     for name, run in runs.items()},
        "peaks": compact_peaks(first.get("peaks")),
    }
    if args.matmul_tflops:
        out["matmul_bf16_TFLOPS"] = {"TFLOPS": args.matmul_tflops, "source": args.matmul_source}
    if args.note:
        out["note"] = args.note
    out["written_by"] = written_by(args)
    out["rows"] = compare_rows(runs, args.matmul_tflops)
    return {k: v for k, v in out.items() if v is not None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs=2, metavar="FAMILY=JSON",
                    help="a family's name and its bench_decode --json file (the first is compared)")
    ap.add_argument("--out", required=True, help="the compact comparison to write")
    ap.add_argument("--commit", required=True, help="the library commit that was measured")
    ap.add_argument("--driver", help="NVIDIA driver version (nvidia-smi)")
    ap.add_argument("--env", action="append", default=[], metavar="FAMILY=VAR=VALUE",
                    help="the environment a family's run had, written before its command")
    ap.add_argument("--program", default="python3 -m kernelflow.bench.decode",
                    help="the benchmark the runs' argv was given to (default: %(default)s)")
    ap.add_argument("--matmul-tflops", type=float,
                    help="the bf16 matrix-multiply peak to give each TFLOPS figure a fraction of")
    ap.add_argument("--matmul-source", help="where --matmul-tflops comes from")
    ap.add_argument("--what", help="one line saying what the comparison is")
    ap.add_argument("--note", help="anything a reader needs to read the commands right")
    args = ap.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    args.argv_rest = [a for a in given if a not in args.runs]
    if args.matmul_tflops and not args.matmul_source:
        ap.error("--matmul-tflops needs --matmul-source (where the peak comes from)")
    named = [parse_named(r, "run") for r in args.runs]
    if named[0][0] == named[1][0]:
        ap.error(f"both runs are named {named[0][0]!r}")
    runs = {name: load_run(path) for name, path in named}
    with open(args.out, "w") as f:
        f.write(dumps(comparison(runs, args)) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
