#include "core/train/options.h"

#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/train/megatron_flags.h"
#include "core/train/noise_scale.h"
#include "core/util/error.h"

namespace megabatch::train {
using config::Option;
using config::Type;
using nlohmann::json;

namespace {
using config::above;
using config::at_least;
using config::within;

// The accepted values of every number option (each must have one: a new option without
// its range is caught by the first call).
const std::map<std::string, config::Range>& ranges() {
  static const std::map<std::string, config::Range> r = {
      {"threads", at_least(0)},
      {"seed", at_least(0)},
      {"num_layers", at_least(1)},
      {"hidden_size", at_least(1)},
      {"num_attention_heads", at_least(1)},
      {"ffn_hidden_size", at_least(1)},
      {"seq_length", at_least(1)},
      {"max_position_embeddings", at_least(1)},
      {"hidden_dropout", within(0, 1, true)},
      {"rotary_percent", {0, 1, true, false}},
      {"rotary_base", above(1)},
      {"rotary_seq_len_interpolation_factor", at_least(1)},
      {"norm_epsilon", above(0)},
      {"kv_channels", at_least(1)},
      {"num_query_groups", at_least(1)},
      {"attention_dropout", within(0, 1, true)},
      {"embedding_init_method_std", above(0)},
      {"mask_prob", config::Range{0, 1, true, false}},
      {"short_seq_prob", within(0, 1)},
      {"init_method_std", above(0)},
      {"make_vocab_size_divisible_by", at_least(1)},
      {"tensor_model_parallel_size", at_least(1)},
      {"data_parallel_size", at_least(1)},
      {"ddp_bucket_size", at_least(1)},
      {"encoder_num_layers", at_least(1)},
      {"decoder_num_layers", at_least(1)},
      {"encoder_seq_length", at_least(1)},
      {"decoder_seq_length", at_least(1)},
      {"relative_attention_num_buckets", at_least(1)},
      {"relative_attention_max_distance", at_least(1)},
      {"vocab_extra_ids", at_least(0)},
      {"loss_scale", above(0)},
      {"initial_loss_scale", above(0)},
      {"min_loss_scale", above(0)},
      {"loss_scale_window", at_least(1)},
      {"hysteresis", at_least(1)},
      {"micro_batch_size", at_least(1)},
      {"global_batch_size", at_least(1)},
      {"train_iters", at_least(1)},
      {"train_samples", at_least(1)},
      {"rampup_batch_size", at_least(1)},
      {"iterations_to_skip", at_least(1)},
      {"lr", at_least(0)},
      {"min_lr", at_least(0)},
      {"lr_decay_power", above(0)},
      {"lr_decay_iters", at_least(1)},
      {"lr_decay_samples", at_least(1)},
      {"lr_warmup_iters", at_least(0)},
      {"lr_warmup_samples", at_least(0)},
      {"lr_warmup_fraction", within(0, 1)},
      {"lr_scaling_ref_batch", at_least(1)},
      {"lr_warmup_init", at_least(0)},
      {"lr_wsd_decay_iters", at_least(0)},
      {"lr_wsd_decay_samples", at_least(0)},
      {"decoupled_lr", at_least(0)},
      {"decoupled_min_lr", at_least(0)},
      {"weight_decay", at_least(0)},
      {"start_weight_decay", at_least(0)},
      {"end_weight_decay", at_least(0)},
      {"clip_grad", at_least(0)},
      {"adam_beta1", within(0, 1, true)},
      {"adam_beta2", within(0, 1, true)},
      {"adam_eps", above(0)},
      {"sgd_momentum", within(0, 1)},
      {"save_interval", at_least(0)},
      {"exit_interval", at_least(0)},
      {"exit_duration_in_mins", above(0)},
      {"distributed_timeout_minutes", at_least(0)},
      {"keep_checkpoints", at_least(0)},
      {"save_retain_interval", at_least(1)},
      {"ckpt_step", at_least(0)},
      {"log_interval", at_least(1)},
      {"eval_interval", at_least(0)},
      {"eval_iters", at_least(0)},
      {"eval_samples", at_least(1)},
      {"diagnostics_interval", at_least(0)},
      {"tensorboard_log_interval", at_least(1)},
      {"divergence_loss", above(0)},
      {"divergence_intervals", at_least(1)},
      {"noise_scale_ema", within(0, 1, true)},
      {"noise_scale_window", at_least(1)},
      {"profile_steps", at_least(0)},
      {"check_weight_hash_across_dp_replicas_interval", at_least(1)},
  };
  return r;
}

config::Schema with_ranges(const std::string& program, std::vector<Option> options) {
  for (auto& o : options) {
    if (o.type != Type::kInt && o.type != Type::kFloat && o.type != Type::kIntList) continue;
    const auto it = ranges().find(o.name);
    if (it == ranges().end()) throw std::logic_error("train option " + o.name + " has no range in options.cc");
    o.range = it->second;
  }
  for (const auto& f : megatron_flags())
    for (const auto& o : options)
      if (o.name == f.name) throw std::logic_error("train option " + o.name + " is in megatron_flags.cc too");
  return config::Schema(program, std::move(options), megatron_flags());
}
}  // namespace

const config::Schema& train_schema() {
  static const config::Schema schema = with_ranges(
      "train",
      {
          {"config", Type::kString, nullptr, "JSON file of options (snake_case keys); flags override it", "run"},
          {"model", Type::kString, nullptr, "model preset (gpt-mini, gpt2-124m, gpt-1.7b, ...; see --list-models)",
           "run"},
          {"list_models", Type::kBool, false, "print the model presets and exit", "run"},
          {"print_params", Type::kBool, false, "print parameter count and memory estimate, then exit", "run"},
          {"print_config", Type::kBool, false,
           "print the options as train reads them (--config file, then the flags, in either --flag value or "
           "--flag=value "
           "form; defaults filled in) as one JSON object, then exit; launchers read their layout checks from it",
           "run"},
          {"skip_memory_check", Type::kBool, false,
           "start even when the memory estimate exceeds the memory available (the estimate assumes two fp32 "
           "optimizer states per parameter)",
           "run"},
          {"check", Type::kBool, false,
           "validate the configuration, the optimizer plugin and its hyperparameters, the data files and the memory "
           "estimate, then exit (sweep run --dry-run checks every point this way)",
           "run"},
          {"skip_train", Type::kBool, false,
           "evaluate without training (Megatron's --skip-train): the validation and test splits, as at the end of "
           "training, at the iteration of the checkpoint --load gives (or the weights of --pretrained-checkpoint); "
           "the results go to the console and to run_dir's metrics.h5 (validation/, test/); nothing is saved",
           "run"},
          {"run_dir", Type::kString, "runs/train", "where config.json and metrics.h5 are written", "run"},
          {"threads", Type::kInt, 0, "CPU threads (0: all cores, shared out among the ranks on a node)", "run"},
          {"device", Type::kString, nullptr,
           "cpu, cuda or cuda:N (default: cuda when this build has CUDA and a GPU is visible, else cpu)", "run"},
          {"distributed_backend", Type::kString, "auto",
           "collectives of the TP and DP groups: auto (NCCL on GPUs when every rank has a GPU of its own, else MPI), "
           "nccl, "
           "or mpi (on GPUs: staged through host memory, so several ranks can share one GPU)",
           "run"},
          {"distributed_timeout_minutes", Type::kFloat, 10.0,
           "end the job when a collective of the TP or DP group has waited this many minutes for the other ranks "
           "(fractions allowed; 0: no deadline): one died, hung or was stopped; the rank says which group and exits "
           "5, and a rerun resumes from the last checkpoint",
           "run"},
          {"overlap_grad_reduce", Type::kBool, false,
           "data parallelism: sum each gradient bucket over the DP group as soon as the last micro-batch's backward "
           "pass "
           "has finished it, overlapping the rest of the backward pass",
           "run"},
          {"check_weight_hash_across_dp_replicas_interval", Type::kInt, nullptr,
           "data parallelism: every N iterations (and at the start) each replica hashes its weights and the group "
           "compares them; replicas that differ stop the job naming the first parameter (Megatron's)",
           "distributed"},
          {"use_distributed_optimizer", Type::kBool, false,
           "Megatron's distributed optimizer: gradients reduce-scattered over the DP group, each rank keeps and steps "
           "only its shard of the optimizer state and (bf16, fp16) of the fp32 master weights, parameters all-gathered "
           "after "
           "the step (plugins that declare "
           "MB_PLUGIN_DP_SHARDS)",
           "run"},
          {"ddp_bucket_size", Type::kInt, nullptr,
           "gradient elements per data-parallel bucket (default: max(40M, 1M x DP) with --overlap-grad-reduce, else "
           "one "
           "bucket)",
           "run"},
          {"seed", Type::kInt, 1234, "random seed (initialization, data order, dropout)", "run"},

          {"model_type", Type::kString, nullptr, "gpt, bert or t5, for a model without --model (default gpt)", "model"},
          {"num_layers", Type::kInt, nullptr, "transformer layers", "model"},
          {"hidden_size", Type::kInt, nullptr, "hidden size", "model"},
          {"num_attention_heads", Type::kInt, nullptr, "attention heads", "model"},
          {"ffn_hidden_size", Type::kInt, nullptr, "MLP hidden size (default 4 x hidden)", "model"},
          {"seq_length", Type::kInt, nullptr, "sequence length", "model"},
          {"max_position_embeddings", Type::kInt, nullptr, "position embeddings (default seq_length)", "model"},
          {"hidden_dropout", Type::kFloat, 0.1, "dropout after attention and MLP outputs and embeddings", "model"},
          {"attention_dropout", Type::kFloat, 0.1, "dropout of attention probabilities", "model"},
          {"init_method_std", Type::kFloat, 0.02, "std of the normal initialization", "model"},
          {"embedding_init_method_std", Type::kFloat, nullptr,
           "std of the word, position and token-type embeddings' normal initialization, where it differs from "
           "--init-method-std (then normal even with --init-method-xavier-uniform, as Megatron's)",
           "model"},
          {"init_method_xavier_uniform", Type::kBool, false,
           "initialize the weights and embeddings from U(-a, a), a = sqrt(6 / (fan in + fan out)) of each full "
           "tensor, instead of the normal of --init-method-std (Megatron's)",
           "model"},
          {"make_vocab_size_divisible_by", Type::kInt, 128, "pad the vocabulary to a multiple of this x TP", "model"},
          {"tensor_model_parallel_size", Type::kInt, 1, "tensor-parallel ranks", "model"},
          {"data_parallel_size", Type::kInt, nullptr,
           "data-parallel ranks the run expects (default: the job's ranks / TP); a job of another size is refused, and "
           "sweep run starts TP x DP ranks for the point",
           "model"},
          {"encoder_num_layers", Type::kInt, nullptr, "T5 encoder layers (default num_layers)", "model"},
          {"decoder_num_layers", Type::kInt, nullptr, "T5 decoder layers (default num_layers)", "model"},
          {"encoder_seq_length", Type::kInt, nullptr, "T5 encoder sequence length (default seq_length)", "model"},
          {"decoder_seq_length", Type::kInt, nullptr, "T5 decoder sequence length", "model"},
          {"position_embedding_type", Type::kString, "learned_absolute",
           "learned_absolute, relative (T5: relative position buckets), or rope (GPT: rotary embeddings, in Megatron's "
           "rotate-half form)",
           "model"},
          {"no_position_embedding", Type::kBool, false,
           "GPT and BERT: no learned position embeddings (Megatron's; NoPE: a GPT's causal mask alone tells it the "
           "positions)",
           "model"},
          {"rotary_percent", Type::kFloat, 1.0,
           "rope: the share of each head's channels that turn (Megatron's; the first ones)", "model"},
          {"rotary_base", Type::kFloat, 10000.0, "rope: the base of the rotary frequencies (Megatron's)", "model"},
          {"rotary_interleaved", Type::kBool, false,
           "rope: turn channel pairs (2i, 2i + 1) (GPT-J's interleaved form) instead of (i, i + d/2)", "model"},
          {"rotary_seq_len_interpolation_factor", Type::kInt, nullptr,
           "rope: positions divided by this factor (linear position interpolation, to run a model at a longer "
           "sequence than it was trained at)",
           "model"},
          {"relative_attention_num_buckets", Type::kInt, 32, "T5 relative position buckets", "model"},
          {"relative_attention_max_distance", Type::kInt, 128, "distance of T5's last relative position bucket",
           "model"},
          {"vocab_extra_ids", Type::kInt, nullptr, "T5 sentinel tokens appended to the vocabulary (T5 default 100)",
           "model"},
          {"normalization", Type::kString, "LayerNorm", "LayerNorm, or RMSNorm (T5's, weight only)", "model"},
          {"norm_epsilon", Type::kFloat, 1e-5, "epsilon of every LayerNorm or RMSNorm", "model"},
          {"kv_channels", Type::kInt, nullptr,
           "channels of each attention head: hidden / heads, the one value megabatch's attention takes (Megatron's "
           "default; given by its example scripts)",
           "model"},
          {"apply_layernorm_1p", Type::kBool, false,
           "every LayerNorm's (or RMSNorm's) weight stored as w and applied as 1 + w, initialized 0 (Megatron's)",
           "model"},
          {"apply_residual_connection_post_layernorm", Type::kBool, false,
           "pre-LN blocks whose residual is taken after the norm: x = ln(x) + drop(f(ln(x))) for the attention and "
           "the MLP (Megatron's; GLM's and BLOOM's option)",
           "model"},
          {"qk_layernorm", Type::kBool, false,
           "GPT and BERT: a LayerNorm (RMSNorm with --normalization RMSNorm) over each head's query and key, before "
           "the rotary embeddings (Megatron's; it keeps attention logits from growing at large learning rates)",
           "model"},
          {"group_query_attention", Type::kBool, false,
           "GPT and BERT: grouped-query attention, the heads sharing --num-query-groups key/value heads (Megatron's)",
           "model"},
          {"num_query_groups", Type::kInt, 1,
           "with --group-query-attention: the key/value heads, each shared by heads / groups query heads; divides the "
           "heads, and the tensor-parallel size divides it",
           "model"},
          {"attention_backend", Type::kString, "auto",
           "attention: auto (flash attention where its kernels run: a CUDA GPU, bf16 or fp16, head dim 64 or 128; the "
           "explicit form elsewhere), flash (flash attention, refused where it cannot run), unfused or local (the "
           "explicit "
           "form: scores, softmax, probabilities times values)",
           "model"},
          {"eod_mask_loss", Type::kBool, false,
           "GPT: no loss at positions whose input is the end-of-document token (the next document's first token, which "
           "nothing before it predicts)",
           "model"},
          {"reset_position_ids", Type::kBool, false,
           "GPT with learned positions: each document of a sample takes positions from 0 (after each "
           "end-of-document token), instead of the sample's (Megatron's)",
           "model"},
          {"reset_attention_mask", Type::kBool, false,
           "GPT: each document of a sample attends to its own tokens only (the attention starts again after each "
           "end-of-document token), instead of across the sample's documents (Megatron's)",
           "model"},
          {"bert_no_binary_head", Type::kBool, false, "BERT without the sentence-order head and its loss", "model"},
          {"swiglu", Type::kBool, false,
           "the MLP gated as LLaMA's: fc1 gives ffn (gate, up) pairs, fc2 takes silu(gate) x up (Megatron's --swiglu; "
           "give --ffn-hidden-size, as its scripts do, or it stays 4 x hidden)",
           "model"},
          {"squared_relu", Type::kBool, false,
           "the MLP's activation max(x, 0)^2 instead of GELU (Megatron's --squared-relu; Primer's MLP)", "model"},
          {"disable_bias_linear", Type::kBool, false,
           "the transformer layers' linear layers (QKV, projections, MLP) without biases; LayerNorms keep theirs",
           "model"},
          {"add_qkv_bias", Type::kBool, false, "with --disable-bias-linear: the QKV projections keep their biases",
           "model"},
          {"untie_embeddings_and_output_weights", Type::kBool, false,
           "GPT: an output layer of its own (output_layer.weight) instead of the word embeddings", "model"},
          {"post_layernorm", Type::kBool, false,
           "BERT: the original post-LN blocks and embedding LayerNorm (Megatron: pre-LN)", "model"},

          {"bf16", Type::kBool, false,
           "bf16 weights and activations, fp32 main gradients and master weights (A100, H100)", "mixed precision"},
          {"fp16", Type::kBool, false,
           "fp16 weights and activations with loss scaling, fp32 main gradients and master weights", "mixed precision"},
          {"loss_scale", Type::kFloat, nullptr, "fp16: a static loss scale (default: dynamic loss scaling)",
           "mixed precision"},
          {"initial_loss_scale", Type::kFloat, 4294967296.0, "fp16: initial dynamic loss scale", "mixed precision"},
          {"min_loss_scale", Type::kFloat, 1.0, "fp16: the dynamic loss scale never goes below this",
           "mixed precision"},
          {"loss_scale_window", Type::kInt, 1000, "fp16: clean iterations before the dynamic loss scale doubles",
           "mixed precision"},
          {"hysteresis", Type::kInt, 2, "fp16: overflowing iterations tolerated before the loss scale is halved",
           "mixed precision"},

          {"micro_batch_size", Type::kInt, 8, "samples per forward/backward pass", "batch"},
          {"global_batch_size", Type::kInt, nullptr,
           "samples per optimizer step (default micro_batch_size x data-parallel size)", "batch"},
          {"train_iters", Type::kInt, nullptr, "optimizer steps (or --train-samples)", "batch"},
          {"train_samples", Type::kInt, nullptr, "samples to train on (or --train-iters)", "batch"},
          {"iterations_to_skip", Type::kIntList, nullptr,
           "N [N ...]: these iterations (numbered as the log's lines) train on nothing: their global batch of samples "
           "is passed over, the learning rate does not advance (Megatron's; with --ckpt-step, PaLM's way past a loss "
           "spike: rewind before it, skip the batches around it)",
           "batch"},
          {"rampup_batch_size", Type::kIntList, nullptr,
           "START INCREMENT SAMPLES: the global batch starts at START and grows by INCREMENT to --global-batch-size "
           "over the first SAMPLES samples, in equal shares (with --train-samples; the learning rate counts samples, "
           "and --lr-scaling scales by --global-batch-size)",
           "batch"},

          {"lr", Type::kFloat, nullptr, "peak learning rate (before the scaling rule)", "learning rate"},
          {"min_lr", Type::kFloat, 0.0, "learning rate at the end of decay", "learning rate"},
          {"decoupled_lr", Type::kFloat, nullptr,
           "peak learning rate of the input embedding and output layer (Megatron's; same warmup and decay, scaled as "
           "--lr)",
           "learning rate"},
          {"decoupled_min_lr", Type::kFloat, nullptr, "their learning rate at the end of decay (default --min-lr)",
           "learning rate"},
          {"lr_decay_style", Type::kString, "linear",
           "constant, linear, cosine, inverse-square-root, polynomial, or WSD (warmup, stable, decay: --lr at the end "
           "of "
           "the warmup until the last --lr-wsd-decay-iters of the decay span, then down to --min-lr)",
           "learning rate"},
          {"lr_wsd_decay_style", Type::kString, "exponential",
           "WSD's decay: exponential, linear, cosine, minus_sqrt (1 - sqrt of its fraction)", "learning rate"},
          {"lr_wsd_decay_iters", Type::kInt, nullptr, "WSD: iterations of the decay, the end of the decay span",
           "learning rate"},
          {"lr_wsd_decay_samples", Type::kInt, nullptr, "WSD: samples of the decay (with --train-samples)",
           "learning rate"},
          {"lr_decay_power", Type::kFloat, 1.0, "power of the polynomial decay", "learning rate"},
          {"lr_decay_iters", Type::kInt, nullptr, "decay over this many iterations (default train_iters)",
           "learning rate"},
          {"lr_decay_samples", Type::kInt, nullptr, "decay over this many samples (with --train-samples)",
           "learning rate"},
          {"lr_warmup_iters", Type::kInt, 0, "linear warmup iterations", "learning rate"},
          {"lr_warmup_samples", Type::kInt, 0, "linear warmup samples", "learning rate"},
          {"lr_warmup_fraction", Type::kFloat, nullptr, "warmup as a fraction of the decay span", "learning rate"},
          {"lr_warmup_init", Type::kFloat, 0.0,
           "learning rate the warmup starts from (after the scaling rule, as --lr)", "learning rate"},
          {"lr_scaling", Type::kString, "none", "scale lr and min_lr with the global batch: none, sqrt, linear",
           "learning rate"},
          {"lr_scaling_ref_batch", Type::kInt, nullptr, "global batch size at which lr is given", "learning rate"},

          {"optimizer", Type::kString, "adamw", "optimizer plugin name (see --list-optimizers)", "optimizer"},
          {"optimizer_params", Type::kObject, json::object(),
           "plugin hyperparameter, e.g. --optimizer-params beta2=0.95", "optimizer"},
          {"list_optimizers", Type::kBool, false, "print the optimizer plugins found and their hyperparameters",
           "optimizer"},
          {"plugin_path", Type::kStringList, json::array(), "extra directories searched for optimizer plugins",
           "optimizer"},
          {"weight_decay", Type::kFloat, 0.01, "weight decay (passed to the plugin's weight_decay)", "optimizer"},
          {"start_weight_decay", Type::kFloat, nullptr,
           "weight decay at the start of a --weight-decay-incr-style schedule", "optimizer"},
          {"end_weight_decay", Type::kFloat, nullptr, "weight decay at the end of a --weight-decay-incr-style schedule",
           "optimizer"},
          {"weight_decay_incr_style", Type::kString, "constant",
           "weight decay over the run, from --start-weight-decay to --end-weight-decay: constant (--weight-decay "
           "throughout), linear, cosine",
           "optimizer"},
          {"clip_grad", Type::kFloat, 1.0, "global gradient-norm clipping (0: off)", "optimizer"},
          {"calculate_per_token_loss", Type::kBool, false,
           "the lm loss as the mean over the global batch's counted tokens, each token weighing the same (Megatron's), "
           "instead of the mean over the micro-batches of each one's mean: the step then does not depend on how the "
           "batch is split into micro-batches and ranks where their token counts differ (BERT's masked tokens, "
           "--eod-mask-loss)",
           "optimizer"},
          {"adam_beta1", Type::kFloat, 0.9, "passed to the plugin's beta1", "optimizer"},
          {"adam_beta2", Type::kFloat, 0.999, "passed to the plugin's beta2", "optimizer"},
          {"adam_eps", Type::kFloat, 1e-8, "passed to the plugin's eps", "optimizer"},
          {"sgd_momentum", Type::kFloat, 0.9, "passed to the plugin's momentum", "optimizer"},

          {"data_path", Type::kStringList, nullptr,
           "indexed dataset prefix (.bin/.idx), or a weighted blend, W1 PREFIX1 W2 PREFIX2 ... (prefixes without "
           "weights weigh "
           "their samples); default data/brown_gpt2_text_document (GPT), data/brown_bert_text_sentence (BERT)",
           "data"},
          {"split", Type::kString, "969, 30, 1", "train, validation, test proportions by document", "data"},
          {"mask_prob", Type::kFloat, 0.15,
           "BERT: the share of each sample's tokens masked and predicted (of them 80% [MASK], 10% a random token, 10% "
           "unchanged); T5: the share of tokens corrupted into spans (Megatron's)",
           "data"},
          {"bert_masking", Type::kString, "token",
           "BERT: token (each masked token chosen alone, as the original BERT) or whole-word (Megatron's: whole words "
           "with their ## pieces, in n-grams of 1 to 3 words drawn with probability proportional to 1/n, to "
           "min(p x the sample's target length, round(p x its tokens)))",
           "data"},
          {"t5_masking", Type::kString, "span",
           "T5: span (T5's span corruption: spans of mean length 3 in a uniformly random composition) or whole-word "
           "(Megatron's: each span an n-gram of whole words, of a geometric number of words (p = 0.2) up to 10, to "
           "min(p x the sample's target length, round(p x its tokens)) tokens)",
           "data"},
          {"short_seq_prob", Type::kFloat, 0.1,
           "BERT and T5: the probability that a sample is filled to a shorter length, drawn uniformly from 2 up "
           "(Megatron's)",
           "data"},
          {"train_data_path", Type::kStringList, nullptr,
           "the training data, whole (a prefix or a blend, as --data-path): with --valid-data-path and "
           "--test-data-path "
           "instead of --data-path and --split",
           "data"},
          {"valid_data_path", Type::kStringList, nullptr, "the validation data, whole (beside --train-data-path)",
           "data"},
          {"test_data_path", Type::kStringList, nullptr, "the test data, whole (beside --train-data-path)", "data"},
          {"data_args_path", Type::kString, nullptr, "a file holding --data-path's list (whitespace-separated)",
           "data"},
          {"per_split_data_args_path", Type::kString, nullptr,
           "a JSON file holding each split's data: {\"train\": [...], \"valid\": [...], \"test\": [...]}", "data"},
          {"tokenizer_type", Type::kString, nullptr,
           "GPT2BPETokenizer (GPT's default), BertWordPieceLowerCase (BERT's default), BertWordPieceCase", "data"},
          {"vocab_file", Type::kString, nullptr, "vocabulary (default: the asset cache's)", "data"},
          {"merge_file", Type::kString, nullptr, "GPT-2 merges (default: the asset cache's)", "data"},

          {"save", Type::kString, nullptr, "directory for checkpoints (iter_NNNNNNN.h5)", "checkpointing"},
          {"save_interval", Type::kInt, 0, "iterations between checkpoints (0: only at the end and on exit)",
           "checkpointing"},
          {"load", Type::kString, nullptr,
           "resume from the newest checkpoint in this directory (none there: start fresh), or from this checkpoint "
           "file",
           "checkpointing"},
          {"ckpt_step", Type::kInt, nullptr,
           "resume from the checkpoint of this iteration in --load's directory, not the newest (Megatron's); the "
           "later ones there are set aside in DIR/earlier/N, and the run directory's metrics.h5 as it was is "
           "copied to RUN_DIR/earlier/N",
           "checkpointing"},
          {"load_fallback", Type::kBool, false,
           "when the newest checkpoint in --load is damaged (a tensor fails its checksum), resume from the newest "
           "intact "
           "one instead of stopping",
           "checkpointing"},
          {"exit_interval", Type::kInt, 0, "stop after this iteration, writing a checkpoint first when --save is set",
           "checkpointing"},
          {"exit_duration_in_mins", Type::kFloat, nullptr,
           "stop after the iteration that ends this many minutes into training (fractions allowed), writing a "
           "checkpoint first when --save is set; exit status 3, resumable, as a stop by signal",
           "checkpointing"},
          {"keep_checkpoints", Type::kInt, 0, "keep only the newest K checkpoints (0: all)", "checkpointing"},
          {"save_retain_interval", Type::kInt, nullptr,
           "keep the checkpoints of iterations that are multiples of this for good, whatever --keep-checkpoints "
           "removes; the others as --keep-checkpoints says, or only the newest without it (Megatron's); a multiple "
           "of --save-interval",
           "checkpointing"},
          {"finetune", Type::kBool, false, "load only the model from --load and start at iteration 0", "checkpointing"},
          {"pretrained_checkpoint", Type::kString, nullptr,
           "when --load holds no checkpoint of this run (a first start), take the model from this checkpoint (the "
           "newest "
           "in a directory, or a file) and start at iteration 0 with a fresh optimizer; a run that resumes from --load "
           "does "
           "not read it",
           "checkpointing"},
          {"pretrained_optimizer_state", Type::kBool, false,
           "with --pretrained-checkpoint, a first start also takes the optimizer plugin's state (LAMB's and AdamW's "
           "moments) from there, as NVIDIA's BERT recipe carries LAMB's into phase 2; the step count, learning-rate "
           "schedule, loss scale and data start afresh",
           "checkpointing"},
          {"no_load_optim", Type::kBool, false, "resume from --load without the optimizer state", "checkpointing"},
          {"use_checkpoint_args", Type::kBool, false,
           "take the model's options (family, sizes, positions, norms, tokenizer) from the checkpoint the run loads "
           "(--load's, else --pretrained-checkpoint's); one given otherwise is refused (Megatron's)",
           "checkpointing"},
          {"exit_on_missing_checkpoint", Type::kBool, false,
           "stop with an error where --load holds no checkpoint, instead of starting from scratch (a mistyped path) "
           "(Megatron's)",
           "checkpointing"},
          {"override_opt_param_scheduler", Type::kBool, false,
           "resuming with other learning-rate settings than the checkpoint was trained with (refused otherwise): take "
           "this run's (Megatron's; its spelling --override-opt_param-scheduler works too)",
           "checkpointing"},
          {"use_checkpoint_opt_param_scheduler", Type::kBool, false,
           "resuming with other learning-rate settings than the checkpoint was trained with (refused otherwise): keep "
           "the checkpoint's (Megatron's; --use-checkpoint-opt_param-scheduler works too)",
           "checkpointing"},

          {"log_interval", Type::kInt, 100, "iterations between console lines and metrics flushes", "logging"},
          {"eval_interval", Type::kInt, 1000, "iterations between validation runs", "logging"},
          {"eval_iters", Type::kInt, 100, "global batches per validation run (0: none)", "logging"},
          {"profile_steps", Type::kInt, 0,
           "after 2 warm-up iterations, time N iterations by op family (on a GPU: each kernel's time, from CUPTI) and "
           "print "
           "the table once (0: off)",
           "logging"},
          {"eval_samples", Type::kInt, nullptr,
           "samples per validation run instead of eval_iters global batches, in an order that does not depend on "
           "--seed: "
           "the same held-out samples for every batch size and seed (a multiple of micro_batch_size); a split with "
           "fewer "
           "samples is evaluated whole, each sample once (--eval-iters beside it: refused, unless 0)",
           "logging"},
          {"diagnostics_interval", Type::kInt, nullptr,
           "per-tensor optimizer diagnostics (trust ratio, weight and update norms) every N iterations "
           "(default: log_interval; 0: off)",
           "logging"},
          {"log_noise_scale", Type::kBool, false,
           "estimate the gradient noise scale B_simple (needs >= 2 micro-batches per global batch)", "logging"},
          {"noise_scale_ema", Type::kFloat, 0.99, "moving-average decay a step of the noise-scale estimates",
           "logging"},
          {"noise_scale_window", Type::kInt, nullptr,
           "instead of --noise-scale-ema, the moving averages' window in samples (decay exp(-global batch / window) a "
           "step): runs at different batch sizes then average over the same samples and compare at the same loss",
           "logging"},
          {"log_throughput", Type::kBool, false,
           "add Megatron's throughput per GPU (TFLOP/s/GPU) to the iteration line", "logging"},
          {"log_params_norm", Type::kBool, false, "add the parameters' L2 norm (params norm) to the iteration line",
           "logging"},
          {"log_num_zeros_in_grad", Type::kBool, false,
           "add the number of zeros in the gradients (num zeros) to the iteration line", "logging"},
          {"tensorboard_dir", Type::kString, nullptr,
           "also write every metric as TensorBoard scalars (event files) to this directory", "logging"},
          {"tensorboard_log_interval", Type::kInt, 1,
           "TensorBoard takes the training series at the iterations this divides (validation and test at every "
           "evaluation; metrics.h5 has every iteration)",
           "logging"},
          {"divergence_loss", Type::kFloat, nullptr,
           "stop as diverged (exit status 4, run_dir/DIVERGED) when the lm loss averaged over a log interval stays "
           "above "
           "this for divergence_intervals intervals in a row (default: 2 ln(padded vocab), twice the loss of a uniform "
           "guess); a NaN or infinite loss or gradient norm stops the run at once, as do a NaN or infinite evaluation "
           "loss and weights that are not finite when a checkpoint is due",
           "logging"},
          {"divergence_intervals", Type::kInt, 3,
           "log intervals in a row above divergence_loss that make a run diverged (and, fp16, of nothing but "
           "overflowing steps at the lowest loss scale)",
           "logging"},
      });
  return schema;
}

// The dtype of --bf16 / --fp16 (f32 otherwise) and the fp16 loss scaler of Megatron's flags.
DType run_dtype(const json& v) {
  const bool bf16 = v["bf16"].get<bool>(), fp16 = v["fp16"].get<bool>();
  check(!(bf16 && fp16), "--bf16 and --fp16 are mutually exclusive; pick one (bf16 needs no loss scaling)");
  return bf16 ? DType::kBF16 : fp16 ? DType::kF16 : DType::kF32;
}

ops::LossScalerConfig loss_scaler(const config::Resolved& r, DType dtype) {
  const json& v = r.values;
  for (const char* k : {"loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"})
    check(!r.given(k) || dtype == DType::kF16, "--", config::flag_name(k),
              " is for --fp16 runs (loss scaling); ", dtype == DType::kBF16 ? "bf16 needs none" : "add --fp16",
              " or drop it");
  ops::LossScalerConfig c;
  c.dynamic = !v.contains("loss_scale");
  c.initial_scale = static_cast<float>(c.dynamic ? v["initial_loss_scale"].get<double>() : v["loss_scale"].get<double>());
  c.min_scale = static_cast<float>(v["min_loss_scale"].get<double>());
  c.window = static_cast<int32_t>(v["loss_scale_window"].get<int64_t>());
  c.hysteresis = static_cast<int32_t>(v["hysteresis"].get<int64_t>());
  check(std::isfinite(c.initial_scale) && c.initial_scale > 0, c.dynamic ? "--initial-loss-scale" : "--loss-scale",
            " must be a positive finite number");
  check(c.min_scale > 0 && c.min_scale <= c.initial_scale, "--min-loss-scale must be in (0, initial loss scale]");
  check(c.window >= 1 && c.hysteresis >= 1, "--loss-scale-window and --hysteresis must be >= 1");
  return c;
}

std::string schedule_key_counting(const json& v, const std::string& unit) {
  for (const std::string kind : {"lr_warmup_", "lr_decay_", "lr_wsd_decay_"}) {
    const std::string key = kind + unit;
    if (!v.contains(key) || v[key].is_null()) continue;
    if (kind != "lr_warmup_" || (v[key].is_number() && v[key].get<double>() != 0)) return key;  // a warmup of 0 is none
  }
  return "";
}

std::string schedule_conflict(const json& v, const std::function<std::string(const std::string&)>& name,
                              const std::string& length_from) {
  const auto present = [&](const char* k) { return v.contains(k) && !v[k].is_null(); };
  const auto nonzero = [&](const char* k) { return present(k) && v[k].is_number() && v[k].get<double>() != 0; };
  const bool by_iters = present("train_iters"), by_samples = present("train_samples");
  // a key of one count in a run of the other: what to give instead
  const auto counted = [&](const std::string& key, const std::string& instead) {
    const std::string run =
        name(by_iters ? "train_iters" : "train_samples") + (length_from.empty() ? "" : ", from " + length_from);
    std::string s = name(key) + " counts " + (by_iters ? "samples" : "iterations") + ", but this run counts " +
                    (by_iters ? "iterations" : "samples") + " (" + run + "), which would ignore it; give " + instead;
    if (length_from.empty()) s += ", or train by " + name(by_iters ? "train_samples" : "train_iters");
    return s;
  };
  if (by_iters != by_samples) {
    const std::string ignored = schedule_key_counting(v, by_iters ? "samples" : "iters");
    if (!ignored.empty()) {
      const std::string kind = ignored.substr(0, ignored.rfind('_') + 1);  // "lr_warmup_", "lr_decay_", ...
      if (kind != "lr_warmup_") return counted(ignored, name(kind + (by_iters ? "iters" : "samples")) + " instead");
      return counted(ignored, by_iters ? name("lr_warmup_fraction") + " (a share of the decay span" +
                                             (length_from.empty() ? "" : ": the same samples at every batch size") +
                                             ") or " + name("lr_warmup_iters") + " instead"
                                       : name("lr_warmup_samples") + " or " + name("lr_warmup_fraction") + " instead");
    }
  }
  // WSD's keys on another decay style, which would ignore them; WSD without its decay's length
  const bool wsd = present("lr_decay_style") && v["lr_decay_style"].is_string() &&
                   v["lr_decay_style"].get<std::string>() == "WSD";
  // (the shape by its value: train's values carry its default, exponential)
  const char* ignored = wsd                                   ? nullptr
                        : present("lr_wsd_decay_iters")       ? "lr_wsd_decay_iters"
                        : present("lr_wsd_decay_samples")     ? "lr_wsd_decay_samples"
                        : present("lr_wsd_decay_style") && v["lr_wsd_decay_style"] != "exponential"
                            ? "lr_wsd_decay_style"
                            : nullptr;
  if (ignored)
    return name(ignored) + " shapes the decay of " + name("lr_decay_style") + " WSD, which this run does not use (" +
           (present("lr_decay_style") && v["lr_decay_style"].is_string() ? v["lr_decay_style"].get<std::string>()
                                                                          : std::string("the default, linear")) +
           "), so it would do nothing; set " + name("lr_decay_style") + " WSD, or drop it";
  if (wsd && !present("lr_wsd_decay_iters") && !present("lr_wsd_decay_samples"))
    return name("lr_decay_style") + " WSD decays over the last " +
           name(by_samples && !by_iters ? "lr_wsd_decay_samples" : "lr_wsd_decay_iters") +
           " of the decay span, which is not given; give it (0: no decay before the span ends)";
  if (nonzero("lr_warmup_init") && !nonzero("lr_warmup_iters") && !nonzero("lr_warmup_samples") &&
      !nonzero("lr_warmup_fraction"))
    return name("lr_warmup_init") + " is where the warmup starts, and this run has none, so it would do nothing; "
           "give a warmup (" + name("lr_warmup_iters") + ", " + name("lr_warmup_samples") + " or " +
           name("lr_warmup_fraction") + "), or drop it";
  if (present("lr_warmup_fraction"))
    for (const char* count : {"lr_warmup_iters", "lr_warmup_samples"})
      if (nonzero(count))
        return name("lr_warmup_fraction") + " and " + name(count) + " both set the warmup; give one of them";
  if (present("lr") && present("min_lr") && v["lr"].is_number() && v["min_lr"].is_number() &&
      v["min_lr"].get<double>() > v["lr"].get<double>())
    return name("min_lr") + " (" + v["min_lr"].dump() + ") is above " + name("lr") + " (" + v["lr"].dump() +
           "): the learning rate would rise as it decays; give a " + name("min_lr") + " at or below " + name("lr");
  const bool scaled =
      present("lr_scaling") && v["lr_scaling"].is_string() && v["lr_scaling"].get<std::string>() != "none";
  if (present("lr_scaling_ref_batch") && !scaled)
    return name("lr_scaling_ref_batch") + " is the batch at which " + name("lr") + " is given for " +
           name("lr_scaling") + ", which is none here, so it would do nothing; set " + name("lr_scaling") +
           " to sqrt or linear, or drop it";
  return "";
}

namespace {
// --rampup-batch-size START INCREMENT SAMPLES, checked against the run's batch.
BatchRampup rampup(const json& list, bool by_iters, const TrainOptions& opt, int64_t dp_size) {
  check(list.size() == 3, "--rampup-batch-size takes three numbers, START INCREMENT SAMPLES (got ", list.size(),
        ": ", list.dump(), ")");
  check(!by_iters, "--rampup-batch-size ramps the batch over samples, and needs a run counted in samples: give "
        "--train-samples instead of --train-iters (and the schedule's --lr-*-samples), as Megatron does");
  const BatchRampup r{list[0].get<int64_t>(), list[1].get<int64_t>(), list[2].get<int64_t>()};
  check_rampup(r, opt.global_batch_size, opt.micro_batch_size, dp_size);
  return r;
}

// The learning-rate schedule of the flags (--lr, --min-lr, --lr-decay-*, --lr-warmup-*,
// --lr-scaling), in samples of a global batch of `gbs`.
optim::LrSchedule lr_schedule(const json& v, int64_t gbs, int64_t train_iters) {
  const bool by_iters = v.contains("train_iters");
  check(v.contains("lr"), "--lr is required");
  const std::string conflict =
      schedule_conflict(v, [](const std::string& key) { return "--" + config::flag_name(key); });
  check(conflict.empty(), conflict);
  const auto rule = optim::parse_lr_scaling(v["lr_scaling"].get<std::string>());
  const int64_t ref = v.contains("lr_scaling_ref_batch") ? v["lr_scaling_ref_batch"].get<int64_t>() : 0;
  optim::LrSchedule s;
  s.max_lr = optim::scaled_lr(v["lr"].get<double>(), rule, gbs, ref);
  s.min_lr = optim::scaled_lr(v["min_lr"].get<double>(), rule, gbs, ref);
  s.init_lr = optim::scaled_lr(v["lr_warmup_init"].get<double>(), rule, gbs, ref);
  s.decoupled = v.contains("decoupled_lr");
  check(s.decoupled || !v.contains("decoupled_min_lr"), "--decoupled-min-lr is the minimum of the learning rate that "
        "--decoupled-lr gives the embedding and output layer, which is not given; give --decoupled-lr, or drop "
        "--decoupled-min-lr");
  if (s.decoupled) {
    s.decoupled_max_lr = optim::scaled_lr(v["decoupled_lr"].get<double>(), rule, gbs, ref);
    s.decoupled_min_lr =
        v.contains("decoupled_min_lr") ? optim::scaled_lr(v["decoupled_min_lr"].get<double>(), rule, gbs, ref) : s.min_lr;
  }
  s.style = optim::parse_decay_style(v["lr_decay_style"].get<std::string>());
  s.wsd_style = optim::parse_wsd_style(v["lr_wsd_decay_style"].get<std::string>());
  s.power = v["lr_decay_power"].get<double>();
  if (by_iters) {
    s.decay_samples = (v.contains("lr_decay_iters") ? v["lr_decay_iters"].get<int64_t>() : train_iters) * gbs;
    s.warmup_samples = v["lr_warmup_iters"].get<int64_t>() * gbs;
    if (v.contains("lr_wsd_decay_iters")) s.wsd_decay_samples = v["lr_wsd_decay_iters"].get<int64_t>() * gbs;
  } else {
    s.decay_samples = v.contains("lr_decay_samples") ? v["lr_decay_samples"].get<int64_t>() : v["train_samples"].get<int64_t>();
    s.warmup_samples = v["lr_warmup_samples"].get<int64_t>();
    if (v.contains("lr_wsd_decay_samples")) s.wsd_decay_samples = v["lr_wsd_decay_samples"].get<int64_t>();
  }
  if (v.contains("lr_warmup_fraction"))
    s.warmup_samples = static_cast<int64_t>(v["lr_warmup_fraction"].get<double>() * static_cast<double>(s.decay_samples));
  // the flags that set the warmup, the decay span and WSD's decay, as the run counts them
  const std::string unit = by_iters ? "iters" : "samples";
  const auto given = [&](const std::string& key, const std::string& otherwise) {
    const std::string& k = v.contains(key) || !v.contains(otherwise) ? key : otherwise;
    std::string flag = "--" + config::flag_name(k);
    if (v.contains(k)) flag.append(" ").append(v[k].dump());
    return flag;
  };
  const std::string warmup = given("lr_warmup_fraction", "lr_warmup_" + unit);
  const std::string span = given("lr_decay_" + unit, by_iters ? "train_iters" : "train_samples");
  check(s.warmup_samples <= s.decay_samples || s.style == optim::DecayStyle::kConstant ||
            s.style == optim::DecayStyle::kInverseSquareRoot,
        "the lr warmup (", warmup, ") is longer than the decay span (", span,
        "): the decay would end before the warmup does; give a shorter warmup or a longer --lr-decay-", unit);
  // the decay starts before the warmup ends: the learning rate would jump down as the warmup ends
  check(s.style != optim::DecayStyle::kWsd || s.wsd_decay_samples <= s.decay_samples - s.warmup_samples,
        "--lr-decay-style WSD: its decay (", given("lr_wsd_decay_" + unit, ""), ") is longer than what the decay span (",
        span, ") leaves after the warmup (", warmup, "), so it would start during the warmup; give a shorter "
        "--lr-wsd-decay-", unit, " or a shorter warmup");
  check(s.init_lr <= s.max_lr, "--lr-warmup-init (", s.init_lr, ") is above --lr (", s.max_lr,
        "): the warmup would lower the learning rate; give a --lr-warmup-init at or below --lr");
  check(!s.decoupled || s.init_lr <= s.decoupled_max_lr, "--lr-warmup-init (", s.init_lr, ") is above --decoupled-lr (",
        s.decoupled_max_lr, "): the warmup, which both learning rates share, would lower the embedding's; give a ",
        "--lr-warmup-init at or below both");
  return s;
}

// The weight-decay schedule of the flags (--weight-decay-incr-style, --start-weight-decay,
// --end-weight-decay) over the run's `samples`, as Megatron's; constant: the plugin's own
// weight_decay, which the caller records once the plugin is known.
optim::WdSchedule wd_schedule(const config::Resolved& r, int64_t samples) {
  const json& v = r.values;
  optim::WdSchedule s;
  s.style = optim::parse_wd_incr_style(v["weight_decay_incr_style"].get<std::string>());
  const bool start = v.contains("start_weight_decay"), end = v.contains("end_weight_decay");
  if (!s.scheduled()) {
    check(!start && !end, "--", start ? "start" : "end", "-weight-decay moves the weight decay over the run only with "
          "--weight-decay-incr-style linear or cosine, which is not given (constant holds --weight-decay); give the "
          "style, or drop --start-weight-decay and --end-weight-decay");
    return s;
  }
  const std::string style = "--weight-decay-incr-style " + v["weight_decay_incr_style"].get<std::string>();
  check(start && end, style, " moves the weight decay from --start-weight-decay to --end-weight-decay; give both");
  check(!r.given("weight_decay"), style, " sets the weight decay from --start-weight-decay to --end-weight-decay, so "
        "--weight-decay ", v["weight_decay"].dump(), " would be ignored; drop it (null in a config or sweep file)");
  s.start = v["start_weight_decay"].get<double>();
  s.end = v["end_weight_decay"].get<double>();
  s.incr_samples = samples;
  return s;
}

// Clipping, logging, evaluation, diagnostics and noise-scale options.
void logging_options(const config::Resolved& r, TrainOptions& opt) {
  const json& v = r.values;
  opt.clip_grad = v["clip_grad"].get<double>();
  opt.log_interval = std::max<int64_t>(1, v["log_interval"].get<int64_t>());
  opt.eval_interval = v["eval_interval"].get<int64_t>();
  opt.eval_iters = v["eval_iters"].get<int64_t>();
  if (v.contains("eval_samples")) {
    opt.eval_samples = v["eval_samples"].get<int64_t>();
    check(opt.eval_samples % opt.micro_batch_size == 0, "--eval-samples (", opt.eval_samples,
              ") must be a multiple of --micro-batch-size (", opt.micro_batch_size, ")");
    // a validation run of eval_samples samples: eval_iters' batches, given too, would be ignored
    check(!r.given("eval_iters") || opt.eval_iters == 0, "--eval-iters ", opt.eval_iters, " and --eval-samples ",
          opt.eval_samples,
          " both size a validation run, and --eval-samples takes its samples instead of --eval-iters' global batches, "
          "so --eval-iters would be ignored; give one of them");
  }
  check(!v["skip_train"].get<bool>() || opt.eval_iters > 0 || opt.eval_samples > 0,
        "--skip-train evaluates the validation and test splits, but --eval-iters is 0, so it would evaluate nothing; "
        "give --eval-iters N (global batches) or --eval-samples N, or drop --skip-train");
  opt.diagnostics_interval =
      v.contains("diagnostics_interval") ? v["diagnostics_interval"].get<int64_t>() : opt.log_interval;
  check(opt.diagnostics_interval >= 0, "--diagnostics-interval must be >= 0 (0: off), got ",
            opt.diagnostics_interval);
  opt.diagnostics_asked = r.given("diagnostics_interval");
  opt.noise_scale = v["log_noise_scale"].get<bool>();
  opt.per_token_loss = v["calculate_per_token_loss"].get<bool>();
  check(!opt.per_token_loss || !opt.noise_scale,
        "--log-noise-scale estimates the noise from each micro-batch's mean gradient, which "
        "--calculate-per-token-loss weighs by its token count; drop one of them");
  for (const char* key : {"noise_scale_ema", "noise_scale_window"})
    check(opt.noise_scale || !r.given(key), "--", config::flag_name(key),
              " averages the gradient noise scale, which only --log-noise-scale estimates; add it or drop the option");
  check(!r.given("noise_scale_ema") || !r.given("noise_scale_window"),
            "--noise-scale-ema (a decay a step) and --noise-scale-window (a window in samples) are both set; give one");
  opt.noise_scale_ema = v["noise_scale_ema"].get<double>();
  if (v.contains("noise_scale_window")) opt.noise_scale_window = static_cast<double>(v["noise_scale_window"].get<int64_t>());
}
}  // namespace

// The run's batch, iterations, learning-rate schedule, logging, evaluation, checkpoint,
// loss-scaling and divergence options from its flags (errors name the flag); dp_size: the
// data-parallel ranks launched. What depends on the model (tokens per sample, FLOPs per
// iteration) is the caller's to fill in.
TrainOptions train_options(const config::Resolved& r, DType dtype, int64_t dp_size, int64_t padded_vocab) {
  const json& v = r.values;
  TrainOptions opt;
  opt.micro_batch_size = v["micro_batch_size"].get<int64_t>();
  opt.global_batch_size =
      v.contains("global_batch_size") ? v["global_batch_size"].get<int64_t>() : opt.micro_batch_size * dp_size;
  check(opt.micro_batch_size >= 1 && opt.global_batch_size >= 1, "micro_batch_size and global_batch_size must be >= 1");
  check(opt.global_batch_size % opt.micro_batch_size == 0, "global_batch_size (", opt.global_batch_size,
            ") must be a multiple of micro_batch_size (", opt.micro_batch_size, ")");
  check(opt.global_batch_size % (opt.micro_batch_size * dp_size) == 0, "global_batch_size (", opt.global_batch_size,
            ") must be a multiple of micro_batch_size x data-parallel size (", opt.micro_batch_size, " x ", dp_size, ")");
  const bool by_iters = v.contains("train_iters"), by_samples = v.contains("train_samples");
  check(by_iters != by_samples, "give exactly one of --train-iters and --train-samples");
  if (v.contains("rampup_batch_size")) opt.rampup = rampup(v["rampup_batch_size"], by_iters, opt, dp_size);
  opt.train_iters = by_iters ? v["train_iters"].get<int64_t>()
                             : ramp_iterations(opt.rampup, opt.global_batch_size, v["train_samples"].get<int64_t>());
  check(opt.train_iters >= 1, "the run has no iterations (train_iters ", opt.train_iters, ")");
  if (v.contains("iterations_to_skip")) {
    for (const int64_t it : v["iterations_to_skip"].get<std::vector<int64_t>>()) {
      check(it <= opt.train_iters, "--iterations-to-skip ", it, " is past the run's last iteration (", opt.train_iters,
            "), so it would skip nothing; drop it");
      opt.iterations_to_skip.insert(it);
    }
  }
  opt.schedule = lr_schedule(v, opt.global_batch_size, opt.train_iters);
  opt.schedule.wd = wd_schedule(r, by_iters ? opt.train_iters * opt.global_batch_size : v["train_samples"].get<int64_t>());
  logging_options(r, opt);
  // (the trainer checks it again; here, so that --check and a sweep's dry run refuse it)
  if (opt.noise_scale) check_noise_scale_batch(opt.global_batch(0), opt.micro_batch_size, opt.rampup.on());
  if (v.contains("save")) opt.save_dir = v["save"].get<std::string>();
  opt.save_interval = v["save_interval"].get<int64_t>();
  opt.exit_interval = v["exit_interval"].get<int64_t>();
  if (v.contains("exit_duration_in_mins")) opt.exit_duration_minutes = v["exit_duration_in_mins"].get<double>();
  opt.profile_steps = v["profile_steps"].get<int64_t>();
  if (v.contains("check_weight_hash_across_dp_replicas_interval"))
    opt.replica_check_interval = v["check_weight_hash_across_dp_replicas_interval"].get<int64_t>();
  // (a resumed run that has 2 or fewer iterations left says so at its end: StepProfile)
  check(opt.profile_steps == 0 || opt.train_iters > kProfileWarmup, "--profile-steps ", opt.profile_steps,
        " times the iterations after the first ", kProfileWarmup, " (warm-up), but the run has ", opt.train_iters,
        " in all (", by_iters ? "--train-iters" : "--train-samples", "), so it would profile nothing; ask for at least ",
        kProfileWarmup + 1, " iterations, or drop --profile-steps");
  opt.keep_checkpoints = static_cast<int>(v["keep_checkpoints"].get<int64_t>());
  check(opt.save_interval >= 0 && opt.exit_interval >= 0 && opt.keep_checkpoints >= 0,
            "--save-interval, --exit-interval and --keep-checkpoints must be >= 0");
  // Checkpoint options without the directory they act on: refused, where they did nothing (a
  // run that meant to checkpoint every N iterations wrote none).
  check(!opt.save_dir.empty() || opt.save_interval == 0, "--save-interval ", opt.save_interval,
        " writes checkpoints into --save, which is not given, so none would be written; add --save DIR (and --load "
        "DIR to resume from them), or drop --save-interval");
  check(!opt.save_dir.empty() || opt.keep_checkpoints == 0, "--keep-checkpoints ", opt.keep_checkpoints,
        " keeps the newest checkpoints in --save, which is not given; add --save DIR, or drop --keep-checkpoints");
  // Megatron's --save-retain-interval: the newest and every R-th (with --keep-checkpoints K, the K newest)
  if (v.contains("save_retain_interval")) {
    opt.save_retain_interval = v["save_retain_interval"].get<int64_t>();
    const std::string flag = "--save-retain-interval " + std::to_string(opt.save_retain_interval);
    check(!opt.save_dir.empty(), flag, " keeps checkpoints in --save, which is not given; add --save DIR, or drop it");
    check(opt.save_interval > 0 && opt.save_retain_interval % opt.save_interval == 0, flag,
          " keeps the checkpoints of its multiples, which --save-interval ", opt.save_interval,
          opt.save_interval > 0 ? " does not write" : " (only at the end) does not write",
          " (Megatron asserts the same); make it a multiple of --save-interval");
    if (opt.keep_checkpoints == 0) opt.keep_checkpoints = 1;
  }
  check(!v["override_opt_param_scheduler"].get<bool>() || !v["use_checkpoint_opt_param_scheduler"].get<bool>(),
        "--override-opt-param-scheduler takes this run's learning-rate schedule and "
        "--use-checkpoint-opt-param-scheduler the checkpoint's; give one of them");
  for (const char* flag : {"finetune", "no_load_optim", "load_fallback", "override_opt_param_scheduler",
                           "use_checkpoint_opt_param_scheduler", "exit_on_missing_checkpoint"})
    check(v.contains("load") || !v[flag].get<bool>(), "--", config::flag_name(flag),
          " says how to load from --load, which is not given, so it would do nothing; add --load DIR (or a "
          "checkpoint file), or drop --",
          config::flag_name(flag));
  // --finetune makes --load the weights to start from; beside --pretrained-checkpoint, --load is
  // this run's own checkpoints, which a restart must resume from, not fine-tune from again.
  check(!v.contains("pretrained_checkpoint") || !v["finetune"].get<bool>(),
        "--finetune takes the model from --load, but with --pretrained-checkpoint the model comes from there and "
        "--load is this run's own checkpoints to resume from; drop --finetune");
  check(
      v.contains("load") || !v.contains("ckpt_step"), "--ckpt-step ", v.value("ckpt_step", int64_t{0}),
      " picks a checkpoint of --load's directory, which is not given; add --load DIR",
      v.contains("pretrained_checkpoint") ? " (for --pretrained-checkpoint, name its file: DIR/iter_NNNNNNN.h5)" : "");
  check(!v.contains("pretrained_checkpoint") || !v["exit_on_missing_checkpoint"].get<bool>(),
        "--exit-on-missing-checkpoint refuses a first start, which is when --pretrained-checkpoint is read; give one "
        "of them");
  check(v.contains("pretrained_checkpoint") || !v["pretrained_optimizer_state"].get<bool>(),
        "--pretrained-optimizer-state takes the optimizer state from --pretrained-checkpoint, which is not given, so "
        "it would do nothing; add --pretrained-checkpoint DIR, or drop --pretrained-optimizer-state");
  opt.seed = static_cast<uint64_t>(v["seed"].get<int64_t>());
  opt.loss_scaler = loss_scaler(r, dtype);
  opt.log_throughput = v["log_throughput"].get<bool>();
  opt.log_params_norm = v["log_params_norm"].get<bool>();
  opt.log_num_zeros_in_grad = v["log_num_zeros_in_grad"].get<bool>();
  opt.divergence_loss = v.contains("divergence_loss") ? v["divergence_loss"].get<double>()
                                                      : 2.0 * std::log(static_cast<double>(padded_vocab));
  opt.divergence_intervals = v["divergence_intervals"].get<int64_t>();
  return opt;
}

}  // namespace megabatch::train
