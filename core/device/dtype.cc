#include "core/device/dtype.h"

namespace megabatch {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
  }
  return "?";
}

}  // namespace megabatch
