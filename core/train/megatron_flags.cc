#include "core/train/megatron_flags.h"

#include <string>

namespace megabatch::train {
using config::ForeignFlag;

namespace {
// How a step runs, not what it computes: fused kernels, overlapped communication.
const char* kHowItRuns =
    "it chooses how Megatron's step runs (fused kernels, overlapped communication), not what it computes; "
    "megabatch's kernels and their order are its own";
const char* kKeepsActivations =
    "megabatch keeps every activation for the backward (the memory check before the run counts them); the "
    "gradients are those recomputation gives";
const char* kTensorBoardHasIt =
    "megabatch writes every series of metrics.h5 to TensorBoard (--tensorboard-dir), this one among them";
const char* kHdf5Checkpoints =
    "megabatch writes and reads checkpoints of its own (HDF5, with checksums), not Megatron's formats; drop it";
const char* kStopsAtNan =
    "megabatch stops a run as diverged (exit status 4, run_dir/DIVERGED) at the first NaN or inf lm loss or gradient "
    "norm, always, naming that iteration (an fp16 loss too: the forward pass overflowed, which no loss scale mends; an "
    "fp16 step whose gradients alone overflow is the loss scaler's to skip; a GPU run learns of it at the next log "
    "line, and never checkpoints after it; an evaluation's NaN loss, and weights a step overflowed, stop it too): "
    "training on from NaN weights learns nothing";
ForeignFlag taken(const char* name, int arity, const char* done) { return {name, arity, done, {}, ""}; }
ForeignFlag refused(const char* name, int arity, std::string why) { return {name, arity, "", {}, std::move(why)}; }
ForeignFlag taken_at(const char* name, const char* value, const char* done, std::string why_not) {
  return {name, 1, done, {value}, std::move(why_not)};
}
}  // namespace

const std::vector<ForeignFlag>& megatron_flags() {
  static const std::vector<ForeignFlag> flags = {
      // taken: what they ask for is what megabatch does anyway
      taken("use_mcore_models", 0, "megabatch has one implementation of each model, with Megatron Core's layout"),
      {"transformer_impl",
       1,
       "megabatch's transformer layer is its own, with the same math as either",
       {"local", "transformer_engine"},
       "Megatron's values are local and transformer_engine"},
      taken("no_masked_softmax_fusion", 0, kHowItRuns),
      taken("no_bias_gelu_fusion", 0, kHowItRuns),
      taken("no_bias_dropout_fusion", 0, kHowItRuns),
      taken("no_bias_swiglu_fusion", 0, kHowItRuns),
      taken("no_rope_fusion", 0, kHowItRuns),
      taken("no_gradient_accumulation_fusion", 0, kHowItRuns),
      taken("no_persist_layer_norm", 0, kHowItRuns),
      taken("cross_entropy_loss_fusion", 0, kHowItRuns),
      taken("no_async_tensor_model_parallel_allreduce", 0, kHowItRuns),
      taken("tp_comm_overlap", 0, kHowItRuns),
      taken("defer_embedding_wgrad_compute", 0, kHowItRuns),
      taken("overlap_param_gather", 0, kHowItRuns),
      taken("sequence_parallel", 0,
            "megabatch keeps the whole sequence on each tensor-parallel rank; the results are the same (dropout is "
            "keyed by element index), only the activation memory differs"),
      taken("recompute_activations", 0, kKeepsActivations),
      taken("recompute_granularity", 1, kKeepsActivations),
      taken("recompute_method", 1, kKeepsActivations),
      taken("recompute_num_layers", 1, kKeepsActivations),
      taken("checkpoint_activations", 0, kKeepsActivations),
      taken("distribute_checkpointed_activations", 0, kKeepsActivations),
      taken("no_scatter_gather_tensors_in_pipeline", 0, "megabatch has no pipeline stages to send tensors between"),
      taken("attention_softmax_in_fp32", 0, "megabatch's attention softmax is in fp32 always"),
      taken("accumulate_allreduce_grads_in_fp32", 0,
            "megabatch accumulates and all-reduces gradients in fp32 always (its main gradients)"),
      taken("apply_query_key_layer_scaling", 0,
            "it divides fp16 attention scores by the layer number and multiplies them back inside the softmax; "
            "megabatch's softmax is in fp32, where that changes nothing"),
      taken("openai_gelu", 0, "megabatch's GELU is the tanh approximation, the one this flag asks for"),
      taken("use_cpu_initialization", 0,
            "megabatch initializes on the CPU always: weights drawn by element index from Philox, then copied to the "
            "device"),
      taken("deterministic_mode", 0,
            "megabatch's runs are deterministic always: the same configuration on the "
            "same device gives the same bits"),
      taken("exit_signal_handler", 0, "megabatch always stops at a checkpoint on SIGTERM, SIGUSR1 and Ctrl-C"),
      taken("no_create_attention_mask_in_dataloader", 0,
            "megabatch's kernels make the attention masks from indices, never the data loader"),
      taken("no_align_grad_reduce", 0, kHowItRuns),
      taken("ddp_average_in_collective", 0,
            "megabatch averages the data-parallel gradients its own way, the same on every rank; the mean is the "
            "same"),
      taken("train_sync_interval", 1,
            "megabatch's host reads the device's step rows at each log line (--log-interval), which keeps it from "
            "running further ahead of the GPU"),
      taken("logging_level", 1, "it sets Python's logging level; megabatch's console lines are its own"),
      taken("num_workers", 1, "megabatch builds the samples in the training process"),
      taken("num_dataset_builder_threads", 1, "megabatch builds the sample index in the training process"),
      taken("data_cache_path", 1, "megabatch builds the sample index in memory when the run starts; no cache file"),
      taken("mmap_bin_files", 0, "megabatch memory-maps the .bin files always"),
      taken("no_mmap_bin_files", 0, "megabatch memory-maps the .bin files always; the samples are the same"),
      taken("manual_gc", 0, "it drives Python's garbage collector; megabatch has none"),
      taken("manual_gc_interval", 1, "it drives Python's garbage collector; megabatch has none"),
      taken("empty_unused_memory_level", 1, "it empties PyTorch's memory cache; megabatch's allocator keeps its own"),
      taken("timing_log_level", 1,
            "the iteration line has the time per iteration; train --profile-steps N times a step by op family"),
      taken("timing_log_option", 1,
            "the iteration line has the time per iteration; train --profile-steps N times a step by op family"),
      taken("log_timers_to_tensorboard", 0,
            "the time per iteration is in TensorBoard (train/iteration_time_ms) with --tensorboard-dir"),
      taken("log_loss_scale_to_tensorboard", 0, kTensorBoardHasIt),
      taken("log_memory_to_tensorboard", 0,
            "megabatch writes the device's memory at every iteration line (memory/allocated_bytes, "
            "max_allocated_bytes, reserved_bytes) to metrics.h5 and, with --tensorboard-dir, TensorBoard always"),
      taken("log_batch_size_to_tensorboard", 0, kTensorBoardHasIt),
      taken("log_learning_rate_to_tensorboard", 0, kTensorBoardHasIt),
      taken("log_validation_ppl_to_tensorboard", 0,
            "megabatch writes the validation and test perplexities (validation/lm_loss_ppl) to TensorBoard always"),
      taken("tensorboard_queue_size", 1, "megabatch writes TensorBoard's events at each flush of metrics.h5"),
      taken("check_for_nan_in_loss_and_grad", 0, kStopsAtNan),
      taken("no_check_for_nan_in_loss_and_grad", 0, kStopsAtNan),
      taken("no_query_key_layer_scaling", 0, "megabatch does not scale attention scores by the layer number"),
      {"data_impl",
       1,
       "megabatch reads Megatron's mmap indexed datasets",
       {"mmap", "infer"},
       "megabatch reads Megatron's mmap indexed datasets (.bin/.idx), not the lazy or cached formats"},
      {"DDP_impl",
       1,
       "megabatch's data parallelism is its own, with the same gradients as either",
       {"local", "torch"},
       "Megatron's values are local and torch"},
      taken_at("pipeline_model_parallel_size", "1", "one pipeline stage is what megabatch runs",
               "megabatch has no pipeline parallelism; spread the model by --tensor-model-parallel-size and the "
               "batch over data-parallel ranks"),
      taken_at("virtual_pipeline_model_parallel_size", "1", "one pipeline stage is what megabatch runs",
               "megabatch has no pipeline parallelism; drop it"),
      taken_at("context_parallel_size", "1", "one context-parallel rank is what megabatch runs",
               "megabatch does not split the sequence over ranks; drop it (long sequences fit by flash attention, "
               "which keeps no T x T scores)"),
      taken_at("expert_model_parallel_size", "1", "megabatch's models have no experts",
               "megabatch's models have no experts (mixture of experts); drop it"),
      taken_at("dataloader_type", "single", "megabatch's loader takes the samples in order, as Megatron's single",
               "megabatch's loader is Megatron's single (the samples in order); drop it"),
      taken_at("rerun_mode", "disabled", "megabatch has no rerun state machine",
               "megabatch has no rerun state machine (its runs are deterministic: a run repeated gives the same "
               "bits); drop it"),

      // refused: megabatch does not do what they ask
      refused("use_flash_attn", 0, "Megatron's older switch for flash attention; say --attention-backend flash"),
      refused("layernorm_epsilon", 1, "Megatron's older name of --norm-epsilon; say --norm-epsilon"),
      refused("yaml_cfg", 1, "megabatch's configuration file is JSON with snake_case keys: --config FILE"),
      refused("use_rotary_position_embeddings", 0,
              "Megatron's older switch for rotary embeddings; say --position-embedding-type rope"),
      refused("fp8_format", 1, "megabatch trains in fp32, bf16 (--bf16) or fp16 (--fp16); it has no fp8"),
      refused("fp8_recipe", 1, "megabatch trains in fp32, bf16 (--bf16) or fp16 (--fp16); it has no fp8"),
      refused("first_last_layers_bf16", 0, "megabatch has no fp8, so all layers are in the run's dtype"),
      refused("fp32_residual_connection", 0,
              "megabatch keeps the residual stream in the run's dtype (Megatron's default); drop it"),
      refused("mock_data", 0,
              "megabatch trains on indexed datasets; `preprocess brown` makes the default one, `preprocess --input` "
              "one from any text"),
      refused("tokenizer_model", 1,
              "megabatch's tokenizers are GPT-2's BPE and BERT's WordPiece (--tokenizer-type, --vocab-file, "
              "--merge-file); it reads no SentencePiece or Hugging Face tokenizer model"),
      refused("fp16_lm_cross_entropy", 0, "megabatch's cross entropy is in fp32 always; drop it"),
      refused("num_layers_per_virtual_pipeline_stage", 1, "megabatch has no pipeline parallelism; drop it"),
      refused("no_load_rng", 0,
              "a resume restores the random state and data position with the weights, which is what makes it exact; "
              "--finetune takes the weights alone"),
      refused("no_save_optim", 0, "megabatch's checkpoints always hold the optimizer state, so a run resumes exactly"),
      refused("no_save_rng", 0, "megabatch's checkpoints always hold the random state, so a run resumes exactly"),
      refused("non_persistent_save_interval", 1, "megabatch keeps the newest checkpoints: --keep-checkpoints N"),
      refused("ckpt_format", 1, kHdf5Checkpoints),
      refused("dist_ckpt_strictness", 1, kHdf5Checkpoints),
      refused("async_save", 0, kHdf5Checkpoints),
      refused("ckpt_fully_parallel_save", 0, kHdf5Checkpoints),
      refused("ckpt_fully_parallel_load", 0, kHdf5Checkpoints),
      refused("profile", 0, "megabatch's profile is --profile-steps N (a step's time by op family)"),
      refused("use_pytorch_profiler", 0, "megabatch's profile is --profile-steps N (a step's time by op family)"),
      refused("profile_step_start", 1, "megabatch's profile is --profile-steps N, after 2 warm-up iterations"),
      refused("profile_step_end", 1, "megabatch's profile is --profile-steps N, after 2 warm-up iterations"),
      refused("record_memory_history", 0, "it records PyTorch's allocator; megabatch has no such record; drop it"),
      refused("memory_snapshot_path", 1, "it records PyTorch's allocator; megabatch has no such record; drop it"),
      refused("log_world_size_to_tensorboard", 0,
              "megabatch does not write the world size to TensorBoard (config.json has the layout); drop it"),
      refused("log_progress", 0, "megabatch writes no progress.txt; metrics.h5 has every iteration; drop it"),
      refused("log_straggler", 0, "megabatch has no straggler detector; drop it"),
      refused("log_energy", 0, "megabatch does not read the GPUs' energy counters; drop it"),
      refused("use_torch_fsdp2", 0,
              "megabatch shards the optimizer state and master weights over the data-parallel ranks with "
              "--use-distributed-optimizer, not FSDP; use that"),
      refused("grad_reduce_in_bf16", 0,
              "megabatch sums the data-parallel gradients in fp32 always (its main gradients); drop it"),
      refused("wandb_project", 1, "megabatch logs to metrics.h5 and TensorBoard (--tensorboard-dir), not W&B"),
      refused("wandb_exp_name", 1, "megabatch logs to metrics.h5 and TensorBoard (--tensorboard-dir), not W&B"),
      refused("wandb_save_dir", 1, "megabatch logs to metrics.h5 and TensorBoard (--tensorboard-dir), not W&B"),
  };
  return flags;
}

}  // namespace megabatch::train
