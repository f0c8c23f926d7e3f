// core/ops/cuda/flash_attention_backward.cu compiled as C++ for the warp emulator (MB_WARP_EMULATOR, set for
// this test program): its entry points as ops::emulated::*.
#include "core/ops/cuda/flash_attention_backward.cu"
