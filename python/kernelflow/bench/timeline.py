"""Where a decode call's time goes, block by block (GPU; a library built with -DKF_TIMELINE=ON).

    python3 -m kernelflow.bench.timeline --h-q 16 --batch 1 64 --s-k 4096 [--formats bf16 fp8_e4m3]
        [--workers N] [--raw] [--json OUT]
    python3 -m kernelflow.bench.timeline --layer --batch 1 64 [--layers 27] [--json OUT]
    python3 -m kernelflow.bench.timeline --from docs/results/timeline_h200.json --key KEY

In the timeline build (src/cuda/common/timeline.cuh) thread 0 of every decode and combine block
writes the global timer (ns) at a few events into a buffer whose device address the library
reads once per process from KF_TIMELINE_BUFFER. This module allocates that buffer, sets the
variable before its first decode, and for each shape runs the decode benchmark's calls (decode +
combine, the caches rotated beyond L2: kernelflow.bench.decode.Problem) as one CUDA graph of C
calls: it times the graph, zeroes the buffer, replays once more and reads the stamps, which are
then the replay's last call's. Per event it prints how many blocks reached it and the minimum,
median and maximum over them, in microseconds from that call's first decode block entry, beside
the time per call of the graph: what lies between the last combine block's exit and the next
call is the launch of the next decode.

The events, in kernel order: entry (first instruction), waited (past the dependency wait and,
for a decode block, the metadata check), pieces (the first round's piece list), first_tile (the
first tile of the first piece landed; the sm_90a 16-bit kernel: its first scores done),
first_epilogue, last_epilogue (the epilogue of the worker's first and last piece begins), exit;
and per decode block the number of pieces it ran. Combine blocks stamp entry, waited and exit.
With --layer the fused DeepSeek-V2-Lite layer graph runs instead, and every launch of its last
layer is read (the projections, the query absorption with the prologue, the decode, the combine,
the output absorption and W_o; a GEMM block stamps its entry, its wait, its first stage, its
epilogue, its tile's split partials in place (partials), its share of the output stored (stored)
and its exit), from that layer's first entry, beside the time per layer; then, per launch, its
link (from the previous launch's last block exit to its median wait) and the time from that wait
to its last block's exit, with a GEMM's epilogue and split sums (layer_steps).
In any other build the stamps stay zero and this module says so. --from prints the tables of a
stored run (docs/results/timeline_h200.json with --key) without a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

# The buffer's layout (src/cuda/common/timeline.cuh): uint64 [kernels][blocks][events].
KERNELS = ("decode", "combine", "gemm_proj", "q_absorb", "gemm_uv", "gemm_o", "gemm_q_b",
           "gemm_other")
MAX_BLOCKS = 16384
EVENTS_PER_BLOCK = 8
EVENTS = ("entry", "waited", "pieces", "first_tile", "first_epilogue", "last_epilogue", "exit")
PIECES_SLOT = 7  # a decode block's piece count | its SM << 32, not a time
BUFFER_WORDS = len(KERNELS) * MAX_BLOCKS * EVENTS_PER_BLOCK
# A GEMM block (the layer's launches, kf_linear) stamps two steps of its epilogue in slots a
# decode block uses for other events: its tile's split partials in place ("partials", the piece
# list's slot) and its share of Y stored ("stored", the last epilogue's slot; timeline.cuh's
# kTlGemmPartials and kTlGemmStored). Listed in the order they happen.
GEMM_EVENTS = (("entry", 0), ("waited", 1), ("first_tile", 3), ("first_epilogue", 4),
               ("partials", 2), ("stored", 5), ("exit", 6))


def kernel_events(kernel: str) -> tuple:
    """(name, slot) of the events a kernel's blocks stamp, in the order they happen."""
    if kernel in ("decode", "combine"):
        return tuple((name, slot) for slot, name in enumerate(EVENTS))
    return GEMM_EVENTS


def spread(values: list) -> dict:
    """n, min, median and max of values (None for an empty list)."""
    if not values:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {"n": len(values), "min": min(values), "median": statistics.median(values),
            "max": max(values)}


def summarize(words, origin: str = "decode") -> dict:
    """The stamps of one call (a flat sequence of BUFFER_WORDS uint64 words) as, per kernel and
    event, the spread over the blocks that reached it, in microseconds from the first decode
    block's entry (origin "decode") or the first entry of any kernel (origin "first": a layer
    graph's last layer from its first projection); decode blocks' piece counts as
    "pieces_per_block". Kernels without stamps are left out. None when no decode block stamped
    its entry (not a timeline build, or nothing ran)."""
    def slot(kernel, block, event):
        return int(words[(kernel * MAX_BLOCKS + block) * EVENTS_PER_BLOCK + event])

    def entries(k):
        return [slot(k, b, 0) for b in range(MAX_BLOCKS) if slot(k, b, 0) != 0]

    if not entries(0):
        return None
    t0 = min(entries(0)) if origin == "decode" else min(
        min(e) for e in (entries(k) for k in range(len(KERNELS))) if e)
    out = {}
    for k, name in enumerate(KERNELS):
        per_event = {}
        for ev, e in kernel_events(name):
            vals = [(slot(k, b, e) - t0) / 1e3 for b in range(MAX_BLOCKS) if slot(k, b, e) >= t0]
            if vals:
                per_event[ev] = spread(vals)
        if per_event:
            out[name] = per_event
    out["pieces_per_block"] = spread([slot(0, b, PIECES_SLOT) & 0xFFFFFFFF
                                      for b in range(MAX_BLOCKS)
                                      if slot(0, b, 0) != 0 and slot(0, b, PIECES_SLOT) != 0])
    return out


def decode_blocks(words) -> list:
    """Each decode block that stamped its entry, as [block, SM, piece count, then every event in
    EVENTS order in us from the first decode entry (None where not reached)]: the raw rows
    behind summarize, for questions the spreads do not answer (which blocks end last, on which
    SMs, with how many pieces). Blocks without work have no SM and 0 pieces."""
    def slot(block, event):
        return int(words[block * EVENTS_PER_BLOCK + event])

    live = [b for b in range(MAX_BLOCKS) if slot(b, 0) != 0]
    if not live:
        return []
    t0 = min(slot(b, 0) for b in live)
    rows = []
    for b in live:
        tag = slot(b, PIECES_SLOT)
        rows.append([b, (tag >> 32) if tag else None, tag & 0xFFFFFFFF]
                    + [round((slot(b, e) - t0) / 1e3, 3) if slot(b, e) >= t0 else None
                       for e in range(len(EVENTS))])
    return rows


def format_summary(title: str, s: dict, us_per_call: float) -> str:
    lines = [f"## {title}: {us_per_call:.2f} us per call (graph)",
             "| kernel | event | blocks | min us | median us | max us |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in [k for k in KERNELS if k in s]:
        for ev, _ in kernel_events(name):
            r = s.get(name, {}).get(ev)
            if r:
                lines.append(f"| {name} | {ev} | {r['n']} | {r['min']:.2f} | {r['median']:.2f} | "
                             f"{r['max']:.2f} |")
    p = s.get("pieces_per_block")  # not kept in a compacted file
    if p and p["n"]:
        lines.append(f"pieces per decode block with work: min {p['min']}, median "
                     f"{p['median']}, max {p['max']} ({p['n']} blocks)")
    return "\n".join(lines)


# The fused layer's launches in the order one layer runs them (gemm_q_b only where the model
# compresses the query); the first one follows the previous layer's last.
LAYER_CHAIN = ("gemm_proj", "gemm_q_b", "q_absorb", "decode", "combine", "gemm_uv", "gemm_o")


def layer_steps(s: dict, us_per_layer: float) -> list:
    """Per launch of a layer's summary (summarize with origin "first"), in LAYER_CHAIN order:
    link, the gap from the previous launch's last block exit to this launch's median wait (for
    the layer's first launch, from the previous layer's last launch, placed one layer period
    earlier); wait_to_last_exit, from that wait to this launch's last block exit; entry_lead,
    how long before the previous launch's last block exit this launch's median block entered
    (> 0: its blocks were resident early, requesting what they may before their wait; < 0: they
    entered only after, as when they cannot share the previous kernel's SMs); and for a GEMM
    epilogue (first epilogue to Y stored, medians) and sums (split partials in place to Y stored,
    medians) where its blocks stamped them. Launches without a wait or an exit are left out."""
    chain = [k for k in LAYER_CHAIN if "waited" in s.get(k, {}) and "exit" in s.get(k, {})]
    rows = []
    for i, k in enumerate(chain):
        ev = s[k]
        prev_exit = (s[chain[i - 1]]["exit"]["max"] if i > 0
                     else s[chain[-1]]["exit"]["max"] - us_per_layer)
        waited = ev["waited"]["median"]
        row = {"kernel": k, "link": round(waited - prev_exit, 2),
               "wait_to_last_exit": round(ev["exit"]["max"] - waited, 2)}
        if "entry" in ev:
            row["entry_lead"] = round(prev_exit - ev["entry"]["median"], 2)
        if "first_epilogue" in ev and "stored" in ev:
            row["epilogue"] = round(ev["stored"]["median"] - ev["first_epilogue"]["median"], 2)
        if "partials" in ev and "stored" in ev:
            row["sums"] = round(ev["stored"]["median"] - ev["partials"]["median"], 2)
        rows.append(row)
    return rows


def format_layer_steps(steps: list) -> str:
    lines = ["| launch | link us | wait to last exit us | entry lead us | "
             "first epilogue to stored us | partials to stored us |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in steps:
        cells = [r["kernel"], f"{r['link']:.2f}", f"{r['wait_to_last_exit']:.2f}",
                 f"{r['entry_lead']:.2f}" if "entry_lead" in r else "-",
                 f"{r['epilogue']:.2f}" if "epilogue" in r else "-",
                 f"{r['sums']:.2f}" if "sums" in r else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_stored(path: str, key: str) -> int:
    """--from: the summaries (and, for a layer run, its steps) of a stored run, no GPU needed."""
    with open(path) as f:
        doc = json.load(f)
    run = doc.get(key) if key else doc
    if not run or "rows" not in run:
        raise SystemExit(f"{path}: no run {key!r} (keys: {', '.join(sorted(doc))})")
    for r in run["rows"]:
        per = r.get("us_per_layer", r.get("us_per_call"))
        title = " ".join(f"{k} {r[k]}" for k in ("model", "format", "h_q", "b", "s_k") if k in r)
        print(format_summary(title, r["events"], per), flush=True)
        if "us_per_layer" in r:
            print(format_layer_steps(layer_steps(r["events"], r["us_per_layer"])), flush=True)
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kernelflow.bench.timeline",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--h-q", type=int, nargs="+", default=[16])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--s-k", type=int, nargs="+", default=[4096])
    ap.add_argument("--s-q", type=int, default=1)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--formats", nargs="+", default=["bf16"],
                    choices=["bf16", "fp8_e4m3", "int8"])
    ap.add_argument("--workers", type=int, default=None,
                    help="the schedule's worker count (default: the library's for the batch)")
    ap.add_argument("--replays", type=int, default=20, help="graph replays timed per shape")
    ap.add_argument("--json", default=None, help="write the summaries here")
    ap.add_argument("--raw", action="store_true",
                    help="also write each decode block's SM, pieces and events (decode_blocks)")
    ap.add_argument("--layer", action="store_true",
                    help="the fused DeepSeek-V2-Lite layer graph (kernelflow.DecodeGraph) of "
                         "--layers layers instead of decode calls: every launch of its last layer, "
                         "from that layer's first entry")
    ap.add_argument("--layers", type=int, default=27, help="--layer: layers in the graph")
    ap.add_argument("--from", dest="stored", default=None, metavar="JSON",
                    help="print a stored run's tables (a --json output, or a file of runs by "
                         "key with --key) instead of running; no GPU needed")
    ap.add_argument("--key", default=None, help="--from: the run's key in the file")
    return ap.parse_args(argv)


NO_STAMPS = ("no stamps: the kernelflow on the path is not a KF_TIMELINE build "
             "(cmake -DKF_TIMELINE=ON)")


def read_stamps(buf, origin: str = "decode"):
    """The buffer's words and their summary (summarize); exits when nothing was stamped."""
    words = buf.cpu().numpy().view("uint64")
    s = summarize(words, origin)
    if s is None:
        raise SystemExit(NO_STAMPS)
    return words, s


def decode_rows(args, buf, torch, kf) -> list:
    """Per cache format and shape, decode + combine calls over rotated caches (the decode
    benchmark's Problem and worker count) as one CUDA graph: timed, then replayed once more with
    the buffer zeroed, whose stamps are the replay's last call's."""
    from kernelflow.bench import decode as dec

    rows = []
    for fmt in args.formats:
        for h_q in args.h_q:
            for b in args.batch:
                for s_k in args.s_k:
                    p = dec.Problem(h_q, b, s_k, args.page, torch.bfloat16, 4 * 60e6, 64, 0,
                                    s_q=args.s_q)
                    r = dec.KernelFlowRunner(kf, args.workers)
                    r.prepare(p, kv_format=fmt)
                    kv = kf.convert_cache(p.kv, kv_format=fmt) if fmt != "bf16" else p.kv
                    call = r.format_call(p, kv, fmt if fmt != "bf16" else None)
                    unit = lambda: [call(i) for i in range(p.copies)]  # noqa: E731
                    t = dec.time_unit(unit, p.copies, args.replays)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        unit()
                    graph.replay()
                    torch.cuda.synchronize()
                    buf.zero_()
                    graph.replay()
                    torch.cuda.synchronize()
                    words, s = read_stamps(buf)
                    title = (f"{fmt} h_q {h_q} s_q {args.s_q} b {b} s_k {s_k} page {args.page}, "
                             f"{r.num_workers} workers, {p.copies} calls per graph")
                    print(format_summary(title, s, t["us"]), flush=True)
                    rows.append({"format": fmt, "h_q": h_q, "s_q": args.s_q, "b": b, "s_k": s_k,
                                 "page": args.page, "workers": r.num_workers,
                                 "calls_per_graph": p.copies, "us_per_call": t["us"],
                                 "events": s})
                    if args.raw:
                        rows[-1]["decode_blocks"] = {
                            "columns": ["block", "sm", "n_pieces", *EVENTS],
                            "rows": decode_blocks(words)}
                    del graph, kv
                    p.free()
    return rows


def layer_rows(args, buf, torch) -> list:
    """--layer: per batch and cache format, the fused layer graph of args.layers DeepSeek-V2-Lite
    layers (the layer benchmark's weights, caches and step: kernelflow.bench.layer) timed, then
    one more launch whose stamps are read: its last layer's launches."""
    from kernelflow.bench import decode as dec
    from kernelflow.bench import layer as bl

    device = torch.device("cuda")
    shape = bl.tl.LayerShape.deepseek_v2_lite()
    gen = torch.Generator(device=device).manual_seed(0)
    weights = [bl.tl.make_layer_weights(shape, gen, device) for _ in range(args.layers)]
    stream = torch.cuda.current_stream()
    rows = []
    for b in args.batch:
        for s_k in args.s_k:
            step = bl.tl.make_step(shape, [s_k] * b, args.layers, gen, device,
                                   page_size=args.page)
            for fmt in args.formats:
                caches = (step.caches if fmt == "bf16"
                          else [bl.in_format(c, fmt) for c in step.caches])
                output = torch.empty_like(step.hidden)
                errors = bl.kf.new_error_buffer(step.hidden)
                with bl.fused_graph(shape, weights, caches, step, fmt, output, errors) as graph:
                    launch = lambda: graph.launch(stream=stream)  # noqa: E731
                    t = dec.time_unit(launch, args.layers, args.replays, use_graph=False)
                    buf.zero_()
                    launch()
                    torch.cuda.synchronize()
                    _, s = read_stamps(buf, origin="first")
                title = (f"V2-Lite layer {fmt} b {b} s_k {s_k} page {args.page}, "
                         f"{args.layers} layers (the last one's launches, us per layer)")
                print(format_summary(title, s, t["us"]), flush=True)
                print(format_layer_steps(layer_steps(s, t["us"])), flush=True)
                rows.append({"model": "v2_lite", "format": fmt, "b": b, "s_k": s_k,
                             "page": args.page, "layers": args.layers, "us_per_layer": t["us"],
                             "events": s})
                del caches
            del step
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.stored:
        return print_stored(args.stored, args.key)
    import torch

    # The library reads the address once, at its first call: set it before any.
    buf = torch.zeros(BUFFER_WORDS, dtype=torch.int64, device="cuda")
    os.environ["KF_TIMELINE_BUFFER"] = f"{buf.data_ptr():x}"
    import kernelflow as kf

    rows = layer_rows(args, buf, torch) if args.layer else decode_rows(args, buf, torch, kf)
    if args.json:
        what = ("per-block event stamps of the last layer of a fused layer graph"
                if args.layer else "per-block event stamps of one decode + combine call")
        unit = ("us from the last layer's first launch entry" if args.layer
                else "us from the call's first decode block entry")
        doc = {"what": what + " (python -m kernelflow.bench.timeline)",
               "gpu": torch.cuda.get_device_name(0),
               "date": datetime.date.today().isoformat(), "host": platform.node(),
               "command": "python3 -m kernelflow.bench.timeline " + " ".join(
                   sys.argv[1:] if argv is None else argv),
               "unit": unit, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
