#include "core/comm/nccl_communicator.h"

#include "core/comm/mpi_communicator.h"
#include "core/comm/watchdog.h"
#include "core/util/error.h"

#if MEGABATCH_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/device/cuda/check.h"
#include "core/device/runtime.h"
#endif

namespace megabatch::comm {

#if MEGABATCH_WITH_CUDA
namespace {

#define MB_NCCL_CHECK(call)                                                                        \
  do {                                                                                             \
    const ncclResult_t mb_r_ = (call);                                                             \
    if (mb_r_ != ncclSuccess) fail("NCCL ", #call, " failed: ", ncclGetErrorString(mb_r_), last()); \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    default: fail("NCCL collectives take f32, f64, bf16 or f16 buffers, not ", dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MpiCommunicator* group, Device device) : device_(device) {
    runtime::use_device(device_);
    const int n = group ? group->size() : 1, r = group ? group->rank() : 0;
    ncclUniqueId id;
    if (r == 0) MB_NCCL_CHECK(ncclGetUniqueId(&id));
    if (group) {
      const std::string s = group->broadcast_string(r == 0 ? std::string(id.internal, sizeof id.internal) : std::string(), 0);
      check(s.size() == sizeof id.internal, "NCCL bootstrap: rank 0 sent a unique id of ", s.size(), " bytes");
      std::memcpy(id.internal, s.data(), sizeof id.internal);
    }
    MB_NCCL_CHECK(ncclCommInitRank(&comm_, n, id, r));
    rank_ = r;
    size_ = n;
    compute_ = static_cast<cudaStream_t>(runtime::cuda_stream(device_));
    MB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MB_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    MB_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    const int index = device_.index;
    watch_.emplace([this, index] {  // asked by the watchdog's thread: its own current device
      cudaSetDevice(index);
      return cudaEventQuery(done_) != cudaErrorNotReady;
    });
  }
  ~NcclCommunicator() override {
    watch_.reset();  // (before the event it queries)
    if (scratch_) runtime::raw_free(device_, scratch_, scratch_bytes_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_buffers() const override { return true; }
  std::string backend() const override { return "NCCL " + nccl_version(); }

  // ---- device buffers: on stream_, between the run's stream's work before and after ----
  void all_reduce_device(void* data, size_t n, DType t, ReduceOp op) override {
    begin();
    MB_NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type(t), nccl_op(op), comm_, stream_));
    end("all-reduce");
  }
  void all_gather_device(const void* in, void* out, size_t n, DType t) override {
    begin();
    MB_NCCL_CHECK(ncclAllGather(in, out, n, nccl_type(t), comm_, stream_));
    end("all-gather");
  }
  void reduce_scatter_device(const void* in, void* out, size_t n, DType t) override {
    begin();
    MB_NCCL_CHECK(ncclReduceScatter(in, out, n, nccl_type(t), ncclSum, comm_, stream_));
    end("reduce-scatter");
  }
  void broadcast_device(void* data, size_t n, DType t, int root) override {
    begin();
    MB_NCCL_CHECK(ncclBroadcast(data, data, n, nccl_type(t), root, comm_, stream_));
    end("broadcast");
  }

  // ---- non-blocking: the run's stream goes on; wait_all() makes it wait for them all ----
  void start_all_reduce_device(void* data, size_t n, DType t) override {
    begin();
    MB_NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type(t), ncclSum, comm_, stream_));
    MB_CUDA_CHECK(cudaEventRecord(done_, stream_));  // the last one started: stream_ runs them in order
    watch_->queued("gradient-bucket all-reduce", name());
    started_ = true;
  }
  void start_reduce_scatter_device(const void* in, void* out, size_t n, DType t) override {
    begin();
    MB_NCCL_CHECK(ncclReduceScatter(in, out, n, nccl_type(t), ncclSum, comm_, stream_));
    MB_CUDA_CHECK(cudaEventRecord(done_, stream_));
    watch_->queued("gradient-bucket reduce-scatter", name());
    started_ = true;
  }
  void wait_all() override {
    if (!started_) return;
    MB_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    started_ = false;
  }

  // ---- host buffers: through a device buffer, waiting for the result ----
  void all_reduce(float* data, size_t n, ReduceOp op) override { host_all_reduce(data, n, DType::kF32, op); }
  void all_reduce(double* data, size_t n, ReduceOp op) override { host_all_reduce(data, n, DType::kF64, op); }
  void all_gather_bytes(const void* in, void* out, size_t bytes) override {
    const CollectiveWait wait("all-gather", name());
    char* d = static_cast<char*>(scratch(bytes * (static_cast<size_t>(size_) + 1)));
    up(d, in, bytes);
    begin();
    MB_NCCL_CHECK(ncclAllGather(d, d + bytes, bytes, ncclUint8, comm_, stream_));
    end("all-gather");
    down(out, d + bytes, bytes * static_cast<size_t>(size_));
  }
  void reduce_scatter(const float* in, float* out, size_t n) override {
    const CollectiveWait wait("reduce-scatter", name());
    const size_t bytes = n * sizeof(float);
    char* d = static_cast<char*>(scratch(bytes * (static_cast<size_t>(size_) + 1)));
    up(d, in, bytes * static_cast<size_t>(size_));
    reduce_scatter_device(d, d + bytes * static_cast<size_t>(size_), n, DType::kF32);
    down(out, d + bytes * static_cast<size_t>(size_), bytes);
  }
  void broadcast(float* data, size_t n, int root) override {
    const CollectiveWait wait("broadcast", name());
    void* d = scratch(n * sizeof(float));
    up(d, data, n * sizeof(float));
    broadcast_device(d, n, DType::kF32, root);
    down(data, d, n * sizeof(float));
  }
  void barrier() override {
    float one = 1.0f;
    all_reduce(&one, 1, ReduceOp::kSum);
  }

 private:
  std::string last() const { return comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : std::string(); }
  void begin() {
    MB_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    MB_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  void end(const char* what) {
    MB_CUDA_CHECK(cudaEventRecord(done_, stream_));
    MB_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    watch_->queued(what, name());
  }
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {  // grows to the largest host collective once; none in the steady state
      if (scratch_) runtime::raw_free(device_, scratch_, scratch_bytes_);
      scratch_bytes_ = std::max(bytes, size_t{4096});
      scratch_ = runtime::raw_alloc(device_, scratch_bytes_);
    }
    return scratch_;
  }
  void up(void* d, const void* h, size_t bytes) { runtime::copy_bytes(d, device_, h, Device::cpu(), bytes); }
  void down(void* h, const void* d, size_t bytes) { runtime::copy_bytes(h, Device::cpu(), d, device_, bytes); }
  void host_all_reduce(void* data, size_t n, DType t, ReduceOp op) {
    const CollectiveWait wait("all-reduce", name());
    const size_t bytes = n * dtype_size(t);
    void* d = scratch(bytes);
    up(d, data, bytes);
    all_reduce_device(d, n, t, op);
    down(data, d, bytes);
  }

  Device device_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  bool started_ = false;  // non-blocking ones not yet waited for
  // the deadline on the collectives queued on stream_ (comm/watchdog.h): done_ follows the newest
  std::optional<QueuedCollectives> watch_;
};

}  // namespace

bool nccl_built() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator* group, Device device) {
  if (!device.is_cuda()) fail("the NCCL communicator needs a GPU device, not ", device.str());
  return std::make_unique<NcclCommunicator>(group, device);
}

#else  // a build without CUDA

bool nccl_built() { return false; }
std::string nccl_version() { return ""; }
std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator*, Device) {
  fail("this build has no NCCL: rebuild with CUDA (cmake -DMEGABATCH_CUDA=ON, where nvcc and NCCL are installed), "
       "or use --distributed-backend mpi");
}

#endif

}  // namespace megabatch::comm
