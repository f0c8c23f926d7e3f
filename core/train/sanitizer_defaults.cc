// In a sanitizer build (the sanitize presets) only: what ASan does in an MPI rank.
//
// Leak checks of a rank need full stacks. Open MPI unloads its components at MPI_Finalize, and
// its libraries have no frame pointers, so the fast (frame-pointer) stack of one of their
// allocations ends in an unknown module, and tests/tools/lsan.supp's suppressions, which name
// Open MPI's libraries, cannot match it: every rank then ended in a leak report of Open MPI's own
// allocations (exit 134, through __cxa_finalize). Full stacks reach libmpi.so, but unwinding
// every allocation fully makes a rank about 4x slower (a 2-rank run 5.7 s against 1.5 s).
//
// MEGABATCH_RANK_LEAK_CHECK in a rank's environment says which:
//   unset or 1: full stacks and leak checks (a sanitized train run under mpirun by hand);
//   0:          fast stacks and no leak checks; every other check of ASan and UBSan stays.
// The sanitize test preset sets 0 for its tests, and the MPI tests that cover each path of a
// rank (tensor and data parallel, the distributed optimizer, a stop by signal) set 1 for their
// job (tests/e2e/test_mpi.cc). A process that is not a rank (every single-process test) checks
// leaks with fast stacks either way. ASAN_OPTIONS still overrides all of this.
//
// ASan asks for these options before it is initialised: nothing here may be instrumented
// or call an intercepted function (getenv, strlen, read all crashed or saw nothing), so the
// environment is read from /proc with raw system calls.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

// Whether `entry` (NAME=VALUE, n bytes) starts with `key` ("NAME="); `value` then points past it.
__attribute__((no_sanitize("address", "undefined"))) bool starts_with(const char* entry, long n, const char* key,
                                                                      const char** value) {
  long k = 0;
  while (key[k] != '\0' && k < n && entry[k] == key[k]) ++k;
  if (key[k] != '\0') return false;
  *value = entry + k;
  return true;
}

// The options for this process: none for one that is not an MPI rank (no OMPI_COMM_WORLD_SIZE,
// which mpirun sets for a rank); for a rank, full stacks, or no leak check where
// MEGABATCH_RANK_LEAK_CHECK=0.
__attribute__((no_sanitize("address", "undefined"))) const char* options() {
  static char env[1 << 16];
  const long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/environ", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const long n = syscall(SYS_read, fd, env, sizeof env - 1);
  syscall(SYS_close, fd);
  bool rank = false, unchecked = false;
  for (long i = 0; i < n;) {  // NUL-separated NAME=VALUE entries
    const char* value = nullptr;
    if (starts_with(env + i, n - i, "OMPI_COMM_WORLD_SIZE=", &value)) rank = true;
    if (starts_with(env + i, n - i, "MEGABATCH_RANK_LEAK_CHECK=", &value))
      unchecked = value[0] == '0' && value[1] == '\0';
    while (i < n && env[i] != '\0') ++i;
    ++i;
  }
  if (!rank) return "";
  return unchecked ? "detect_leaks=0" : "fast_unwind_on_malloc=0";
}

}  // namespace

extern "C" __attribute__((no_sanitize("address", "undefined"))) const char* __asan_default_options() {
  return options();
}
