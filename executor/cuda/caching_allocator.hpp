// A caching allocator for the CUDA backend: freed blocks are kept per (rounded) size and handed
// out again for the next request of that size, so a training step that repeats the same shapes
// stops calling cudaMalloc* after the first step. The ledger (MemoryLedger, in the Backend base
// class) still sees every tensor allocation and free at its requested size: the cache only
// changes where the bytes come from, never what is accounted. reserved_bytes() is what the
// allocator holds from CUDA (live + cached), the number to set beside the ledger and
// cudaMemGetInfo when explaining a gap between predicted and observed memory.
//
// Kinds: device blocks are cudaMalloc (default since issue 12: strategy code never reads tensor
// memory on the host) or cudaMallocManaged (CudaBackendOptions::managed_memory, for debugging and
// host-staged communicators); host blocks are pinned (cudaMallocHost), so kernels and DMA reach
// them directly. Status: compiles, untested on GPU (docs/CUDA.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ctx::exec::cuda {

enum class BlockKind { managed, device, pinned_host };

class CachingAllocator {
 public:
  CachingAllocator(int device, bool managed_device_memory);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(int64_t bytes, bool host);
  void release(void* p, bool host);
  // Gives every cached (free) block back to CUDA; live blocks stay.
  void trim();

  int64_t reserved_bytes() const { return reserved_[0] + reserved_[1]; }
  int64_t reserved_device_bytes() const { return reserved_[0]; }
  int64_t reserved_host_bytes() const { return reserved_[1]; }
  int64_t cached_bytes() const { return cached_[0] + cached_[1]; }
  int64_t peak_reserved_device_bytes() const { return peak_reserved_device_; }
  int64_t cuda_calls() const { return cuda_calls_; }  // cudaMalloc* calls so far (cache misses)

  static constexpr int64_t kRoundBytes = 512;  // sizes are rounded up to this (alignment of every block)

 private:
  void* cuda_alloc(size_t bytes, bool host);
  void cuda_free(void* p, bool host);
  int device_;
  bool managed_;
  bool advise_ = false;  // the device supports concurrent managed access: set placement hints
  // per kind (0 device, 1 host): size -> free blocks; live block -> size
  std::unordered_map<size_t, std::vector<void*>> free_[2];
  std::unordered_map<void*, size_t> live_[2];
  int64_t reserved_[2] = {0, 0}, cached_[2] = {0, 0};
  int64_t peak_reserved_device_ = 0, cuda_calls_ = 0;
};

}  // namespace ctx::exec::cuda
