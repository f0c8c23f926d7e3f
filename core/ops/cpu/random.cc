// Philox normal draws on the CPU.
#include "core/ops/backends.h"
#include "core/util/philox.h"

namespace megabatch::ops::cpu {

void normal_fill(const Tensor& out, uint64_t key, const ShardLayout& layout) {
  float* o = out.data<float>();
  const int64_t n = static_cast<int64_t>(out.numel());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(philox_normal(key, static_cast<uint64_t>(layout.full_index(i))));
}

}  // namespace megabatch::ops::cpu
