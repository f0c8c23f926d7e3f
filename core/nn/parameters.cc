#include "core/nn/parameters.h"

#include <cmath>
#include <cstring>

#include "core/ops/elementwise.h"
#include "core/util/error.h"
#include "core/util/philox.h"

namespace megabatch::nn {

const char* role_name(Role r) {
  switch (r) {
    case Role::kEmbedding: return "embedding";
    case Role::kWeight: return "weight";
    case Role::kBias: return "bias";
    case Role::kNorm: return "norm";
  }
  return "?";
}

int64_t ParamInfo::full_numel() const {
  int64_t n = 1;
  for (int64_t d : full_shape) n *= d;
  return n;
}

int64_t ParamInfo::full_index(int64_t i) const {
  if (!sharding.sharded) return i;
  if (shape.size() == 1) return sharding.tp_rank * shape[0] + i;
  const int64_t cols = shape[1], r = i / cols, c = i % cols;
  if (sharding.partition_dim == 0) return (sharding.tp_rank * shape[0] + r) * full_shape[1] + c;
  return r * full_shape[1] + sharding.tp_rank * cols + c;
}

int ParameterStore::add(ParamSpec spec) {
  check(!finalized_, "parameter '", spec.name, "' declared after the parameter store was finalized");
  check(find(spec.name) < 0, "parameter '", spec.name, "' declared twice");
  check(!spec.full_shape.empty() && spec.full_shape.size() <= 2, "parameter '", spec.name,
        "': 1 or 2 dimensions expected");
  ParamInfo p;
  static_cast<ParamSpec&>(p) = std::move(spec);
  p.shape = p.full_shape;
  if (p.sharding.sharded) {
    const int d = p.sharding.partition_dim;
    check(d >= 0 && d < static_cast<int>(p.shape.size()), "parameter '", p.name, "': bad partition dim ", d);
    check(p.shape[d] % p.sharding.tp_size == 0, "parameter '", p.name, "': dimension ", d, " (", p.shape[d],
          ") is not divisible by the tensor-parallel size ", p.sharding.tp_size);
    p.shape[d] /= p.sharding.tp_size;
  }
  // Sizes of absurd models are refused here, before anything wraps: the element count of
  // one tensor and of the flat buffer stay below 2^62 (an int64 in bytes for f32 and f64).
  constexpr int64_t kMaxElements = int64_t{1} << 62;
  int64_t numel = 1, full = 1;
  for (size_t k = 0; k < p.shape.size(); ++k) {
    check(p.full_shape[k] >= 0, "parameter '", p.name, "': dimension ", k, " is ", p.full_shape[k], ", not >= 0");
    if (__builtin_mul_overflow(numel, p.shape[k], &numel) || __builtin_mul_overflow(full, p.full_shape[k], &full) ||
        full >= kMaxElements)
      fail("parameter '", p.name, "': ", p.full_shape[0],
           p.full_shape.size() > 1 ? " x " + std::to_string(p.full_shape[1]) : "",
           " elements is more than any machine holds; check the model's sizes");
  }
  p.numel = static_cast<size_t>(numel);
  p.offset = next_offset_;
  next_offset_ += (p.numel + 15) / 16 * 16;
  check(next_offset_ < static_cast<size_t>(kMaxElements), "parameter '", p.name, "': the model's parameters add up to ",
        "more than 2^62 elements, more than any machine holds; check the model's sizes");
  check(!__builtin_add_overflow(full_elements_, full, &full_elements_) && full_elements_ < kMaxElements, "parameter '",
        p.name, "': the model's parameters add up to more than 2^62 elements, more than any machine holds; check the "
        "model's sizes");
  index_.emplace(p.name, static_cast<int>(infos_.size()));
  infos_.push_back(std::move(p));
  return static_cast<int>(infos_.size() - 1);
}

void ParameterStore::finalize(DType dtype, Device device) {
  check(!finalized_, "parameter store finalized twice");
  if (dtype != DType::kF32 && !is_half(dtype)) fail("parameters are f32, bf16 or f16, not ", dtype_name(dtype));
  dtype_ = dtype;
  device_ = device;
  const int64_t n = static_cast<int64_t>(next_offset_);
  params_.resize({n}, dtype, device);
  grads_.resize({n}, DType::kF32, device);
  if (mixed()) masters_.resize({n}, DType::kF32, device);
  finalized_ = true;
}

Tensor ParameterStore::view(const Tensor& flat, int id) const {
  const ParamInfo& p = infos_.at(static_cast<size_t>(id));
  return flat.flat(p.offset, p.numel, p.shape);
}
Tensor ParameterStore::param(int id) const { return view(params_, id); }
Tensor ParameterStore::grad(int id) const { return view(grads_, id); }
Tensor ParameterStore::master(int id) const { return view(masters(), id); }

namespace {
constexpr const char* kReleased =
    "internal error: the fp32 master weights are sharded over the data-parallel ranks (--use-distributed-optimizer); "
    "read this rank's pieces through optim::DpShards";
}  // namespace

const Tensor& ParameterStore::masters() const {
  check(!masters_released_, kReleased);
  return mixed() ? masters_ : params_;
}

void ParameterStore::release_masters() {
  check(finalized_, "release_masters() before finalize()");
  if (!mixed()) return;
  masters_ = Tensor();
  masters_released_ = true;
}

namespace {
// A uniform draw in [0, 1) that is a pure function of (key, index): 53 bits of the Philox block
// of counter index (as philox_normal's, for the Xavier initialization).
double philox_uniform(uint64_t key, uint64_t index) {
  const Philox4x32::Block r = Philox4x32::generate(key, 0, index);
  return static_cast<double>(((uint64_t{r[0]} << 32) | r[1]) >> 11) * 0x1.0p-53;
}
}  // namespace

void ParameterStore::initialize(uint64_t seed, bool xavier_uniform) {
  check(finalized_, "initialize() before finalize()");
  check(!masters_released_, kReleased);
  Tensor host({static_cast<int64_t>(next_offset_)});  // fp32 values on the host, then to the device
  for (size_t id = 0; id < infos_.size(); ++id) {
    const ParamInfo& p = infos_[id];
    float* w = host.data() + p.offset;
    if (p.init.kind == Init::kOnes) {
      for (size_t i = 0; i < p.numel; ++i) w[i] = 1.0f;
    } else if (p.init.kind == Init::kNormal && xavier_uniform && !p.init.own_std && p.full_shape.size() == 2) {
      const uint64_t key = mix_key(seed, name_key(p.name.data(), p.name.size()));
      const double a = std::sqrt(6.0 / static_cast<double>(p.full_shape[0] + p.full_shape[1]));
#pragma omp parallel for schedule(static) if (p.numel > 65536)
      for (int64_t i = 0; i < static_cast<int64_t>(p.numel); ++i)
        w[i] = static_cast<float>(a * (2.0 * philox_uniform(key, static_cast<uint64_t>(p.full_index(i))) - 1.0));
    } else if (p.init.kind == Init::kNormal) {
      const uint64_t key = mix_key(seed, name_key(p.name.data(), p.name.size()));
#pragma omp parallel for schedule(static) if (p.numel > 65536)
      for (int64_t i = 0; i < static_cast<int64_t>(p.numel); ++i) {
        w[i] = static_cast<float>(p.init.std * philox_normal(key, static_cast<uint64_t>(p.full_index(i))));
      }
    }
  }
  if (!mixed()) {
    copy(params_, host);
    return;
  }
  // the masters are the fp32 values of the rounded parameters (rounded in place: a cast
  // to the half type and back would widen a whole-model copy through the CPU kernels'
  // scratch pool, which keeps it)
  float* w = host.data();
  const DType t = dtype_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(next_offset_); ++i) w[i] = round_to(t, w[i]);
  copy(masters_, host);
  copy_masters_to_params();
}

void ParameterStore::copy_masters_to_params() {
  check(!masters_released_, kReleased);
  if (mixed()) ops::cast(params_, masters_);
}

int ParameterStore::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

int64_t ParameterStore::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : infos_) n += static_cast<int64_t>(p.numel);
  return n;
}

int64_t ParameterStore::num_full_parameters() const {
  int64_t n = 0;
  for (const auto& p : infos_) n += p.full_numel();
  return n;
}

void ParameterStore::zero_grad() { grads_.zero(); }

}  // namespace megabatch::nn
