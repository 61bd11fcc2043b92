// CTX_LAUNCH in the emulated build (executor/cuda/launch.cuh): a kernel launch queued on an
// emulated stream. The arguments are converted to the kernel's parameter types and copied now,
// as a real launch copies them; the launch geometry is checked now against sm_90's limits
// (an invalid launch sets cudaGetLastError's error, as on a GPU, and queues nothing); the kernel
// runs on the CPU emulator (cuda_emulator.hpp) when the stream reaches it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>

#include "executor/cuda/emulated/emu_device.hpp"
#include "executor/cuda/tests/cuda_emulator.hpp"

namespace ctx_emu {

// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) as recorded by the emulated runtime
size_t max_dynamic_smem_of(const void* kernel);  // 0: never set

inline Idx to_idx(dim3 d) { return {d.x, d.y, d.z}; }
inline Idx to_idx(unsigned n) { return {n, 1, 1}; }
inline Idx to_idx(int n) { return {static_cast<unsigned>(n), 1, 1}; }
inline Idx to_idx(long n) { return {static_cast<unsigned>(n), 1, 1}; }
inline Idx to_idx(long long n) { return {static_cast<unsigned>(n), 1, 1}; }
inline Idx to_idx(unsigned long n) { return {static_cast<unsigned>(n), 1, 1}; }

template <typename... P>
class Launch {
 public:
  template <typename G, typename B>
  Launch(const char* name, G grid, B block, size_t smem, cudaStream_t stream, void (*kernel)(P...))
      : name_(name), grid_(to_idx(grid)), block_(to_idx(block)), smem_(smem), stream_(stream), kernel_(kernel) {}

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "CTX_LAUNCH: wrong number of kernel arguments");
    std::tuple<std::decay_t<P>...> copied(std::forward<A>(args)...);
    std::lock_guard<std::recursive_mutex> lock(Device::get().mutex());
    // the opt-in is the function's (cudaFuncSetAttribute on its pointer), never another
    // instantiation's that stringifies to the same name ("k<T>")
    if (const size_t most = max_dynamic_smem_of(reinterpret_cast<const void*>(kernel_))) set_max_dynamic_smem(name_, most);
    else max_dynamic_smem().erase(name_);
    try {
      check_launch(name_, grid_, block_, smem_);
    } catch (const std::invalid_argument& e) {
      last_error() = cudaErrorInvalidConfiguration;
      std::fprintf(stderr, "emulated CUDA: %s\n", e.what());
      return;
    }
    Op op;
    op.what = "kernel " + name_;
    auto kernel = kernel_;
    auto name = name_;
    const Idx grid = grid_, block = block_;
    const size_t smem = smem_;
    op.start = [kernel, copied, name, grid, block, smem] {
      launch(name, grid, block, smem, [&] { std::apply(kernel, copied); });
      return true;
    };
    Device::get().enqueue(stream_, std::move(op));
  }

 private:
  std::string name_;
  Idx grid_, block_;
  size_t smem_;
  cudaStream_t stream_;
  void (*kernel_)(P...);
};

template <typename G, typename B, typename... P>
Launch(const char*, G, B, size_t, cudaStream_t, void (*)(P...)) -> Launch<P...>;

}  // namespace ctx_emu
