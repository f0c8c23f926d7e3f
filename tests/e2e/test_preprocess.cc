// The `preprocess` program end to end: Megatron's flags and output names, workers,
// bad input, inspect, and the default dataset.
#include <gtest/gtest.h>

#include "core/data/indexed_dataset.h"
#include "core/data/tokenizer.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

using megabatch::testing::run_command;
using megabatch::testing::TempDir;
using megabatch::testing::write_text;

std::string preprocess() { return megabatch::testing::bin_dir() + "/preprocess"; }

TEST(Preprocess, JsonlWithSeveralKeysSentencesAndEod) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  TempDir dir;
  write_text(dir / "in.jsonl",
             "{\"text\": \"The cat sat. Then it left! Mr. Smith stayed.\", \"title\": \"Cats\"}\n"
             "\n"
             "{\"text\": \"One more document here.\", \"title\": \"More\"}\n");
  const auto r = run_command(preprocess() + " --input " + (dir / "in.jsonl").string() + " --output-prefix " +
                             (dir / "out").string() +
                             " --json-keys text title --split-sentences --tokenizer-type BertWordPieceLowerCase "
                             "--append-eod --workers 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("docs/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MB/s"), std::string::npos);
  const IndexedDataset text(dir / "out_text_sentence"), title(dir / "out_title_sentence");
  EXPECT_EQ(text.num_documents(), 2u);
  EXPECT_EQ(text.num_sequences(), 4u) << "3 sentences (Mr. is an abbreviation) + 1";
  EXPECT_EQ(title.num_sequences(), 2u);
  TokenizerOptions o;
  o.type = "BertWordPieceLowerCase";
  const auto tok = make_tokenizer(o);
  EXPECT_EQ(tok->decode(text.sequence(1)), "then it left !");
  EXPECT_EQ(text.sequence(2).back(), 30523) << "[EOS] closes the document's last sentence, as Megatron appends it";
}

TEST(Preprocess, WorkersDoNotChangeTheOutputAndGpt2MatchesTheLibrary) {
  MB_REQUIRE_ASSET("brown/ca01");
  TempDir dir;
  const auto b = run_command(preprocess() + " brown --output-dir " + dir.path().string());
  ASSERT_EQ(b.exit_code, 0) << b.output;
  for (int w : {1, 2}) {
    const auto r = run_command(preprocess() + " --input " + (dir / "brown.jsonl").string() + " --output-prefix " +
                               (dir / ("w" + std::to_string(w))).string() +
                               " --tokenizer-type GPT2BPETokenizer --append-eod --log-interval 100 --workers " +
                               std::to_string(w));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  for (const char* ext : {".bin", ".idx"}) {
    const std::string w1 = read_file(dir / (std::string("w1_text_document") + ext));
    EXPECT_EQ(w1, read_file(dir / (std::string("w2_text_document") + ext))) << ext;
    EXPECT_EQ(w1, read_file(dir / (std::string("brown_gpt2_text_document") + ext)))
        << "preprocess of brown.jsonl equals the default dataset, " << ext;
  }
  const auto again = run_command(preprocess() + " brown --output-dir " + dir.path().string());
  EXPECT_NE(again.output.find("up to date"), std::string::npos) << again.output;
  const auto ins = run_command(preprocess() + " inspect " + (dir / "brown_gpt2_text_document").string() +
                               " --tokenizer-type GPT2BPETokenizer --documents 1");
  ASSERT_EQ(ins.exit_code, 0) << ins.output;
  EXPECT_NE(ins.output.find("documents    500"), std::string::npos) << ins.output;
  EXPECT_NE(ins.output.find("end of doc   500 of 500 documents end in <|endoftext|> (50256)"), std::string::npos)
      << "made with --append-eod: " << ins.output;
  EXPECT_NE(ins.output.find("The Fulton County Grand Jury said Friday"), std::string::npos);
  // A GPT-2 dataset inspected with the BERT vocabulary: its tokenizer record refuses it; without
  // the record (as Megatron writes datasets), its ids past the vocabulary's end do.
  const std::string inspect_as_bert = preprocess() + " inspect " + (dir / "brown_gpt2_text_document").string() +
                                      " --tokenizer-type BertWordPieceLowerCase";
  const auto wrong = run_command(inspect_as_bert);
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find((dir / "brown_gpt2_text_document.tokenizer.json").string() + ": the dataset " +
                              (dir / "brown_gpt2_text_document").string() + " was made by GPT2BPETokenizer"),
            std::string::npos)
      << wrong.output;
  const std::string record = read_file(dir / "brown_gpt2_text_document.tokenizer.json");
  std::filesystem::remove(dir / "brown_gpt2_text_document.tokenizer.json");
  const auto unrecorded = run_command(inspect_as_bert);
  EXPECT_NE(unrecorded.exit_code, 0);
  EXPECT_NE(unrecorded.output.find("is outside the vocabulary of BertWordPieceLowerCase"), std::string::npos)
      << unrecorded.output;
  // the default dataset made before tokenizer records gets them, unchanged otherwise
  const auto recorded = run_command(preprocess() + " brown --output-dir " + dir.path().string());
  EXPECT_NE(recorded.output.find("up to date"), std::string::npos) << recorded.output;
  EXPECT_EQ(read_file(dir / "brown_gpt2_text_document.tokenizer.json"), record);

  // The compact dataset the default sweep trains on: `preprocess compact` of the GPT-2 dataset
  // gives the same files; it reads as the same text; a missing one is made again.
  const auto c = run_command(preprocess() + " compact " + (dir / "brown_gpt2_text_document").string() + " " +
                             (dir / "cli").string() + " --tokenizer-type GPT2BPETokenizer");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("32735 of 50257 GPT2BPETokenizer tokens"), std::string::npos) << c.output;
  for (const char* ext : {".bin", ".idx", ".vocab.json"})  // (.vocab.json's "source" is the same input)
    EXPECT_EQ(read_file(dir / (std::string("brown_gpt2_compact_text_document") + ext)),
              read_file(dir / (std::string("cli") + ext))) << ext;
  // (named by its .idx, as a file browser offers it: inspect takes it for the prefix)
  const auto cins = run_command(preprocess() + " inspect " + (dir / "brown_gpt2_compact_text_document.idx").string() +
                                " --tokenizer-type GPT2BPETokenizer --documents 1");
  ASSERT_EQ(cins.exit_code, 0) << cins.output;
  EXPECT_NE(cins.output.find("token ids    0 .. 32734"), std::string::npos) << cins.output;
  EXPECT_NE(cins.output.find("end of doc   500 of 500 documents end in <|endoftext|> (32734)"), std::string::npos)
      << "the compact vocabulary's own id of the token: " << cins.output;
  EXPECT_NE(cins.output.find("The Fulton County Grand Jury said Friday"), std::string::npos) << cins.output;
  std::filesystem::remove(dir / "brown_gpt2_compact_text_document.idx");
  const auto remade = run_command(preprocess() + " brown --output-dir " + dir.path().string());
  EXPECT_NE(remade.output.find("wrote " + (dir / "brown_gpt2_compact_text_document").string()), std::string::npos)
      << remade.output;
  EXPECT_EQ(read_file(dir / "brown_gpt2_compact_text_document.idx"), read_file(dir / "cli.idx"));
}

// .jsonl.gz, .jsonl.xz and .jsonl.zst (made by the gzip, xz and zstd programs) give the
// same dataset as the plain file, byte for byte; concatenated gzip members are read whole;
// a truncated or corrupt file is an error naming it, never a silently shorter dataset.
TEST(Preprocess, CompressedCorporaGiveTheSameDatasetAndDamageIsAnError) {
  MB_REQUIRE_ASSET("brown/ca01");
  TempDir dir;
  ASSERT_EQ(run_command(preprocess() + " brown --output-dir " + dir.path().string()).exit_code, 0);
  const std::string plain = (dir / "brown.jsonl").string();
  auto run = [&](const std::string& input, const std::string& out) {
    return run_command(preprocess() + " --input " + input + " --output-prefix " + (dir / out).string() +
                       " --tokenizer-type GPT2BPETokenizer --append-eod --log-interval 0 --workers 2");
  };
  for (const auto& [make, file] : std::vector<std::pair<std::string, std::string>>{
           {"gzip -c " + plain, "c.jsonl.gz"},
           {"xz -T1 -c " + plain, "c.jsonl.xz"},
           {"zstd -q -c " + plain, "c.jsonl.zst"},
           {"head -c 2000000 " + plain + " | gzip -c; tail -c +2000001 " + plain + " | gzip -c", "members.jsonl.gz"}}) {
    SCOPED_TRACE(file);
    ASSERT_EQ(run_command("(" + make + ") > " + (dir / file).string()).exit_code, 0);
    const auto r = run((dir / file).string(), "z");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* ext : {".bin", ".idx"})
      EXPECT_EQ(read_file(dir / (std::string("z_text_document") + ext)), read_file(dir / (std::string("brown_gpt2_text_document") + ext)))
          << ext;
  }
  for (const std::string file : {"c.jsonl.gz", "c.jsonl.xz", "c.jsonl.zst"}) {
    SCOPED_TRACE(file);
    const std::string cut = (dir / ("cut-" + file)).string();
    ASSERT_EQ(run_command("head -c $(($(stat -c %s " + (dir / file).string() + ") / 2)) " + (dir / file).string() + " > " + cut).exit_code, 0);
    auto r = run(cut, "t");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(cut + ": the "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("is truncated"), std::string::npos) << r.output;
    const std::string bad = (dir / ("bad-" + file)).string();
    ASSERT_EQ(run_command("cp " + (dir / file).string() + " " + bad + " && printf 'XXXXXXXXXXXXXXXX' | dd of=" + bad +
                          " bs=1 seek=3000 conv=notrunc 2>/dev/null").exit_code, 0);
    r = run(bad, "b");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(bad + ": corrupt"), std::string::npos) << r.output;
  }
}

TEST(Preprocess, BadLinesNameFileAndLineAndCanBeSkipped) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  TempDir dir;
  // line 5: a number beyond a double's range (nlohmann's out_of_range, which aborted preprocess
  // in its worker until the JSON errors had one parser)
  write_text(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"broken\n{\"other\": 1}\n{\"text\": 5}\n"
                                "{\"text\": \"big\", \"n\": 1e999}\n{\"text\": \"ok\"}\n");
  const std::string base = preprocess() + " --input " + (dir / "bad.jsonl").string() + " --output-prefix " +
                           (dir / "o").string() + " --tokenizer-type GPT2BPETokenizer";
  const auto r = run_command(base);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("bad.jsonl:2: not valid JSON"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--skip-bad-lines"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "o_text_document.idx")) << "no partial dataset";
  const auto s = run_command(base + " --skip-bad-lines");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("Skipped 4 bad line(s); the first: " + (dir / "bad.jsonl").string() + ":2"), std::string::npos)
      << s.output;
  EXPECT_EQ(IndexedDataset(dir / "o_text_document").num_documents(), 2u);
  const auto k = run_command(preprocess() + " --input " + (dir / "bad.jsonl").string() + " --output-prefix " +
                             (dir / "o").string() + " --tokenizer-type GPT2BPETokenizer --json-keys body --skip-bad-lines");
  EXPECT_NE(k.output.find("no documents found"), std::string::npos) << k.output;
}

// More --workers than the system gives threads: an error naming the flag, and no dataset.
// Before, std::thread's exception destroyed the joinable threads and the process aborted
// ("terminate called without an active exception", exit 134). A 2 GB address-space limit
// refuses the 8 MiB stacks of 1,000 threads (RLIMIT_NPROC does not bind root).
// A stack limit of 1 TiB a thread (ulimit -s; which thread the system refuses first depends
// on its overcommit policy) is an error too, where the input's reader thread, started
// outside the workers' guard, ended in "internal: Resource temporarily unavailable" (exit 3).
// Under AddressSanitizer only that part runs: ASan reserves terabytes of address space for
// its shadow memory, which the 2 GB limit leaves no room for.
TEST(Preprocess, MoreWorkersThanTheSystemGivesIsAnError) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  TempDir dir;
  write_text(dir / "in.jsonl", "{\"text\": \"one document\"}\n{\"text\": \"and another\"}\n");
  const std::string run = preprocess() + " --input " + (dir / "in.jsonl").string() + " --output-prefix " +
                          (dir / "o").string() + " --tokenizer-type GPT2BPETokenizer --workers 1000";
  auto left_nothing = [&] {
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      EXPECT_EQ(e.path().filename(), "in.jsonl") << "left behind: " << e.path();
  };
  const auto s = run_command("ulimit -s 1073741824 && " + run);
  EXPECT_EQ(s.exit_code, 2) << "an error, not an internal one (3) or a crash:\n" << s.output;
  EXPECT_TRUE(s.output.find("preprocess: error: --workers 1000: the system refused to start thread ") != std::string::npos ||
              s.output.find("in.jsonl: cannot start the thread that reads it (") != std::string::npos)
      << s.output;
  left_nothing();
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the 2 GB address-space limit: AddressSanitizer's shadow memory needs terabytes of address space";
#endif
  const auto r = run_command("ulimit -v 2000000 && " + run);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("preprocess: error: --workers 1000: the system refused to start thread "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ask for fewer"), std::string::npos) << r.output;
  left_nothing();
}

TEST(Preprocess, PlainTextAndFlagErrors) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  TempDir dir;
  write_text(dir / "in.txt", "First sentence of doc one.\nSecond sentence.\n\n\nDoc two only line.\n");
  const auto r = run_command(preprocess() + " --input " + (dir / "in.txt").string() + " --output-prefix " +
                             (dir / "t").string() + " --tokenizer-type BertWordPieceLowerCase --split-sentences");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const IndexedDataset ds(dir / "t_text_sentence");
  EXPECT_EQ(ds.num_documents(), 2u);
  EXPECT_EQ(ds.num_sequences(), 3u);
  const auto u = run_command(preprocess() + " --input x --output-prefix y --tokenizer-type GPT2BPETokenizer --bogus");
  EXPECT_NE(u.output.find("unknown option --bogus"), std::string::npos) << u.output;
  // a flag's bad value: the program named once (before: "preprocess: error: preprocess: --workers")
  const auto w =
      run_command(preprocess() + " --input x --output-prefix y --tokenizer-type GPT2BPETokenizer --workers 2x");
  EXPECT_EQ(w.exit_code, 2) << w.output;
  EXPECT_EQ(w.output.rfind("preprocess: error: --workers: expected an integer, got '2x'", 0), 0u) << w.output;
  EXPECT_EQ(w.output.find("preprocess:", 1), std::string::npos) << w.output;
  const auto m = run_command(preprocess() + " --input " + (dir / "in.txt").string() + " --output-prefix " +
                             (dir / "t").string() + " --tokenizer-type GPT2BPETokenizer --vocab-file " +
                             (dir / "none.json").string());
  EXPECT_NE(m.output.find("none.json: cannot open GPT-2 vocabulary"), std::string::npos) << m.output;
  // a missing input is named with the system's reason, from the program by name (before:
  // "error: ...: cannot open the input file (Success)", errno read before stat() had run)
  const auto missing = run_command(preprocess() + " --input " + (dir / "absent.jsonl").string() +
                                   " --output-prefix " + (dir / "a").string() + " --tokenizer-type GPT2BPETokenizer");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("preprocess: error: " + (dir / "absent.jsonl").string() +
                                ": cannot open the input file (No such file or directory)"),
            std::string::npos)
      << missing.output;
  const auto h = run_command(preprocess() + " --help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.output.find("examples:"), std::string::npos);
}

}  // namespace
}  // namespace megabatch::data
