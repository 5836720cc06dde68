"""The bound model of the estimate: which decode kernel a call runs on a GPU, how many of its
blocks share an SM, how the library's scheduler splits the batch over workers, and the time per
call as the slowest of the SM's pipes and of the memory traffic.

Time per call = max(compute, memory):
  compute = max over pipes of (blocks on the busiest SM x warps per block x the busiest worker's
            (KV tiles x per-tile units + pieces x per-piece units)) / (rate x clock);
  memory  = bytes moved / the GPU's read bandwidth: the cache rows read, q, out and lse, the
            block table, and the split pieces' partial outputs written by the decode and read
            by the combine.
Not modeled: launch and pipeline fill latency, the combine kernel's own time, barrier waits,
bank conflicts and L2 behaviour (see docs/optimization/ampere_estimate.md, "Limits").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .estimate_loop import PIPES

HEAD_DIM, LATENT_DIM, ROPE_DIM = 576, 512, 64  # src/core/mla_shape.h
SCHED_BLOCK_N = 64  # tokens per scheduling tile (src/core/scheduler.h, kSchedBlockN)
KV_FMT = {"bf16": 0, "fp8_e4m3": 1, "int8": 2}  # the kernels' kFmt (mla_decode_traits.h)
BYTES_PER_TOKEN = {"bf16": HEAD_DIM * 2, "fp8_e4m3": 644, "int8": 644}  # docs/formats.md
MMA_MACS = 16 * 8 * 16  # multiply-adds of one m16n8k16 HMMA

_NAME = re.compile(r"mla_decode_sm80_kernel.*MlaDecodeTraitsILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)"
                   r"ELb([01])ELb([01])EEE(13__nv_bfloat16|6__half)Li(\d+)ELb([01])E")


@dataclass(frozen=True)
class DecodeKernel:
    """One instantiation of mla_decode_sm80_kernel<MlaDecodeTraits<...>, T, kFmt, kSmallPages>,
    read from its mangled name."""

    name: str
    m_frags: int
    row_groups: int
    block_n: int
    stages: int
    kv8: bool
    defer_pv: bool
    dtype: str  # "bf16" or "fp16"
    fmt: int
    small_pages: bool

    @property
    def block_m(self):
        return self.row_groups * self.m_frags * 16

    @property
    def warps(self):
        return self.row_groups * 4

    @property
    def threads(self):
        return self.warps * 32

    @property
    def smem_bytes(self):
        """Dynamic shared memory (MlaDecodeTraits::kSmemBytes): KV ring, partial scores, P, row
        stats and per-thread softmax state, token flags, q_pe, piece list."""
        bm, bn, t = self.block_m, self.block_n, self.threads
        size = self.stages * bn * (BYTES_PER_TOKEN["int8"] if self.kv8 else HEAD_DIM * 2)
        size += 4 * bm * bn * 4 + bm * bn * 2 + 2 * bm * 4 + 3 * t * 4
        size += t * 4 if self.kv8 else 0
        size += (self.stages * bn + 15) // 16 * 16 + bm * ROPE_DIM * 2 + 8 * 32 + 16
        return size

    @property
    def tensor_per_tile(self):
        """m16n8k16 HMMAs per warp per KV tile: q.k over 576 dims and p.v over 512."""
        return self.block_m * self.block_n * (HEAD_DIM + LATENT_DIM) / MMA_MACS / self.warps


def parse_kernel_name(mangled):
    """The DecodeKernel a mangled name instantiates, or None for another kernel."""
    m = _NAME.search(mangled)
    if not m:
        return None
    mf, rg, bn, st, kv8, defer, dtype, fmt, small = m.groups()
    return DecodeKernel(mangled, int(mf), int(rg), int(bn), int(st), kv8 == "1", defer == "1",
                        "bf16" if "bfloat16" in dtype else "fp16", int(fmt), small == "1")


def choose_kernel(kernels, num_rows, kv_format, two_32_row_blocks_fit):
    """The bf16 instantiation a call runs (src/cuda/decode/decode_config.h): 8-bit formats their
    16-row kernel; 16-bit caches the 16-row tile up to 16 rows, the 32-row tile up to 32 rows or
    where two 32-row blocks fit an SM, else the 64-row tile. kernels: the usual (not small-page)
    bf16 instantiations."""
    fmt = KV_FMT[kv_format]
    by_rows = {k.block_m: k for k in kernels if k.fmt == fmt}
    if fmt != 0:
        return by_rows[16]
    if num_rows <= 16:
        return by_rows[16]
    if num_rows <= 32 or two_32_row_blocks_fit:
        return by_rows[32]
    return by_rows[64]


def blocks_per_sm(kernel, regs, gpu):
    """Blocks of the kernel that fit one SM, as mla_decode_sm80_blocks_per_sm counts them:
    shared memory (with the per-block reservation), registers (per warp in units of 256),
    threads."""
    by_smem = gpu.smem_per_sm // (kernel.smem_bytes + gpu.smem_reserved_per_block)
    by_regs = gpu.regs_per_sm // ((regs + 7) // 8 * 8 * 32 * kernel.warps)
    by_threads = gpu.threads_per_sm // kernel.threads
    return max(1, min(by_smem, by_regs, by_threads))


# The metadata layout (src/core/scheduler.h): header, then 8 ints per worker, then the
# requests' first-piece offsets.
_META_HEADER, _META_WORKER = 16, 8
_META_BATCH, _META_WORKERS = 2, 5


def worker_pieces(meta, seqlens):
    """Per worker, the token counts of its pieces, from a metadata array (the walk of
    for_each_piece in src/core/scheduler.h)."""
    batch, workers = int(meta[_META_BATCH]), int(meta[_META_WORKERS])
    result = []
    for w in range(workers):
        sr, st, er, et = (int(x) for x in meta[_META_HEADER + w * _META_WORKER:][:4])
        pieces = []
        r = sr
        while (sr, st) != (er, et) and r < batch and (r < er or (r == er and et > 0)):
            n = int(seqlens[r])
            lo = st if r == sr else 0
            hi = et if r == er else -(-n // SCHED_BLOCK_N)
            pieces.append(max(0, min(hi * SCHED_BLOCK_N, n) - lo * SCHED_BLOCK_N))
            r += 1
        result.append(pieces)
    return result


def split_pieces(meta):
    """Pieces of requests split over more than one worker: each writes a partial output."""
    batch, workers = int(meta[_META_BATCH]), int(meta[_META_WORKERS])
    offsets = meta[_META_HEADER + workers * _META_WORKER:][:batch + 1]
    counts = [int(offsets[r + 1]) - int(offsets[r]) for r in range(batch)]
    return sum(c for c in counts if c > 1)


def schedule(batch, s_k, h_q, kv_format, num_workers):
    """(per-worker piece token counts, split pieces) from the library's own scheduler (the CPU
    backend's get_mla_metadata: the same bytes as the GPU's)."""
    import numpy as np

    from .mla import get_mla_metadata

    seqlens = np.full(batch, s_k, dtype=np.int32)
    meta = np.asarray(get_mla_metadata(seqlens, h_q, s_q=1, num_workers=num_workers,
                                       kv_format=kv_format))
    return worker_pieces(meta, seqlens), split_pieces(meta)


def memory_bytes(batch, s_k, h_q, kv_format, n_split):
    """Bytes a call moves through DRAM (module docstring)."""
    cache = batch * s_k * BYTES_PER_TOKEN[kv_format]
    q = batch * h_q * HEAD_DIM * 2
    out = batch * h_q * (LATENT_DIM * 2 + 4)
    table = batch * -(-s_k // SCHED_BLOCK_N) * 4
    partials = 2 * n_split * h_q * (LATENT_DIM + 1) * 4
    return cache + q + out + table + partials


def compute_cycles(tile, piece, tiles, pieces, warps, blocks, rates):
    """{pipe: cycles} on the busiest SM: `blocks` co-resident blocks of `warps` warps, each
    running `tiles` KV tiles (LoopCounts `tile`) and `pieces` pieces ((units, issue) `piece`)."""
    piece_units, piece_issue = piece
    scale = blocks * warps
    work = {p: scale * (tiles * tile.pipes[p] + pieces * piece_units[p]) for p in PIPES}
    work["issue"] = scale * (tiles * tile.issue + pieces * piece_issue)
    work["fp32+int"] = work["fp32"] + work["int"]
    return {p: work[p] / r for p, r in rates.items()}


@dataclass
class Prediction:
    us: float
    bound: str  # "memory" or the slowest pipe
    compute_us: float
    memory_us: float
    cycles: dict
    kernel: DecodeKernel
    blocks_per_sm: int
    workers: int
    tiles: int  # KV tiles of the busiest worker
    pieces: int
    bytes: int


def predict(shape, gpu, kernel, regs, counts):
    """Time per call of `shape` (h_q, b, s_k, kv_format) on `gpu`, running `kernel` (with
    `regs` registers) whose loops count `counts` = (tile LoopCounts, piece (units, issue))."""
    h_q, b, s_k, kv_format = shape
    bps = blocks_per_sm(kernel, regs, gpu)
    row_tiles = -(-h_q // kernel.block_m)
    workers = max(1, gpu.sms * bps // row_tiles)
    per_worker, n_split = schedule(b, s_k, h_q, kv_format, workers)
    loads = [(sum(-(-t // kernel.block_n) for t in ps), len(ps)) for ps in per_worker]
    tile, piece = counts
    tiles, pieces = max(loads, key=lambda tp: tp[0] * tile.issue + tp[1] * piece[1])
    blocks = min(bps, -(-workers * row_tiles // gpu.sms))
    cycles = compute_cycles(tile, piece, tiles, pieces, kernel.warps, blocks, gpu.rates)
    slowest = max(cycles, key=cycles.get)
    compute_us = cycles[slowest] / gpu.clock_mhz
    nbytes = memory_bytes(b, s_k, h_q, kv_format, n_split)
    memory_us = nbytes / (gpu.read_GBps * 1e3)
    bound = "memory" if memory_us >= compute_us else slowest
    return Prediction(max(compute_us, memory_us), bound, compute_us, memory_us, cycles, kernel,
                      bps, workers, tiles, pieces, nbytes)
