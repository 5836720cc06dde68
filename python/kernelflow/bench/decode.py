"""MLA decode benchmark: kernelflow against a Triton and a PyTorch baseline (and FlashMLA).

For each shape of the grid (s_k, then s_q, then h_q, then b; --s-q takes a list, default 1), bf16,
page 64, every request at length s_k:
  - the cache is rotated: C copies (distinct, scattered pages of one pool, each with its own block
    table and q) so that C * cache bytes >= --rotate-mb (default 4x L2), C at least 2 and at
    most --max-copies (64); one CUDA graph captures C calls, one per copy, and is replayed;
    time per call = median replay time (CUDA events) / C;
  - a "call" is the decode and its combine (kernelflow.mla_decode, or Triton stage 1 + stage 2);
    kernelflow's metadata is computed once per step and timed on its own (same method);
  - s_q > 1 (speculative decoding) is causal: query j of s_q sees the first s_k - s_q + 1 + j
    positions. kernelflow and FlashMLA run it; the Triton, torch and FlashInfer baselines decode
    s_q = 1 only and are left out of those shapes (a line says so);
  - each kernel's output on copy 0 is checked once, before timing, against the float64 reference
    kernelflow.reference (worst-row cosine distance < 1e-5, lse within 1e-4: docs/spec.md
    section 4) and the result printed;
  - GB/s = (b*s_k*1152 + q bytes + o bytes) / time (the cache read once, whatever s_q);
    TFLOPS = 2*b*h_q*seen*(576+512) / time, seen = the positions the s_q query rows see
    (s_k at s_q = 1); both as fractions of the peaks measured by peaks.py in this run (or
    docs/spec.md's with --peaks-from-spec);
  - FlashMLA runs if `import flash_mla` works; otherwise docs/spec.md's H200 figures are shown at
    s_q = 1, labelled "FlashMLA (docs/spec.md, not this run)"
    (anchors/h200-flashmla-torch-2026-11-30.json in this package).
Rows (JSON and the printed table) carry s_q.

    python3 -m kernelflow.bench.decode --quick --json $OUT/bench.json
    python3 -m kernelflow.bench.decode --h-q 16 --batch 64 128 --s-k 4096 --s-q 1 2
    python3 -m kernelflow.bench.decode --baselines-only --quick      # no kernelflow

--flashmla-matrix runs FlashMLA's own test matrix (b 128, s_k 4096 and 16384, h_q 16/32/64/128,
s_q 1 and 2, causal) with kernelflow and FlashMLA alone, and prints after the table a matrix of
FlashMLA's time / kernelflow's per cell (rows s_q, columns (h_q, s_k); > 1: kernelflow faster) with
the count of cells where kernelflow is not slower; the JSON gets it as "flashmla_matrix". Without
flash_mla it says so and gives no ratio.

    python3 -m kernelflow.bench.decode --flashmla-matrix --json $OUT/matrix.json

8-bit caches (--formats bf16 fp8_e4m3 int8, kernelflow only, one --s-q value): each problem's bf16
cache is converted with kernelflow.convert_cache and every format is timed in the same run at equal
shapes; bytes = b*s_k*644 for the 8-bit formats (+ q and o); the table gives each format's time,
GB/s, fraction of the read peak and speedup over bf16; each 8-bit output is checked against the
float64 reference on the unquantized cache (whole-output cosine distance, docs/spec.md section 4:
3e-3 fp8, 5e-4 int8).
--sk-sweep runs s_k 1K..64K at h_q = 16, b = 64 (with --formats, or all three formats).

    python3 -m kernelflow.bench.decode --formats bf16 fp8_e4m3 int8 --h-q 16 --batch 64 128 --s-k 4096
    python3 -m kernelflow.bench.decode --sk-sweep

`python -m kernelflow bench` runs this module's grid, format and sweep modes in one process
(run_grid, run_formats) with the peaks measured once.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

from kernelflow import reference as kf_ref
from kernelflow.bench import peaks as peaks_mod
from kernelflow.bench.baselines import torch_mla
from kernelflow.bench.results import plain
from kernelflow.bench.timing import event_times_ms

try:
    from kernelflow.bench.baselines import triton_mla
except ImportError:  # no Triton here: the Triton baseline is left out (make_runners says so)
    triton_mla = None

SCALE = 0.114721  # DeepSeek-V2-Lite softmax_scale (docs/spec.md section 1)
DEVICE = "cuda"
BYTES_PER_TOKEN = 1152
FORMAT_BYTES = {"bf16": 1152, "fp8_e4m3": 644, "int8": 644}
ANCHOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "anchors",
                      "h200-flashmla-torch-2026-11-30.json")


# The grid's shape options and their defaults (None in the parser, so that --flashmla-matrix can
# tell which were given).
GRID_DEFAULTS = {"h_q": [16, 128], "batch": [1, 8, 16, 32, 64, 128], "s_k": [4096, 16384],
                 "s_q": [1]}
# FlashMLA's own test matrix (FlashMLA's tests/test_flash_mla.py: batch 128, h_q 16/32/64/128 for
# tensor parallelism 8/4/2/1, one or two query tokens per step, causal) at s_k 4096 and 16384.
FLASHMLA_MATRIX = {"h_q": [16, 32, 64, 128], "batch": [128], "s_k": [4096, 16384], "s_q": [1, 2]}


def option(dest: str) -> str:
    """The command-line spelling of an argparse dest ("s_q" -> "--s-q")."""
    return "--" + dest.replace("_", "-")


def apply_flashmla_matrix(ap, args) -> None:
    """--flashmla-matrix: FlashMLA's matrix as the grid, kernelflow and FlashMLA alone. The options
    it sets, and the modes it cannot run with, are refused when given beside it."""
    clash = [option(k) for k in FLASHMLA_MATRIX if getattr(args, k) is not None]
    clash += [option(k) for k in ("quick", "formats", "sk_sweep", "baselines_only", "no_flashmla")
              if getattr(args, k)]
    if clash:
        ap.error(f"--flashmla-matrix sets the grid to FlashMLA's matrix (kernelflow beside "
                 f"FlashMLA): leave out {' '.join(clash)}")
    for k, v in FLASHMLA_MATRIX.items():
        setattr(args, k, list(v))
    args.no_triton = args.no_torch = args.no_flashinfer = True


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kernelflow.bench.decode",
                                 description="MLA decode benchmark (see the module docstring)")
    ap.add_argument("--h-q", type=int, nargs="+", default=None,
                    help=f"query heads (default {' '.join(map(str, GRID_DEFAULTS['h_q']))})")
    ap.add_argument("--batch", type=int, nargs="+", default=None,
                    help=f"requests (default {' '.join(map(str, GRID_DEFAULTS['batch']))})")
    ap.add_argument("--s-k", type=int, nargs="+", default=None,
                    help=f"cached tokens per request (default "
                         f"{' '.join(map(str, GRID_DEFAULTS['s_k']))})")
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--quick", action="store_true",
                    help="h_q 16,128; b 1,32,128; s_k 4096; fewer replays, quick Triton tuning")
    ap.add_argument("--baselines-only", action="store_true", help="skip kernelflow")
    ap.add_argument("--no-check", action="store_true",
                    help="time only, no check against the float64 reference (for A/B timing of "
                         "two builds whose correctness the GPU tests establish)")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-flashmla", action="store_true")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--peaks-from-spec", action="store_true",
                    help="use docs/spec.md's H200 peaks instead of measuring them")
    ap.add_argument("--peaks-json", help="use the peaks that a `peaks.py --json` run wrote")
    ap.add_argument("--tune", choices=["quick", "full"], default=None,
                    help="Triton search space (default: full, quick with --quick)")
    ap.add_argument("--replays", type=int, default=None, help="graph replays timed (default 30)")
    ap.add_argument("--rotate-mb", type=float, default=None,
                    help="cache bytes touched per graph replay (default 4x L2)")
    ap.add_argument("--max-copies", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None,
                    help="kernelflow's worker count for every configuration (default: "
                    "kernelflow.default_num_workers of the device, shape, format and batch)")
    ap.add_argument("--json", help="write full results here (e.g. $OUT/bench.json)")
    ap.add_argument("--formats", nargs="+", choices=list(FORMAT_BYTES), default=None,
                    help="kernelflow only: time these cache formats side by side (8-bit speedups)")
    ap.add_argument("--s-q", type=int, nargs="+", default=None, choices=[1, 2, 3, 4],
                    help="query tokens per request, causal above 1 (speculative decoding); the "
                         "grid runs each value (default 1); kernelflow and FlashMLA run s_q > 1, "
                         "the Triton, torch and FlashInfer baselines s_q = 1 only; with --formats "
                         "one value")
    ap.add_argument("--flashmla-matrix", action="store_true",
                    help="FlashMLA's test matrix, kernelflow beside FlashMLA: --batch 128 --s-k "
                         "4096 16384 --h-q 16 32 64 128 --s-q 1 2 without the Triton, torch and "
                         "FlashInfer baselines; prints the FlashMLA / kernelflow time ratio of "
                         "each cell after the table (and writes it to --json)")
    ap.add_argument("--sk-sweep", action="store_true",
                    help="s_k 1K..64K at h_q 16, b 64, over --formats (default all three)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.flashmla_matrix:
        apply_flashmla_matrix(ap, args)
    if args.sk_sweep:
        args.h_q, args.batch = [16], [64]
        args.s_k = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
        args.formats = args.formats or list(FORMAT_BYTES)
    if args.quick:
        args.h_q, args.batch, args.s_k = [16, 128], [1, 32, 128], [4096]
    for k, v in GRID_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, list(v))
    if args.workers is not None and args.workers < 1:
        ap.error(f"--workers: at least 1 (got {args.workers})")
    if args.max_copies < 1:
        ap.error(f"--max-copies: at least 1 cache copy (got {args.max_copies})")
    if args.formats and len(args.s_q) != 1:
        ap.error(f"--s-q: --formats and --sk-sweep take one value (got "
                 f"{' '.join(map(str, args.s_q))})")
    if args.tune is None:
        args.tune = "quick" if args.quick else "full"
    if args.replays is None:
        args.replays = 10 if args.quick else 30
    return args


def log(msg: str = ""):
    print(msg, flush=True)


def short_err(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:200] if s else ''}"


# ---- timing ------------------------------------------------------------------------------------

def time_unit(unit, calls_per_unit: int, replays: int, use_graph: bool = True) -> dict:
    """Median (and min) time per call of `unit` (a callable doing calls_per_unit calls), as a
    replayed CUDA graph; eager event timing if capture fails.

    triton.testing.do_bench_cudagraph does the same measurement (one graph, CUDA events, median)
    but unrolls the callable into the graph until a replay lasts `rep` ms: with `unit` already
    unrolled over the C cache copies that rotate the cache beyond L2, that is thousands of nodes
    per capture for the short shapes, it fixes the replay count at 10, and a callable that cannot
    be captured (a baseline that synchronizes) raises instead of falling back to eager timing.
    So one graph of C calls is replayed here, `replays` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        unit()  # warm-up (compiles, cuBLAS handles) off the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    mode = "graph"
    graph = None
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                unit()
            graph.replay()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            log(f"    (graph capture failed, eager timing: {short_err(e)})")
            graph = None
            torch.cuda.synchronize()
    if graph is None:
        mode = "eager"
    run = graph.replay if graph is not None else unit
    run()
    ms = [t / calls_per_unit for t in event_times_ms(run, replays)]
    del graph
    return {"us": statistics.median(ms) * 1e3, "us_min": min(ms) * 1e3, "timing": mode}


def fast_time_ms(unit, calls_per_unit: int) -> float:
    """Cheap timing for the Triton search: graph, 3 replays, best."""
    return time_unit(unit, calls_per_unit, replays=3)["us_min"] / 1e3


# ---- data --------------------------------------------------------------------------------------

class Problem:
    def __init__(self, h_q, b, s_k, page, dtype, rotate_bytes, max_copies, seed, s_q=1):
        self.h_q, self.b, self.s_k, self.page, self.dtype, self.s_q = h_q, b, s_k, page, dtype, s_q
        dev = torch.device(DEVICE)
        pages_per_seq = math.ceil(s_k / page)
        self.cache_bytes = b * s_k * BYTES_PER_TOKEN
        self.copies = int(min(max_copies, max(2, math.ceil(rotate_bytes / self.cache_bytes))))
        num_pages = self.copies * b * pages_per_seq
        g = torch.Generator(device=dev).manual_seed(seed)
        self.kv = torch.randn(num_pages, page, 576, device=dev, dtype=dtype, generator=g)
        perm = torch.randperm(num_pages, device=dev, generator=g).to(torch.int32)
        self.block_tables = perm.view(self.copies, b, pages_per_seq).contiguous()
        self.qs = torch.randn(self.copies, b, s_q, h_q, 576, device=dev, dtype=dtype, generator=g)
        self.seqlens = torch.full((b,), s_k, dtype=torch.int32, device=dev)
        q_bytes = b * s_q * h_q * 576 * self.kv.element_size()
        o_bytes = b * s_q * h_q * 512 * self.kv.element_size()
        self.bytes = self.cache_bytes + q_bytes + o_bytes
        seen = sum(s_k - s_q + 1 + i for i in range(s_q))  # positions the s_q queries see (causal)
        self.flops = 2 * b * h_q * seen * (576 + 512)
        self._ref = None

    def ref(self):
        if self._ref is None:
            self._ref = torch_mla.reference(self.qs[0], self.kv, self.block_tables[0],
                                            self.seqlens, SCALE)
        return self._ref

    def free(self):
        self.kv = self.qs = self.block_tables = self._ref = None


# ---- kernels -------------------------------------------------------------------------------------

class Runner:
    """A kernel of the grid: prepare(p) for a problem, check(p) -> check dict, unit(p) -> a
    callable doing p.copies calls, optionally info() -> dict. multi_token: it decodes s_q > 1
    (causal); kept: the attributes its constructor sets, which release() leaves."""

    name = ""
    multi_token = False
    kept = ()

    def release(self):
        """Drop what prepare() made for the last problem: its tensors (views of the cache
        among them) would otherwise hold that problem's memory while the next one is made."""
        for k in [k for k in vars(self) if k not in self.kept]:
            delattr(self, k)


def split_by_s_q(runners: list, s_q: int) -> tuple:
    """(the runners that decode s_q query tokens per request, the names of those left out: the
    baselines that cover s_q = 1 only)."""
    run = [r for r in runners if s_q == 1 or r.multi_token]
    return run, [r.name for r in runners if r not in run]


class KernelFlowRunner(Runner):
    name = "kernelflow"
    multi_token = True
    kept = ("kf", "workers")

    def __init__(self, kf, workers=None):
        self.kf = kf
        self.workers = workers  # --workers: the schedule's worker count instead of the default

    def prepare(self, p: Problem, kv_format: str = "bf16"):
        """Worker count, schedule and workspace for decodes over a cache of kv_format."""
        kf = self.kf
        dev_index = torch.cuda.current_device()
        self.num_workers = self.workers
        if self.num_workers is None:
            try:
                self.num_workers = int(kf.default_num_workers(dev_index, p.h_q, p.s_q, kv_format,
                                                              batch=p.b))
            except Exception as e:  # noqa: BLE001
                log(f"    kernelflow.default_num_workers failed ({short_err(e)}); using the default")
        self.md = kf.get_mla_metadata(p.seqlens, p.h_q, s_q=p.s_q, num_workers=self.num_workers,
                                      kv_format=kv_format)
        self.ws = None
        if self.num_workers is not None:
            try:
                n = int(kf.workspace_size(p.b, p.h_q, p.s_q, self.num_workers))
                self.ws = torch.empty(max(n, 1), dtype=torch.uint8, device=DEVICE)
            except Exception as e:  # noqa: BLE001
                log(f"    kernelflow.workspace_size failed ({short_err(e)}); no workspace")
        self.out = torch.empty(p.b, p.s_q, p.h_q, 512, dtype=p.dtype, device=DEVICE)
        self.lse = torch.empty(p.b, p.h_q, p.s_q, dtype=torch.float32, device=DEVICE)

    def call(self, p: Problem, i: int):
        return self.format_call(p, p.kv, None)(i)

    def format_call(self, p: Problem, kv, kv_format_code):
        """call(i): the decode of cache copy i over `kv`, a cache in the format prepare() was
        given (kv_format_code: None for the 16-bit cache, else the format's name)."""
        def call(i):
            kw = {"out": self.out, "lse": self.lse}
            if self.ws is not None:
                kw["workspace"] = self.ws
            return self.kf.mla_decode(p.qs[i], kv, p.block_tables[i], p.seqlens, self.md, SCALE,
                                      kv_format=kv_format_code, **kw)
        return call

    def check(self, p: Problem):
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))
        self.call(p, 0)
        torch.cuda.synchronize()
        return torch_mla.check(self.out, self.lse, *p.ref())

    def unit(self, p: Problem):
        return lambda: [self.call(p, i) for i in range(p.copies)]

    def metadata_unit(self, p: Problem, n: int = 16):
        return (lambda: [self.kf.get_mla_metadata(p.seqlens, p.h_q, s_q=p.s_q,
                                                   num_workers=self.num_workers)
                         for _ in range(n)]), n


class TritonRunner(Runner):
    name = "triton"
    kept = ("tune_level", "num_sms")

    def __init__(self, tune_level: str, num_sms: int):
        self.tune_level, self.num_sms = tune_level, num_sms

    def prepare(self, p: Problem):
        self.out = torch.empty(p.b, 1, p.h_q, 512, dtype=p.dtype, device=DEVICE)
        self.lse = torch.empty(p.b, p.h_q, 1, dtype=torch.float32, device=DEVICE)
        self.scratch = triton_mla.Scratch(p.b, p.h_q, 128, DEVICE)

        def run_for(cfg):
            return lambda: [triton_mla.mla_decode(p.qs[i], p.kv, p.block_tables[i], p.seqlens,
                                                  SCALE, cfg, self.out, self.lse, self.scratch)
                            for i in range(p.copies)]

        t0 = time.time()
        self.config, self.tried = triton_mla.autotune(
            run_for, p.b, p.h_q, p.s_k, self.num_sms,
            lambda unit: fast_time_ms(unit, p.copies), level=self.tune_level, log=log)
        ok = [t for t in self.tried if t[1] is not None]
        log(f"    triton tuned over {len(ok)} configs ({len(self.tried) - len(ok)} skipped) "
            f"in {time.time() - t0:.1f}s: best {self.config.short()}")
        self._run_for = run_for

    def check(self, p: Problem):
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))
        triton_mla.mla_decode(p.qs[0], p.kv, p.block_tables[0], p.seqlens, SCALE, self.config,
                              self.out, self.lse, self.scratch)
        torch.cuda.synchronize()
        return torch_mla.check(self.out, self.lse, *p.ref())

    def unit(self, p: Problem):
        return self._run_for(self.config)

    def info(self):
        return {"config": self.config.short(),
                "tried": [(c.short(), ms) for c, ms, _ in self.tried]}


class TorchRunner(Runner):
    name = "torch"

    def prepare(self, p: Problem):
        pass

    def check(self, p: Problem):
        o, l = torch_mla.mla_decode_torch(p.qs[0], p.kv, p.block_tables[0], p.seqlens, SCALE)
        torch.cuda.synchronize()
        return torch_mla.check(o, l, *p.ref())

    def unit(self, p: Problem):
        return lambda: [torch_mla.mla_decode_torch(p.qs[i], p.kv, p.block_tables[i], p.seqlens,
                                                   SCALE) for i in range(p.copies)]


class FlashMLARunner(Runner):
    """flash_mla.flash_mla_with_kvcache over the same paged cache, seen as FlashMLA's
    [pages, page, h_kv, 576] with one KV head; q [b, s_q, h_q, 576], causal. FlashMLA schedules
    s_q * h_q // h_kv query rows per KV head (its get_mla_metadata's num_heads_per_head_k)."""

    name = "flashmla"
    multi_token = True
    kept = ("fm",)
    H_KV = 1

    def __init__(self, fm):
        self.fm = fm

    def prepare(self, p: Problem):
        self.md, self.splits = self.fm.get_mla_metadata(p.seqlens, p.s_q * p.h_q // self.H_KV,
                                                        self.H_KV)
        self.kv4 = p.kv.view(p.kv.shape[0], p.page, self.H_KV, 576)

    def call(self, p: Problem, i: int):
        return self.fm.flash_mla_with_kvcache(p.qs[i], self.kv4, p.block_tables[i], p.seqlens,
                                              512, self.md, self.splits, softmax_scale=SCALE,
                                              causal=True)

    def check(self, p: Problem):
        o, l = self.call(p, 0)
        torch.cuda.synchronize()
        return torch_mla.check(o, l, *p.ref())

    def unit(self, p: Problem):
        return lambda: [self.call(p, i) for i in range(p.copies)]


class FlashInferRunner(Runner):
    """flashinfer.mla.BatchMLAPagedAttentionWrapper over the same paged cache: the 512 latent and
    64 rope columns passed as two strided views of it, one planned wrapper per cache copy (each
    copy has its own block table) sharing one float workspace, planned before the capture.
    FlashInfer's own timing helpers are not used: they time one call without the rotation over
    cache copies that every kernel here gets."""

    name = "flashinfer"
    kept = ("fi",)
    WORKSPACE_BYTES = 128 << 20

    def __init__(self, fi):
        self.fi = fi

    def prepare(self, p: Problem):
        dev, b = p.kv.device, p.b
        pages = p.block_tables.shape[2]
        self.ckv = p.kv[..., :512]
        self.kpe = p.kv[..., 512:]
        self.workspace = torch.empty(self.WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=dev)
        kv_indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * pages
        self.out = torch.empty(b, p.h_q, 512, dtype=p.dtype, device=dev)
        self.wrappers = []
        for i in range(p.copies):
            w = self.fi.mla.BatchMLAPagedAttentionWrapper(self.workspace)
            w.plan(qo_indptr, kv_indptr, p.block_tables[i].reshape(-1).contiguous(), p.seqlens,
                   p.h_q, 512, 64, p.page, False, SCALE, p.dtype, p.dtype)
            self.wrappers.append(w)

    def call(self, p: Problem, i: int):
        q = p.qs[i][:, 0]
        return self.wrappers[i].run(q[..., :512], q[..., 512:], self.ckv, self.kpe, out=self.out,
                                    return_lse=True)

    def check(self, p: Problem):
        o, lse = self.call(p, 0)
        torch.cuda.synchronize()
        # FlashInfer's lse is base 2; the reference's is natural.
        return torch_mla.check(o[:, None], (lse * math.log(2.0))[:, :, None], *p.ref())

    def unit(self, p: Problem):
        return lambda: [self.call(p, i) for i in range(p.copies)]


# ---- reporting -------------------------------------------------------------------------------------

def grid_order(args) -> list:
    """The grid's shapes (h_q, b, s_k, s_q) in the benchmark's order: s_k, then s_q, then h_q,
    then b."""
    return [(h_q, b, s_k, s_q) for s_k in args.s_k for s_q in args.s_q for h_q in args.h_q
            for b in args.batch]


def shapes(args, dtype, rotate_bytes, label: str):
    """The grid's problems in grid_order, as (h_q, b, s_k, Problem); a shape whose caches do not
    fit the GPU is logged and skipped, and each problem's memory is given back after its turn.
    The shape's line names s_q when it is above 1."""
    for h_q, b, s_k, s_q in grid_order(args):
        tokens = f" s_q={s_q}" if s_q > 1 else ""
        log(f"\n[h_q={h_q} b={b} s_k={s_k}{tokens} page={args.page} {label}]")
        on_shape = getattr(args, "on_shape", None)
        if on_shape is not None:
            on_shape(f"decode {label} h_q={h_q} b={b} s_k={s_k}{tokens}")
        try:
            p = Problem(h_q, b, s_k, args.page, dtype, rotate_bytes, args.max_copies, args.seed,
                        s_q=s_q)
        except torch.cuda.OutOfMemoryError as e:
            log(f"  skipped: {short_err(e)}")
            continue
        yield h_q, b, s_k, p
        p.free()
        del p
        torch.cuda.empty_cache()


# ---- 8-bit formats side by side -------------------------------------------------------------

def run_formats(args, pk, dtype, rotate_bytes) -> dict:
    """kernelflow on each of args.formats at equal shapes, in this run: time, GB/s (the format's
    bytes), fraction of the read peak, speedup over bf16, and an accuracy check per format. Returns
    {"device", "argv", "peaks", "rows", "failures"}."""
    import kernelflow as kf

    log(f"kernelflow: {kf.__file__}; formats {' '.join(args.formats)}")
    rows, fails = [], 0
    for h_q, b, s_k, p in shapes(args, dtype, rotate_bytes, f"q {args.dtype}"):
        ref = None
        res = {}
        for fmt in args.formats:
            row = {"kernel": "kernelflow", "format": fmt, "h_q": h_q, "b": b, "s_k": s_k,
                   "s_q": p.s_q}
            try:
                q8 = fmt != "bf16"
                kv = kf.convert_cache(p.kv, kv_format=fmt) if q8 else p.kv
                code = fmt if q8 else None
                # The format's default worker count (or --workers) and schedule (the metadata
                # call is not timed).
                runner = KernelFlowRunner(kf, getattr(args, "workers", None))
                runner.prepare(p, kv_format=fmt)
                row["workers"] = runner.num_workers
                call = runner.format_call(p, kv, code)

                runner.out.fill_(float("nan"))
                call(0)
                torch.cuda.synchronize()
                if args.no_check:
                    row["check"] = {"ok": True, "skipped": True}
                elif q8:
                    if ref is None:
                        ref = p.ref()
                    cos = float(kf_ref.cosine_distance(runner.out.double().cpu().numpy(), ref[0],
                                                       axis=None))
                    bound = kf_ref.MAX_WHOLE_COS_DIST_8BIT[fmt]
                    ok = cos < bound
                    row["check"] = {"ok": ok, "whole_output_cos_dist": cos}
                    log(f"  check {fmt:9s}: {'PASS' if ok else 'FAIL'} whole-output cos "
                        f"dist {cos:.2e} (bound {bound:.0e})")
                else:
                    row["check"] = torch_mla.check(runner.out, runner.lse, *p.ref())
                    ref = p.ref()
                    log(f"  check {fmt:9s}: {torch_mla.fmt_check(row['check'])}")
                fails += not row["check"]["ok"]
                t = time_unit(lambda: [call(i) for i in range(p.copies)], p.copies,
                              args.replays)
                nbytes = p.bytes - p.cache_bytes + b * s_k * FORMAT_BYTES[fmt]
                gbps = nbytes / (t["us"] * 1e-6) / 1e9
                row.update({"us": t["us"], "GBps": gbps,
                            "frac_read_peak": gbps / pk["read_GBps"], "timing": t["timing"]})
                res[fmt] = row
                del kv
            except Exception as e:  # noqa: BLE001
                row["error"] = short_err(e)
                log(f"  {fmt:9s}: FAILED {short_err(e)}")
            rows.append(row)
        for fmt, row in res.items():
            sp = (f"  {res['bf16']['us'] / row['us']:.2f}x vs bf16"
                  if "bf16" in res and fmt != "bf16" else "")
            log(f"  {fmt:9s}: {row['us']:9.1f} us {row['GBps']:7.0f} GB/s "
                f"({100 * row['frac_read_peak']:5.1f}% read){sp}, {row['workers']} workers")
    log(f"\n## MLA decode by cache format, {torch.cuda.get_device_name(0)}, q {args.dtype}, "
        f"page {args.page}, s_q {args.s_q[0]}, read peak {pk['read_GBps']:.0f} GB/s; 8-bit bytes = b*s_k*644\n")
    log("| h_q | b | s_k | " + " | ".join(f"{f} us | {f} %read" + (f" | {f}/bf16" if f != "bf16" else "")
                                          for f in args.formats) + " |")
    ncol = sum(3 if f != "bf16" else 2 for f in args.formats) + 3
    log("|" + " --- |" * ncol)
    keys = sorted({(r["h_q"], r["b"], r["s_k"]) for r in rows}, key=lambda k: (k[2], k[0], k[1]))
    for h_q, b, s_k in keys:
        by = {r["format"]: r for r in rows if (r["h_q"], r["b"], r["s_k"]) == (h_q, b, s_k)
              and "us" in r}
        cells = []
        for f in args.formats:
            r = by.get(f)
            cells += [f"{r['us']:.1f}" if r else "-",
                      f"{100 * r['frac_read_peak']:.0f}%" if r else "-"]
            if f != "bf16":
                cells.append(f"{by['bf16']['us'] / r['us']:.2f}x" if r and "bf16" in by else "-")
        log(f"| {h_q} | {b} | {s_k} | " + " | ".join(cells) + " |")
    log("(speedup: bf16 time / the format's time, same run, same shapes)")
    for r in rows:
        base = next((x for x in rows if x["format"] == "bf16" and "us" in x
                     and (x["h_q"], x["b"], x["s_k"]) == (r["h_q"], r["b"], r["s_k"])), None)
        if base is not None and "us" in r and r["format"] != "bf16":
            r["speedup_vs_bf16"] = base["us"] / r["us"]
    return {"device": torch.cuda.get_device_name(0), "argv": args.argv, "peaks": pk,
            "rows": rows, "failures": fails}


def load_spec_flashmla():
    try:
        with open(ANCHOR) as f:
            rows = json.load(f)["rows"]
        return {(r["h_q"], r["b"], r["s_k"]): r for r in rows if r.get("kernel") == "flashmla"}
    except Exception as e:  # noqa: BLE001
        log(f"(no FlashMLA anchor: {short_err(e)})")
        return {}


def get_peaks(args):
    if args.peaks_json and not args.peaks_from_spec:
        try:
            with open(args.peaks_json) as f:
                res = json.load(f)
            res["source"] = f"{res.get('source', 'peaks.py')} ({args.peaks_json})"
            return res
        except Exception as e:  # noqa: BLE001
            log(f"could not read {args.peaks_json} ({short_err(e)}); measuring")
    if not args.peaks_from_spec:
        try:
            t0 = time.time()
            res = peaks_mod.measure_peaks(verbose=True)
            log(f"(peaks measured in {time.time() - t0:.1f}s)")
            return res
        except Exception as e:  # noqa: BLE001
            log(f"peaks.py failed ({short_err(e)}); falling back to docs/spec.md's peaks")
    return {"read_GBps": peaks_mod.SPEC_PEAKS["read_GBps"],
            "mma_sync_bf16_TFLOPS": peaks_mod.SPEC_PEAKS["mma_sync_bf16_TFLOPS"],
            "source": peaks_mod.SPEC_PEAKS["source"]}


def perf(p: Problem, us: float, pk: dict) -> dict:
    gbps = p.bytes / (us * 1e-6) / 1e9
    tflops = p.flops / (us * 1e-6) / 1e12
    return {"us": us, "GBps": gbps, "TFLOPS": tflops,
            "frac_read_peak": gbps / pk["read_GBps"],
            "frac_mma_peak": tflops / pk["mma_sync_bf16_TFLOPS"]}


def fmt_perf(r: dict) -> str:
    return (f"{r['us']:9.1f} us {r['GBps']:7.0f} GB/s ({100 * r['frac_read_peak']:5.1f}% read) "
            f"{r['TFLOPS']:6.1f} TFLOPS ({100 * r['frac_mma_peak']:5.1f}% mma.sync)")


def triton_version() -> str:
    return triton_mla.triton.__version__ if triton_mla is not None else "not installed"


def gpu_setup(args) -> dict:
    """The run's device facts and numeric settings, with the header line printed; the torch
    matmul settings the baseline's check needs."""
    # cuBLAS may otherwise reduce split-K partials in 16 bits: the torch baseline's worst row then
    # sits near the 1e-5 cosine threshold (7-9e-6 measured at s_k 4096).
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    ctx = {"device": props.name, "num_sms": props.multi_processor_count, "l2_bytes": l2,
           "dtype": torch.bfloat16 if args.dtype == "bf16" else torch.float16,
           "rotate_bytes": args.rotate_mb * 1e6 if args.rotate_mb else 4 * l2}
    log(f"device: {props.name}, {ctx['num_sms']} SMs, L2 {l2 / 2**20:.0f} MiB; torch "
        f"{torch.__version__}, triton {triton_version()}; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
    log(f"argv: {' '.join(args.argv)}")
    return ctx


def make_runners(args, num_sms: int) -> tuple:
    """(runners, errors, flashmla_measured): the kernels of this run in order, the import
    failures, and whether FlashMLA runs here (else its docs/spec.md figures are shown)."""
    runners, errors = [], []
    if not args.baselines_only:
        try:
            import kernelflow
            runners.append(KernelFlowRunner(kernelflow, getattr(args, "workers", None)))
            log(f"kernelflow: {getattr(kernelflow, '__file__', '?')}")
        except Exception as e:  # noqa: BLE001
            log(f"kernelflow unavailable ({short_err(e)}); running the baselines only")
            errors.append({"kernel": "kernelflow", "error": short_err(e)})
    if not args.no_triton and triton_mla is None:
        log("triton not importable: no Triton row")
    elif not args.no_triton:
        runners.append(TritonRunner(args.tune, num_sms))
    if not args.no_torch:
        runners.append(TorchRunner())
    flashmla_measured = False
    if not args.no_flashmla:
        try:
            import flash_mla
            runners.append(FlashMLARunner(flash_mla))
            flashmla_measured = True
        except Exception as e:  # noqa: BLE001
            log(f"flash_mla not importable ({short_err(e)}): showing FlashMLA (docs/spec.md, not "
                f"this run)")
    if not args.no_flashinfer:
        try:
            import flashinfer.mla
            runners.append(FlashInferRunner(flashinfer))
        except Exception as e:  # noqa: BLE001
            log(f"flashinfer not importable ({short_err(e)}): no FlashInfer row (the repo keeps "
                f"no FlashInfer figures)")
    return runners, errors, flashmla_measured


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to benchmark")
        return 1
    ctx = gpu_setup(args)
    pk = get_peaks(args)
    log(f"peaks used: read {pk['read_GBps']:.0f} GB/s, mma.sync bf16 "
        f"{pk['mma_sync_bf16_TFLOPS']:.0f} TFLOPS ({pk['source']})")
    if args.formats:
        out = run_formats(args, pk, ctx["dtype"], ctx["rotate_bytes"])
    else:
        out = run_grid(args, pk, ctx)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=plain)
        log(f"wrote {args.json}")
    return 1 if out["failures"] else 0


def measure(r: Runner, p: Problem, args, pk: dict) -> dict:
    """One kernel on one problem: prepared, checked once against the float64 reference (unless
    --no-check), then timed. Returns its row; a failure's row holds the error instead."""
    row = {"kernel": r.name, "h_q": p.h_q, "b": p.b, "s_k": p.s_k, "s_q": p.s_q,
           "page": args.page, "dtype": args.dtype, "copies": p.copies}
    try:
        r.prepare(p)
        if args.no_check:
            row["check"] = {"ok": True, "skipped": True}
        else:
            row["check"] = r.check(p)
            log(f"  check {r.name:10s}: {torch_mla.fmt_check(row['check'])}")
        t = time_unit(r.unit(p), p.copies, args.replays)
        row.update(perf(p, t["us"], pk))
        row["us_min"], row["timing"] = t["us_min"], t["timing"]
        if hasattr(r, "info"):
            row.update(r.info())
        if isinstance(r, KernelFlowRunner):
            try:
                mu, n = r.metadata_unit(p)
                row["metadata_us"] = time_unit(mu, n, args.replays)["us"]
            except Exception as e:  # noqa: BLE001
                row["metadata_error"] = short_err(e)
        extra = f"  [{row['config']}]" if "config" in row else ""
        if "metadata_us" in row:
            extra += f"  metadata {row['metadata_us']:.1f} us"
        log(f"  {r.name:16s}: {fmt_perf(row)}{extra}")
    except Exception as e:  # noqa: BLE001
        row["error"] = short_err(e)
        log(f"  {r.name:16s}: FAILED {short_err(e)}")
        if os.environ.get("KF_BENCH_TRACE"):
            traceback.print_exc()
    return row


def speedups(res: dict) -> dict:
    """The other kernel's time / this one's, for kernelflow and Triton against every other kernel
    of the shape (> 1: this one faster)."""
    ratios = {}
    for main_k in ("kernelflow", "triton"):
        for other in ("triton", "torch", "flashmla", "flashmla_spec", "flashinfer"):
            if main_k in res and other in res and other != main_k:
                ratios[f"{main_k}_speedup_vs_{other}"] = res[other]["us"] / res[main_k]["us"]
    return ratios


def run_grid(args, pk, ctx) -> dict:
    """Every kernel of this run on every shape of the grid, checked, then timed (at s_q > 1 the
    kernels that decode it: kernelflow and FlashMLA); the compact table printed last, then
    FlashMLA's matrix with --flashmla-matrix. Returns the run as a dict (rows, speedups, errors,
    "failures"; "flashmla_matrix" with --flashmla-matrix)."""
    dtype, rotate_bytes = ctx["dtype"], ctx["rotate_bytes"]
    runners, errors, flashmla_measured = make_runners(args, ctx["num_sms"])
    spec_fm = load_spec_flashmla()

    rows = []
    table = []
    for h_q, b, s_k, p in shapes(args, dtype, rotate_bytes, args.dtype):
        log(f"  {p.copies} cache copies x {p.cache_bytes / 1e6:.1f} MB, "
            f"{p.copies} calls per graph replay, {args.replays} replays")
        active, left_out = split_by_s_q(runners, p.s_q)
        if left_out:
            log(f"  {', '.join(left_out)}: left out at s_q {p.s_q} (they decode s_q = 1 only)")
        res = {}
        for r in active:
            row = measure(r, p, args, pk)
            if "error" in row:
                errors.append({"kernel": r.name, "h_q": h_q, "b": b, "s_k": s_k, "s_q": p.s_q,
                               "error": row["error"]})
            else:
                res[r.name] = row
            rows.append(row)
            torch.cuda.synchronize()
        for r in runners:
            r.release()
        fm = spec_fm.get((h_q, b, s_k)) if p.s_q == 1 else None
        if not flashmla_measured and fm is not None:
            frow = {"kernel": "flashmla_spec", "h_q": h_q, "b": b, "s_k": s_k, "s_q": 1,
                    "page": 64, "dtype": "bf16",
                    "note": "FlashMLA (docs/spec.md, not this run)", **perf(p, fm["us_graph"], pk)}
            res["flashmla_spec"] = frow
            rows.append(frow)
            log(f"  {'FlashMLA (docs/spec.md, not this run)':16s}: {fmt_perf(frow)}")
        ratios = speedups(res)
        if ratios:
            log("  speedups (other's time / this one's): " +
                ", ".join(f"{k.replace('_speedup_vs_', ' vs ')} {v:.2f}x"
                          for k, v in ratios.items()))
        table.append({"h_q": h_q, "b": b, "s_k": s_k, "s_q": p.s_q, "res": res,
                      "ratios": ratios})

    for line in grid_table(table, args, ctx["device"], pk, flashmla_measured):
        log(line)
    out = {}
    if args.flashmla_matrix:
        cells = flashmla_matrix(rows, {k: getattr(args, k) for k in FLASHMLA_MATRIX})
        for line in [""] + matrix_lines(cells, flashmla_measured):
            log(line)
        out = {"flashmla_matrix": cells,
               "flashmla_matrix_not_slower": not_slower(cells) if flashmla_measured else None}
    n_fail = sum(1 for r in rows if "check" in r and not r["check"]["ok"])
    log(f"\nchecks: {sum(1 for r in rows if 'check' in r)} run, {n_fail} failed; "
        f"errors: {len(errors)}")

    return {"device": ctx["device"], "num_sms": ctx["num_sms"], "l2_bytes": ctx["l2_bytes"],
            "torch": torch.__version__, "triton": triton_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": args.argv,
            "peaks": pk, "flashmla_measured": flashmla_measured,
            "rows": rows, "ratios": [{k: t[k] for k in ("h_q", "b", "s_k", "s_q", "ratios")}
                                     for t in table],
            "errors": errors, "failures": n_fail, **out}


# ---- the printed table and FlashMLA's matrix ---------------------------------------------------

def us_cell(res: dict, kernel: str, key: str = "us", fmt: str = "{:.1f}") -> str:
    return fmt.format(res[kernel][key]) if kernel in res and key in res[kernel] else "-"


def grid_table(table: list, args, device: str, pk: dict, flashmla_measured: bool) -> list:
    """The compact markdown table of the grid (one line per shape, s_q in its own column): the
    times, kernelflow's and Triton's GB/s and TFLOPS, and the speedups."""
    fm_label = "FlashMLA us" if flashmla_measured else "FlashMLA us (docs/spec.md, not this run)"
    fm_key = "flashmla" if flashmla_measured else "flashmla_spec"
    lines = ["", f"## MLA decode, {device}, {args.dtype}, page {args.page}, s_q "
             f"{' '.join(map(str, args.s_q))} (causal above 1), peaks: read "
             f"{pk['read_GBps']:.0f} GB/s, mma.sync {pk['mma_sync_bf16_TFLOPS']:.0f} TFLOPS "
             f"({'measured' if 'measured' in pk['source'] else 'docs/spec.md'})", "",
             f"| h_q | b | s_k | s_q | KF us | KF GB/s | KF TFLOPS | KF %read | KF %mma | "
             f"Triton us | Triton GB/s | Triton TFLOPS | torch us | {fm_label} | KF/Triton | "
             f"KF/torch | KF/FlashMLA | Triton/torch | Triton/FlashMLA |",
             "|" + " --- |" * 19]
    for t in table:
        res, ra = t["res"], t["ratios"]

        def ratio(a, o):
            k = f"{a}_speedup_vs_{o}"
            return f"{ra[k]:.2f}x" if k in ra else "-"

        def pct(key):
            kf = res.get("kernelflow", {})
            return f"{100 * kf[key]:.0f}%" if key in kf else "-"

        lines.append(
            f"| {t['h_q']} | {t['b']} | {t['s_k']} | {t['s_q']} | {us_cell(res, 'kernelflow')} | "
            f"{us_cell(res, 'kernelflow', 'GBps', '{:.0f}')} | "
            f"{us_cell(res, 'kernelflow', 'TFLOPS', '{:.1f}')} | {pct('frac_read_peak')} | "
            f"{pct('frac_mma_peak')} | {us_cell(res, 'triton')} | "
            f"{us_cell(res, 'triton', 'GBps', '{:.0f}')} | "
            f"{us_cell(res, 'triton', 'TFLOPS', '{:.1f}')} | {us_cell(res, 'torch')} | "
            f"{us_cell(res, fm_key)} | {ratio('kernelflow', 'triton')} | "
            f"{ratio('kernelflow', 'torch')} | {ratio('kernelflow', fm_key)} | "
            f"{ratio('triton', 'torch')} | {ratio('triton', fm_key)} |")
    lines.append("(speedups: the other kernel's time / this one's; > 1 means faster; at s_q > 1 "
                 "FLOPs count the positions each causal query row sees)")
    return lines


def flashmla_matrix(rows: list, grid: dict = FLASHMLA_MATRIX) -> list:
    """FlashMLA's matrix from the grid's rows: one cell per (s_q, h_q, s_k) of grid (lists under
    "s_q", "h_q", "s_k"; the batch is grid["batch"][0]), in that order, with kernelflow's and
    FlashMLA's times measured in this run and ratio = FlashMLA's time / kernelflow's (> 1:
    kernelflow faster); None where either has no time. kf_check_ok: kernelflow's check passed
    there (or --no-check skipped it). FlashMLA's docs/spec.md figures (flashmla_spec) never
    enter."""
    b = grid["batch"][0]

    def timed(kernel, key):
        return next((r for r in rows if r.get("kernel") == kernel and "us" in r
                     and (r.get("s_q", 1), r["h_q"], r["s_k"], r["b"]) == key + (b,)), None)

    cells = []
    for key in ((s_q, h_q, s_k) for s_q in grid["s_q"] for h_q in grid["h_q"]
                for s_k in grid["s_k"]):
        kf, fm = timed("kernelflow", key), timed("flashmla", key)
        cells.append({"s_q": key[0], "h_q": key[1], "s_k": key[2], "b": b,
                      "kf_us": kf["us"] if kf else None,
                      "flashmla_us": fm["us"] if fm else None,
                      "ratio": fm["us"] / kf["us"] if kf and fm else None,
                      "kf_check_ok": bool(kf and kf.get("check", {}).get("ok"))})
    return cells


def not_slower(cells: list) -> int:
    """The cells where kernelflow, checked, is at least as fast as FlashMLA."""
    return sum(1 for c in cells if c["ratio"] is not None and c["ratio"] >= 1 and c["kf_check_ok"])


def matrix_lines(cells: list, flashmla_measured: bool) -> list:
    """FlashMLA's matrix as printed: a row per s_q, a column per (h_q, s_k), each cell FlashMLA's
    time / kernelflow's, then the count of cells where kernelflow is not slower. Without FlashMLA
    in this run it says so and shows no ratio."""
    b = cells[0]["b"] if cells else "-"
    lines = [f"## FlashMLA's matrix, b {b}, causal: FlashMLA's time / kernelflow's, both measured "
             f"in this run (> 1: kernelflow faster)", ""]
    if not flashmla_measured:
        return lines + ["FlashMLA did not run in this call (flash_mla does not import here): no "
                        "ratios; kernelflow's times are in the table above"]
    cols = list(dict.fromkeys((c["h_q"], c["s_k"]) for c in cells))
    lines += ["| s_q | " + " | ".join(f"h_q {h_q}, s_k {s_k}" for h_q, s_k in cols) + " |",
              "|" + " --- |" * (1 + len(cols))]
    for s_q in dict.fromkeys(c["s_q"] for c in cells):
        by_col = {(c["h_q"], c["s_k"]): c for c in cells if c["s_q"] == s_q}
        texts = []
        for col in cols:
            c = by_col.get(col)
            if c is None or c["ratio"] is None:
                texts.append("-")
            else:
                texts.append(f"{c['ratio']:.3f}x" + ("" if c["kf_check_ok"] else " !"))
        lines.append(f"| {s_q} | " + " | ".join(texts) + " |")
    lines += ["(-: kernelflow or FlashMLA has no time there; !: kernelflow's check failed there, "
              "not counted)",
              f"kernelflow not slower than FlashMLA in {not_slower(cells)} of {len(cells)} cells"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
