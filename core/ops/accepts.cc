#include "core/ops/accepts.h"

namespace megabatch::ops {

std::string DTypes::names() const {
  std::vector<std::string> n;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32, DType::kU8})
    if (has(d)) n.push_back(dtype_name(d));
  std::string out;
  for (size_t i = 0; i < n.size(); ++i) out += (i == 0 ? "" : i + 1 == n.size() ? " or " : ", ") + n[i];
  return out.empty() ? "nothing" : out;
}

const std::vector<Accepts>& all_accepts() {
  using namespace accepts;
  static const std::vector<Accepts> rows = {
#define MB_OP_ACCEPTS(op, arg, cpu, cuda, narrowed) op##_##arg,
#include "core/ops/accepts.inc"
#undef MB_OP_ACCEPTS
  };
  return rows;
}

}  // namespace megabatch::ops
