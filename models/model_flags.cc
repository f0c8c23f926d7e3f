#include "models/model_flags.h"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <string>
#include <vector>

#include "core/data/compact_vocab.h"
#include "core/util/error.h"
#include "core/util/strings.h"

namespace megabatch::models {

namespace {
// The family and the starting sizes: a --model preset, or --model-type with the sizes given
// as flags (all four required).
ModelConfig model_family(const nlohmann::json& v) {
  ModelConfig c;
  if (v.contains("model")) {
    c = preset(v["model"].get<std::string>());
  } else {
    if (v.contains("model_type")) c.family = v["model_type"].get<std::string>();
    check(c.family == "gpt" || c.family == "bert" || c.family == "t5", "model_type: '", c.family,
              "' is not a model type (gpt, bert, t5)");
    const bool t5 = c.family == "t5";
    for (const char* k : {"num_layers", "hidden_size", "num_attention_heads", "seq_length"}) {
      const bool has = v.contains(k) || (t5 && std::string(k) == "num_layers" && v.contains("encoder_num_layers")) ||
                       (t5 && std::string(k) == "seq_length" && v.contains("encoder_seq_length"));
      check(has,
            "no model given: use --model PRESET (see --list-models) or give --num-layers, "
            "--hidden-size, --num-attention-heads and --seq-length (missing --",
            config::flag_name(k), ")");
    }
    c.preset.clear();
    if (c.family == "bert") c.vocab_size = 30522;
    if (t5) {
      c.vocab_extra_ids = 100;
      c.vocab_size = 30522 + 100;
    }
  }
  return c;
}

// Megatron's position embedding flags (learned absolute, T5's relative buckets, or GPT's
// rotary embeddings).
void set_positions(const nlohmann::json& v, ModelConfig& c) {
  const std::string pos = v["position_embedding_type"].get<std::string>();
  check(pos == "learned_absolute" || pos == "relative" || pos == "rope", "position_embedding_type: '", pos,
        "' is not one of learned_absolute, relative, rope");
  check(pos != "relative" || c.family == "t5", "position_embedding_type relative is T5's; this model is ", c.family);
  check(pos != "rope" || c.family == "gpt", "position_embedding_type rope is GPT's here; this model is ", c.family);
  c.relative_attention = pos == "relative";
  c.rope = pos == "rope";
  c.no_position_embedding = v["no_position_embedding"].get<bool>();
  c.rotary_percent = v["rotary_percent"].get<double>();
  c.rotary_base = v["rotary_base"].get<double>();
  c.rotary_interleaved = v["rotary_interleaved"].get<bool>();
  if (v.contains("rotary_seq_len_interpolation_factor"))
    c.rotary_interpolation = v["rotary_seq_len_interpolation_factor"].get<int64_t>();
  c.relative_attention_num_buckets = v["relative_attention_num_buckets"].get<int64_t>();
  c.relative_attention_max_distance = v["relative_attention_max_distance"].get<int64_t>();
  check(c.relative_attention_num_buckets >= 4 && c.relative_attention_max_distance >= c.relative_attention_num_buckets / 2,
        "relative_attention_num_buckets must be >= 4 and relative_attention_max_distance >= half of it");
}

// Options of one model family given to a model of another, which would ignore them, and T5's
// relative position buckets without relative positions; a layer count or length given twice
// (--num-layers beside --encoder-num-layers: Megatron refuses both too; here the second won).
void check_family_options(const config::Resolved& r, const ModelConfig& c) {
  const auto flag = [](const std::string& key) { return "--" + config::flag_name(key); };
  if (c.family != "t5")
    for (const std::string k : {"encoder_num_layers", "encoder_seq_length", "decoder_num_layers", "decoder_seq_length",
                                "vocab_extra_ids", "relative_attention_num_buckets", "relative_attention_max_distance"})
      check(!r.given(k), flag(k), " is T5's, and this model is ", c.family, ", which would ignore it; drop it",
            k.rfind("encoder_", 0) == 0 ? " (a " + c.family + "'s layers and length are --num-layers and --seq-length)"
                                        : std::string());
  check(c.family == "bert" || !r.given("bert_masking"), "--bert-masking is BERT's, and this model is ", c.family,
        ", which would ignore it; drop it", c.family == "t5" ? " (T5's is --t5-masking)" : "");
  check(c.family == "t5" || !r.given("t5_masking"), "--t5-masking is T5's, and this model is ", c.family,
        ", which would ignore it; drop it", c.family == "bert" ? " (BERT's is --bert-masking)" : "");
  if (c.family == "gpt")
    for (const std::string k : {"mask_prob", "short_seq_prob"})
      check(!r.given(k), flag(k),
            " sets how BERT's and T5's samples are made, and a GPT's are windows of the "
            "documents with nothing masked, so it would be ignored; drop it");
  // switches of one family, set on another (false is the default, and allowed)
  struct Switch {
    const char* family;  // whose it is
    const char* owner;   // as the message names it
    const char* key;
  };
  for (const Switch& sw :
       {Switch{"gpt", "GPT", "eod_mask_loss"}, Switch{"gpt", "GPT", "untie_embeddings_and_output_weights"},
        Switch{"gpt", "GPT", "reset_position_ids"}, Switch{"gpt", "GPT", "reset_attention_mask"},
        Switch{"bert", "BERT", "bert_no_binary_head"}, Switch{"bert", "BERT", "post_layernorm"}})
    check(c.family == sw.family || !r.given(sw.key) || !r.values[sw.key].get<bool>(), flag(sw.key), " is ", sw.owner,
          "'s, and this model is ", c.family, ", which would ignore it; drop it");
  if (!c.rope)
    for (const std::string k :
         {"rotary_percent", "rotary_base", "rotary_interleaved", "rotary_seq_len_interpolation_factor"})
      check(!r.given(k) || r.values[k] == false, flag(k),  // (a switch set false asks for nothing)
            " sets the rotary embeddings, which this run does not have; add "
            "--position-embedding-type rope, or drop it");
  check(c.group_query_attention || !r.given("num_query_groups"),
        "--num-query-groups sets grouped-query attention, which this run does not have (Megatron ignores it then); add "
        "--group-query-attention, or drop it");
  if (c.family == "t5" && !c.relative_attention)
    for (const std::string k : {"relative_attention_num_buckets", "relative_attention_max_distance"})
      check(!r.given(k), flag(k),
            " sets T5's relative position buckets, which this run does not use (its positions are learned absolute "
            "embeddings); add --position-embedding-type relative, or drop it");
  for (const auto& [one, other] : {std::pair<std::string, std::string>{"num_layers", "encoder_num_layers"},
                                   {"seq_length", "encoder_seq_length"}})
    if (r.given(one) && r.given(other))  // (the values only exist when both are given)
      fail(flag(one), " and ", flag(other), " both set the ",
           one == "num_layers" ? "encoder's layers" : "encoder's sequence length", " (", r.values.at(one).dump(),
           " and ", r.values.at(other).dump(), "); give one");
}

void print_sizes(const ModelConfig& c, std::ostream& out) {
  const auto r = size_report(c);
  const std::string layers = c.family == "t5" ? std::to_string(c.num_layers) + " + " + std::to_string(c.decoder_layers())
                                               : std::to_string(c.num_layers);
  out << "model: " << (c.preset.empty() ? "custom" : c.preset) << " (" << layers << " layers, hidden " << c.hidden_size
      << ", " << c.heads_text() << ", ffn " << c.ffn()
      << (c.swiglu         ? " (SwiGLU)"
          : c.squared_relu ? " (squared ReLU)"
                           : "")
      << ", seq " << c.seq_length << ", vocab " << c.vocab_size << " padded to " << c.padded_vocab_size() << ")\n"
      << "parameters:                 " << r.parameters << " (" << std::setprecision(4)
      << static_cast<double>(r.parameters) / 1e9 << " B)\n"
      << "tensor-parallel size:       " << c.tensor_model_parallel_size << "\n"
      << "parameters per rank:        " << r.parameters_per_rank << "\n"
      << "fp32 + Adam state per rank: " << human_bytes(r.fp32_adam_bytes)
      << " (16 B/param: weights, grads, 2 moments)\n"
      << "bf16 mixed precision + Adam per rank: " << human_bytes(r.mixed_adam_bytes)
      << " (18 B/param: bf16 weights, fp32 grads, master, 2 moments)\n"
      << "activations per sample per rank: " << human_bytes(r.activation_bytes)
      << " (16-bit, no recomputation; x micro-batch size)\n";
}

}  // namespace

ModelConfig model_config(const config::Resolved& r) {
  const nlohmann::json& v = r.values;
  ModelConfig c = model_family(v);
  check(!v.contains("model_type") || !v.contains("model") || v["model_type"].get<std::string>() == c.family,
            "model_type '", v.contains("model_type") ? v["model_type"].get<std::string>() : "",
            "' contradicts --model ", v.contains("model") ? v["model"].get<std::string>() : "", " (a ", c.family,
            "); drop one");
  c.post_layernorm = v["post_layernorm"].get<bool>();
  set_positions(v, c);
  c.binary_head = !v["bert_no_binary_head"].get<bool>();
  c.eod_mask_loss = v["eod_mask_loss"].get<bool>();
  c.reset_position_ids = v["reset_position_ids"].get<bool>();
  c.reset_attention_mask = v["reset_attention_mask"].get<bool>();
  c.mask_prob = v["mask_prob"].get<double>();
  c.short_seq_prob = v["short_seq_prob"].get<double>();
  c.bert_masking = v["bert_masking"].get<std::string>();
  c.t5_masking = v["t5_masking"].get<std::string>();
  auto set = [&](const char* key, int64_t& field) {
    if (v.contains(key)) field = v[key].get<int64_t>();
  };
  set("num_layers", c.num_layers);
  set("hidden_size", c.hidden_size);
  set("num_attention_heads", c.num_attention_heads);
  set("ffn_hidden_size", c.ffn_hidden_size);
  set("seq_length", c.seq_length);
  set("max_position_embeddings", c.max_position_embeddings);
  set("make_vocab_size_divisible_by", c.make_vocab_size_divisible_by);
  set("tensor_model_parallel_size", c.tensor_model_parallel_size);
  set("encoder_num_layers", c.num_layers);
  set("encoder_seq_length", c.seq_length);
  set("decoder_num_layers", c.decoder_num_layers);
  set("decoder_seq_length", c.decoder_seq_length);
  set("vocab_extra_ids", c.vocab_extra_ids);
  const bool t5_lengths = v.contains("seq_length") || v.contains("encoder_seq_length") || v.contains("decoder_seq_length");
  if (c.family == "t5" && t5_lengths && !v.contains("max_position_embeddings"))
    c.max_position_embeddings = std::max(c.seq_length, c.decoder_seq());
  if (v.contains("seq_length") && !v.contains("max_position_embeddings") && c.max_position_embeddings < c.seq_length)
    c.max_position_embeddings = c.seq_length;
  c.hidden_dropout = v["hidden_dropout"].get<double>();
  c.attention_dropout = v["attention_dropout"].get<double>();
  c.init_method_std = v["init_method_std"].get<double>();
  c.init_method_xavier_uniform = v["init_method_xavier_uniform"].get<bool>();
  if (v.contains("embedding_init_method_std"))
    c.embedding_init_method_std = v["embedding_init_method_std"].get<double>();
  check(!c.init_method_xavier_uniform || !r.given("init_method_std"), "--init-method-std ", v["init_method_std"].dump(),
        " is the normal initialization's, which --init-method-xavier-uniform replaces, so "
        "it would be ignored; give one of them");
  c.normalization = v["normalization"].get<std::string>();
  c.layernorm_epsilon = v["norm_epsilon"].get<double>();
  c.attention_backend = v["attention_backend"].get<std::string>();
  c.untie_embeddings_and_output_weights = v["untie_embeddings_and_output_weights"].get<bool>();
  c.disable_bias_linear = v["disable_bias_linear"].get<bool>();
  c.add_qkv_bias = v["add_qkv_bias"].get<bool>();
  c.swiglu = v["swiglu"].get<bool>();
  c.squared_relu = v["squared_relu"].get<bool>();
  c.qk_layernorm = v["qk_layernorm"].get<bool>();
  c.apply_layernorm_1p = v["apply_layernorm_1p"].get<bool>();
  c.residual_post_norm = v["apply_residual_connection_post_layernorm"].get<bool>();
  c.group_query_attention = v["group_query_attention"].get<bool>();
  c.num_query_groups = v["num_query_groups"].get<int64_t>();
  if (v.contains("kv_channels"))
    check(v["kv_channels"].get<int64_t>() * c.num_attention_heads == c.hidden_size, "--kv-channels ",
          v["kv_channels"].get<int64_t>(), ": megabatch's attention heads have hidden / heads = ", c.hidden_size, " / ",
          c.num_attention_heads, (c.hidden_size % c.num_attention_heads ? " (not whole)" : ""),
          " channels each; drop --kv-channels, or make --hidden-size heads x kv-channels");
  check_family_options(r, c);
  return c;
}

std::string take_checkpoint_model(config::Resolved& r, const nlohmann::json& model, const std::string& file) {
  check(model.is_object() && model.contains("family") && model.contains("num_layers"), file,
        ": it records no model (a checkpoint from before megabatch recorded one), so --use-checkpoint-args has "
        "nothing to take; give the model's flags instead");
  const std::string family = model["family"].get<std::string>();
  std::vector<std::pair<std::string, nlohmann::json>> take = {{"model_type", family}};
  auto same = [&](const char* key) {
    if (model.contains(key)) take.emplace_back(key, model[key]);
  };
  for (const char* key :
       {"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length", "max_position_embeddings",
        "normalization", "disable_bias_linear", "add_qkv_bias", "swiglu", "squared_relu", "qk_layernorm",
        "apply_layernorm_1p", "apply_residual_connection_post_layernorm"})
    same(key);
  const bool rope = model.value("rope", false);
  take.emplace_back("position_embedding_type", rope                                       ? "rope"
                                               : model.value("relative_attention", false) ? "relative"
                                                                                          : "learned_absolute");
  if (model.value("no_position_embedding", false)) take.emplace_back("no_position_embedding", true);
  if (rope)
    for (const char* key :
         {"rotary_percent", "rotary_base", "rotary_interleaved", "rotary_seq_len_interpolation_factor"})
      same(key);
  if (model.contains("num_query_groups") && model["num_query_groups"] != model["num_attention_heads"]) {
    take.emplace_back("group_query_attention", true);
    same("num_query_groups");
  }
  if (family == "gpt") same("untie_embeddings_and_output_weights");
  if (family == "bert") {
    same("post_layernorm");
    if (model.contains("binary_head")) take.emplace_back("bert_no_binary_head", !model["binary_head"].get<bool>());
  }
  if (family == "t5")
    for (const char* key : {"decoder_num_layers", "decoder_seq_length", "vocab_extra_ids",
                            "relative_attention_num_buckets", "relative_attention_max_distance"})
      same(key);
  // the vocabulary's padding, whose rows take part in the softmax: the recorded multiple, or (a
  // checkpoint from before it was recorded) one that pads to the same size at its TP size
  if (model.contains("make_vocab_size_divisible_by")) {
    same("make_vocab_size_divisible_by");
  } else if (model.contains("padded_vocab_size") && model.contains("tensor_model_parallel_size")) {
    const int64_t padded = model["padded_vocab_size"].get<int64_t>(),
                  tp = model["tensor_model_parallel_size"].get<int64_t>();
    if (tp > 0 && padded % tp == 0) take.emplace_back("make_vocab_size_divisible_by", padded / tp);
  }
  if (model.contains("tokenizer") && model["tokenizer"].is_object() && model["tokenizer"].contains("type"))
    take.emplace_back("tokenizer_type", model["tokenizer"]["type"]);
  std::string said;
  for (const auto& [key, value] : take) {
    const std::string flag = "--" + config::flag_name(key);
    check(!r.given(key) || r.values[key] == value, flag, " ", r.values.value(key, nlohmann::json()).dump(),
          " contradicts the model of ", file, ", whose ", key, " is ", value.dump(),
          " (--use-checkpoint-args takes the model from it); drop ", flag, ", or --use-checkpoint-args");
    if (r.values.value(key, nlohmann::json()) != value) {  // (what differs from the defaults is said)
      std::string text = value.is_string() ? value.get<std::string>() : value.dump();
      if (!said.empty()) said += ' ';
      said += flag;
      if (!value.is_boolean())
        said += ' ' + text;
      else if (!value.get<bool>())
        said += "=false";
    }
    r.values[key] = value;
    r.explicit_.insert(key);
  }
  return said;
}

void set_family_defaults(nlohmann::json& v, const ModelConfig& c) {
  const bool wordpiece = c.family == "bert" || c.family == "t5";
  if (!v.contains("tokenizer_type")) v["tokenizer_type"] = wordpiece ? "BertWordPieceLowerCase" : "GPT2BPETokenizer";
  const bool per_split = v.contains("train_data_path") || v.contains("valid_data_path") || v.contains("test_data_path");
  if (!v.contains("data_path") && !per_split)  // the data of --train-data-path and the like is their own
    v["data_path"] = nlohmann::json::array({wordpiece ? "data/brown_bert_text_sentence" : "data/brown_gpt2_text_document"});
}

data::TokenizerOptions tokenizer_options(const nlohmann::json& v, const ModelConfig& mc) {
  data::TokenizerOptions to;
  to.type = v["tokenizer_type"].get<std::string>();
  if (v.contains("vocab_file")) to.vocab_file = v["vocab_file"].get<std::string>();
  if (v.contains("merge_file")) to.merge_file = v["merge_file"].get<std::string>();
  to.extra_ids = static_cast<int>(mc.vocab_extra_ids);
  to.vocabulary_only = true;
  return to;
}

nlohmann::json model_json(const ModelConfig& c) {
  nlohmann::json m = {{"family", c.family},
                      {"post_layernorm", c.post_layernorm},
                      {"binary_head", c.binary_head},
                      {"relative_attention", c.relative_attention},
                      {"rope", c.rope},
                      {"no_position_embedding", c.no_position_embedding},
                      {"rotary_percent", c.rotary_percent},
                      {"rotary_base", c.rotary_base},
                      {"rotary_interleaved", c.rotary_interleaved},
                      {"rotary_seq_len_interpolation_factor", c.rotary_interpolation},
                      {"decoder_num_layers", c.decoder_layers()},
                      {"decoder_seq_length", c.decoder_seq()},
                      {"vocab_extra_ids", c.vocab_extra_ids},
                      {"num_layers", c.num_layers},
                      {"hidden_size", c.hidden_size},
                      {"num_attention_heads", c.num_attention_heads},
                      {"ffn_hidden_size", c.ffn()},
                      {"seq_length", c.seq_length},
                      {"max_position_embeddings", c.max_positions()},
                      {"vocab_size", c.vocab_size},
                      {"padded_vocab_size", c.padded_vocab_size()},
                      {"make_vocab_size_divisible_by", c.make_vocab_size_divisible_by},
                      {"tensor_model_parallel_size", c.tensor_model_parallel_size},
                      {"normalization", c.normalization},
                      {"untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights},
                      {"disable_bias_linear", c.disable_bias_linear},
                      {"add_qkv_bias", c.add_qkv_bias},
                      {"swiglu", c.swiglu},
                      {"squared_relu", c.squared_relu},
                      {"num_query_groups", c.query_groups()},
                      {"qk_layernorm", c.qk_layernorm},
                      {"apply_layernorm_1p", c.apply_layernorm_1p},
                      {"apply_residual_connection_post_layernorm", c.residual_post_norm}};
  if (c.relative_attention) {  // T5's position bias: its table's rows, and which distances share one
    m["relative_attention_num_buckets"] = c.relative_attention_num_buckets;
    m["relative_attention_max_distance"] = c.relative_attention_max_distance;
  }
  return m;
}

void print_params(const nlohmann::json& v, ModelConfig c, std::ostream& out) {
  if (v.contains("vocab_file")) {
    c.vocab_size = data::make_tokenizer(tokenizer_options(v, c))->vocab_size();
  } else if (v["tokenizer_type"].get<std::string>() != "GPT2BPETokenizer") {
    c.vocab_size = 30522 + c.vocab_extra_ids;  // BERT's WordPiece vocabulary (+ T5 sentinels)
  }
  const char* key = v.contains("data_path") ? "data_path" : "train_data_path";
  const auto data = v.contains(key) ? v[key].get<std::vector<std::string>>() : std::vector<std::string>();
  if (data.size() == 1 && std::filesystem::exists(data::compact_vocab_path(data[0])))
    c.vocab_size = static_cast<int64_t>(data::read_compact_vocab(data::compact_vocab_path(data[0])).ids.size());  // the corpus's own
  print_sizes(c, out);
}

}  // namespace megabatch::models
