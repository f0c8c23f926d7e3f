/* megabatch optimizer plugin kit: the C++ layer over the C ABI of plugin.h (included here).
 * Write a class, get the C entry.
 *
 *   struct SgdUpdate {                       // the math, once, as a host/device functor
 *     float* w; const float* g; float lr;
 *     MB_HOST_DEVICE void operator()(int64_t j) const { w[j] -= lr * g[j]; }
 *   };
 *   class MySgd : public megabatch::plugin::Optimizer {
 *    public:
 *     explicit MySgd(const megabatch::plugin::Context& ctx) : Optimizer(ctx) {}
 *     void step(const mb_step_info& info) override {
 *       std::vector<megabatch::plugin::TensorJob<SgdUpdate>> jobs;
 *       for (size_t i = 0; i < num_params(); ++i)
 *         jobs.push_back({param(i).numel, {param(i).data, param(i).grad, float(info.lr)}});
 *       apply(jobs);   // every tensor: one OpenMP region on the CPU, one kernel on a GPU
 *     }
 *   };
 *   static const mb_hparam_spec kSchema[] = {{"momentum", MB_HPARAM_FLOAT, 0.0, 0.0, 1.0, "momentum"}};
 *   MEGABATCH_OPTIMIZER_PLUGIN(MySgd, "my_sgd", "1.0.0", "plain SGD", kSchema)
 *
 * Compiled by a C++ compiler the plugin runs on the CPU; compiled by nvcc (the plugin kit
 * does so where CUDA is present) the same functors also become CUDA kernels. Exceptions
 * thrown by the constructor or step() become the error message.
 * ---------------------------------------------------------------------------------- */
#ifndef MEGABATCH_OPTIM_PLUGIN_KIT_H_
#define MEGABATCH_OPTIM_PLUGIN_KIT_H_

#ifndef __cplusplus
#error "plugin_kit.h is C++; a plugin written in C includes <megabatch/plugin.h> alone"
#endif

#include "plugin.h"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#define MB_PLUGIN_PRAGMA(x) _Pragma(x)
#else
#define MB_PLUGIN_PRAGMA(x)
#endif

/* Marks optimizer functors so the same math compiles for the CPU and, under nvcc, for
 * CUDA kernels. MB_PLUGIN_GPU: the kit has its GPU path (under nvcc; and in megabatch's own
 * tests, MB_WARP_EMULATOR, where the kernels run on the CPU's warp emulator, tests/emulator). */
#if defined(__CUDACC__)
#define MB_HOST_DEVICE __host__ __device__
#define MB_PLUGIN_DEVICES (MB_DEVICES_CPU | MB_DEVICES_CUDA)
#define MB_PLUGIN_GPU 1
#elif defined(MB_WARP_EMULATOR)
#include "tests/emulator/warp_emulator.h"
#define MB_HOST_DEVICE
#define MB_PLUGIN_DEVICES (MB_DEVICES_CPU | MB_DEVICES_CUDA)
#define MB_PLUGIN_GPU 1
#else
#define MB_HOST_DEVICE
#define MB_PLUGIN_DEVICES MB_DEVICES_CPU
#endif

namespace megabatch::plugin {

// ---- jobs -----------------------------------------------------------------------------
// Elementwise optimizer math is a small functor (pointers and scalars of one tensor, an
// operator() for element j). A TensorJob pairs it with an element count; Optimizer::apply
// and Optimizer::sum run a whole list of jobs. A job is usually one tensor, but any
// index space works (one row or one column of a matrix: factored statistics).
template <typename Fn>
struct TensorJob {
  int64_t n;  // elements (indices 0 .. n - 1)
  Fn fn;
};

// K per-element quantities (e.g. a squared update and a squared weight), returned by a
// sum functor's operator()(j); returned by value so that the loop vectorizes.
template <int K>
struct Sums {
  double v[K];
};

inline constexpr int64_t kChunk = 16384;         // CPU: elements per OpenMP work item
inline constexpr int64_t kDeviceChunk = 65536;   // GPU: elements per thread block

namespace detail {
// A functor may have `Fn prepared() const`: it then computes, once per chunk (CPU) or per
// job (GPU, in a kernel before the element kernel) rather than per element, scalars it
// derives from device values (a trust ratio from norms in device memory), and the loop runs
// the prepared copy.
template <typename Fn, typename = void>
struct has_prepared : std::false_type {};
template <typename Fn>
struct has_prepared<Fn, std::void_t<decltype(std::declval<const Fn&>().prepared())>> : std::true_type {};
template <typename Fn>
MB_HOST_DEVICE inline Fn prepare(const Fn& fn) {
  if constexpr (has_prepared<Fn>::value)
    return fn.prepared();
  else
    return fn;
}

struct Chunk {
  int64_t job;
  int64_t begin, end;
};
template <typename Fn>
std::vector<Chunk> make_chunks(const std::vector<TensorJob<Fn>>& jobs, int64_t size, std::vector<int64_t>* first = nullptr) {
  std::vector<Chunk> chunks;
  if (first) first->assign(1, 0);
  for (size_t t = 0; t < jobs.size(); ++t) {
    for (int64_t b = 0; b < jobs[t].n; b += size)
      chunks.push_back({static_cast<int64_t>(t), b, b + size < jobs[t].n ? b + size : jobs[t].n});
    if (first) first->push_back(static_cast<int64_t>(chunks.size()));
  }
  return chunks;
}

// ---- the CPU: fixed chunks shared by OpenMP threads ------------------------------------
template <typename Fn>
void cpu_apply(const std::vector<TensorJob<Fn>>& jobs) {
  const std::vector<Chunk> chunks = make_chunks(jobs, kChunk);
  const int64_t count = static_cast<int64_t>(chunks.size());
  MB_PLUGIN_PRAGMA("omp parallel for schedule(static) if (count > 1)")
  for (int64_t c = 0; c < count; ++c) {
    const Fn fn = prepare(jobs[static_cast<size_t>(chunks[c].job)].fn);  // a private copy keeps the scalars in registers
    const int64_t end = chunks[c].end;
    MB_PLUGIN_PRAGMA("omp simd")
    for (int64_t j = chunks[c].begin; j < end; ++j) fn(j);
  }
}

// out[job * K + k]: chunks summed in double, chunk partials added in order.
template <int K, typename Fn>
void cpu_sum(const std::vector<TensorJob<Fn>>& jobs, double* out) {
  static_assert(K >= 1 && K <= 4, "sum: 1 to 4 sums per element");
  const std::vector<Chunk> chunks = make_chunks(jobs, kChunk);
  const int64_t count = static_cast<int64_t>(chunks.size());
  std::vector<std::array<double, K>> partial(chunks.size());
  MB_PLUGIN_PRAGMA("omp parallel for schedule(static) if (count > 1)")
  for (int64_t c = 0; c < count; ++c) {
    const Fn fn = prepare(jobs[static_cast<size_t>(chunks[c].job)].fn);
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;  // scalars, not an array: a vectorizable reduction
    const int64_t end = chunks[c].end;
    MB_PLUGIN_PRAGMA("omp simd reduction(+ : a0, a1, a2, a3)")
    for (int64_t j = chunks[c].begin; j < end; ++j) {
      const Sums<K> t = fn(j);
      a0 += t.v[0];
      if constexpr (K > 1) a1 += t.v[1];
      if constexpr (K > 2) a2 += t.v[2];
      if constexpr (K > 3) a3 += t.v[3];
    }
    const double a[4] = {a0, a1, a2, a3};
    for (int k = 0; k < K; ++k) partial[static_cast<size_t>(c)][k] = a[k];
  }
  for (size_t i = 0; i < jobs.size() * K; ++i) out[i] = 0.0;
  for (size_t c = 0; c < chunks.size(); ++c)
    for (int k = 0; k < K; ++k) out[chunks[c].job * K + k] += partial[c][k];
}

// ---- device copies of the tables a step makes ------------------------------------------
// One slot per table, in the order a step makes its tables: a table whose bytes equal the
// slot's from the step before is not uploaded again. The shipped plugins' tables hold
// pointers and constants only (per-step numbers come through info.values), so after the
// first step they upload nothing; a functor holding info.lr still works, uploaded each step.
class TableCache {
 public:
  void restart() { next_ = 0; }       // a new step
  int64_t uploads() const { return uploads_; }  // tables uploaded so far
  const void* get(const mb_host& h, const std::vector<unsigned char>& table) {
    if (next_ == slots_.size()) slots_.emplace_back();
    Slot& s = slots_[next_++];
    if (s.device && s.bytes == table) return s.device;
    if (!s.device || s.capacity < table.size()) {
      const size_t size = table.empty() ? 8 : table.size();
      s.device = h.alloc_device(h.ctx, size);
      if (!s.device) throw std::runtime_error("the host has no device memory for a job table");
      s.capacity = size;
    }
    s.bytes = table;
    if (!table.empty()) h.upload(h.ctx, s.device, table.data(), table.size());
    ++uploads_;
    return s.device;
  }

 private:
  struct Slot {
    std::vector<unsigned char> bytes;  // what the device copy holds
    void* device = nullptr;
    size_t capacity = 0;
  };
  std::vector<Slot> slots_;
  size_t next_ = 0;
  int64_t uploads_ = 0;
};

#if defined(MB_PLUGIN_GPU)
// ---- a GPU: one thread block per chunk, job tables in device memory --------------------
template <typename Fn>
struct DeviceJob {
  Fn fn;
  int64_t n;
};

// A functor with prepared() is prepared once per job by a kernel of its own, before the
// element kernels: they then carry none of its code (the double-precision powers of a bias
// correction), which keeps their registers low and their occupancy high (LambUpdate: 30
// registers instead of 56 at sm_90, 4 blocks of 512 threads on an SM instead of 2).
template <typename Fn>
__global__ void prepare_kernel(DeviceJob<Fn>* out, const DeviceJob<Fn>* jobs, int64_t n) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < n) out[t] = DeviceJob<Fn>{jobs[t].fn.prepared(), jobs[t].n};
}

// The element loops are not unrolled: a functor stores to arrays its next element's loads
// may alias, so unrolling buys no overlap, only registers (sum_kernel of LambMoments: 40
// instead of 54). The memory parallelism comes from resident threads.
template <typename Fn>
__global__ void apply_kernel(const DeviceJob<Fn>* jobs, const Chunk* chunks, const float* skip) {
  if (skip && *skip != 0.0f) return;
  const Chunk c = chunks[blockIdx.x];
  const Fn fn = jobs[c.job].fn;
#pragma unroll 1
  for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x) fn(j);
}

// the sum over a warp's 32 lanes, in a fixed tree (every lane gets it)
__device__ inline double warp_sum_of(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline double block_sum_of(double v, double* scratch) {
  v = warp_sum_of(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  return warp_sum_of((threadIdx.x & 31) < (blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0.0);
}

// partial[chunk * K + k]; a fixed tree per block: deterministic. `jobs` are prepared.
template <int K, typename Fn>
__global__ void sum_kernel(const DeviceJob<Fn>* jobs, const Chunk* chunks, double* partial, const float* skip) {
#if defined(MB_WARP_EMULATOR)
  double* scratch = reinterpret_cast<double*>(::megabatch::emu::dynamic_smem());  // (32 doubles: the launch)
#else
  __shared__ double scratch[32];
#endif
  double acc[K];
  for (int k = 0; k < K; ++k) acc[k] = 0.0;
  const Chunk c = chunks[blockIdx.x];
  if (!(skip && *skip != 0.0f)) {
    const Fn fn = jobs[c.job].fn;
#pragma unroll 1
    for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x) {
      const Sums<K> t = fn(j);
      for (int k = 0; k < K; ++k) acc[k] += t.v[k];
    }
  }
  for (int k = 0; k < K; ++k) {
    const double s = block_sum_of(acc[k], scratch);
    if (threadIdx.x == 0) partial[blockIdx.x * K + k] = s;
  }
}

// out[job * K + k] = the sum of the job's chunk partials, a warp per job: lane i adds partials
// i, i + 32, ... in order, then a fixed shuffle tree. Deterministic, and a tensor of many
// chunks (an embedding: hundreds) costs a few dependent loads a lane, not one per chunk.
constexpr int kCombineWarps = 4;  // jobs per block
template <int K>
__global__ void combine_kernel(double* out, const double* partial, const int64_t* first, int64_t jobs) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(kCombineWarps) + threadIdx.x / 32;
  if (t >= jobs) return;  // a whole warp: the shuffles below see all 32 lanes
  const int lane = threadIdx.x % 32;
  const int64_t begin = first[t], end = first[t + 1];
  for (int k = 0; k < K; ++k) {
    double s = 0.0;
    for (int64_t c = begin + lane; c < end; c += 32) s += partial[c * K + k];
    s = warp_sum_of(s);
    if (lane == 0) out[t * K + k] = s;
  }
}

// Launches kernel(args...) on `grid` blocks of `block` threads (on the warp emulator, with
// `emulated_smem` bytes of shared memory for what a GPU holds in static shared memory).
template <typename Kernel, typename... A>
void launch(const char* what, Kernel kernel, unsigned grid, unsigned block, cudaStream_t s, size_t emulated_smem,
            A... args) {
#if defined(MB_WARP_EMULATOR)
  (void)s;
  ::megabatch::emu::launch(what, dim3(grid), dim3(block), emulated_smem, [=] { kernel(args...); });
#else
  (void)emulated_smem;
  kernel<<<grid, block, 0, s>>>(args...);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
#endif
}

// The job and chunk tables in device memory, through the cache. The job table is built in
// zeroed bytes, each functor and count copied in whole, so equal jobs give equal bytes
// (padding inside a functor is copied as it is: order a functor's members by size).
template <typename Fn>
const DeviceJob<Fn>* device_jobs(const mb_host& h, TableCache& cache, const std::vector<TensorJob<Fn>>& jobs) {
  static_assert(std::is_trivially_copyable<Fn>::value, "an optimizer functor holds pointers and scalars only");
  std::vector<unsigned char> table(jobs.size() * sizeof(DeviceJob<Fn>), 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    unsigned char* at = table.data() + i * sizeof(DeviceJob<Fn>);
    std::memcpy(at + offsetof(DeviceJob<Fn>, fn), &jobs[i].fn, sizeof(Fn));
    std::memcpy(at + offsetof(DeviceJob<Fn>, n), &jobs[i].n, sizeof(int64_t));
  }
  return static_cast<const DeviceJob<Fn>*>(cache.get(h, table));
}
template <typename T>
const T* device_vector(const mb_host& h, TableCache& cache, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  return static_cast<const T*>(cache.get(h, std::vector<unsigned char>(p, p + v.size() * sizeof(T))));
}

// The job table as the element kernels read it: prepared on the device (into scratch)
// where the functor has prepared(), else the table itself.
template <typename Fn>
const DeviceJob<Fn>* prepared_jobs(const mb_host& h, const DeviceJob<Fn>* table, size_t n, cudaStream_t s) {
  if constexpr (!has_prepared<Fn>::value) {
    return table;
  } else {
    auto* out = static_cast<DeviceJob<Fn>*>(h.scratch(h.ctx, n * sizeof(DeviceJob<Fn>)));
    if (!out) throw std::runtime_error("the host has no scratch memory for the prepared job table");
    launch("multi-tensor prepare kernel", prepare_kernel<Fn>, static_cast<unsigned>((n + 127) / 128), 128, s, 0, out,
           table, static_cast<int64_t>(n));
    return out;
  }
}

template <typename Fn>
void cuda_apply(const mb_host& h, TableCache& cache, const std::vector<TensorJob<Fn>>& jobs, const float* skip) {
  const std::vector<Chunk> chunks = make_chunks(jobs, kDeviceChunk);
  if (chunks.empty()) return;
  const cudaStream_t s = static_cast<cudaStream_t>(h.stream);
  const DeviceJob<Fn>* dj = prepared_jobs(h, device_jobs(h, cache, jobs), jobs.size(), s);
  const Chunk* dc = device_vector(h, cache, chunks);
  launch("multi-tensor apply kernel", apply_kernel<Fn>, static_cast<unsigned>(chunks.size()), 512, s, 0, dj, dc, skip);
}

template <int K, typename Fn>
void cuda_sum(const mb_host& h, TableCache& cache, const std::vector<TensorJob<Fn>>& jobs, double* out,
              const float* skip) {
  std::vector<int64_t> first;
  const std::vector<Chunk> chunks = make_chunks(jobs, kDeviceChunk, &first);
  const cudaStream_t s = static_cast<cudaStream_t>(h.stream);
  double* partial = static_cast<double*>(h.scratch(h.ctx, (chunks.size() + 1) * K * sizeof(double)));
  if (!chunks.empty()) {
    const DeviceJob<Fn>* dj = prepared_jobs(h, device_jobs(h, cache, jobs), jobs.size(), s);
    const Chunk* dc = device_vector(h, cache, chunks);
    launch("multi-tensor sum kernel", sum_kernel<K, Fn>, static_cast<unsigned>(chunks.size()), 512, s,
           32 * sizeof(double), dj, dc, partial, skip);
  }
  const int64_t n = static_cast<int64_t>(jobs.size());
  if (n == 0) return;
  const int64_t* df = device_vector(h, cache, first);
  launch("multi-tensor sum combine kernel", combine_kernel<K>, static_cast<unsigned>((n + kCombineWarps - 1) / kCombineWarps),
         32 * kCombineWarps, s, 0, out, partial, df, n);
}
#endif  // MB_PLUGIN_GPU
}  // namespace detail

// Per-job sums of K quantities, on the run's device (host memory on the CPU), valid until
// step() returns: data()[job * K + k]. A kernel functor can read them (a trust ratio from
// the norms); host() copies them to the host (waiting for the device) for diagnostics.
template <int K>
class TensorSums {
 public:
  TensorSums(const mb_host* host, double* data, size_t jobs) : host_(host), data_(data), jobs_(jobs) {}
  const double* data() const { return data_; }
  double* data() { return data_; }
  size_t jobs() const { return jobs_; }
  std::vector<std::array<double, K>> host() const {
    std::vector<std::array<double, K>> out(jobs_);
    if (jobs_) host_->download(host_->ctx, out.data(), data_, jobs_ * K * sizeof(double));
    return out;
  }

 private:
  const mb_host* host_;
  double* data_;
  size_t jobs_;
};

// ---- the optimizer base class -------------------------------------------------------
struct Context {
  const mb_host* host;
  const mb_param* params;
  size_t num_params;
  const double* hparams;
  const mb_hparam_spec* schema;
  size_t num_hparams;
};

class Optimizer {
 public:
  explicit Optimizer(const Context& ctx) : ctx_(ctx) {}
  virtual ~Optimizer() = default;
  virtual void step(const mb_step_info& info) = 0;
  // entry.flags: a class whose math is elementwise and whose per-tensor sums go through
  // sum_shards declares `static constexpr uint32_t kFlags = MB_PLUGIN_DP_SHARDS;`; one that
  // decays by the step's weight decay (info.weight_decay, or values->weight_decay in a
  // functor's prepared()) adds MB_PLUGIN_WD_SCHEDULE; one that steps each parameter at
  // lr_of(i, info) adds MB_PLUGIN_DECOUPLED_LR.
  static constexpr uint32_t kFlags = 0;
  // Called by the entry's step() before step(): the step's skip flag for the kernels, and
  // the table cache rewound to its first slot.
  void begin_step(const mb_step_info& info) {
    skip_ = info.skip;
    tables_.restart();
  }
  // Job, chunk and index tables uploaded to the device so far (0 on the CPU, which needs none).
  int64_t table_uploads() const { return tables_.uploads(); }

 protected:
  size_t num_params() const { return ctx_.num_params; }
  const mb_param& param(size_t i) const { return ctx_.params[i]; }
  bool on_gpu() const { return ctx_.host->device == MB_DEVICE_CUDA; }
  // Where parameter i's learning rate for the step lies on the device, for a functor to read
  // in prepared(): values->decoupled_lr for the embedding or output layer, values->lr else.
  static const double* lr_of(const mb_param& p, const mb_step_info& info) {
    return p.embedding_or_output ? &info.values->decoupled_lr : &info.values->lr;
  }
  const double* lr_of(size_t i, const mb_step_info& info) const { return lr_of(param(i), info); }
  // The value of hyperparameter `name` (it must be in the schema).
  double hparam(const char* name) const {
    for (size_t i = 0; i < ctx_.num_hparams; ++i)
      if (std::strcmp(ctx_.schema[i].name, name) == 0) return ctx_.hparams[i];
    throw std::logic_error(std::string("plugin asked for hyperparameter '") + name + "' missing from its schema");
  }
  // State the shape of parameter i, sharded as the parameter.
  float* alloc_state(size_t i, const char* state_name) const {
    const mb_param& p = param(i);
    return alloc_state(i, state_name, std::vector<int64_t>(p.shape, p.shape + p.ndim), p.sharded ? p.partition_dim : -1);
  }
  // State of any shape (e.g. per-row factors: {rows}), `partition_dim` split across the
  // tensor-parallel group as the parameter (-1: the same on every rank); scratch
  // (checkpointed false) is not saved.
  float* alloc_state(size_t i, const char* state_name, const std::vector<int64_t>& shape, int32_t partition_dim,
                     bool checkpointed = true) const {
    float* p = ctx_.host->alloc_state(ctx_.host->ctx, i, state_name, static_cast<int32_t>(shape.size()), shape.data(),
                                      partition_dim, checkpointed ? 1 : 0);
    if (!p) throw std::runtime_error(std::string("host refused state '") + state_name + "'");
    return p;
  }

  // fn(j) for every element j of every job (fn touches element j of its arrays only).
  template <typename Fn>
  void apply(const std::vector<TensorJob<Fn>>& jobs) const {
    if (!on_gpu()) return detail::cpu_apply(jobs);
#if defined(MB_PLUGIN_GPU)
    detail::cuda_apply(*ctx_.host, tables_, jobs, skip_);
#else
    throw std::logic_error("this plugin was built without CUDA");  // the host refuses it before
#endif
  }
  // Per-job sums of K (1 to 4) quantities: fn(j) may update element j of its arrays and
  // returns its K contributions as Sums<K>. Summed in double in fixed chunks whose partials
  // are added in a fixed order: the same result on every run and for any thread count. Local: make per-parameter sums whole-
  // tensor sums with sum_shards.
  template <int K, typename Fn>
  TensorSums<K> sum(const std::vector<TensorJob<Fn>>& jobs) const {
    double* out = static_cast<double*>(ctx_.host->scratch(ctx_.host->ctx, (jobs.size() + 1) * K * sizeof(double)));
    if (!on_gpu()) {
      detail::cpu_sum<K>(jobs, out);
    } else {
#if defined(MB_PLUGIN_GPU)
      detail::cuda_sum<K>(*ctx_.host, tables_, jobs, out, skip_);
#else
      throw std::logic_error("this plugin was built without CUDA");
#endif
    }
    return TensorSums<K>(ctx_.host, out, jobs.size());
  }
  // Makes per-parameter sums whole-tensor sums: added over the data-parallel pieces
  // (distributed optimizer) and, for sharded parameters, over the tensor-parallel group.
  // The jobs of `sums` must be the parameters in order.
  template <int K>
  void sum_shards(TensorSums<K>& sums) const {
    if (sums.jobs() != num_params()) throw std::logic_error("sum_shards: one job per parameter expected");
    ctx_.host->sum_shards(ctx_.host->ctx, sums.data(), K);
  }
  // Sums any values over the tensor-parallel group (e.g. column statistics of a tensor
  // split by rows).
  void tp_sum(double* values, size_t n) const { ctx_.host->tp_sum(ctx_.host->ctx, values, n); }
  // Elements of parameter i's full (unsharded) tensor.
  int64_t full_numel(size_t i) const {
    const mb_param& p = param(i);
    return p.ndim == 1 ? p.full_shape[0] : p.full_shape[0] * p.full_shape[1];
  }
  void metric(const char* series, size_t i, double value) const {
    ctx_.host->metric(ctx_.host->ctx, series, i, value);
  }
  void log(const std::string& line) const { ctx_.host->log(ctx_.host->ctx, line.c_str()); }
  const mb_host& host() const { return *ctx_.host; }

 private:
  Context ctx_;
  const float* skip_ = nullptr;
  mutable detail::TableCache tables_;  // apply and sum are const: the cache is not the optimizer's state
};

namespace detail {
inline void set_error(char* err, size_t len, const char* msg) {
  if (!err || len == 0) return;
  std::strncpy(err, msg, len - 1);
  err[len - 1] = '\0';
}
template <typename T>
void* create(const mb_host* host, const mb_param* params, size_t n, const double* hparams, char* err, size_t len,
             const mb_hparam_spec* schema, size_t num_hparams) {
  try {
    return new T(Context{host, params, n, hparams, schema, num_hparams});
  } catch (const std::exception& e) {
    set_error(err, len, e.what());
  } catch (...) {
    set_error(err, len, "unknown exception in create()");
  }
  return nullptr;
}
template <typename T>
int step(void* self, const mb_step_info* info, char* err, size_t len) {
  try {
    T* opt = static_cast<T*>(self);
    opt->begin_step(*info);
    opt->step(*info);
    return 0;
  } catch (const std::exception& e) {
    set_error(err, len, e.what());
  } catch (...) {
    set_error(err, len, "unknown exception in step()");
  }
  return 1;
}
template <typename T>
void destroy(void* self) {
  delete static_cast<T*>(self);
}
}  // namespace detail
}  // namespace megabatch::plugin

#define MEGABATCH_OPTIMIZER_PLUGIN(Class, NAME, VERSION, DESCRIPTION, SCHEMA)                                     \
  namespace {                                                                                                     \
  void* mb_create_(const mb_host* h, const mb_param* p, size_t n, const double* hp, char* e, size_t l) {          \
    return ::megabatch::plugin::detail::create<Class>(h, p, n, hp, e, l, SCHEMA, sizeof(SCHEMA) / sizeof(SCHEMA[0])); \
  }                                                                                                               \
  }                                                                                                               \
  extern "C" __attribute__((visibility("default"))) const mb_plugin_entry megabatch_optimizer_plugin = {          \
      MB_PLUGIN_ABI_VERSION, MB_PLUGIN_DEVICES, NAME, VERSION, DESCRIPTION, SCHEMA,                               \
      sizeof(SCHEMA) / sizeof(SCHEMA[0]), mb_create_, ::megabatch::plugin::detail::step<Class>,                   \
      ::megabatch::plugin::detail::destroy<Class>, Class::kFlags};

#endif /* MEGABATCH_OPTIM_PLUGIN_KIT_H_ */
