#!/usr/bin/env python3
"""A/B timing of source trees or builds of the library in one GPU call: does a change cost time?

Three steps, the first where git is (this checkout), the others on the GPU machine:

    python3 bench/ab.py export exp-a exp-b            # each revision's tree into .ab/NAME
    python3 bench/ab.py run --gtest 'GpuLayer*' --pytest 'tests/test_layer.py -m gpu'   # layer
    python3 bench/ab.py run --bench decode -- --no-check --formats bf16 --h-q 16 --batch 64

`run` builds the current tree ("base", in build/ab) and every tree under .ab/ (each in its own
build/ab) side by side for one architecture, runs the named GPU tests on each (a variant that
fails them is still timed, and its column says FAILED), then the benchmark module
(`kernelflow.bench.layer` or `.decode`, arguments after `--` or the defaults below) in
alternating rounds, base first, each a fresh process with its build on PYTHONPATH, so every build
sees the same drift of the GPU's clocks. `--build NAME=DIR` (repeatable) times given folders
importable as `kernelflow` instead, without exporting or building. A session whose calls are
short can split the work: `run --rounds 0` builds and tests, a later call on the same machine
`run --no-build` times (carry .ab/ only with the first: a carried folder replaces the built one).

Every benchmark run writes its --json; the table lists each timing ("us" in the JSON rows,
labelled by the row's identity: model, kernel, format, h_q, b, s_q, s_k, layers) with every
build's median and rounds, and each variant's speed against base (base's median over the
variant's: > 1 is faster). `$OUT/ab/ab.json` (`--out DIR`: DIR/ab.json) keeps the rounds and the
table; `python3 bench/ab.py compare ab.json` prints the table again. Correctness is the tests'
job: the default decode arguments skip the benchmark's reference checks.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys

BENCH_ARGS = {
    "layer": ["--batch", "1", "8", "32", "64", "--formats", "bf16", "fp8_e4m3", "--no-unfused",
              "--no-gemm", "--v3-layers", "2", "--v3-batch", "1", "64", "--peaks-from-spec"],
    "decode": ["--no-check", "--formats", "bf16", "fp8_e4m3", "--h-q", "16", "128", "--batch",
               "1", "8", "64", "128", "--s-k", "4096", "--peaks-from-spec"],
}
ID_FIELDS = ("model", "kernel", "format", "h_q", "b", "s_q", "s_k", "layers")
SKIP_KEYS = {"check", "peaks", "versions", "method", "anchors", "breakdown", "argv"}
BUILD_DIR = os.path.join("build", "ab")
REV_FILE = "AB_REV"


def timings(doc) -> dict:
    """Every "us" value of a benchmark JSON, keyed by where it lies: list items by their
    identity fields (e.g. "model=v2_lite,b=64,s_k=4096,layers=27 fused bf16")."""
    out = {}

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "us" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[" ".join(path)] = float(v)
                elif k not in SKIP_KEYS and isinstance(v, (dict, list)):
                    walk(v, path + [k] if path or k != "rows" else path)
        elif isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, dict):
                    ident = ",".join(f"{f}={item[f]}" for f in ID_FIELDS
                                     if f in item and isinstance(item[f], (str, int)))
                    walk(item, path + [ident or str(i)])

    walk(doc, [])
    return out


def table(names: list, rounds: dict) -> list:
    """rounds[name]: one timings() dict per round. One row per case every build timed: each
    build's median and rounds, and for every build after the first the first's median over its
    own (> 1: faster than the first)."""
    cases = [c for c in rounds[names[0]][0] if all(c in r for n in names for r in rounds[n])]
    rows = []
    for case in cases:
        row = {"case": case, "us": {}, "median": {}, "speed_vs_base": {}}
        for n in names:
            vals = [r[case] for r in rounds[n]]
            row["us"][n] = vals
            row["median"][n] = statistics.median(vals)
        for n in names[1:]:
            row["speed_vs_base"][n] = row["median"][names[0]] / row["median"][n]
        rows.append(row)
    return rows


def format_table(names: list, rows: list, status: dict | None = None) -> str:
    status = status or {}
    head = ["case"] + [f"{n}{' (' + status[n] + ')' if status.get(n) else ''} us" for n in names]
    head += [f"{n} vs {names[0]}" for n in names[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["case"]]
        cells += [f"{r['median'][n]:.1f} ({'; '.join(f'{v:.1f}' for v in r['us'][n])})"
                  for n in names]
        cells += [f"{r['speed_vs_base'][n]:.3f}x" for n in names[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"(median (rounds) per build; vs {names[0]}: {names[0]}'s median over the "
                 "build's, > 1 is faster)")
    return "\n".join(lines)


def tree_name(rev: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", rev).strip("-") or "rev"


def export(args) -> int:
    os.makedirs(args.dir, exist_ok=True)
    for rev in args.revs:
        commit = subprocess.run(["git", "rev-parse", "--verify", rev + "^{commit}"],
                                check=True, capture_output=True, text=True).stdout.strip()
        dst = os.path.join(args.dir, tree_name(rev))
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        archive = subprocess.run(["git", "archive", commit], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", dst], input=archive.stdout, check=True)
        with open(os.path.join(dst, REV_FILE), "w") as f:
            f.write(f"{rev} {commit}\n")
        print(f"{rev} ({commit[:9]}) -> {dst}")
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    with open(os.path.join(args.dir, REV_FILE), "w") as f:  # what "base" (this tree) is
        f.write(f"base {head.strip()}{' with uncommitted changes' if dirty else ''}\n")
    return 0


def trees(args) -> dict:
    """NAME -> source tree: base (this one) and every exported tree under --dir."""
    out = {"base": "."}
    if os.path.isdir(args.dir):
        for name in sorted(os.listdir(args.dir)):
            path = os.path.join(args.dir, name)
            if os.path.isfile(os.path.join(path, "CMakeLists.txt")):
                out[name] = path
    if args.only:
        out = {n: p for n, p in out.items() if n == "base" or n in args.only}
    return out


def build_all(srcs: dict, args, log) -> dict:
    """Configure and build every tree at once (cmake, Ninja); NAME -> error text or None."""
    env = dict(os.environ)
    gtest = os.path.abspath(os.path.join(".deps", "googletest"))
    if os.path.isdir(gtest):
        env.setdefault("KF_GTEST_SOURCE_DIR", gtest)
    jobs = args.jobs or max(2, (os.cpu_count() or 4) // len(srcs))
    procs = {}
    for name, src in srcs.items():
        bdir = os.path.join(src, BUILD_DIR)
        script = (f"cmake -S {src} -B {bdir} -G Ninja -DCMAKE_BUILD_TYPE=Release "
                  f"-DKF_BUILD_TESTS=ON -DKF_BUILD_PYTHON=ON -DKF_CUDA_ARCHS={args.arch} "
                  f"{' '.join(args.cmake_arg)} && cmake --build {bdir} -j {jobs}")
        logf = open(os.path.join(args.out, f"build_{name}.log"), "w")
        procs[name] = (subprocess.Popen(["bash", "-c", script], stdout=logf,
                                        stderr=subprocess.STDOUT, env=env), logf)
    errors = {}
    for name, (p, logf) in procs.items():
        rc = p.wait()
        logf.close()
        errors[name] = None if rc == 0 else f"build failed (build_{name}.log)"
        log(f"build {name}: {'ok' if rc == 0 else errors[name]}")
    return errors


def run_tests(name: str, src: str, pypath: str, args, log) -> str | None:
    """The named GPU tests of one build; None when they pass, else what failed."""
    failed = []
    env = dict(os.environ, PYTHONPATH=os.path.abspath(pypath))
    if args.gtest:
        exe = os.path.join(src, BUILD_DIR, "cpp_tests", "kf_cpp_tests")
        p = subprocess.run([exe, f"--gtest_filter={args.gtest}"], capture_output=True, text=True)
        tail = (p.stdout.strip().splitlines() or [""])[-1]
        log(f"  {name} kf_cpp_tests: {tail}")
        if p.returncode:
            failed.append("kf_cpp_tests")
    if args.pytest:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", *shlex.split(args.pytest)],
                           cwd=src, env=env, capture_output=True, text=True)
        tail = (p.stdout.strip().splitlines() or [""])[-1]
        log(f"  {name} pytest: {tail}")
        if p.returncode:
            failed.append("pytest")
    return " and ".join(failed) + " FAILED" if failed else None


def time_builds(builds: dict, args, bench_args: list, status: dict, log) -> dict:
    """Alternating rounds of the benchmark module: rounds[name] = [timings() per round]. A run
    that wrote its JSON but exited non-zero (a failed check in the run) is timed and flagged in
    status; one that wrote nothing stops the comparison."""
    rounds = {n: [] for n in builds}
    for r in range(args.rounds):
        for name, pypath in builds.items():
            out_json = os.path.join(args.out, f"{name}.r{r + 1}.json")
            cmd = [sys.executable, "-m", f"kernelflow.bench.{args.bench}", *bench_args,
                   "--json", out_json]
            env = dict(os.environ, PYTHONPATH=os.path.abspath(pypath))
            if os.path.exists(out_json):
                os.remove(out_json)
            with open(os.path.join(args.out, f"{name}.r{r + 1}.log"), "w") as logf:
                rc = subprocess.run(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT).returncode
            if not os.path.exists(out_json):
                raise RuntimeError(f"{name}, round {r + 1}: the benchmark exited {rc} without "
                                   f"its JSON (see {name}.r{r + 1}.log)")
            if rc != 0:
                status[name] = f"benchmark exited {rc} in round {r + 1}"
            with open(out_json) as f:
                rounds[name].append(timings(json.load(f)))
            log(f"round {r + 1}: {name} done")
    return rounds


def run(args) -> int:
    os.makedirs(args.out, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    bench_args = args.bench_args or BENCH_ARGS[args.bench]
    status, revs = {}, {}
    if args.build:
        builds = dict(b.split("=", 1) for b in args.build)
    else:
        srcs = trees(args)
        for name, src in srcs.items():
            rev_file = os.path.join(args.dir if name == "base" else src, REV_FILE)
            if os.path.exists(rev_file):
                revs[name] = open(rev_file).read().strip()
        errors = {} if args.no_build else build_all(srcs, args, log)
        builds = {}
        for name, src in srcs.items():
            if errors.get(name):
                status[name] = errors[name]
                continue
            builds[name] = os.path.join(src, BUILD_DIR, "python")
            if args.gtest or args.pytest:
                failed = run_tests(name, src, builds[name], args, log)
                if failed:
                    status[name] = failed
        if "base" not in builds:
            log("base did not build: nothing to compare against")
            return 1
    if args.rounds == 0:  # build and test only
        for name in builds:
            log(f"{name}: {status.get(name, 'ok')}")
        return 1 if status else 0
    names = list(builds)
    rounds = time_builds(builds, args, bench_args, status, log)
    rows = table(names, rounds)
    print(format_table(names, rows, status))
    for name in status:
        if name not in builds:
            print(f"{name}: {status[name]}, not timed")
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which(
                             "nvidia-smi") else None
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": gpu, "argv": sys.argv[1:], "bench": args.bench, "bench_args": bench_args,
              "builds": builds, "revisions": revs, "status": status, "rounds": rounds,
              "table": rows}
    with open(os.path.join(args.out, "ab.json"), "w") as f:
        json.dump(record, f, indent=1)
    return 1 if status else 0


def compare(args) -> int:
    with open(args.record) as f:
        rec = json.load(f)
    names = list(rec["builds"])
    print(format_table(names, table(names, rec["rounds"]), rec.get("status")))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="each revision's tree into DIR/NAME (needs git)")
    ex.add_argument("revs", nargs="+")
    ex.add_argument("--dir", default=".ab")
    rn = sub.add_parser("run", help="build, test and time base and the exported trees")
    rn.add_argument("--dir", default=".ab")
    rn.add_argument("--only", nargs="+",
                    help="exported trees to take, by their names under --dir (default: all)")
    rn.add_argument("--build", action="append",
                    help="NAME=DIR: a folder importable as kernelflow (repeatable; no building)")
    rn.add_argument("--no-build", action="store_true", help="use the trees' existing build/ab")
    rn.add_argument("--arch", default="90", help="KF_CUDA_ARCHS of the builds")
    rn.add_argument("--cmake-arg", action="append", default=[], help="e.g. -DKF_TIMELINE=ON")
    rn.add_argument("--jobs", type=int, default=0, help="build jobs per tree")
    rn.add_argument("--gtest", help="kf_cpp_tests --gtest_filter for every build")
    rn.add_argument("--pytest", help="pytest arguments for every build, one string "
                    "(e.g. 'tests/test_layer.py -m gpu')")
    rn.add_argument("--bench", choices=sorted(BENCH_ARGS), default="layer")
    rn.add_argument("--rounds", type=int, default=2,
                    help="benchmark rounds per build; 0: build and test only")
    rn.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/kf-out"), "ab"))
    rn.add_argument("bench_args", nargs=argparse.REMAINDER,
                    help="-- then the benchmark module's arguments (default: see BENCH_ARGS)")
    cp = sub.add_parser("compare", help="print the table of an ab.json again")
    cp.add_argument("record")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        args.bench_args = [a for a in args.bench_args if a != "--"] or None
        if args.rounds < 0:
            ap.error("--rounds: 0 or more")
        if args.build and any("=" not in b for b in args.build):
            ap.error("--build: NAME=DIR")
    return {"export": export, "run": run, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
