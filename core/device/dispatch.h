// The one place that knows whether this build compiled the CUDA code.
//
// Dispatch code in core/device and core/ops reaches the implementations under cuda/
// through MB_CUDA(statement): in a CUDA build it is the statement, in a CPU-only build
// (where no cuda/ source is compiled) it is an Error that says how to get a CUDA build.
// Layers, models, the trainer and the tools never use it: they call the dispatching API.
#pragma once

#ifndef MEGABATCH_WITH_CUDA
#error "core/device/dispatch.h is for megabatch_core's own sources (MEGABATCH_WITH_CUDA is set there)"
#endif

namespace megabatch {
// Error: this build has no CUDA support (what to rebuild with).
[[noreturn]] void fail_no_cuda();
}  // namespace megabatch

#if MEGABATCH_WITH_CUDA
#define MB_CUDA(...) __VA_ARGS__
#else
#define MB_CUDA(...) ::megabatch::fail_no_cuda()
#endif
