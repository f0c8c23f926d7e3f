#include "core/comm/collectives.h"

#include "core/device/profile.h"
#include "core/device/runtime.h"
#include "core/util/error.h"

namespace megabatch::comm {

// ---- Communicator's device-buffer defaults: communicators without them refuse ----

void Communicator::all_reduce_device(void*, size_t, DType, ReduceOp) {
  fail("the ", backend(), " communicator takes no device buffers (core/comm/collectives.h stages them)");
}
void Communicator::all_gather_device(const void*, void*, size_t, DType) {
  fail("the ", backend(), " communicator takes no device buffers (core/comm/collectives.h stages them)");
}
void Communicator::reduce_scatter_device(const void*, void*, size_t, DType) {
  fail("the ", backend(), " communicator takes no device buffers (core/comm/collectives.h stages them)");
}
void Communicator::broadcast_device(void*, size_t, DType, int) {
  fail("the ", backend(), " communicator takes no device buffers (core/comm/collectives.h stages them)");
}

namespace {

bool native(const Communicator& c, const Tensor& t) { return t.device().is_cuda() && c.device_buffers(); }

void check_float(const Tensor& t, const char* what) {
  if (!is_floating(t.dtype())) fail(what, " of a ", t.describe(), " tensor");
}

// f32 host copies of t and the way back (f64 stays f64 through all_reduce only)
std::vector<float> host(const Tensor& t) { return to_host_f32(t); }
void back(const Tensor& t, const std::vector<float>& v) { copy(t, from_host(v, t.shape(), t.dtype(), t.device())); }

}  // namespace

void all_reduce(Communicator& c, const Tensor& t, ReduceOp op) {
  if (c.size() == 1 || t.numel() == 0) return;
  const profile::Region mark(profile::Family::kCommunication);
  check_float(t, "all_reduce");
  if (native(c, t)) return c.all_reduce_device(t.raw(), t.numel(), t.dtype(), op);
  if (t.device().is_cpu() && t.dtype() == DType::kF32) return c.all_reduce(t.data<float>(), t.numel(), op);
  if (t.device().is_cpu() && t.dtype() == DType::kF64) return c.all_reduce(t.data<double>(), t.numel(), op);
  if (t.dtype() == DType::kF64) {  // on a GPU: f64 is CPU-only, so this is a host mirror
    std::vector<double> v = to_host_f64(t);
    c.all_reduce(v.data(), v.size(), op);
    copy(t, from_host(v, t.shape()));
    return;
  }
  std::vector<float> v = host(t);
  c.all_reduce(v.data(), v.size(), op);
  back(t, v);
}

void all_gather(Communicator& c, const Tensor& in, const Tensor& out) {
  const profile::Region mark(profile::Family::kCommunication);
  if (!(out.numel() == in.numel() * static_cast<size_t>(c.size()) && in.dtype() == out.dtype()))
    fail("all_gather of ", in.describe(), " into ", out.describe(), " over ", c.size(), " ranks");
  check_float(in, "all_gather");
  if (native(c, in)) return c.all_gather_device(in.raw(), out.raw(), in.numel(), in.dtype());
  // the bits, whatever the dtype: no conversion, no rounding
  if (in.device().is_cpu() && out.device().is_cpu()) return c.all_gather_bytes(in.raw(), out.raw(), in.nbytes());
  std::vector<char> a(in.nbytes()), b(out.nbytes());  // a GPU tensor through host memory
  runtime::copy_bytes(a.data(), Device::cpu(), in.raw(), in.device(), a.size());
  c.all_gather_bytes(a.data(), b.data(), a.size());
  runtime::copy_bytes(out.raw(), out.device(), b.data(), Device::cpu(), b.size());
}

void reduce_scatter(Communicator& c, const Tensor& in, const Tensor& out) {
  const profile::Region mark(profile::Family::kCommunication);
  if (!(in.numel() == out.numel() * static_cast<size_t>(c.size()) && in.dtype() == out.dtype()))
    fail("reduce_scatter of ", in.describe(), " into ", out.describe(), " over ", c.size(), " ranks");
  check_float(in, "reduce_scatter");
  if (native(c, in)) return c.reduce_scatter_device(in.raw(), out.raw(), out.numel(), in.dtype());
  if (in.device().is_cpu() && in.dtype() == DType::kF32)
    return c.reduce_scatter(in.data<float>(), out.data<float>(), out.numel());
  std::vector<float> a = host(in), b(out.numel());
  c.reduce_scatter(a.data(), b.data(), b.size());
  back(out, b);
}

void start_all_reduce(Communicator& c, const Tensor& t) {
  if (c.size() == 1 || t.numel() == 0) return;
  const profile::Region mark(profile::Family::kCommunication);
  if (t.dtype() != DType::kF32) fail("start_all_reduce of a ", t.describe(), " tensor (f32 gradients only)");
  if (native(c, t)) return c.start_all_reduce_device(t.raw(), t.numel(), t.dtype());
  if (t.device().is_cpu()) return c.start_all_reduce(t.data<float>(), t.numel());
  all_reduce(c, t, ReduceOp::kSum);
}

void start_reduce_scatter(Communicator& c, const Tensor& in, const Tensor& out) {
  const profile::Region mark(profile::Family::kCommunication);
  if (!(in.numel() == out.numel() * static_cast<size_t>(c.size()) && in.dtype() == DType::kF32 &&
        out.dtype() == DType::kF32))
    fail("start_reduce_scatter of ", in.describe(), " into ", out.describe(), " (f32, size() times the output)");
  if (c.size() == 1) return copy(out, in);
  if (out.numel() == 0) return;
  if (native(c, in)) return c.start_reduce_scatter_device(in.raw(), out.raw(), out.numel(), in.dtype());
  if (in.device().is_cpu()) return c.start_reduce_scatter(in.data<float>(), out.data<float>(), out.numel());
  reduce_scatter(c, in, out);
}

void broadcast(Communicator& c, const Tensor& t, int root) {
  if (c.size() == 1 || t.numel() == 0) return;
  const profile::Region mark(profile::Family::kCommunication);
  check_float(t, "broadcast");
  if (native(c, t)) return c.broadcast_device(t.raw(), t.numel(), t.dtype(), root);
  if (t.device().is_cpu() && t.dtype() == DType::kF32) return c.broadcast(t.data<float>(), t.numel(), root);
  std::vector<float> v = host(t);
  c.broadcast(v.data(), v.size(), root);
  back(t, v);
}

}  // namespace megabatch::comm
