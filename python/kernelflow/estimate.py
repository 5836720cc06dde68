"""The Ampere estimate: decode time per call on GPUs that are not at hand (RTX 3090, A100, RTX
4090), predicted from the built library's SASS, and validated on the H200 against measurements.

Method (docs/optimization/ampere_estimate.md):
  1. cuobjdump reads the decode kernels' SASS per architecture from the built libkernelflow
     (estimate_sass.py); each kernel's template arguments, read from its mangled name, give its
     tile shape (estimate_model.DecodeKernel).
  2. In each kernel the KV tile loop is found from the control flow and one trip of it is counted
     per pipe, per warp; so is a piece's work outside it (estimate_loop.py).
  3. For each shape, the kernel the library would pick, its blocks per SM, the worker count and
     the library's own split schedule give the busiest SM's work; the time is the slowest of its
     pipes at the GPU's nominal rates (estimate_gpus.py) and of the bytes over the read bandwidth
     (estimate_model.py).
Every printed figure is an estimate except the measurements it is compared with, which are
labelled with their source.

Use from Python (the `kernelflow bench --estimate` command calls the same functions):

    from kernelflow import estimate
    result = estimate.run_estimate()            # dict: kernels, rows, validation, reference
    print(estimate.format_report(result))
    # or, with the command line's options parsed: estimate.estimate_main(["--json", "e.json"])

`python -m kernelflow.estimate --help` lists the options.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import statistics
import sys

from . import estimate_loop as loop
from . import estimate_sass as sass
from .estimate_gpus import GPUS, REFERENCE_3090
from .estimate_model import choose_kernel, blocks_per_sm, parse_kernel_name, predict

FORMATS = ("bf16", "fp8_e4m3", "int8")
HEADS = (16, 128)
BATCHES = (1, 8, 32, 64, 128)
SEQ_LENS = (4096, 16384)
VALIDATION_FILES = ("decode_h200.json", "formats_h200.json")


def default_shapes():
    """(h_q, b, s_k, kv_format) of the benchmark grid."""
    return [(h, b, s, f) for f in FORMATS for h in HEADS for s in SEQ_LENS for b in BATCHES]


def find_library():
    """The libkernelflow this package runs: $KF_LIBRARY, else the one the loaded extension
    linked (from /proc/self/maps), else one in the package folder; None when none is found."""
    env = os.environ.get("KF_LIBRARY")
    if env:
        return env if os.path.isfile(env) else None
    from . import _C  # noqa: F401  (loads libkernelflow)

    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libkernelflow" in os.path.basename(path) and os.path.isfile(path):
                    return path
    except OSError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    hits = glob.glob(os.path.join(here, "libkernelflow*.so*"))
    return hits[0] if hits else None


@dataclasses.dataclass
class KernelCounts:
    kernel: object  # estimate_model.DecodeKernel
    regs: int
    tile: loop.LoopCounts
    piece: tuple  # (units per pipe, issue) of a piece outside its tiles


def read_kernels(library, arch, cuobjdump):
    """{(fmt, block_m): KernelCounts} of the bf16 decode kernels compiled for `arch`."""
    usage = {f: r for a, f, r in sass.resource_usage(cuobjdump, library) if a == arch}
    wanted = {}
    for name in usage:
        k = parse_kernel_name(name)
        if k is not None and k.dtype == "bf16" and not k.small_pages:
            wanted[name] = k
    if not wanted:
        raise FileNotFoundError(f"no {arch} decode kernels in {library}")
    code = sass.dump_sass(cuobjdump, library, arch, sorted(wanted))
    result = {}
    for name, k in wanted.items():
        instrs = code[(arch, name)]
        tile_loop = loop.tile_loop(instrs)
        piece_loop = loop.enclosing_loop(instrs, tile_loop)
        tile = loop.count_loop(instrs, tile_loop, k.tensor_per_tile)
        piece = (loop.count_outside(instrs, piece_loop, tile_loop) if piece_loop
                 else (dict.fromkeys(loop.PIPES, 0.0), 0.0))
        result[(k.fmt, k.block_m)] = KernelCounts(k, usage[name]["REG"], tile, piece)
    return result


def predict_shape(shape, gpu, kernels):
    """estimate_model.Prediction of one shape on one GPU from its architecture's kernels."""
    usual = [kc.kernel for kc in kernels.values()]
    m32 = kernels.get((0, 32))
    two_fit = m32 is not None and blocks_per_sm(m32.kernel, m32.regs, gpu) >= 2
    kernel = choose_kernel(usual, shape[0], shape[3], two_fit)
    kc = kernels[(kernel.fmt, kernel.block_m)]
    return predict(shape, gpu, kernel, kc.regs, (kc.tile, kc.piece))


def _flops(h_q, b, s_k):
    return 2 * b * h_q * s_k * (576 + 512)


def _bench_bytes(h_q, b, s_k, kv_format):
    """The bytes kernelflow.bench.decode divides by time for its GB/s."""
    per_token = 1152 if kv_format == "bf16" else 644
    return b * s_k * per_token + b * h_q * 576 * 2 + b * h_q * 512 * 2


def prediction_row(gpu, shape, p):
    h_q, b, s_k, kv_format = shape
    secs = p.us * 1e-6
    return {"gpu": gpu.key, "format": kv_format, "h_q": h_q, "b": b, "s_k": s_k,
            "us": round(p.us, 2), "bound": p.bound, "compute_us": round(p.compute_us, 2),
            "memory_us": round(p.memory_us, 2),
            "GBps": round(_bench_bytes(h_q, b, s_k, kv_format) / secs / 1e9, 1),
            "TFLOPS": round(_flops(h_q, b, s_k) / secs / 1e12, 2),
            "tile": f"{p.kernel.block_m}x{p.kernel.block_n}", "blocks_per_sm": p.blocks_per_sm,
            "workers": p.workers, "tiles_busiest_worker": p.tiles}


def kernel_table(arch, kernels):
    """One row per kernel: its tile, occupancy inputs and per-tile counts per pipe."""
    rows = []
    for (fmt, bm), kc in sorted(kernels.items()):
        k = kc.kernel
        rows.append({"arch": arch, "format": {0: "bf16", 1: "fp8_e4m3", 2: "int8"}[fmt],
                     "tile": f"{bm}x{k.block_n}", "warps": k.warps, "regs": kc.regs,
                     "smem_bytes": k.smem_bytes, "loop_instructions": kc.tile.instructions,
                     "issue_per_warp_tile": round(kc.tile.issue, 1),
                     "per_warp_tile": {p: round(v, 1) for p, v in kc.tile.pipes.items()},
                     "conditional_tensor_weight": kc.tile.conditional_tensor_weight,
                     "piece_issue_per_warp": round(kc.piece[1], 1)})
    return rows


def find_results_dir(explicit=None):
    """docs/results with the H200 measurements: the given folder, ./docs/results, or the
    source tree above this file; None when absent (an installed package)."""
    candidates = [explicit] if explicit else [os.path.join(os.getcwd(), "docs", "results")]
    if not explicit:
        d = os.path.dirname(os.path.abspath(__file__))
        for _ in range(4):
            d = os.path.dirname(d)
            candidates.append(os.path.join(d, "docs", "results"))
    for c in candidates:
        if c and all(os.path.isfile(os.path.join(c, f)) for f in VALIDATION_FILES):
            return c
    return None


def measured_h200(results_dir):
    """[(source label, read peak GB/s, (h_q, b, s_k, format), us)] of this library's kernels in
    the committed H200 runs."""
    out = []
    with open(os.path.join(results_dir, "decode_h200.json")) as f:
        run = json.load(f)
    for r in run["rows"]:
        if r["kernel"] == "kernelflow":
            out.append((f"decode_h200.json ({run['commit']})", run["peaks"]["read_GBps"],
                        (r["h_q"], r["b"], r["s_k"], "bf16"), r["us"]))
    with open(os.path.join(results_dir, "formats_h200.json")) as f:
        grid = json.load(f)["grid"]
    for r in grid["rows"]:
        if r["kernel"] == "kernelflow":
            out.append((f"formats_h200.json grid ({grid['commit']})", grid["peaks"]["read_GBps"],
                        (r["h_q"], r["b"], r["s_k"], r["format"]), r["us"]))
    return out


def validate_h200(kernels_sm90, results_dir):
    """Predicted against measured H200 times, each prediction with the read peak measured in the
    run it is compared with."""
    rows = []
    for source, read_peak, shape, us in measured_h200(results_dir):
        gpu = dataclasses.replace(GPUS["h200"], read_GBps=read_peak)
        p = predict_shape(shape, gpu, kernels_sm90)
        h_q, b, s_k, fmt = shape
        rows.append({"source": source, "format": fmt, "h_q": h_q, "b": b, "s_k": s_k,
                     "measured_us": us, "estimate_us": round(p.us, 2), "bound": p.bound,
                     "error": round((p.us - us) / us, 3)})
    return rows


# The regimes the validation error is summarized over.
REGIMES = (
    ("all cells", lambda r: True),
    ("bf16, h_q 16, b >= 32 (memory-bound)", lambda r: r["format"] == "bf16" and r["h_q"] == 16
     and r["b"] >= 32),
    ("8-bit, h_q 16, b >= 32", lambda r: r["format"] != "bf16" and r["h_q"] == 16
     and r["b"] >= 32),
    ("h_q 128, b >= 8 (compute-bound)", lambda r: r["h_q"] == 128 and r["b"] >= 8),
    ("b = 1 (launch and latency)", lambda r: r["b"] == 1),
)


def error_summary(rows, keep=lambda r: True):
    errs = [abs(r["error"]) for r in rows if keep(r)]
    if not errs:
        return None
    return {"cells": len(errs), "median_abs_error": round(statistics.median(errs), 3),
            "max_abs_error": round(max(errs), 3)}


def compare_3090(rows):
    """The RTX 3090 estimate in the reference design's terms (REFERENCE_3090)."""
    ref = REFERENCE_3090
    mine = [r for r in rows if r["gpu"] == "rtx3090"]
    mem = [r for r in mine if r["format"] == "bf16" and r["h_q"] == 16 and r["b"] >= 64]
    comp = [r for r in mine if r["format"] == "bf16" and r["h_q"] == 128 and r["b"] >= 16]
    by_shape = {(r["format"], r["h_q"], r["b"], r["s_k"]): r["us"] for r in mine}

    def span(values):
        return [round(min(values), 3), round(max(values), 3)] if values else None

    speedups = {}
    for fmt in ("fp8_e4m3", "int8"):
        for h_q in HEADS:
            s = [by_shape[("bf16", h, b, k)] / by_shape[(f, h, b, k)]
                 for (f, h, b, k) in by_shape if f == fmt and h == h_q and b >= 64]
            speedups[f"{fmt}, h_q {h_q}, b >= 64"] = span(s)
    return {
        "memory_bound": {"estimate_GBps": span([r["GBps"] for r in mem]),
                         "estimate_frac_read_peak": span([r["GBps"] / ref["read_peak_GBps"]
                                                          for r in mem]),
                         "reference": ref["memory_bound"]},
        "compute_bound": {"estimate_TFLOPS": span([r["TFLOPS"] for r in comp]),
                          "estimate_frac_bf16_peak": span([r["TFLOPS"] / ref["bf16_peak_TFLOPS"]
                                                           for r in comp]),
                          "reference": ref["compute_bound"]},
        "speedup_vs_bf16": {"estimate": speedups, "reference": ref["speedup_vs_bf16"]},
        "reference_label": ref["label"],
    }


def run_estimate(library=None, gpus=tuple(GPUS), shapes=None, results_dir=None, cuobjdump=None):
    """The whole estimate as a dict (what --json writes): kernels per architecture, a row per
    (GPU, shape), the H200 validation when docs/results and sm_90 code are at hand, and the RTX
    3090 comparison. Raises FileNotFoundError when the library, cuobjdump or the needed SASS is
    missing."""
    library = library or find_library()
    if not library or not os.path.isfile(library):
        raise FileNotFoundError("libkernelflow not found (pass --library or set KF_LIBRARY)")
    cuobjdump = cuobjdump or sass.find_cuobjdump()
    if not cuobjdump:
        raise FileNotFoundError("cuobjdump not found (CUDA toolkit, or pip install "
                                "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    shapes = shapes or default_shapes()
    archs = {GPUS[g].sass for g in gpus} | {"sm_90"}
    kernels, notes = {}, []
    for arch in sorted(archs):
        try:
            kernels[arch] = read_kernels(library, arch, cuobjdump)
        except (FileNotFoundError, KeyError) as e:
            notes.append(f"{arch}: {e}")
    result = {"what": "estimate: decode time per call from the SASS of the built library "
                      "(python -m kernelflow.estimate); every figure here is an estimate except "
                      "measured_us and the reference design's figures",
              "library": os.path.basename(library), "gpus": {}, "kernels": [], "rows": [],
              "notes": notes}
    for g in gpus:
        gpu = GPUS[g]
        if gpu.sass not in kernels:
            continue
        result["gpus"][g] = gpu_entry(gpu)
        for shape in shapes:
            result["rows"].append(prediction_row(gpu, shape, predict_shape(shape, gpu,
                                                                           kernels[gpu.sass])))
    for arch, ks in sorted(kernels.items()):
        result["kernels"] += kernel_table(arch, ks)
    results_dir = find_results_dir(results_dir)
    if "sm_90" in kernels and results_dir:
        rows = validate_h200(kernels["sm_90"], results_dir)
        result["h200_validation"] = {"rows": rows, "summary": [
            dict(which=label, **error_summary(rows, keep)) for label, keep in REGIMES
            if error_summary(rows, keep)]}
    else:
        notes.append("H200 validation skipped: " + ("no sm_90 code in the library"
                                                   if "sm_90" not in kernels
                                                   else "docs/results not found (--results)"))
    if any(r["gpu"] == "rtx3090" for r in result["rows"]):
        result["rtx3090_vs_reference"] = compare_3090(result["rows"])
    return result


def gpu_entry(gpu):
    return {"name": gpu.name, "arch": gpu.arch, "sass_counted": gpu.sass, "sms": gpu.sms,
            "clock_MHz": gpu.clock_mhz, "dram_GBps": gpu.dram_GBps, "read_GBps": gpu.read_GBps,
            "read_source": gpu.read_source, "rates_per_sm_clock": gpu.rates,
            "source": gpu.source}


def format_report(result):
    """The estimate as text: every figure labelled estimate or measured."""
    from .estimate_report import report_lines

    return "\n".join(report_lines(result))


def _parser():
    ap = argparse.ArgumentParser(
        prog="python -m kernelflow.estimate",
        description="Estimate the decode's time per call on RTX 3090, A100, RTX 4090 and H200 "
                    "from the built library's SASS (no GPU needed), validated against the "
                    "measured H200 times in docs/results.")
    ap.add_argument("--library", help="libkernelflow to read (default: $KF_LIBRARY, else the "
                                      "one this package loads)")
    ap.add_argument("--gpu", nargs="+", choices=sorted(GPUS), default=list(GPUS),
                    help="GPUs to estimate (default: all)")
    ap.add_argument("--results", help="folder with decode_h200.json and formats_h200.json "
                                      "(default: ./docs/results, else the source tree's)")
    ap.add_argument("--json", metavar="PATH", help="write the whole estimate as JSON")
    ap.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return ap


def estimate_main(argv=None):
    """Command line entry (python -m kernelflow.estimate, kernelflow bench --estimate): prints
    the report, writes --json; returns the exit status (2 when something needed is missing)."""
    args = _parser().parse_args(argv)
    try:
        result = run_estimate(args.library, tuple(args.gpu), results_dir=args.results)
    except FileNotFoundError as e:
        print(f"estimate: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(format_report(result))
    if args.json:
        from .estimate_report import dumps

        with open(args.json, "w") as f:
            f.write(dumps(dict(provenance(argv), **result)) + "\n")
    return 0


def provenance(argv):
    """Date, build, the command line and (from a git checkout in the current folder) the commit,
    for the JSON."""
    import datetime
    import subprocess

    from . import _C

    info = {"date": datetime.date.today().isoformat(), "build": _C.build_info(),
            "command": "python -m kernelflow.estimate " + " ".join(
                sys.argv[1:] if argv is None else argv)}
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True,
                                        check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


if __name__ == "__main__":
    sys.exit(estimate_main())
