// NcclCommunicator: the collectives over NCCL, for GPU runs with one process per GPU.
// Device buffers go to NCCL directly, on the communicator's own stream, ordered after the
// run's stream by events (and the run's stream after them); host buffers (the trainer's
// few scalars) are staged through a device buffer. Bootstrapped over MPI: rank 0 of the
// group creates NCCL's unique id and broadcasts it. NCCL refuses two ranks on one GPU;
// ParallelState then keeps the host-staged MPI communicator (core/comm/mpi_communicator.h).
// No CUDA header here: a CPU-only build compiles the callers and reports NCCL absent.
#pragma once

#include <memory>
#include <string>

#include "core/comm/communicator.h"
#include "core/device/device.h"

namespace megabatch::comm {

class MpiCommunicator;

// True in a build with CUDA (and so NCCL, which the CUDA toolkit here ships).
bool nccl_built();
// "2.28.3": the NCCL library this process loaded ("" without NCCL).
std::string nccl_version();

// An NCCL communicator over the ranks of `group` (every rank of it calls this together),
// on GPU `device`; group null: a communicator of this process alone. Errors: a build
// without CUDA, NCCL's own (with its message, e.g. two ranks on one GPU).
std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator* group, Device device);

}  // namespace megabatch::comm
