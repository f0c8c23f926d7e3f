#include "core/data/indexed_dataset.h"

#include <algorithm>
#include <limits>

#include "core/util/error.h"

namespace megabatch::data {

namespace fs = std::filesystem;

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kU8: case DType::kI8: return 1;
    case DType::kI16: case DType::kU16: return 2;
    case DType::kI32: case DType::kF32: return 4;
    case DType::kI64: case DType::kF64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kU8: return "uint8";
    case DType::kI8: return "int8";
    case DType::kI16: return "int16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kF64: return "float64";
    case DType::kF32: return "float32";
    case DType::kU16: return "uint16";
  }
  return "?";
}

DType token_dtype(int64_t vocab_size) { return vocab_size < 65500 ? DType::kU16 : DType::kI32; }

namespace {
fs::path with_suffix(const fs::path& prefix, const char* suffix) {
  fs::path p = prefix;
  p += suffix;
  return p;
}
}  // namespace

fs::path dataset_prefix(const fs::path& path) {
  const fs::path ext = path.extension();
  return ext == ".bin" || ext == ".idx" ? fs::path(path).replace_extension() : path;
}

IndexedDataset::IndexedDataset(const fs::path& prefix) : prefix_(prefix) {
  const fs::path idx_path = with_suffix(prefix, ".idx"), bin_path = with_suffix(prefix, ".bin");
  if (!fs::exists(idx_path)) {
    const fs::path named = dataset_prefix(prefix);  // one of the dataset's files given for it
    if (named != prefix && fs::exists(with_suffix(named, ".idx")))
      fail(prefix.string(), ": this is one of a dataset's two files; a dataset is named by their prefix, without ",
           prefix.extension().string(), ": give ", named.string());
    fail(idx_path.string(), ": dataset index not found; expected PREFIX.idx and PREFIX.bin from `preprocess` ",
         "or Megatron's tools/preprocess_data.py (PREFIX is e.g. data/corpus_text_document)");
  }
  if (!fs::exists(bin_path)) fail(bin_path.string(), ": dataset tokens not found (the .idx is there, the .bin is not)");
  read_index(idx_path);
  check_bin(bin_path);
}

void IndexedDataset::read_index(const fs::path& idx_path) {
  idx_ = MappedFile(idx_path);
  const std::string name = idx_path.string();
  const uint8_t* p = idx_.data();
  const size_t size = idx_.size();
  if (size < 9 || std::memcmp(p, kIndexMagic, 9) != 0)
    fail(name, ": not a Megatron indexed dataset index (the file does not start with the magic \"MMIDIDX\\0\\0\"",
         size < 9 ? ", it is shorter than the magic" : "", ")");
  if (size < kIndexHeaderBytes)
    fail(name, ": truncated header (", size, " bytes, the header alone is ", kIndexHeaderBytes, ")");
  const auto version = load<uint64_t>(p + 9);
  if (version != kIndexVersion)
    fail(name, ": index version ", version, " at byte 9; only version ", kIndexVersion, " (MMIDIDX) is supported");
  const uint8_t code = p[17];
  if (code < 1 || code > 8)
    fail(name, ": unknown dtype code ", int(code), " at byte 17; expected 1..8 (u8=1, i8=2, i16=3, i32=4, i64=5, f64=6, f32=7, u16=8)");
  dtype_ = static_cast<DType>(code);
  if (dtype_ == DType::kF32 || dtype_ == DType::kF64)
    fail(name, ": dtype ", dtype_name(dtype_), " holds no token ids; token datasets are integer-typed");
  const auto s = load<uint64_t>(p + 18), d = load<uint64_t>(p + 26);
  const uint64_t max_count = size / 4;
  if (s > max_count || d > max_count || d < 1)
    fail(name, ": header claims ", s, " sequences and ", d, " document indices, impossible for a ", size, "-byte file");
  const uint64_t expected = kIndexHeaderBytes + 4 * s + 8 * s + 8 * d;
  if (size != expected)
    fail(name, ": ", size < expected ? "truncated" : "has trailing bytes", " (", size, " bytes; the header's ", s,
         " sequences and ", d, " document indices need exactly ", expected, "); rebuild the dataset");
  num_sequences_ = s;
  num_doc_indices_ = d;
  lengths_ = p + kIndexHeaderBytes;
  pointers_ = lengths_ + 4 * s;
  doc_indices_ = pointers_ + 8 * s;

  if (document_index(0) != 0) fail(name, ": document indices must start at 0, found ", document_index(0));
  for (size_t i = 1; i < d; ++i)
    if (document_index(i) < document_index(i - 1))
      fail(name, ": document index ", i, " (", document_index(i), ") is below the previous one (", document_index(i - 1), ")");
  if (static_cast<uint64_t>(document_index(d - 1)) != s)
    fail(name, ": the last document index is ", document_index(d - 1), " but there are ", s, " sequences");
}

void IndexedDataset::check_bin(const fs::path& bin_path) {
  const std::string name = with_suffix(prefix_, ".idx").string();
  const uint64_t s = num_sequences_;
  bin_ = MappedFile(bin_path);
  const uint64_t item = dtype_size(dtype_);
  uint64_t need = 0;
  for (size_t i = 0; i < s; ++i) {
    const int32_t len = sequence_length(i);
    const int64_t ptr = sequence_pointer(i);
    if (len < 0) fail(name, ": sequence ", i, " has negative length ", len);
    if (ptr < 0 || static_cast<uint64_t>(ptr) % item != 0)
      fail(name, ": sequence ", i, " has byte offset ", ptr, ", not a multiple of the ", dtype_name(dtype_), " size");
    need = std::max<uint64_t>(need, static_cast<uint64_t>(ptr) + item * static_cast<uint64_t>(len));
    num_tokens_ += static_cast<uint64_t>(len);
  }
  if (bin_.size() < need)
    fail(bin_path.string(), ": shorter than the index says (", bin_.size(), " bytes, the index needs ", need,
         "); the file was truncated or belongs to another index: rebuild the dataset");
  // Megatron writes the tokens back to back: the .bin is exactly the sum of the lengths
  // times the item size. Any other size means the .idx describes another .bin (most often
  // its dtype: a uint16 index over int32 tokens reads every id wrong, silently).
  const uint64_t expected_bin = num_tokens_ * item;
  if (bin_.size() != expected_bin) {
    std::string hint;
    for (const uint64_t other : {1, 2, 4, 8})
      if (other != item && num_tokens_ * other == bin_.size())
        hint = " (the size of as many " + std::to_string(other) + "-byte tokens: the index's dtype is not its .bin's)";
    fail(name, " and ", bin_path.string(), " do not match: the index's ", s, " sequences hold ", num_tokens_, " ",
         dtype_name(dtype_), " tokens, ", expected_bin, " bytes, but the .bin has ", bin_.size(), hint,
         "; rebuild both with the same preprocess run");
  }
}

void IndexedDataset::read(size_t seq, size_t offset, size_t count, int32_t* out, int64_t vocab_limit) const {
  if (seq >= num_sequences_)
    fail(prefix_.string(), ": sequence ", seq, " requested, the dataset has ", num_sequences_);
  const auto len = static_cast<size_t>(sequence_length(seq));
  if (offset + count > len)
    fail(prefix_.string(), ": read of tokens [", offset, ", ", offset + count, ") past the end of sequence ", seq,
         " (", len, " tokens)");
  if (count == 0) return;  // an empty read touches nothing (an empty .bin maps to no memory)
  // a .bin cut short under the running job is an Error naming it, not a SIGBUS
  bin_.read_guarded([&] { copy_tokens(seq, offset, count, out); });
  if (vocab_limit > 0)
    for (size_t i = 0; i < count; ++i)
      if (out[i] < 0 || out[i] >= vocab_limit)
        fail(prefix_.string(), ".bin: token id ", out[i], " at position ", offset + i, " of sequence ", seq,
             " (byte ", sequence_pointer(seq) + static_cast<int64_t>((offset + i) * dtype_size(dtype_)),
             ") is outside the vocabulary [0, ", vocab_limit, "); was the dataset built with another tokenizer?");
}

void IndexedDataset::copy_tokens(size_t seq, size_t offset, size_t count, int32_t* out) const {
  const uint8_t* base = raw(seq) + offset * dtype_size(dtype_);
  switch (dtype_) {
    case DType::kU16: {
      const auto* t = reinterpret_cast<const uint16_t*>(base);
      for (size_t i = 0; i < count; ++i) out[i] = t[i];
      break;
    }
    case DType::kI32: std::memcpy(out, base, count * 4); break;
    case DType::kU8: for (size_t i = 0; i < count; ++i) out[i] = base[i]; break;
    case DType::kI8: for (size_t i = 0; i < count; ++i) out[i] = static_cast<int8_t>(base[i]); break;
    case DType::kI16: {
      const auto* t = reinterpret_cast<const int16_t*>(base);
      for (size_t i = 0; i < count; ++i) out[i] = t[i];
      break;
    }
    case DType::kI64: {
      const auto* t = reinterpret_cast<const int64_t*>(base);
      for (size_t i = 0; i < count; ++i) {
        if (t[i] < std::numeric_limits<int32_t>::min() || t[i] > std::numeric_limits<int32_t>::max())
          fail(prefix_.string(), ".bin: token ", t[i], " of sequence ", seq, " does not fit a 32-bit id");
        out[i] = static_cast<int32_t>(t[i]);
      }
      break;
    }
    default: fail(prefix_.string(), ": cannot read tokens of dtype ", dtype_name(dtype_));
  }
}

int32_t IndexedDataset::last_token(size_t d) const {
  for (int64_t seq = document_index(d + 1) - 1; seq >= document_index(d); --seq) {
    const int32_t n = sequence_length(static_cast<size_t>(seq));
    if (n == 0) continue;
    int32_t last = -1;
    read(static_cast<size_t>(seq), static_cast<size_t>(n - 1), 1, &last);
    return last;
  }
  return -1;
}

std::vector<int32_t> IndexedDataset::sequence(size_t seq, int64_t vocab_limit) const {
  std::vector<int32_t> out(seq < num_sequences_ ? static_cast<size_t>(sequence_length(seq)) : 0);
  read(seq, 0, out.size(), out.data(), vocab_limit);
  return out;
}

// ---------------------------------------------------------------- builder

IndexedDatasetBuilder::IndexedDatasetBuilder(fs::path prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype), bin_(with_suffix(prefix_, ".bin")) {
  if (dtype != DType::kU16 && dtype != DType::kI32 && dtype != DType::kU8 && dtype != DType::kI16 &&
      dtype != DType::kI64 && dtype != DType::kI8)
    fail(prefix_.string(), ": token datasets are integer-typed, not ", dtype_name(dtype));
}

void IndexedDatasetBuilder::add_sequence(std::span<const int32_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail(prefix_.string(), ": a sequence of ", tokens.size(), " tokens exceeds the int32 length field");
  const size_t item = dtype_size(dtype_);
  buf_.resize(tokens.size() * item);
  int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case DType::kU8: lo = 0, hi = 255; break;
    case DType::kI8: lo = -128, hi = 127; break;
    case DType::kU16: lo = 0, hi = 65535; break;
    case DType::kI16: lo = -32768, hi = 32767; break;
    default: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t v = tokens[i];
    if (v < lo || v > hi)
      fail(prefix_.string(), ": token id ", v, " does not fit the dataset dtype ", dtype_name(dtype_));
    if (item == 8) {
      std::memcpy(&buf_[i * 8], &v, 8);
    } else if (item == 4) {
      const auto x = static_cast<int32_t>(v);
      std::memcpy(&buf_[i * 4], &x, 4);
    } else if (item == 2) {
      const auto x = static_cast<uint16_t>(v);
      std::memcpy(&buf_[i * 2], &x, 2);
    } else {
      buf_[i] = static_cast<uint8_t>(v);
    }
  }
  bin_.write(buf_.data(), buf_.size());
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetBuilder::end_document() { doc_indices_.push_back(static_cast<int64_t>(lengths_.size())); }

void IndexedDatasetBuilder::add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths) {
  size_t pos = 0;
  for (const int32_t len : lengths) {
    if (len < 0 || pos + static_cast<size_t>(len) > tokens.size())
      fail(prefix_.string(), ": add_document lengths exceed the ", tokens.size(), " tokens given");
    add_sequence(tokens.subspan(pos, static_cast<size_t>(len)));
    pos += static_cast<size_t>(len);
  }
  end_document();
}

void IndexedDatasetBuilder::finalize() {
  if (finalized_) return;
  const uint64_t s = lengths_.size(), d = doc_indices_.size();
  AtomicFile idx(with_suffix(prefix_, ".idx"));
  std::vector<uint8_t> header(kIndexHeaderBytes);
  std::memcpy(header.data(), kIndexMagic, 9);
  std::memcpy(header.data() + 9, &kIndexVersion, 8);
  header[17] = static_cast<uint8_t>(dtype_);
  std::memcpy(header.data() + 18, &s, 8);
  std::memcpy(header.data() + 26, &d, 8);
  idx.write(header.data(), header.size());
  idx.write(lengths_.data(), 4 * s);
  std::vector<int64_t> pointers(s);
  int64_t off = 0;
  for (size_t i = 0; i < s; ++i) {
    pointers[i] = off;
    off += static_cast<int64_t>(lengths_[i]) * static_cast<int64_t>(dtype_size(dtype_));
  }
  idx.write(pointers.data(), 8 * s);
  idx.write(doc_indices_.data(), 8 * d);
  bin_.commit();  // .bin first: a visible .idx always has its complete .bin
  idx.commit();
  finalized_ = true;
}

}  // namespace megabatch::data
