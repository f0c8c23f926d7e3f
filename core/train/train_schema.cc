// train's options: each one's name, type, default, help text and group, and the range of every
// number (Megatron-LM's names and meanings, plus megabatch's own; the Megatron flags train
// refuses or only accepts are in megatron_flags.cc). What they mean for a run: options.h.
#include "core/train/train_schema.h"

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/train/megatron_flags.h"

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
    if (it == ranges().end()) throw std::logic_error("train option " + o.name + " has no range in train_schema.cc");
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
           "does not read it",
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
}  // namespace megabatch::train
