// Lets src/core be compiled by a plain C++ compiler (CPU backend) and by nvcc (kernels).
// KF_HD marks a function for host and device (always inlined on the device); it does not carry
// `inline`: every header function says `KF_HD inline` itself, which is valid in both compilers.
#pragma once

#if defined(__CUDACC__)
#define KF_HD __host__ __device__ __attribute__((always_inline))
#else
#define KF_HD
#endif
