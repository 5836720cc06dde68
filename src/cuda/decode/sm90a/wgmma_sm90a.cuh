// The Hopper (sm_90a) instructions the sm90a decode kernels and the fused layer's sm_90a skinny
// GEMM are built from, as hand-written PTX: warpgroup MMA (wgmma.mma_async m64nNk16 with N from
// 8 to 256, fp32 accumulators, A from shared memory or registers, B from shared memory K- or
// MN-major), its shared-memory matrix descriptors (128-byte swizzle), the async-proxy fence,
// mbarriers with transaction counts, the tensor copy (TMA) into shared memory, and the
// warpgroup's fence / commit / wait. Compiled for sm_90a only.
//
// Accumulator layout of one m64nN wgmma (PTX ISA, "wgmma register fragments"): warp w of the
// warpgroup holds rows 16 w + lane / 4 and 16 w + lane / 4 + 8; d[4 j + 2 h + e] is row
// 16 w + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e (j < N / 8, h, e < 2). The A fragment of
// a k16 step from registers: a[0] = row 16 w + lane / 4, columns 2 (lane % 4) + {0, 1};
// a[1] = row + 8, same columns; a[2], a[3] = the same rows, columns + 8.
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

// The accumulator registers of an m64n256 wgmma (128: %0 .. %127), of an m64n64 one (32) and
// their asm operands.
#define KF_WGMMA_D32_REGS \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define KF_WGMMA_D128_REGS \
  "{" \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63," \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127" \
  "}"
#define KF_WGMMA_D8_REGS "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define KF_WGMMA_D8_ONLY(d) KF_WGMMA_D8_OPERANDS(d, 0)
#define KF_WGMMA_D8_OPERANDS(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define KF_WGMMA_D32_OPERANDS(d) \
  KF_WGMMA_D8_OPERANDS(d, 0), KF_WGMMA_D8_OPERANDS(d, 8), KF_WGMMA_D8_OPERANDS(d, 16), \
      KF_WGMMA_D8_OPERANDS(d, 24)
#define KF_WGMMA_D128_OPERANDS(d)                                                          \
  KF_WGMMA_D32_OPERANDS(d), KF_WGMMA_D8_OPERANDS(d, 32), KF_WGMMA_D8_OPERANDS(d, 40),      \
      KF_WGMMA_D8_OPERANDS(d, 48), KF_WGMMA_D8_OPERANDS(d, 56), KF_WGMMA_D8_OPERANDS(d, 64), \
      KF_WGMMA_D8_OPERANDS(d, 72), KF_WGMMA_D8_OPERANDS(d, 80), KF_WGMMA_D8_OPERANDS(d, 88), \
      KF_WGMMA_D8_OPERANDS(d, 96), KF_WGMMA_D8_OPERANDS(d, 104),                           \
      KF_WGMMA_D8_OPERANDS(d, 112), KF_WGMMA_D8_OPERANDS(d, 120)
// bf16 inputs (else fp16).
template <typename T>
constexpr bool kIsBf16 = std::is_same<T, __nv_bfloat16>::value;

// One wgmma with fp32 accumulators: shape SHAPE, inputs of PTX type TY ("bf16" or "f16"), D
// registers REGS, B from the shared-memory descriptor %B (K-major for TRANS_B "0", MN-major for
// "1"), D accumulated when the operand %P is not 0; scale-a and scale-b are 1.
//   SS: A from the shared-memory descriptor %A (K-major);
//   RS: A from four registers (%A0 .. : the A fragment of the PTX ISA's "wgmma register
//       fragments", two 16-bit values each, the m16n8k16 A layout per warp of 16 rows).
#define KF_WGMMA_SS(SHAPE, TY, REGS, A, B, P, TRANS_B, D_OPERANDS)                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " REGS ", " A ", " B \
               ", p, 1, 1, 0, " TRANS_B ";\n}\n"                                            \
               : D_OPERANDS(d)                                                             \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define KF_WGMMA_RS(SHAPE, TY, REGS, A0, B, P, TRANS_B, D_OPERANDS)                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " REGS ", " A0 ", " B \
               ", p, 1, 1, " TRANS_B ";\n}\n"                                                \
               : D_OPERANDS(d)                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
// OP (KF_WGMMA_SS or KF_WGMMA_RS) for the PTX type of T.
#define KF_WGMMA_T(OP, SHAPE, ...)       \
  if constexpr (kIsBf16<T>)              \
    OP(SHAPE, "bf16", __VA_ARGS__);      \
  else                                   \
    OP(SHAPE, "f16", __VA_ARGS__)

// D (64 x 64, fp32) = A (64 x 16, shared, K-major) B (16 x 64, shared, K-major: 64 rows of 16
// k values) + (accumulate ? D : 0).
template <typename T>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                             int accumulate) {
  KF_WGMMA_T(KF_WGMMA_SS, "m64n64k16", KF_WGMMA_D32_REGS, "%32", "%33", "%34", "0",
             KF_WGMMA_D32_OPERANDS);
}

// D (64 x 64, fp32) = A (64 x 16, registers) B (16 x 64, shared, K-major) + (accumulate ? D : 0).
template <typename T>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4],
                                             uint64_t desc_b, int accumulate) {
  KF_WGMMA_T(KF_WGMMA_RS, "m64n64k16", KF_WGMMA_D32_REGS, "{%32,%33,%34,%35}", "%36", "%37", "0",
             KF_WGMMA_D32_OPERANDS);
}

// D (64 x 256, fp32) = A (64 x 16, registers) B (16 x 256, shared, MN-major: 16 rows of four
// 64-column blocks the descriptor's leading byte offset apart, 8-row groups its stride byte
// offset apart) + (accumulate ? D : 0).
template <typename T>
__device__ __forceinline__ void wgmma_rs_n256_bmn(float (&d)[128], const uint32_t (&a)[4],
                                                  uint64_t desc_b, int accumulate) {
  KF_WGMMA_T(KF_WGMMA_RS, "m64n256k16", KF_WGMMA_D128_REGS, "{%128,%129,%130,%131}", "%132",
             "%133", "1", KF_WGMMA_D128_OPERANDS);
}

// D (64 x 256, fp32) = A (64 x 16, shared, K-major) B (16 x 256, shared, MN-major as above) +
// (accumulate ? D : 0).
template <typename T>
__device__ __forceinline__ void wgmma_ss_n256_bmn(float (&d)[128], uint64_t desc_a,
                                                  uint64_t desc_b, int accumulate) {
  KF_WGMMA_T(KF_WGMMA_SS, "m64n256k16", KF_WGMMA_D128_REGS, "%128", "%129", "%130", "1",
             KF_WGMMA_D128_OPERANDS);
}

// The token-major 8-bit kernel's products (mla_decode_sm90a_kv8.cuh), N = 16 query rows:
// D (64 x 16, fp32) = A (64 x 16, registers) B (16 x 16, shared, K-major) + (accumulate ? D : 0);
// fp16 inputs whatever T (the 8-bit codes and q scaled into fp16's range).
__device__ __forceinline__ void wgmma_rs_n16_f16(float (&d)[8], const uint32_t (&a)[4],
                                                 uint64_t desc_b, int accumulate) {
  KF_WGMMA_RS("m64n16k16", "f16", KF_WGMMA_D8_REGS, "{%8,%9,%10,%11}", "%12", "%13", "0",
              KF_WGMMA_D8_ONLY);
}
// D (64 x 16, fp32) = A (64 x 16, shared, K-major) B (16 x 16, shared, K-major) + (accumulate ?
// D : 0), bf16 inputs (the cache's rope part and q_pe).
__device__ __forceinline__ void wgmma_ss_n16_bf16(float (&d)[8], uint64_t desc_a, uint64_t desc_b,
                                                  int accumulate) {
  KF_WGMMA_SS("m64n16k16", "bf16", KF_WGMMA_D8_REGS, "%8", "%9", "%10", "0", KF_WGMMA_D8_ONLY);
}

// The fused layer's skinny GEMM (src/cuda/layer/sm90a/skinny_gemm_sm90a.cu): D (64 x N, fp32) =
// A (64 x 16, shared, K-major) B (16 x N, shared, K-major: N rows of 16 k values) + D, bf16
// inputs, N = 8, 16, 32, 64 or 128 (d holds N / 2 accumulators per thread).
#define KF_WGMMA_D4_REGS "{%0,%1,%2,%3}"
#define KF_WGMMA_D4_OPERANDS(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define KF_WGMMA_D16_REGS "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define KF_WGMMA_D16_OPERANDS(d) KF_WGMMA_D8_OPERANDS(d, 0), KF_WGMMA_D8_OPERANDS(d, 8)
#define KF_WGMMA_D64_REGS \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define KF_WGMMA_D64_OPERANDS(d)                                                        \
  KF_WGMMA_D32_OPERANDS(d), KF_WGMMA_D8_OPERANDS(d, 32), KF_WGMMA_D8_OPERANDS(d, 40), \
      KF_WGMMA_D8_OPERANDS(d, 48), KF_WGMMA_D8_OPERANDS(d, 56)
template <int N>
__device__ __forceinline__ void wgmma_ss_bf16_acc(float (&d)[N / 2], uint64_t desc_a,
                                                  uint64_t desc_b) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128, "N: 8 .. 128, powers of 2");
  constexpr int accumulate = 1;
  if constexpr (N == 8)
    KF_WGMMA_SS("m64n8k16", "bf16", KF_WGMMA_D4_REGS, "%4", "%5", "%6", "0",
                KF_WGMMA_D4_OPERANDS);
  else if constexpr (N == 16)
    KF_WGMMA_SS("m64n16k16", "bf16", KF_WGMMA_D8_REGS, "%8", "%9", "%10", "0", KF_WGMMA_D8_ONLY);
  else if constexpr (N == 32)
    KF_WGMMA_SS("m64n32k16", "bf16", KF_WGMMA_D16_REGS, "%16", "%17", "%18", "0",
                KF_WGMMA_D16_OPERANDS);
  else if constexpr (N == 64)
    KF_WGMMA_SS("m64n64k16", "bf16", KF_WGMMA_D32_REGS, "%32", "%33", "%34", "0",
                KF_WGMMA_D32_OPERANDS);
  else
    KF_WGMMA_SS("m64n128k16", "bf16", KF_WGMMA_D64_REGS, "%64", "%65", "%66", "0",
                KF_WGMMA_D64_OPERANDS);
}

#undef KF_WGMMA_D4_REGS
#undef KF_WGMMA_D4_OPERANDS
#undef KF_WGMMA_D16_REGS
#undef KF_WGMMA_D16_OPERANDS
#undef KF_WGMMA_D64_REGS
#undef KF_WGMMA_D64_OPERANDS
#undef KF_WGMMA_T
#undef KF_WGMMA_SS
#undef KF_WGMMA_RS
#undef KF_WGMMA_D128_OPERANDS
#undef KF_WGMMA_D32_OPERANDS
#undef KF_WGMMA_D8_ONLY
#undef KF_WGMMA_D8_REGS
#undef KF_WGMMA_D8_OPERANDS
#undef KF_WGMMA_D128_REGS
#undef KF_WGMMA_D32_REGS

// ---- register budget per warpgroup ----
// Every thread of the warpgroup executes it: the warpgroup's registers per thread become N
// (a multiple of 8, 24..256), taken from the block's pool (kTake) or given back to it.
template <bool kTake, int N>
__device__ __forceinline__ void setmaxnreg() {
  if constexpr (kTake)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
  else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- mbarriers (shared::cta, 64-bit) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// The barriers' initialization made visible to the tensor copies that complete on them (before
// the block's first barrier synchronization).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival of this thread (release: its earlier writes are visible to threads that see the
// phase complete).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// Wait until the phase of parity `parity` has completed (acquire). A barrier in its first phase
// counts the phase before it (parity 1) as completed. The retry loop is inside the asm, so the
// compiler sees no divergent branch between the wgmmas around a wait.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nKF_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra KF_MBAR_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Arm barrier `bar` (one arrival) for `bytes` more bytes of asynchronous copies this phase; the
// phase completes when the arrival is made and the copies have delivered those bytes (in either
// order).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// A 4-byte cp.async (src_bytes 0: zero-fill).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// ---- tensor copies (TMA) ----
// Copy the box at coordinates (c0, c1, c2) of the 3-D tensor map `map` (a __grid_constant__
// kernel parameter) into shared memory at dst (1024-aligned for the 128-byte swizzle); the copy
// completes its bytes on barrier `bar`. Elements outside the tensor are written as zeros. The
// lines are marked evict-first in L2: the cache is streamed once per call (the other row tile of
// the request reads them at about the same time).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
      : "memory");
}
// The same for the box at (c0, c1) of a 2-D tensor map.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int c0, int c1,
                                            uint32_t bar) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- shared-memory stores by address ----
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

// ---- bulk stores (shared -> global) ----
// Copy `bytes` (a multiple of 16) from shared memory at src to global memory at dst (both
// 16-byte aligned) as one asynchronous bulk copy in this thread's current bulk group; the
// keep-in-L2 variant marks the lines evict-last (split partials, read back by the combine).
// The source must be written and fenced for the async proxy (fence_proxy_async_smem) first.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_store_keep(void* dst, uint32_t src, uint32_t bytes,
                                                uint64_t policy) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;\n" ::"l"(
          dst),
      "r"(src), "r"(bytes), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk stores have read their shared-memory source (it may be overwritten).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk stores are complete (their global writes performed).
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

}  // namespace kf::cuda::sm90a
