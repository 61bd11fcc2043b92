// A CPU emulator of the CUDA execution model, for running the backend's kernel source
// (executor/cuda/*_kernels.cuh) in tests on machines without a GPU. Each block runs its threads
// as cooperative fibers (a register switch on x86-64, ucontext elsewhere) on one OS thread; __syncthreads, __syncthreads_or, warp
// shuffles, __any_sync and __syncwarp are barriers over the block or the warp. A fiber runs
// until it reaches a barrier (or exits), then the next runnable fiber runs: between barriers the
// threads of a block run one after another, never interleaved within a barrier interval. Blocks
// run one after another.
//
// What it checks on every launch (options() turns each off):
//  - barriers are reached uniformly (a divergent barrier is reported as a deadlock, naming the
//    block);
//  - shared-memory races (smem_race_detector.hpp): two threads of a block touching the same
//    shared word, one of them writing, with no __syncthreads (or, within a warp, __syncwarp)
//    between them; reported with the kernel name, the word and both thread ids;
//  - execution-order dependence: with a nonzero seed the blocks run in a seeded random order and,
//    at every round of the scheduler, the runnable threads of a block run in a seeded random
//    order (the seed is in every error the emulator throws; CTX_EMU_SEED sets it);
//  - sm_90 launch limits (check_launch): threads per block, block and grid dimensions, static +
//    dynamic shared memory with the opt-in above 48 KiB (set_max_dynamic_smem, the emulator's
//    cudaFuncSetAttribute(MaxDynamicSharedMemorySize)).
// What it cannot prove: anything about the GPU's memory model beyond barrier ordering (a race
// between blocks through global memory is only caught when it changes a result under some block
// order), occupancy, bank conflicts, or speed. mma_emulator.hpp emulates mma.sync m16n8k16.
//
// Include this header first, then the .cuh files, in a translation unit that links no CUDA
// kernels (names would collide with nvcc's host stubs).
#pragma once
#include <cuda_runtime_api.h>  // first: its host_defines.h macros are replaced below
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/cuda/tests/smem_race_detector.hpp"

namespace ctx_emu {

struct Idx {
  unsigned x = 0, y = 0, z = 0;
};

// Switching between fibers. x86-64: a hand-written switch of the callee-saved registers, the
// stack pointer, MXCSR and the x87 control word (tens of nanoseconds; glibc's swapcontext also
// saves the signal mask, a system call per switch, which made a launch of 16K threads cost a
// second). Elsewhere: ucontext.
#if defined(__x86_64__)
#define CTX_EMU_FAST_SWITCH 1
// Saves the registers on the current stack, stores its pointer in *from, continues on `to`.
__attribute__((naked, noinline)) static void ctx_emu_switch(void** /*from*/, void* /*to*/) {
  asm volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "subq $8, %rsp\n\tstmxcsr (%rsp)\n\tfnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\tfldcw 4(%rsp)\n\taddq $8, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
#endif

// Fiber stacks, kept across launches (allocating and zeroing 256 KiB per thread per launch cost
// more than the kernels): stack(i) is the i-th stack of this OS thread.
inline char* fiber_stack(size_t i, size_t bytes) {
  thread_local std::vector<std::unique_ptr<char[]>> pool;
  while (pool.size() <= i) pool.emplace_back(new char[bytes]);
  return pool[i].get();
}
constexpr size_t kFiberStackBytes = 256 * 1024;

struct Fiber {
  ucontext_t ctx{};
  void* sp = nullptr;  // CTX_EMU_FAST_SWITCH: the saved stack pointer
  Idx tid;
  enum State { run, warp_wait, block_wait, done } state = run;
  unsigned warp_gen = 0, block_gen = 0;
  unsigned fence_gen = 0;  // __syncwarp calls: the warp's memory-ordering points
};

// What launches check, and the schedule seed (0: blocks and threads in index order).
struct Options {
  bool race_check = race::available();
  // blocks checked per launch, the first ones of the schedule (0: all; CTX_EMU_RACE_BLOCKS sets
  // it): each checked access costs two signals, so checking is rationed
  unsigned race_blocks = [] {
    const char* e = std::getenv("CTX_EMU_RACE_BLOCKS");
    return e ? static_cast<unsigned>(std::strtoul(e, nullptr, 0)) : 1u;
  }();
  bool limits = true;
  uint64_t seed = [] {
    const char* e = std::getenv("CTX_EMU_SEED");
    return e ? std::strtoull(e, nullptr, 0) : uint64_t{0x5eed};
  }();
};
inline Options& options() {
  static Options o;
  return o;
}

struct BlockState {
  Idx block_idx, block_dim, grid_dim;
  std::vector<Fiber> fibers;
  race::PageBuffer smem;                        // dynamic shared memory (page-aligned)
  std::vector<uint64_t> warp_slots[2];          // [gen % 2][thread]: shuffle and vote exchange
  int block_or[2] = {0, 0};                     // __syncthreads_or accumulators by generation
  std::function<void()> body;
  ucontext_t scheduler{};
  void* scheduler_sp = nullptr;
  Fiber* current = nullptr;
  std::string kernel;
  std::mt19937_64 rng;
};

inline BlockState*& state() {
  static BlockState* s = nullptr;
  return s;
}
inline Fiber& me() { return *state()->current; }
inline unsigned my_index() { return me().tid.x + me().tid.y * state()->block_dim.x; }

// Each barrier starts with a compiler barrier: the epoch counters (which the race detector reads)
// must not be bumped before the thread's shared-memory accesses that precede the barrier.
#define CTX_EMU_COMPILER_BARRIER() asm volatile("" ::: "memory")
inline void yield_as(Fiber::State st) {
  Fiber& f = me();
  f.state = st;
  // a compiler barrier: the static __shared__ arrays never escape, so without it the compiler may
  // move their loads and stores across the call (an order no GPU barrier allows)
  CTX_EMU_COMPILER_BARRIER();
#if CTX_EMU_FAST_SWITCH
  ctx_emu_switch(&f.sp, state()->scheduler_sp);
#else
  swapcontext(&f.ctx, &state()->scheduler);
#endif
  CTX_EMU_COMPILER_BARRIER();
}

// ---- the intrinsics the kernels use
inline void syncthreads() {
  CTX_EMU_COMPILER_BARRIER();
  me().block_gen++;
  yield_as(Fiber::block_wait);
}
inline int syncthreads_or(int p) {
  BlockState& b = *state();
  const unsigned g = me().block_gen;
  b.block_or[g % 2] |= (p != 0);
  syncthreads();
  return b.block_or[g % 2];
}
inline void syncwarp() {
  CTX_EMU_COMPILER_BARRIER();
  me().warp_gen++;
  yield_as(Fiber::warp_wait);
}
inline void syncwarp_fence() {  // __syncwarp: a barrier that also orders the warp's memory accesses
  CTX_EMU_COMPILER_BARRIER();
  me().fence_gen++;
  syncwarp();
}
template <typename T>
T exchange(T v, unsigned src_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  BlockState& b = *state();
  const unsigned g = me().warp_gen, idx = my_index(), base = idx & ~31u;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  b.warp_slots[g % 2][idx] = bits;
  syncwarp();
  T out;
  std::memcpy(&out, &b.warp_slots[g % 2][base + (src_lane & 31u)], sizeof(T));
  return out;
}
template <typename T>
T shfl_sync(unsigned, T v, int src) { return exchange(v, static_cast<unsigned>(src)); }
template <typename T>
T shfl_xor_sync(unsigned, T v, int mask) { return exchange(v, (my_index() & 31u) ^ static_cast<unsigned>(mask)); }
inline bool any_sync(unsigned, bool p) {
  BlockState& b = *state();
  const unsigned g = me().warp_gen, idx = my_index(), base = idx & ~31u;
  b.warp_slots[g % 2][idx] = p ? 1 : 0;
  syncwarp();
  for (unsigned l = 0; l < 32; ++l)
    if (b.warp_slots[g % 2][base + l]) return true;
  return false;
}

inline void fiber_entry() {
  state()->body();
  me().state = Fiber::done;  // uc_link returns to the scheduler
#if CTX_EMU_FAST_SWITCH
  ctx_emu_switch(&me().sp, state()->scheduler_sp);
  __builtin_trap();  // a finished fiber is never resumed
#endif
}

// Runs one block to completion; throws when the threads deadlock on divergent barriers.
inline void run_block(BlockState& b) {
  const unsigned n = b.block_dim.x * b.block_dim.y;
  if (n % 32 != 0) throw std::logic_error("emulator: block size must be a multiple of 32");
  b.fibers.resize(n);
  for (auto& s : b.warp_slots) s.assign(n, 0);
  b.block_or[0] = b.block_or[1] = 0;
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = b.fibers[t];
    char* stack = fiber_stack(t, kFiberStackBytes);
    f.tid = {t % b.block_dim.x, t / b.block_dim.x, 0};
    f.state = Fiber::run;
    f.warp_gen = f.block_gen = f.fence_gen = 0;
#if CTX_EMU_FAST_SWITCH
    // the frame ctx_emu_switch pops: MXCSR and x87 control word, six registers, then the return
    // address (fiber_entry) and a null return address for it (16-byte alignment as after a call)
    auto top = (reinterpret_cast<uintptr_t>(stack) + kFiberStackBytes) & ~uintptr_t{15};
    auto* frame = reinterpret_cast<uint64_t*>(top) - 9;
    uint32_t mxcsr = 0;
    uint16_t fcw = 0;
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fcw));
    frame[0] = static_cast<uint64_t>(mxcsr) | (static_cast<uint64_t>(fcw) << 32);
    for (int r = 1; r <= 6; ++r) frame[r] = 0;
    frame[7] = reinterpret_cast<uint64_t>(&fiber_entry);
    frame[8] = 0;
    f.sp = frame;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = kFiberStackBytes;
    f.ctx.uc_link = &b.scheduler;
    makecontext(&f.ctx, fiber_entry, 0);
#endif
  }
  std::vector<unsigned> order(n);
  for (unsigned t = 0; t < n; ++t) order[t] = t;
  for (;;) {
    bool ran = false;
    if (options().seed) std::shuffle(order.begin(), order.end(), b.rng);
    for (unsigned t : order) {
      Fiber& f = b.fibers[t];
      if (f.state != Fiber::run) continue;
      b.current = &f;
#if CTX_EMU_FAST_SWITCH
      ctx_emu_switch(&b.scheduler_sp, f.sp);
#else
      swapcontext(&b.scheduler, &f.ctx);
#endif
      b.current = nullptr;
      ran = true;
    }
    // release warps whose live threads all wait at a warp barrier
    bool released = false;
    for (unsigned w = 0; w < n / 32; ++w) {
      unsigned waiting = 0, done = 0;
      for (unsigned l = 0; l < 32; ++l) {
        const auto st = b.fibers[w * 32 + l].state;
        waiting += st == Fiber::warp_wait;
        done += st == Fiber::done;
      }
      if (waiting > 0 && waiting + done == 32) {
        if (done > 0) throw std::logic_error("emulator: a full-warp shuffle/vote while lanes of the warp have exited");
        for (unsigned l = 0; l < 32; ++l) b.fibers[w * 32 + l].state = Fiber::run;
        released = true;
      }
    }
    unsigned at_block = 0, done = 0;
    for (auto& f : b.fibers) {
      at_block += f.state == Fiber::block_wait;
      done += f.state == Fiber::done;
    }
    if (done == n) return;
    if (at_block > 0 && at_block + done == n) {  // exited threads count as arrived
      unsigned gen = 0;
      for (auto& f : b.fibers)
        if (f.state == Fiber::block_wait) gen = f.block_gen;
      b.block_or[gen % 2] = 0;  // the accumulator of the barrier after this one: gen % 2 == (gen_of_this + 1) % 2
      for (auto& f : b.fibers)
        if (f.state == Fiber::block_wait) f.state = Fiber::run;
      released = true;
    }
    if (!ran && !released)
      throw std::logic_error("emulator: " + b.kernel + ": deadlock in block (" + std::to_string(b.block_idx.x) +
                             "," + std::to_string(b.block_idx.y) + "): threads wait at different barriers" +
                             " (schedule seed " + std::to_string(options().seed) + ")");
  }
}

// ---- sm_90 launch limits (compute capability 9.0)
struct Limits {
  static constexpr unsigned threads_per_block = 1024, block_x = 1024, block_y = 1024, block_z = 64;
  static constexpr uint64_t grid_x = (uint64_t{1} << 31) - 1;
  static constexpr unsigned grid_y = 65535, grid_z = 65535;
  static constexpr size_t smem_default = 48 * 1024;   // without the opt-in: static + dynamic
  static constexpr size_t smem_optin = 227 * 1024;    // 228 KB per SM less 1 KB reserved per block
};

// Per kernel name: the dynamic shared memory it may use (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline std::map<std::string, size_t>& max_dynamic_smem() {
  static std::map<std::string, size_t> m;
  return m;
}
// The emulator's cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes):
// refused, as CUDA refuses it, when bytes plus the kernel's static shared memory exceed 227 KiB.
inline void set_max_dynamic_smem(const std::string& kernel, size_t bytes, size_t static_bytes = 0) {
  if (bytes + static_bytes > Limits::smem_optin)
    throw std::invalid_argument("emulator: " + kernel + ": cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " +
                                std::to_string(bytes) + ") exceeds the sm_90 limit of " +
                                std::to_string(Limits::smem_optin) + " bytes of shared memory per block");
  max_dynamic_smem()[kernel] = bytes;
}

// Throws std::invalid_argument naming the kernel and the limit when a launch of this geometry
// would fail on sm_90 (cudaErrorInvalidConfiguration / cudaErrorInvalidValue).
inline void check_launch(const std::string& kernel, Idx grid, Idx block, size_t dyn_smem, size_t static_smem = 0) {
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument("emulator: " + kernel + ": launch exceeds the sm_90 limit: " + what);
  };
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    refuse("a zero grid or block dimension");
  if (threads > Limits::threads_per_block)
    refuse(std::to_string(threads) + " threads per block > " + std::to_string(Limits::threads_per_block));
  if (block.x > Limits::block_x || block.y > Limits::block_y || block.z > Limits::block_z)
    refuse("block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) +
           ") > (1024,1024,64)");
  if (grid.x > Limits::grid_x || grid.y > Limits::grid_y || grid.z > Limits::grid_z)
    refuse("grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
           ") > (2^31-1,65535,65535)");
  if (static_smem > Limits::smem_default)
    refuse(std::to_string(static_smem) + " bytes of static shared memory > 48 KiB");
  const auto it = max_dynamic_smem().find(kernel);
  const size_t allowed = it != max_dynamic_smem().end() ? it->second : Limits::smem_default - static_smem;
  if (dyn_smem > allowed)
    refuse(std::to_string(dyn_smem) + " bytes of dynamic shared memory > " + std::to_string(allowed) +
           (it == max_dynamic_smem().end()
                ? " (48 KiB less static; more needs set_max_dynamic_smem, i.e. cudaFuncSetAttribute)"
                : " (the kernel's MaxDynamicSharedMemorySize)"));
  if (dyn_smem + static_smem > Limits::smem_optin)
    refuse(std::to_string(dyn_smem + static_smem) + " bytes of shared memory > 227 KiB");
}

// The thread the race detector attributes an access to.
inline bool race_who(race::Who& w) {
  BlockState* b = state();
  if (!b || !b->current) return false;
  const Fiber& f = *b->current;
  w = {f.tid.x + f.tid.y * b->block_dim.x, f.block_gen, f.fence_gen};
  return true;
}

}  // namespace ctx_emu
extern "C" {
extern char __start_ctx_emu_shared[] __attribute__((weak));
extern char __stop_ctx_emu_shared[] __attribute__((weak));
}
// A page defined before every kernel's __shared__ array: the linker lays the section out in reverse
// order of definition, so it ends the section and the static arrays' pages hold nothing else
// (checked at launch; otherwise static arrays go unchecked and static_checked() says so).
namespace ctx_emu {
__attribute__((section("ctx_emu_shared"), aligned(4096), used)) static char shared_guard[4096];
inline bool& static_checked() {
  static bool b = false;
  return b;
}


// Launches `body` (a call of the kernel with its arguments) over grid x block threads, after
// checking the launch limits; `kernel` names it in every report. static_smem: the kernel's
// static __shared__ bytes (the emulator cannot see them per kernel), for the limit check.
inline void launch(const std::string& kernel, Idx grid, Idx block, size_t smem_bytes, std::function<void()> body,
                   size_t static_smem = 0) {
  if (options().limits) check_launch(kernel, grid, block, smem_bytes, static_smem);
  BlockState b;
  b.grid_dim = grid;
  b.block_dim = block;
  b.body = std::move(body);
  b.kernel = kernel;
  b.rng.seed(options().seed);
  b.smem.assign(smem_bytes + 2 * sizeof(float));
  std::vector<Idx> blocks;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back({x, y, z});
  if (options().seed) std::shuffle(blocks.begin(), blocks.end(), b.rng);

  race::Detector det;
  const bool check = options().race_check && race::available();
  if (check) {
    race::install_handlers();
    const size_t page = det.page;
    det.kernel = kernel;
    det.who = race_who;
    race::Region dyn;
    dyn.base = b.smem.p;
    dyn.bytes = b.smem.mapped;
    dyn.tracked = b.smem.p;
    dyn.tracked_bytes = smem_bytes;
    dyn.name = "dynamic";
    det.regions.push_back(std::move(dyn));
    if (__start_ctx_emu_shared && +__stop_ctx_emu_shared > +__start_ctx_emu_shared) {  // (as pointers: the linker's section bounds)
      race::Region st;  // every __shared__ array starts a page (see __shared__ below)
      const uintptr_t lo = reinterpret_cast<uintptr_t>(__start_ctx_emu_shared) & ~(page - 1);
      const uintptr_t hi = reinterpret_cast<uintptr_t>(shared_guard);
      st.base = reinterpret_cast<char*>(lo);
      st.bytes = hi - lo;
      st.tracked = __start_ctx_emu_shared;
      st.tracked_bytes = static_cast<size_t>(__stop_ctx_emu_shared - __start_ctx_emu_shared);
      st.name = "static";
      // the handler's own state must not share a page with the static arrays
      const uintptr_t own = reinterpret_cast<uintptr_t>(&race::current());
      uintptr_t guard_end = hi + sizeof(shared_guard), stop = reinterpret_cast<uintptr_t>(__stop_ctx_emu_shared);
      asm volatile("" : "+r"(guard_end), "+r"(stop));  // addresses, not objects: no folding of the comparison
      static_checked() = guard_end == stop && hi > lo && (own < lo || own >= hi);
      st.tracked_bytes = hi - reinterpret_cast<uintptr_t>(__start_ctx_emu_shared);
      if (static_checked()) det.regions.push_back(std::move(st));
    }
    race::current() = &det;
  }
  struct Restore {
    race::Detector* det;
    bool check;
    ~Restore() {
      if (check) {
        det->armed = false;
        det->protect(PROT_READ | PROT_WRITE);
        race::current() = nullptr;
      }
      state() = nullptr;
    }
  } restore{&det, check};
  state() = &b;
  unsigned checked = 0;
  for (const Idx& bi : blocks) {
    b.block_idx = bi;
    const bool check_block = check && (options().race_blocks == 0 || checked++ < options().race_blocks);
    if (check_block) {
      det.block_x = bi.x;
      det.block_y = bi.y;
      for (auto& r : det.regions) r.words.assign(r.tracked_bytes / 4 + 1, {});
      det.armed = true;
      det.protect(PROT_NONE);
    }
    run_block(b);
    if (check_block) {
      det.armed = false;
      det.protect(PROT_READ | PROT_WRITE);
    }
  }
  if (check && !det.reports.empty()) {
    std::string what;
    for (size_t i = 0; i < det.reports.size() && i < 5; ++i) what += det.reports[i].str() + "\n";
    what += std::to_string(det.reports.size()) + " race(s) in all (schedule seed " + std::to_string(options().seed) + ")";
    throw race::RaceError("emulator: " + what, det.reports);
  }
}
inline void launch(Idx grid, Idx block, size_t smem_bytes, std::function<void()> body) {
  launch("(unnamed kernel)", grid, block, smem_bytes, std::move(body));
}

}  // namespace ctx_emu

// ---- the CUDA spellings, mapped onto the emulator
#undef __global__
#undef __device__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
// blocks run one at a time: a static is the block's shared array; each starts a page of the
// section ctx_emu_shared, which the race detector protects
#define __shared__ static __attribute__((section("ctx_emu_shared"), aligned(4096)))
#define __launch_bounds__(...)
#define threadIdx (::ctx_emu::me().tid)
#define blockIdx (::ctx_emu::state()->block_idx)
#define blockDim (::ctx_emu::state()->block_dim)
#define gridDim (::ctx_emu::state()->grid_dim)
#define __syncthreads() ::ctx_emu::syncthreads()
#define __syncthreads_or(p) ::ctx_emu::syncthreads_or(p)
#define __syncwarp(...) ::ctx_emu::syncwarp_fence()
#define __shfl_sync(m, v, s) ::ctx_emu::shfl_sync(m, v, s)
#define __shfl_xor_sync(m, v, s) ::ctx_emu::shfl_xor_sync(m, v, s)
#define __any_sync(m, p) ::ctx_emu::any_sync(m, p)
#define CTX_DYNAMIC_SMEM(name) float* name = ::ctx_emu::state()->smem.data()
namespace ctx::exec::cuda::dev {
using std::isfinite;  // device code calls it unqualified; sincos is ::sincos (glibc)
}  // namespace ctx::exec::cuda::dev
