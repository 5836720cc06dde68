"""`python -m kernelflow profile`: one decode configuration under Nsight Compute, and the kernel
count of the layer graph.

    python -m kernelflow profile decode --h-q 128 --batch 64 --s-k 4096 [--format fp8_e4m3]
    python -m kernelflow profile decode --family sm80 --print-command   # the ncu line, not run
    python -m kernelflow profile decode --h-q 128 --batch 64 --stalls 30  # where the warps wait
    python -m kernelflow profile layer --batch 64 --layers 27           # kernel nodes per layer
    python -m kernelflow profile layer-kernel --kernel regex:q_absorb --batch 64 --stalls 30

decode: runs this module again as ncu's target (`run-one`: the decode of that configuration a
few times, KF_NVTX=1 so the C API's ranges show) with ncu measuring the decode kernel's launch
after the warm-up ones, then prints the metrics that say where the kernel stands: DRAM
throughput, achieved occupancy, tensor-pipe utilization, shared-memory bank conflicts and
issue-slot utilization, with the kernel's duration. Metrics the device's ncu does not list
(`ncu --query-metrics`) are left out with a note, so one name unknown to a GPU generation does
not fail the run. With --stalls N it records the same launch's warp-stall samples instead
(WarpStateStats and SourceCounters) and prints where the warps wait: each stall reason's share
and the N hottest SASS instructions with their main reasons (kernelflow.bench.stalls). Needs ncu
(Nsight Compute) on PATH or --ncu, and the right to read the GPU's performance counters.

layer: builds a kernelflow.DecodeGraph of --layers DeepSeek-V2-Lite layers and checks its
kernel nodes per layer (DecodeGraph.kernel_nodes / layers, the once-per-step metadata node
included) against issue 14's bound of 8; exit status 1 above it.

layer-kernel: one launch of a fused-layer kernel under Nsight Compute, the same metrics or stall
samples as decode: the target process (`run-layer`) launches the --layers graph WARMUPS + 1
times, and ncu takes the launch of the kernels matching --kernel that --skip says (by default
the middle layer of the last graph launch, for a name that matches one launch per layer; the
layer's launches and their kernel names: src/cuda/layer/layer_graph.cu). ncu runs the graph's
kernels one at a time, so the profiled launch does not overlap its neighbours as it does in the
graph; the caches are left as the launches before it left them (--cache-control none), not
flushed.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

# ncu metric -> what it says (names valid on sm_80 and sm_90: Nsight Compute's metric reference).
METRICS = {
    "gpu__time_duration.sum": "kernel duration",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput (% of peak)",
    "dram__bytes_read.sum.per_second": "DRAM read bandwidth",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy (% of max warps)",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active":
        "tensor pipe active, all tensor instructions (% of cycles)",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active":
        "tensor pipe, HMMA op active (% of cycles; the sm_90a wgmma kernel counts here too)",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active":
        "tensor pipe, wgmma (GMMA) active (% of cycles; sm_90)",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum":
        "shared-memory bank conflicts, all (ldmatrix included)",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "shared-memory bank conflicts, loads",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum":
        "shared-memory bank conflicts, stores",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": "shared-memory wavefronts (all)",
    "sm__inst_issued.avg.pct_of_peak_sustained_active": "issue slots busy (% of peak)",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "cycles with an issue (% per scheduler)",
}
DECODE_KERNEL = "regex:mla_decode"  # the decode kernels of every family, not the combine
WARMUPS = 2  # decode launches (or layer graph launches) before the profiled one
FORMATS = ("bf16", "fp8_e4m3", "int8")


def add_config_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--h-q", type=int, default=128, help="query heads (16 or 128; default 128)")
    ap.add_argument("--batch", type=int, default=64, help="requests (default 64)")
    ap.add_argument("--s-k", type=int, default=4096, help="cached tokens per request (4096)")
    ap.add_argument("--format", choices=FORMATS, default="bf16", help="cache format (bf16)")
    ap.add_argument("--page", type=int, default=64, help="page size (64)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kernelflow profile",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    dec = sub.add_parser("decode", help="one decode configuration under Nsight Compute")
    add_config_arguments(dec)
    dec.add_argument("--family", default="auto",
                     help="kernel family (KF_KERNEL_FAMILY: auto, sm80 or sm90a; default auto)")
    dec.add_argument("--kernel", default=DECODE_KERNEL,
                     help=f"ncu --kernel-name filter (default {DECODE_KERNEL})")
    add_ncu_arguments(dec)
    lay = sub.add_parser("layer", help="kernel nodes per layer of the fused layer graph (<= 8)")
    add_layer_arguments(lay)
    lk = sub.add_parser("layer-kernel", help="one launch of a fused-layer kernel under Nsight "
                        "Compute")
    add_layer_arguments(lk)
    lk.add_argument("--kernel", required=True,
                    help="ncu --kernel-name filter, e.g. regex:q_absorb (the absorption and "
                    "prologue), regex:skinny_gemm, regex:mla_decode, regex:combine")
    lk.add_argument("--skip", type=int, default=None,
                    help="matching launches to skip (default: WARMUPS x layers + layers // 2, the "
                    "middle layer of the last graph launch for a name matched once per layer)")
    add_ncu_arguments(lk)
    one = sub.add_parser("run-one", help="(internal) the process ncu profiles")
    add_config_arguments(one)
    run_layer = sub.add_parser("run-layer", help="(internal) the process ncu profiles")
    add_layer_arguments(run_layer)
    return ap


def add_ncu_arguments(ap: argparse.ArgumentParser) -> None:
    """How ncu runs (decode and layer-kernel)."""
    ap.add_argument("--ncu", default=None, help="the ncu executable (default: ncu on PATH)")
    ap.add_argument("--print-command", action="store_true",
                    help="print the ncu command line and exit without running it")
    ap.add_argument("--stalls", type=int, default=0, metavar="N",
                    help="instead of the metrics: the warp-stall samples per SASS instruction "
                    "(ncu's WarpStateStats and SourceCounters sections, kernelflow.bench.stalls): "
                    "the reasons' shares and the N hottest instructions")


def add_layer_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--batch", type=int, default=64, help="requests (default 64)")
    ap.add_argument("--layers", type=int, default=27, help="V2-Lite layers (default 27)")
    ap.add_argument("--s-k", type=int, default=4096, help="cache length (default 4096)")
    ap.add_argument("--format", choices=FORMATS, default="bf16", help="cache format (bf16)")


# ---- one kernel launch under ncu: the decode, or a layer kernel --------------------------------

def target_argv(args) -> list:
    """The profiled process: this module's run-one (decode) or run-layer (layer-kernel) with
    the configuration."""
    if args.what == "layer-kernel":
        return ["-m", "kernelflow.bench.profile", "run-layer", "--batch", str(args.batch),
                "--layers", str(args.layers), "--s-k", str(args.s_k), "--format", args.format]
    return ["-m", "kernelflow.bench.profile", "run-one", "--h-q", str(args.h_q), "--batch",
            str(args.batch), "--s-k", str(args.s_k), "--format", args.format, "--page",
            str(args.page)]


def launch_options(args) -> list:
    """Which launch ncu takes (and, for a layer kernel, the caches left as they were)."""
    if args.what == "layer-kernel":
        skip = args.skip if args.skip is not None else WARMUPS * args.layers + args.layers // 2
        return ["--launch-skip", str(skip), "--launch-count", "1", "--cache-control", "none"]
    return ["--launch-skip", str(WARMUPS), "--launch-count", "1"]


def ncu_command(args, ncu: str = "ncu", metrics=None, python: str = sys.executable) -> list:
    """ncu measuring one launch of the kernels matching args.kernel (launch_options), as CSV."""
    metrics = list(METRICS) if metrics is None else list(metrics)
    return [ncu, "--target-processes", "all", "--kernel-name", args.kernel, *launch_options(args),
            "--metrics", ",".join(metrics), "--csv", "--page", "raw", python, *target_argv(args)]


def stalls_commands(args, ncu: str, report: str, python: str = sys.executable) -> tuple:
    """(ncu recording the stall samples of the same launch into report.ncu-rep, ncu printing
    that report's source page as CSV)."""
    record = [ncu, "--target-processes", "all", "--kernel-name", args.kernel,
              *launch_options(args), "--section", "WarpStateStats", "--section", "SourceCounters",
              "--import-source", "no", "-f", "-o", report, python, *target_argv(args)]
    export = [ncu, "-i", report + ".ncu-rep", "--page", "source", "--csv", "--print-source",
              "sass"]
    return record, export


def profile_stalls(args, ncu: str) -> int:
    from kernelflow.bench import stalls

    with tempfile.TemporaryDirectory() as d:
        record, export = stalls_commands(args, ncu, os.path.join(d, "stalls"))
        print(" ".join(record), flush=True)
        res = subprocess.run(record, env=ncu_env(args), capture_output=True, text=True)
        page = subprocess.run(export, capture_output=True, text=True) if res.returncode == 0 \
            else res
        try:
            summary = stalls.stall_summary(page.stdout, args.stalls)
        except ValueError as e:
            print(res.stdout[-2000:] + res.stderr[-2000:] + page.stderr[-2000:])
            print(f"ncu gave no stall samples for {args.kernel}: {e}")
            return 1
    print(describe(args))
    print("\n".join(stalls.summary_lines(summary)))
    return 0


def describe(args) -> str:
    """The profiled launch in words."""
    if args.what == "layer-kernel":
        skip = launch_options(args)[1]
        return (f"layer graph of {args.layers} V2-Lite layers, b {args.batch}, s_k {args.s_k}, "
                f"{args.format} cache: the launch after {skip} launches matching {args.kernel}")
    return (f"decode h_q {args.h_q}, b {args.batch}, s_k {args.s_k}, {args.format} cache, family "
            f"{args.family}: launch {WARMUPS + 1} of the decode kernel")


def ncu_env(args) -> dict:
    env = dict(os.environ, KF_NVTX="1")
    if getattr(args, "family", "auto") != "auto":
        env["KF_KERNEL_FAMILY"] = args.family
    return env


def available_metrics(ncu: str) -> set | None:
    """The base metric names the device's ncu lists, or None when it cannot say."""
    try:
        text = subprocess.run([ncu, "--query-metrics", "--devices", "0"], capture_output=True,
                              text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = {line.split()[0] for line in text.splitlines() if line.strip() and "__" in line}
    return names or None


def usable_metrics(ncu: str) -> tuple:
    """(metrics to ask for, metrics this device's ncu does not list)."""
    known = available_metrics(ncu)
    if known is None:
        return list(METRICS), []
    use = [m for m in METRICS if m.split(".")[0] in known]
    return use, [m for m in METRICS if m not in use]


def parse_ncu_csv(text: str) -> dict:
    """{metric: (value, unit)} of the first profiled kernel in `ncu --csv --page raw` output (a
    header row starting with "ID", a row of units, then one row per kernel); {} without one."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return {}
    rows = list(csv.reader(lines[start:]))
    if len(rows) < 3:
        return {}
    header, units, values = rows[0], rows[1], rows[2]
    return {h: (v, u) for h, u, v in zip(header, units, values) if h in METRICS or h ==
            "Kernel Name"}


def print_metrics(found: dict, missing: list) -> None:
    if "Kernel Name" in found:
        print(f"kernel: {found['Kernel Name'][0]}")
    for metric, label in METRICS.items():
        if metric in found:
            value, unit = found[metric]
            print(f"  {label:52s} {value:>14s} {unit:10s} ({metric})")
    for metric in missing:
        print(f"  {METRICS[metric]:52s} {'not listed by this ncu':>14s}            ({metric})")


def profile_kernel(args) -> int:
    ncu = args.ncu or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if args.print_command:
        if args.stalls:
            for cmd in stalls_commands(args, ncu, "stalls"):
                print(" ".join(cmd))
        else:
            print(" ".join(ncu_command(args, ncu)))
        return 0
    if not os.path.exists(ncu) and shutil.which(ncu) is None:
        print("ncu (Nsight Compute) not found: put it on PATH or pass --ncu PATH")
        return 1
    if args.stalls:
        return profile_stalls(args, ncu)
    metrics, missing = usable_metrics(ncu)
    cmd = ncu_command(args, ncu, metrics)
    print(" ".join(cmd), flush=True)
    res = subprocess.run(cmd, env=ncu_env(args), capture_output=True, text=True)
    found = parse_ncu_csv(res.stdout)
    if res.returncode != 0 or not found:
        print(res.stdout[-3000:] + res.stderr[-3000:])
        print(f"ncu exited {res.returncode} without a profiled kernel matching {args.kernel}")
        return 1
    print(describe(args))
    print_metrics(found, missing)
    return 0


def run_one(args) -> int:
    """The profiled process: WARMUPS + 1 decodes of the configuration (each with its combine)."""
    import torch

    import kernelflow as kf
    from kernelflow.bench import decode as d

    p = d.Problem(args.h_q, args.batch, args.s_k, args.page, torch.bfloat16, rotate_bytes=0,
                  max_copies=2, seed=0)
    kv = p.kv if args.format == "bf16" else kf.convert_cache(p.kv, kv_format=args.format)
    md = kf.get_mla_metadata(p.seqlens, args.h_q, kv_format=args.format)
    for _ in range(WARMUPS + 1):
        kf.mla_decode(p.qs[0], kv, p.block_tables[0], p.seqlens, md, d.SCALE,
                      kv_format=None if args.format == "bf16" else args.format)
    torch.cuda.synchronize()
    return 0


# ---- the layer graph: its kernel count, and the process a layer kernel is profiled in -----------

def layer_graph(args, use):
    """use(graph) on a kernelflow.DecodeGraph of args.layers V2-Lite layers (the layer
    benchmark's weights, caches and step), returning what use returns."""
    import torch

    import kernelflow as kf
    from kernelflow.bench import layer as lay

    tl, dev = lay.tl, torch.device("cuda")
    shape = tl.LayerShape.deepseek_v2_lite()
    gen = torch.Generator(device=dev).manual_seed(0)
    weights = [tl.make_layer_weights(shape, gen, dev) for _ in range(args.layers)]
    step = tl.make_step(shape, [args.s_k] * args.batch, args.layers, gen, dev, page_size=64)
    caches = (step.caches if args.format == "bf16"
              else [kf.convert_cache(c, kv_format=args.format) for c in step.caches])
    output = torch.empty_like(step.hidden)
    with lay.fused_graph(shape, weights, caches, step, args.format, output,
                         kf.new_error_buffer(step.hidden)) as graph:
        return use(graph)


def run_layer(args) -> int:
    """The profiled process of layer-kernel: WARMUPS + 1 launches of the layer graph."""
    import torch

    def launches(graph):
        for _ in range(WARMUPS + 1):
            graph.launch()
        torch.cuda.synchronize()

    layer_graph(args, launches)
    return 0


def layer_nodes(args) -> int:
    from kernelflow.bench import layer as lay

    nodes = layer_graph(args, lay.kernel_nodes)
    per_layer = nodes / args.layers
    ok = per_layer <= lay.MAX_NODES_PER_LAYER
    print(f"layer graph, {args.layers} V2-Lite layers, b {args.batch}, {args.format} cache: "
          f"{nodes} kernel nodes, {per_layer:.2f} per layer (bound {lay.MAX_NODES_PER_LAYER}): "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.what == "run-one":
        return run_one(args)
    if args.what == "run-layer":
        return run_layer(args)
    from kernelflow.bench.cli import gpu_missing

    if not getattr(args, "print_command", False):
        why = gpu_missing()
        if why:
            print(why)
            return 1
    return layer_nodes(args) if args.what == "layer" else profile_kernel(args)


if __name__ == "__main__":
    sys.exit(main())
