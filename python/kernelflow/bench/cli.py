"""`python -m kernelflow bench`: the library's numbers on the GPU at hand, in one run.

In order: the GPU's peaks (read bandwidth, mma.sync bf16 rate: kernelflow.bench.peaks); the decode
grid (h_q 16 memory-bound and 128 compute-bound, b 1..128, s_k 4096/16384) for each kernel family
of the build beside the baselines (our Triton kernel, PyTorch, FlashMLA and FlashInfer when they
import, otherwise FlashMLA's figures from docs/spec.md labelled with their source:
kernelflow.bench.decode); the 8-bit speedups (FP8 / INT8 over bf16, s_k 1K..64K); the decode-layer
table (kernelflow.bench.layer). Every figure is printed with its fraction of the relevant peak (the
read peak below the ridge point flops/byte = mma peak / read peak, the mma.sync peak above it), and
the whole run goes to one JSON (GPU, clocks seen, versions, command, every row).

The families: the build's (sm80 always, sm90a when build_info lists 90a) that the device runs.
The process's own family (the default, or the one KF_KERNEL_FAMILY forces) runs
here; any other runs in a child process with KF_KERNEL_FAMILY set, so that each family's timings
come from a process that never ran the other (docs/design.md).

The measurements sit behind one object (GpuSections) so that the record, the fractions and the
printed tables can be checked on the CPU with synthetic timings (tests/test_bench_cli.py).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

from kernelflow.bench import progress as progress_mod
from kernelflow.bench import results

SECTIONS = ("peaks", "decode", "formats", "layer")
FORMATS = ("bf16", "fp8_e4m3", "int8")
ANCHOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "anchors",
                      "h200-flashmla-torch-2026-11-30.json")
ANCHOR_LABEL = "docs/spec.md section 5 (H200, 2026-11-30), not this run"
ALL_BATCHES = ["1", "8", "16", "32", "64", "128"]
SWEEP_SK = ["1024", "2048", "4096", "8192", "16384", "32768", "65536"]

# Section options (kernelflow.bench.decode / .layer flags) of the full run and of --quick.
FULL = {
    "decode": ["--h-q", "16", "128", "--batch", *ALL_BATCHES, "--s-k", "4096", "16384",
               "--tune", "quick"],
    "formats": ["--formats", *FORMATS, "--h-q", "16", "--batch", "64", "--s-k", *SWEEP_SK],
    "layer": [],
}
QUICK = {
    "decode": ["--h-q", "16", "128", "--batch", "1", "64", "--s-k", "4096", "--tune", "quick",
               "--replays", "10"],
    "formats": ["--formats", *FORMATS, "--h-q", "16", "--batch", "64", "--s-k", "1024", "8192",
                "65536", "--replays", "10"],
    "layer": ["--quick", "--no-gemm", "--v3-layers", "0"],
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true",
                    help="a one-minute check: decode h_q 16/128 x b 1/64 at s_k 4096, the 8-bit "
                         "speedups at s_k 1K/8K/64K, the layer at b 1/64 without the GEMM and V3 "
                         "rows (under 2 minutes on an H200; the full run is under 10)")
    ap.add_argument("--json", metavar="PATH", default="kernelflow_bench.json",
                    help="the run record: every figure, the GPU, clocks seen, versions, command "
                         "(default: %(default)s)")
    ap.add_argument("--log", metavar="PATH",
                    help="the sections' detailed printout (default: the JSON path with .log)")
    ap.add_argument("--verbose", action="store_true",
                    help="print the sections' detailed output here instead of into --log")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    metavar="NAME", help=f"what to run, of {' '.join(SECTIONS)} (default: all)")
    ap.add_argument("--families", nargs="+", metavar="NAME",
                    help="kernel families to time the decode with (sm80, sm90a; default: every "
                         "family the build has that this device runs, its own first)")
    ap.add_argument("--no-baselines", action="store_true",
                    help="the decode without the Triton, PyTorch, FlashMLA and FlashInfer rows")
    ap.add_argument("--peaks-json", metavar="PATH",
                    help="reuse the peaks a `python -m kernelflow.bench.peaks --json` run wrote")
    ap.add_argument("--peaks-from-spec", action="store_true",
                    help="use docs/spec.md's H200 peaks instead of measuring them")
    ap.add_argument("--decode-args", default="", metavar="'FLAGS'",
                    help="extra kernelflow.bench.decode flags for the decode grid, given last so "
                         "they win, e.g. \"--tune full\" or --decode-args=--no-torch (a single "
                         "flag needs the = form; python -m kernelflow.bench.decode --help)")
    ap.add_argument("--formats-args", default="", metavar="'FLAGS'",
                    help="extra kernelflow.bench.decode flags for the 8-bit sweep")
    ap.add_argument("--layer-args", default="", metavar="'FLAGS'",
                    help="extra kernelflow.bench.layer flags, e.g. \"--v3-layers 0\" "
                         "(python -m kernelflow.bench.layer --help)")
    ap.add_argument("--figures", metavar="DIR",
                    help="also draw the figures of the run into DIR (kernelflow.bench.plots; "
                         "needs matplotlib)")
    ap.add_argument("--progress", choices=["auto", "rich", "tqdm", "plain", "none"],
                    default="auto", help="progress bar: rich or tqdm when installed "
                                         "(pip install kernelflow[bench]), else plain lines")
    ap.add_argument("--summary", metavar="JSON",
                    help="print the tables of an earlier run's JSON (e.g. "
                         "docs/optimization/kernelflow_bench.json) and exit; no GPU needed")
    ap.add_argument("--estimate", action="store_true",
                    help="print the Ampere estimate from the SASS (kernelflow.estimate; no GPU "
                         "needed) and exit")


def build_parser(prog: str = "python -m kernelflow bench") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return ap


# ---- what runs ---------------------------------------------------------------------------------

def section_argv(opts, name: str) -> list:
    """kernelflow.bench.decode / .layer flags of a section: the full or quick preset, the peaks
    and baseline options, then the user's extra flags (argparse keeps the last value given)."""
    preset = (QUICK if opts.quick else FULL)[name]
    extra = {"decode": opts.decode_args, "formats": opts.formats_args,
             "layer": opts.layer_args}[name].split()
    base = list(preset)
    if name == "decode" and opts.no_baselines:
        base += ["--no-triton", "--no-torch", "--no-flashmla", "--no-flashinfer"]
    return base + extra


def flag_values(argv: list, flag: str, default: list) -> list:
    """The values after the last `flag` in argv (an nargs='+' option), else default."""
    out = default
    for i, a in enumerate(argv):
        if a == flag:
            vals = []
            for v in argv[i + 1:]:
                if v.startswith("--"):
                    break
                vals.append(v)
            out = vals
    return out


def decode_shapes(argv: list) -> int:
    return (len(flag_values(argv, "--h-q", ["16", "128"])) *
            len(flag_values(argv, "--batch", ALL_BATCHES)) *
            len(flag_values(argv, "--s-k", ["4096", "16384"])))


def layer_steps(argv: list) -> int:
    return len(flag_values(argv, "--batch", ["1", "64"] if "--quick" in argv
                           else ["1", "8", "32", "64"]))


def built_archs(build_info: str) -> list:
    """The CUDA architectures of a kernelflow.build_info() string ("...; cuda archs 86 90 90a;
    cuda runtime 13.0")."""
    m = re.search(r"cuda archs ([^;]+)", build_info)
    return m.group(1).split() if m else []


def built_families(build_info: str) -> list:
    """The kernel families of a build: the portable sm80 family with any CUDA code, sm90a when
    the build lists its 90a code (CMakeLists.txt adds "90a" to the architectures then)."""
    archs = built_archs(build_info)
    return (["sm80"] if archs else []) + (["sm90a"] if "90a" in archs else [])


def process_family(build_info: str, device_sm: str, env_family: str) -> str:
    """The family this process's decodes run (docs/design.md, pick_family): the portable one
    when KF_KERNEL_FAMILY=sm80 forces it, else sm90a where the device is 9.0 and the build has
    it (the default there), else the portable one."""
    if env_family != "sm80" and device_sm == "90" and "sm90a" in built_families(build_info):
        return "sm90a"
    return "sm80"


def default_families(build_info: str, device_sm: str, env_family: str) -> list:
    """The decode's families to time: this process's first, then every other family of the
    build the device runs (the portable one everywhere, sm90a on 9.0 only), unless
    KF_KERNEL_FAMILY forces one."""
    own = process_family(build_info, device_sm, env_family)
    if env_family not in ("", "auto"):
        return [own]
    runs = [f for f in built_families(build_info) if f == "sm80" or device_sm == "90"]
    return [own] + [f for f in runs if f != own]


def gpu_missing() -> str | None:
    """Why this machine cannot run the benchmark (one line), or None."""
    try:
        import kernelflow as kf
    except Exception as e:  # noqa: BLE001
        return f"kernelflow does not import ({type(e).__name__}: {e})"
    if not kf.has_cuda():
        return "no GPU: this kernelflow build has no CUDA backend (cpu-only); nothing to benchmark"
    try:
        import torch
    except ImportError:
        return "the benchmark needs PyTorch with CUDA (pip install torch); not installed"
    if not torch.cuda.is_available() or kf.cuda_device_count() == 0:
        return "no GPU: no CUDA device is visible (to PyTorch and the library); nothing to benchmark"
    return None


# ---- the measurements ----------------------------------------------------------------------------

class GpuSections:
    """The measurements on the GPU: kernelflow.bench.peaks, .decode (the process's own family
    in-process, another family in a child process) and .layer."""

    def __init__(self, log_stream):
        self.log_stream = log_stream

    def gpu(self) -> dict:
        """The device (results.gpu_info) and the clocks seen now."""
        return dict(results.gpu_info(0), clocks=results.clocks(0))

    def clocks(self) -> dict:
        return results.clocks(0)

    def peaks(self, opts) -> dict:
        """Measured here, or read from --peaks-json, or docs/spec.md's (--peaks-from-spec, or
        when the peaks section is left out and no file is given)."""
        from kernelflow.bench import decode as d

        args = d.parse_args([])
        args.peaks_json = opts.peaks_json
        args.peaks_from_spec = opts.peaks_from_spec or ("peaks" not in opts.sections
                                                        and not opts.peaks_json)
        return d.get_peaks(args)

    def decode(self, argv: list, peaks: dict, family: str, on_step) -> dict:
        import kernelflow as kf

        own = process_family(kf.build_info(), results.gpu_info(0)["sm"],
                             os.environ.get("KF_KERNEL_FAMILY", ""))
        if family == own:
            from kernelflow.bench import decode as d

            args = d.parse_args(argv)
            args.on_shape = on_step
            ctx = d.gpu_setup(args)
            if args.formats:
                return d.run_formats(args, peaks, ctx["dtype"], ctx["rotate_bytes"])
            return d.run_grid(args, peaks, ctx)
        return self.decode_child(argv, peaks, family, on_step)

    def decode_child(self, argv: list, peaks: dict, family: str, on_step) -> dict:
        """kernelflow.bench.decode in a child process with KF_KERNEL_FAMILY=family, kernelflow
        alone, the same peaks; its printout goes to the log, each shape advances the bar."""
        import kernelflow

        with tempfile.TemporaryDirectory() as tmp:
            pk_path, out_path = os.path.join(tmp, "peaks.json"), os.path.join(tmp, "out.json")
            with open(pk_path, "w") as f:
                json.dump(peaks, f)
            cmd = [sys.executable, "-m", "kernelflow.bench.decode", *argv, "--no-triton",
                   "--no-torch", "--no-flashmla", "--no-flashinfer", "--peaks-json", pk_path,
                   "--json", out_path]
            pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(kernelflow.__file__)))
            env = dict(os.environ, KF_KERNEL_FAMILY=family, PYTHONPATH=os.pathsep.join(
                [pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                if p]))
            print(f"\n== family {family}: {' '.join(cmd)}", file=self.log_stream, flush=True)
            child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
            for line in child.stdout:
                self.log_stream.write(line)
                if line.startswith("[h_q="):
                    on_step(f"decode {family} {line.strip()[1:-1]}")
            rc = child.wait()
            if not os.path.exists(out_path):
                raise RuntimeError(f"kernelflow.bench.decode with KF_KERNEL_FAMILY={family} "
                                   f"exited {rc} without results (see the log)")
            with open(out_path) as f:
                return json.load(f)

    def layer(self, argv: list, peaks: dict, on_step) -> dict:
        from kernelflow.bench import layer as lay

        args = lay.parse_args(argv)
        args.on_shape = on_step
        return lay.run(args, peaks)


# ---- the run -------------------------------------------------------------------------------------

def load_anchor() -> dict:
    """FlashMLA's and the unfused layer's H200 figures kept in the repo, with their source."""
    with open(ANCHOR) as f:
        data = json.load(f)
    return {"source": ANCHOR_LABEL, "rows": data.get("rows", [])}


def plan_steps(opts, families: list) -> int:
    n = 1 if "peaks" in opts.sections else 0
    if "decode" in opts.sections:
        n += decode_shapes(section_argv(opts, "decode")) * len(families)
    if "formats" in opts.sections:
        n += decode_shapes(section_argv(opts, "formats"))
    if "layer" in opts.sections:
        n += layer_steps(section_argv(opts, "layer"))
    return n


def label_family(result: dict, family: str) -> dict:
    for row in result.get("rows", []):
        row["family"] = family
        row.pop("tried", None)  # the Triton search's every configuration: the log keeps it
    return result


def decode_section(opts, sections, bar, families, peaks) -> dict:
    """The decode grid of every family, one list of rows labelled with their family."""
    out = {"rows": [], "errors": [], "by_family": {}, "failures": 0}
    for fam in families:
        res = label_family(sections.decode(section_argv(opts, "decode"), peaks, fam, bar.step),
                           fam)
        out["rows"] += res.get("rows", [])
        out["errors"] += res.get("errors", [])
        out["by_family"][fam] = {k: res.get(k) for k in ("failures", "flashmla_measured",
                                                          "ratios")}
        out["failures"] += res.get("failures", 0)
    return out


def formats_section(opts, sections, bar, families, peaks) -> dict:
    res = sections.decode(section_argv(opts, "formats"), peaks, families[0], bar.step)
    return {"rows": label_family(res, families[0]).get("rows", []),
            "failures": res.get("failures", 0)}


def layer_section(opts, sections, bar, families, peaks) -> dict:
    res = sections.layer(section_argv(opts, "layer"), peaks, bar.step)
    return {k: res.get(k, 0 if k == "failures" else None) for k in (
        "rows", "gemm_rows", "v3_rows", "method", "versions", "fused_missing", "failures")
        if res.get(k) is not None or k == "failures"}


SECTION_RUNNERS = {"decode": decode_section, "formats": formats_section,
                   "layer": layer_section}


def run(opts, sections, bar, families: list, log_stream) -> dict:
    """Every section asked for, into one record (see results.SCHEMA); the detailed printout of
    the sections goes to log_stream. A section that raises is recorded with its error (the
    traceback in the log) and counted as a failure; the others still run."""
    record = results.run_header(opts.argv)
    record.update({"quick": bool(opts.quick), "gpu": sections.gpu(),
                   "versions": results.versions(), "families": families, "failures": 0,
                   "seconds": {}, "anchors": load_anchor()})
    with contextlib.redirect_stdout(log_stream):
        t0 = time.time()
        record["peaks"] = sections.peaks(opts)
        record["seconds"]["peaks"] = time.time() - t0
        if "peaks" in opts.sections:
            bar.step("peaks")
        for name, runner in SECTION_RUNNERS.items():
            if name not in opts.sections:
                continue
            t0 = time.time()
            try:
                record[name] = runner(opts, sections, bar, families, record["peaks"])
            except Exception as e:  # noqa: BLE001  (recorded; the other sections still run)
                traceback.print_exc(file=log_stream)
                record[name] = {"rows": [], "error": f"{type(e).__name__}: {e}", "failures": 1}
                print(f"{name}: FAILED {type(e).__name__}: {e}", file=sys.stderr)
            record["failures"] += record[name]["failures"]
            record["seconds"][name] = time.time() - t0
    record["seconds"]["total"] = sum(record["seconds"].values())
    record["clocks_after"] = sections.clocks()
    return record


# ---- the printed summary ------------------------------------------------------------------------

def ridge(peaks: dict) -> float:
    """Flops per byte where the mma.sync peak meets the read peak."""
    return peaks["mma_sync_bf16_TFLOPS"] * 1e12 / (peaks["read_GBps"] * 1e9)


def of_peak(row: dict, peaks: dict) -> str:
    """`x% read` below the ridge point, `x% mma` above it (the peak that bounds the shape)."""
    if "TFLOPS" in row and row["GBps"] > 0 and row["TFLOPS"] * 1e3 / row["GBps"] > ridge(peaks):
        return f"{100 * row['frac_mma_peak']:.0f}% mma"
    return f"{100 * row['frac_read_peak']:.0f}% read"


DECODE_KERNELS = ("kernelflow", "triton", "torch", "flashmla", "flashmla_spec", "flashinfer")


def decode_table(record: dict) -> list:
    """The decode rows as a table, one line per (family, h_q, s_q, s_k, b); the s_q column only
    when the run has rows of more than one query per request (--decode-args "--s-q 1 2")."""
    rows = record["decode"]["rows"]
    pk = record["peaks"]
    kernels = [k for k in DECODE_KERNELS if any(r.get("kernel") == k and "us" in r for r in rows)]

    def key(r):
        return (r.get("family"), r["h_q"], r.get("s_q", 1), r["s_k"], r["b"])

    keys = sorted({key(r) for r in rows}, key=lambda k: (str(k[0]),) + k[1:])
    with_s_q = any(k[2] != 1 for k in keys)
    lines = [f"## Decode (bf16 cache, {'causal' if with_s_q else 's_q 1'}, page 64): us per call, "
             f"fraction of the bounding peak (read {pk['read_GBps']:.0f} GB/s, mma.sync "
             f"{pk['mma_sync_bf16_TFLOPS']:.0f} TFLOPS, {pk.get('source', '?')})", "",
             "| family | h_q | " + ("s_q | " if with_s_q else "") + "s_k | b | "
             + " | ".join(kernels) + " |",
             "|" + " --- |" * (4 + with_s_q + len(kernels))]
    for k in keys:
        fam, h_q, s_q, s_k, b = k
        cells = []
        for kernel in kernels:
            r = next((x for x in rows if x.get("kernel") == kernel and "us" in x and key(x) == k),
                     None)
            cells.append("-" if r is None else f"{r['us']:.1f} ({of_peak(r, pk)})")
        lines.append(f"| {fam} | {h_q} | " + (f"{s_q} | " if with_s_q else "") + f"{s_k} | {b} | "
                     + " | ".join(cells) + " |")
    if "flashmla_spec" in kernels:
        lines.append(f"(flashmla_spec: FlashMLA's figures from {ANCHOR_LABEL})")
    return lines


def formats_table(record: dict) -> list:
    rows = [r for r in record["formats"]["rows"] if "us" in r]
    lines = ["## 8-bit caches (h_q 16): us per call, fraction of the read peak, speedup over bf16",
             "", "| s_k | b | " + " | ".join(FORMATS) + " |", "|" + " --- |" * (2 + len(FORMATS))]
    for s_k, b in sorted({(r["s_k"], r["b"]) for r in rows}):
        cells = []
        for f in FORMATS:
            r = next((x for x in rows if (x["format"], x["s_k"], x["b"]) == (f, s_k, b)), None)
            sp = f", {r['speedup_vs_bf16']:.2f}x" if r and "speedup_vs_bf16" in r else ""
            cells.append("-" if r is None else
                         f"{r['us']:.1f} ({100 * r['frac_read_peak']:.0f}% read{sp})")
        lines.append(f"| {s_k} | {b} | " + " | ".join(cells) + " |")
    return lines


LAYER_VARIANTS = ("unfused eager", "unfused graph", "fused bf16", "fused fp8_e4m3", "fused int8")


def layer_us(row: dict) -> dict:
    """Microseconds per layer of each variant of a layer row."""
    unf, fused = row.get("unfused", {}), row.get("fused", {})
    out = {"unfused eager": unf.get("eager_us"), "unfused graph": unf.get("graph_us")}
    for f in FORMATS:
        out[f"fused {f}"] = fused.get(f, {}).get("us")
    return out


def layer_table(record: dict) -> list:
    lines = ["## Decode layer (DeepSeek-V2-Lite, s_k 4096): us per layer, fraction of the read "
             "peak (the floor at the read peak / the time)", "",
             "| b | " + " | ".join(LAYER_VARIANTS) + " | floor bf16 | floor 8-bit |",
             "|" + " --- |" * (3 + len(LAYER_VARIANTS))]
    for row in record["layer"].get("rows", []):
        if "floor_us" not in row:
            continue
        cells = []
        for name, us in layer_us(row).items():
            floor = row["floor_us"]["bf16" if name in ("unfused eager", "unfused graph",
                                                       "fused bf16") else "int8"]
            cells.append("-" if us is None else f"{us:.1f} ({100 * floor / us:.0f}% read)")
        lines.append(f"| {row['b']} | " + " | ".join(cells) +
                     f" | {row['floor_us']['bf16']:.1f} | {row['floor_us']['int8']:.1f} |")
    for row in record["layer"].get("v3_rows") or []:
        us = row.get("fused", {}).get("us")
        if us is not None:
            lines.append(f"V3 shape ({row['layers']} layers), b {row['b']}: fused bf16 {us:.1f} us "
                         f"per layer ({100 * row['floor_us'] / us:.0f}% read), floor "
                         f"{row['floor_us']:.1f}")
    gemms = [g for g in record["layer"].get("gemm_rows") or [] if "torch_us" in g]
    if gemms:
        lines.append("GEMM alone, us per GEMM (% read), torch.matmul / kernelflow.linear: " +
                     ", ".join(f"{g['projection']} b {g['b']} {g['torch_us']:.2f} "
                               f"({100 * g['torch_frac_read_peak']:.0f}%) / " +
                               (f"{g['kf_us']:.2f} ({100 * g['kf_frac_read_peak']:.0f}%)"
                                if "kf_us" in g else "-") for g in gemms))
    return lines


def summary(record: dict) -> list:
    gpu = record.get("gpu", {})
    clk = gpu.get("clocks", {})
    lines = [f"# kernelflow bench on {gpu.get('name', '?')} (sm_{gpu.get('sm', '?')}), "
             f"{record['date']}; clocks SM {clk.get('sm_MHz', '?')} / memory "
             f"{clk.get('mem_MHz', '?')} MHz ({clk.get('source') or 'not read'})",
             f"command: {record['command']}", ""]
    for name, table in (("decode", decode_table), ("formats", formats_table),
                        ("layer", layer_table)):
        if record.get(name):
            lines += table(record) + [""]
    secs = record["seconds"]
    lines.append(f"{record['failures']} failed checks or errors; "
                 + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items()))
    return lines


# ---- entry ---------------------------------------------------------------------------------------

def run_estimate() -> int:
    """The Ampere estimate (kernelflow.estimate, another module of the package), if present."""
    try:
        from kernelflow import estimate
    except ImportError as e:
        print(f"kernelflow.estimate is absent from this installation ({e}): no Ampere estimate")
        return 1
    entry = getattr(estimate, "estimate_main", None) or getattr(estimate, "main", None)
    if entry is None:
        print("kernelflow.estimate has no estimate_main(argv) or main(argv) to call")
        return 1
    return int(entry([]) or 0)


def main(argv=None, sections=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = build_parser().parse_args(argv)
    opts.argv = argv
    if opts.estimate:
        return run_estimate()
    if opts.summary:
        with open(opts.summary) as f:
            print("\n".join(summary(json.load(f))))
        return 0
    if sections is None:
        why = gpu_missing()
        if why:
            print(why)
            return 1
    import kernelflow as kf

    log_path = opts.log or os.path.splitext(opts.json)[0] + ".log"
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "w") as log_file:
        log_stream = sys.stdout if opts.verbose else log_file
        sections = sections or GpuSections(log_stream)
        device_sm = sections.gpu().get("sm", "")
        families = opts.families or default_families(kf.build_info(), device_sm,
                                                     os.environ.get("KF_KERNEL_FAMILY", ""))
        bar = progress_mod.make(plan_steps(opts, families), opts.progress)
        try:
            record = run(opts, sections, bar, families, log_stream)
        finally:
            bar.close()
    record["log"] = log_path
    results.write(opts.json, record)
    print("\n".join(summary(record)))
    print(f"wrote {opts.json} (the sections' printout: {log_path})")
    if opts.figures:
        try:
            from kernelflow.bench import plots
        except ImportError as e:
            print(f"no figures: {e} (pip install matplotlib, or kernelflow[bench])")
        else:
            for path in plots.draw_all(record, opts.figures):
                print(f"wrote {path}")
    return 1 if record["failures"] else 0
