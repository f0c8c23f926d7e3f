// adafactor: Adafactor (Shazeer & Stern 2018) without momentum, an example of a plugin
// built outside the megabatch tree, and of optimizer state that is not parameter-sized.
//
// For a matrix W (rows x cols) it keeps factored second moments: one value per row (R)
// and one per column (C) instead of a full matrix, with b2_t = 1 - t^-0.8:
//   R <- b2_t R + (1 - b2_t) mean over columns of (g^2 + eps1)
//   C <- b2_t C + (1 - b2_t) mean over rows    of (g^2 + eps1)
//   u  = g / sqrt(R_r C_c / mean(R))                     (vectors: u = g / sqrt(v), v full)
//   u /= max(1, rms(u) / clip);  W <- W (1 - lr wd) - lr u   (decay: weights and embeddings;
//   wd the step's, which a run may schedule)
// Row and column statistics are sums over jobs of one row or one column each. Under
// tensor parallelism a matrix split by rows has whole rows here (its column sums, the
// mean of R and rms(u) are summed over the group), one split by columns whole columns.
#include <megabatch/plugin_kit.h>

#include <cmath>
#include <vector>

namespace {
using megabatch::plugin::Sums;
using megabatch::plugin::TensorJob;

struct SquaresAlong {  // sum of g^2 along one row (stride 1) or one column (stride cols)
  const float* g;
  int64_t start, stride;
  MB_HOST_DEVICE Sums<1> operator()(int64_t j) const {
    const double x = g[start + j * stride];
    return {{x * x}};
  }
};

// The step's numbers are read on the device from `values` (in prepared(), once per chunk or
// thread), not copied into the functors: then the tables are the same every step and the
// kit uploads them once. Members are ordered by size, so a functor has no padding bytes.
MB_HOST_DEVICE inline float decay_rate(const mb_step_values* values) {  // b2_t = 1 - t^-0.8
  return static_cast<float>(1.0 - std::pow(static_cast<double>(values->step), -0.8));
}

struct FactorUpdate {  // f[j] <- b f[j] + (1 - b) (sums[j] / n + eps1)
  float* f;
  const double* sums;
  const mb_step_values* values;
  double inv_n;
  float eps1;
  float b = 0.0f;  // set by prepared()
  MB_HOST_DEVICE FactorUpdate prepared() const {
    FactorUpdate p = *this;
    p.b = decay_rate(values);
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const {
    f[j] = b * f[j] + (1.0f - b) * (static_cast<float>(sums[j] * inv_n) + eps1);
  }
};

struct VectorMoment {  // v <- b v + (1 - b) (g^2 + eps1), element-wise
  float* v;
  const float* g;
  const mb_step_values* values;
  float eps1;
  float b = 0.0f;  // set by prepared()
  MB_HOST_DEVICE VectorMoment prepared() const {
    VectorMoment p = *this;
    p.b = decay_rate(values);
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const { v[j] = b * v[j] + (1.0f - b) * (g[j] * g[j] + eps1); }
};

struct Values {  // sum of a vector (the mean of R)
  const float* x;
  MB_HOST_DEVICE Sums<1> operator()(int64_t j) const { return {{static_cast<double>(x[j])}}; }
};

// The unclipped update u of element j: factored for a matrix, full for a vector.
struct Direction {
  const float* g;
  const float *R, *C, *v;  // R, C for a matrix (v null); v for a vector
  const double* rsum;      // sum of R over the full rows
  int64_t cols;
  double inv_rows;
  float rmean = 1.0f;  // set by prepared()
  float unused = 0.0f;  // fills the last 8 bytes: no padding bytes
  MB_HOST_DEVICE Direction prepared() const {
    Direction p = *this;
    if (!v) p.rmean = static_cast<float>(*rsum * inv_rows);
    return p;
  }
  MB_HOST_DEVICE float operator()(int64_t j) const {
    if (v) return g[j] / std::sqrt(v[j]);
    return g[j] / std::sqrt(R[j / cols] / rmean * C[j % cols]);
  }
};

struct SquaredDirection {  // |u|^2 of a tensor (for its rms)
  Direction u;
  MB_HOST_DEVICE SquaredDirection prepared() const { return {u.prepared()}; }
  MB_HOST_DEVICE Sums<1> operator()(int64_t j) const {
    const double x = u(j);
    return {{x * x}};
  }
};

struct Update {
  Direction u;
  float* w;
  const double* usq;  // |u|^2 of the full tensor
  const mb_step_values* values;
  const double* lr_at;  // values->lr, or values->decoupled_lr for the embedding
  double inv_numel, clip;
  double decays;      // 1 for weights and embeddings, 0 for biases and norms: the factor on the step's weight decay
  float keep = 1.0f;  // 1 - lr wd, set by prepared()
  float step = 0.0f;  // lr / max(1, rms(u) / clip), set by prepared()
  MB_HOST_DEVICE Update prepared() const {
    Update p = *this;
    p.u = u.prepared();
    const double rms = std::sqrt(*usq * inv_numel), denom = rms / clip > 1.0 ? rms / clip : 1.0;
    p.step = static_cast<float>(*lr_at / denom);
    const double wd = decays * values->weight_decay;  // the step's: a run may schedule it
    p.keep = wd != 0.0 ? static_cast<float>(1.0 - *lr_at * wd) : 1.0f;
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const { w[j] = w[j] * keep - step * u(j); }
};

class Adafactor final : public megabatch::plugin::Optimizer {
 public:
  // decays by the step's weight decay (values->weight_decay); steps the embedding at the decoupled lr
  static constexpr uint32_t kFlags = MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR;
  explicit Adafactor(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx), eps1_(hparam("eps1")), clip_(hparam("clip_threshold")) {
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      Slot s;
      if (p.ndim == 2) {  // factored: per-row and per-column state, sharded along the parameter's split
        s.R = alloc_state(i, "exp_avg_sq_row", {p.shape[0]}, p.sharded && p.partition_dim == 0 ? 0 : -1);
        s.C = alloc_state(i, "exp_avg_sq_col", {p.shape[1]}, p.sharded && p.partition_dim == 1 ? 0 : -1);
      } else {
        s.v = alloc_state(i, "exp_avg_sq");
      }
      slots_.push_back(s);
    }
  }

  void step(const mb_step_info& info) override {
    // 1. sums of g^2 along every row and every column of every matrix
    std::vector<TensorJob<SquaresAlong>> rows, cols;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      if (p.ndim != 2) continue;
      for (int64_t r = 0; r < p.shape[0]; ++r) rows.push_back({p.shape[1], {p.grad, r * p.shape[1], 1}});
      for (int64_t c = 0; c < p.shape[1]; ++c) cols.push_back({p.shape[0], {p.grad, c, p.shape[1]}});
    }
    auto row_sums = sum<1>(rows);
    auto col_sums = sum<1>(cols);
    // 2. the factors of matrices, the full second moment of vectors
    std::vector<TensorJob<FactorUpdate>> factors;
    std::vector<TensorJob<VectorMoment>> vectors;
    int64_t at_r = 0, at_c = 0;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      if (p.ndim != 2) {
        vectors.push_back({p.numel, {slots_[i].v, p.grad, info.values, static_cast<float>(eps1_)}});
        continue;
      }
      double* rs = row_sums.data() + at_r;
      double* cs = col_sums.data() + at_c;
      if (p.sharded && p.partition_dim == 1) tp_sum(rs, static_cast<size_t>(p.shape[0]));  // rows cut into pieces
      if (p.sharded && p.partition_dim == 0) tp_sum(cs, static_cast<size_t>(p.shape[1]));  // columns cut into pieces
      factors.push_back({p.shape[0], {slots_[i].R, rs, info.values, 1.0 / static_cast<double>(p.full_shape[1]),
                                      static_cast<float>(eps1_)}});
      factors.push_back({p.shape[1], {slots_[i].C, cs, info.values, 1.0 / static_cast<double>(p.full_shape[0]),
                                      static_cast<float>(eps1_)}});
      at_r += p.shape[0];
      at_c += p.shape[1];
    }
    apply(factors);
    apply(vectors);
    // 3. the mean of R per matrix, then |u|^2 per tensor, both global over the group
    std::vector<TensorJob<Values>> rjobs;
    for (size_t i = 0; i < num_params(); ++i)
      rjobs.push_back({param(i).ndim == 2 ? param(i).shape[0] : 0, {slots_[i].R}});
    auto rsum = sum<1>(rjobs);
    for (size_t i = 0; i < num_params(); ++i)
      if (param(i).ndim == 2 && param(i).sharded && param(i).partition_dim == 0) tp_sum(rsum.data() + i, 1);
    std::vector<TensorJob<SquaredDirection>> ujobs;
    for (size_t i = 0; i < num_params(); ++i) ujobs.push_back({param(i).numel, {direction(i, rsum.data() + i)}});
    auto usq = sum<1>(ujobs);
    sum_shards(usq);
    // 4. the update
    std::vector<TensorJob<Update>> jobs;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      const bool decay = p.role == MB_ROLE_WEIGHT || p.role == MB_ROLE_EMBEDDING;
      jobs.push_back({p.numel,
                      {direction(i, rsum.data() + i), p.data, usq.data() + i, info.values, lr_of(i, info),
                       1.0 / static_cast<double>(full_numel(i)), clip_, decay ? 1.0 : 0.0}});
    }
    if (info.diagnostics) {
      const auto u2 = usq.host();
      for (size_t i = 0; i < num_params(); ++i)
        metric("update_rms", i, std::sqrt(u2[i][0] / static_cast<double>(full_numel(i))));
    }
    apply(jobs);
  }

 private:
  struct Slot {
    float *R = nullptr, *C = nullptr, *v = nullptr;
  };
  Direction direction(size_t i, const double* rsum) const {
    const mb_param& p = param(i);
    return {p.grad, slots_[i].R, slots_[i].C, slots_[i].v, rsum, p.ndim == 2 ? p.shape[1] : 1,
            p.ndim == 2 ? 1.0 / static_cast<double>(p.full_shape[0]) : 1.0};
  }

  double eps1_, clip_;
  std::vector<Slot> slots_;
};

const mb_hparam_spec kSchema[] = {
    {"eps1", MB_HPARAM_FLOAT, 1e-30, 0.0, 1.0, "added to g^2 in the second-moment statistics"},
    {"clip_threshold", MB_HPARAM_FLOAT, 1.0, 1e-6, 1e6, "the update is scaled down to this rms"},
    {"weight_decay", MB_HPARAM_FLOAT, 0.0, 0.0, 10.0, "decoupled weight decay of weights and embeddings"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(Adafactor, "adafactor", "0.3.0",
                           "Adafactor without momentum: factored second moments (example plugin)", kSchema)
