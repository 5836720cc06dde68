// mma.sync.m16n8k16 bf16 x bf16 -> fp32 issue-rate probe: a register-only loop, kAcc independent
// accumulator chains per warp so the tensor-core latency is hidden, no memory traffic. The ceiling
// of the instruction a portable sm_80-class kernel uses (Hopper's wgmma is faster; not measured
// here). FLOPs per mma = 2 * 16 * 8 * 16 = 4096.
#include <cstdint>

#define K_ACC 8

extern "C" __global__ void mma_bf16_f32(int iters, float* __restrict__ sink) {
  // Operands come from threadIdx so the compiler cannot fold them; small bf16 values (2^-7 and
  // 2^-8 in both halves) keep the accumulators finite over long loops.
  const uint32_t t = threadIdx.x & 1u;
  const uint32_t a0 = 0x3C003C00u ^ t, a1 = 0x3C003C00u, a2 = 0x3B803B80u, a3 = 0x3C003C00u ^ t;
  const uint32_t b0 = 0x3B803B80u ^ t, b1 = 0x3C003C00u;
  float c[K_ACC][4];
#pragma unroll
  for (int j = 0; j < K_ACC; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < K_ACC; ++j) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
          "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < K_ACC; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 1234.5f) sink[blockIdx.x] = s;  // never in practice; keeps the chains alive
}
