// The CUDA kernels, compiled for the host: one block of one thread, so every grid-stride
// loop covers its whole range and every block reduction is the thread's own sum.
#include "host_shim.h"
// The operation codes and the kernels' prototypes, which NVRTC gets prepended to the
// source (cuda::kernels::SOURCE).
#include "kernel_header.h"
#include "kernels.cu"
