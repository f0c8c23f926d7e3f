// A model from `train`'s flags (Megatron's names): the family and sizes, the family's
// defaults (tokenizer, dataset), the configuration as checkpoints store it, and the figures
// --print-params shows.
#pragma once

#include <iosfwd>

#include <nlohmann/json.hpp>

#include "core/config/config.h"
#include "core/data/tokenizer.h"
#include "models/presets.h"

namespace megabatch::models {

// The model the flags describe: a --model preset or --model-type with its sizes, then any
// size flag over it; errors name the flag.
ModelConfig model_config(const config::Resolved& r);

// Megatron's --use-checkpoint-args: the model's options from a checkpoint's recorded model
// (model_json, as `file` holds it): each option not given takes the checkpoint's value (and
// counts as given), one given with another value is an Error naming the flag, both values and
// the file. Returns the options taken, as flags ("--num-layers 2 --hidden-size 32 ...").
std::string take_checkpoint_model(config::Resolved& r, const nlohmann::json& model, const std::string& file);

// Megatron's defaults of the family (pretrain_gpt.py / pretrain_bert.py / pretrain_t5.py)
// where the flags give none: --tokenizer-type and --data-path (the Brown corpus made by
// `preprocess brown`; none where --train-data-path and the like give the data).
void set_family_defaults(nlohmann::json& values, const ModelConfig& c);

// The tokenizer the flags name (--tokenizer-type, --vocab-file, --merge-file), with T5's
// sentinel tokens: its vocabulary alone, as train never encodes text.
data::TokenizerOptions tokenizer_options(const nlohmann::json& values, const ModelConfig& c);

// The model's configuration as stored in checkpoints.
nlohmann::json model_json(const ModelConfig& c);

// --print-params: the sizes, parameters and memory per rank, with the vocabulary the run
// would have (its tokenizer's, or a compact dataset's own), without reading the data.
void print_params(const nlohmann::json& values, ModelConfig c, std::ostream& out);

}  // namespace megabatch::models
