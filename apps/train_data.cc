#include "apps/train_data.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "core/data/blend.h"
#include "core/data/compact_vocab.h"
#include "core/data/indexed_dataset.h"
#include "core/data/split.h"
#include "core/train/blended_source.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"
#include "core/util/numbers.h"
#include "core/util/strings.h"
#include "models/model_flags.h"
#include "models/registry.h"

namespace megabatch::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The command that makes the default Brown corpus into `dir`: the preprocess program beside
// this train (build/bin/preprocess from the source tree, PREFIX/bin/preprocess installed;
// relative to the working directory where it lies under it), with --output-dir unless the
// directory is data/, its default.
std::string preprocess_brown_command(const fs::path& dir) {
  const fs::path bin = program_dir();
  fs::path program = bin.empty() ? fs::path("preprocess") : bin / "preprocess";
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  const fs::path rel = ec ? fs::path() : program.lexically_relative(cwd);
  if (!rel.empty() && *rel.begin() != "..") program = rel;
  const fs::path out = dir.empty() ? fs::path(".") : dir;
  return program.string() + " brown" +
         (out.lexically_normal() == fs::path("data") ? "" : " --output-dir " + out.string());
}

// The flags that give each split its own data, whole, instead of --data-path's --split shares.
constexpr const char* kSplitKeys[3] = {"train_data_path", "valid_data_path", "test_data_path"};
constexpr const char* kSplitNames[3] = {"training", "validation", "test"};
constexpr data::DocumentRange RunDataset::*kRanges[3] = {&RunDataset::train, &RunDataset::valid, &RunDataset::test};

// The file read_data_args took split k's data from (-1: --data-path's) as "FILE (--its-flag)";
// "" where a flag gave it.
std::string data_file(const json& v, int k) {
  const char* file_key = k < 0 ? "data_args_path" : "per_split_data_args_path";
  return v.contains(file_key) ? v[file_key].get<std::string>() + " (--" + config::flag_name(file_key) + ")" : "";
}

// What gave split k's data, as errors name it: its key; or its file (and the file's key).
constexpr const char* kFileKeys[3] = {"train", "valid", "test"};
std::string data_source(const json& v, int k) {
  const std::string file = data_file(v, k);
  if (file.empty()) return k < 0 ? "data_path" : kSplitKeys[k];
  return k < 0 ? file : file + ": " + kFileKeys[k];
}

bool serves(const RunDataset& set, int split) { return set.split < 0 || set.split == split; }

// The documents a dataset gives: all of its split's under --train-data-path and the like;
// --split's training share under --data-path.
const data::DocumentRange& served(const RunDataset& set) { return set.*kRanges[std::max(set.split, 0)]; }

// --data-path against --train-data-path, --valid-data-path and --test-data-path: one or the
// other (Megatron would train on --data-path and ignore the others without a word), without
// --split beside the others (it cuts --data-path's documents; Megatron asserts against it),
// and with training data.
void check_data_options(const config::Resolved& r) {
  const json& v = r.values;
  std::vector<std::string> given;
  for (const char* key : kSplitKeys)
    if (v.contains(key)) given.push_back("--" + config::flag_name(key));
  if (given.empty()) return;
  const std::string flags = join(given, ", ");
  check(!v.contains("data_path"), "--data-path and ", flags,
        " both give the data: give --data-path (cut into training, validation and test by --split), or each "
        "split's own data by --train-data-path, --valid-data-path and --test-data-path, not both");
  check(!r.given("split"), "--split cuts --data-path's documents, but ", flags, given.size() == 1 ? " gives" : " give",
        " each split its own data, whole; drop --split");
  check(v.contains("train_data_path"), flags,
        " without --train-data-path: give the training data by --train-data-path");
}

// A dataset of the run, with the default Brown corpus's command when it is missing, and the
// working directory where a missing one was named by a relative path (a sweep file's data/...
// run from elsewhere). Errors name the flag that gave it, where that is not --data-path.
std::shared_ptr<const data::IndexedDataset> open_indexed(const std::string& prefix, const std::string& key) {
  const fs::path named = data::dataset_prefix(prefix);  // (given as its .bin: IndexedDataset says so)
  const bool missing = !fs::exists(named.string() + ".idx") && !fs::exists(named.string() + ".bin");
  std::string relative;
  std::error_code ec;
  if (const fs::path cwd = fs::current_path(ec); missing && named.is_relative() && !ec)
    relative = "; " + named.string() + " is relative to the working directory, " + cwd.string();
  if (missing && named.filename().string().rfind("brown_", 0) == 0)
    fail(key, ": ", named.string(), ".bin/.idx are missing", relative, "; the default Brown corpus is made by `",
         preprocess_brown_command(named.parent_path()), "`, run it first");
  try {
    return std::make_shared<const data::IndexedDataset>(prefix);
  } catch (const Error& e) {
    if (key == "data_path" && relative.empty()) throw;
    fail(key == "data_path" ? "" : key + ": ", e.what(), relative);
  }
}

// A dataset's documents for the splits: --split's shares of them; or all for the one split
// whose flag names it.
void assign_documents(RunDataset& d, const std::string& split) {
  const size_t docs = d.ds->num_documents();
  if (d.split >= 0) {
    d.*kRanges[d.split] = {0, docs};
    return;
  }
  const auto cut = data::split_documents(split, docs);
  d.train = {0, cut[0]};
  d.valid = {cut[0], cut[1]};
  d.test = {cut[1], cut[2]};
  check(d.train.end > d.train.begin, "split '", split, "' leaves no training documents in ", d.prefix, " (", docs,
        " documents)");
}

// For a GPT: "" when the dataset's documents end in the end-of-document token, as Megatron's
// preprocess_data.py --append-eod makes them; else a warning that its samples run from one
// document into the next with no token between (a dataset made without --append-eod). Up to
// 1,000 of the documents it serves (its training split's under --split), spread over them,
// are looked at; a dataset where none of them ends in the token is said.
std::string missing_eod(const RunDataset& d, const data::Tokenizer& tokenizer) {
  const int32_t eod = tokenizer.special().eod;
  const data::DocumentRange& range = served(d);
  const size_t docs = range.end - range.begin, looked = std::min<size_t>(docs, 1000);
  if (eod < 0 || looked == 0) return "";
  for (size_t k = 0; k < looked; ++k)
    if (d.ds->last_token(range.begin + k * docs / looked) == eod) return "";
  return d.prefix + ": none of the " + std::to_string(looked) + (d.split < 0 ? " training" : "") +
         " documents looked at ends in the end-of-document token (" + std::to_string(eod) + ", " +
         tokenizer.token_text(eod) +
         "), so GPT samples run from one document into the next with no token between them; make the dataset " +
         "with preprocess --append-eod (Megatron's GPT data has it)";
}

std::string percent(double share) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * share);
  return buf;
}

}  // namespace

void read_data_args(config::Resolved& r) {
  json& v = r.values;
  const bool whole = v.contains("data_args_path"), per_split = v.contains("per_split_data_args_path");
  if (!whole && !per_split) return;
  check(!(whole && per_split), "--data-args-path and --per-split-data-args-path both give the data; give one");
  const std::string flag = whole ? "--data-args-path" : "--per-split-data-args-path";
  const fs::path file = v[whole ? "data_args_path" : "per_split_data_args_path"].get<std::string>();
  for (const char* key : {"data_path", "train_data_path", "valid_data_path", "test_data_path"})
    check(!v.contains(key), flag, " ", file.string(), " gives the data, and so does --", config::flag_name(key),
          "; give one of them");
  // a list of strings, or one string of whitespace-separated items (Megatron's file)
  auto items = [&](const json& x, const std::string& where) {
    std::vector<std::string> out;
    if (x.is_string()) {
      std::istringstream in(x.get<std::string>());
      for (std::string item; in >> item;) out.push_back(item);
    } else {
      check(x.is_array(), where, ": expected a list of strings or one string, got ", x.dump());
      for (const json& item : x) {  // a weight may be a number
        check(item.is_string() || item.is_number(), where, ": ", item.dump(),
              " is neither a dataset prefix nor a weight");
        out.push_back(item.is_string() ? item.get<std::string>() : shortest(item.get<double>()));
      }
    }
    (void)data::parse_data_path(out, where);  // the file's mistakes, named by it
    return out;
  };
  const std::string text = read_file(file, flag + " file");
  if (whole) {
    v["data_path"] = items(json(text), file.string() + " (" + flag + ")");
    return;
  }
  const json j = parse_json_or_fail(text, file.string() + " (" + flag + ")",
                                    "; it holds {\"train\": [...], \"valid\": [...], \"test\": [...]}");
  check(j.is_object(), file.string(), " (", flag, "): expected {\"train\": [...], \"valid\": [...], \"test\": [...]}");
  for (const auto& [key, x] : j.items())
    check(key == "train" || key == "valid" || key == "test", file.string(), " (", flag, "): unknown key '", key,
          "'; the splits are train, valid and test");
  check(j.contains("train"), file.string(), " (", flag, "): no \"train\" data");
  for (const char* split : {"train", "valid", "test"})
    if (j.contains(split) && !j[split].is_null())
      v[std::string(split) + "_data_path"] = items(j[split], file.string() + " (" + flag + "): " + split);
}

std::string RunData::prefixes() const {
  std::vector<std::string> named;
  for (const RunDataset& d : sets)
    if (std::find(named.begin(), named.end(), d.prefix) == named.end()) named.push_back(d.prefix);
  return join(named, ", ");
}

RunData open_data(const config::Resolved& r, models::ModelConfig& mc) {
  const json& v = r.values;
  check_data_options(r);
  RunData d;
  d.per_split = !v.contains("data_path");
  struct Part {
    data::BlendPart part;
    int split;  // -1: --data-path's
    std::string source;  // data_source's name for it
  };
  std::vector<Part> parts;
  for (int k = d.per_split ? 0 : -1; k < (d.per_split ? 3 : 0); ++k) {
    const std::string key = k < 0 ? "data_path" : kSplitKeys[k];
    if (!v.contains(key)) continue;
    for (data::BlendPart& p : data::parse_data_path(v[key].get<std::vector<std::string>>(), key))
      parts.push_back({std::move(p), k, data_source(v, k)});
  }
  const auto options = models::tokenizer_options(v, mc);
  d.tokenizer = data::tokenizer_for_dataset(data::make_tokenizer(options), parts[0].part.prefix);
  for (const Part& p : parts) {
    const fs::path vocab = data::compact_vocab_path(p.part.prefix);
    if (fs::exists(vocab)) {
      d.compact_vocab = true;
      for (const Part& other : parts)
        check(other.part.prefix == p.part.prefix, p.source, ": ", p.part.prefix, " has a vocabulary of its own (",
              vocab.string(), "), so its token ids are not those of ", other.part.prefix, " (", other.source, "); ",
              d.per_split ? "give every split data" : "blend datasets",
              " in the tokenizer's whole vocabulary (such as the one `preprocess compact` made it from)");
    }
    // each dataset's tokenizer record against the run's tokenizer
    if (&p != &parts[0]) (void)data::tokenizer_for_dataset(data::make_tokenizer(options), p.part.prefix);
  }
  mc.vocab_size = d.tokenizer->vocab_size();
  mc.validate();
  std::map<std::string, std::shared_ptr<const data::IndexedDataset>> opened;  // a dataset two splits name, once
  for (const Part& p : parts) {
    auto& ds = opened[p.part.prefix];
    const bool first = !ds;
    if (first) ds = open_indexed(p.part.prefix, p.source);
    RunDataset& set = d.sets.emplace_back(RunDataset{p.part.prefix, p.part.weight, ds, {}, {}, {}, p.split});
    assign_documents(set, d.per_split ? "" : v["split"].get<std::string>());
    if (mc.family == "gpt" && first)
      if (std::string w = missing_eod(set, *d.tokenizer); !w.empty()) d.warnings.push_back(std::move(w));
  }
  const std::string file = data_file(v, 0);  // the per-split file, if one gave the data
  for (const RunDataset& set : d.sets) {
    if (set.split <= 0) continue;  // a validation or test dataset the run trains on too
    for (const RunDataset& trained : d.sets)
      if (trained.split == 0 && trained.prefix == set.prefix)
        d.warnings.push_back(set.prefix + " is both training and " + kSplitNames[set.split] + " data (" +
                             (file.empty() ? "--" + config::flag_name(kSplitKeys[0]) + " and --" +
                                                 config::flag_name(kSplitKeys[set.split])
                                           : std::string("\"train\" and \"") + kFileKeys[set.split] + "\" of " + file) +
                             "): its " + kSplitNames[set.split] + " loss is measured on documents the run trains on");
  }
  return d;
}

Sources make_sources(const config::Resolved& r, const models::ModelConfig& mc, const RunData& d,
                     const train::TrainOptions& opt) {
  Sources s;
  // The sources of split k: one dataset's, or the blend of those that hold a sample there;
  // nullptr where none does.
  auto blend = [&](int k, uint64_t seed) -> std::unique_ptr<train::BatchSource> {
    const bool training = k == 0;
    const auto members =
        std::count_if(d.sets.begin(), d.sets.end(), [&](const RunDataset& set) { return serves(set, k); });
    std::vector<std::unique_ptr<train::BatchSource>> parts;
    std::vector<double> weights;
    for (const RunDataset& set : d.sets) {
      if (!serves(set, k)) continue;
      const data::DocumentRange range = set.*kRanges[k];
      if (range.end <= range.begin && !training) continue;
      auto src = models::make_batch_source(mc, set.ds, range, *d.tokenizer, seed);
      if (src->samples_per_epoch() == 0) {
        // documents too short for one sample: no training from a dataset meant to be in it
        check(!training || members == 1, data_source(r.values, set.split), ": ", set.prefix,
              set.split < 0 ? "'s training split" : "", " holds no sample of ", mc.seq_length,
              " tokens (its documents are too short); leave it out of the blend");
        if (!training) continue;
      }
      if (const std::string w = src->unused_text_warning(); training && !w.empty())
        s.warnings.push_back(set.prefix + ": " + w);
      weights.push_back(set.weight > 0 ? set.weight : static_cast<double>(src->samples_per_epoch()));
      if (training) s.train_samples.push_back(src->samples_per_epoch());
      parts.push_back(std::move(src));
    }
    if (parts.empty()) return nullptr;
    if (training) s.train_weights = weights;
    if (members == 1) return std::move(parts[0]);
    return std::make_unique<train::BlendedSource>(std::move(parts), std::move(weights));
  };
  s.train = blend(0, opt.seed);
  const bool evaluating = opt.eval_iters > 0 || opt.eval_samples > 0;
  if (!evaluating) return s;
  const uint64_t eval_seed = opt.eval_samples > 0 ? 1234 : opt.seed;
  s.valid = blend(1, eval_seed + 1);
  s.test = blend(2, eval_seed + 2);  // evaluated once at the end
  if (s.valid) return s;
  std::string docs_said;
  for (const RunDataset& set : d.sets) {
    if (!serves(set, 1)) continue;
    const size_t docs = set.valid.end - set.valid.begin;
    docs_said +=
        std::string(docs_said.empty() ? "" : "; ") +
        (docs ? "no sample of " + std::to_string(mc.seq_length) + " tokens (its " + std::to_string(docs) +
                    " documents are too short)"
              : std::string("no document")) +
        (d.per_split ? " in " + set.prefix : " of " + set.prefix + "'s " + std::to_string(set.ds->num_documents()));
  }
  const std::string why =
      !d.per_split ? "the validation split of --split '" + r.values["split"].get<std::string>() + "' holds " + docs_said
      : docs_said.empty() ? std::string("no --valid-data-path was given")
                          : "the validation data of --valid-data-path holds " + docs_said;
  // asked for by name: an error; the default --eval-iters: training goes on, with a warning
  const char* asked = r.values["skip_train"].get<bool>() ? "skip_train"
                      : r.given("eval_samples")          ? "eval_samples"
                      : r.given("eval_iters")            ? "eval_iters"
                                                         : nullptr;
  if (asked)
    fail("--", config::flag_name(asked), " asks for validation, but ", why, "; ",
         !d.per_split        ? "give the validation split a share (e.g. --split 969,30,1)"
         : docs_said.empty() ? "give the validation data by --valid-data-path"
                             : "give validation data that holds a sample by --valid-data-path",
         ", or drop --", config::flag_name(asked));
  s.no_validation = "no validation loss will be logged: " + why + " (--eval-iters 0 says there is none to take)";
  return s;
}

nlohmann::json training_data_record(const RunData& d, const models::ModelConfig& mc) {
  nlohmann::json sets = nlohmann::json::array();
  for (const RunDataset& set : d.sets)
    if (serves(set, 0))
      sets.push_back({{"prefix", set.prefix},
                      {"documents", set.ds->num_documents()},
                      {"tokens", set.ds->num_tokens()},
                      {"training_documents", {set.train.begin, set.train.end}},
                      {"weight", set.weight}});
  nlohmann::json record = {{"datasets", sets}, {"seq_length", mc.seq_length}};
  if (mc.family == "t5") record["decoder_seq_length"] = mc.decoder_seq();
  // it chooses which sentences make each sample (the masking does not: it may change on a
  // resume); recorded where it is not the default, so that checkpoints from before it compare
  if (mc.family != "gpt" && mc.short_seq_prob != models::ModelConfig().short_seq_prob)
    record["short_seq_prob"] = mc.short_seq_prob;
  // T5's whole-word masking fills its samples to the encoder's length (span corruption to what
  // the decoder holds), so it chooses the sentences too
  if (mc.family == "t5" && mc.t5_masking != models::ModelConfig().t5_masking) record["t5_masking"] = mc.t5_masking;
  return record;
}

std::string describe_data(const RunData& d, const Sources& s) {
  double sum = 0;
  for (double w : s.train_weights) sum += w;
  std::string out;
  for (int k = 0; k < (d.per_split ? 3 : 1); ++k) {
    std::vector<const RunDataset*> members;
    for (const RunDataset& set : d.sets)
      if (serves(set, k)) members.push_back(&set);
    if (members.empty()) continue;
    if (d.per_split) out += std::string(k ? "; " : "") + kSplitNames[k] + ": ";
    if (members.size() > 1) out += "a blend of " + std::to_string(members.size()) + " datasets: ";
    for (size_t j = 0; j < members.size(); ++j) {
      const RunDataset& set = *members[j];
      const auto docs = set.ds->num_documents();
      if (j) out += " | ";
      if (members.size() > 1 && k == 0) out += percent(s.train_weights[j] / sum) + " of the samples from ";
      if (members.size() > 1 && k > 0 && set.weight > 0) out += "weight " + shortest(set.weight) + ": ";
      out +=
          set.prefix + ": " + std::to_string(docs) + " documents, " + std::to_string(set.ds->num_tokens()) + " tokens";
      if (!d.per_split)
        out += "; split " + std::to_string(set.train.end) + " / " + std::to_string(set.valid.end - set.valid.begin) +
               " / " + std::to_string(docs - set.valid.end) + " documents";
      if (k == 0) out += "; " + std::to_string(s.train_samples[j]) + " training samples per epoch";
    }
  }
  if (d.compact_vocab)
    out += "; vocabulary: its own " + std::to_string(d.tokenizer->vocab_size()) + " " +
           std::string(d.tokenizer->type()) + " tokens (" + data::compact_vocab_path(d.sets[0].prefix).string() + ")";
  return out;
}

}  // namespace megabatch::apps
