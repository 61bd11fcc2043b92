#include "executor/cuda/caching_allocator.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <new>
#include <stdexcept>
#include <string>

#include "executor/cuda/cuda_check.hpp"

namespace ctx::exec::cuda {

CachingAllocator::CachingAllocator(int device, bool managed) : device_(device), managed_(managed) {
  int concurrent = 0;
  CTX_CUDA(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device));
  advise_ = managed && concurrent != 0;
}

CachingAllocator::~CachingAllocator() {
  trim();
  // live blocks at destruction belong to tensors that outlived the backend: give them back too
  for (int h = 0; h < 2; ++h)
    for (auto& [p, bytes] : live_[h]) cuda_free(p, h == 1);
}

void* CachingAllocator::cuda_alloc(size_t bytes, bool host) {
  void* p = nullptr;
  cudaError_t e;
  if (host) e = cudaMallocHost(&p, bytes);
  else if (managed_) e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
  else e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    return nullptr;
  }
  ++cuda_calls_;
  if (!host && advise_) {
    // Live on the GPU; the CPU maps the pages instead of migrating them when the strategy code
    // reads a loss or an LSE on the host (docs/CUDA.md, "Where tensors live").
#if CUDART_VERSION >= 13000
    cudaMemLocation dev{};
    dev.type = cudaMemLocationTypeDevice;
    dev.id = device_;
    cudaMemLocation cpu{};
    cpu.type = cudaMemLocationTypeHost;
    cpu.id = 0;
    CTX_CUDA(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, dev));
    CTX_CUDA(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, cpu));
#else
    CTX_CUDA(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, device_));
    CTX_CUDA(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, cudaCpuDeviceId));
#endif
  }
  return p;
}

void CachingAllocator::cuda_free(void* p, bool host) {
  if (host) cudaFreeHost(p);
  else cudaFree(p);
}

void* CachingAllocator::allocate(int64_t bytes, bool host) {
  const int h = host ? 1 : 0;
  const size_t size = static_cast<size_t>((std::max<int64_t>(bytes, 1) + kRoundBytes - 1) / kRoundBytes * kRoundBytes);
  auto it = free_[h].find(size);
  if (it != free_[h].end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    cached_[h] -= static_cast<int64_t>(size);
    live_[h].emplace(p, size);
    return p;
  }
  void* p = cuda_alloc(size, host);
  if (!p && cached_[h] > 0) {  // out of memory: give the cache back and try once more
    CTX_CUDA(cudaDeviceSynchronize());
    trim();
    p = cuda_alloc(size, host);
  }
  if (!p) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw std::runtime_error(std::string("CUDA backend: out of ") + (host ? "pinned host" : "device") +
                             " memory allocating " + std::to_string(size) + " bytes (allocator holds " +
                             std::to_string(reserved_[h]) + " bytes; cudaMemGetInfo free " + std::to_string(free_b) +
                             " of " + std::to_string(total_b) + ")");
  }
  reserved_[h] += static_cast<int64_t>(size);
  if (!host && reserved_[0] > peak_reserved_device_) peak_reserved_device_ = reserved_[0];
  live_[h].emplace(p, size);
  return p;
}

void CachingAllocator::release(void* p, bool host) {
  if (!p) return;
  const int h = host ? 1 : 0;
  auto it = live_[h].find(p);
  if (it == live_[h].end()) throw std::logic_error("CUDA caching allocator: freeing a pointer it did not allocate");
  const size_t size = it->second;
  live_[h].erase(it);
  free_[h][size].push_back(p);
  cached_[h] += static_cast<int64_t>(size);
}

void CachingAllocator::trim() {
  for (int h = 0; h < 2; ++h) {
    for (auto& [size, blocks] : free_[h]) {
      for (void* p : blocks) {
        cuda_free(p, h == 1);
        reserved_[h] -= static_cast<int64_t>(size);
      }
      blocks.clear();
    }
    free_[h].clear();
    cached_[h] = 0;
  }
}

}  // namespace ctx::exec::cuda
