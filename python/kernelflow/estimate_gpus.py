"""Nominal per-SM rates and sizes of the GPUs the estimate covers, and the reference design's
RTX 3090 measurements it is compared with. Every figure names its source.

Rates are per SM per clock in the units of estimate_loop (warp instructions; tensor in
m16n8k16 HMMAs with fp32 accumulation; shared and global in 128-byte wavefronts). A pipe without
a rate (barrier, other) costs issue slots only.
"""
from __future__ import annotations

from dataclasses import dataclass

# The CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table (results per clock
# per SM, divided by 32 lanes): fp32 add/mul/fma 64 on 8.0 and 128 on 8.6/8.9/9.0; 32-bit integer
# add/logic/shift/multiply-add 64; "all other type conversions" 16; reciprocal, exp2, log2,
# sin/cos (MUFU) 16. Issue: four warp schedulers per SM, one instruction each per clock (the
# Ampere GA100/GA102, Ada AD102 and Hopper GH100 whitepapers). Shared memory and the L1 data path
# move 128 bytes per clock per SM (32 banks of 4 bytes).
_COMMON = {"issue": 4.0, "int": 2.0, "conversion": 0.5, "mufu": 0.5, "shared": 1.0,
           "global": 1.0}


def _rates(fp32, tensor, shared_fp32_int):
    rates = dict(_COMMON, fp32=fp32, tensor=tensor)
    if shared_fp32_int:
        # GA10x and AD10x: one of the two 16-lane datapaths of each SM sub-partition runs fp32 or
        # int32, so fp32 and integer instructions together issue at most 128 lanes per clock
        # (GA102 whitepaper, "Second-Generation RTX").
        rates["fp32+int"] = 4.0
    return rates


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    arch: str  # what the GPU runs
    sass: str  # whose SASS the estimate counts (sm_86 stands in for sm_80 and sm_89)
    sms: int
    clock_mhz: float
    dram_GBps: float  # nominal
    read_GBps: float  # what a read-only kernel reaches, the memory bound's denominator
    read_source: str
    smem_per_sm: int  # bytes a kernel may use per SM
    threads_per_sm: int
    rates: dict
    source: str
    regs_per_sm: int = 65536
    smem_reserved_per_block: int = 1024

    @property
    def proxy(self):
        """Whether the counted SASS is another architecture's."""
        return self.sass != self.arch


# RTX 3090 read bandwidth a read-only kernel reached in the reference design's measurements
# (docs/spec.md section 8), over the nominal 936.2 GB/s: the fraction assumed for the GPUs whose
# achievable read is not measured here.
_REF_3090_READ_GBPS = 873.8
_READ_FRACTION = _REF_3090_READ_GBPS / 936.2

GPUS = {
    # GA102 whitepaper: 82 SMs, boost 1695 MHz, 19.5 Gbps GDDR6X on 384 bits = 936.2 GB/s, FP16
    # and BF16 tensor with fp32 accumulation 71 TFLOPS dense = 256 FMA per clock per SM (an
    # m16n8k16 HMMA is 2048 FMA: 0.125 per clock). Shared memory: 100 KB per SM (programming
    # guide, compute capability 8.6), 1536 threads per SM.
    "rtx3090": Gpu("rtx3090", "RTX 3090", "sm_86", "sm_86", 82, 1695.0, 936.2,
                   _REF_3090_READ_GBPS, "reference design's measured read peak (docs/spec.md 8)",
                   102400, 1536, _rates(4.0, 0.125, True),
                   "NVIDIA Ampere GA102 GPU Architecture whitepaper; CUDA C++ Programming Guide"),
    # A100 whitepaper and the A100 80GB SXM datasheet: 108 SMs, boost 1410 MHz, 2039 GB/s, BF16
    # tensor 312 TFLOPS dense = 1024 FMA per clock per SM (0.5 HMMA m16n8k16 per clock); 164 KB
    # of shared memory per SM, 2048 threads. Counted on the sm_86 SASS (the same source and
    # tiles; the CI build has no sm_80 code).
    "a100": Gpu("a100", "A100 SXM4 80GB", "sm_80", "sm_86", 108, 1410.0, 2039.0,
                round(2039.0 * _READ_FRACTION, 1), "nominal x the RTX 3090's measured fraction",
                167936, 2048, _rates(2.0, 0.5, False),
                "NVIDIA A100 Tensor Core GPU Architecture whitepaper; A100 datasheet"),
    # Ada AD102 whitepaper: 128 SMs, boost 2520 MHz, 21 Gbps GDDR6X on 384 bits = 1008 GB/s, FP16
    # and BF16 tensor with fp32 accumulation 165.2 TFLOPS dense = 256 FMA per clock per SM; 100 KB
    # shared memory per SM (compute capability 8.9), 1536 threads. Counted on the sm_86 SASS.
    "rtx4090": Gpu("rtx4090", "RTX 4090", "sm_89", "sm_86", 128, 2520.0, 1008.0,
                   round(1008.0 * _READ_FRACTION, 1), "nominal x the RTX 3090's measured fraction",
                   102400, 1536, _rates(4.0, 0.125, True),
                   "NVIDIA Ada GPU Architecture whitepaper; CUDA C++ Programming Guide"),
    # H200 datasheet: 4.8 TB/s; GH100 (H100 SXM5 whitepaper): 132 SMs, boost 1980 MHz, 228 KB
    # shared memory per SM, 2048 threads. Tensor rate: mma.sync m16n8k16 bf16 reached 630.3
    # TFLOPS over all SMs in docs/results/decode_h200.json's run (kernelflow.bench.peaks), 0.589 HMMA per
    # clock per SM at 1980 MHz; the nominal 989 TFLOPS is wgmma's, which the portable kernel does
    # not use. Read: the 4638.9 GB/s measured in that run.
    "h200": Gpu("h200", "H200", "sm_90", "sm_90", 132, 1980.0, 4800.0, 4638.9,
                "measured in docs/results/decode_h200.json's run", 233472, 2048,
                _rates(4.0, 630.3e12 / (132 * 1980e6 * 4096), False),
                "H200 datasheet; NVIDIA H100 Tensor Core GPU Architecture whitepaper"),
}

# The reference design's RTX 3090 measurements (docs/spec.md section 8): not this library's.
REFERENCE_3090 = {
    "label": "reference design's RTX 3090 measurements (docs/spec.md section 8), not this library's",
    "read_peak_GBps": 873.8,
    "bf16_peak_TFLOPS": 70.0,
    "memory_bound": {"h_q": 16, "b": ">= 64", "s_k": ">= 4096", "GBps": [821.0, 864.0],
                     "frac_read_peak": [0.94, 0.99]},
    "compute_bound": {"h_q": 128, "b": ">= 16", "TFLOPS": [50.8, 52.6],
                      "frac_bf16_peak": [0.73, 0.75]},
    "speedup_vs_bf16": {"fp8_e4m3": [1.55, 1.70], "int8": [1.54, 1.60], "byte_ratio": 1.79},
}
