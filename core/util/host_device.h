// MB_HOST_DEVICE: a function compiled for the host and, by nvcc, for the device too (the
// Philox stream, the loss scaler's update, tensor-parallel shard arithmetic), so the CPU
// reference and the CUDA kernels run the same code.
#pragma once

#if defined(__CUDACC__)
#define MB_HOST_DEVICE __host__ __device__
#else
#define MB_HOST_DEVICE
#endif
