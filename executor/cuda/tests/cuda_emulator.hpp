// A CPU emulator of the CUDA execution model, for running the backend's kernel source
// (executor/cuda/*_kernels.cuh) in tests on machines without a GPU. Each block runs its threads
// as cooperative fibers (ucontext) on one OS thread; __syncthreads, __syncthreads_or, warp
// shuffles, __any_sync and __syncwarp are barriers over the block or the warp. Blocks run one
// after another. What it proves: indexing, masking, the algorithms, and that every barrier is
// reached uniformly (a divergent barrier is reported as a deadlock, naming the block). What it
// cannot prove: anything about the GPU's memory model, shared-memory limits, occupancy or speed.
//
// Include this header first, then the .cuh files, in a translation unit that links no CUDA
// kernels (names would collide with nvcc's host stubs).
#pragma once
#include <cuda_runtime_api.h>  // first: its host_defines.h macros are replaced below
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctx_emu {

struct Idx {
  unsigned x = 0, y = 0, z = 0;
};

struct Fiber {
  ucontext_t ctx{};
  std::vector<char> stack;
  Idx tid;
  enum State { run, warp_wait, block_wait, done } state = run;
  unsigned warp_gen = 0, block_gen = 0;
};

struct BlockState {
  Idx block_idx, block_dim, grid_dim;
  std::vector<Fiber> fibers;
  std::vector<float> smem;                      // dynamic shared memory
  std::vector<uint64_t> warp_slots[2];          // [gen % 2][thread]: shuffle and vote exchange
  int block_or[2] = {0, 0};                     // __syncthreads_or accumulators by generation
  std::function<void()> body;
  ucontext_t scheduler{};
  Fiber* current = nullptr;
};

inline BlockState*& state() {
  static BlockState* s = nullptr;
  return s;
}
inline Fiber& me() { return *state()->current; }
inline unsigned my_index() { return me().tid.x + me().tid.y * state()->block_dim.x; }

inline void yield_as(Fiber::State st) {
  Fiber& f = me();
  f.state = st;
  swapcontext(&f.ctx, &state()->scheduler);
}

// ---- the intrinsics the kernels use
inline void syncthreads() {
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
  me().warp_gen++;
  yield_as(Fiber::warp_wait);
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
    f.stack.resize(256 * 1024);
    f.tid = {t % b.block_dim.x, t / b.block_dim.x, 0};
    f.state = Fiber::run;
    f.warp_gen = f.block_gen = 0;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &b.scheduler;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  for (;;) {
    bool ran = false;
    for (auto& f : b.fibers) {
      if (f.state != Fiber::run) continue;
      b.current = &f;
      swapcontext(&b.scheduler, &f.ctx);
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
      throw std::logic_error("emulator: deadlock in block (" + std::to_string(b.block_idx.x) + "," +
                             std::to_string(b.block_idx.y) + "): threads wait at different barriers");
  }
}

// Launches `body` (a call of the kernel with its arguments) over grid x block threads.
inline void launch(Idx grid, Idx block, size_t smem_bytes, std::function<void()> body) {
  BlockState b;
  b.grid_dim = grid;
  b.block_dim = block;
  b.body = std::move(body);
  b.smem.assign(smem_bytes / sizeof(float) + 2, 0.0f);
  state() = &b;
  for (unsigned y = 0; y < grid.y; ++y)
    for (unsigned x = 0; x < grid.x; ++x) {
      b.block_idx = {x, y, 0};
      run_block(b);
    }
  state() = nullptr;
}

}  // namespace ctx_emu

// ---- the CUDA spellings, mapped onto the emulator
#undef __global__
#undef __device__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __shared__ static  // blocks run one at a time: a static is the block's shared array
#define __launch_bounds__(...)
#define threadIdx (::ctx_emu::me().tid)
#define blockIdx (::ctx_emu::state()->block_idx)
#define blockDim (::ctx_emu::state()->block_dim)
#define gridDim (::ctx_emu::state()->grid_dim)
#define __syncthreads() ::ctx_emu::syncthreads()
#define __syncthreads_or(p) ::ctx_emu::syncthreads_or(p)
#define __syncwarp(...) ::ctx_emu::syncwarp()
#define __shfl_sync(m, v, s) ::ctx_emu::shfl_sync(m, v, s)
#define __shfl_xor_sync(m, v, s) ::ctx_emu::shfl_xor_sync(m, v, s)
#define __any_sync(m, p) ::ctx_emu::any_sync(m, p)
#define CTX_DYNAMIC_SMEM(name) float* name = ::ctx_emu::state()->smem.data()
namespace ctx::exec::cuda::dev {
using std::isfinite;  // device code calls it unqualified; sincos is ::sincos (glibc)
}  // namespace ctx::exec::cuda::dev
