// Just enough of CUDA for ralpc's kernels to compile and run on the host as one block of one
// thread (blockDim = gridDim = 1): the arithmetic and indexing are what is tested; the
// parallel schedule is not.
#pragma once
#include <math.h>
#include <string.h>

struct HostDim3 {
  unsigned x;
};
static const HostDim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__

// `extern __shared__ float scratch[]` in a kernel names this.
float scratch[1024];

inline void __syncthreads() {}

inline float __int_as_float(unsigned bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

inline float atomicAdd(float* p, float v) {
  float old = *p;
  *p = old + v;
  return old;
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
