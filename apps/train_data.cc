#include "apps/train_data.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/data/blend.h"
#include "core/data/compact_vocab.h"
#include "core/data/indexed_dataset.h"
#include "core/data/split.h"
#include "core/train/blended_source.h"
#include "core/util/error.h"
#include "core/util/files.h"
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

// One dataset, split by --split.
RunDataset open_dataset(const data::BlendPart& part, const std::string& split) {
  RunDataset d{part.prefix, part.weight, nullptr, {}, {}, {}};
  const fs::path named = data::dataset_prefix(d.prefix);  // (given as its .bin: IndexedDataset says so)
  if (!fs::exists(named.string() + ".idx") && !fs::exists(named.string() + ".bin") &&
      named.filename().string().rfind("brown_", 0) == 0)
    fail("data_path: ", named.string(), ".bin/.idx are missing; the default Brown corpus is made by `",
         preprocess_brown_command(named.parent_path()), "`, run it first");
  d.ds = std::make_shared<const data::IndexedDataset>(d.prefix);
  const auto cut = data::split_documents(split, d.ds->num_documents());
  d.train = {0, cut[0]};
  d.valid = {cut[0], cut[1]};
  d.test = {cut[1], cut[2]};
  check(d.train.end > d.train.begin, "split '", split, "' leaves no training documents in ", d.prefix, " (",
        d.ds->num_documents(), " documents)");
  return d;
}

// For a GPT: "" when the dataset's documents end in the end-of-document token, as Megatron's
// preprocess_data.py --append-eod makes them; else a warning that its samples run from one
// document into the next with no token between (a dataset made without --append-eod). Up to
// 1,000 of the training split's documents, spread over it, are looked at; a dataset where
// none of them ends in the token is said.
std::string missing_eod(const RunDataset& d, const data::Tokenizer& tokenizer) {
  const int32_t eod = tokenizer.special().eod;
  const size_t docs = d.train.end - d.train.begin, looked = std::min<size_t>(docs, 1000);
  if (eod < 0 || looked == 0) return "";
  for (size_t k = 0; k < looked; ++k)
    if (d.ds->last_token(d.train.begin + k * docs / looked) == eod) return "";
  return d.prefix + ": none of the " + std::to_string(looked) + " training documents looked at ends in the " +
         "end-of-document token (" + std::to_string(eod) + ", " + tokenizer.token_text(eod) +
         "), so GPT samples run from one document into the next with no token between them; make the dataset " +
         "with preprocess --append-eod (Megatron's GPT data has it)";
}

std::string percent(double share) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * share);
  return buf;
}

}  // namespace

std::string RunData::prefixes() const {
  std::string s;
  for (const RunDataset& d : sets) s += (s.empty() ? "" : ", ") + d.prefix;
  return s;
}

RunData open_data(const json& v, models::ModelConfig& mc) {
  const auto parts = data::parse_data_path(v["data_path"].get<std::vector<std::string>>());
  RunData d;
  const auto options = models::tokenizer_options(v, mc);
  d.tokenizer = data::tokenizer_for_dataset(data::make_tokenizer(options), parts[0].prefix);
  for (const data::BlendPart& p : parts) {
    const bool compact = fs::exists(data::compact_vocab_path(p.prefix));
    check(!compact || parts.size() == 1, "data_path: ", p.prefix, " has a vocabulary of its own (",
          data::compact_vocab_path(p.prefix).string(),
          "), so its token ids are not those of the other datasets of the blend; blend datasets in the tokenizer's "
          "whole vocabulary (such as the one `preprocess compact` made it from)");
    d.compact_vocab = compact;
    // each dataset's tokenizer record against the run's tokenizer
    if (&p != &parts[0]) (void)data::tokenizer_for_dataset(data::make_tokenizer(options), p.prefix);
  }
  mc.vocab_size = d.tokenizer->vocab_size();
  mc.validate();
  for (const data::BlendPart& p : parts) d.sets.push_back(open_dataset(p, v["split"].get<std::string>()));
  if (mc.family == "gpt")
    for (const RunDataset& set : d.sets)
      if (std::string w = missing_eod(set, *d.tokenizer); !w.empty()) d.warnings.push_back(std::move(w));
  return d;
}

Sources make_sources(const config::Resolved& r, const models::ModelConfig& mc, const RunData& d,
                     const train::TrainOptions& opt) {
  Sources s;
  // The sources of one split (`docs` of each dataset): one dataset's, or the blend of those
  // that hold a sample there; nullptr where none does.
  auto blend = [&](data::DocumentRange RunDataset::*docs, uint64_t seed,
                   bool training) -> std::unique_ptr<train::BatchSource> {
    std::vector<std::unique_ptr<train::BatchSource>> parts;
    std::vector<double> weights;
    for (const RunDataset& set : d.sets) {
      const data::DocumentRange range = set.*docs;
      if (range.end <= range.begin && !training) continue;
      auto src = models::make_batch_source(mc, set.ds, range, *d.tokenizer, seed);
      if (src->samples_per_epoch() == 0) {
        // documents too short for one sample: no training from a dataset meant to be in it
        check(!training || d.sets.size() == 1, "data_path: ", set.prefix, "'s training split holds no sample of ",
              mc.seq_length, " tokens (its documents are too short); leave it out of the blend");
        if (!training) continue;
      }
      weights.push_back(set.weight > 0 ? set.weight : static_cast<double>(src->samples_per_epoch()));
      if (training) s.train_samples.push_back(src->samples_per_epoch());
      parts.push_back(std::move(src));
    }
    if (parts.empty()) return nullptr;
    if (training) s.train_weights = weights;
    if (d.sets.size() == 1) return std::move(parts[0]);
    return std::make_unique<train::BlendedSource>(std::move(parts), std::move(weights));
  };
  s.train = blend(&RunDataset::train, opt.seed, true);
  const bool evaluating = opt.eval_iters > 0 || opt.eval_samples > 0;
  if (!evaluating) return s;
  const uint64_t eval_seed = opt.eval_samples > 0 ? 1234 : opt.seed;
  s.valid = blend(&RunDataset::valid, eval_seed + 1, false);
  s.test = blend(&RunDataset::test, eval_seed + 2, false);  // evaluated once at the end
  if (s.valid) return s;
  std::string docs_said;
  for (const RunDataset& set : d.sets) {
    const size_t docs = set.valid.end - set.valid.begin;
    docs_said += std::string(docs_said.empty() ? "" : "; ") +
                 (docs ? "no sample of " + std::to_string(mc.seq_length) + " tokens (its " + std::to_string(docs) +
                             " documents are too short)"
                       : std::string("no document")) +
                 " of " + set.prefix + "'s " + std::to_string(set.ds->num_documents());
  }
  const std::string why =
      "the validation split of --split '" + r.values["split"].get<std::string>() + "' holds " + docs_said;
  // asked for by name: an error; the default --eval-iters: training goes on, with a warning
  const char* asked = r.given("eval_samples") ? "eval_samples" : r.given("eval_iters") ? "eval_iters" : nullptr;
  if (asked)
    fail("--", config::flag_name(asked), " asks for validation, but ", why,
         "; give the validation split a share (e.g. --split 969,30,1), or drop --", config::flag_name(asked));
  s.no_validation = "no validation loss will be logged: " + why + " (--eval-iters 0 says there is none to take)";
  return s;
}

std::string describe_data(const RunData& d, const Sources& s) {
  double sum = 0;
  for (size_t k = 0; k < d.sets.size(); ++k) sum += s.train_weights[k];
  std::string out = d.sets.size() == 1 ? "" : "a blend of " + std::to_string(d.sets.size()) + " datasets: ";
  for (size_t k = 0; k < d.sets.size(); ++k) {
    const RunDataset& set = d.sets[k];
    const auto docs = set.ds->num_documents();
    if (d.sets.size() > 1) out += (k ? " | " : "") + percent(s.train_weights[k] / sum) + " of the samples from ";
    out += set.prefix + ": " + std::to_string(docs) + " documents, " + std::to_string(set.ds->num_tokens()) +
           " tokens; split " + std::to_string(set.train.end) + " / " + std::to_string(set.valid.end - set.valid.begin) +
           " / " + std::to_string(docs - set.valid.end) + " documents; " + std::to_string(s.train_samples[k]) +
           " training samples per epoch";
  }
  if (d.compact_vocab)
    out += "; vocabulary: its own " + std::to_string(d.tokenizer->vocab_size()) + " " +
           std::string(d.tokenizer->type()) + " tokens (" + data::compact_vocab_path(d.sets[0].prefix).string() + ")";
  return out;
}

}  // namespace megabatch::apps
