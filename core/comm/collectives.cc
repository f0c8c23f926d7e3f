#include "core/comm/collectives.h"

#include "core/util/error.h"

namespace megabatch::comm {

void all_reduce(Communicator& c, const Tensor& t, ReduceOp op) {
  if (c.size() == 1 || t.numel() == 0) return;
  if (t.device().is_cpu() && t.dtype() == DType::kF32) return c.all_reduce(t.data<float>(), t.numel(), op);
  if (t.device().is_cpu() && t.dtype() == DType::kF64) return c.all_reduce(t.data<double>(), t.numel(), op);
  check(is_floating(t.dtype()), "all_reduce of a ", t.describe(), " tensor");
  if (t.dtype() == DType::kF64) {  // on a GPU: f64 is CPU-only, so this is a host mirror
    std::vector<double> v = to_host_f64(t);
    c.all_reduce(v.data(), v.size(), op);
    copy(t, from_host(v, t.shape()));
    return;
  }
  std::vector<float> v = to_host_f32(t);
  c.all_reduce(v.data(), v.size(), op);
  copy(t, from_host(v, t.shape(), t.dtype(), t.device()));
}

}  // namespace megabatch::comm
