#include "core/train/run_device.h"

#include <iostream>
#include <string>

#include "core/device/runtime.h"
#include "core/ops/cpu/blas.h"
#include "core/ops/flash_attention.h"
#include "core/util/error.h"

namespace megabatch::train {

namespace {
// The flash kernels' variants where they are not the defaults (MEGABATCH_FLASH_DQ,
// MEGABATCH_FLASH_FORWARD_ROWS: asking checks them)
std::string flash_variants() {
  std::string s;
  if (ops::flash_dq() == ops::FlashDq::kOrdered) s += ", ordered dQ";
  if (ops::flash_forward_rows() == ops::FlashForwardRows::k32) s += ", 32 forward rows a warp";
  return s.empty() ? s : "; flash kernels" + s;
}
}  // namespace

Device run_device(const nlohmann::json& v, DType dtype, int local_rank) {
  const Device d = select_device(v.contains("device") ? v["device"].get<std::string>() : "", local_rank);
  if (d.is_cuda()) {
    const runtime::GpuInfo g = runtime::gpu_info(d.index);
    check(dtype != DType::kBF16 || g.has_bf16(), "--bf16: ", d.str(), " (", g.name, ", sm_", g.major, g.minor,
              ") has no bf16 arithmetic (it needs sm_80 or later, A100 / H100); use --fp16 on this GPU");
    runtime::use_device(d);
    std::cout << "> device: " << d.str() << " (" << g.name << ", sm_" << g.major << g.minor << ", "
              << (g.total_memory >> 30) << " GiB), " << dtype_name(dtype) << flash_variants() << std::endl;
  } else {
    std::cout << "> device: cpu"
              << (v.contains("device") ? ""
                  : runtime::built_with_cuda() ? " (no GPU visible)"
                                                  : " (this build has no CUDA)")
              << ", " << dtype_name(dtype) << (dtype == DType::kF32 ? "" : " emulated (stored rounded, computed in f32)")
              << "; " << ops::cpu::cpu_and_blas() << std::endl;
  }
  return d;
}

}  // namespace megabatch::train
