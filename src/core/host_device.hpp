// LS_HOST_DEVICE marks functions usable from host code and CUDA device code alike.
#pragma once
#if defined(__CUDACC__)
#define LS_HOST_DEVICE __host__ __device__
#else
#define LS_HOST_DEVICE
#endif
