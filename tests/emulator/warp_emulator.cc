// The warp emulator's scheduler: fibers for the threads of the resident blocks, barriers,
// warp collectives, cp.async groups. See warp_emulator.h.
#include "tests/emulator/warp_emulator.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MB_EMU_ASAN 1
#endif

namespace megabatch::emu {

namespace {

// ---- fibers: a stack each, and a switch between them ----------------------------------
// On x86-64 the switch saves the callee-saved registers on the stack it leaves and takes
// them from the one it enters (the ABI says the caller saved the rest): a few instructions,
// where swapcontext also makes a system call for the signal mask (a third of the emulator's
// time went there). Elsewhere, ucontext.
#if defined(__x86_64__)
extern "C" void mb_emu_switch(void** save_sp, void* to_sp);
asm(R"(
  .text
  .globl mb_emu_switch
  .type mb_emu_switch, @function
mb_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mb_emu_switch, .-mb_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
struct Context {
  void* sp = nullptr;
};
void switch_context(Context& from, Context& to) { mb_emu_switch(&from.sp, to.sp); }
// A context that starts entry() on stack [stack, stack + size): six zero registers, then
// entry as the return address, whose own return slot (never used) sits 8 below a 16-byte
// boundary, as after a call.
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uintptr_t*>(top);
  *--slot = 0;  // entry's return address
  *--slot = reinterpret_cast<uintptr_t>(entry);
  for (int r = 0; r < 6; ++r) *--slot = 0;
  c.sp = slot;
}
#else
struct Context {
  ucontext_t uc{};
};
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
// (a function of its own: getcontext returns twice, and the caller's loop must not see it)
__attribute__((noinline)) void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

constexpr size_t kStack = 512 * 1024;  // a thread's stack (kernels keep their fragments there)

// Stacks of ended threads, for the next ones (a launch of a few thousand blocks would
// otherwise map and unmap as many stacks, slowly under AddressSanitizer).
std::unique_ptr<char[]> take_stack();
void give_stack(std::unique_ptr<char[]> stack);
constexpr int kLanes = 32;
constexpr size_t kSlot = 32;  // bytes a lane deposits at a collective (an mma's a, b, c)

enum class Kind { kNone, kShfl, kMma, kMmaBf16, kLdmatrix, kLdmatrixTrans };

struct Block;
struct Warp;

struct Copy {
  void* dst;
  std::array<unsigned char, 16> bytes;
};

struct Fiber {
  Context ctx;
  std::unique_ptr<char[]> stack;
  Block* block = nullptr;
  Warp* warp = nullptr;
  uint3 idx{};
  int lane = 0;
  bool done = false, waiting = false;
  std::vector<Copy> uncommitted;
  std::deque<std::vector<Copy>> groups;  // committed, oldest first
#ifdef MB_EMU_ASAN
  void* fake_stack = nullptr;
#endif
};

struct Warp {
  int live = 0, arrived = 0;
  Kind kind = Kind::kNone;
  int arg = 0;  // the shuffle's lane mask
  std::array<std::array<unsigned char, kSlot>, kLanes> in{}, out{};
  std::vector<Fiber*> waiting;
};

struct Block {
  uint3 idx{};
  std::vector<unsigned char> storage;  // the shared memory, from a 128-byte boundary
  unsigned char* smem = nullptr;
  std::map<const void*, std::unique_ptr<unsigned char[]>> statics;  // MB_SHARED_ARRAY's, by declaration
  int live = 0, arrived = 0;
  std::vector<Fiber*> waiting;
  std::vector<Warp> warps;
  std::vector<std::unique_ptr<Fiber>> fibers;
};

struct Launch {
  dim3 grid, block;
  size_t smem = 0;
  std::function<void()> kernel;
  std::deque<Fiber*> runnable;
  std::mt19937_64 rng;
  std::string error;
  int64_t idle_polls = 0;  // polls since anything else happened
  int64_t live_fibers = 0;
  Context main;
#ifdef MB_EMU_ASAN
  const void* main_bottom = nullptr;
  size_t main_size = 0;
  void* main_fake_stack = nullptr;
#endif
};

thread_local Options g_options;
thread_local int64_t g_launches = 0;
thread_local int64_t g_mmas = 0;
thread_local int64_t g_philox_blocks = 0;
thread_local Launch* g_launch = nullptr;
thread_local Fiber* g_fiber = nullptr;

Fiber& me() {
  if (!g_fiber) throw std::logic_error("warp emulator: a kernel function was called outside emu::launch");
  return *g_fiber;
}

// back to the scheduler; returns when the scheduler runs this fiber again
void yield() {
  Fiber& f = me();
  Launch& l = *g_launch;
#ifdef MB_EMU_ASAN
  __sanitizer_start_switch_fiber(&f.fake_stack, l.main_bottom, l.main_size);
#endif
  switch_context(f.ctx, l.main);
#ifdef MB_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

// the fibers in `waiting` may run again
void wake(std::vector<Fiber*>& waiting) {
  for (Fiber* f : waiting) {
    f->waiting = false;
    g_launch->runnable.push_back(f);
  }
  waiting.clear();
  g_launch->idle_polls = 0;
}

// blocks this fiber until a wake()
void wait_on(std::vector<Fiber*>& waiting) {
  Fiber& f = me();
  f.waiting = true;
  waiting.push_back(&f);
  yield();
}

std::string where(const Fiber& f) {
  return "block (" + std::to_string(f.block->idx.x) + ", " +
         std::to_string(f.block->idx.y) + ", " + std::to_string(f.block->idx.z) + ") thread (" +
         std::to_string(f.idx.x) + ", " + std::to_string(f.idx.y) + ", " + std::to_string(f.idx.z) + ")";
}

// Ends the launch with an error. The thread never runs again and its frames are never
// unwound, so nothing on its stack may own memory: the message is built here, in the launch.
[[noreturn]] void fail(const char* why, const char* detail = "") {
  Fiber& f = me();
  if (g_launch->error.empty()) g_launch->error = std::string(why) + detail + " (" + where(f) + ")";
  f.done = true;  // the scheduler ends the launch
  yield();
  std::abort();  // (not reached)
}

uint16_t half_bits(uint32_t r, int k) { return static_cast<uint16_t>(k ? r >> 16 : r & 0xffffu); }
float half_value(uint16_t bits, bool bf16) {
  if (bf16) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// The results of a collective for all lanes from what they deposited.
void compute(Warp& w) {
  switch (w.kind) {
    case Kind::kShfl:
      for (int lane = 0; lane < kLanes; ++lane) std::memcpy(w.out[lane].data(), w.in[lane ^ w.arg].data(), 8);
      break;
    case Kind::kMma:
    case Kind::kMmaBf16: {
      ++g_mmas;
      // a lane deposits a[4] and b0, b1 in `in` (bytes 0..15, 16..23) and c[4] in `out`
      const bool bf16 = w.kind == Kind::kMmaBf16;
      float A[16][16], B[16][8];
      for (int lane = 0; lane < kLanes; ++lane) {
        uint32_t a[4], b[2];
        std::memcpy(a, w.in[lane].data(), 16);
        std::memcpy(b, w.in[lane].data() + 16, 8);
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 4; ++r)
          for (int k = 0; k < 2; ++k) {
            const int row = g + (r & 1) * 8, col = 2 * t + (r >> 1) * 8 + k;
            A[row][col] = half_value(half_bits(a[r], k), bf16);
          }
        for (int r = 0; r < 2; ++r)
          for (int k = 0; k < 2; ++k) B[2 * t + r * 8 + k][g] = half_value(half_bits(b[r], k), bf16);
      }
      for (int lane = 0; lane < kLanes; ++lane) {
        float c[4];
        std::memcpy(c, w.out[lane].data(), 16);
        const int g = lane / 4, t = lane % 4;
        for (int e = 0; e < 4; ++e) {
          const int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
          double s = c[e];
          for (int k = 0; k < 16; ++k) s += static_cast<double>(A[row][k]) * B[k][col];
          c[e] = static_cast<float>(s);
        }
        std::memcpy(w.out[lane].data(), c, 16);
      }
      break;
    }
    case Kind::kLdmatrix:
    case Kind::kLdmatrixTrans: {
      const unsigned char* rows[kLanes];
      for (int lane = 0; lane < kLanes; ++lane) std::memcpy(&rows[lane], w.in[lane].data(), sizeof(void*));
      for (int lane = 0; lane < kLanes; ++lane) {
        uint32_t r[4];
        for (int m = 0; m < 4; ++m) {
          if (w.kind == Kind::kLdmatrix) {
            std::memcpy(&r[m], rows[8 * m + lane / 4] + 4 * (lane % 4), 4);
          } else {  // the transposed matrix's row lane / 4: column lane / 4 of rows 2 (lane % 4) and + 1
            uint16_t lo, hi;
            std::memcpy(&lo, rows[8 * m + 2 * (lane % 4)] + 2 * (lane / 4), 2);
            std::memcpy(&hi, rows[8 * m + 2 * (lane % 4) + 1] + 2 * (lane / 4), 2);
            r[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
          }
        }
        std::memcpy(w.out[lane].data(), r, 16);
      }
      break;
    }
    case Kind::kNone:
      break;
  }
}

// Every lane of the warp deposits `in` (and `out`'s start value), the last computes, each
// takes its `out`.
void collective(Kind kind, int arg, const void* in, size_t in_bytes, void* out, size_t out_bytes, bool out_in) {
  Fiber& f = me();
  Warp& w = *f.warp;
  if (w.arrived == 0) {
    w.kind = kind;
    w.arg = arg;
  } else if (w.kind != kind || w.arg != arg) {
    fail("lanes of one warp met at different warp-wide instructions");
  }
  std::memcpy(w.in[f.lane].data(), in, in_bytes);
  if (out_in) std::memcpy(w.out[f.lane].data(), out, out_bytes);
  if (++w.arrived == w.live) {
    compute(w);
    w.arrived = 0;
    wake(w.waiting);
  } else {
    wait_on(w.waiting);
  }
  std::memcpy(out, w.out[f.lane].data(), out_bytes);
}

void apply(const std::vector<Copy>& copies) {
  for (const Copy& c : copies) std::memcpy(c.dst, c.bytes.data(), 16);
}

void thread_exits(Fiber& f) {
  f.done = true;
  --g_launch->live_fibers;
  g_launch->idle_polls = 0;
  Block& b = *f.block;
  Warp& w = *f.warp;
  --w.live;
  if (w.arrived > 0) fail("a thread ended while the other lanes of its warp wait at a warp-wide instruction");
  if (--b.live > 0 && b.arrived == b.live) {  // the others wait at a barrier that now counts them all
    b.arrived = 0;
    wake(b.waiting);
  }
}

void trampoline() {
#ifdef MB_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_launch->main_bottom, &g_launch->main_size);
#endif
  Fiber& f = me();
  g_launch->kernel();
  thread_exits(f);
#ifdef MB_EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, g_launch->main_bottom, g_launch->main_size);
#endif
  Context gone;  // (never entered again)
  switch_context(gone, g_launch->main);
}

thread_local std::vector<std::unique_ptr<char[]>> g_stacks;
std::unique_ptr<char[]> take_stack() {
  if (g_stacks.empty()) return std::unique_ptr<char[]>(new char[kStack]);
  std::unique_ptr<char[]> s = std::move(g_stacks.back());
  g_stacks.pop_back();
#ifdef MB_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(s.get(), kStack);  // (what the last thread's frames left)
#endif
  return s;
}
void give_stack(std::unique_ptr<char[]> stack) {
  if (g_stacks.size() < 4096) g_stacks.push_back(std::move(stack));
}

std::unique_ptr<Block> start_block(Launch& l, int64_t linear) {
  auto b = std::make_unique<Block>();
  b->idx = uint3{static_cast<unsigned>(linear % l.grid.x), static_cast<unsigned>(linear / l.grid.x % l.grid.y),
                 static_cast<unsigned>(linear / (static_cast<int64_t>(l.grid.x) * l.grid.y))};
  const int threads = static_cast<int>(l.block.x * l.block.y * l.block.z);
  b->storage.assign(l.smem + 128, 0xa5);  // not zeros: a kernel that reads what it did not write shows
  b->smem = b->storage.data() + (128 - reinterpret_cast<uintptr_t>(b->storage.data()) % 128) % 128;
  b->live = threads;
  b->warps.resize(static_cast<size_t>((threads + kLanes - 1) / kLanes));
  for (int i = 0; i < threads; ++i) {
    auto f = std::make_unique<Fiber>();
    f->block = b.get();
    f->warp = &b->warps[static_cast<size_t>(i / kLanes)];
    f->warp->live++;
    f->lane = i % kLanes;
    f->idx = uint3{static_cast<unsigned>(i % l.block.x), static_cast<unsigned>(i / l.block.x % l.block.y),
                   static_cast<unsigned>(i / (l.block.x * l.block.y))};
    f->stack = take_stack();
    make_context(f->ctx, f->stack.get(), kStack, trampoline);
    l.runnable.push_back(f.get());
    b->fibers.push_back(std::move(f));
  }
  l.live_fibers += threads;
  return b;
}

}  // namespace

void set_options(const Options& o) { g_options = o; }
const Options& options() { return g_options; }

void launch(const char* name, dim3 grid, dim3 block, size_t smem, std::function<void()> kernel) {
  if (g_launch) throw std::logic_error("warp emulator: a launch from inside a kernel");
  const int threads = static_cast<int>(block.x * block.y * block.z);
  if (threads <= 0 || threads > 1024) throw std::runtime_error(std::string(name) + ": " + std::to_string(threads) + " threads a block");
  Launch l;
  l.grid = grid;
  l.block = block;
  l.smem = smem;
  l.kernel = std::move(kernel);
  l.rng.seed(g_options.seed);
  const int64_t total = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  const int resident = g_options.resident < 1 ? 1 : g_options.resident;
  std::vector<std::unique_ptr<Block>> active;
  int64_t next = 0;
  g_launch = &l;
  while (l.error.empty()) {
    for (size_t i = 0; i < active.size();) {  // blocks whose threads all ended make room
      if (active[i]->live == 0) {
        for (auto& f : active[i]->fibers) give_stack(std::move(f->stack));
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    while (static_cast<int>(active.size()) < resident && next < total) active.push_back(start_block(l, next++));
    if (l.runnable.empty()) {
      if (active.empty()) break;  // every block ran to its end
      l.error = "deadlock: every thread waits at a barrier or a warp-wide instruction that no thread can reach";
      break;
    }
    // round robin: the oldest; random: any one, the last taking its place (the set's order
    // does not matter to a uniform pick, and an erase from the middle cost a move of the rest)
    Fiber* f;
    if (g_options.seed == 0) {
      f = l.runnable.front();
      l.runnable.pop_front();
    } else {
      std::swap(l.runnable[static_cast<size_t>(l.rng() % l.runnable.size())], l.runnable.back());
      f = l.runnable.back();
      l.runnable.pop_back();
    }
    g_fiber = f;
#ifdef MB_EMU_ASAN
    __sanitizer_start_switch_fiber(&l.main_fake_stack, f->stack.get(), kStack);
#endif
    switch_context(l.main, f->ctx);
#ifdef MB_EMU_ASAN
    __sanitizer_finish_switch_fiber(l.main_fake_stack, nullptr, nullptr);
#endif
    g_fiber = nullptr;
    if (!f->done && !f->waiting) l.runnable.push_back(f);  // it yielded to let the others run
    if (l.idle_polls > 1'000'000 + 1'000 * l.live_fibers)
      l.error = "deadlock: the threads still running only poll, for a value that no thread will write";
  }
  g_launch = nullptr;
  if (!l.error.empty()) throw std::runtime_error(std::string("warp emulator: ") + name + ": " + l.error);
  ++g_launches;
}

int64_t launches() { return g_launches; }
int64_t mmas() { return g_mmas; }
int64_t philox_blocks() { return g_philox_blocks; }
void count_philox_block() { ++g_philox_blocks; }

const uint3& thread_index() { return me().idx; }
const uint3& block_index() { return me().block->idx; }
const dim3& block_dim() { return g_launch->block; }
const dim3& grid_dim() { return g_launch->grid; }
unsigned char* dynamic_smem() { return me().block->smem; }

void* static_smem(const void* declaration, size_t bytes) {
  std::unique_ptr<unsigned char[]>& array = me().block->statics[declaration];
  if (!array) {
    array.reset(new unsigned char[bytes]);  // (new's alignment: 16 bytes)
    std::memset(array.get(), 0xa5, bytes);  // not zeros, as the dynamic shared memory
  }
  return array.get();
}

void syncthreads() {
  Block& b = *me().block;
  if (++b.arrived == b.live) {
    b.arrived = 0;
    wake(b.waiting);
    yield();  // (a barrier is a point where the others run)
  } else {
    wait_on(b.waiting);
  }
}

uint64_t shfl_xor_bits(uint64_t v, int lane_mask) {
  uint64_t out = 0;
  collective(Kind::kShfl, lane_mask & 31, &v, 8, &out, 8, false);
  return out;
}

void mma_m16n8k16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1, bool bf16) {
  unsigned char in[24];
  std::memcpy(in, a, 16);
  std::memcpy(in + 16, &b0, 4);
  std::memcpy(in + 20, &b1, 4);
  collective(bf16 ? Kind::kMmaBf16 : Kind::kMma, 0, in, sizeof in, d, 16, true);
}

void ldmatrix_x4(uint32_t* r, const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) fail("ldmatrix: a row address not 16-byte aligned");
  collective(trans ? Kind::kLdmatrixTrans : Kind::kLdmatrix, 0, &row, sizeof row, r, 16, false);
}

void cp_async16(void* dst, const void* src, int src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % 16 != 0))
    fail("cp.async of 16 bytes: an address not 16-byte aligned");
  Copy c{dst, {}};
  if (src_bytes > 0) std::memcpy(c.bytes.data(), src, static_cast<size_t>(src_bytes));
  if (g_options.copies == Copies::kEager) {
    apply({c});
  } else {
    me().uncommitted.push_back(c);
  }
}
void cp_commit() {
  Fiber& f = me();
  f.groups.push_back(std::move(f.uncommitted));
  f.uncommitted.clear();
}
void cp_wait(int groups_in_flight) {
  Fiber& f = me();
  while (static_cast<int>(f.groups.size()) > groups_in_flight) {
    apply(f.groups.front());
    f.groups.pop_front();
  }
}

int atomic_add(int* p, int v) {
  const int old = *p;
  *p = old + v;
  g_launch->idle_polls = 0;
  return old;
}

void poll() {
  ++g_launch->idle_polls;
  yield();
}

void trap(const char* why) { fail("the kernel trapped: ", why); }

float ex2(float x) { return std::exp2(x); }

}  // namespace megabatch::emu
