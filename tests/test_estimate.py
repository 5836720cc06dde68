"""The Ampere estimate (kernelflow.estimate): the SASS parser, the tile-loop finder and the pipe
counts on a small captured-format snippet, the bound model on hand-computed cases, and an
end-to-end run on the built library's sm_86 SASS. The end-to-end test skips when cuobjdump,
nvdisasm or sm_86 code is missing, unless KF_REQUIRE_RESOURCE_CHECK=1 (CI sets it): then it
fails."""
import numpy as np
import pytest

from kernelflow import estimate
from kernelflow import estimate_loop as loop
from kernelflow import estimate_model as model
from kernelflow import estimate_sass as sass
from kernelflow.estimate_gpus import GPUS, REFERENCE_3090
from test_sm86_resources import _missing

# cuobjdump -sass layout: a tile loop [0x30, 0x140] inside a piece loop [0x10, 0x160], with two
# conditional copies of two HMMAs (like the deferred P V), and the trailing self-branch every
# function ends with.
SNIPPET = """
\tcode for sm_86
\t\tFunction : _Z4testv
\t.headerflags\t@"EF_CUDA_SM86 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM86)"
        /*0000*/                   S2R R0, SR_TID.X ;                      /* 0x0000000000007919 */
                                                                           /* 0x000e620000002100 */
        /*0010*/                   MOV R2, RZ ;                            /* 0x000000ff00027202 */
        /*0020*/                   LDS.128 R4, [R0] ;                      /* 0x0000000000047984 */
        /*0030*/                   DEPBAR.LE SB0, 0x0 ;                    /* 0x000080000000791a */
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;           /* 0x0000000000007b1d */
        /*0050*/                   LDSM.16.M88.4 R8, [R0] ;                /* 0x000000000008783b */
        /*0060*/                   HMMA.16816.F32.BF16 R12, R8, R10, R12 ; /* 0x0000000a080c723c */
        /*0070*/                   HMMA.16816.F32.BF16 R16, R8.reuse, R11, R16 ; /* 0x0 */
        /*0080*/               @P0 BRA 0xd0 ;                              /* 0x0000004000000947 */
        /*0090*/                   HMMA.16816.F32.BF16 R20, R8, R10, R20 ; /* 0x0 */
        /*00a0*/                   HMMA.16816.F32.BF16 R24, R8, R10, R24 ; /* 0x0 */
        /*00b0*/                   FMUL R1, R1, R2 ;                       /* 0x0 */
        /*00c0*/                   BRA 0xf0 ;                              /* 0x0 */
        /*00d0*/                   HMMA.16816.F32.BF16 R20, R8, R10, R20 ; /* 0x0 */
        /*00e0*/                   HMMA.16816.F32.BF16 R24, R8, R10, R24 ; /* 0x0 */
        /*00f0*/                   MUFU.EX2 R3, R3 ;                       /* 0x0 */
        /*0100*/                   F2FP.BF16.F32.PACK_AB R4, R5, R6 ;      /* 0x0 */
        /*0110*/                   LDGSTS.E.BYPASS.128 [R23], desc[UR12][R60.64] ; /* 0x0 */
        /*0120*/                   IADD3 R21, R21, 0x20, RZ ;              /* 0x0 */
        /*0130*/                   ISETP.GE.AND P1, PT, R21, R22, PT ;     /* 0x0 */
        /*0140*/              @!P1 BRA 0x30 ;                              /* 0x0 */
        /*0150*/                   STG.E.64 [R2.64], R4 ;                  /* 0x0 */
        /*0160*/               @P2 BRA 0x10 ;                              /* 0x0 */
        /*0170*/                   EXIT ;                                  /* 0x0 */
        /*0180*/                   BRA 0x180;                              /* 0x0 */
"""


@pytest.fixture(scope="module")
def snippet():
    kernels = sass.parse_sass(SNIPPET)
    assert list(kernels) == [("sm_86", "_Z4testv")]
    return kernels[("sm_86", "_Z4testv")]


def test_parser_reads_addresses_guards_opcodes(snippet):
    assert len(snippet) == 25
    first, bra = snippet[0], snippet[8]
    assert (first.addr, first.guard, first.opcode, first.op) == (0, "", "S2R", "S2R")
    assert first.operands == "R0, SR_TID.X"
    assert (bra.addr, bra.guard, bra.op, loop.branch_target(bra)) == (0x80, "@P0", "BRA", 0xD0)
    assert snippet[20].guard == "@!P1"


def test_loops_and_the_tile_loop(snippet):
    assert loop.loops(snippet) == [(0x30, 0x140), (0x10, 0x160), (0x180, 0x180)]
    tile = loop.tile_loop(snippet)
    assert tile == (0x30, 0x140)
    assert loop.enclosing_loop(snippet, tile) == (0x10, 0x160)
    assert loop.enclosing_loop(snippet, (0x10, 0x160)) is None


def test_no_tile_loop_without_hmma_and_barrier(snippet):
    without_bar = [i for i in snippet if i.op != "BAR"]
    with pytest.raises(ValueError, match="HMMA and BAR"):
        loop.tile_loop(without_bar)


def test_basic_blocks_and_successors(snippet):
    blocks = loop.basic_blocks(snippet)
    starts = [snippet[b.first].addr for b in blocks]
    assert starts == [0x0, 0x10, 0x30, 0x90, 0xD0, 0xF0, 0x150, 0x170, 0x180]
    by_start = dict(zip(starts, blocks))
    assert sorted(by_start[0x30].succs) == [3, 4]  # BRA 0xd0 taken or not
    assert by_start[0x90].succs == [5]  # unconditional BRA 0xf0
    assert sorted(by_start[0xF0].succs) == [2, 6]  # back to the head, or out
    assert by_start[0x170].succs == []  # EXIT


def test_pipe_units():
    def ins(opcode):
        return sass.Instr(0, "", opcode, "")

    assert loop.units(ins("HMMA.16816.F32.BF16")) == 1.0
    assert loop.units(ins("HMMA.1688.F32.TF32")) == 0.5
    assert loop.units(ins("LDSM.16.MT88.4")) == 4.0
    assert loop.units(ins("LDSM.16.M88.2")) == 2.0
    assert loop.units(ins("LDS.128")) == 4.0
    assert loop.units(ins("STS.64")) == 2.0
    assert loop.units(ins("LDS.U16")) == 1.0
    assert loop.units(ins("LDGSTS.E.BYPASS.128")) == 4.0
    assert [loop.pipe_of(ins(o)) for o in ("FFMA", "IMAD.MOV.U32", "F2FP.BF16.F32.PACK_AB",
                                            "MUFU.EX2", "SHFL.BFLY", "LDGDEPBAR", "UMOV")] == \
        ["fp32", "int", "conversion", "mufu", "shared", "barrier", "other"]


def test_tile_counts_weight_the_conditional_tensor_blocks(snippet):
    c = loop.count_loop(snippet, (0x30, 0x140), tensor_per_trip=4)
    assert (c.tensor_always, c.tensor_conditional, c.conditional_tensor_weight) == (2, 4, 0.5)
    assert c.instructions == 18
    assert c.issue == 15.0  # 12 always + (4 + 2) conditional tensor instructions at 0.5
    assert c.pipes == {"tensor": 4.0, "fp32": 0.5, "int": 2.0, "conversion": 1.0, "mufu": 1.0,
                       "shared": 4.0, "global": 4.0, "barrier": 2.0, "other": 2.5}
    unweighted = loop.count_loop(snippet, (0x30, 0x140))
    assert unweighted.pipes["tensor"] == 6.0 and unweighted.issue == 18.0


def test_piece_counts_outside_the_tile_loop(snippet):
    pipes, issue = loop.count_outside(snippet, (0x10, 0x160), (0x30, 0x140))
    assert issue == 4.0
    assert (pipes["int"], pipes["shared"], pipes["global"], pipes["other"]) == (1.0, 4.0, 2.0, 1.0)


def _kernel(traits, fmt=0, dtype="13__nv_bfloat16", small=0):
    mf, rg, bn, st, kv8, defer = traits
    name = (f"_ZN2kf4cuda22mla_decode_sm80_kernelINS0_15MlaDecodeTraitsILi{mf}ELi{rg}ELi{bn}ELi{st}"
            f"ELb{kv8}ELb{defer}EEE{dtype}Li{fmt}ELb{small}EEEvNS_15MlaDecodeParamsE")
    return model.parse_kernel_name(name)


M16, M32, M64, M8 = (1, 1, 32, 2, 0, 0), (2, 1, 16, 4, 0, 0), (2, 2, 16, 3, 0, 1), (1, 1, 32, 4, 1, 0)


def test_kernel_names_give_tiles_and_shared_memory():
    k = _kernel(M64)
    assert (k.block_m, k.block_n, k.warps, k.defer_pv, k.dtype, k.small_pages) == \
        (64, 16, 8, True, "bf16", False)
    assert _kernel(M16, dtype="6__half", small=1).dtype == "fp16"
    assert model.parse_kernel_name("_ZN2kf4cuda18mla_combine_kernelEv") is None
    # kSmemBytes as src/cuda/decode/sm80/mla_decode_kernel.cuh states them
    assert [_kernel(t, f).smem_bytes for t, f in ((M16, 0), (M32, 0), (M64, 0), (M8, 1))] == \
        [86992, 89168, 85824, 96272]
    assert all(_kernel(t).tensor_per_tile == 68 for t in (M16, M32, M64))


def test_kernel_choice_and_occupancy():
    ks = [_kernel(M16), _kernel(M32), _kernel(M64), _kernel(M8, 1), _kernel(M8, 2)]
    pick = model.choose_kernel
    assert pick(ks, 16, "bf16", False).block_m == 16
    assert pick(ks, 32, "bf16", False).block_m == 32
    assert pick(ks, 128, "bf16", False).block_m == 64
    assert pick(ks, 128, "bf16", True).block_m == 32
    assert pick(ks, 128, "int8", False).fmt == 2
    # two 32-row blocks fit the H200 (228 KB, 255 registers: 2 x 32768), one fits the RTX 3090
    assert model.blocks_per_sm(_kernel(M32), 255, GPUS["h200"]) == 2
    assert model.blocks_per_sm(_kernel(M32), 255, GPUS["rtx3090"]) == 1
    assert model.blocks_per_sm(_kernel(M64), 253, GPUS["a100"]) == 1


def test_schedule_from_the_library():
    # seqlens 128 and 192 are 2 and 3 tiles of 64; with fixed cost 1, T = 3 + 4 = 7 over 3
    # workers: cuts at 2 (request 0, tile 1) and 4 (request 1's fixed part: its start).
    meta = np.asarray(__import__("kernelflow").get_mla_metadata(
        np.array([128, 192], np.int32), 16, num_workers=3))
    assert model.worker_pieces(meta, [128, 192]) == [[64], [64], [192]]
    assert model.split_pieces(meta) == 2


def test_memory_bytes_by_hand():
    assert model.memory_bytes(2, 128, 16, "bf16", 0) == \
        2 * 128 * 1152 + 2 * 16 * 1152 + 2 * 16 * 1028 + 2 * 2 * 4
    assert model.memory_bytes(1, 64, 16, "int8", 2) - model.memory_bytes(1, 64, 16, "int8", 0) == \
        2 * 2 * 16 * 513 * 4


def test_compute_cycles_by_hand():
    tile = loop.LoopCounts(dict.fromkeys(loop.PIPES, 0.0), 100.0, 100, 68, 0, 1.0)
    tile.pipes.update(tensor=68.0, fp32=40.0, int=40.0)
    piece = (dict.fromkeys(loop.PIPES, 0.0), 400.0)
    cycles = model.compute_cycles(tile, piece, tiles=10, pieces=1, warps=4, blocks=1,
                                  rates=GPUS["rtx3090"].rates)
    assert cycles["tensor"] == 4 * 10 * 68 / 0.125
    assert cycles["issue"] == 4 * (10 * 100 + 400) / 4
    assert cycles["fp32+int"] == 4 * 10 * 80 / 4


@pytest.fixture(scope="module")
def sm86_estimate():
    library = estimate.find_library()
    if library is None:
        _missing("libkernelflow not found (set KF_LIBRARY or build the package)")
    if sass.find_cuobjdump() is None:
        _missing("cuobjdump not found (CUDA toolkit or pip nvidia-cuda-cuobjdump)")
    if sass.find_nvdisasm() is None:
        _missing("nvdisasm, which cuobjdump -sass runs, not found (CUDA toolkit or pip "
                 "nvidia-cuda-nvdisasm)")
    shapes = [(h, b, 4096, f) for f in ("bf16", "fp8_e4m3") for h in (16, 128) for b in (1, 64)]
    try:
        return estimate.run_estimate(library, ("rtx3090",), shapes)
    except FileNotFoundError as e:
        _missing(f"no sm_86 decode code: {e}")


def test_sm86_kernels_counted(sm86_estimate):
    rows = [k for k in sm86_estimate["kernels"] if k["arch"] == "sm_86"]
    assert {(k["format"], k["tile"]) for k in rows} == {
        ("bf16", "16x32"), ("bf16", "32x16"), ("bf16", "64x16"), ("fp8_e4m3", "16x32"),
        ("int8", "16x32")}
    for k in rows:
        assert k["per_warp_tile"]["tensor"] == 68, k  # the tile's math, per warp
        assert k["per_warp_tile"]["barrier"] >= 2 and k["per_warp_tile"]["shared"] > 0, k
        assert 68 < k["issue_per_warp_tile"] < 5000, k
    assert next(k for k in rows if k["tile"] == "64x16")["conditional_tensor_weight"] == 0.5


def test_sm86_rtx3090_estimate_is_sane(sm86_estimate):
    rows = {(r["format"], r["h_q"], r["b"]): r for r in sm86_estimate["rows"]}
    mem = rows[("bf16", 16, 64)]
    assert mem["bound"] == "memory"
    assert 0.9 * REFERENCE_3090["read_peak_GBps"] < mem["GBps"] <= REFERENCE_3090["read_peak_GBps"]
    comp = rows[("bf16", 128, 64)]
    assert comp["bound"] == "tensor" and comp["tile"] == "64x16"
    assert 40 < comp["TFLOPS"] < 75  # at most the nominal 71 TFLOPS
    speedup = mem["us"] / rows[("fp8_e4m3", 16, 64)]["us"]
    assert 1.5 < speedup < 1.8  # at most the byte ratio 1152 / 644
    assert all(r["us"] > 0 for r in rows.values())
    assert "rtx3090_vs_reference" in sm86_estimate
