// In a sanitizer build (the sanitize presets) only: an MPI rank unwinds the stack of every
// allocation fully. Open MPI unloads its components at MPI_Finalize, so the fast
// (frame-pointer) stack of one of their allocations ends in an unknown module, and
// tests/tools/lsan.supp's suppressions, which name Open MPI's libraries, cannot match it:
// every rank then ended in a leak report of Open MPI's own allocations (exit 134, through
// __cxa_finalize) wherever a test started train under mpirun. Full stacks reach libmpi.so.
// Only ranks pay for them (about 4x on allocations); ASAN_OPTIONS still overrides this.
//
// ASan asks for these options before it is initialised: nothing here may be instrumented
// or call an intercepted function (getenv, strlen, read all crashed or saw nothing), so the
// environment is read from /proc with raw system calls.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

// Whether this process's environment has OMPI_COMM_WORLD_SIZE (set by mpirun for a rank).
__attribute__((no_sanitize("address", "undefined"))) bool is_mpi_rank() {
  static char env[1 << 16];
  const long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/environ", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const long n = syscall(SYS_read, fd, env, sizeof env - 1);
  syscall(SYS_close, fd);
  const char* key = "OMPI_COMM_WORLD_SIZE=";
  for (long i = 0; i < n;) {  // NUL-separated NAME=VALUE entries
    long k = 0;
    while (key[k] != '\0' && i + k < n && env[i + k] == key[k]) ++k;
    if (key[k] == '\0') return true;
    while (i < n && env[i] != '\0') ++i;
    ++i;
  }
  return false;
}

}  // namespace

extern "C" __attribute__((no_sanitize("address", "undefined"))) const char* __asan_default_options() {
  return is_mpi_rank() ? "fast_unwind_on_malloc=0" : "";
}
