// megabatch: errors that reach the user.
//
// Every error that bad input can cause is a megabatch::Error whose message names the
// file (and line, key or byte offset), says what was expected, and what to do. Binaries
// catch it at main() and print it as one line; nothing else should reach the user.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace megabatch {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// fail("file.idx: ", "bad magic") throws Error with the concatenation of its arguments.
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

// check(cond, ...) throws Error(concat(...)) when cond is false. Its arguments are evaluated
// whether or not cond holds: where the message calls a function (Tensor::describe, shape_text)
// on a path that runs at every op or step, write if (!cond) fail(...) so that it is built only
// for the error.
template <typename... Args>
void check(bool cond, Args&&... args) {
  if (!cond) fail(std::forward<Args>(args)...);
}

}  // namespace megabatch
