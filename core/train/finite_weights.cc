#include "core/train/finite_weights.h"

#include <cmath>
#include <vector>

namespace megabatch::train {

std::string nonfinite_weights(const nn::ParameterStore& params, comm::Communicator& world) {
  const std::vector<float> values = to_host_f32(params.params());  // one read of the flat buffer
  std::vector<float> bad(params.count(), 0.0f);                    // per parameter: 1 where not finite
  for (size_t i = 0; i < params.count(); ++i) {
    const nn::ParamInfo& info = params.info(static_cast<int>(i));
    const float* v = values.data() + info.offset;
    for (size_t k = 0; k < info.numel; ++k)
      if (!std::isfinite(v[k])) {
        bad[i] = 1.0f;
        break;
      }
  }
  if (world.size() > 1) world.all_reduce(bad.data(), bad.size(), comm::ReduceOp::kMax);  // any rank's
  size_t first = bad.size(), count = 0;
  for (size_t i = 0; i < bad.size(); ++i)
    if (bad[i] != 0.0f) {
      if (first == bad.size()) first = i;
      ++count;
    }
  if (count == 0) return "";
  std::string said = params.info(static_cast<int>(first)).name;
  if (count > 1)
    said += " and " + std::to_string(count - 1) + " more of the " + std::to_string(bad.size()) + " parameters";
  return said + (count > 1 ? " hold" : " holds") + " NaN or inf";
}

}  // namespace megabatch::train
