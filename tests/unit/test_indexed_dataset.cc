// Megatron indexed datasets: byte-exact agreement with an independent numpy
// implementation of the format, and clear errors for every kind of damage.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "core/data/indexed_dataset.h"
#include "core/util/error.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

using megabatch::testing::run_command;
using megabatch::testing::TempDir;
using megabatch::testing::write_text;
using Docs = std::vector<std::vector<std::vector<int32_t>>>;

Docs random_docs(uint32_t seed, int32_t max_id) {
  std::mt19937 rng(seed);
  Docs docs(1 + rng() % 7);
  for (auto& d : docs) {
    d.resize(rng() % 4);  // empty documents too
    for (auto& s : d) {
      s.resize(rng() % 13);  // empty sequences too
      for (auto& t : s) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(max_id));
    }
  }
  return docs;
}

void write_docs(const std::filesystem::path& prefix, DType dtype, const Docs& docs) {
  IndexedDatasetBuilder b(prefix, dtype);
  for (const auto& d : docs) {
    for (const auto& s : d) b.add_sequence(s);
    b.end_document();
  }
  b.finalize();
}

std::string python() { return "/usr/bin/python3 " + megabatch::testing::source_dir() + "/tests/reference/megatron_index.py"; }

std::string expect_error(const std::filesystem::path& prefix) {
  try {
    IndexedDataset ds(prefix);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "opening " << prefix << " should have failed";
  return "";
}

TEST(IndexedDataset, WriterMatchesIndependentImplementationByteForByte) {
  TempDir dir;
  for (const auto& [dtype, max_id] : {std::pair{DType::kU16, 65535}, std::pair{DType::kI32, 1 << 30}}) {
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      const Docs docs = random_docs(seed, max_id);
      write_docs(dir / "ours", dtype, docs);
      write_text(dir / "docs.json", nlohmann::json(docs).dump());
      const auto r = run_command(python() + " write " + (dir / "theirs").string() + " " +
                                 std::to_string(static_cast<int>(dtype)) + " " + (dir / "docs.json").string());
      ASSERT_EQ(r.exit_code, 0) << r.output;
      for (const char* ext : {".idx", ".bin"})
        EXPECT_EQ(read_file(dir / (std::string("ours") + ext)), read_file(dir / (std::string("theirs") + ext)))
            << ext << " differs, seed " << seed << ", dtype " << dtype_name(dtype);
      // And the reference reads what we wrote.
      const auto rr = run_command(python() + " read " + (dir / "ours").string() + " " + (dir / "back.json").string());
      ASSERT_EQ(rr.exit_code, 0) << rr.output;
      const auto back = nlohmann::json::parse(read_file(dir / "back.json"));
      EXPECT_EQ(back["dtype"].get<int>(), static_cast<int>(dtype));
      EXPECT_EQ(back["docs"].get<Docs>(), docs);
    }
  }
}

TEST(IndexedDataset, ReaderReturnsWhatTheReferenceWrote) {
  TempDir dir;
  const Docs docs = random_docs(42, 50000);
  write_text(dir / "docs.json", nlohmann::json(docs).dump());
  const auto r = run_command(python() + " write " + (dir / "ref").string() + " 8 " + (dir / "docs.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const IndexedDataset ds(dir / "ref");
  EXPECT_EQ(ds.dtype(), DType::kU16);
  ASSERT_EQ(ds.num_documents(), docs.size());
  size_t seq = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(static_cast<size_t>(ds.document_index(d)), seq);
    for (const auto& s : docs[d]) EXPECT_EQ(ds.sequence(seq++), s);
  }
  EXPECT_EQ(ds.num_sequences(), seq);
}

// A document's last token (train's check that GPT data was made with --append-eod): that of
// its last non-empty sequence, -1 for a document with none; over random documents with empty
// ones and empty sequences among them.
TEST(IndexedDataset, LastTokenOfADocumentSkipsEmptySequences) {
  TempDir dir;
  int checked = 0, skipped_empty = 0;
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    const Docs docs = random_docs(seed, 50000);
    const auto prefix = dir / ("d" + std::to_string(seed));
    write_docs(prefix, DType::kI32, docs);
    const IndexedDataset ds(prefix);
    for (size_t d = 0; d < docs.size(); ++d) {
      int32_t last = -1;
      for (const auto& s : docs[d])
        if (!s.empty()) last = s.back();
      EXPECT_EQ(ds.last_token(d), last) << "seed " << seed << ", document " << d;
      ++checked;
      skipped_empty += !docs[d].empty() && docs[d].back().empty() && last >= 0;
    }
  }
  EXPECT_GT(checked, 60);
  EXPECT_GT(skipped_empty, 0) << "some document ends in an empty sequence after a non-empty one";
}

TEST(IndexedDataset, DamagedFilesGiveOneClearErrorEach) {
  TempDir dir;
  write_docs(dir / "good", DType::kU16, {{{1, 2, 3}, {4, 5}}, {{6}}});
  const std::string idx = read_file(dir / "good.idx"), bin = read_file(dir / "good.bin");
  auto variant = [&](const std::string& name, std::string i, std::string b) {
    write_text(dir / (name + ".idx"), i);
    write_text(dir / (name + ".bin"), b);
    return expect_error(dir / name);
  };
  std::string bad_magic = idx;
  bad_magic[0] = 'X';
  EXPECT_NE(variant("magic", bad_magic, bin).find("magic.idx: not a Megatron indexed dataset index"), std::string::npos);
  std::string bad_version = idx;
  bad_version[9] = 2;
  EXPECT_NE(variant("version", bad_version, bin).find("index version 2 at byte 9"), std::string::npos);
  std::string bad_dtype = idx;
  bad_dtype[17] = 9;
  EXPECT_NE(variant("dtype", bad_dtype, bin).find("unknown dtype code 9 at byte 17"), std::string::npos);
  EXPECT_NE(variant("trunc", idx.substr(0, idx.size() - 5), bin).find("trunc.idx: truncated"), std::string::npos);
  EXPECT_NE(variant("header", idx.substr(0, 20), bin).find("header.idx: truncated header"), std::string::npos);
  EXPECT_NE(variant("shortbin", idx, bin.substr(0, bin.size() - 2)).find("shortbin.bin: shorter than the index says"),
            std::string::npos);
  EXPECT_NE(expect_error(dir / "nothing").find("nothing.idx: dataset index not found"), std::string::npos);
  // one of a dataset's files given for the dataset: named by its prefix (its .bin.idx is not looked for)
  for (const std::string ext : {".bin", ".idx"})
    EXPECT_NE(expect_error(dir / ("good" + ext))
                  .find("good" + ext +
                        ": this is one of a dataset's two files; a dataset is named by their prefix, "
                        "without " +
                        ext + ": give " + (dir / "good").string()),
              std::string::npos);
  EXPECT_EQ(dataset_prefix(dir / "good.bin"), dir / "good");
  EXPECT_EQ(dataset_prefix("data/corpus_text_document"), std::filesystem::path("data/corpus_text_document"));
  // an .idx whose dtype is not its .bin's: uint16 ids over int32 tokens read every id wrong
  write_docs(dir / "wide", DType::kI32, {{{1, 2, 3}, {4, 5}}, {{6}}});
  // good.idx (uint16, 6 tokens) beside wide.bin (the same 6 tokens as int32, 24 bytes)
  const std::string mismatch = variant("mixed", idx, read_file(dir / "wide.bin"));
  EXPECT_NE(mismatch.find((dir / "mixed.idx").string() + " and " + (dir / "mixed.bin").string() +
                          " do not match: the index's 3 sequences hold 6 uint16 tokens, 12 bytes, but the .bin has 24 (the "
                          "size of as many 4-byte tokens: the index's dtype is not its .bin's); rebuild both"),
            std::string::npos) << mismatch;
  EXPECT_NE(variant("longbin", idx, bin + "xy").find("longbin.bin do not match: the index's 3 sequences hold 6 uint16 "
                                                      "tokens, 12 bytes, but the .bin has 14;"),
            std::string::npos);

  const IndexedDataset ds(dir / "good");
  try {
    std::vector<int32_t> out(3);
    ds.read(0, 0, 3, out.data(), /*vocab_limit=*/3);
    ADD_FAILURE() << "token 3 >= vocabulary 3 should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 3 at position 2 of sequence 0 (byte 4) is outside the vocabulary [0, 3)"),
              std::string::npos) << e.what();
  }
  try {
    std::vector<int32_t> out(4);
    ds.read(1, 0, 4, out.data());
    ADD_FAILURE() << "reading past the sequence should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("past the end of sequence 1"), std::string::npos) << e.what();
  }
}

// A dataset cut short while it is open (truncated in place under a running job): a read
// past the new end is an Error naming the .bin, where the mapped read died of SIGBUS; and an
// access outside a guarded read (the .idx's arrays) ends the process with that error, exit 1.
TEST(IndexedDataset, AFileCutShortUnderAReaderIsAnErrorNotASignal) {
  TempDir dir;
  std::vector<std::vector<int32_t>> doc(64, std::vector<int32_t>(4096, 7));  // 64 sequences of 8 KiB (u16)
  write_docs(dir / "big", DType::kU16, {doc});
  const IndexedDataset ds(dir / "big");
  std::vector<int32_t> out(4096);
  ds.read(63, 0, 4096, out.data());  // mapped and read once: its pages are in memory
  EXPECT_EQ(out[4095], 7);
  std::filesystem::resize_file(dir / "big.bin", 4096);
  try {
    ds.read(63, 0, 4096, out.data());
    ADD_FAILURE() << "a read past the end of a truncated .bin should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "big.bin").string() + ": the file is shorter than when this run opened it "
                                         "(524288 bytes then, 4096 now): it was truncated or rewritten in place"),
              std::string::npos) << e.what();
  }
  ds.read(0, 0, 2048, out.data());  // what is left reads as before
  EXPECT_EQ(out[0], 7);
  std::filesystem::resize_file(dir / "big.idx", 0);
  EXPECT_EXIT(
      {
        volatile int32_t length = ds.sequence_length(63);  // a read the compiler keeps
        (void)length;
      },
      ::testing::ExitedWithCode(1),
              "error: " + (dir / "big.idx").string() + ": the file became shorter while this process read it");
}

TEST(IndexedDataset, InterruptedBuildLeavesNoDataset) {
  TempDir dir;
  {
    IndexedDatasetBuilder b(dir / "partial", DType::kU16);
    b.add_sequence(std::vector<int32_t>{1, 2, 3});
    b.end_document();
    // destroyed without finalize(), as when the process dies
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "partial.idx"));
  EXPECT_FALSE(std::filesystem::exists(dir / "partial.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "partial.bin.tmp")) << "an abandoned build removes its temporary";
  IndexedDatasetBuilder b(dir / "u16", DType::kU16);
  try {
    b.add_sequence(std::vector<int32_t>{70000});
    ADD_FAILURE() << "70000 does not fit uint16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit the dataset dtype uint16"), std::string::npos);
  }
}

TEST(IndexedDataset, TokenDtypeFollowsMegatron) {
  EXPECT_EQ(token_dtype(50257), DType::kU16);
  EXPECT_EQ(token_dtype(65499), DType::kU16);
  EXPECT_EQ(token_dtype(65500), DType::kI32);
}

}  // namespace
}  // namespace megabatch::data
