// Collectives on tensors of any dtype and device, over a Communicator. A group of one rank
// does nothing. CPU f32 and f64 tensors go to the communicator as they are; CPU half
// tensors are reduced in f32 and rounded back. GPU tensors go to the communicator as
// device buffers where it takes them (NCCL) and are staged through host memory otherwise
// (MPI: correct, not fast; it lets several processes share one GPU).
#pragma once

#include "core/comm/communicator.h"
#include "core/tensor/tensor.h"

namespace megabatch::comm {

// In place: every rank ends with the reduction over all ranks.
void all_reduce(Communicator& c, const Tensor& t, ReduceOp op);
// out (size() x in's elements, flat) = every rank's `in`, in rank order.
void all_gather(Communicator& c, const Tensor& in, const Tensor& out);
// in (size() x out's elements, flat) summed over ranks; this rank keeps its slice in out.
void reduce_scatter(Communicator& c, const Tensor& in, const Tensor& out);
// In place: every rank ends with root's values.
void broadcast(Communicator& c, const Tensor& t, int root);
// A non-blocking sum in place (f32): started now, complete after c.wait_all(). CPU tensors
// and NCCL's device tensors overlap what follows; host-staged GPU tensors complete at once.
void start_all_reduce(Communicator& c, const Tensor& t);
// A non-blocking reduce-scatter (f32) as reduce_scatter: `in` and `out` are not touched
// until c.wait_all(); they must not overlap.
void start_reduce_scatter(Communicator& c, const Tensor& in, const Tensor& out);

}  // namespace megabatch::comm
