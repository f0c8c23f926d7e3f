// Collectives on tensors of any dtype and device, over a Communicator (which moves host
// float and double buffers). A group of one rank does nothing. CPU f32 and f64 tensors go
// to the communicator as they are; half tensors are reduced in f32 and rounded back; GPU
// tensors are staged through host memory (correct, not fast: the NCCL communicator of the
// multi-GPU work replaces the staging).
#pragma once

#include "core/comm/communicator.h"
#include "core/tensor/tensor.h"

namespace megabatch::comm {

// In place: every rank ends with the reduction over all ranks.
void all_reduce(Communicator& c, const Tensor& t, ReduceOp op);

}  // namespace megabatch::comm
