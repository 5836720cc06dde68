"""Measured ceilings of this GPU: DRAM read bandwidth and the mma.sync bf16 rate.

(a) read_bw.cu streams a >= 4 GiB buffer with 16-byte loads and writes nothing: best GB/s over a
    few launch shapes.
(b) mma_sync.cu issues mma.sync.m16n8k16 bf16 -> fp32 from registers only, on every SM: best
    TFLOPS over warps per block (4/8/16) and blocks per SM (1/2/4).

The probes (probes/*.cu, package data) are compiled for the device's own architecture with nvcc
(-cubin) and launched through CuPy; without nvcc, CuPy's NVRTC compiles the same source. Timing:
CUDA events, best of several launches after a warm-up (a ceiling is a best, not a median).

    python3 -m kernelflow.bench.peaks [--json PATH] [--read-gib 4.5]

kernelflow.bench.decode, .layer and `python -m kernelflow bench` take measure_peaks() from here.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

PROBES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes")

# docs/spec.md section 5 (H200, 2026-11-30), for --peaks-from-spec and for comparison.
SPEC_PEAKS = {"read_GBps": 4429.1, "mma_sync_bf16_TFLOPS": 639.0, "bf16_mm_TFLOPS": 740.8,
              "source": "docs/spec.md section 5 (H200, 2026-11-30), not this run"}


def _nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


def device_arch(cp) -> str:
    """sm_XY of the current device (the probes use mma.sync bf16: sm_80 or newer)."""
    return f"sm_{cp.cuda.Device().compute_capability}"  # CuPy gives "90" for 9.0


def _load_module(name: str):
    """CuPy RawModule of probes/<name>.cu built for the current device."""
    import cupy as cp

    src = os.path.join(PROBES, name + ".cu")
    arch = device_arch(cp)
    nvcc = _nvcc()
    if nvcc:
        out = os.path.join(tempfile.mkdtemp(prefix="kf_peaks_"), name + ".cubin")
        subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-O3", "-o", out, src], check=True,
                       capture_output=True, text=True)
        return cp.RawModule(path=out)
    with open(src) as f:
        code = f.read()
    return cp.RawModule(code=code, options=(f"--gpu-architecture={arch}", "-std=c++17"))


def _time_ms(cp, launch, reps: int) -> float:
    """Best of `reps` event-timed launches after one warm-up (ceilings: best, not median)."""
    launch()
    cp.cuda.Device().synchronize()
    best = float("inf")
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(reps):
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop))
    return best


def measure_read_bw(read_gib: float = 4.5, reps: int = 8, verbose: bool = True) -> dict:
    import cupy as cp

    kern = _load_module("read_bw").get_function("read_bw")
    num_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    n_bytes = int(read_gib * (1 << 30)) // 16 * 16
    buf = cp.empty(n_bytes // 4, dtype=cp.uint32)
    # Non-constant contents: reading a zero-filled buffer could be cheaper on some memory systems.
    buf[:] = cp.arange(buf.size, dtype=cp.uint32) * cp.uint32(2654435761)
    sink = cp.zeros(1, dtype=cp.uint32)
    n_vec = cp.uint64(n_bytes // 16)
    best = {"GBps": 0.0}
    for threads in (256, 512, 1024):
        for blocks_per_sm in (1, 2, 4, 8):
            if threads * blocks_per_sm > 2048:
                continue
            grid = num_sms * blocks_per_sm
            ms = _time_ms(cp, lambda: kern((grid,), (threads,), (buf, n_vec, sink)), reps)
            gbps = n_bytes / (ms * 1e-3) / 1e9
            if verbose:
                print(f"  read  threads={threads:4d} blocks/SM={blocks_per_sm}: {gbps:8.1f} GB/s")
            if gbps > best["GBps"]:
                best = {"GBps": gbps, "threads": threads, "blocks_per_sm": blocks_per_sm,
                        "bytes": n_bytes, "ms": ms}
    buf = None  # release before freeing the pool
    cp.get_default_memory_pool().free_all_blocks()
    return best


def measure_mma_sync(iters: int = 20000, reps: int = 5, verbose: bool = True) -> dict:
    import cupy as cp

    kern = _load_module("mma_sync").get_function("mma_bf16_f32")
    num_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    k_acc, flop_per_mma = 8, 2 * 16 * 8 * 16
    sink = cp.zeros(num_sms * 4, dtype=cp.float32)
    best = {"TFLOPS": 0.0}
    for warps in (4, 8, 16):
        for blocks_per_sm in (1, 2, 4):
            grid = num_sms * blocks_per_sm
            ms = _time_ms(cp, lambda: kern((grid,), (warps * 32,), (cp.int32(iters), sink)), reps)
            flops = grid * warps * iters * k_acc * flop_per_mma
            tflops = flops / (ms * 1e-3) / 1e12
            if verbose:
                print(f"  mma.sync warps/block={warps:2d} blocks/SM={blocks_per_sm}: "
                      f"{tflops:7.1f} TFLOPS")
            if tflops > best["TFLOPS"]:
                best = {"TFLOPS": tflops, "warps_per_block": warps, "blocks_per_sm": blocks_per_sm,
                        "iters": iters, "ms": ms}
    return best


def measure_peaks(verbose: bool = True, read_gib: float = 4.5) -> dict:
    import cupy as cp

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    if verbose:
        print(f"peaks on {name} ({dev.attributes['MultiProcessorCount']} SMs, "
              f"L2 {props['l2CacheSize'] / 2**20:.0f} MiB)")
    rd = measure_read_bw(read_gib=read_gib, verbose=verbose)
    mma = measure_mma_sync(verbose=verbose)
    res = {"device": name, "num_sms": dev.attributes["MultiProcessorCount"],
           "l2_bytes": int(props["l2CacheSize"]), "read_GBps": rd["GBps"],
           "mma_sync_bf16_TFLOPS": mma["TFLOPS"], "read": rd, "mma_sync": mma,
           "source": "measured in this run (kernelflow.bench.peaks)"}
    if verbose:
        print(f"PEAK read {res['read_GBps']:.1f} GB/s "
              f"(docs/spec.md {SPEC_PEAKS['read_GBps']}), "
              f"mma.sync bf16 {res['mma_sync_bf16_TFLOPS']:.1f} TFLOPS "
              f"(docs/spec.md {SPEC_PEAKS['mma_sync_bf16_TFLOPS']})")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernelflow.bench.peaks",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--read-gib", type=float, default=4.5, help="read buffer size in GiB (>= 4)")
    args = ap.parse_args(argv)
    res = measure_peaks(verbose=True, read_gib=args.read_gib)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
