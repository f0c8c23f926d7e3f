#include "core/train/resume.h"

#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/data/tokenizer_record.h"
#include "core/train/trainer_state.h"
#include "core/util/error.h"
#include "core/util/numbers.h"
#include "core/util/strings.h"

namespace megabatch::train {

std::optional<std::filesystem::path> intact_checkpoint(const std::filesystem::path& load, bool fallback,
                                                       std::ostream& console, const std::string& flag) {
  const bool file = std::filesystem::is_regular_file(load);
  std::optional<std::filesystem::path> chosen = file ? std::optional(load) : io::latest_checkpoint(load);
  if (!chosen) return chosen;
  const auto damage = io::checkpoint_damage(*chosen);
  if (!damage) return chosen;
  const bool own = flag == "--load";  // this run's checkpoints, not the weights it starts from
  if (file)
    fail(*damage, "; give ", flag, " another checkpoint",
         own ? ", or its directory to resume from the newest there" : "");
  const auto intact =
      io::newest_intact_checkpoint(load, io::checkpoint_iteration(*chosen).value_or(std::numeric_limits<int64_t>::max()));
  check(intact.has_value(), *damage, "; ", load.string(), " holds no intact checkpoint before it",
        own ? ": move the damaged file away to start from scratch" : "");
  const std::string which =
      intact->string() + " (iteration " + std::to_string(io::checkpoint_iteration(*intact).value_or(-1)) + ")";
  check(fallback, *damage, "; the newest intact checkpoint in ", load.string(), " is ", which,
        own ? ": resume from it with --load-fallback (or " : ": start from it with ", flag, " ", intact->string(),
        own ? ")" : "");
  console << "> warning: " << *damage << "; resuming from the newest intact checkpoint, " << which
          << " (--load-fallback)" << std::endl;
  return intact;
}

namespace {
// --pretrained-checkpoint's path that holds no checkpoint: a wrong path, not a first start.
[[noreturn]] void no_pretrained_checkpoint(const std::string& pretrained) {
  fail("--pretrained-checkpoint: ", pretrained,
       " holds no checkpoint to start from; give it the checkpoint directory (--save) of the run whose weights this "
       "one starts from, or one of its iter_NNNNNNN.h5 files");
}
}  // namespace

std::optional<std::filesystem::path> checkpoint_to_load(const LoadOptions& how) {
  auto named = [](const std::string& path) -> std::optional<std::filesystem::path> {
    if (path.empty()) return std::nullopt;
    return std::filesystem::is_regular_file(path) ? std::optional<std::filesystem::path>(path)
                                                  : io::latest_checkpoint(path);
  };
  if (how.ckpt_step && !how.load.empty()) return io::checkpoint_path(how.load, *how.ckpt_step);
  if (auto own = named(how.load)) return own;
  return named(how.pretrained);
}

ResumePoint find_resume_point(const LoadOptions& how, uint64_t seed, int64_t train_iters, std::ostream& console,
                              bool verify) {
  // the checkpoint a path names: read whole (verify), else the file or the newest by its name
  auto checkpoint_of = [&](const std::string& path, bool fallback, const std::string& flag) {
    if (verify) return intact_checkpoint(path, fallback, console, flag);
    return std::filesystem::is_regular_file(path) ? std::optional<std::filesystem::path>(path)
                                                  : io::latest_checkpoint(path);
  };
  ResumePoint p;
  p.finetune = how.finetune;
  p.no_load_optim = how.no_load_optim;
  if (how.ckpt_step) {
    check(!std::filesystem::is_regular_file(how.load), "--ckpt-step ", *how.ckpt_step,
          " picks a checkpoint of --load's directory, and --load names the file ", how.load,
          "; give --load its directory, or drop --ckpt-step");
    const std::filesystem::path file = io::checkpoint_path(how.load, *how.ckpt_step);
    if (!std::filesystem::exists(file)) {
      std::vector<int64_t> its;
      for (const auto& [it, path] : io::list_checkpoints(how.load)) its.push_back(it);
      const std::string held = join(its, ", ");
      fail("--ckpt-step ", *how.ckpt_step, ": ", how.load, " holds no checkpoint of iteration ", *how.ckpt_step,
           held.empty() ? std::string(" (it holds none)") : " (it holds iterations " + held + ")",
           "; give one of them, or drop --ckpt-step to resume from the newest");
    }
    p.from = checkpoint_of(file.string(), false, "--load");
  } else if (!how.load.empty()) {
    p.from = checkpoint_of(how.load, how.fallback, "--load");
    if (!p.from) {
      // resuming, an empty directory is the first start; fine-tuning, it is a wrong path
      check(!how.finetune, "--finetune: ", how.load,
            " holds no checkpoint to fine-tune from; give --load the directory (or file) of the run whose weights "
            "this one starts from");
      check(!how.exit_on_missing, "--exit-on-missing-checkpoint: ", how.load,
            " (--load) holds no checkpoint; give --load the directory (--save) of the run to resume, or drop "
            "--exit-on-missing-checkpoint for a first start");
      console << "> no checkpoint in " << how.load << "; "
              << (how.pretrained.empty() ? "starting from scratch" : "a first start, from --pretrained-checkpoint")
              << "\n";
    }
  }
  if (!p.from && !how.pretrained.empty()) {
    p.from = checkpoint_of(how.pretrained, false, "--pretrained-checkpoint");
    if (!p.from) no_pretrained_checkpoint(how.pretrained);
    // iteration 0, this run's seed: the weights only, or the optimizer's state too
    p.finetune = true;
    p.pretrained_optimizer = how.pretrained_optimizer;
  }
  if (!p.from) return p;
  p.state = io::read_checkpoint_state(*p.from);
  check(p.finetune || p.state.seed == seed, p.from->string(), ": written with --seed ", p.state.seed,
        " but this run has --seed ", seed,
        "; resume with the same seed (data order and dropout depend on it), or use --finetune");
  check(p.finetune || p.state.iteration <= train_iters, p.from->string(), ": the checkpoint is at iteration ",
        p.state.iteration, ", past --train-iters ", train_iters);
  return p;
}

namespace {
// --pretrained-optimizer-state from a checkpoint of another plugin: its state is not this one's.
void check_pretrained_plugin(const std::filesystem::path& file, const std::string& theirs, const std::string& ours) {
  check(theirs == ours, file.string(),
        ": --pretrained-optimizer-state takes its optimizer state, which is from plugin '", theirs,
        "', but this run uses '", ours, "'; give --optimizer ", theirs,
        ", or drop --pretrained-optimizer-state to take the weights only");
}

// A model setting that changes what the weights compute while their names and shapes stay the
// same, so io::check_checkpoint_matches cannot tell a checkpoint of the other setting.
struct WeightMeaning {
  const char* key;        // in the checkpoint's recorded model (models::model_json)
  nlohmann::json absent;  // its value in a checkpoint from before the setting (null: not compared)
  bool rotary;            // compared only when both models turn their queries and keys
  const char* what;       // what the weights would be read as
};
const WeightMeaning kWeightMeanings[] = {
    {"squared_relu", false, false, "the MLP's activation: squared ReLU, else GELU"},
    {"post_layernorm", false, false, "the blocks' order: BERT's post-LN, else pre-LN"},
    {"apply_residual_connection_post_layernorm", false, false,
     "the residual each block adds to: its norm's output, else its input"},
    {"rotary_interleaved", false, true, "which channels of a head turn together: pairs, else halves"},
    {"rotary_percent", 1.0, true, "how many of each head's channels turn"},
    // (the fused QKV weight's rows: per group of heads, its queries, key and value, each a
    // head dim wide; as many rows for another count of heads that divides the hidden size)
    {"num_attention_heads", nullptr, false, "which rows of the attention's projections make each head"},
    {"relative_attention_max_distance", nullptr, false,
     "which distances between tokens share a row of T5's position bias"},
};

// A recorded setting as its flag: (true) "--squared-relu", (false) "no --squared-relu" (the
// words before a bool's flag: `yes`, `no`), (0.5) "--rotary-percent 0.5".
std::string as_flag(const char* key, const nlohmann::json& value, const char* yes, const char* no) {
  const std::string flag = "--" + config::flag_name(key);
  if (value.is_boolean()) return (value.get<bool>() ? yes : no) + flag;
  return yes + flag + " " + (value.is_number() ? shortest(value.get<double>()) : value.dump());
}

// What the checkpoint's header (its state and recorded model) says against the run: the
// vocabulary, the settings that change what its weights mean and, for
// --pretrained-optimizer-state, the plugin.
void check_checkpoint_header(const ResumePoint& point, int64_t vocab_size, const nlohmann::json& tokenizer,
                             const std::string& plugin, const nlohmann::json& model) {
  check_checkpoint_vocabulary(*point.from, point.state.model, vocab_size, tokenizer);
  // (a checkpoint from before the setting has plain weights)
  const bool theirs = point.state.model.value("apply_layernorm_1p", false),
             ours = model.value("apply_layernorm_1p", false);
  check(theirs == ours, point.from->string(), ": its norms' weights are stored as ",
        theirs ? "w, applied as 1 + w" : "the scale itself", " and this run's ",
        ours ? "as w, applied as 1 + w (--apply-layernorm-1p)" : "as the scale itself",
        ", so every norm would scale by 1 more or less; load it ", theirs ? "with" : "without",
        " --apply-layernorm-1p");
  const bool both_rotary = point.state.model.value("rope", false) && model.value("rope", false);
  for (const WeightMeaning& m : kWeightMeanings) {
    if (m.rotary && !both_rotary) continue;
    const nlohmann::json theirs_m = point.state.model.value(m.key, m.absent), ours_m = model.value(m.key, m.absent);
    if (theirs_m.is_null() || ours_m.is_null()) continue;
    check(theirs_m == ours_m, point.from->string(), ": it was trained ", as_flag(m.key, theirs_m, "with ", "without "),
          " and this run has ", as_flag(m.key, ours_m, "", "no "), " (", m.what,
          "), which the weights' names and shapes do not tell, so they would load into another model; load it ",
          as_flag(m.key, theirs_m, "with ", "without "));
  }
  if (point.pretrained_optimizer) check_pretrained_plugin(*point.from, point.state.optimizer, plugin);
}
}  // namespace

void check_checkpoint_fits(const ResumePoint& point, const nn::ParameterStore& params, int64_t vocab_size,
                           const nlohmann::json& tokenizer, const std::string& plugin, int64_t padded_vocab,
                           const nlohmann::json& model) {
  if (!point.from) return;
  check_checkpoint_header(point, vocab_size, tokenizer, plugin, model);
  io::check_checkpoint_matches(*point.from, params, point.loads_optimizer() ? plugin : std::string(), padded_vocab,
                               model);
}

namespace {
nlohmann::json without_prefixes(nlohmann::json record) {
  if (record.contains("datasets") && record["datasets"].is_array())
    for (auto& d : record["datasets"])
      if (d.is_object()) d.erase("prefix");
  return record;
}

// "a (500 documents, 1268237 tokens; training documents 0 to 484), ...; samples of 64 tokens"
std::string data_text(const nlohmann::json& r) {
  auto field = [](const nlohmann::json& o, const char* key) {
    return o.is_object() && o.contains(key) ? (o[key].is_string() ? o[key].get<std::string>() : o[key].dump()) : "?";
  };
  std::string out;
  if (r.contains("datasets") && r["datasets"].is_array())
    for (const auto& d : r["datasets"]) {
      const nlohmann::json span = d.is_object() ? d.value("training_documents", nlohmann::json()) : nlohmann::json();
      const bool weighed = d.is_object() && d.value("weight", nlohmann::json(0)).is_number() && d["weight"] > 0;
      out += (out.empty() ? "" : ", ") + field(d, "prefix") + " (" + field(d, "documents") + " documents, " +
             field(d, "tokens") + " tokens; training documents " +
             (span.is_array() && span.size() == 2 ? span[0].dump() + " to " + span[1].dump() : "?") +
             (weighed ? ", weight " + shortest(d["weight"].get<double>()) : "") + ")";
    }
  return out + "; samples of " + field(r, "seq_length") + " tokens" +
         (r.contains("decoder_seq_length") ? " (decoder " + field(r, "decoder_seq_length") + ")" : "") +
         (r.contains("short_seq_prob") ? ", short ones at --short-seq-prob " + field(r, "short_seq_prob") : "") +
         (r.contains("t5_masking") ? ", --t5-masking " + field(r, "t5_masking") : "");
}
}  // namespace

void check_checkpoint_data(const ResumePoint& point, const nlohmann::json& data) {
  if (!point.resuming() || point.state.data.is_null()) return;
  check(without_prefixes(point.state.data) == without_prefixes(data), point.from->string(), ": its run trained on ",
        data_text(point.state.data), ", and this run's training data is ", data_text(data),
        "; the data position it resumes at (", point.state.consumed_samples,
        " samples) would count other samples than the run's own. Resume with the checkpoint's data (the same "
        "datasets, --split, blend weights, --seq-length, --short-seq-prob and --t5-masking), or start a new run from "
        "its weights "
        "(--finetune --load, or --pretrained-checkpoint)");
}

nlohmann::json checkpoint_tokenizer(const data::Tokenizer& tokenizer) {
  const data::TokenizerRecord r = data::describe_tokenizer(tokenizer);
  return {{"tokenizer_type", r.tokenizer_type}, {"vocab_fingerprint", r.fingerprint}};
}

void check_checkpoint_vocabulary(const std::filesystem::path& file, const nlohmann::json& model, int64_t vocab_size,
                                 const nlohmann::json& tokenizer) {
  // Only the vocabulary's padding may differ (as between tensor-parallel sizes): rows of
  // another vocabulary are other tokens' (a compact dataset's, or another tokenizer's).
  if (model.contains("vocab_size") && model["vocab_size"].is_number_integer())
    check(model["vocab_size"].get<int64_t>() == vocab_size, file.string(), ": its model has a vocabulary of ",
          model["vocab_size"].get<int64_t>(), " tokens, but this run's has ", vocab_size,
          ", so its embedding rows would stand for other tokens; load it with the dataset and tokenizer it was "
          "trained with, or start without it");
  // As many tokens, other ones (another vocabulary file of the same size): the record tells.
  if (model.contains("tokenizer")) {
    const nlohmann::json& theirs = model["tokenizer"];
    check(theirs["vocab_fingerprint"] == tokenizer["vocab_fingerprint"], file.string(),
          ": its model was trained with a ", theirs["tokenizer_type"].get<std::string>(), " vocabulary of ", vocab_size,
          " tokens (", theirs["vocab_fingerprint"].get<std::string>(), "), and this run's ",
          tokenizer["tokenizer_type"].get<std::string>(), " vocabulary has as many but other ones (",
          tokenizer["vocab_fingerprint"].get<std::string>(),
          "), so its embedding rows would stand for other tokens; load it with the --vocab-file and dataset it was "
          "trained with, or start without it");
  }
}

void load_resume_point(const ResumePoint& point, nn::ParameterStore& params, optim::PluginOptimizer& optimizer,
                       optim::DpShards* shards, int64_t vocab_size, const nlohmann::json& tokenizer,
                       int64_t padded_vocab, const nlohmann::json& model, std::ostream& console) {
  if (!point.from) return;
  // (load_checkpoint checks the names, shapes and plugin itself, as io::check_checkpoint_matches)
  check_checkpoint_header(point, vocab_size, tokenizer, optimizer.plugin().name(), model);
  const bool load_optim = point.loads_optimizer();
  optim::OptimizerState whole = load_optim ? optimizer.whole_state() : optim::OptimizerState{};
  std::vector<Tensor> masters = shards ? shards->whole_masters() : std::vector<Tensor>{};
  io::load_checkpoint(*point.from, params, load_optim ? &whole : nullptr, optimizer.plugin().name(), padded_vocab,
                      shards ? &masters : nullptr, model);
  if (load_optim) optimizer.restore_pieces(whole);
  if (shards) shards->restore_masters(masters);
  const auto& s = point.state;
  console << "> loaded "
          << (point.pretrained_optimizer ? "the model and optimizer state from "
              : point.finetune           ? "the model from "
              : point.no_load_optim      ? "the model and position from "
                                         : "")
          << point.from->string() << " (iteration " << s.iteration << ", " << s.consumed_samples << " samples)"
          << (point.finetune ? "; starting at iteration 0" : "")
          << (s.checksummed ? "" : "; written before checkpoints carried checksums, so not verified") << std::endl;
}

namespace {
// The settings of the checkpoint's schedule and the run's that differ where they move the
// learning rate under either one's decay style: "what X in the checkpoint, Y in this run" each.
std::vector<std::string> schedule_differences(const optim::LrSchedule& saved, const optim::LrSchedule& run) {
  using optim::DecayStyle;
  std::vector<std::string> out;
  auto differ = [&](const std::string& what, const std::string& a, const std::string& b) {
    if (a != b) out.push_back(what + " " + a + " in the checkpoint, " + b + " in this run");
  };
  const auto decays = [](DecayStyle s) { return s != DecayStyle::kConstant; };
  const auto spans = [](DecayStyle s) {
    return s == DecayStyle::kLinear || s == DecayStyle::kCosine || s == DecayStyle::kPolynomial ||
           s == DecayStyle::kWsd;
  };
  differ("--lr-decay-style", optim::decay_style_name(saved.style), optim::decay_style_name(run.style));
  differ("peak learning rate (--lr, after --lr-scaling)", shortest(saved.max_lr), shortest(run.max_lr));
  differ("warmup (samples: --lr-warmup-*)", std::to_string(saved.warmup_samples), std::to_string(run.warmup_samples));
  if (decays(saved.style) || decays(run.style))
    differ("--min-lr (after --lr-scaling)", shortest(saved.min_lr), shortest(run.min_lr));
  if (spans(saved.style) || spans(run.style))
    differ("decay span (samples: --lr-decay-iters or --lr-decay-samples, else the run's length)",
           std::to_string(saved.decay_samples), std::to_string(run.decay_samples));
  if (saved.style == DecayStyle::kPolynomial || run.style == DecayStyle::kPolynomial)
    differ("--lr-decay-power", shortest(saved.power), shortest(run.power));
  if (saved.style == DecayStyle::kWsd || run.style == DecayStyle::kWsd) {
    differ("WSD's decay (samples: --lr-wsd-decay-*)", std::to_string(saved.wsd_decay_samples),
           std::to_string(run.wsd_decay_samples));
    differ("--lr-wsd-decay-style", optim::wsd_style_name(saved.wsd_style), optim::wsd_style_name(run.wsd_style));
  }
  if (saved.warmup_samples > 0 || run.warmup_samples > 0)
    differ("--lr-warmup-init (after --lr-scaling)", shortest(saved.init_lr), shortest(run.init_lr));
  // the embedding's own learning rate (--decoupled-lr): none, or its peak and minimum
  const auto own = [](const optim::LrSchedule& s, double x) { return s.decoupled ? shortest(x) : std::string("none"); };
  differ("--decoupled-lr (after --lr-scaling)", own(saved, saved.decoupled_max_lr), own(run, run.decoupled_max_lr));
  if (saved.decoupled && run.decoupled && (decays(saved.style) || decays(run.style)))
    differ("--decoupled-min-lr (after --lr-scaling)", shortest(saved.decoupled_min_lr), shortest(run.decoupled_min_lr));
  // the weight decay: a constant one is the plugin's weight_decay (Megatron checks it as its start and end)
  const optim::WdSchedule &sw = saved.wd, &rw = run.wd;
  differ("--weight-decay-incr-style", optim::wd_incr_style_name(sw.style), optim::wd_incr_style_name(rw.style));
  if (!sw.scheduled() && !rw.scheduled()) {
    differ("weight decay (--weight-decay)", shortest(sw.end), shortest(rw.end));
  } else {
    differ("--start-weight-decay", shortest(sw.start), shortest(rw.start));
    differ("--end-weight-decay", shortest(sw.end), shortest(rw.end));
    if (sw.scheduled() && rw.scheduled())
      differ("weight-decay span (samples: the run's length)", std::to_string(sw.incr_samples),
             std::to_string(rw.incr_samples));
  }
  return out;
}
}  // namespace

optim::LrSchedule schedule_on_resume(const ResumePoint& point, const optim::LrSchedule& run, ScheduleOnResume how,
                                     std::ostream& console) {
  if (!point.resuming()) return run;
  const TrainerState state = read_trainer_state(point.state);
  if (!state.schedule) return run;
  optim::LrSchedule saved = *state.schedule;
  if (!state.schedule_has_wd) saved.wd = run.wd;  // saved before weight-decay schedules: nothing to compare
  const std::vector<std::string> diff = schedule_differences(saved, run);
  if (diff.empty()) return run;
  std::string list;
  for (const auto& d : diff) list += (list.empty() ? "" : "; ") + d;
  check(how != ScheduleOnResume::kCheck, point.from->string(),
        " was trained with another learning-rate or weight-decay schedule than this run's flags give, so the resumed "
        "run would go on with another one: ",
        list,
        ". Give the flags the checkpoint was trained with, or --use-checkpoint-opt-param-scheduler to keep its "
        "schedule, or --override-opt-param-scheduler to take this run's");
  const bool own = how == ScheduleOnResume::kOverride;
  console << "> learning-rate and weight-decay schedule: " << (own ? "this run's flags'" : "the checkpoint's") << " ("
          << (own ? "--override-opt-param-scheduler" : "--use-checkpoint-opt-param-scheduler") << "), where " << list
          << std::endl;
  return own ? run : saved;
}

}  // namespace megabatch::train
