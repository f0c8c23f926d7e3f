// A small mutation fuzzer for the targets in this folder, for machines without libFuzzer
// (GCC builds, CI): each target defines LLVMFuzzerTestOneInput as for libFuzzer, and this
// driver runs it on every file of a seed corpus, then on random mutations of them (bit
// flips, byte changes, insertions, deletions, repeats of a slice, splices of two inputs,
// interesting values) for a given time. A crash, a sanitizer report or an exception the
// target lets out ends the run; the input that caused it is saved first, to replay with
//   fuzz_<target> --replay FILE
// With clang, the same targets link against libFuzzer instead (-DMEGABATCH_LIBFUZZER=ON).
//
//   fuzz_<target> --corpus DIR [--seconds 10] [--seed 1] [--max-len 4096] [--crash-dir DIR]
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

Bytes read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string g_crash_file;  // where the current input is kept while it runs

void keep(const Bytes& b) {
  std::ofstream out(g_crash_file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

extern "C" void on_crash(int sig) {
  const char msg[] = "\nfuzz: the target crashed; the input is in the file named below\n";
  [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
  n = ::write(2, g_crash_file.c_str(), g_crash_file.size());
  n = ::write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

Bytes mutate(const Bytes& in, const std::vector<Bytes>& corpus, std::mt19937_64& g, size_t max_len) {
  Bytes b = in;
  const int edits = 1 + static_cast<int>(g() % 4);
  static const uint8_t interesting[] = {0, 1, 0x7F, 0x80, 0xFF, '"', '\\', '{', '}', '[', ']', ',', ':', '-', '.', 'e', '0', '9', '\n'};
  for (int e = 0; e < edits; ++e) {
    const size_t at = b.empty() ? 0 : g() % b.size();
    switch (g() % 8) {
      case 0: if (!b.empty()) b[at] ^= static_cast<uint8_t>(1u << (g() % 8)); break;
      case 1: if (!b.empty()) b[at] = static_cast<uint8_t>(g()); break;
      case 2: b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<uint8_t>(g())); break;
      case 3: if (!b.empty()) b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(std::min(b.size(), at + 1 + g() % 8))); break;
      case 4: if (!b.empty()) {  // repeat a slice
        const size_t len = 1 + g() % std::min<size_t>(b.size() - at, 16);
        Bytes s(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + len));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), s.begin(), s.end());
      } break;
      case 5: {  // splice another input's tail
        const Bytes& o = corpus[g() % corpus.size()];
        if (!o.empty()) {
          b.resize(at);
          const size_t from = g() % o.size();
          b.insert(b.end(), o.begin() + static_cast<std::ptrdiff_t>(from), o.end());
        }
      } break;
      case 6: if (!b.empty()) b[at] = interesting[g() % sizeof interesting]; break;
      default:  // an 8-byte little-endian extreme value (sizes, counts, offsets)
        if (b.size() >= 8) {
          static const uint64_t v[] = {0, 1, 0x7FFFFFFFull, 0x80000000ull, 0xFFFFFFFFull, 0x7FFFFFFFFFFFFFFFull, ~0ull};
          const uint64_t x = v[g() % 7];
          std::memcpy(&b[g() % (b.size() - 7)], &x, 8);
        }
    }
  }
  if (b.size() > max_len) b.resize(max_len);
  return b;
}
}  // namespace

void usage(const char* program, std::ostream& out) {
  const std::string name = fs::path(program).filename().string();
  out << "usage: " << name << " --corpus DIR [--seconds 10] [--seed 1] [--max-len 4096] [--crash-dir DIR]\n"
      << "       " << name << " --replay FILE\n"
      << "Runs this fuzz target on every file of the seed corpus DIR, then on random mutations of them for\n"
      << "--seconds; an input that crashes it, or makes it let an exception out, is kept in --crash-dir\n"
      << "(crash-input-PID) and ends the run with a nonzero status. --replay runs one such input again.\n"
      << "Examples (from the repository root; ctest -L fuzz runs each target for a few seconds):\n"
      << "  build/bin/" << name << " --corpus tests/fuzz/corpus/" << name.substr(name.find('_') + 1)
      << " --seconds 60\n"
      << "  build/bin/" << name << " --replay build/fuzz-crashes/crash-input-12345\n";
}

int main(int argc, char** argv) {
  std::string corpus_dir, crash_dir = ".", replay;
  double seconds = 10;
  uint64_t seed = 1;
  size_t max_len = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::cerr << "fuzz: " << a << " needs a value (see --help)\n"; std::exit(2); }
      return argv[++i];
    };
    // a number, or a message naming the option
    auto number = [&](auto parse) {
      const std::string v = next();
      try {
        size_t used = 0;
        const auto x = parse(v, &used);
        if (used == v.size() && v[0] != '-') return x;
      } catch (const std::exception&) {
      }
      std::cerr << "fuzz: " << a << " takes a non-negative number, not '" << v << "'\n";
      std::exit(2);
    };
    if (a == "--help" || a == "-h") { usage(argv[0], std::cout); return 0; }
    else if (a == "--corpus") corpus_dir = next();
    else if (a == "--seconds") seconds = number([](const std::string& v, size_t* n) { return std::stod(v, n); });
    else if (a == "--seed") seed = number([](const std::string& v, size_t* n) { return std::stoull(v, n); });
    else if (a == "--max-len") max_len = number([](const std::string& v, size_t* n) { return std::stoul(v, n); });
    else if (a == "--crash-dir") crash_dir = next();
    else if (a == "--replay") replay = next();
    else { std::cerr << "fuzz: unknown option " << a << "\n"; usage(argv[0], std::cerr); return 2; }
  }
  if (!replay.empty()) {
    if (!fs::is_regular_file(replay)) { std::cerr << "fuzz: --replay " << replay << ": no such file\n"; return 2; }
    const Bytes b = read_all(replay);
    LLVMFuzzerTestOneInput(b.data(), b.size());
    std::cout << "fuzz: " << replay << " ran without a crash\n";
    return 0;
  }
  std::vector<Bytes> corpus;
  if (!corpus_dir.empty() && !fs::is_directory(corpus_dir)) {
    std::cerr << "fuzz: --corpus " << corpus_dir << ": no such directory (the seeds are in tests/fuzz/corpus/)\n";
    return 2;
  }
  if (!corpus_dir.empty())
    for (const auto& e : fs::directory_iterator(corpus_dir))
      if (e.is_regular_file()) corpus.push_back(read_all(e.path()));
  if (corpus.empty()) corpus.push_back({});
  fs::create_directories(crash_dir);
  g_crash_file = (fs::path(crash_dir) / ("crash-input-" + std::to_string(::getpid()))).string();
  for (int s : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(s, on_crash);
  std::mt19937_64 g(seed);
  size_t runs = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto run = [&](const Bytes& b) {
    keep(b);
    try {
      LLVMFuzzerTestOneInput(b.data(), b.size());
    } catch (const std::exception& e) {
      std::cerr << "fuzz: the target let an exception out: " << e.what() << "\nfuzz: the input is in " << g_crash_file << "\n";
      std::exit(1);
    }
    ++runs;
  };
  for (const auto& b : corpus) run(b);
  while (std::chrono::steady_clock::now() < end) run(mutate(corpus[g() % corpus.size()], corpus, g, max_len));
  std::remove(g_crash_file.c_str());
  std::cout << "fuzz: " << runs << " inputs from " << corpus.size() << " seeds in " << seconds << " s, no crash\n";
  return 0;
}
