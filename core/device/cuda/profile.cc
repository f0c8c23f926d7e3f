#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/device/cuda/cuda_profile.h"
#include "core/util/error.h"

namespace megabatch::cuda_profile {

namespace {

constexpr size_t kBufferBytes = 8u << 20;
constexpr size_t kAlign = 8;

std::mutex g_mu;
Collected g_collected;  // filled by CUPTI's buffer-completed callback, under g_mu

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  fail("profile: ", what, " failed: ", msg ? msg : "unknown CUPTI error",
       " (another profiler, e.g. nsys or ncu, may hold the GPU's counters; run without it)");
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : name;
  return short_kernel_name(s);
}

}  // namespace

// "void megabatch::ops::cuda::(anonymous namespace)::softmax<float, true>(float*, int)" ->
// "ops::cuda::softmax": no return type, anonymous namespaces, template arguments or
// parameter list; cuBLASLt's names ("nvjet_sm90_tss_...") stay as they are.
std::string short_kernel_name(std::string s) {
  for (const std::string cut : {"(anonymous namespace)::", "megabatch::"})
    for (size_t at; (at = s.find(cut)) != std::string::npos;) s.erase(at, cut.size());
  std::string out;
  int depth = 0;  // inside <...> or (...)
  for (char ch : s) {
    if (ch == '<' || ch == '(') ++depth;
    if (depth == 0) out += ch;
    if ((ch == '>' || ch == ')') && depth > 0) --depth;
  }
  if (out.rfind("void ", 0) == 0) out.erase(0, 5);
  return out;
}

namespace {

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        g_collected.activities.push_back({k->start, k->end, k->correlationId, false, demangled(k->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        g_collected.activities.push_back({m->start, m->end, m->correlationId, true, "memcpy"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        g_collected.activities.push_back({m->start, m->end, m->correlationId, true, "memset"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
        if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) g_collected.external[e->correlationId] = e->externalId;
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) g_collected.dropped += dropped;
  std::free(buffer);
}

// CUPTI writes an external correlation record only ahead of an API record, so the runtime's
// and the driver's API records are on too (cuBLASLt launches through the driver); they are
// read past.
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET,            CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_DRIVER,            CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

}  // namespace

void start() {
  static std::once_flag registered;
  std::call_once(registered, [] { check(cuptiActivityRegisterCallbacks(requested, completed), "cuptiActivityRegisterCallbacks"); });
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_collected = Collected{};
  }
  for (CUpti_ActivityKind k : kKinds) check(cuptiActivityEnable(k), "cuptiActivityEnable");
}

Collected stop() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
  std::lock_guard<std::mutex> lock(g_mu);
  Collected out = std::move(g_collected);
  g_collected = Collected{};
  return out;
}

uint64_t timestamp() {
  uint64_t t = 0;
  check(cuptiGetTimestamp(&t), "cuptiGetTimestamp");
  return t;
}

void push(uint64_t id) { cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id); }

void pop() {
  uint64_t last = 0;
  cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

}  // namespace megabatch::cuda_profile
