#include "core/optim/dp_shards.h"

#include <algorithm>

#include "core/comm/collectives.h"
#include "core/ops/elementwise.h"
#include "core/util/error.h"

namespace megabatch::optim {

DpShards::DpShards(nn::ParameterStore& store, std::vector<Range> ranges, comm::Communicator& dp)
    : store_(store), dp_(dp) {
  check(store.finalized(), "DpShards: the parameter store is not finalized");
  const size_t D = static_cast<size_t>(dp.size()), r = static_cast<size_t>(dp.rank());
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  size_t covered = 0, at = 0, largest = 0;
  for (const Range& g : ranges) {
    check(g.begin == covered && g.end > g.begin, "DpShards: buckets must partition the flat buffers");
    covered = g.end;
  }
  check(covered == store.flat_size(), "DpShards: buckets must partition the flat buffers");
  // buckets in the order given to the gradient buckets (reverse parameter order): grads_
  // holds them as they are reduced
  std::reverse(ranges.begin(), ranges.end());
  for (const Range& g : ranges) {
    Bucket b;
    b.begin = g.begin;
    b.end = g.end;
    b.shard = (g.end - g.begin + D - 1) / D;
    b.at = at;
    at += b.shard;
    largest = std::max(largest, b.shard);
    if (b.shard * D != g.end - g.begin) b.staging = Tensor({static_cast<int64_t>(b.shard * D)}, DType::kF32, store.device());
    buckets_.push_back(std::move(b));
  }
  grads_ = Tensor({static_cast<int64_t>(std::max<size_t>(at, 1))}, DType::kF32, store.device());
  send_ = Tensor({static_cast<int64_t>(std::max<size_t>(largest, 1))}, DType::kF32, store.device());
  // each parameter's piece: its intersection with this rank's shard of its bucket
  pieces_.resize(store.count());
  for (size_t i = 0; i < store.count(); ++i) {
    const nn::ParamInfo& p = store.info(static_cast<int>(i));
    const size_t lo = p.offset, hi = p.offset + p.numel;
    for (const Bucket& b : buckets_) {
      if (lo < b.begin || lo >= b.end) continue;
      check(hi <= b.end, "DpShards: parameter ", p.name, " crosses a bucket boundary");
      const size_t mine = b.begin + r * b.shard, mine_end = std::min(mine + b.shard, b.end);
      const size_t from = std::max(lo, mine), to = std::min(hi, mine_end);
      Piece& piece = pieces_[i];
      if (from < to) {
        piece.begin = static_cast<int64_t>(from - lo);
        piece.end = static_cast<int64_t>(to - lo);
        piece.at = b.at + (from - mine);
        (p.sharding.sharded ? sharded_ : replicated_).emplace_back(piece.at, piece.at + (to - from));
      } else {  // empty
        piece.at = b.at;
      }
    }
  }
  if (!store.mixed()) return;
  // this rank's shards of the fp32 masters; the store's whole copy goes
  masters_ = Tensor({static_cast<int64_t>(std::max<size_t>(at, 1))}, DType::kF32, store.device());
  for (const Bucket& b : buckets_) {
    const auto [mine, n] = own(b);
    if (n > 0) copy(masters_.flat(b.at, n), store.masters().flat(b.begin + mine, n));
  }
  store.release_masters();
}

std::pair<size_t, size_t> DpShards::own(const Bucket& b) const {
  const size_t L = b.end - b.begin, first = std::min(static_cast<size_t>(dp_.rank()) * b.shard, L);
  return {first, std::min(b.shard, L - first)};
}

Tensor DpShards::master_piece(int id) const {
  const Piece& p = piece(id);
  const auto n = static_cast<size_t>(p.numel());
  if (masters_.defined()) return masters_.flat(p.at, n);
  return store_.params().flat(store_.info(id).offset + static_cast<size_t>(p.begin), n);
}

std::vector<DpShards::Range> DpShards::ranges() const {
  std::vector<Range> r;
  for (size_t b = 0; b < buckets_.size(); ++b) r.push_back(bucket(b));
  return r;
}

int64_t DpShards::piece_elements() const {
  int64_t n = 0;
  for (const Piece& p : pieces_) n += p.numel();
  return n;
}

void DpShards::start_reduce_scatter(size_t i) {
  Bucket& b = buckets_[i];
  const size_t L = b.end - b.begin;
  const Tensor out = grads_.flat(b.at, b.shard);
  if (!b.staging.defined()) return comm::start_reduce_scatter(dp_, store_.grads().flat(b.begin, L), out);
  // the bucket padded with zeros to shard x D
  copy(b.staging.flat(0, L), store_.grads().flat(b.begin, L));
  b.staging.flat(L, b.staging.numel() - L).zero();
  comm::start_reduce_scatter(dp_, b.staging, out);
}

void DpShards::all_gather_params() {
  const Tensor& params = store_.params();
  const DType t = params.dtype();
  for (Bucket& b : buckets_) {
    const size_t L = b.end - b.begin;
    const auto [mine, n] = own(b);
    // the f32 send and staging buffers hold the parameters' dtype (2 or 4 bytes) as well
    const Tensor send = Tensor::borrow(send_.raw(), {static_cast<int64_t>(b.shard)}, t, store_.device());
    if (n < b.shard) send.flat(n, b.shard - n).zero();
    if (n > 0) {
      if (masters_.defined()) {  // this rank's half parameters: its masters rounded
        ops::cast(send.flat(0, n), masters_.flat(b.at, n));
      } else {
        copy(send.flat(0, n), params.flat(b.begin + mine, n));
      }
    }
    if (!b.staging.defined()) {
      comm::all_gather(dp_, send, params.flat(b.begin, L));
    } else {
      const Tensor staging = Tensor::borrow(b.staging.raw(), {static_cast<int64_t>(b.shard * static_cast<size_t>(dp_.size()))}, t,
                                            store_.device());
      comm::all_gather(dp_, send, staging);
      copy(params.flat(b.begin, L), staging.flat(0, L));
    }
  }
}

Tensor DpShards::gather_pieces(const Tensor& piece, int64_t offset, const std::vector<int64_t>& shape) const {
  Tensor whole(shape, DType::kF32, store_.device());
  ops::scale(whole, -1.0f);  // -0.0 everywhere: the identity of the sum below
  if (piece.numel() > 0) copy(whole.flat(static_cast<size_t>(offset), piece.numel()), piece);
  comm::all_reduce(dp_, whole, comm::ReduceOp::kSum);
  return whole;
}

std::vector<Tensor> DpShards::whole_masters() const {
  std::vector<Tensor> whole;
  for (size_t i = 0; i < store_.count(); ++i) {
    const auto id = static_cast<int>(i);
    whole.push_back(masters_.defined() ? gather_pieces(master_piece(id), piece(id).begin, store_.info(id).shape)
                                       : store_.param(id));
  }
  return whole;
}

void DpShards::restore_masters(const std::vector<Tensor>& whole) {
  check(whole.size() == store_.count(), "internal error: ", whole.size(), " whole masters for ", store_.count(),
        " parameters");
  for (size_t i = 0; i < store_.count(); ++i) {
    const auto id = static_cast<int>(i);
    const Tensor param = store_.param(id);
    if (!(whole[i].numel() == param.numel() && whole[i].dtype() == DType::kF32))
      fail("internal error: whole master ", whole[i].describe(), " for ", store_.info(id).name);
    if (masters_.defined()) {
      const Piece& p = piece(id);
      copy(master_piece(id), whole[i].flat(static_cast<size_t>(p.begin), static_cast<size_t>(p.numel())));
      ops::cast(param, whole[i]);
    } else if (whole[i].raw() != param.raw()) {
      copy(param, whole[i]);
    }
  }
}

}  // namespace megabatch::optim
