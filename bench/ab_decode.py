#!/usr/bin/env python3
"""A/B timing of two builds of the library on one GPU: does a kernel change cost time?

Each build is a folder importable as `kernelflow` (an in-tree build's `<build>/python`, or a
`pip install --target` folder). The runs alternate A, B, A, B, ... (--runs pairs), each a fresh
process of `python -m kernelflow.bench.decode` (the benchmark module of the build under test) in
its cache-format mode without the reference checks (the GPU
tests establish correctness), so both builds see the same GPU state drift. The table gives each
cell's median over the runs of each build and the ratio B / A (> 1: B slower).

    python3 bench/ab_decode.py --a build/base/python --b build/gpu/python --runs 3 \\
        --formats bf16 fp8_e4m3 --h-q 16 128 --batch 1 64 128 --s-k 4096 --json $OUT/ab.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_one(pythonpath: str, args, out_json: str) -> list:
    cmd = [sys.executable, "-m", "kernelflow.bench.decode", "--no-check", "--formats",
           *args.formats, "--h-q", *map(str, args.h_q), "--batch", *map(str, args.batch),
           "--s-k", *map(str, args.s_k), "--json", out_json]
    if args.peaks_json:
        cmd += ["--peaks-json", args.peaks_json]
    else:
        cmd += ["--peaks-from-spec"]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(pythonpath))
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        return [r for r in json.load(f)["rows"] if "us" in r]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="folder importable as kernelflow: build A")
    ap.add_argument("--b", required=True, help="folder importable as kernelflow: build B")
    ap.add_argument("--runs", type=int, default=3, help="alternating runs of each build")
    ap.add_argument("--formats", nargs="+", default=["bf16", "fp8_e4m3"])
    ap.add_argument("--h-q", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 128])
    ap.add_argument("--s-k", type=int, nargs="+", default=[4096])
    ap.add_argument("--peaks-json", help="peaks for the %%read column (default: docs/spec.md's)")
    ap.add_argument("--json", help="write every run's rows and the table here")
    args = ap.parse_args()

    times = {"A": {}, "B": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name, path in (("A", args.a), ("B", args.b)):
                rows = run_one(path, args, os.path.join(tmp, f"{name}{i}.json"))
                for r in rows:
                    key = (r["format"], r["h_q"], r["b"], r["s_k"])
                    times[name].setdefault(key, []).append(r["us"])
                print(f"run {i + 1}/{args.runs} of {name} done", flush=True)

    table = []
    print("\n| format | h_q | b | s_k | A us (median) | B us (median) | B / A | A runs | B runs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in sorted(set(times["A"]) & set(times["B"])):
        a, b = times["A"][key], times["B"][key]
        ma, mb = statistics.median(a), statistics.median(b)
        table.append({"format": key[0], "h_q": key[1], "b": key[2], "s_k": key[3],
                      "a_us": a, "b_us": b, "a_median": ma, "b_median": mb, "ratio": mb / ma})
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {ma:.1f} | {mb:.1f} | "
              f"{mb / ma:.3f} | {' '.join(f'{x:.1f}' for x in a)} | "
              f"{' '.join(f'{x:.1f}' for x in b)} |")
    worst = max((abs(t["ratio"] - 1) for t in table), default=0.0)
    print(f"largest |B/A - 1|: {100 * worst:.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "a": args.a, "b": args.b, "table": table}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
