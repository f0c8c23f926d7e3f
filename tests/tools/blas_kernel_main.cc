// A program that links megabatch_core and prints its machine line (CPU; OpenBLAS and the
// sgemm kernel this process runs with), and nothing else: tests/tools/check_blas_kernel.sh
// starts it on CPUs emulated by QEMU to see which kernel a megabatch program ends up with.
#include <cstdio>

#include "core/ops/cpu/blas.h"

int main() {
  std::printf("%s\n", megabatch::ops::cpu::cpu_and_blas().c_str());
  return 0;
}
