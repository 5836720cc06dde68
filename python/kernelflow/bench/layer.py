"""Decode-layer benchmark: the fused layer graph (kernelflow.DecodeGraph) against the unfused
PyTorch layer (kernelflow.bench.baselines.torch_layer, attention by kernelflow.mla_decode), on the
DeepSeek-V2-Lite attention block of docs/spec.md section 3.

Setup: --layers (27) layers of the V2-Lite shape, each with its own random weights and its own
paged cache (page 64, pages scattered over the pool); every request at s_k = 4096 after this
step's append; b in --batch (1, 8, 32, 64). Reported in microseconds per layer, one run:
  - unfused eager: the torch layer called 27 times (the metadata once per step);
  - unfused graph: the same 27 layers captured in one torch.cuda.CUDAGraph;
  - fused: one kernelflow.DecodeGraph of 27 layers with the bf16 cache, and with fp8_e4m3 and
    int8 caches made by kernelflow.convert_cache from the bf16 ones;
  - the floor: (weights + b * s_k * bytes_per_token) / the read peak, per layer; the weights'
    bytes counted from the shapes (27.5 MB), bytes per token 1152 (bf16) or 644 (8-bit), the read
    peak measured by kernelflow.bench.peaks in this run (as kernelflow.bench.decode gets it:
    --peaks-json reuses a peaks result, --peaks-from-spec takes docs/spec.md's);
  - speedups: the unfused graph's time / each one's; kernel nodes per layer: for torch's graph
    counted with cuGraphGetNodes on its cudaGraph_t (CUDAGraph(keep_graph=True); the
    torch.profiler count of one eager step where that is unavailable), for ours g.kernel_nodes;
    both include the once-per-step nodes (the metadata), spread over the layers;
  - docs/spec.md section 5's unfused figures (attention by FlashMLA, H200, 2026-11-30) beside,
    labelled "not from this run".
The skinny GEMM alone: torch.matmul(x [b, in], W^T) and kernelflow.linear (the fused layer's
GEMM as an operation of its own, launched in plain stream order) over distinct weights of each
V2-Lite projection (W_q, W_kv_a, W_o, and [W_q; W_kv_a], the one launch the fused layer makes
of those two) in one CUDA graph per (projection, b, library): 27 of them, more where 27 would
stay within 4x L2 (so each GEMM reads its weights from memory); microseconds per GEMM and GB/s
against the read peak. Inside the fused graph the GEMMs are programmatic dependents that
stream their weights while the kernel before them finishes, so they take less there
(--breakdown lists the fused graph's kernels by name with their times, from torch.profiler).
V3 row: --v3-layers (4) layers of the V3 shape (hidden 7168, 128 heads, q_lora 1536; 374 MB of
weights per layer), b = 1 and 64, fused bf16 against its floor (and the unfused graph).

Timing: CUDA events around each call (a graph replay, a DecodeGraph launch, an eager step) after
warm-ups; the median over --replays, divided by the layer count. No cache or weight rotation is
needed for the layer graphs: one step reads every layer's weights once (27 x 27.5 MB = 743 MB,
12x the H200's 60 MiB L2) and its caches, so nothing a layer reads is still in L2 when the next
replay reaches it.
Check before timing, per layer (docs/spec.md section 3's bound is the layer's): a one-layer
fused graph (layer 0's weights, its own copy of layer 0's cache in the row's format) against the
one-layer torch layer on another copy, the same input and cache format: cosine distance
1 - 2<x,y>/(|x|^2+|y|^2) of the layer output, PASS below 1e-4 with the error buffer clean; the
cache rows the two wrote (bf16) and the 8-bit layers against the bf16 one are reported. The timed
graph of all the layers is then run once against the torch layers (writing into their own copies
of the caches): its whole output's cosine distance is reported as the drift over the layers,
information without a bound (bf16 rounding differences compound through a chain of random-weight
layers); its error buffer must be clean.

    python3 -m kernelflow.bench.layer --json $OUT/layer.json       # everything, ~3 min
    python3 -m kernelflow.bench.layer --quick --no-unfused         # b 1 and 64, fused only
    python3 -m kernelflow.bench.layer --device cpu                 # CPU smoke test, tiny shapes

`python -m kernelflow bench` runs this module's run() with the peaks it measured once.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections import Counter

import torch

import kernelflow as kf
from kernelflow import reference as kf_ref
from kernelflow.bench import peaks as peaks_mod
from kernelflow.bench.baselines import torch_layer as tl
from kernelflow.bench.results import plain
from kernelflow.bench.timing import event_times_ms

ANCHOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "anchors",
                      "h200-flashmla-torch-2026-11-30.json")
SPEC_LABEL = ("docs/spec.md section 5: unfused PyTorch layer, attention by FlashMLA, H200, "
              "2026-11-30 (not from this run)")
BYTES_PER_TOKEN = {"bf16": 1152, "fp8_e4m3": 644, "int8": 644}
MAX_COS_DIST = 1e-4  # fused vs torch layer, same cache format (docs/spec.md section 3)
# Issue 14's bounds, microseconds per layer at s_k = 4096, and kernel nodes per layer.
TARGETS = {("bf16", 1): 25.0, ("bf16", 64): 95.0, ("fp8_e4m3", 64): 60.0}
MAX_NODES_PER_LAYER = 8
GEMM_PROJECTIONS = ("w_q", "w_kv_a", "w_q_kv_a", "w_o")
GEMM_MIN_FRAC_READ = 0.80  # issue 14: each projection GEMM at b <= 8
GEMM_BOUND_MAX_B = 8
GEMM_BOUND_PROJECTIONS = ("w_q_kv_a", "w_o")  # the fused layer's launches of these weights
GEMM_MAX_ERR = 1e-2  # kernelflow.linear against the fp32 product, relative to its largest value


def log(msg: str = ""):
    print(msg, flush=True)


def short_err(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300] if s else ''}"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kernelflow.bench.layer",
                                 description="decode-layer benchmark (see the module docstring)")
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="default 1 8 32 64")
    ap.add_argument("--layers", type=int, default=None, help="V2-Lite layers (default 27)")
    ap.add_argument("--s-k", type=int, default=None, help="cache length after the append (4096)")
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--formats", nargs="+", choices=list(BYTES_PER_TOKEN), default=None,
                    help="fused cache formats (default all three)")
    ap.add_argument("--v3-layers", type=int, default=None, help="V3 layers (default 4; 0 skips)")
    ap.add_argument("--v3-batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--quick", action="store_true", help="b 1 and 64, fewer replays")
    ap.add_argument("--no-unfused", action="store_true", help="skip the torch layer's timings")
    ap.add_argument("--no-gemm", action="store_true", help="skip the skinny GEMM table")
    ap.add_argument("--breakdown", action="store_true",
                    help="list the fused bf16 graph's kernels and times (torch.profiler)")
    ap.add_argument("--replays", type=int, default=None, help="timed graph launches (30)")
    ap.add_argument("--eager-replays", type=int, default=None, help="timed eager steps (10)")
    ap.add_argument("--warmups", type=int, default=3)
    ap.add_argument("--peaks-json", help="use the peaks that a `peaks.py --json` run wrote")
    ap.add_argument("--peaks-from-spec", action="store_true",
                    help="use docs/spec.md's H200 peaks instead of measuring them")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a smoke test of the same code on tiny shapes (CPU backend)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write everything here (e.g. $OUT/layer.json)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    cpu = args.device == "cpu"
    defaults = {"batch": [1, 3] if cpu else ([1, 64] if args.quick else [1, 8, 32, 64]),
                "layers": 2 if cpu else 27, "s_k": 200 if cpu else 4096,
                "formats": list(BYTES_PER_TOKEN), "v3_layers": 2 if cpu else 4,
                "replays": 3 if cpu else (10 if args.quick else 30),
                "eager_replays": 3 if cpu else (5 if args.quick else 10)}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if cpu:
        args.v3_batch, args.warmups = [1, 3], 1
    if min(args.batch + args.v3_batch) < 1 or args.layers < 1 or args.s_k < 1:
        ap.error("--batch, --v3-batch, --layers and --s-k take positive values")
    return args


def shapes_for(args):
    """(V2-Lite shape, V3 shape): the models' on the GPU, small ones of the same kinds on the
    CPU (no query compression / with it)."""
    if args.device == "cpu":
        return (tl.LayerShape(hidden_size=256, num_heads=4, q_lora_rank=0,
                              softmax_scale=tl.SCALE_V2_LITE),
                tl.LayerShape(hidden_size=320, num_heads=8, q_lora_rank=128,
                              softmax_scale=tl.SCALE_V3))
    return tl.LayerShape.deepseek_v2_lite(), tl.LayerShape.deepseek_v3()


# ---- timing and graphs --------------------------------------------------------------------------

def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, replays: int, warmups: int, device) -> dict:
    """Median and min microseconds of one call of fn: CUDA events around each call on the
    current stream (the host clock on the CPU), after `warmups` calls."""
    for _ in range(warmups):
        fn()
    synchronize(device)
    if device.type == "cuda":
        us = [1e3 * t for t in event_times_ms(fn, replays)]
    else:
        us = []
        for _ in range(replays):
            t0 = time.perf_counter()
            fn()
            us.append(1e6 * (time.perf_counter() - t0))
    return {"us": statistics.median(us), "us_min": min(us), "replays": replays}


def capture(fn):
    """(graph, fn's result inside it): fn run once on a side stream (cuBLAS and the allocator
    warmed up off the capture), then captured in one torch.cuda.CUDAGraph, kept as a cudaGraph_t
    where this torch allows so that its nodes can be counted."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        graph, kept = torch.cuda.CUDAGraph(keep_graph=True), True
    except TypeError:
        graph, kept = torch.cuda.CUDAGraph(), False
    with torch.cuda.graph(graph):
        result = fn()
    if kept:
        graph.instantiate()
    graph.replay()
    torch.cuda.synchronize()
    graph.kept_raw_graph = kept
    return graph, result


# CUgraphNodeType (cuda.h)
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty",
              6: "wait_event", 7: "event_record", 8: "ext_semas_signal", 9: "ext_semas_wait",
              10: "mem_alloc", 11: "mem_free", 12: "batch_mem_op", 13: "conditional"}


def graph_node_types(raw_graph: int) -> Counter:
    """Node types of a cudaGraph_t (a CUgraph to the driver), child graphs included, through
    the driver API (libcuda's cuGraphGetNodes / cuGraphNodeGetType)."""
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} returned CUresult {rc}")

    def walk(graph, counts):
        n = ctypes.c_size_t(0)
        check(cuda.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)),
              "cuGraphGetNodes")
        nodes = (ctypes.c_void_p * n.value)()
        check(cuda.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(n)),
              "cuGraphGetNodes")
        for node in nodes[:n.value]:
            kind = ctypes.c_int(-1)
            check(cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)),
                  "cuGraphNodeGetType")
            counts[NODE_TYPES.get(kind.value, str(kind.value))] += 1
            if kind.value == 4:
                child = ctypes.c_void_p()
                check(cuda.cuGraphChildGraphNodeGetGraph(ctypes.c_void_p(node),
                                                         ctypes.byref(child)),
                      "cuGraphChildGraphNodeGetGraph")
                walk(child.value, counts)
        return counts

    return walk(raw_graph, Counter())


def cuda_driver_version() -> str:
    """The driver's CUDA version, e.g. '13.0' (cuDriverGetVersion), or why it is unknown."""
    try:
        version = ctypes.c_int(0)
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError as e:
        return f"unknown ({e})"


def profiled_kernels(fn, device) -> list:
    """(name, microseconds) of every kernel fn launches, from torch.profiler (CUPTI)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


def count_graph_kernels(graph, eager_fn, device) -> dict:
    """Kernel nodes of a captured torch graph, and how they were counted."""
    if graph.kept_raw_graph:
        try:
            counts = graph_node_types(graph.raw_cuda_graph())
            return {"kernels": counts.get("kernel", 0), "node_types": dict(counts),
                    "method": "cuGraphGetNodes on the captured cudaGraph_t"}
        except Exception as e:  # noqa: BLE001
            log(f"    (cuGraphGetNodes failed: {short_err(e)}; counting with torch.profiler)")
    kernels = profiled_kernels(eager_fn, device)
    return {"kernels": len(kernels),
            "method": "torch.profiler: kernels launched by one eager step"}


# ---- the two implementations ---------------------------------------------------------------------

def layer_dicts(weights: list, caches: list) -> list:
    return [dict(w, kv_cache=c) for w, c in zip(weights, caches)]


def torch_step(shape, weights, caches, step, attention, kv_format="bf16"):
    """A callable running the unfused torch layers over one step."""
    layers = layer_dicts(weights, caches)
    return lambda: tl.torch_layers(shape, layers, step.hidden, step.positions, step.cache_seqlens,
                                   step.block_table, step.cos_sin, attention=attention,
                                   kv_format=kv_format)


def has_decode_graph() -> bool:
    return hasattr(kf, "DecodeGraph") and hasattr(kf, "LayerConfig")


def fused_graph(shape, weights, caches, step, kv_format, output, error_buffer):
    """kernelflow.DecodeGraph of len(weights) layers over the step's static buffers (docs:
    python/kernelflow/layer.py); its workspace is allocated in torch by the library."""
    cfg = kf.LayerConfig(**vars(shape), kv_format=kv_format, page_size=step.page_size,
                         max_batch=step.batch, max_pages_per_seq=int(step.block_table.shape[1]),
                         max_position=int(step.cos_sin.shape[0]))
    return kf.DecodeGraph(cfg, layer_dicts(weights, caches), hidden=step.hidden, output=output,
                          positions=step.positions, cache_seqlens=step.cache_seqlens,
                          block_table=step.block_table, cos_sin=step.cos_sin,
                          error_buffer=error_buffer)


def kernel_nodes(graph) -> int:
    n = graph.kernel_nodes
    return int(n() if callable(n) else n)


def cos_dist(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(kf_ref.cosine_distance(a.double().cpu().numpy(), b.double().cpu().numpy(),
                                        axis=None))


def written_rows(caches: list, step) -> torch.Tensor:
    """The rows at cache_seqlens - 1 of every layer's 16-bit cache, [layers, b, 576]."""
    slots = tl.cache_slots(step.cache_seqlens, step.block_table, step.page_size)
    return torch.stack([c.view(-1, tl.HEAD_DIM)[slots] for c in caches])


# ---- one configuration ---------------------------------------------------------------------------

def floor_us(weight_bytes: int, b: int, s_k: int, kv_format: str, read_gbps: float) -> float:
    return (weight_bytes + b * s_k * BYTES_PER_TOKEN[kv_format]) / (read_gbps * 1e9) * 1e6


def run_unfused(shape, weights, step, args, device, graph_too=True, eager=True) -> dict:
    """The torch layer's microseconds per layer, eager and as one captured graph, its kernel
    nodes per layer, and the graph's output against an eager step's."""
    n = len(weights)
    res = {}
    attention = tl.KernelflowAttention(step.cache_seqlens, shape.num_heads)
    fn = torch_step(shape, weights, step.caches, step, attention)
    if eager:
        t = time_calls(fn, args.eager_replays, args.warmups, device)
        res["eager_us"] = t["us"] / n
        log(f"  unfused eager       : {res['eager_us']:9.1f} us/layer")
    if graph_too and device.type == "cuda":
        want = fn().clone()
        graph, out = capture(fn)
        res["graph_vs_eager_identical"] = bool(torch.equal(out, want))
        t = time_calls(graph.replay, args.replays, args.warmups, device)
        res["graph_us"] = t["us"] / n
        nodes = count_graph_kernels(graph, fn, device)
        res["nodes_per_layer"] = nodes["kernels"] / n
        res["nodes"] = nodes
        log(f"  unfused graph       : {res['graph_us']:9.1f} us/layer, "
            f"{res['nodes_per_layer']:.1f} kernel nodes/layer ({nodes['kernels']} in all; "
            f"{nodes['method']}); replay "
            f"{'bit-identical to' if res['graph_vs_eager_identical'] else 'DIFFERS from'} eager")
        del graph, out
    return res


def current_stream(device):
    return torch.cuda.current_stream() if device.type == "cuda" else None


def in_format(cache: torch.Tensor, kv_format: str) -> torch.Tensor:
    """A new cache of kv_format holding the bf16 cache's rows (a copy for bf16)."""
    return cache.clone() if kv_format == "bf16" else kf.convert_cache(cache, kv_format=kv_format)


def torch_output(shape, weights, caches, step, kv_format) -> torch.Tensor:
    """The torch layers' output over the step, each layer writing its row into `caches`."""
    attention = tl.KernelflowAttention(step.cache_seqlens, shape.num_heads, kv_format)
    return torch_step(shape, weights, caches, step, attention, kv_format)()


def compare(output, want, ours, theirs, step, kv_format, errors, fused16) -> dict:
    """The fused output against the torch one (cos_dist_vs_torch); with a bf16 cache the rows
    both wrote (ours, theirs: their caches), with an 8-bit one the output against the fused bf16
    output fused16 where given; the error buffer and whether it is clean."""
    res = {"cos_dist_vs_torch": cos_dist(output, want)}
    if kv_format == "bf16":
        res["cache_rows_cos_dist"] = cos_dist(written_rows(ours, step), written_rows(theirs, step))
    elif fused16 is not None:
        res["cos_dist_vs_fused_bf16"] = cos_dist(output, fused16)
    res["error_buffer"] = errors.tolist()
    res["error_buffer_clean"] = res["error_buffer"][0] == 0
    return res


def extras(res: dict) -> str:
    """The reported figures of a comparison beside the torch one, for the log."""
    return "".join(f", {k} {res[k]:.2e}" for k in ("cache_rows_cos_dist", "cos_dist_vs_fused_bf16")
                   if k in res) + ("" if res["error_buffer_clean"]
                                   else f", error buffer {res['error_buffer']}")


def check_layer(shape, weights, step, kv_format, device, fused16=None):
    """The check of one configuration, per layer: a one-layer fused graph (layer 0's weights, its
    own copy of layer 0's cache in kv_format) against the one-layer torch layer on another copy,
    the same input; PASS when the cosine distance of the layer output is below MAX_COS_DIST and
    the error buffer is clean. fused16: the bf16 check's output, which an 8-bit layer's is
    compared with. Returns (the check, the fused layer's output)."""
    ours = in_format(step.caches[0], kv_format)
    theirs = ours.clone()
    want = torch_output(shape, weights[:1], [theirs], step, kv_format)
    output = torch.full_like(step.hidden, float("nan"))
    errors = kf.new_error_buffer(step.hidden)
    with fused_graph(shape, weights[:1], [ours], step, kv_format, output, errors) as graph:
        graph.launch(stream=current_stream(device))
        synchronize(device)
    res = {"layers": 1, "bound": MAX_COS_DIST}
    res.update(compare(output, want, [ours], [theirs], step, kv_format, errors, fused16))
    res["ok"] = bool(res["cos_dist_vs_torch"] < MAX_COS_DIST and res["error_buffer_clean"])
    log(f"  check fused {kv_format:9s}: {'PASS' if res['ok'] else 'FAIL'} one layer, cosine "
        f"distance vs the torch layer {res['cos_dist_vs_torch']:.2e} (bound {MAX_COS_DIST:.0e})"
        f"{extras(res)}")
    return res, output


def run_fused(shape, weights, step, kv_format, args, device, fused16=None) -> dict:
    """The fused graph of all the layers over caches of kv_format: the per-layer check
    (check_layer, in res["check"]), then one launch against the torch layers on their own copy
    of the same caches (the drift over the layers: reported, no bound; the error buffer must be
    clean), then timed. fused16: the bf16 run's res["outputs"], which the 8-bit ones are
    compared with; res["outputs"]: {"check": the one-layer output, "drift": the graph's}."""
    n = len(weights)
    fused16 = fused16 or {}
    check, check_output = check_layer(shape, weights, step, kv_format, device,
                                      fused16.get("check"))
    res = {"format": kv_format, "check": check}
    caches = (step.caches if kv_format == "bf16"
              else [in_format(c, kv_format) for c in step.caches])
    own = [c.clone() for c in caches]
    want = torch_output(shape, weights, own, step, kv_format)
    output = torch.full_like(step.hidden, float("nan"))
    errors = kf.new_error_buffer(step.hidden)
    stream = current_stream(device)
    with fused_graph(shape, weights, caches, step, kv_format, output, errors) as graph:
        graph.launch(stream=stream)
        synchronize(device)
        res.update(compare(output, want, caches, own, step, kv_format, errors,
                           fused16.get("drift")))
        res["drift_layers"] = n
        del own, want
        res["ok"] = bool(check["ok"] and res["error_buffer_clean"])
        log(f"  drift over {n:3d} layers: cosine distance vs the torch layers "
            f"{res['cos_dist_vs_torch']:.2e} (information, no bound){extras(res)}")
        t = time_calls(lambda: graph.launch(stream=stream), args.replays, args.warmups, device)
        res["us"] = t["us"] / n
        res["us_min"] = t["us_min"] / n
        res["kernel_nodes"] = kernel_nodes(graph)
        res["nodes_per_layer"] = res["kernel_nodes"] / n
        log(f"  fused {kv_format:14s}: {res['us']:9.1f} us/layer, "
            f"{res['nodes_per_layer']:.2f} kernel nodes/layer ({res['kernel_nodes']} in all)")
        if args.breakdown and kv_format == "bf16" and device.type == "cuda":
            res["breakdown"] = breakdown(lambda: graph.launch(stream=stream), n, device)
    res["outputs"] = {"check": check_output, "drift": output}  # removed before the JSON
    return res


def breakdown(fn, n_layers: int, device) -> list:
    """The kernels of one launch by name: calls and microseconds per layer (torch.profiler)."""
    try:
        kernels = profiled_kernels(fn, device)
    except Exception as e:  # noqa: BLE001
        log(f"  (breakdown unavailable: {short_err(e)})")
        return []
    by_name: dict = {}
    for name, us in kernels:
        calls, total = by_name.get(name, (0, 0.0))
        by_name[name] = (calls + 1, total + us)
    rows = [{"kernel": k, "calls": c, "us_per_layer": t / n_layers, "us_per_call": t / c}
            for k, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])]
    log(f"  fused bf16 kernels in one launch (torch.profiler; with programmatic dependent launch a "
        f"kernel's time includes its wait): {len(kernels)} kernels")
    for r in rows:
        log(f"    {r['calls']:4d} x {r['us_per_call']:8.2f} us = {r['us_per_layer']:7.2f} us/layer"
            f"  {r['kernel'][:110]}")
    return rows


# ---- the sections --------------------------------------------------------------------------------

def bench_v2_lite(args, shape, weights, peaks, device, gen, out) -> int:
    fails = 0
    wbytes = tl.layer_weight_bytes(shape)
    for b in args.batch:
        log(f"\n== V2-Lite layer, b = {b}, s_k = {args.s_k}, {args.layers} layers, page "
            f"{args.page}")
        on_shape = getattr(args, "on_shape", None)
        if on_shape is not None:
            on_shape(f"layer b={b}")
        row = {"model": "v2_lite", "b": b, "s_k": args.s_k, "layers": args.layers}
        row["floor_us"] = {f: floor_us(wbytes, b, args.s_k, f, peaks["read_GBps"])
                           for f in BYTES_PER_TOKEN}
        try:
            step = tl.make_step(shape, [args.s_k] * b, args.layers, gen, device,
                                page_size=args.page)
            if not args.no_unfused:
                row["unfused"] = run_unfused(shape, weights, step, args, device)
            row["fused"] = {}
            if has_decode_graph():
                fused16 = None
                for fmt in args.formats:
                    try:
                        res = run_fused(shape, weights, step, fmt, args, device, fused16)
                        outputs = res.pop("outputs")
                        if fmt == "bf16":
                            fused16 = outputs
                        fails += not res["ok"]
                    except Exception as e:  # noqa: BLE001
                        res = {"format": fmt, "error": short_err(e)}
                        fails += 1
                        log(f"  fused {fmt:14s}: FAILED {short_err(e)}")
                        if os.environ.get("KF_BENCH_TRACE"):
                            traceback.print_exc()
                    row["fused"][fmt] = res
            del step
        except Exception as e:  # noqa: BLE001
            fails += row_failed(row, e)
        out["rows"].append(row)
        free(device)
        save(args, out)
    return fails


def row_failed(row: dict, e: Exception) -> int:
    """Record a row's failure (printed, in the row's "error"; the traceback too with
    KF_BENCH_TRACE=1); returns 1, the count of failures it adds."""
    row["error"] = short_err(e)
    log(f"  FAILED {short_err(e)}")
    if os.environ.get("KF_BENCH_TRACE"):
        traceback.print_exc()
    return 1


def gemm_shapes(shape) -> dict:
    """[out, in] of each projection of GEMM_PROJECTIONS (w_q_kv_a: W_q and W_kv_a stacked)."""
    shapes = dict(tl.weight_shapes(shape))
    if "w_q" in shapes:
        shapes["w_q_kv_a"] = (shapes["w_q"][0] + shapes["w_kv_a"][0], shapes["w_q"][1])
    return shapes


def time_gemm_chain(gemm, copies, args, device) -> float:
    """Microseconds per GEMM of gemm(i) for i < copies, all in one captured CUDA graph."""

    def unit():
        for i in range(copies):
            gemm(i)

    graph, _ = capture(unit)
    t = time_calls(graph.replay, args.replays, args.warmups, device)
    del graph
    return t["us"] / copies


def bench_gemm(args, shape, peaks, device, gen, l2_bytes, out):
    """torch.matmul and kernelflow.linear over distinct weights of each projection, one CUDA
    graph per (projection, b, library)."""
    log(f"\n== skinny GEMM alone: torch.matmul(x [b, in], W^T) and kernelflow.linear, "
        f"distinct weights per call")
    shapes = gemm_shapes(shape)
    fails = 0
    for name in GEMM_PROJECTIONS:
        if name not in shapes:
            continue
        n_out, n_in = shapes[name]
        wbytes = 2 * n_out * n_in
        copies = max(args.layers, math.ceil(4 * l2_bytes / wbytes))
        ws = torch.randn(copies, n_out, n_in, generator=gen, device=device,
                         dtype=torch.float32).to(torch.bfloat16)
        for b in args.batch:
            row = {"projection": name, "shape": [n_out, n_in], "b": b, "copies": copies}
            try:
                x = torch.randn(b, n_in, generator=gen, device=device).to(torch.bfloat16)
                ys = torch.empty(copies, b, n_out, device=device, dtype=torch.bfloat16)
                nbytes = wbytes + 2 * b * (n_in + n_out)
                workspace = kf.new_linear_workspace(x, ws[0])
                gemms = {
                    "torch": lambda i: torch.matmul(x, ws[i].t(), out=ys[i]),
                    "kf": lambda i: kf.linear(x, ws[i], out=ys[i], workspace=workspace),
                }
                for lib, gemm in gemms.items():
                    us = time_gemm_chain(gemm, copies, args, device)
                    row.update({f"{lib}_us": us, f"{lib}_GBps": nbytes / us / 1e3,
                                f"{lib}_frac_read_peak": nbytes / us / 1e3 / peaks["read_GBps"]})
                    label = "torch.matmul" if lib == "torch" else "kernelflow.linear"
                    log(f"  {name:8s} [{n_out}, {n_in}] b = {b:3d}: {label:17s} {us:7.2f} us, "
                        f"{row[f'{lib}_GBps']:6.0f} GB/s "
                        f"({100 * row[f'{lib}_frac_read_peak']:5.1f}% of read), {copies} weights")
                # The kernelflow chain ran last: its outputs against fp32 sums of the same bf16
                # values, relative to the largest (one bf16 rounding is 2^-8 of a value).
                ref = torch.matmul(x.float(), ws[copies - 1].float().t())
                err = float(((ys[copies - 1].float() - ref).abs()).max() / ref.abs().max())
                row["kf_max_err_rel_to_max"] = err
                if not err <= GEMM_MAX_ERR:
                    raise RuntimeError(f"kernelflow.linear's output {err:.2e} (relative to the "
                                       f"largest value) from the fp32 product, bound {GEMM_MAX_ERR}")
            except Exception as e:  # noqa: BLE001
                fails += row_failed(row, e)
            out["gemm_rows"].append(row)
        del ws
        free(device)
    save(args, out)
    return fails


def bench_v3(args, shape, peaks, device, gen, out) -> int:
    fails = 0
    wbytes = tl.layer_weight_bytes(shape)
    log(f"\n== query-compressed layer ({describe(shape)}), {args.v3_layers} layers, "
        f"s_k = {args.s_k}, bf16 cache")
    weights = [tl.make_layer_weights(shape, gen, device) for _ in range(args.v3_layers)]
    for b in args.v3_batch:
        row = {"model": "v3", "b": b, "s_k": args.s_k, "layers": args.v3_layers,
               "floor_us": floor_us(wbytes, b, args.s_k, "bf16", peaks["read_GBps"])}
        log(f"  b = {b}: floor {row['floor_us']:.1f} us/layer")
        try:
            step = tl.make_step(shape, [args.s_k] * b, args.v3_layers, gen, device,
                                page_size=args.page)
            if not args.no_unfused:
                row["unfused"] = run_unfused(shape, weights, step, args, device, eager=False)
            if has_decode_graph():
                res = run_fused(shape, weights, step, "bf16", args, device)
                res.pop("outputs")
                fails += not res["ok"]
                row["fused"] = res
            del step
        except Exception as e:  # noqa: BLE001
            fails += row_failed(row, e)
        out["v3_rows"].append(row)
        free(device)
        save(args, out)
    return fails


# ---- reporting -----------------------------------------------------------------------------------

def load_spec_rows() -> dict:
    try:
        with open(ANCHOR) as f:
            rows = json.load(f)["rows"]
        return {r["b"]: r for r in rows if "layer" in r}
    except Exception as e:  # noqa: BLE001
        log(f"(no docs/spec.md anchor: {short_err(e)})")
        return {}


def fmt_us(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def fmt_cos(v) -> str:
    return "-" if v is None else f"{v:.1e}"


def fmt_x(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def describe(shape) -> str:
    return (f"hidden {shape.hidden_size}, {shape.num_heads} heads, q_lora {shape.q_lora_rank}; "
            f"{tl.layer_weight_bytes(shape) / 1e6:.1f} MB of weights per layer")


def print_tables(args, out, peaks, v2, v3):
    rows = [r for r in out["rows"] if "error" not in r]
    fused_us = {(r["b"], f): r.get("fused", {}).get(f, {}).get("us") for r in rows
                for f in args.formats}
    log(f"\n## Decode layer ({describe(v2)}), {out['device']}: microseconds per layer "
        f"({args.layers} layers in one graph, s_k = {args.s_k}, page {args.page}; floors at the "
        f"read peak {peaks['read_GBps']:.0f} GB/s, {peaks['source']})\n")
    heads = (["b", "unfused eager", "unfused graph"] + [f"fused {f}" for f in args.formats]
             + ["floor bf16", "floor 8-bit"] + [f"graph / fused {f}" for f in args.formats]
             + ["floor / fused bf16", "nodes/layer unfused", "nodes/layer fused"])
    log("| " + " | ".join(heads) + " |")
    log("|" + " --- |" * len(heads))
    for r in rows:
        unf = r.get("unfused", {})
        nodes_f = r.get("fused", {}).get("bf16", {}).get("nodes_per_layer")
        cells = ([str(r["b"]), fmt_us(unf.get("eager_us")), fmt_us(unf.get("graph_us"))]
                 + [fmt_us(fused_us[(r["b"], f)]) for f in args.formats]
                 + [fmt_us(r["floor_us"]["bf16"]), fmt_us(r["floor_us"]["int8"])]
                 + [fmt_x(unf.get("graph_us"), fused_us[(r["b"], f)]) for f in args.formats]
                 + [fmt_x(r["floor_us"]["bf16"], fused_us[(r["b"], "bf16")]
                          if "bf16" in args.formats else None),
                    "-" if "nodes_per_layer" not in unf else f"{unf['nodes_per_layer']:.1f}",
                    "-" if nodes_f is None else f"{nodes_f:.2f}"])
        log("| " + " | ".join(cells) + " |")
    log("(graph / fused: the unfused graph's time over the fused one's, > 1 is faster; floor: "
        "(weights + b * s_k * bytes per token) / read peak)")
    spec = load_spec_rows()
    if spec:
        log(f"\n{SPEC_LABEL}, microseconds per layer:\n")
        log("| b | eager | one CUDA graph | floor bf16 | floor 8-bit |")
        log("| --- | --- | --- | --- | --- |")
        for b in sorted(spec):
            s = spec[b]
            log(f"| {b} | {s['us_eager']:.0f} | {s['us_graph']:.1f} | "
                f"{s['floor_us_at_read_peak']:.1f} | {s['floor_fp8_us']:.1f} |")
    if out["gemm_rows"]:
        log("\nSkinny GEMM alone, distinct weights per call (microseconds per GEMM, GB/s, % of the "
            "read peak): torch.matmul and kernelflow.linear (plain stream order)\n")
        log("| projection | b | torch us | torch GB/s | torch % read | kernelflow us | "
            "kernelflow GB/s | kernelflow % read | torch / kernelflow |")
        log("|" + " --- |" * 9)
        for g in out["gemm_rows"]:
            if "kf_us" in g:
                log(f"| {g['projection']} {g['shape'][0]}x{g['shape'][1]} | {g['b']} | "
                    f"{g['torch_us']:.2f} | {g['torch_GBps']:.0f} | "
                    f"{100 * g['torch_frac_read_peak']:.0f}% | {g['kf_us']:.2f} | "
                    f"{g['kf_GBps']:.0f} | {100 * g['kf_frac_read_peak']:.0f}% | "
                    f"{g['torch_us'] / g['kf_us']:.2f}x |")
    if out["v3_rows"]:
        log(f"\nQuery-compressed layer ({describe(v3)}), bf16 cache, microseconds per layer\n")
        log("| b | layers | fused bf16 | floor | floor / fused | unfused graph | "
            "check, one layer (cos dist) | drift over the layers (cos dist) |")
        log("|" + " --- |" * 8)
        for r in out["v3_rows"]:
            f = r.get("fused", {})
            log(f"| {r['b']} | {r['layers']} | {fmt_us(f.get('us'))} | {fmt_us(r['floor_us'])} | "
                f"{fmt_x(r['floor_us'], f.get('us'))} | "
                f"{fmt_us(r.get('unfused', {}).get('graph_us'))} | "
                f"{fmt_cos(f.get('check', {}).get('cos_dist_vs_torch'))} | "
                f"{fmt_cos(f.get('cos_dist_vs_torch'))} |")
    log("\nIssue 14's bounds (this run):")
    for (fmt, b), bound in TARGETS.items():
        got = fused_us.get((b, fmt))
        verdict = "not run" if got is None else ("met" if got <= bound else "NOT met")
        log(f"  fused {fmt} at b = {b}: <= {bound:.0f} us/layer: {fmt_us(got)} ({verdict})")
    small = [g for g in out["gemm_rows"] if "kf_us" in g and g["b"] <= GEMM_BOUND_MAX_B
             and g["projection"] in GEMM_BOUND_PROJECTIONS]
    if small:
        low = min(small, key=lambda g: g["kf_frac_read_peak"])
        ok = all(g["kf_frac_read_peak"] >= GEMM_MIN_FRAC_READ for g in small)
        log(f"  the projection GEMMs ([W_q; W_kv_a], W_o) at b <= {GEMM_BOUND_MAX_B} alone >= "
            f"{100 * GEMM_MIN_FRAC_READ:.0f}% of the read peak (kernelflow.linear, plain stream "
            f"order; W_UV, per head, is not a kernelflow.linear call): lowest "
            f"{100 * low['kf_frac_read_peak']:.0f}% ({low['projection']} b = {low['b']}) "
            f"({'met' if ok else 'NOT met'})")
    nodes = [r["fused"][f]["nodes_per_layer"] for r in rows for f in r.get("fused", {})
             if "nodes_per_layer" in r["fused"][f]]
    if nodes:
        log(f"  kernel nodes per layer <= {MAX_NODES_PER_LAYER}: at most {max(nodes):.2f} "
            f"({'met' if max(nodes) <= MAX_NODES_PER_LAYER else 'NOT met'})")
    print_check_summary(fused_runs(out))


def fused_runs(out) -> list:
    """(label, fused result) of every fused run of the V2-Lite and V3 rows."""
    runs = [(f"V2-Lite b = {r['b']} {f}", res) for r in out["rows"]
            for f, res in r.get("fused", {}).items()]
    return runs + [(f"V3 b = {r['b']} bf16", r["fused"]) for r in out["v3_rows"] if "fused" in r]


def worst(items: list) -> tuple:
    """The item whose first value (a cosine distance) is largest, NaN above everything."""
    return max(items, key=lambda it: math.inf if math.isnan(it[0]) else it[0])


def print_check_summary(runs: list):
    """The worst per-layer check and the worst drift over the fused runs."""
    checks = [(res["check"]["cos_dist_vs_torch"], label) for label, res in runs if "check" in res]
    if checks:
        dist, label = worst(checks)
        met = all(res["check"]["ok"] for _, res in runs if "check" in res)
        log(f"  the layer's output within {MAX_COS_DIST:.0e} cosine distance of the torch layer "
            f"(one layer, same input and cache format): worst {dist:.2e} ({label}) "
            f"({'met' if met else 'NOT met'})")
    drifts = [(res["cos_dist_vs_torch"], res["drift_layers"], label) for label, res in runs
              if "drift_layers" in res]
    if drifts:
        dist, n, label = worst(drifts)
        log(f"  drift over the graph's layers (information, no bound): worst {dist:.2e} over "
            f"{n} layers ({label})")


def free(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def save(args, out):
    if not args.json:
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1, default=plain)


def get_peaks(args, device) -> dict:
    """kernelflow.bench.decode's peaks: measured in this run, or --peaks-json, or
    --peaks-from-spec (docs/spec.md's); docs/spec.md's on the CPU."""
    if device.type == "cpu":
        return dict(peaks_mod.SPEC_PEAKS)
    try:
        from kernelflow.bench.decode import get_peaks as decode_peaks
    except Exception as e:  # noqa: BLE001
        log(f"(kernelflow.bench.decode not importable: {short_err(e)}; measuring the peaks here)")
        return dict(peaks_mod.SPEC_PEAKS) if args.peaks_from_spec else peaks_mod.measure_peaks()
    return decode_peaks(args)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        log("no CUDA device: nothing to benchmark (--device cpu runs the CPU smoke test)")
        return 1
    out = run(args)
    save(args, out)
    log(f"\n{out['failures']} failed checks or errors; {out['seconds']:.0f} s"
        + (f"; wrote {args.json}" if args.json else ""))
    if out.get("fused_missing"):
        log("(the fused rows need kernelflow.DecodeGraph)")
    return 1 if out["failures"] else 0


def run(args, peaks=None) -> dict:
    """Every section of the layer benchmark; returns the run as a dict ("failures" counts the
    failed checks and errors). peaks: the read peak to use, measured here when None."""
    t0 = time.time()
    device = torch.device(args.device)
    # cuBLAS may otherwise reduce split-K partials in bf16: the torch layer is the check's
    # reference, so it accumulates in fp32 like the fused layer.
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    out = {"device": "cpu", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "command": "python3 -m kernelflow.bench.layer " + " ".join(args.argv),
           "argv": args.argv, "versions": {
               "torch": torch.__version__, "torch_cuda": torch.version.cuda,
               "kernelflow": kf.__version__, "kernelflow_build": kf.build_info(),
               "python": platform.python_version()},
           "method": {
               "timing": "CUDA events around each graph replay / DecodeGraph launch / eager step, "
                         "median, after warm-ups, divided by the layer count",
               "floor": "(layer weight bytes + b * s_k * bytes_per_token) / read peak",
               "nodes_torch": "cuGraphGetNodes on torch's cudaGraph_t (keep_graph=True), else "
                              "torch.profiler kernels of one eager step",
               "nodes_fused": "DecodeGraph.kernel_nodes",
               "check": f"per layer, a fused row's 'check': a one-layer fused graph against the "
                        f"one-layer torch layer (layer 0, same input and cache format), cosine "
                        f"distance of the layer output < {MAX_COS_DIST}, error buffer clean",
               "drift": "a fused row's cos_dist_vs_torch, cache_rows_cos_dist and "
                        "cos_dist_vs_fused_bf16: the timed graph of drift_layers layers against "
                        "as many torch layers, whole output; information, no bound"},
           "rows": [], "gemm_rows": [], "v3_rows": []}
    l2_bytes = 0
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2_bytes = getattr(props, "L2_cache_size", 60 << 20)
        out.update({"device": props.name, "num_sms": props.multi_processor_count,
                    "l2_bytes": l2_bytes})
        out["versions"]["cuda_driver"] = cuda_driver_version()
    log(f"device: {out['device']}; torch {torch.__version__}; kernelflow {kf.__version__} "
        f"({kf.build_info()}) from {kf.__file__}; {out['date']}")
    log(f"command: {out['command']}")
    if not has_decode_graph():
        log(f"kernelflow {kf.__version__} has no DecodeGraph / LayerConfig (the fused layer is not "
            f"in this build): the fused rows are skipped")
        out["fused_missing"] = True
    peaks = peaks or get_peaks(args, device)
    out["peaks"] = peaks
    log(f"read peak used: {peaks['read_GBps']:.0f} GB/s ({peaks['source']})")

    v2, v3 = shapes_for(args)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    weights = [tl.make_layer_weights(v2, gen, device) for _ in range(args.layers)]
    wbytes = tl.layer_weight_bytes(v2)
    log(f"layer shape: {describe(v2)}; {args.layers} layers, "
        f"{args.layers * wbytes / 1e6:.0f} MB of weights in all")
    fails = bench_v2_lite(args, v2, weights, peaks, device, gen, out)
    del weights
    free(device)
    if not args.no_gemm and device.type == "cuda":
        fails += bench_gemm(args, v2, peaks, device, gen, l2_bytes, out)
    if args.v3_layers > 0:
        fails += bench_v3(args, v3, peaks, device, gen, out)
    print_tables(args, out, peaks, v2, v3)
    out["seconds"] = time.time() - t0
    out["failures"] = fails
    return out


if __name__ == "__main__":
    sys.exit(main())
