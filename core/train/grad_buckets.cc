#include "core/train/grad_buckets.h"

#include <algorithm>

#include "core/comm/collectives.h"
#include "core/util/error.h"

namespace megabatch::train {

size_t default_bucket_elems(size_t flat_size, int dp_size, bool overlap) {
  return overlap ? std::max<size_t>(40000000, size_t{1000000} * static_cast<size_t>(dp_size)) : std::max<size_t>(flat_size, 1);
}

GradientBuckets::GradientBuckets(nn::ParameterStore& store, comm::Communicator& dp, size_t bucket_elems, bool overlap)
    : store_(store), dp_(dp), overlap_(overlap) {
  check(bucket_elems >= 1, "ddp_bucket_size must be >= 1 element");
  const size_t n = store.count(), flat = store.flat_size();
  bucket_of_.assign(n, 0);
  final_.assign(n, false);
  // MPI counts are int: no bucket over 2^30 elements
  const size_t cap = std::min<size_t>(bucket_elems, size_t{1} << 30);
  size_t end = flat;  // the current bucket's end; parameters are laid out in id order
  Bucket cur;
  for (size_t i = n; i-- > 0;) {
    const nn::ParamInfo& p = store.info(static_cast<int>(i));
    check(i + 1 == n || p.offset < store.info(static_cast<int>(i + 1)).offset, "parameters out of layout order");
    bucket_of_[i] = buckets_.size();
    ++cur.params;
    if (end - p.offset >= cap || i == 0) {
      cur.begin = i == 0 ? 0 : p.offset;
      cur.end = end;
      buckets_.push_back(cur);
      end = cur.begin;
      cur = Bucket{};
    }
  }
  if (overlap_) store_.set_grads_final_hook([this](int first, int last) { on_final(first, last); });
}

GradientBuckets::~GradientBuckets() {
  if (overlap_) store_.set_grads_final_hook({});
}

void GradientBuckets::arm() {  // (finish() left every bucket not started)
  for (auto& b : buckets_) b.final = 0;
  std::fill(final_.begin(), final_.end(), false);
  started_early_ = 0;
  armed_ = overlap_;
}

void GradientBuckets::on_final(int first, int end) {
  if (!armed_) return;
  for (int i = first; i < end; ++i) {
    if (final_[static_cast<size_t>(i)]) continue;
    final_[static_cast<size_t>(i)] = true;
    const size_t b = bucket_of_[static_cast<size_t>(i)];
    if (++buckets_[b].final == buckets_[b].params) {
      start(b);
      ++started_early_;
    }
  }
  dp_.progress();
}

void GradientBuckets::start(size_t b) {
  Bucket& k = buckets_[b];
  k.started = true;
  comm::start_all_reduce(dp_, store_.grads().flat(k.begin, k.end - k.begin));
}

void GradientBuckets::finish() {
  armed_ = false;
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!buckets_[b].started) start(b);
  dp_.wait_all();
  for (auto& b : buckets_) b.started = false;
}

}  // namespace megabatch::train
