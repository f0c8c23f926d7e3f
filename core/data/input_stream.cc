#include "core/data/input_stream.h"

#include <fcntl.h>
#include <lzma.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/util/error.h"

namespace megabatch::data {
namespace fs = std::filesystem;

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "plain";
    case Compression::kGzip: return "gzip";
    case Compression::kXz: return "xz";
    case Compression::kZstd: return "zstd";
  }
  return "?";
}

Compression detect_compression(const fs::path& path) {
  unsigned char m[6] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Compression::kNone;
  const ssize_t n = ::read(fd, m, sizeof m);
  ::close(fd);
  if (n >= 2 && m[0] == 0x1F && m[1] == 0x8B) return Compression::kGzip;
  if (n >= 6 && std::memcmp(m, "\xFD" "7zXZ\x00", 6) == 0) return Compression::kXz;
  if (n >= 4 && m[0] == 0x28 && m[1] == 0xB5 && m[2] == 0x2F && m[3] == 0xFD) return Compression::kZstd;
  return Compression::kNone;
}

fs::path strip_compression_extension(const fs::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".gz" || ext == ".xz" || ext == ".zst" || ext == ".zstd") return path.parent_path() / path.stem();
  return path;
}

namespace {
constexpr size_t kIn = 1 << 20, kOut = 4 << 20;  // compressed reads, decompressed chunks
constexpr size_t kAhead = 4;                      // chunks the decompressor may run ahead

// Decompresses (or copies) fd into chunks handed to `emit`; throws Error naming `name`.
class Decoder {
 public:
  virtual ~Decoder() = default;
  // Consumes in[0..n) (n == 0: the end of the file); appends output to out. Returns
  // whether the stream has ended (no more input is expected).
  virtual bool feed(const uint8_t* in, size_t n, std::string& out) = 0;
};

class Plain final : public Decoder {
 public:
  bool feed(const uint8_t* in, size_t n, std::string& out) override {
    out.append(reinterpret_cast<const char*>(in), n);
    return n == 0;
  }
};

class Gzip final : public Decoder {
 public:
  explicit Gzip(std::string name) : name_(std::move(name)) {
    check(inflateInit2(&z_, 15 + 32) == Z_OK, name_, ": zlib could not start");
  }
  ~Gzip() override { inflateEnd(&z_); }
  bool feed(const uint8_t* in, size_t n, std::string& out) override {
    if (n == 0) {
      check(ended_, name_, ": the gzip stream is truncated (it ends inside a member); the file is incomplete");
      return true;
    }
    z_.next_in = const_cast<Bytef*>(in);
    z_.avail_in = static_cast<uInt>(n);
    char buf[1 << 16];
    while (z_.avail_in > 0) {
      if (ended_) {  // another member follows (concatenated .gz files)
        check(inflateReset(&z_) == Z_OK, name_, ": zlib reset failed");
        ended_ = false;
      }
      z_.next_out = reinterpret_cast<Bytef*>(buf);
      z_.avail_out = sizeof buf;
      const int r = inflate(&z_, Z_NO_FLUSH);
      if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
        fail(name_, ": corrupt gzip data near compressed byte ", z_.total_in + consumed_, " (", z_.msg ? z_.msg : "zlib error", ")");
      out.append(buf, sizeof buf - z_.avail_out);
      if (r == Z_STREAM_END) {
        consumed_ += z_.total_in;
        ended_ = true;
      }
      if (r == Z_BUF_ERROR && z_.avail_out != 0) break;
    }
    return false;
  }

 private:
  std::string name_;
  z_stream z_{};
  bool ended_ = false;
  uint64_t consumed_ = 0;
};

class Xz final : public Decoder {
 public:
  explicit Xz(std::string name) : name_(std::move(name)) {
    check(lzma_stream_decoder(&s_, UINT64_MAX, LZMA_CONCATENATED) == LZMA_OK, name_, ": liblzma could not start");
  }
  ~Xz() override { lzma_end(&s_); }
  bool feed(const uint8_t* in, size_t n, std::string& out) override {
    s_.next_in = in;
    s_.avail_in = n;
    const lzma_action action = n == 0 ? LZMA_FINISH : LZMA_RUN;
    uint8_t buf[1 << 16];
    while (true) {
      s_.next_out = buf;
      s_.avail_out = sizeof buf;
      const lzma_ret r = lzma_code(&s_, action);
      out.append(reinterpret_cast<const char*>(buf), sizeof buf - s_.avail_out);
      if (r == LZMA_STREAM_END) return true;
      if (r == LZMA_BUF_ERROR && n == 0) fail(name_, ": the xz stream is truncated; the file is incomplete");
      if (r != LZMA_OK && r != LZMA_BUF_ERROR)
        fail(name_, ": corrupt xz data near compressed byte ", s_.total_in, " (liblzma error ", static_cast<int>(r), ")");
      // Mid-file: wait for more input. At the end, keep finishing: a truncated stream makes
      // no progress, and liblzma then answers LZMA_BUF_ERROR.
      if (n != 0 && s_.avail_in == 0 && s_.avail_out != 0) return false;
    }
  }

 private:
  std::string name_;
  lzma_stream s_ = LZMA_STREAM_INIT;
};

class Zstd final : public Decoder {
 public:
  explicit Zstd(std::string name) : name_(std::move(name)), d_(ZSTD_createDStream()) {
    check(d_ != nullptr && !ZSTD_isError(ZSTD_initDStream(d_)), name_, ": libzstd could not start");
  }
  ~Zstd() override { ZSTD_freeDStream(d_); }
  bool feed(const uint8_t* in, size_t n, std::string& out) override {
    if (n == 0) {
      check(frame_done_, name_, ": the zstd stream is truncated (it ends inside a frame); the file is incomplete");
      return true;
    }
    ZSTD_inBuffer input{in, n, 0};
    char buf[1 << 17];
    while (true) {  // until the input is used up and the decoder holds nothing more
      ZSTD_outBuffer output{buf, sizeof buf, 0};
      const size_t r = ZSTD_decompressStream(d_, &output, &input);
      if (ZSTD_isError(r))
        fail(name_, ": corrupt zstd data near compressed byte ", consumed_ + input.pos, " (", ZSTD_getErrorName(r), ")");
      out.append(buf, output.pos);
      frame_done_ = r == 0;  // a frame ended and everything in it was returned
      if (input.pos == input.size && output.pos < output.size) break;
    }
    consumed_ += n;
    return false;
  }

 private:
  std::string name_;
  ZSTD_DStream* d_;
  bool frame_done_ = true;
  uint64_t consumed_ = 0;
};
}  // namespace

// The decompressing thread and the chunks it has made.
struct InputStream::Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> chunks;
  bool finished = false, stop = false;
  std::exception_ptr error;
  std::thread thread;
};

InputStream::InputStream(const fs::path& path) : path_(path), pipe_(std::make_unique<Pipe>()) {
  struct stat st {};
  // errno read after the call (check's arguments are evaluated in no fixed order)
  if (::stat(path.c_str(), &st) != 0) fail(path.string(), ": cannot open the input file (", std::strerror(errno), ")");
  check(S_ISREG(st.st_mode), path.string(), ": not a regular file; give the path of a corpus file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, path.string(), ": cannot open the input file (", std::strerror(errno), ")");
  compression_ = detect_compression(path);
  std::unique_ptr<Decoder> dec;
  switch (compression_) {
    case Compression::kNone: dec = std::make_unique<Plain>(); break;
    case Compression::kGzip: dec = std::make_unique<Gzip>(path.string()); break;
    case Compression::kXz: dec = std::make_unique<Xz>(path.string()); break;
    case Compression::kZstd: dec = std::make_unique<Zstd>(path.string()); break;
  }
  Pipe* p = pipe_.get();
  const std::string name = path.string();
  auto reader = [p, fd, name, d = std::move(dec)]() mutable {
    try {
      std::vector<uint8_t> in(kIn);
      std::string out;
      bool ended = false;
      while (!ended) {
        const ssize_t n = ::read(fd, in.data(), in.size());
        if (n < 0 && errno == EINTR) continue;
        check(n >= 0, name, ": read error (", std::strerror(errno), ")");
        ended = d->feed(in.data(), static_cast<size_t>(n), out) || n == 0;
        if (out.size() >= kOut || (ended && !out.empty())) {
          std::unique_lock<std::mutex> lock(p->mu);
          p->cv.wait(lock, [&] { return p->chunks.size() < kAhead || p->stop; });
          if (p->stop) break;
          p->chunks.push_back(std::move(out));
          out = std::string();
          p->cv.notify_all();
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(p->mu);
      p->error = std::current_exception();
    }
    ::close(fd);
    std::lock_guard<std::mutex> lock(p->mu);
    p->finished = true;
    p->cv.notify_all();
  };
  try {
    p->thread = std::thread(std::move(reader));
  } catch (const std::system_error& e) {  // the system refused a thread (a process or memory limit)
    ::close(fd);
    fail(name, ": cannot start the thread that reads it (", e.what(), ")");
  }
}

InputStream::~InputStream() {
  {
    std::lock_guard<std::mutex> lock(pipe_->mu);
    pipe_->stop = true;
    pipe_->cv.notify_all();
  }
  if (pipe_->thread.joinable()) pipe_->thread.join();
}

bool InputStream::refill() {
  std::unique_lock<std::mutex> lock(pipe_->mu);
  pipe_->cv.wait(lock, [&] { return !pipe_->chunks.empty() || pipe_->finished; });
  if (!pipe_->chunks.empty()) {
    chunk_.erase(0, at_);  // keep a partial line
    chunk_ += pipe_->chunks.front();
    at_ = 0;
    pipe_->chunks.pop_front();
    pipe_->cv.notify_all();
    return true;
  }
  if (pipe_->error) std::rethrow_exception(pipe_->error);
  return false;
}

bool InputStream::getline(std::string& line) {
  while (true) {
    const size_t nl = chunk_.find('\n', at_);
    if (nl != std::string::npos) {
      line.assign(chunk_, at_, nl - at_);
      at_ = nl + 1;
      return true;
    }
    if (done_ || !refill()) {
      done_ = true;
      if (at_ >= chunk_.size()) return false;
      line.assign(chunk_, at_, std::string::npos);  // a last line without '\n'
      at_ = chunk_.size();
      return true;
    }
  }
}

}  // namespace megabatch::data
