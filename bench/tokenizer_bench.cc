// Tokenizer and preprocess throughput on the de-tagged Brown corpus, with the reference
// GPT-2 encoder (gpt-3-encoder under Node.js) timed in the same run.
//
//   build/bin/tokenizer_bench            (after ./setup.sh and a build)
//
// Prints one table; numbers are wall-clock on this machine, best of --repeat runs.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "core/data/brown.h"
#include "core/data/gpt2_tokenizer.h"
#include "core/data/preprocess.h"
#include "core/data/wordpiece_tokenizer.h"
#include "core/util/args.h"
#include "core/util/error.h"
#include "core/util/files.h"

using namespace megabatch;
using namespace megabatch::data;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Row {
  std::string what, threads;
  double mb_s, tokens_m;
  std::string note;
};

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// The benchmark, its flags read and checked first (guarded_main prints what it throws).
int run(int argc, char** argv) {
  ArgParser a("tokenizer_bench",
              "usage: tokenizer_bench [--repeat N] [--bin-dir DIR]\n\n"
              "GPT-2 BPE and WordPiece encode throughput (one core) and preprocess end to end\n"
              "on the de-tagged Brown corpus, next to the reference JavaScript encoder.");
  a.option("repeat", "N", "runs per measurement (best is reported)", "3");
  a.option("bin-dir", "DIR", "where the preprocess binary is", "");
  if (!a.parse(argc, argv)) return 0;
  const int repeat = static_cast<int>(a.get_int("repeat"));
  check(repeat >= 1, "--repeat ", repeat, ": at least 1");
  std::string bin_dir = a.get("bin-dir");
  if (bin_dir.empty()) bin_dir = std::filesystem::canonical("/proc/self/exe").parent_path().string();

  const auto docs = read_brown(asset_path("brown"));
  std::vector<std::string> records;  // the same records for every encoder
  size_t bytes = 0;
  for (const auto& d : docs)
    for (size_t i = 0; i < d.sentences.size(); i += 4) {
      std::string rec;
      for (size_t k = i; k < std::min(i + 4, d.sentences.size()); ++k) rec += d.sentences[k] + "\n";
      bytes += rec.size();
      records.push_back(std::move(rec));
    }
  const double mb = static_cast<double>(bytes) / 1e6;
  std::vector<Row> rows;

  auto time_encoder = [&](const Tokenizer& tok, bool fresh_each_run, const std::string& name, const std::string& note) {
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeat; ++r) {
      std::unique_ptr<Tokenizer> fresh;
      const Tokenizer* t = &tok;
      if (fresh_each_run) {  // a new tokenizer starts with an empty word cache
        fresh = std::make_unique<Gpt2Tokenizer>(asset_path("gpt2/encoder.json"), asset_path("gpt2/vocab.bpe"));
        t = fresh.get();
      }
      std::vector<int32_t> ids;
      tokens = 0;
      const auto t0 = Clock::now();
      for (const auto& rec : records) {
        ids.clear();
        t->encode(rec, ids);
        tokens += ids.size();
      }
      best = std::min(best, seconds_since(t0));
    }
    rows.push_back({name, "1", mb / best, static_cast<double>(tokens) / 1e6, note});
  };
  const Gpt2Tokenizer gpt2(asset_path("gpt2/encoder.json"), asset_path("gpt2/vocab.bpe"));
  time_encoder(gpt2, true, "megabatch GPT-2 BPE", "cold word cache");
  time_encoder(gpt2, false, "megabatch GPT-2 BPE", "warm word cache");
  const WordPieceTokenizer wp(asset_path("bert/vocab.txt"), true);
  time_encoder(wp, false, "megabatch WordPiece (uncased)", "");

  // Pathological text: one line of random letters without whitespace is one pre-token,
  // which the merges must take apart (target: >= 5 MB/s for 1 MB). The reference is
  // quadratic in it, so it runs on a 16 KB line, beside megabatch on the same line.
  auto letters = [](size_t n) {
    std::mt19937 g(7);
    std::string line;
    for (size_t i = 0; i < n; ++i) line += static_cast<char>('a' + g() % 26);
    return line;
  };
  auto time_line = [&](const std::string& line, const std::string& name, const std::string& note) {
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeat; ++r) {
      const Gpt2Tokenizer fresh(asset_path("gpt2/encoder.json"), asset_path("gpt2/vocab.bpe"));  // cold cache
      std::vector<int32_t> ids;
      const auto t0 = Clock::now();
      fresh.encode(line, ids);
      best = std::min(best, seconds_since(t0));
      tokens = ids.size();
    }
    rows.push_back({name, "1", static_cast<double>(line.size()) / 1e6 / best, static_cast<double>(tokens) / 1e6, note});
  };
  time_line(letters(1 << 20), "megabatch GPT-2 BPE, 1 MB one-word line", "target >= 5 MB/s");
  const std::string short_line = letters(16 << 10);
  time_line(short_line, "megabatch GPT-2 BPE, 16 KB one-word line", "");

  // Reference: gpt-3-encoder's JavaScript encoder on the same records.
  const auto tmp = std::filesystem::temp_directory_path() / ("mb-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  {
    std::ofstream out(tmp / "records.jsonl");
    for (const auto& rec : records) out << nlohmann::json(rec).dump() << "\n";
  }
  const std::string src = std::filesystem::path(__FILE__).parent_path().string();
  double best_js = 1e30, js_tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    std::istringstream res(shell("node " + src + "/gpt2_reference_bench.js " +
                                 (asset_dir() / "gpt-3-encoder").string() + " " + (tmp / "records.jsonl").string()));
    double b = 0, s = 0, t = 0;
    if (!(res >> b >> s >> t)) fail("the reference encoder did not run (is node installed? run ./setup.sh)");
    best_js = std::min(best_js, s);
    js_tokens = t;
  }
  rows.push_back({"reference gpt-3-encoder (Node.js)", "1", mb / best_js, js_tokens / 1e6, "same records"});
  {
    std::ofstream out(tmp / "line.jsonl");
    out << nlohmann::json(short_line).dump() << "\n";
  }
  std::istringstream line_res(shell("node " + src + "/gpt2_reference_bench.js " +
                                    (asset_dir() / "gpt-3-encoder").string() + " " + (tmp / "line.jsonl").string()));
  double lb = 0, ls = 0, lt = 0;
  if (!(line_res >> lb >> ls >> lt)) fail("the reference encoder did not run on the 16 KB line");
  rows.push_back({"reference gpt-3-encoder, 16 KB one-word line", "1", lb / 1e6 / ls, lt / 1e6, "once"});

  // preprocess end to end: brown.jsonl -> GPT-2 dataset, 1 and 2 workers.
  std::ostringstream quiet;
  build_brown(tmp, 2, true, quiet);
  const double jsonl_mb = static_cast<double>(std::filesystem::file_size(tmp / "brown.jsonl")) / 1e6;
  auto time_preprocess = [&](const std::string& input, int w) {
    double best = 1e30;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = Clock::now();
      const std::string out = shell(
          bin_dir + "/preprocess --input " + (tmp / input).string() + " --output-prefix " + (tmp / "bench").string() +
          " --tokenizer-type GPT2BPETokenizer --append-eod --log-interval 0 --workers " + std::to_string(w) + " 2>&1");
      best = std::min(best, seconds_since(t0));
      if (out.find("Done:") == std::string::npos) fail("preprocess failed: ", out);
    }
    return jsonl_mb / best;  // MB of JSON lines (uncompressed) per second
  };
  double plain2 = 0;
  for (int w : {1, 2}) {
    const double v = time_preprocess("brown.jsonl", w);
    if (w == 2) plain2 = v;
    rows.push_back(
        {"preprocess end to end (GPT-2)", std::to_string(w), v, 0, "process start, JSON parse, write .bin/.idx"});
  }
  // Compressed corpora, read through zlib / liblzma / libzstd (target: >= 80% of plain).
  for (const auto& [tool, ext] :
       {std::pair<std::string, std::string>{"gzip -k -6", ".gz"}, {"xz -k -6 -T1", ".xz"}, {"zstd -q -k -3", ".zst"}}) {
    shell(tool + " " + (tmp / "brown.jsonl").string() + " 2>&1");
    if (!std::filesystem::exists(tmp / ("brown.jsonl" + ext))) fail(tool, " did not run (run ./setup.sh)");
    const double v = time_preprocess("brown.jsonl" + ext, 2);
    char note[64];
    std::snprintf(note, sizeof note, "%.0f%% of plain; MB/s of JSON lines", 100.0 * v / plain2);
    rows.push_back({"preprocess end to end (GPT-2), .jsonl" + ext, "2", v, 0, note});
  }
  std::filesystem::remove_all(tmp);

  std::printf("corpus: de-tagged Brown, %zu records, %.2f MB; %u hardware threads; best of %d\n\n", records.size(), mb,
              std::thread::hardware_concurrency(), repeat);
  std::printf("%-44s %7s %9s %9s  %s\n", "encoder", "threads", "MB/s", "Mtokens", "note");
  for (const auto& r : rows)
    std::printf(r.mb_s < 0.1 ? "%-44s %7s %9.4f %9s  %s\n" : "%-44s %7s %9.2f %9s  %s\n", r.what.c_str(),
                r.threads.c_str(), r.mb_s, r.tokens_m > 0 ? std::to_string(r.tokens_m).substr(0, 5).c_str() : "-",
                r.note.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return megabatch::bench::guarded_main("tokenizer_bench", [&] { return run(argc, argv); });
}
