// The sm_90a decode kernel's matrix products: S = Q K^T over a tile's column blocks as they land
// (m64n64k16) and O += P V for a warpgroup's half of the output dims (m64n256k16, P from
// registers or from a shared P tile).
#pragma once

#include <cstdint>

#include "cuda/decode/sm90a/sm90a_block.cuh"

namespace kf::cuda::sm90a {

// ---- matrix products ----
template <int N>
__device__ __forceinline__ void reg_fence_all(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}

// Issue S (+)= Q K^T over column blocks [kCb0, kCb1) of the tile in slot s, in the order
// kFirst .. kCb1 - 1, then kCb0 .. kFirst - 1 (the blocks copied first, first), waiting for each
// block's copies (barrier parity `parity`) before its four k16 steps (m64n64, both operands
// K-major in shared memory; block 8's Q from registers). kZero: the first step starts S at zero.
// One committed group; the caller waits for it before it reads s.
template <typename T, int kCb0, int kCb1, int kFirst, bool kZero>
__device__ __forceinline__ void issue_scores(float (&s)[32], const uint32_t (&q8)[16],
                                             const Smem& sm, int slot, uint32_t parity) {
  const uint64_t dq = smem_desc_sw128(sm.q(), 16, 1024);
  const uint64_t dk = smem_desc_sw128(sm.slot(slot), 16, 1024);
#pragma unroll
  for (int n = 0; n < kCb1 - kCb0; ++n) {
    const int cb = kFirst + n < kCb1 ? kFirst + n : kCb0 + (kFirst + n - kCb1);
    mbar_wait(sm.full(slot, cb), parity);
    reg_fence_all(s);
    wgmma_fence();  // s was read by the last tile's softmax
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t off = uint32_t(cb * Tr::kColBlockBytes + kk * 32) >> 4;
      const int acc = kZero && n == 0 && kk == 0 ? 0 : 1;
      if (cb < Tr::kQRegBlock) {
        wgmma_ss_n64<T>(s, dq + off, dk + off, acc);
      } else {
        const uint32_t a[4] = {q8[4 * kk], q8[4 * kk + 1], q8[4 * kk + 2], q8[4 * kk + 3]};
        wgmma_rs_n64<T>(s, a, dk + off, acc);
      }
    }
  }
  wgmma_commit();
}

// V of warpgroup g's output dims in slot s as the MN-major B of an n256 wgmma: column blocks
// 4 g .. 4 g + 3 (8192 bytes apart), 8-token groups 1024 bytes apart; k16 step kt starts 2048 kt
// bytes in.
__device__ __forceinline__ uint64_t v_desc(const Smem& sm, int slot, int g) {
  return smem_desc_sw128(sm.slot(slot) + g * Tr::kOBlocksPerGroup * Tr::kColBlockBytes,
                         Tr::kColBlockBytes, 1024);
}

// Issue O += P V_g with P (q dtype) from registers: pa[4 kt ..] is the A fragment of tokens
// 16 kt .. 16 kt + 15. One committed group.
template <typename T>
__device__ __forceinline__ void issue_pv_regs(float (&o)[128], const uint32_t (&pa)[16],
                                              const Smem& sm, int slot, int g) {
  const uint64_t dv = v_desc(sm, slot, g);
  wgmma_fence();  // o was rescaled and pa written by ordinary instructions
#pragma unroll
  for (int kt = 0; kt < Tr::kBlockN / 16; ++kt) {
    const uint32_t a[4] = {pa[4 * kt], pa[4 * kt + 1], pa[4 * kt + 2], pa[4 * kt + 3]};
    wgmma_rs_n256_bmn<T>(o, a, dv + (uint32_t(kt * 2048) >> 4), 1);
  }
  wgmma_commit();
}

// Issue O += P V_g with P from the shared P tile of slot ps (K-major: tokens 16 kt .. at byte
// 32 kt of its 128-byte rows). One committed group.
template <typename T>
__device__ __forceinline__ void issue_pv_smem(float (&o)[128], const Smem& sm, int ps, int slot,
                                              int g) {
  const uint64_t dp = smem_desc_sw128(sm.p_tile(ps), 16, 1024);
  const uint64_t dv = v_desc(sm, slot, g);
  wgmma_fence();  // o was rescaled by ordinary instructions
#pragma unroll
  for (int kt = 0; kt < Tr::kBlockN / 16; ++kt)
    wgmma_ss_n256_bmn<T>(o, dp + (uint32_t(kt * 32) >> 4), dv + (uint32_t(kt * 2048) >> 4), 1);
  wgmma_commit();
}

}  // namespace kf::cuda::sm90a
