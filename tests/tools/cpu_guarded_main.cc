// A program with nothing but megabatch's CPU check (core/util/cpu_level.cc) and the
// features of the -march it was built with (core/util/cpu_build_features.cc), so that
// tests/tools/check_cpu_level.sh can try builds for CPUs other than the project's own.
#include <cstdio>

#include "core/util/cpu_features.h"

int main() {
  std::printf("runs: built for -march=%s\n", megabatch_build_march);
  return 0;
}
