// Lets src/core be compiled by a plain C++ compiler (CPU backend) and by nvcc (kernels).
#pragma once

#if defined(__CUDACC__)
#define KF_HD __host__ __device__ __forceinline__
#else
#define KF_HD inline
#endif
