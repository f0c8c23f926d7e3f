// train: one training run, configured with Megatron-LM's arguments. The composition root:
// the steps are core/train's (run directory, resume point, metrics, optimizer, plan, the
// loop) and models/' (the model and its batches from the flags).
#include <omp.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "apps/train_data.h"
#include "core/comm/mpi_communicator.h"
#include "core/comm/watchdog.h"
#include "core/config/config.h"
#include "core/data/tokenizer.h"
#include "core/optim/optimizer.h"
#include "core/train/exit_status.h"
#include "core/train/memory_check.h"
#include "core/train/optimizer_setup.h"
#include "core/train/options.h"
#include "core/train/rank_agreement.h"
#include "core/train/resume.h"
#include "core/train/run_device.h"
#include "core/train/run_directory.h"
#include "core/train/run_metrics.h"
#include "core/train/run_plan.h"
#include "core/train/trainer.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/numbers.h"
#include "core/util/threads.h"
#include "models/model_flags.h"
#include "models/presets.h"
#include "models/registry.h"

namespace mb = megabatch;
using nlohmann::json;

namespace {

using mb::train::kExitDiverged;
using mb::train::kExitStopped;

const char* kUsage =
    "usage: train [--config FILE.json] [--model PRESET] [Megatron-LM options...]\n"
    "\n"
    "Trains one model with an optimizer plugin and writes RUN_DIR/config.json and RUN_DIR/metrics.h5.\n"
    "Options are Megatron-LM's (pretrain_gpt.py) with their meaning; a config file uses the same names\n"
    "in snake_case, and flags override it.\n"
    "\n"
    "examples:\n"
    "  train --model gpt-mini --micro-batch-size 8 --global-batch-size 32 --train-iters 300 \\\n"
    "        --lr 1e-3 --lr-warmup-iters 30 --lr-decay-style cosine --optimizer adamw --log-interval 10\n"
    "  train --model gpt-7.5b --tensor-model-parallel-size 8 --print-params\n"
    "  train --config run.json --optimizer sgd --optimizer-params momentum=0.95 --optimizer-params nesterov=true\n"
    "  train --list-optimizers\n";

using mb::apps::RunData;
using mb::apps::Sources;

// What "validation loss" and "test loss" will be means over.
void say_evaluation_samples(const mb::train::Trainer& trainer, const Sources& s, bool training) {
  if (!s.valid && !s.test) return;
  auto describe = [&](const char* name, const mb::train::BatchSource& src) {
    const int64_t n = trainer.eval_sample_count(src);
    const auto epoch = static_cast<int64_t>(src.samples_per_epoch());
    std::string said = std::string(name) + " " + std::to_string(n);
    if (epoch <= 0) return said;  // a source that does not know its size
    if (n == epoch) return said + " (the whole split, each once)";
    return said + (n < epoch ? " of " + std::to_string(epoch) : " (the split's " + std::to_string(epoch) + " repeated)");
  };
  std::cout << "> evaluation samples: "
            << (s.valid ? describe("validation", *s.valid) + (s.test ? ", " : "") : std::string())
            << (s.test ? describe("test", *s.test) + (training ? " after training" : "") : std::string()) << std::endl;
}

// The exit status of a run that stopped for `reason`, and its last words.
int outcome(mb::train::StopReason reason, const mb::train::Trainer& trainer, const mb::train::RunDirectory* dir,
            const mb::train::TrainOptions& opt, const std::filesystem::path& run_dir) {
  if (reason == mb::train::StopReason::kSignal) {
    // The stop is done (checkpoint written): a repeat of the request, as sweep run sends
    // until the point has exited, must not kill the process on its way out.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGUSR1, SIG_IGN);
    return kExitStopped;
  }
  if (reason == mb::train::StopReason::kExitDuration) return kExitStopped;  // resumable, as a signal's stop
  if (reason == mb::train::StopReason::kDiverged) {
    if (dir) dir->write_diverged(trainer.diverged_at(), trainer.divergence_reason(), opt.divergence_loss, opt.divergence_intervals);
    std::cout << "> diverged: iteration " << trainer.diverged_at() << ": " << trainer.divergence_reason() << "; "
              << (run_dir / "DIVERGED").string() << std::endl;
    return kExitDiverged;
  }
  std::cout << "> " << (reason == mb::train::StopReason::kFinished ? "done" : "stopped") << ": iteration "
            << trainer.iteration() << ", " << trainer.consumed_samples() << " samples";
  if (!trainer.losses().empty()) std::cout << ", last lm loss " << trainer.losses().back();
  std::cout << std::endl;
  return 0;
}

// Megatron's --skip-train: the run's end-of-training evaluation at its start point (true); it
// saves nothing and writes no TensorBoard events, each said.
bool skipping_training(const json& v, mb::train::TrainOptions& opt) {
  if (!v["skip_train"].get<bool>()) return false;
  if (!opt.save_dir.empty()) {
    std::cout << "> note: --skip-train saves no checkpoint; --save " << opt.save_dir << " is left as it is"
              << std::endl;
    opt.save_dir.clear();
  }
  if (v.contains("tensorboard_dir"))
    std::cout << "> note: --skip-train writes no TensorBoard events, as Megatron's; the evaluation is in "
              << (std::filesystem::path(v["run_dir"].get<std::string>()) / "metrics.h5").string() << std::endl;
  return true;
}

int evaluate_only(mb::train::Trainer& trainer, const mb::train::ResumePoint& resume, const mb::train::RunDirectory* dir,
                  const mb::train::TrainOptions& opt, const std::filesystem::path& run_dir) {
  std::cout << "skipping training (--skip-train is on) ..." << std::endl;
  trainer.final_evaluation();
  if (trainer.diverged()) return outcome(mb::train::StopReason::kDiverged, trainer, dir, opt, run_dir);
  std::cout << "> done: evaluated at iteration " << trainer.iteration() << " (--skip-train), "
            << (resume.from ? "the weights of " + resume.from->string() : std::string("the weights as initialized"))
            << std::endl;
  return 0;
}

// What a run decided before it trains, written to RUN_DIR/config.json and metrics.h5.
json resolved_config(const json& v, const mb::models::ModelConfig& mc, const mb::optim::Plugin& plugin,
                     const json& hparams, mb::train::Model& model, const mb::train::TrainOptions& opt,
                     const mb::comm::ParallelState& parallel, mb::Device device, mb::DType dtype) {
  json resolved = v;
  resolved["optimizer_params"] = hparams;
  resolved["padded_vocab_size"] = mc.padded_vocab_size();
  resolved["num_parameters"] = model.parameters().num_full_parameters();
  resolved["train_iters"] = opt.train_iters;
  resolved["diagnostics_interval"] = opt.diagnostics_interval;
  resolved["global_batch_size"] = opt.global_batch_size;
  resolved["effective_lr"] = opt.schedule.max_lr;
  resolved["effective_min_lr"] = opt.schedule.min_lr;
  resolved["optimizer_version"] = plugin.entry->version ? plugin.entry->version : "";
  resolved["data_parallel_size"] = parallel.dp->size();
  resolved["world_size"] = parallel.world_size;
  resolved["device"] = device.str();
  resolved["params_dtype"] = mb::dtype_name(dtype);
  return resolved;
}

// Everything a run is made of, in the order `train` makes it.
struct Run {
  mb::models::ModelConfig mc;
  mb::DType dtype = mb::DType::kF32;
  RunData data;
  mb::comm::ParallelState parallel;
  bool logger = true;  // one rank writes the console, config.json and metrics.h5
  mb::train::TrainOptions opt;
  mb::optim::Plugin plugin;
  std::vector<double> hparams;
  mb::Device device;
  std::unique_ptr<mb::train::Model> model;
  Sources sources;
  json data_record;  // what the training samples are drawn from (training_data_record), for checkpoints
  std::string checkpoint_args, checkpoint_args_from;  // --use-checkpoint-args: the options taken, and the file
};

// --override-opt-param-scheduler, --use-checkpoint-opt-param-scheduler (train_options refuses both)
mb::train::ScheduleOnResume schedule_choice(const json& v) {
  if (v["override_opt_param_scheduler"].get<bool>()) return mb::train::ScheduleOnResume::kOverride;
  if (v["use_checkpoint_opt_param_scheduler"].get<bool>()) return mb::train::ScheduleOnResume::kFromCheckpoint;
  return mb::train::ScheduleOnResume::kCheck;
}

mb::train::LoadOptions load_options(const json& v) {
  auto text = [&](const char* key) { return v.contains(key) ? v[key].get<std::string>() : std::string(); };
  return {text("load"),
          text("pretrained_checkpoint"),
          v["load_fallback"].get<bool>(),
          v["finetune"].get<bool>(),
          v["no_load_optim"].get<bool>(),
          v["pretrained_optimizer_state"].get<bool>(),
          v["exit_on_missing_checkpoint"].get<bool>(),
          v.contains("ckpt_step") ? std::optional(v["ckpt_step"].get<int64_t>()) : std::nullopt};
}

// Where the run starts (its checkpoint, if any) and the schedule it steps with, which the
// checkpoint's may refuse; verify false (--check): the checkpoint's header, not its tensors.
mb::train::ResumePoint start_point(const json& v, Run& run, bool verify) {
  auto& opt = run.opt;
  const auto resume = mb::train::find_resume_point(load_options(v), opt.seed, opt.train_iters, std::cout, verify);
  // an evaluation asked of a checkpoint that is not there would evaluate the model as initialized
  mb::check(!v["skip_train"].get<bool>() || !v.contains("load") || resume.from,
            "--skip-train: ", v.contains("load") ? v["load"].get<std::string>() : "",
            " (--load) holds no checkpoint to evaluate; give "
            "--load the run's --save directory or one of its iter_NNNNNNN.h5 files, or drop --load to evaluate the "
            "model as initialized");
  mb::train::check_checkpoint_data(resume, run.data_record);
  // a run that starts at iteration 0 from one of --save's own checkpoints would set it aside
  // with the others past its start (train::RunDirectory) before reading it
  std::error_code ec;
  mb::check(!resume.from || resume.resuming() || v["skip_train"].get<bool>() || !v.contains("save") ||
                !std::filesystem::equivalent(resume.from->parent_path(), v["save"].get<std::string>(), ec),
            resume.from ? resume.from->string() : "", ": this run starts at iteration 0 from its weights (",
            v["finetune"].get<bool>() ? "--finetune" : "--pretrained-checkpoint",
            "), and they lie in its own --save directory, where its checkpoints would mix with the ones before it; "
            "give --save another directory");
  // A constant weight decay is the plugin's hyperparameter, recorded for a resumed run's check;
  // the schedule the resume keeps (the checkpoint's, with --use-checkpoint-opt-param-scheduler)
  // sets it back, and a kept schedule needs a plugin that takes one.
  const int wd_index = mb::optim::hparam_index(run.plugin, "weight_decay");
  if (!opt.schedule.wd.scheduled())
    opt.schedule.wd.start = opt.schedule.wd.end = wd_index >= 0 ? run.hparams[static_cast<size_t>(wd_index)] : 0.0;
  // (an evaluation takes no step: whatever schedule its flags give, the checkpoint's is kept)
  opt.schedule = mb::train::schedule_on_resume(
      resume, opt.schedule,
      v["skip_train"].get<bool>() ? mb::train::ScheduleOnResume::kFromCheckpoint : schedule_choice(v), std::cout);
  if (wd_index >= 0 && !opt.schedule.wd.scheduled()) run.hparams[static_cast<size_t>(wd_index)] = opt.schedule.wd.end;
  if (opt.schedule.wd.scheduled()) mb::optim::check_takes_wd_schedule(run.plugin);
  if (opt.schedule.decoupled) mb::optim::check_takes_decoupled_lr(run.plugin);
  return resume;
}

// The processes (tensor-parallel groups of contiguous ranks, data parallelism across them),
// the training options and the optimizer plugin; then the device, which must hold the run.
// false: --check said all is fine and nothing is to be trained.
bool prepare(const mb::config::Resolved& r, const std::vector<std::filesystem::path>& search, Run& run) {
  const json& v = r.values;
  auto& mc = run.mc;
  run.parallel = mb::comm::ParallelState::create(static_cast<int>(mc.tensor_model_parallel_size));
  // Megatron's deadline (10 minutes unless given; 0: none), on jobs of several ranks only
  const double timeout_minutes = v["distributed_timeout_minutes"].get<double>();
  const bool deadline = run.parallel.world_size > 1 && timeout_minutes > 0;
  if (deadline)
    mb::comm::set_collective_timeout(timeout_minutes * 60,
                                     "--distributed-timeout-minutes " + mb::shortest(timeout_minutes),
                                     run.parallel.world_rank);
  const int64_t dp_size = run.parallel.dp->size();
  if (v.contains("data_parallel_size")) {  // what the job was meant to be, against what was launched
    const int64_t want = v["data_parallel_size"].get<int64_t>();
    mb::check(want == dp_size, "data_parallel_size ", want, ": this job has ", run.parallel.world_size,
              " rank(s) at tensor_model_parallel_size ", mc.tensor_model_parallel_size, ", so DP is ", dp_size,
              "; launch TP x DP = ", mc.tensor_model_parallel_size * want, " ranks (mpirun -np N, srun -n N)");
  }
  run.logger = run.parallel.world_rank == 0;
  if (!run.logger) std::cout.rdbuf(nullptr);
  for (const std::string& taken : r.foreign_taken) std::cout << "> note: Megatron-LM's " << taken << std::endl;
  if (!run.checkpoint_args_from.empty())
    std::cout << "> model from " << run.checkpoint_args_from
              << " (--use-checkpoint-args): " << (run.checkpoint_args.empty() ? "the defaults" : run.checkpoint_args)
              << std::endl;
  // --threads 0 (all CPUs) with several ranks on this node: each rank takes its share of the
  // node's CPUs (as torchrun sets OMP_NUM_THREADS=1), since ranks whose OpenMP threads each
  // want every CPU wait on each other's (4 ranks on 2 cores: 3x the time). The ops' results do
  // not depend on the thread count. OMP_NUM_THREADS, where set, decides instead.
  if (v["threads"].get<int64_t>() == 0 && run.parallel.local_size > 1 && !std::getenv("OMP_NUM_THREADS")) {
    const int node_cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(std::min(mb::available_cpus(), std::max(1, node_cpus / run.parallel.local_size)));
  }
  run.opt = mb::train::train_options(r, run.dtype, dp_size, mc.padded_vocab_size());
  run.opt.tokens_per_sample = mb::models::tokens_per_sample(mc);
  run.opt.flops_per_sample = mb::models::megatron_flops(mc, 1);
  run.plugin = mb::optim::load_plugin(v["optimizer"].get<std::string>(), search);
  run.hparams = mb::optim::resolve_hparams(run.plugin, mb::train::optimizer_params(r, run.plugin), "optimizer_params");
  run.device = mb::train::run_device(v, run.dtype, run.parallel.local_rank);
  run.parallel.connect(run.device, v["distributed_backend"].get<std::string>());
  if (run.parallel.collectives != "local") std::cout << "> collectives: " << run.parallel.collectives << std::endl;
  if (run.parallel.world_size > 1)
    std::cout << "> deadline: "
              << (deadline ? "a collective that waits " + mb::shortest(timeout_minutes) +
                                 " min for the other ranks ends the job (--distributed-timeout-minutes)"
                           : std::string("none on waiting for the other ranks (--distributed-timeout-minutes 0)"))
              << std::endl;
  if (run.opt.replica_check_interval > 0 && dp_size == 1)
    std::cout << "> note: --check-weight-hash-across-dp-replicas-interval compares the data-parallel replicas' "
                 "weights, and this run has one: nothing to compare"
              << std::endl;
  mb::train::check_memory(mb::models::model_memory(mc, run.dtype, run.device), run.dtype, run.device,
                          run.opt.micro_batch_size, v["use_distributed_optimizer"].get<bool>() ? dp_size : 1,
                          run.opt.noise_scale, v["skip_memory_check"].get<bool>(), run.logger);
  // before --check returns: its refusals (a validation split asked for and empty) are the run's
  run.sources = mb::apps::make_sources(r, mc, run.data, run.opt);
  run.data_record = mb::apps::training_data_record(run.data, mc);
  for (const std::string& w : run.data.warnings) std::cout << "> warning: " << w << std::endl;
  if (const std::string w = mb::models::sample_fill_warning(mc, *run.data.tokenizer); !w.empty())
    std::cout << "> warning: " << w << std::endl;
  for (const std::string& w : run.sources.warnings) std::cout << "> warning: " << w << std::endl;
  if (!run.sources.no_validation.empty()) std::cout << "> warning: " << run.sources.no_validation << std::endl;
  if (v["check"].get<bool>()) {
    // what its checkpoint would refuse when it loads: said against the model's declared parameters
    const auto resume = start_point(v, run, false);
    if (resume.from)
      mb::train::check_checkpoint_fits(resume, mb::models::declare_model(mc, *run.parallel.tp)->parameters(),
                                       mc.vocab_size, mb::train::checkpoint_tokenizer(*run.data.tokenizer),
                                       run.plugin.name(), mc.padded_vocab_size(), mb::models::model_json(mc));
    std::cout << "> check: configuration, optimizer " << run.plugin.name() << ", data " << run.data.prefixes()
              << " and memory are fine" << std::endl;
    return false;
  }
  run.model = mb::models::make_model(mc, *run.parallel.tp, run.opt.seed, run.dtype, run.device);
  return true;
}

// From the prepared run to its end: the run directory, the resume point, metrics, the plan,
// the optimizer, the loop.
int train(const mb::config::Resolved& r, Run& run) {
  const json& v = r.values;
  auto& opt = run.opt;
  auto& parallel = run.parallel;
  auto& params = run.model->parameters();
  const bool skip_train = skipping_training(v, opt);
  const std::string version = run.plugin.entry->version ? run.plugin.entry->version : "";
  const auto resume = start_point(v, run, true);
  const json hparams = mb::optim::hparams_json(run.plugin, run.hparams);
  const json resolved = resolved_config(v, run.mc, run.plugin, hparams, *run.model, opt, parallel, run.device, run.dtype);
  mb::train::check_ranks_agree(parallel, resolved);
  const std::filesystem::path run_dir = v["run_dir"].get<std::string>();
  std::optional<mb::train::RunDirectory> dir;  // one run per directory, held until the end
  const bool continues = resume.resuming() && !skip_train;  // the metrics.h5 there, continued
  if (run.logger)
    dir.emplace(run_dir, opt.save_dir, resolved, !continues,
                skip_train ? std::nullopt : std::optional<int64_t>(continues ? resume.state.iteration : 0));
  if (dir && !dir->earlier().empty()) std::cout << "> note: " << dir->earlier() << std::endl;
  mb::train::RunMetrics metrics;
  if (run.logger)
    metrics = mb::train::open_metrics(
        dir->metrics_path(), resolved, continues ? std::optional(resume.state.iteration) : std::nullopt,
        v.contains("tensorboard_dir") && !skip_train ? v["tensorboard_dir"].get<std::string>() : "",
        v["tensorboard_log_interval"].get<int64_t>());
  mb::train::print_plan(
      {run.model->summary(),
       run.plugin.name() + " " + version + " (" + run.plugin.path.string() + ") " + hparams.dump(),
       mb::apps::describe_data(run.data, run.sources), run.mc.tensor_model_parallel_size, parallel.dp->size(),
       parallel.world_size, omp_get_max_threads(), run_dir / "metrics.h5", skip_train},
      opt, std::cout);
  opt.overlap_grad_reduce = v["overlap_grad_reduce"].get<bool>();
  opt.ddp_bucket_size = v.contains("ddp_bucket_size") ? v["ddp_bucket_size"].get<int64_t>() : 0;
  std::unique_ptr<mb::optim::DpShards> shards;
  if (v["use_distributed_optimizer"].get<bool>())
    shards = mb::train::make_dp_shards(params, *parallel.dp, opt.ddp_bucket_size, opt.overlap_grad_reduce, std::cout);
  mb::optim::PluginOptimizer optimizer(run.plugin, params, *parallel.tp, run.hparams, opt.seed,
                                       [](const std::string& line) { std::cout << "> plugin: " << line << "\n"; },
                                       shards.get());
  const json tokenizer = mb::train::checkpoint_tokenizer(*run.data.tokenizer);
  mb::train::load_resume_point(resume, params, optimizer, shards.get(), run.mc.vocab_size, tokenizer,
                               run.mc.padded_vocab_size(), mb::models::model_json(run.mc), std::cout);
  opt.checkpoint.model = mb::models::model_json(run.mc);
  opt.checkpoint.data = run.data_record;
  opt.checkpoint.model["tokenizer"] = tokenizer;
  opt.checkpoint.optimizer = run.plugin.name();
  opt.checkpoint.optimizer_version = version;
  opt.checkpoint.optimizer_params = hparams;
  opt.world_size = parallel.world_size;
  mb::train::Trainer trainer(opt, *run.model, optimizer, *parallel.tp, *run.sources.train, run.sources.valid.get(),
                             metrics.metrics.get(), std::cout);
  trainer.set_test_data(run.sources.test.get());
  say_evaluation_samples(trainer, run.sources, !skip_train);
  trainer.set_data_parallel(*parallel.dp);
  trainer.set_world(*parallel.world);
  if (resume.resuming()) trainer.restore(resume.state);
  if (skip_train) return evaluate_only(trainer, resume, dir ? &*dir : nullptr, opt, run_dir);
  return outcome(trainer.run(), trainer, dir ? &*dir : nullptr, opt, run_dir);
}

int run(int argc, char** argv) {
  const auto& schema = mb::train::train_schema();
  mb::config::Resolved r = mb::config::resolve(schema, argc, argv);
  if (r.help || argc == 1) {
    std::cout << kUsage << schema.help();
    return 0;
  }
  json& v = r.values;
  if (v["print_config"].get<bool>()) {  // before any check of this machine: a launcher asks on a head node
    json shown = v;
    shown.erase("print_config");
    std::cout << shown.dump(2) << std::endl;
    return 0;
  }
  const int64_t threads = v["threads"].get<int64_t>();
  mb::check_thread_count(threads, "--threads");
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
  const auto search = mb::optim::plugin_search_path(v["plugin_path"].get<std::vector<std::string>>());
  if (v["list_models"].get<bool>()) {
    for (const auto& p : mb::models::presets()) std::cout << std::left << std::setw(12) << p.name << p.description << "\n";
    return 0;
  }
  if (v["list_optimizers"].get<bool>()) {
    mb::train::list_optimizers(search, std::cout);
    return 0;
  }
  Run run;
  if (v["use_checkpoint_args"].get<bool>()) {
    const auto file = mb::train::checkpoint_to_load(load_options(v));
    mb::check(file && std::filesystem::exists(*file),
              "--use-checkpoint-args takes the model's options from the checkpoint the run loads, and ",
              file ? file->string() + " is not there" : std::string("--load and --pretrained-checkpoint hold none"),
              "; give --load (or --pretrained-checkpoint) a checkpoint directory or file, or drop "
              "--use-checkpoint-args and give the model's flags");
    run.checkpoint_args =
        mb::models::take_checkpoint_model(r, mb::io::read_checkpoint_state(*file).model, file->string());
    run.checkpoint_args_from = file->string();
  }
  run.mc = mb::models::model_config(r);
  run.dtype = mb::train::run_dtype(v);
  mb::apps::read_data_args(r);  // (before the default data: none where a file gives it)
  mb::models::set_family_defaults(v, run.mc);
  if (v["print_params"].get<bool>()) {
    mb::models::print_params(v, run.mc, std::cout);
    return 0;
  }
  run.data = mb::apps::open_data(r, run.mc);
  if (!prepare(r, search, run)) return 0;
  return train(r, run);
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun / srun / an MPIJob this process is one rank of the job.
  const bool mpi = mb::comm::init_mpi_if_launched(&argc, &argv);
  const std::string who = mpi ? "train (rank " + std::string(std::getenv("OMPI_COMM_WORLD_RANK") ? std::getenv("OMPI_COMM_WORLD_RANK")
                                                             : std::getenv("PMIX_RANK") ? std::getenv("PMIX_RANK") : "?") + ")"
                              : "train";
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const mb::Error& e) {  // one write, so that the ranks' lines do not interleave
    std::cerr << who + ": error: " + e.what() + "\n" << std::flush;
    status = 1;
  } catch (const std::exception& e) {
    std::cerr << who + ": internal error: " + e.what() + "\n" << std::flush;
    status = 2;
  }
  // A failing rank ends the whole job at once, so no other rank waits in a collective.
  if (mpi && status != 0 && status != kExitStopped && status != kExitDiverged) mb::comm::abort_job(status);
  return status;
}
