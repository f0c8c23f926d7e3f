#include "core/ops/cpu/blas.h"

#include "core/ops/cpu/blas_kernel.h"

#include <cstdio>

namespace megabatch::ops::cpu {

std::string cpu_and_blas() {
  std::string model = "unknown CPU";
  if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (std::string l = line; l.rfind("model name", 0) == 0 && l.find(':') != std::string::npos) {
        model = l.substr(l.find(':') + 2);
        if (!model.empty() && model.back() == '\n') model.pop_back();
        break;
      }
    std::fclose(f);
  }
  std::string blas = openblas_get_config();  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": its first two words
  if (const size_t a = blas.find(' '); a != std::string::npos) blas = blas.substr(0, blas.find(' ', a + 1));
  return model + "; " + blas + " sgemm kernel " + openblas_get_corename() + blas_kernel_note();
}

}  // namespace megabatch::ops::cpu
