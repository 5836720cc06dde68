// The Hopper (sm_90a) instructions the sm90a decode kernel is built from, as hand-written PTX:
// warpgroup MMA (wgmma.mma_async m64n32k16 and m64n64k16, fp32 accumulators, both operands in
// shared memory), its shared-memory matrix descriptors (128-byte swizzle), the async-proxy
// fence, mbarriers, setmaxnreg, and the warpgroup's fence / commit / wait. Compiled for sm_90a
// only.
//
// Accumulator layout of one m64nN wgmma (PTX ISA, "wgmma register fragments"): warp w of the
// warpgroup holds rows 16 w + lane / 4 and 16 w + lane / 4 + 8; d[4 j + 2 h + e] is row
// 16 w + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e (j < N / 8, h, e < 2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "src/cuda/decode/sm90a/ is compiled for sm_90a only (CMakeLists.txt: the sm90a family)"
#endif

namespace kf::cuda::sm90a {

// A shared-memory matrix descriptor for a 128-byte-swizzled operand: 8-row atoms of 128-byte
// rows (16-byte chunk c of row r stored at chunk c ^ (r % 8)), each atom 1024-byte aligned.
// addr: the shared-space address of the operand's first element (atom base plus a byte offset
// inside the 128-byte row for a k16 step of a K-major operand). lbo / sbo: the leading and
// stride byte offsets (bits 16-29 and 32-45, in 16-byte units); layout type 1 (bits 62-63) is
// the 128-byte swizzle; the base offset (bits 49-51) is 0 because every atom is 1024-aligned.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}

// Registers the warpgroup wrote become visible to the next wgmma (before the first one of a
// batch whose accumulators or A fragments were touched by ordinary instructions).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across a wgmma boundary.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shared memory written through the generic proxy (st.shared, cp.async) is made visible to the
// async proxy that wgmma reads through: the writing thread fences after its writes completed and
// before it signals the readers.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The accumulator registers of an m64n64 wgmma (32: %0 .. %31) and of an m64n32 one (16:
// %0 .. %15) as asm operands.
#define KF_WGMMA_D32_REGS \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define KF_WGMMA_D16_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define KF_WGMMA_D32_OPERANDS(d) KF_WGMMA_D16_OPERANDS(d), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KF_WGMMA_D16_REGS "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
// One wgmma with fp32 accumulators and inputs of PTX type TY ("bf16" or "f16"):
// shape SHAPE, D registers REGS, A and B from the shared-memory descriptors %A and %B (A K-major,
// B K-major for TRANS_B "0" or MN-major for "1"), D accumulated when the operand %P is not 0;
// scale-a and scale-b are 1.
#define KF_WGMMA_SS(SHAPE, TY, REGS, A, B, P, TRANS_B, D_OPERANDS)                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " REGS ", " A ", " B \
               ", p, 1, 1, 0, " TRANS_B ";\n}\n"                                            \
               : D_OPERANDS(d)                                                             \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// D (64 x 32, fp32) = A (64 x 16, shared, K-major) B (16 x 32, shared, K-major) +
// (accumulate ? D : 0).
template <typename T>
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    KF_WGMMA_SS("m64n32k16", "bf16", KF_WGMMA_D16_REGS, "%16", "%17", "%18", "0",
                KF_WGMMA_D16_OPERANDS);
  else
    KF_WGMMA_SS("m64n32k16", "f16", KF_WGMMA_D16_REGS, "%16", "%17", "%18", "0",
                KF_WGMMA_D16_OPERANDS);
}

// D (64 x 64, fp32) = A (64 x 16, shared, K-major) B (16 x 64, shared, MN-major: 16 rows of 64
// contiguous columns, 8-row groups `sbo` apart) + (accumulate ? D : 0).
template <typename T>
__device__ __forceinline__ void wgmma_ss_bmn(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    KF_WGMMA_SS("m64n64k16", "bf16", KF_WGMMA_D32_REGS, "%32", "%33", "%34", "1",
                KF_WGMMA_D32_OPERANDS);
  else
    KF_WGMMA_SS("m64n64k16", "f16", KF_WGMMA_D32_REGS, "%32", "%33", "%34", "1",
                KF_WGMMA_D32_OPERANDS);
}

#undef KF_WGMMA_SS
#undef KF_WGMMA_D16_REGS
#undef KF_WGMMA_D32_OPERANDS
#undef KF_WGMMA_D16_OPERANDS
#undef KF_WGMMA_D32_REGS

// This warpgroup's registers per thread become kRegs (a multiple of 8 in 24 .. 256): dec gives
// registers back to the block's pool, inc waits until the pool has them.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- mbarriers (shared::cta, 64-bit) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival of this thread (release: its earlier writes are visible to threads that see the
// phase complete).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// Wait until the phase of parity `parity` has completed (acquire). A barrier in its first phase
// counts the phase before it (parity 1) as completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace kf::cuda::sm90a
