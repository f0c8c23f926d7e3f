#include "core/device/device.h"

#include "core/device/runtime.h"
#include "core/util/error.h"
#include "core/util/numbers.h"

namespace megabatch {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device parse_device(const std::string& text, const std::string& where) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 10 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return Device::cuda(static_cast<int>(to_int(text.substr(5), where)));
  fail(where, ": '", text, "' is not a device; use cpu, cuda or cuda:N");
}

Device select_device(const std::string& requested, int local_rank) {
  if (requested.empty()) {
    const int n = runtime::cuda_device_count();
    return n > 0 ? Device::cuda(local_rank % n) : Device::cpu();
  }
  Device d = parse_device(requested, "device");
  if (d.is_cpu()) return d;
  check(runtime::built_with_cuda(), "--device ", requested,
        ": this megabatch was built without CUDA; rebuild where nvcc is found (cmake -DMEGABATCH_CUDA=ON), or use "
        "--device cpu");
  const int n = runtime::cuda_device_count();
  check(n > 0, "--device ", requested, ": no GPU is visible to this process (no NVIDIA driver, no GPU, or ",
        "CUDA_VISIBLE_DEVICES hides them); use --device cpu");
  if (d.index >= n)
    fail("--device ", requested, ": only ", n, " GPU", n == 1 ? " is" : "s are", " visible (cuda:0",
         n > 1 ? " to cuda:" + std::to_string(n - 1) : std::string(), ")");
  if (requested == "cuda") d.index = local_rank % n;
  return d;
}

}  // namespace megabatch
