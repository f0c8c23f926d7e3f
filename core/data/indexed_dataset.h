// Megatron-LM's indexed dataset ("MMIDIDX" version 1): PREFIX.bin holds the tokens of all
// sequences back to back; PREFIX.idx describes them:
//
//   9 bytes  magic "MMIDIDX\0\0"
//   u64      version = 1
//   u8       dtype code (u8=1, i8=2, i16=3, i32=4, i64=5, f64=6, f32=7, u16=8)
//   u64      S, the number of sequences
//   u64      D, the number of document indices (documents + 1)
//   i32[S]   sequence lengths (tokens)
//   i64[S]   sequence byte offsets into .bin
//   i64[D]   document indices: 0, then the sequence index at which each document ends
//
// all little-endian. Files written here load in Megatron and Megatron's load here.
// Reading maps both files; tokens are read in place (zero-copy) and the index arrays are
// read through unaligned-safe accessors (the arrays start at byte 34).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/util/files.h"

namespace megabatch::data {

enum class DType : uint8_t { kU8 = 1, kI8 = 2, kI16 = 3, kI32 = 4, kI64 = 5, kF64 = 6, kF32 = 7, kU16 = 8 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Megatron's choice for token ids: uint16 below 65500 entries, otherwise int32.
DType token_dtype(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// The prefix a path names when it is one of a dataset's files (PREFIX.bin or PREFIX.idx, as a
// user may give it); any other path as it is.
std::filesystem::path dataset_prefix(const std::filesystem::path& path);

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin and validates them; throws Error naming the file,
  // the offending field or offset, and what to do.
  explicit IndexedDataset(const std::filesystem::path& prefix);

  const std::filesystem::path& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  size_t num_sequences() const { return num_sequences_; }
  size_t num_documents() const { return num_doc_indices_ - 1; }
  uint64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(size_t i) const { return load<int32_t>(lengths_ + 4 * i); }
  int64_t sequence_pointer(size_t i) const { return load<int64_t>(pointers_ + 8 * i); }
  // Document d spans sequences [document_index(d), document_index(d + 1)).
  int64_t document_index(size_t d) const { return load<int64_t>(doc_indices_ + 8 * d); }
  // The last token of document d (of its last non-empty sequence); -1 for an empty document.
  // GPT data made with --append-eod ends every document in the end-of-document token.
  int32_t last_token(size_t d) const;

  // Copies tokens [offset, offset + count) of sequence i into out as int32. Throws Error
  // (naming the file, sequence and position) for a range past the sequence end or for a
  // token outside [0, vocab_limit) when vocab_limit > 0.
  void read(size_t seq, size_t offset, size_t count, int32_t* out, int64_t vocab_limit = 0) const;
  std::vector<int32_t> sequence(size_t seq, int64_t vocab_limit = 0) const;
  // The raw bytes of sequence i in .bin (zero-copy).
  const uint8_t* raw(size_t seq) const { return bin_.data() + sequence_pointer(seq); }

 private:
  // The constructor's checks: the .idx header and tables, then the .bin against them.
  void read_index(const std::filesystem::path& idx_path);
  void check_bin(const std::filesystem::path& bin_path);
  // read()'s copy of the tokens out of the mapped .bin, as int32 (a throw here must leave
  // nothing to clean up: it runs under MappedFile::read_guarded)
  void copy_tokens(size_t seq, size_t offset, size_t count, int32_t* out) const;
  template <typename T>
  static T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  std::filesystem::path prefix_;
  MappedFile idx_, bin_;
  DType dtype_ = DType::kU16;
  size_t num_sequences_ = 0, num_doc_indices_ = 0;
  uint64_t num_tokens_ = 0;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_indices_ = nullptr;
};

// Writes PREFIX.bin and PREFIX.idx. Both are written under temporary names and renamed
// into place by finalize(), so an interrupted build never leaves a dataset that looks
// complete. Token ids are range-checked against the dtype.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::filesystem::path prefix, DType dtype);
  void add_sequence(std::span<const int32_t> tokens);
  void end_document();  // the sequences added since the last call form one document
  // Megatron's add_document: the tokens of several sequences with their lengths.
  void add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths);
  void finalize();
  size_t num_sequences() const { return lengths_.size(); }
  uint64_t bin_bytes() const { return bin_.bytes_written(); }

 private:
  std::filesystem::path prefix_;
  DType dtype_;
  AtomicFile bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
  std::vector<uint8_t> buf_;
  bool finalized_ = false;
};

}  // namespace megabatch::data
