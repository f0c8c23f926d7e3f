// MpiCommunicator: the collectives over an MPI communicator (Debian's Open MPI), for CPU
// runs started by mpirun, srun --mpi=pmix or a Kubernetes MPIJob. ParallelState splits
// the world into tensor-parallel groups of contiguous ranks and data-parallel groups of
// the ranks that hold the same shard.
#pragma once

#include <memory>
#include <string>

#include "core/comm/communicator.h"
#include "core/device/device.h"

namespace megabatch::comm {

// Starts MPI when this process was launched as an MPI rank (mpirun, srun, MPIJob: their
// environment says so) and returns true; otherwise runs without MPI and returns false.
// Finalizes at exit.
bool init_mpi_if_launched(int* argc, char*** argv);
// True after init_mpi_if_launched started MPI.
bool mpi_active();
// Ends the whole job (every rank) with this exit status: a rank that fails calls it so
// that no other rank waits forever in a collective.
[[noreturn]] void abort_job(int status);

class MpiCommunicator final : public Communicator {
 public:
  // Wraps an MPI_Comm handle given as its integer/pointer value (kept opaque here so that
  // this header does not include mpi.h). Owns (frees) it when owned is true.
  MpiCommunicator(void* comm, bool owned);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(float* data, size_t n, ReduceOp op) override;
  void all_reduce(double* data, size_t n, ReduceOp op) override;
  void all_gather_bytes(const void* in, void* out, size_t bytes) override;
  void reduce_scatter(const float* in, float* out, size_t n) override;
  void broadcast(float* data, size_t n, int root) override;
  void barrier() override;
  // Broadcasts a string from root (used to check that every rank has the same configuration).
  std::string broadcast_string(const std::string& s, int root);
  std::string backend() const override { return "MPI"; }
  void start_all_reduce(float* data, size_t n) override;  // MPI_Iallreduce
  void start_reduce_scatter(const float* in, float* out, size_t n) override;  // MPI_Ireduce_scatter_block
  void progress() override;                               // MPI_Testall
  void wait_all() override;                               // MPI_Waitall

 private:
  struct Pending;                     // the MPI requests started and not yet waited for
  std::unique_ptr<Pending> pending_;
  void* comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

// World, tensor-parallel and data-parallel groups (Megatron's layout: tensor-parallel
// groups are blocks of tp contiguous ranks; a data-parallel group holds the ranks with the
// same position in their block).
struct ParallelState {
  std::unique_ptr<Communicator> world, tp, dp;
  int world_rank = 0, world_size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks on this node (picks this rank's GPU)
  // With MPI active: splits MPI_COMM_WORLD (its size must be a multiple of tp_size).
  // Without: one rank, local communicators.
  static ParallelState create(int tp_size);
  // Puts the TP and DP groups on the run's device with `backend` (--distributed-backend):
  // "nccl" (a GPU per rank), "mpi" (host-staged for GPU tensors), or "auto": NCCL on a GPU
  // when every rank of the job has a GPU of its own, else MPI. Every rank calls it.
  // Errors name the flag: nccl on the CPU, or with ranks sharing a GPU. The world group
  // stays MPI (configuration checks).
  void connect(Device device, const std::string& backend);
  // For the start-up line: "NCCL 2.28.3", "MPI", "MPI, host-staged: 4 ranks share 1 GPU".
  std::string collectives;
  // The MPI groups NCCL was bootstrapped over (kept alive with it).
  std::unique_ptr<Communicator> tp_bootstrap, dp_bootstrap;
};

}  // namespace megabatch::comm
