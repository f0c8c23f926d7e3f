#include "models/presets.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <sstream>

#include "core/comm/communicator.h"
#include "core/util/error.h"
#include "core/util/strings.h"
#include "models/registry.h"

namespace megabatch::models {

int64_t ModelConfig::padded_vocab_size() const {
  const int64_t m = make_vocab_size_divisible_by * tensor_model_parallel_size;
  return (vocab_size + m - 1) / m * m;
}

void ModelConfig::validate() const {
  // Every size fits an int32 (token ids are int32, kernels index rows with it), so that the
  // products below and the parameter counts cannot wrap an int64.
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"num_layers", num_layers}, {"hidden_size", hidden_size},
        {"num_attention_heads", num_attention_heads}, {"ffn_hidden_size", ffn_hidden_size}, {"seq_length", seq_length},
        {"max_position_embeddings", max_position_embeddings}, {"vocab_size", vocab_size},
        {"make_vocab_size_divisible_by", make_vocab_size_divisible_by},
        {"tensor_model_parallel_size", tensor_model_parallel_size}, {"num_tokentypes", num_tokentypes},
        {"decoder_num_layers", decoder_num_layers}, {"decoder_seq_length", decoder_seq_length},
        {"relative_attention_num_buckets", relative_attention_num_buckets},
        {"relative_attention_max_distance", relative_attention_max_distance}})
    check(value <= kMax, name, " is ", value, "; sizes above ", kMax, " (2^31 - 1) are not supported");
  check(num_layers >= 1, "num_layers must be >= 1 (got ", num_layers, ")");
  check(hidden_size >= 1 && num_attention_heads >= 1, "hidden_size and num_attention_heads must be >= 1");
  check(hidden_size % num_attention_heads == 0, "hidden_size (", hidden_size,
        ") must be divisible by num_attention_heads (", num_attention_heads, ")");
  check(tensor_model_parallel_size >= 1, "tensor_model_parallel_size must be >= 1");
  check(num_attention_heads % tensor_model_parallel_size == 0, "num_attention_heads (", num_attention_heads,
        ") must be divisible by tensor_model_parallel_size (", tensor_model_parallel_size, ")");
  check(ffn() % tensor_model_parallel_size == 0, "ffn_hidden_size (", ffn(),
        ") must be divisible by tensor_model_parallel_size (", tensor_model_parallel_size, ")");
  check(seq_length >= 1, "seq_length must be >= 1");
  check(max_positions() >= seq_length, "max_position_embeddings (", max_positions(), ") must be >= seq_length (",
        seq_length, ")");
  check(vocab_size >= 2, "vocab_size must be >= 2");
  check(hidden_dropout >= 0 && hidden_dropout < 1, "hidden_dropout must be in [0, 1) (got ", hidden_dropout, ")");
  check(attention_dropout >= 0 && attention_dropout < 1, "attention_dropout must be in [0, 1) (got ",
        attention_dropout, ")");
  check(normalization == "LayerNorm" || normalization == "RMSNorm", "normalization: '", normalization,
        "' is not LayerNorm or RMSNorm");
  check(normalization == "LayerNorm" || !post_layernorm, "normalization RMSNorm is for pre-LN models (drop --post-layernorm)");
  check(!residual_post_norm || !post_layernorm,
        "--apply-residual-connection-post-layernorm takes a pre-LN block's residual after its norm, and "
        "--post-layernorm's blocks norm after the residual add; give one of them");
  check(!add_qkv_bias || disable_bias_linear,
        "--add-qkv-bias keeps the QKV biases of --disable-bias-linear, which "
        "is not given (the linear layers have biases); add --disable-bias-linear, or drop --add-qkv-bias");
  check(!rope || (rotary_dim() >= 2 && rotary_dim() % 2 == 0), "--rotary-percent ", rotary_percent, " turns ",
        rotary_dim(), " of the head's ", hidden_size / num_attention_heads,
        " channels; rotary embeddings turn channel pairs: make it an even number, 2 or more");
  check(!swiglu || !squared_relu, "--swiglu and --squared-relu each choose the MLP's activation; give one");
  check(!reset_position_ids || learned_positions(),
        "--reset-position-ids restarts the learned position embeddings at each document, and this GPT has ",
        rope ? "rotary positions, which it would leave as they are (as Megatron's)" : "none (--no-position-embedding)",
        "; drop it");
  check(!no_position_embedding || family != "t5",
        "--no-position-embedding: megabatch's T5 has learned or relative positions (--position-embedding-type); drop "
        "it");
  check(!qk_layernorm || family != "t5",
        "--qk-layernorm: megabatch's T5 has no norm on its queries and keys (GPT's and BERT's do); drop it");
  if (group_query_attention) {
    check(family != "t5",
          "--group-query-attention: T5's decoder cross-attends, and Megatron's cross-attention takes no "
          "grouped-query attention; drop it");
    check(num_query_groups >= 1 && num_attention_heads % num_query_groups == 0, "--num-query-groups ", num_query_groups,
          " does not divide the ", num_attention_heads,
          " attention heads; make it a divisor (each group's key and value serve heads / groups query heads)");
    check(num_query_groups % tensor_model_parallel_size == 0, "--num-query-groups ", num_query_groups,
          " is not a multiple of --tensor-model-parallel-size ", tensor_model_parallel_size,
          "; each rank holds whole groups: make the groups a multiple of it");
  }
  check(attention_backend != "fused",
        "attention_backend: 'fused' is Transformer Engine's cuDNN attention, which "
        "megabatch does not have; use auto (flash attention where it runs), flash, or unfused");
  check(bert_masking == "token" || bert_masking == "whole-word", "bert_masking: '", bert_masking,
        "' is not token or whole-word");
  check(t5_masking == "span" || t5_masking == "whole-word", "t5_masking: '", t5_masking, "' is not span or whole-word");
  check(attention_backend == "auto" || attention_backend == "flash" || attention_backend == "unfused" ||
            attention_backend == "local",
        "attention_backend: '", attention_backend, "' is not auto, flash, unfused or local");
}

std::string ModelConfig::heads_text() const {
  return std::to_string(num_attention_heads) + " heads" + (qk_layernorm ? " (normed queries and keys)" : "") +
         (group_query_attention ? " in " + std::to_string(num_query_groups) +
                                      (num_query_groups == 1 ? " key/value group" : " key/value groups")
                                : "");
}

namespace {
Preset gpt(std::string name, std::string desc, int64_t layers, int64_t hidden, int64_t heads, int64_t seq,
           int64_t vocab = 50257) {
  ModelConfig c;
  c.preset = name;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  c.seq_length = seq;
  c.max_position_embeddings = seq;
  c.vocab_size = vocab;
  return {std::move(name), std::move(desc), c};
}
Preset bert(std::string name, std::string desc, int64_t layers, int64_t hidden, int64_t heads, int64_t seq) {
  Preset p = gpt(std::move(name), std::move(desc), layers, hidden, heads, seq, 30522);  // BERT's WordPiece vocabulary
  p.config.family = "bert";
  return p;
}
Preset t5(std::string name, std::string desc, int64_t layers, int64_t hidden, int64_t heads, int64_t ffn, int64_t enc_seq,
          int64_t dec_seq) {
  // Megatron's T5: the BERT WordPiece vocabulary plus 100 sentinels (--vocab-extra-ids 100)
  Preset p = gpt(std::move(name), std::move(desc), layers, hidden, heads, enc_seq, 30522 + 100);
  p.config.family = "t5";
  p.config.ffn_hidden_size = ffn;
  p.config.decoder_num_layers = layers;
  p.config.decoder_seq_length = dec_seq;
  p.config.vocab_extra_ids = 100;
  p.config.max_position_embeddings = std::max(enc_seq, dec_seq);
  return p;
}
}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = {
      gpt("gpt-mini", "4 layers, hidden 256, 4 heads, seq 128: trains on 2 CPU cores", 4, 256, 4, 128),
      bert("bert-mini", "BERT, 4 layers, hidden 256, 4 heads, seq 128: trains on 2 CPU cores", 4, 256, 4, 128),
      t5("t5-mini", "T5, 2 + 2 layers, hidden 256, 4 heads, encoder seq 128, decoder seq 32: trains on 2 CPU cores", 2,
         256, 4, 1024, 128, 32),
      t5("t5-small", "T5-small: 6 + 6 layers, hidden 512, 8 heads, ffn 2048, encoder seq 512, decoder seq 128", 6, 512,
         8, 2048, 512, 128),
      t5("t5-base", "T5-base: 12 + 12 layers, hidden 768, 12 heads, ffn 3072, encoder seq 512, decoder seq 128", 12, 768,
         12, 3072, 512, 128),
      bert("bert4", "BERT, 4 layers, hidden 1024, 16 heads, seq 128 (the 4-layer model of the large-batch studies)", 4,
           1024, 16, 128),
      bert("bert-base", "BERT-base: 12 layers, hidden 768, 12 heads, seq 512", 12, 768, 12, 512),
      bert("bert-large", "BERT-large: 24 layers, hidden 1024, 16 heads, seq 512", 24, 1024, 16, 512),
      bert("bert-1b", "BERT 1B: 85 layers, hidden 1024, 16 heads, seq 512", 85, 1024, 16, 512),
      gpt("gpt2-124m", "GPT-2 small: 12 layers, hidden 768, 12 heads, seq 1024", 12, 768, 12, 1024),
      gpt("gpt2-350m", "GPT-2 medium: 24 layers, hidden 1024, 16 heads, seq 1024", 24, 1024, 16, 1024),
      // Megatron-LM's GPT scaling table (seq 2048, GPT-2 vocabulary padded to 51200).
      gpt("gpt-1.7b", "Megatron GPT 1.7B: 24 layers, hidden 2304, 24 heads", 24, 2304, 24, 2048),
      gpt("gpt-3.6b", "Megatron GPT 3.6B: 30 layers, hidden 3072, 32 heads", 30, 3072, 32, 2048),
      gpt("gpt-7.5b", "Megatron GPT 7.5B: 36 layers, hidden 4096, 32 heads", 36, 4096, 32, 2048),
      gpt("gpt-18.4b", "Megatron GPT 18.4B: 40 layers, hidden 6144, 48 heads", 40, 6144, 48, 2048),
      gpt("gpt-39.1b", "Megatron GPT 39.1B: 48 layers, hidden 8192, 64 heads", 48, 8192, 64, 2048),
      gpt("gpt-76.1b", "Megatron GPT 76.1B: 60 layers, hidden 10240, 80 heads", 60, 10240, 80, 2048),
      gpt("gpt-145.6b", "Megatron GPT 145.6B: 80 layers, hidden 12288, 96 heads", 80, 12288, 96, 2048),
      gpt("gpt-310.1b", "Megatron GPT 310.1B: 96 layers, hidden 16384, 128 heads", 96, 16384, 128, 2048),
  };
  return table;
}

ModelConfig preset(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& p : presets()) {
    if (p.name == name) return p.config;
    names.push_back(p.name);
  }
  fail("unknown model preset '", name, "'", did_you_mean(name, names), "; presets: ", join(names, ", "));
}

SizeReport size_report(const ModelConfig& c) {
  c.validate();
  // Declaring the parameters allocates nothing, so any size can be counted here.
  SizeReport r;
  // Per rank: sharded tensors divide by TP, replicated ones (norms, row-parallel biases,
  // position embeddings) do not. Count them by declaring rank 0's shard.
  struct RankZero final : comm::Communicator {
    int n;
    explicit RankZero(int size) : n(size) {}
    int rank() const override { return 0; }
    int size() const override { return n; }
    void all_reduce(float*, size_t, comm::ReduceOp) override {}
    void all_reduce(double*, size_t, comm::ReduceOp) override {}
    void all_gather_bytes(const void*, void*, size_t) override {}
    void reduce_scatter(const float*, float*, size_t) override {}
    void broadcast(float*, size_t, int) override {}
    void barrier() override {}
  } rank0(static_cast<int>(c.tensor_model_parallel_size));
  // Every layer after the first of a stack has the same tensors (T5's relative-position
  // table sits in the first), so the counts are linear in the layer counts: declared with at
  // most two layers a stack and extrapolated, exactly, a model of any depth is counted at
  // once (declaring each of a million layers took seconds and gigabytes before the memory
  // check could refuse it). Products are checked: an absurd size is refused, not wrapped.
  auto counts = [&](int64_t layers, int64_t decoder_layers) {
    ModelConfig small = c;
    small.num_layers = layers;
    small.decoder_num_layers = decoder_layers;
    const auto model = declare_model(small, rank0);
    return std::pair<int64_t, int64_t>{model->parameters().num_full_parameters(), model->parameters().num_parameters()};
  };
  const bool two_stacks = c.family == "t5";
  const int64_t encoder = c.num_layers, decoder = two_stacks ? c.decoder_layers() : 0;
  const auto base = counts(1, two_stacks ? 1 : 0);
  const auto more_encoder = counts(2, two_stacks ? 1 : 0);
  const auto more_decoder = two_stacks ? counts(1, 2) : base;
  auto extrapolate = [&](int64_t at1, int64_t per_encoder, int64_t per_decoder) {
    int64_t total = at1, a = 0, b = 0;
    const bool wrapped = __builtin_mul_overflow(per_encoder, encoder - 1, &a) ||
                         (two_stacks && __builtin_mul_overflow(per_decoder, decoder - 1, &b)) ||
                         __builtin_add_overflow(total, a, &total) || __builtin_add_overflow(total, b, &total);
    check(!wrapped && total < (int64_t{1} << 62), "the model's ", encoder, two_stacks ? " + " + std::to_string(decoder) : "",
          " layers of hidden size ", c.hidden_size, " add up to more parameters than any machine holds; check its sizes");
    return total;
  };
  r.parameters = extrapolate(base.first, more_encoder.first - base.first, more_decoder.first - base.first);
  r.parameters_per_rank = extrapolate(base.second, more_encoder.second - base.second, more_decoder.second - base.second);
  const double p = static_cast<double>(r.parameters_per_rank);
  r.fp32_adam_bytes = 16.0 * p;
  r.mixed_adam_bytes = 18.0 * p;
  // Korthikanti et al. 2022: s b h (10 + 24 / t + 5 a s / (h t)) bytes per layer with
  // tensor parallelism t (no sequence parallelism, no recomputation), here for b = 1.
  const double s = static_cast<double>(c.seq_length), h = static_cast<double>(c.hidden_size),
               a = static_cast<double>(c.num_attention_heads), t = static_cast<double>(c.tensor_model_parallel_size);
  // SwiGLU: fc1's output is 2 ffn wide, 2 ffn / t more 16-bit values a token
  const double gated = c.swiglu ? 4.0 * static_cast<double>(c.ffn()) / (h * t) : 0.0;
  // Grouped-query attention (g key/value heads): the saved QKV output holds h (1 + 2 g / a) / t
  // 16-bit values a token, not 3 h / t
  const double kv = static_cast<double>(c.query_groups()) / a, grouped = -4.0 * (1.0 - kv) / t;
  // --qk-layernorm: the q and k rows before their norms, h (1 + g / a) / t more 16-bit values a
  // token, and their fp32 mean and rstd, 2 x (a + g) / t more
  const double qk = c.qk_layernorm ? 2.0 * (1.0 + kv) / t + 8.0 * (a + a * kv) / (h * t) : 0.0;
  r.activation_bytes =
      static_cast<double>(c.num_layers) * s * h * (10.0 + 24.0 / t + grouped + gated + qk + 5.0 * a * s / (h * t));
  r.attention_score_bytes = static_cast<double>(c.num_layers) * s * h * (5.0 * a * s / (h * t));
  return r;
}

// Model FLOPs of one iteration of global batch B, by Megatron's formula (training.py's
// num_floating_point_operations: forward + backward, no recomputation, logits included):
// 12 B s L h^2 (1 + g/a + s/h + ffn/h + V / (2 L h)) for a stack of L layers over s tokens
// with a heads in g key/value groups (g = a without grouped-query attention), which is GPT's
// and BERT's. T5 is two stacks, the decoder's with cross-attention (queries and
// output over s_d tokens, keys and values over s_e, s_d x s_e scores) and the logits.
double megatron_flops(const ModelConfig& c, int64_t global_batch) {
  const double B = static_cast<double>(global_batch), h = static_cast<double>(c.hidden_size),
               f = static_cast<double>(c.ffn()), V = static_cast<double>(c.padded_vocab_size());
  const double gated = c.swiglu ? 1.5 : 1.0;  // SwiGLU: fc1 twice as wide (Megatron's gated_linear_multiplier)
  const double kv = static_cast<double>(c.query_groups()) / static_cast<double>(c.num_attention_heads);
  auto stack = [&](double L, double s) { return 12 * B * s * L * h * h * (1 + kv + s / h + gated * f / h); };
  if (c.family != "t5") {
    const double L = static_cast<double>(c.num_layers), s = static_cast<double>(c.seq_length);
    return stack(L, s) + 6 * B * s * h * V;
  }
  const double se = static_cast<double>(c.seq_length), sd = static_cast<double>(c.decoder_seq()),
               Le = static_cast<double>(c.num_layers), Ld = static_cast<double>(c.decoder_layers());
  const double cross = 3 * (2 * B * h * h * (2 * sd + 2 * se) + 4 * B * sd * se * h);
  return stack(Le, se) + stack(Ld, sd) + Ld * cross + 6 * B * sd * h * V;
}

}  // namespace megabatch::models
