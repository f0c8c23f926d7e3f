#include "core/comm/mpi_communicator.h"

// the C API only (Open MPI would otherwise pull in its removed C++ bindings)
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/comm/nccl_communicator.h"
#include "core/comm/watchdog.h"
#include "core/device/runtime.h"
#include "core/util/error.h"

namespace megabatch::comm {
namespace {

bool g_active = false;

MPI_Comm handle(void* c) { return reinterpret_cast<MPI_Comm>(c); }

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("MPI ", what, " failed: ", std::string(msg, static_cast<size_t>(len)));
}

// An MPI count is an int: a larger buffer is refused with its size rather than cut to a wrong
// (or negative) count.
int mpi_count(size_t n, const char* what) {
  check(n <= static_cast<size_t>(INT32_MAX), "MPI ", what, " of ", n, " elements: more than an MPI count holds (",
        INT32_MAX, ")");
  return static_cast<int>(n);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool init_mpi_if_launched(int* argc, char*** argv) {
  // Open MPI's mpirun, PMIx launchers (srun --mpi=pmix, MPIJob) and PMI-1 set these.
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
  if (!launched) return false;
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "init");
  // Errors come back as codes (and become Errors here) instead of aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_active = true;
  std::atexit(finalize_at_exit);
  return true;
}

bool mpi_active() { return g_active; }

void abort_job(int status) {
  if (g_active) MPI_Abort(MPI_COMM_WORLD, status);
  std::exit(status);
}

struct MpiCommunicator::Pending {
  std::vector<MPI_Request> requests;
};

MpiCommunicator::MpiCommunicator(void* comm, bool owned)
    : pending_(std::make_unique<Pending>()), comm_(comm), owned_(owned) {
  MPI_Comm_rank(handle(comm_), &rank_);
  MPI_Comm_size(handle(comm_), &size_);
}

MpiCommunicator::~MpiCommunicator() {
  if (owned_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm c = handle(comm_);
      MPI_Comm_free(&c);
    }
  }
}

void MpiCommunicator::all_reduce(float* data, size_t n, ReduceOp op) {
  const CollectiveWait wait("all-reduce", name());
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(n, "all-reduce"), MPI_FLOAT, mpi_op(op), handle(comm_)), "all-reduce");
}

void MpiCommunicator::all_reduce(double* data, size_t n, ReduceOp op) {
  const CollectiveWait wait("all-reduce", name());
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(n, "all-reduce"), MPI_DOUBLE, mpi_op(op), handle(comm_)), "all-reduce");
}

void MpiCommunicator::all_gather_bytes(const void* in, void* out, size_t bytes) {
  const CollectiveWait wait("all-gather", name());
  // in the widest unit that divides the bytes, so that large buffers keep within an MPI count
  const size_t unit = bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : bytes % 2 == 0 ? 2 : 1;
  const MPI_Datatype type = unit == 8 ? MPI_UINT64_T : unit == 4 ? MPI_UINT32_T : unit == 2 ? MPI_UINT16_T : MPI_BYTE;
  const size_t count = bytes / unit;
  const int c = mpi_count(count, unit == 1 ? "all-gather (bytes)" : "all-gather (words)");
  check_mpi(MPI_Allgather(in, c, type, out, c, type, handle(comm_)), "all-gather");
}

void MpiCommunicator::reduce_scatter(const float* in, float* out, size_t n) {
  const CollectiveWait wait("reduce-scatter", name());
  mpi_count(n * static_cast<size_t>(size_), "reduce-scatter (whole input)");
  check_mpi(MPI_Reduce_scatter_block(in, out, static_cast<int>(n), MPI_FLOAT, MPI_SUM, handle(comm_)), "reduce-scatter");
}

void MpiCommunicator::broadcast(float* data, size_t n, int root) {
  const CollectiveWait wait("broadcast", name());
  check_mpi(MPI_Bcast(data, mpi_count(n, "broadcast"), MPI_FLOAT, root, handle(comm_)), "broadcast");
}

void MpiCommunicator::start_all_reduce(float* data, size_t n) {
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(n, "all-reduce"), MPI_FLOAT, MPI_SUM, handle(comm_), &r), "all-reduce (start)");
  pending_->requests.push_back(r);
}

void MpiCommunicator::start_reduce_scatter(const float* in, float* out, size_t n) {
  mpi_count(n * static_cast<size_t>(size_), "reduce-scatter (whole input)");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ireduce_scatter_block(in, out, static_cast<int>(n), MPI_FLOAT, MPI_SUM, handle(comm_), &r),
            "reduce-scatter (start)");
  pending_->requests.push_back(r);
}

void MpiCommunicator::progress() {
  if (pending_->requests.empty()) return;
  int done = 0;
  check_mpi(MPI_Testall(static_cast<int>(pending_->requests.size()), pending_->requests.data(), &done, MPI_STATUSES_IGNORE),
            "non-blocking collectives (progress)");
}

void MpiCommunicator::wait_all() {
  if (pending_->requests.empty()) return;
  const CollectiveWait wait("gradient-bucket reduction", name());
  check_mpi(MPI_Waitall(static_cast<int>(pending_->requests.size()), pending_->requests.data(), MPI_STATUSES_IGNORE),
            "non-blocking collectives (wait)");
  pending_->requests.clear();
}

void MpiCommunicator::barrier() {
  const CollectiveWait wait("barrier", name());
  check_mpi(MPI_Barrier(handle(comm_)), "barrier");
}

std::string MpiCommunicator::broadcast_string(const std::string& s, int root) {
  const CollectiveWait wait("broadcast", name());
  int n = mpi_count(s.size(), "broadcast (string)");
  check_mpi(MPI_Bcast(&n, 1, MPI_INT, root, handle(comm_)), "broadcast");
  std::string out = rank_ == root ? s : std::string(static_cast<size_t>(n), '\0');
  check_mpi(MPI_Bcast(out.data(), n, MPI_CHAR, root, handle(comm_)), "broadcast");
  return out;
}

ParallelState ParallelState::create(int tp_size) {
  ParallelState ps;
  if (!g_active) {
    check(tp_size == 1, "tensor_model_parallel_size ", tp_size, " needs ", tp_size,
          " processes: launch with mpirun -np N (N a multiple of ", tp_size, "), srun or an MPIJob");
    ps.world = std::make_unique<LocalCommunicator>();
    ps.tp = std::make_unique<LocalCommunicator>();
    ps.dp = std::make_unique<LocalCommunicator>();
    return ps;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &ps.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ps.world_size);
  check(tp_size >= 1 && ps.world_size % tp_size == 0, "tensor_model_parallel_size ", tp_size,
        " does not divide the ", ps.world_size, " ranks of this job; launch a multiple of it");
  MPI_Comm tp = MPI_COMM_NULL, dp = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, ps.world_rank / tp_size, ps.world_rank % tp_size, &tp), "split (tp)");
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, ps.world_rank % tp_size, ps.world_rank / tp_size, &dp), "split (dp)");
  MPI_Comm_set_errhandler(tp, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(dp, MPI_ERRORS_RETURN);
  MPI_Comm node = MPI_COMM_NULL;  // the ranks that share this node's memory (and GPUs)
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ps.world_rank, MPI_INFO_NULL, &node), "split (node)");
  MPI_Comm_rank(node, &ps.local_rank);
  MPI_Comm_size(node, &ps.local_size);
  MPI_Comm_free(&node);
  ps.world = std::make_unique<MpiCommunicator>(reinterpret_cast<void*>(MPI_COMM_WORLD), false);
  ps.tp = std::make_unique<MpiCommunicator>(reinterpret_cast<void*>(tp), true);
  ps.dp = std::make_unique<MpiCommunicator>(reinterpret_cast<void*>(dp), true);
  ps.tp->set_name("tensor-parallel");
  ps.dp->set_name("data-parallel");
  return ps;
}

void ParallelState::connect(Device device, const std::string& backend) {
  check(backend == "auto" || backend == "nccl" || backend == "mpi", "--distributed-backend: auto, nccl or mpi, not '",
        backend, "'");
  const std::string host = world_size > 1 ? "MPI" : "local";
  collectives = host;
  if (device.is_cpu()) {
    check(backend != "nccl", "--distributed-backend nccl needs GPUs (--device cuda); on the CPU the collectives are MPI's");
    return;
  }
  if (backend == "mpi" || (backend == "auto" && world_size == 1)) {
    collectives = host + (world_size > 1 ? ", host-staged" : "");
    return;
  }
  // NCCL needs a GPU per rank: any node with more ranks than visible GPUs makes the whole
  // job host-staged (decided together, so every rank picks the same backend)
  const int gpus = runtime::cuda_device_count();
  double sharing = local_size > gpus ? 1.0 : 0.0;
  if (world_size > 1) world->all_reduce(&sharing, 1, ReduceOp::kMax);
  if (sharing != 0.0) {
    check(backend != "nccl", "--distributed-backend nccl: ", local_size, " ranks on this node share ", gpus, " GPU",
          gpus == 1 ? "" : "s", ", and NCCL needs a GPU per rank; launch at most ", gpus,
          " ranks per node, or use --distributed-backend mpi (host-staged collectives)");
    collectives = "MPI, host-staged: " + std::to_string(local_size) + " ranks share " + std::to_string(gpus) + " GPU" +
                  (gpus == 1 ? "" : "s");
    return;
  }
  auto* tp_group = dynamic_cast<MpiCommunicator*>(tp.get());
  auto* dp_group = dynamic_cast<MpiCommunicator*>(dp.get());
  auto tp_nccl = make_nccl_communicator(tp_group, device);
  auto dp_nccl = make_nccl_communicator(dp_group, device);
  tp_nccl->set_name(tp->name());
  dp_nccl->set_name(dp->name());
  tp_bootstrap = std::move(tp);
  dp_bootstrap = std::move(dp);
  tp = std::move(tp_nccl);
  dp = std::move(dp_nccl);
  collectives = tp->backend();
}

}  // namespace megabatch::comm
