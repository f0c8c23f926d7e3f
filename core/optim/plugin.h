/* megabatch optimizer plugin ABI, version 2.
 *
 * This header is the only thing a plugin includes. It is plain C (a C++ convenience
 * layer follows at the end), so a plugin built by any compiler loads into any host.
 *
 * A plugin is a shared library that exports exactly one symbol,
 *     const mb_plugin_entry megabatch_optimizer_plugin;
 * (MEGABATCH_OPTIMIZER_PLUGIN below defines it). The host loads it with Boost.DLL,
 * refuses it unless entry.abi_version == MB_PLUGIN_ABI_VERSION (naming both versions),
 * validates the user's hyperparameters against entry.hparams, and keeps the library
 * loaded as long as any optimizer created from it lives.
 *
 * Ownership and timing
 *  - The host owns parameters, gradients and optimizer state. State buffers come from
 *    host->alloc_state during create() only; they are zero-filled, as large as the
 *    parameter, checkpointed by the host, and live until destroy().
 *  - create() is called once, after the model's parameters exist. step() is called once
 *    per iteration after the host has accumulated gradients over the global batch
 *    (mean gradient), all-reduced them over data parallelism, unscaled and inf-checked
 *    them, and clipped them by global norm. step() then updates params in place.
 *    A plugin does numerics only: no clipping, no loss scaling, no accumulation.
 *  - destroy() is called once; after it the host may unload the library.
 *  - Calls come from one host thread; a plugin may use OpenMP inside a call.
 *  - Pointers to parameters, gradients and state point to memory on the run's device
 *    (version 2: the CPU). Sharded parameters are the local shard; host->tp_sum makes
 *    per-tensor norms of sharded tensors global (sum over the tensor-parallel group).
 *  - Errors: return non-zero and write a message into err (err_len bytes, NUL-terminated).
 *    The host stops the run with that message; it never continues after a failed step.
 */
#ifndef MEGABATCH_OPTIM_PLUGIN_H_
#define MEGABATCH_OPTIM_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#define MB_PLUGIN_ABI_VERSION 2u
#define MB_PLUGIN_ENTRY_SYMBOL "megabatch_optimizer_plugin"

#ifdef __cplusplus
extern "C" {
#endif

/* What a parameter is for; plugins use it to exclude biases and norms from weight decay. */
typedef enum mb_role { MB_ROLE_EMBEDDING = 0, MB_ROLE_WEIGHT = 1, MB_ROLE_BIAS = 2, MB_ROLE_NORM = 3 } mb_role;

typedef struct mb_param {
  const char* name;        /* Megatron-style name, e.g. decoder.layers.0.mlp.linear_fc1.weight */
  mb_role role;
  int32_t layer;           /* transformer layer index, -1 outside the layers */
  int32_t ndim;            /* 1 or 2 */
  int64_t shape[2];        /* local (this rank's shard) */
  int64_t full_shape[2];   /* unsharded */
  int32_t sharded;         /* 1: split across the tensor-parallel group along partition_dim */
  int32_t partition_dim;   /* -1 when replicated */
  int64_t numel;           /* local elements */
  float* data;             /* parameter values (updated in place by step) */
  const float* grad;       /* mean gradient over the global batch (read only) */
} mb_param;

typedef enum mb_hparam_type { MB_HPARAM_FLOAT = 0, MB_HPARAM_INT = 1, MB_HPARAM_BOOL = 2 } mb_hparam_type;

/* One hyperparameter of the plugin's schema. Values reach create() as doubles in schema
 * order (ints as whole numbers, bools as 0 or 1), each already checked against min/max. */
typedef struct mb_hparam_spec {
  const char* name;        /* snake_case, e.g. "beta1" */
  mb_hparam_type type;
  double default_value;
  double min_value, max_value; /* inclusive range */
  const char* help;        /* one line */
} mb_hparam_spec;

/* Per-step facts from the host. */
typedef struct mb_step_info {
  int64_t step;            /* 1 for the first optimizer step */
  double lr;               /* learning rate for this step (after warmup, decay and scaling) */
  int64_t global_batch;    /* samples in this step's global batch */
  uint64_t seed;           /* run seed, for plugins that draw random numbers through the host */
  double grad_norm;        /* global L2 norm of the gradients step() sees (after the host's
                              clipping; over all ranks, each element counted once) */
  int32_t diagnostics;     /* 1: report per-tensor diagnostics through host->metric this
                              step; 0: skip them (they may cost reductions) */
} mb_step_info;

/* Services the host offers. Every member is non-null. */
typedef struct mb_host {
  void* ctx;               /* pass back as the first argument */
  /* Zero-filled state of param_index's size, named for checkpoints ("exp_avg"). Only
   * during create(); returns NULL (and the host reports why) on a bad index or name. */
  float* (*alloc_state)(void* ctx, size_t param_index, const char* state_name);
  /* Sums values[0..n) over the tensor-parallel group in place (identity on one rank).
   * Call it with the partial squared norms of sharded tensors only. */
  void (*tp_sum)(void* ctx, double* values, size_t n);
  /* Fills out[0..n) with standard normal draws that are a pure function of
   * (seed, step, param_index, full-tensor element index): identical on any thread
   * count, device or tensor-parallel layout. */
  void (*normal)(void* ctx, size_t param_index, int64_t step, float* out, size_t n);
  /* Records a per-tensor diagnostic (e.g. "trust_ratio") for this step; meant for steps
   * with info->diagnostics set (ignored otherwise). Each series lands in metrics.h5 as
   * optimizer/<series>, one row per reported step, one column per parameter. */
  void (*metric)(void* ctx, const char* series, size_t param_index, double value);
  /* A line for the run's console log. */
  void (*log)(void* ctx, const char* message);
} mb_host;

typedef struct mb_plugin_entry {
  uint32_t abi_version;    /* MB_PLUGIN_ABI_VERSION of the header the plugin was built with */
  const char* name;        /* what users write after --optimizer */
  const char* version;     /* the plugin's own version, e.g. "1.0.0" */
  const char* description; /* one line */
  const mb_hparam_spec* hparams;
  size_t num_hparams;
  /* Creates an optimizer over params[0..n). hparams holds num_hparams values in schema
   * order. Returns NULL on error (message in err). params stays valid until destroy. */
  void* (*create)(const mb_host* host, const mb_param* params, size_t n, const double* hparams, char* err,
                  size_t err_len);
  /* One optimizer step; 0 on success. */
  int (*step)(void* self, const mb_step_info* info, char* err, size_t err_len);
  void (*destroy)(void* self);
} mb_plugin_entry;

#ifdef __cplusplus
} /* extern "C" */

/* ------------------------------------------------------------------------------------
 * C++ convenience layer: write a class, get the C entry.
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
 *       megabatch::plugin::multi_tensor_apply(jobs);   // every tensor, one parallel region
 *     }
 *   };
 *   static const mb_hparam_spec kSchema[] = {{"momentum", MB_HPARAM_FLOAT, 0.0, 0.0, 1.0, "momentum"}};
 *   MEGABATCH_OPTIMIZER_PLUGIN(MySgd, "my_sgd", "1.0.0", "plain SGD", kSchema)
 *
 * Exceptions thrown by the constructor or step() become the error message.
 * ---------------------------------------------------------------------------------- */
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#define MB_PLUGIN_PRAGMA(x) _Pragma(x)
#else
#define MB_PLUGIN_PRAGMA(x)
#endif

/* Marks optimizer functors so the same math compiles for the CPU and, under nvcc, for
 * CUDA kernels. */
#if defined(__CUDACC__)
#define MB_HOST_DEVICE __host__ __device__
#else
#define MB_HOST_DEVICE
#endif

namespace megabatch::plugin {

// ---- multi-tensor apply -------------------------------------------------------------
// Elementwise optimizer math is a small functor (pointers and scalars of one tensor, an
// operator() for element j). A TensorJob pairs it with the tensor's element count; the
// apply functions run a whole list of jobs: on the CPU the elements of all tensors are
// cut into fixed chunks of kChunk that OpenMP threads share, so a model of hundreds of
// small tensors costs one parallel region and large tensors still split evenly. (The
// CUDA path launches the same functors over the same chunks.)
template <typename Fn>
struct TensorJob {
  int64_t n;  // elements of this tensor (the local shard)
  Fn fn;
};

inline constexpr int64_t kChunk = 16384;

namespace detail {
struct Chunk {
  size_t job;
  int64_t begin, end;
};
template <typename Fn>
std::vector<Chunk> make_chunks(const std::vector<TensorJob<Fn>>& jobs) {
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < jobs.size(); ++t)
    for (int64_t b = 0; b < jobs[t].n; b += kChunk) chunks.push_back({t, b, b + kChunk < jobs[t].n ? b + kChunk : jobs[t].n});
  return chunks;
}
}  // namespace detail

// fn(j) for every element j of every job. fn must only touch element j of its arrays.
template <typename Fn>
void multi_tensor_apply(const std::vector<TensorJob<Fn>>& jobs) {
  const std::vector<detail::Chunk> chunks = detail::make_chunks(jobs);
  const int64_t count = static_cast<int64_t>(chunks.size());
  MB_PLUGIN_PRAGMA("omp parallel for schedule(static) if (count > 1)")
  for (int64_t c = 0; c < count; ++c) {
    const Fn fn = jobs[chunks[c].job].fn;  // a private copy keeps the scalars in registers
    const int64_t end = chunks[c].end;
    MB_PLUGIN_PRAGMA("omp simd")
    for (int64_t j = chunks[c].begin; j < end; ++j) fn(j);
  }
}

// K per-element quantities (e.g. a squared update and a squared weight), returned by a
// sum functor's operator()(j); returned by value so that the loop vectorizes.
template <int K>
struct Sums {
  double v[K];
};

// Per-job sums of K (1 to 4) quantities: fn(j) may update element j of its arrays and
// returns its K contributions as Sums<K>. Sums are accumulated in double per chunk and
// added in chunk order, so the result does not depend on the thread count. Returns one
// array of K sums per job (local: reduce sharded tensors over the tensor-parallel group
// with Optimizer::tp_sum_sharded).
template <int K, typename Fn>
std::vector<std::array<double, K>> multi_tensor_sum(const std::vector<TensorJob<Fn>>& jobs) {
  static_assert(K >= 1 && K <= 4, "multi_tensor_sum: 1 to 4 sums per element");
  const std::vector<detail::Chunk> chunks = detail::make_chunks(jobs);
  const int64_t count = static_cast<int64_t>(chunks.size());
  std::vector<std::array<double, K>> partial(chunks.size());
  MB_PLUGIN_PRAGMA("omp parallel for schedule(static) if (count > 1)")
  for (int64_t c = 0; c < count; ++c) {
    const Fn fn = jobs[chunks[c].job].fn;
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
    for (int k = 0; k < K; ++k) partial[c][k] = a[k];
  }
  std::vector<std::array<double, K>> sums(jobs.size());
  for (auto& s : sums) s.fill(0.0);
  for (size_t c = 0; c < chunks.size(); ++c)
    for (int k = 0; k < K; ++k) sums[chunks[c].job][k] += partial[c][k];
  return sums;
}

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

 protected:
  size_t num_params() const { return ctx_.num_params; }
  const mb_param& param(size_t i) const { return ctx_.params[i]; }
  // The value of hyperparameter `name` (it must be in the schema).
  double hparam(const char* name) const {
    for (size_t i = 0; i < ctx_.num_hparams; ++i)
      if (std::strcmp(ctx_.schema[i].name, name) == 0) return ctx_.hparams[i];
    throw std::logic_error(std::string("plugin asked for hyperparameter '") + name + "' missing from its schema");
  }
  float* alloc_state(size_t i, const char* state_name) const {
    float* p = ctx_.host->alloc_state(ctx_.host->ctx, i, state_name);
    if (!p) throw std::runtime_error(std::string("host refused state '") + state_name + "'");
    return p;
  }
  // Sum of squares of parameter i's values (or any float array of its size), made
  // global over the tensor-parallel group for sharded tensors.
  double sum_squares(size_t i, const float* x) const {
    const mb_param& p = param(i);
    double s = 0;
    MB_PLUGIN_PRAGMA("omp parallel for reduction(+ : s) schedule(static) if (p.numel > 65536)")
    for (int64_t j = 0; j < p.numel; ++j) s += static_cast<double>(x[j]) * x[j];
    if (p.sharded) ctx_.host->tp_sum(ctx_.host->ctx, &s, 1);
    return s;
  }
  // Makes per-parameter sums global: the entries of sharded parameters are summed over
  // the tensor-parallel group (in one collective), replicated ones are left alone.
  // sums[i] belongs to parameter i (as multi_tensor_sum returns them for jobs built in
  // parameter order).
  template <size_t K>
  void tp_sum_sharded(std::vector<std::array<double, K>>& sums) const {
    std::vector<double> packed;
    for (size_t i = 0; i < sums.size(); ++i)
      if (param(i).sharded) packed.insert(packed.end(), sums[i].begin(), sums[i].end());
    if (packed.empty()) return;
    ctx_.host->tp_sum(ctx_.host->ctx, packed.data(), packed.size());
    size_t at = 0;
    for (size_t i = 0; i < sums.size(); ++i)
      if (param(i).sharded)
        for (size_t k = 0; k < K; ++k) sums[i][k] = packed[at++];
  }
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
    static_cast<T*>(self)->step(*info);
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
      MB_PLUGIN_ABI_VERSION, NAME, VERSION, DESCRIPTION, SCHEMA, sizeof(SCHEMA) / sizeof(SCHEMA[0]), mb_create_,  \
      ::megabatch::plugin::detail::step<Class>, ::megabatch::plugin::detail::destroy<Class>};

#endif /* __cplusplus */
#endif /* MEGABATCH_OPTIM_PLUGIN_H_ */
