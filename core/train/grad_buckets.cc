#include "core/train/grad_buckets.h"

#include <algorithm>

#include "core/comm/collectives.h"
#include "core/device/profile.h"
#include "core/util/error.h"

namespace megabatch::train {

size_t bucket_elems(int64_t ddp_bucket_size, size_t flat_size, int dp_size, bool overlap) {
  if (ddp_bucket_size > 0) return static_cast<size_t>(ddp_bucket_size);
  return overlap ? std::max<size_t>(40000000, size_t{1000000} * static_cast<size_t>(dp_size)) : std::max<size_t>(flat_size, 1);
}

std::vector<optim::DpShards::Range> bucket_ranges(const nn::ParameterStore& store, size_t bucket_elems) {
  check(bucket_elems >= 1, "ddp_bucket_size must be >= 1 element");
  // MPI counts are int: no bucket over 2^30 elements
  const size_t cap = std::min<size_t>(bucket_elems, size_t{1} << 30);
  const size_t n = store.count();
  std::vector<optim::DpShards::Range> ranges;
  size_t end = store.flat_size();  // the current bucket's end; parameters are laid out in id order
  for (size_t i = n; i-- > 0;) {
    const nn::ParamInfo& p = store.info(static_cast<int>(i));
    check(i + 1 == n || p.offset < store.info(static_cast<int>(i + 1)).offset, "parameters out of layout order");
    if (end - p.offset >= cap || i == 0) {
      const size_t begin = i == 0 ? 0 : p.offset;
      ranges.push_back({begin, end});
      end = begin;
    }
  }
  return ranges;
}

GradientBuckets::GradientBuckets(nn::ParameterStore& store, comm::Communicator& dp,
                                 std::vector<optim::DpShards::Range> ranges, bool overlap, optim::DpShards* shards)
    : store_(store), dp_(dp), overlap_(overlap), shards_(shards) {
  if (shards_) ranges = shards_->ranges();  // bucket b is the shards' bucket b
  bucket_of_.assign(store.count(), 0);
  final_.assign(store.count(), false);
  for (size_t b = 0; b < ranges.size(); ++b) {
    Bucket k;
    k.begin = ranges[b].begin;
    k.end = ranges[b].end;
    for (size_t i = 0; i < store.count(); ++i)
      if (store.info(static_cast<int>(i)).offset >= k.begin && store.info(static_cast<int>(i)).offset < k.end) {
        bucket_of_[i] = b;
        ++k.params;
      }
    buckets_.push_back(k);
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
  if (shards_) return shards_->start_reduce_scatter(b);
  comm::start_all_reduce(dp_, store_.grads().flat(k.begin, k.end - k.begin));
}

void GradientBuckets::finish() {
  armed_ = false;
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!buckets_[b].started) start(b);
  {
    const profile::Region mark(profile::Family::kCommunication);
    dp_.wait_all();
  }
  for (auto& b : buckets_) b.started = false;
}

}  // namespace megabatch::train
