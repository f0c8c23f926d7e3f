// train's data: the datasets --data-path names (one, or a weighted blend) and the --split of
// each, or those each split's own flag names; the tokenizer; and the batch sources of the
// training, validation and test splits.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/data/indexed_dataset.h"
#include "core/data/samples.h"
#include "core/data/tokenizer.h"
#include "core/train/batch_source.h"
#include "core/train/options.h"
#include "models/presets.h"

namespace megabatch::apps {

// One dataset of the run and the documents it gives each split: --split's shares of its own
// documents (--data-path); or all of them, to the one split whose flag names it
// (--train-data-path, --valid-data-path, --test-data-path: a dataset two of them name is two
// of these).
struct RunDataset {
  std::string prefix;
  double weight = 0;  // in its blend, as given; 0: none given (weighed by its samples)
  std::shared_ptr<const data::IndexedDataset> ds;
  data::DocumentRange train, valid, test;
  int split = -1;  // -1: --data-path's; 0, 1, 2: the training, validation or test dataset, whole
};

// The run's datasets and tokenizer; the model's vocabulary is the tokenizer's (a compact
// dataset's own, where PREFIX.vocab.json lies beside it: such a dataset is the run's only one).
struct RunData {
  std::vector<RunDataset> sets;
  bool per_split = false;  // --train-data-path and the like, not --data-path and --split
  std::unique_ptr<data::Tokenizer> tokenizer;
  bool compact_vocab = false;
  std::vector<std::string> warnings;  // what the run should say of its data (a GPT dataset without EOD tokens)
  std::string prefixes() const;       // "a", or "a, b" for a blend (each dataset once)
};

// Megatron's --data-args-path FILE (--data-path's list, whitespace-separated, read from FILE:
// for blends too long for a command line) and --per-split-data-args-path FILE (JSON {"train":
// ..., "valid": ..., "test": ...}, each a list or a whitespace-separated string): their lists
// become data_path, or train_data_path, valid_data_path and test_data_path, checked here so
// that errors name the file. Refused beside the flags they stand for, and beside each other.
void read_data_args(config::Resolved& r);

// Opens --data-path's datasets, or --train-data-path's, --valid-data-path's and
// --test-data-path's (refusing them beside --data-path or --split); errors name the flag and
// the prefix, with the default Brown corpus's command when it is missing. Sets mc.vocab_size
// from the tokenizer, and notes in `warnings` a GPT dataset whose documents do not end in the
// end-of-document token, and a dataset that is both training and validation or test data.
RunData open_data(const config::Resolved& r, models::ModelConfig& mc);

// The batch sources of the splits: training from --seed; validation and test from their own
// documents (with --eval-samples from a fixed seed, so every point of a sweep is measured on
// the same samples), none where evaluation is off or a split holds no sample. A blend's split
// blends the datasets that have samples in it, by their weights.
struct Sources {
  std::unique_ptr<train::BatchSource> train, valid, test;
  std::string no_validation;            // evaluation asked for, nothing to evaluate on (a warning)
  std::vector<std::string> warnings;    // per training dataset whose samples leave most of its text unused
  std::vector<uint64_t> train_samples;  // per dataset: its training split's samples per epoch
  std::vector<double> train_weights;    // per dataset: its weight in the training blend (any scale)
};
Sources make_sources(const config::Resolved& r, const models::ModelConfig& mc, const RunData& d,
                     const train::TrainOptions& opt);

// What a run's training samples are drawn from, for its checkpoints: per dataset of the training
// split its prefix, documents, tokens, the documents of the split and its weight as given; and
// the sample length (T5: and the decoder's). A resumed run is checked against its checkpoint's
// (train::check_checkpoint_data), the prefixes aside: a dataset moved elsewhere is the same.
nlohmann::json training_data_record(const RunData& d, const models::ModelConfig& mc);

// The plan's data line: each dataset's documents, tokens, split and training samples (under
// --train-data-path and the like, each split's datasets).
std::string describe_data(const RunData& d, const Sources& s);

}  // namespace megabatch::apps
