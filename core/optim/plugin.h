/* megabatch optimizer plugin ABI, version 7.
 *
 * This header is the ABI: plain C, so a plugin built by any compiler loads into any host.
 * A C++ plugin includes <megabatch/plugin_kit.h> instead, which includes this one and adds
 * the convenience layer (functors run as OpenMP loops or CUDA kernels, the Optimizer base
 * class, the entry macro).
 *
 * A plugin is a shared library that exports exactly one symbol,
 *     const mb_plugin_entry megabatch_optimizer_plugin;
 * (plugin_kit.h's MEGABATCH_OPTIMIZER_PLUGIN defines it). The host loads it with Boost.DLL,
 * refuses it unless entry.abi_version == MB_PLUGIN_ABI_VERSION (naming both versions),
 * refuses it on a GPU run unless entry.devices has MB_DEVICES_CUDA (a plugin compiled by
 * nvcc has it), validates the user's hyperparameters against entry.hparams, and keeps the
 * library loaded as long as any optimizer created from it lives.
 *
 * Ownership and timing
 *  - The host owns parameters, gradients and optimizer state. State buffers come from
 *    host->alloc_state during create() only: zero-filled, of any shape the plugin asks
 *    for (the parameter's own shape, or e.g. per-row and per-column factors), on the
 *    run's device, checkpointed by the host (unless asked as scratch), alive until
 *    destroy().
 *  - create() is called once, after the model's parameters exist. step() is called once
 *    per iteration after the host has accumulated gradients over the global batch (mean
 *    gradient), all-reduced them over data parallelism, unscaled and inf-checked them, and
 *    clipped them by global norm. step() then updates params in place.
 *    A plugin does numerics only: no clipping, no loss scaling, no accumulation.
 *  - Mixed precision: params are the fp32 master weights and grads the fp32 main
 *    gradients whatever the run's dtype; the host copies the masters into the half weights.
 *  - An fp16 step whose gradients overflowed is not applied. On the CPU the host simply
 *    does not call step(). On a GPU the host does not wait to learn it: step() is called,
 *    and info->skip points to the device flag, which every kernel of the C++ layer reads
 *    first (a plugin that launches its own kernels must do the same). info->step and
 *    info->lr never count skipped steps.
 *  - destroy() is called once; after it the host may unload the library.
 *  - Calls come from one host thread; a plugin may use OpenMP inside a call.
 *  - Device memory: on a GPU run, param data/grad, state, info->values, info->grad_norm,
 *    info->skip and the memory from host->scratch and host->alloc_device are GPU memory, and
 *    everything runs on host->stream. On a CPU run all of it is host memory (the same code
 *    runs in both).
 *  - Launches that repeat: info->values, info->grad_norm and info->skip keep one address for
 *    the whole run, and host->scratch gives the same addresses to the same requests made in
 *    the same order each step. A step whose kernels read the step's numbers through them
 *    (not as launch arguments or in uploaded tables) launches the same kernels with the same
 *    arguments every step: nothing to upload, and the step can be captured in a CUDA graph.
 *  - Tensor parallelism: sharded parameters are the local shard; host->sum_shards makes
 *    per-tensor sums whole-tensor sums, host->tp_sum sums anything over the group.
 *  - The distributed optimizer (--use-distributed-optimizer): each data-parallel rank steps
 *    only a piece of each parameter, local elements [offset, offset + numel) of it
 *    (flattened row-major; numel may be 0), and keeps state only for that piece. A plugin
 *    that works so declares MB_PLUGIN_DP_SHARDS in entry.flags: its per-element math is
 *    elementwise, every checkpointed state buffer has its parameter's shape (the host then
 *    allocates the piece of it), and every per-tensor sum goes through host->sum_shards,
 *    which adds the ranks' pieces (and the tensor-parallel shards) exactly once. The host
 *    refuses other plugins with that flag, naming the plugin; checkpoints hold whole
 *    tensors, so a run resumes at any data-parallel size.
 *  - Weight decay: the host hands each step its weight decay in info->weight_decay (and
 *    info->values->weight_decay), as it hands the learning rate: the plugin's weight_decay
 *    hyperparameter, or the value of the run's schedule (Megatron's --start-weight-decay,
 *    --end-weight-decay, --weight-decay-incr-style) at the samples consumed before the step.
 *    A plugin that decays by that value (not by its hyperparameter read at create()) declares
 *    MB_PLUGIN_WD_SCHEDULE in entry.flags; the host refuses a schedule for other plugins,
 *    naming the plugin.
 *  - Decoupled learning rate: the parameters with embedding_or_output set (the input word
 *    embeddings, which the output layer shares; Megatron's is_embedding_or_output_parameter)
 *    step at info->decoupled_lr (and info->values->decoupled_lr), every other parameter at
 *    info->lr. It is info->lr unless the run gives them a schedule of their own (Megatron's
 *    --decoupled-lr and --decoupled-min-lr: the same warmup and decay, from their own peak to
 *    their own minimum). A plugin that steps those parameters at it declares
 *    MB_PLUGIN_DECOUPLED_LR in entry.flags; the host refuses --decoupled-lr for other plugins,
 *    naming the plugin.
 *  - Errors: return non-zero and write a message into err (err_len bytes, NUL-terminated).
 *    The host stops the run with that message; it never continues after a failed step.
 */
#ifndef MEGABATCH_OPTIM_PLUGIN_H_
#define MEGABATCH_OPTIM_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#define MB_PLUGIN_ABI_VERSION 7u
#define MB_PLUGIN_ENTRY_SYMBOL "megabatch_optimizer_plugin"

/* entry.devices: where the plugin's step can run */
#define MB_DEVICES_CPU 1u
#define MB_DEVICES_CUDA 2u

/* entry.flags */
#define MB_PLUGIN_DP_SHARDS 1u /* steps pieces of parameters: runs with the distributed optimizer */
#define MB_PLUGIN_WD_SCHEDULE 2u /* decays by the step's weight_decay: runs with a weight-decay schedule */
#define MB_PLUGIN_DECOUPLED_LR 4u /* steps embedding_or_output parameters at decoupled_lr: runs with --decoupled-lr */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mb_device_type { MB_DEVICE_CPU = 0, MB_DEVICE_CUDA = 1 } mb_device_type;

/* What a parameter is for; plugins use it to exclude biases and norms from weight decay. */
typedef enum mb_role { MB_ROLE_EMBEDDING = 0, MB_ROLE_WEIGHT = 1, MB_ROLE_BIAS = 2, MB_ROLE_NORM = 3 } mb_role;

typedef struct mb_param {
  const char* name;        /* Megatron-style name, e.g. decoder.layers.0.mlp.linear_fc1.weight */
  mb_role role;
  int32_t layer;           /* transformer layer index, -1 outside the layers */
  int32_t ndim;            /* 1 or 2 */
  int32_t embedding_or_output; /* 1: the input embedding or the output layer, stepped at
                              info->decoupled_lr; 0: stepped at info->lr */
  int64_t shape[2];        /* local (this rank's shard) */
  int64_t full_shape[2];   /* unsharded */
  int32_t sharded;         /* 1: split across the tensor-parallel group along partition_dim */
  int32_t partition_dim;   /* -1 when replicated */
  int64_t numel;           /* elements this rank steps: the local ones, or its piece of them */
  float* data;             /* fp32 (master) values, on the run's device (updated in place by step) */
  const float* grad;       /* fp32 mean gradient over the global batch, on the run's device (read only) */
  int64_t offset;          /* distributed optimizer: data[0] is local element `offset`; else 0 */
} mb_param;

typedef enum mb_hparam_type { MB_HPARAM_FLOAT = 0, MB_HPARAM_INT = 1, MB_HPARAM_BOOL = 2 } mb_hparam_type;

/* One hyperparameter of the plugin's schema. Values reach create() as doubles in schema
 * order (ints as whole numbers, bools as 0 or 1), each already checked against min/max.
 * The loader refuses a schema at odds with itself: names not snake_case or declared twice,
 * an empty range, a default outside it, an int default not whole, a bool default not 0/1. */
typedef struct mb_hparam_spec {
  const char* name;        /* snake_case, e.g. "beta1" */
  mb_hparam_type type;
  double default_value;
  double min_value, max_value; /* inclusive range */
  const char* help;        /* one line */
} mb_hparam_spec;

/* The numbers that change from step to step, in run's-device memory at one address for the
 * whole run (info->values). The host writes them, in stream order, before each step(). */
typedef struct mb_step_values {
  int64_t step;            /* == info->step */
  double lr;               /* == info->lr */
  int64_t global_batch;    /* == info->global_batch */
  double weight_decay;     /* == info->weight_decay */
  double decoupled_lr;     /* == info->decoupled_lr */
} mb_step_values;

/* Per-step facts from the host. */
typedef struct mb_step_info {
  int64_t step;            /* the optimizer's step count: 1 for the first applied step */
  double lr;               /* learning rate for this step (after warmup, decay and scaling) */
  int64_t global_batch;    /* samples in this step's global batch */
  uint64_t seed;           /* run seed, for plugins that draw random numbers through the host */
  const double* grad_norm; /* the global L2 norm of the gradients step() sees (after the host's
                              clipping; over all ranks, each element counted once): one double
                              on the run's device */
  int32_t diagnostics;     /* 1: report per-tensor diagnostics through host->metric this
                              step; 0: skip them (they may cost reductions) */
  const float* skip;       /* GPU runs: the overflow flag on the device; when *skip != 0 the
                              step must change nothing. NULL: apply the step. */
  const mb_step_values* values; /* step, lr, global_batch, weight_decay and decoupled_lr again,
                              in run's-device memory */
  double weight_decay;     /* the weight decay for this step: the plugin's weight_decay
                              hyperparameter (0 when it has none) or, when the run schedules it
                              (--weight-decay-incr-style), the schedule's value */
  double decoupled_lr;     /* learning rate of the embedding_or_output parameters for this step:
                              lr, or with --decoupled-lr the value of its own schedule */
} mb_step_info;

/* Services the host offers. Every member is non-null. */
typedef struct mb_host {
  void* ctx;               /* pass back as the first argument */
  int32_t device;          /* MB_DEVICE_CPU or MB_DEVICE_CUDA: where memory lives, where kernels run */
  int32_t device_index;    /* the GPU's index (CUDA) */
  void* stream;            /* cudaStream_t of the run (CUDA); NULL on the CPU */
  /* Zero-filled fp32 state for parameter param_index named `state_name` ("exp_avg"), of
   * `ndim` (1 to 4) dimensions `shape` (this rank's local shape). partition_dim is the
   * dimension split across the tensor-parallel group as the parameter's own partition is
   * (the full shape multiplies it by the group size), or -1 when every rank holds the same
   * values. checkpointed 0 asks for scratch that lives as long but is not saved. Only during
   * create(); returns NULL (and the host reports why) on a bad index, name or shape. */
  float* (*alloc_state)(void* ctx, size_t param_index, const char* state_name, int32_t ndim, const int64_t* shape,
                        int32_t partition_dim, int32_t checkpointed);
  /* Sums values[0..n) (run's device memory) over the tensor-parallel group in place. */
  void (*tp_sum)(void* ctx, double* values, size_t n);
  /* values[num_params * per_param] (run's device memory), per_param values per parameter
   * in parameter order, each a sum over the elements this rank steps, become sums over the
   * whole tensor: added over the data-parallel pieces (distributed optimizer) and, for
   * sharded parameters, over the tensor-parallel group; each element counted once. */
  void (*sum_shards)(void* ctx, double* values, size_t per_param);
  /* Fills out[0..n) (run's device memory) with standard normal draws for the elements this
   * rank steps, each a pure function of (seed, step, param_index, full-tensor element
   * index): identical on any thread count, device or tensor/data-parallel layout. */
  void (*normal)(void* ctx, size_t param_index, int64_t step, float* out, size_t n);
  /* `bytes` of run's-device memory valid until step() (or create()) returns. */
  void* (*scratch)(void* ctx, size_t bytes);
  /* `bytes` of run's-device memory, uninitialized and not checkpointed, that lives until
   * destroy(); at any time, for what a plugin keeps on the device from step to step (the
   * kit's job tables). NULL (and the host reports why) when the device has no room. */
  void* (*alloc_device)(void* ctx, size_t bytes);
  /* Copies host memory to run's-device memory (ordered on the stream; src may be reused
   * when the call returns) and run's-device memory to host memory (waits for the device). */
  void (*upload)(void* ctx, void* device_dst, const void* host_src, size_t bytes);
  void (*download)(void* ctx, void* host_dst, const void* device_src, size_t bytes);
  /* Records a per-tensor diagnostic (e.g. "trust_ratio") for this step; meant for steps
   * with info->diagnostics set (ignored otherwise). Each series lands in metrics.h5 as
   * optimizer/<series>, one row per reported step, one column per parameter. */
  void (*metric)(void* ctx, const char* series, size_t param_index, double value);
  /* A line for the run's console log. */
  void (*log)(void* ctx, const char* message);
} mb_host;

typedef struct mb_plugin_entry {
  uint32_t abi_version;    /* MB_PLUGIN_ABI_VERSION of the header the plugin was built with */
  uint32_t devices;        /* MB_DEVICES_CPU | MB_DEVICES_CUDA (when built with nvcc) */
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
  uint32_t flags; /* MB_PLUGIN_DP_SHARDS | MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR, any of them */
} mb_plugin_entry;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEGABATCH_OPTIM_PLUGIN_H_ */
