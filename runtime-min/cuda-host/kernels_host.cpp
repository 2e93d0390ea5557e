// The CUDA kernels, compiled for the host: one block of one thread, so every grid-stride
// loop covers its whole range and every block reduction is the thread's own sum.
#include "host_shim.h"
#include "kernels.cu"
