// MB_OP_DISPATCH: the one place an op reaches its backend, core/ops/cpu/ or core/ops/cuda/
// (through MB_CUDA, core/device/dispatch.h), marked for the profile (core/device/profile.h).
// Only the dispatching op files (core/ops/<family>.cc) include it.
#pragma once

#include "core/device/dispatch.h"
#include "core/device/profile.h"
#include "core/ops/backends.h"

// Calls the backend of `device` (a CUDA tensor in a CPU-only build: the build error),
// marked for the profile (core/device/profile.h) with the op's family.
#define MB_OP_DISPATCH(device, fn, ...)  \
  do {                                   \
    ::megabatch::profile::OpMark mb_op_mark_(#fn); \
    if ((device).is_cuda()) {            \
      MB_CUDA(::megabatch::ops::cuda::fn(__VA_ARGS__)); \
    } else {                             \
      ::megabatch::ops::cpu::fn(__VA_ARGS__);           \
    }                                    \
  } while (0)
