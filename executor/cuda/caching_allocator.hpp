// A stream-ordered, splitting caching allocator for the CUDA backend (PyTorch's design, smaller).
//
//   segments    memory comes from CUDA in segments: a request of at most 1 MiB takes a 2 MiB
//               segment (small pool), up to 10 MiB a 20 MiB segment, larger ones their size rounded
//               up to 2 MiB (large pool). A segment is split into blocks (512-byte granularity); a
//               split is made when the rest is at least 512 bytes (small pool) or above 1 MiB
//               (large pool), so large segments are not shredded into slivers.
//   reuse       best fit across sizes: the smallest free block of the pool that holds the request.
//               Freed neighbours in a segment coalesce. A segment goes back to CUDA only by trim(),
//               empty_cache(), out of memory or the destructor.
//   streams     a block is allocated for a stream and freed on a stream (by default the one it was
//               allocated for); at the free an event is recorded on that stream. The freeing stream
//               may reuse the block at once (its later work is ordered after the earlier use);
//               another stream gets it only after the event completed (cudaEventQuery), so queued
//               kernels that still read or write the block never see it handed to unordered work.
//               Work on other streams that touched the block must be ordered before the free on
//               the freeing stream (cudaStreamWaitEvent): the NCCL communicator does this in wait().
//   out of      the cache is given back (the device is synchronised, so every event has completed,
//   memory      then every whole free segment is cudaFree'd) and the request retried once, at its
//               own size; then OutOfDeviceMemory is thrown naming the bytes requested, the caller's
//               `what` (category, ledger total, predicted peak), the allocator's reserved and
//               allocated bytes and cudaMemGetInfo's free/total. Never oversubscription: device
//               memory is cudaMalloc, managed memory (cudaMallocManaged) only when asked for
//               (CudaBackendOptions::managed_memory, a debugging option).
//   host        pinned host blocks (cudaMallocHost) are a second, separate set of pools with the
//               same rules: kernels and DMA reach them asynchronously too.
//   the ledger  MemoryLedger (in the Backend base class) still sees every tensor allocation at its
//               requested size: the cache changes where the bytes come from, never what is
//               accounted. reserved is what the allocator holds from CUDA (live + cached), the
//               number to put beside the ledger and cudaMemGetInfo when explaining a gap.
//
// Every device call goes through AllocatorDevice, so a test drives the allocator with a fake device
// (executor/cuda/tests/test_caching_allocator.cpp, label cpu). Status: the allocation logic is
// verified on the CPU against that fake; the CUDA calls (CudaAllocatorDevice) ran on one H200 (2026-11-28).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "executor/backend.hpp"  // DeviceOutOfMemory

namespace ctx::exec::cuda {

enum class BlockKind { managed, device, pinned_host };

// What the allocator asks of CUDA. CudaAllocatorDevice is the runtime; tests pass a fake.
class AllocatorDevice {
 public:
  virtual ~AllocatorDevice() = default;
  // A new segment: cudaMalloc / cudaMallocManaged (device pools) or cudaMallocHost (host pools).
  // nullptr when out of memory (the runtime's error state cleared).
  virtual void* malloc(size_t bytes, bool host) = 0;
  virtual void free(void* p, bool host) = 0;
  virtual cudaEvent_t event_create() = 0;
  virtual void event_destroy(cudaEvent_t e) = 0;
  virtual void event_record(cudaEvent_t e, cudaStream_t s) = 0;
  virtual bool event_done(cudaEvent_t e) = 0;  // cudaEventQuery: true when the event has completed
  virtual void synchronize() = 0;              // cudaDeviceSynchronize
  virtual void mem_get_info(size_t* free_bytes, size_t* total_bytes) = 0;
};

// The CUDA runtime for device `device`: cudaMalloc, or cudaMallocManaged with placement hints
// when `managed` (debugging), and cudaMallocHost for host blocks. Ran on one H200 (2026-11-28).
std::unique_ptr<AllocatorDevice> make_cuda_allocator_device(int device, bool managed);

// Thrown when a request cannot be met after the cache was given back. A runtime_error, so callers
// that do not know it still report what(); ctxrun can map it to kExitDoesNotFit.
class OutOfDeviceMemory : public DeviceOutOfMemory {
 public:
  OutOfDeviceMemory(const std::string& msg, int64_t requested) : DeviceOutOfMemory(msg), requested_bytes(requested) {}
  int64_t requested_bytes;
};

struct AllocatorStats {
  int64_t reserved_bytes = 0;        // segments held from CUDA (live + cached)
  int64_t allocated_bytes = 0;       // live blocks (512-byte rounded sizes)
  int64_t requested_bytes = 0;       // live blocks at the sizes asked for
  int64_t cached_bytes = 0;          // reserved - allocated
  int64_t peak_reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t segments = 0;              // segments held now
  int64_t live_blocks = 0;
  int64_t cuda_malloc_calls = 0;     // successful segment allocations (cache misses)
  int64_t cuda_free_calls = 0;
  int64_t oom_retries = 0;           // times the cache was given back to meet a request
};

class CachingAllocator {
 public:
  // The old constructor: the CUDA runtime on `device`. `default_stream` is the stream the old
  // entry points (allocate/release without a stream) allocate for and record their free on:
  // the backend's compute stream (nullptr, the legacy default stream, until the backend passes it).
  CachingAllocator(int device, bool managed_device_memory, cudaStream_t default_stream = nullptr);
  // Any device (tests: a fake).
  CachingAllocator(std::unique_ptr<AllocatorDevice> dev, cudaStream_t default_stream = nullptr);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `bytes` for work queued on `stream`; `what` names the request in the out-of-memory error
  // (e.g. "activations; ledger total 61.2 GiB; predicted peak 63.0 GiB"). Never returns nullptr.
  void* alloc(int64_t bytes, cudaStream_t stream, const std::string& what, bool host = false);
  // Frees `p` after the work queued so far on `stream` (an event is recorded there).
  void free(void* p, cudaStream_t stream);

  // The old entry points: default_stream(), "tensor" as the request's name.
  void* allocate(int64_t bytes, bool host) { return alloc(bytes, default_stream_, "tensor", host); }
  void release(void* p, bool /*host: the block knows its pool*/) { free_on_block_stream(p); }
  void set_default_stream(cudaStream_t s) { default_stream_ = s; }
  // Appended to `what` in an out-of-memory error, computed only then (the backend: the ledger's
  // total and the plan's predicted peak), so no allocation pays for formatting it.
  void set_oom_context(std::function<std::string()> f) { oom_context_ = std::move(f); }
  cudaStream_t default_stream() const { return default_stream_; }

  // Gives every whole free segment whose last use has completed back to CUDA; live blocks stay.
  void trim();
  // Synchronises the device, then gives every whole free segment back.
  void empty_cache();

  AllocatorStats stats(bool host = false) const;
  // Empty when the block structure is sound (tests): links, sets, sums, and no two neighbouring
  // free blocks left apart that could have merged. Otherwise what is wrong.
  std::string check_consistency() const;
  // The old accessors (cuda_backend.cpp's memory report).
  int64_t reserved_bytes() const { return reserved_device_bytes() + reserved_host_bytes(); }
  int64_t reserved_device_bytes() const { return stats(false).reserved_bytes; }
  int64_t reserved_host_bytes() const { return stats(true).reserved_bytes; }
  int64_t cached_bytes() const { return stats(false).cached_bytes + stats(true).cached_bytes; }
  int64_t peak_reserved_device_bytes() const { return stats(false).peak_reserved_bytes; }
  int64_t cuda_calls() const { return stats(false).cuda_malloc_calls + stats(true).cuda_malloc_calls; }

  static constexpr int64_t kRoundBytes = 512;                  // block granularity and alignment
  static constexpr int64_t kSmallRequestBytes = 1 << 20;       // at most this: the small pool
  static constexpr int64_t kSmallSegmentBytes = 2 << 20;       // the small pool's segment
  static constexpr int64_t kMediumRequestBytes = 10 << 20;     // below this: a 20 MiB segment
  static constexpr int64_t kMediumSegmentBytes = 20 << 20;
  static constexpr int64_t kLargeRoundBytes = 2 << 20;         // larger segments: rounded to 2 MiB

 public:
  struct Pending;  // an event recorded at a free, shared by the pieces of a split block
  struct Block;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct ByStreamSize {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct Pool {               // one per (host, small/large)
    std::set<Block*, BySize> ready;          // free, usable by any stream
    std::set<Block*, ByStreamSize> pending;  // free, usable by its stream now, by others after its event
  };

  Pool& pool_of(const Block* b);
  void insert_free(Block* b);
  void erase_free(Block* b);
  Block* best_fit(Pool& pool, size_t size, cudaStream_t stream);
  bool promote_completed(Pool& pool);  // pending blocks whose event completed become ready
  Block* try_merge(Block* a, Block* b);  // a directly before b, both free and out of the sets
  void coalesce_and_insert(Block* b);    // b free and out of the sets
  void free_block(Block* b, cudaStream_t stream);
  void free_on_block_stream(void* p);
  void release_free_segments(bool host, bool only_completed);
  Block* new_segment(size_t segment_bytes, bool host, bool small);
  std::shared_ptr<Pending> record_pending(cudaStream_t stream);
  [[noreturn]] void throw_oom(int64_t bytes, size_t rounded, bool host, const std::string& what);

  std::unique_ptr<AllocatorDevice> dev_;
  cudaStream_t default_stream_;
  std::function<std::string()> oom_context_;
  mutable std::mutex mu_;
  Pool pools_[2][2];  // [host][large]
  std::unordered_map<void*, Block*> live_;
  std::vector<cudaEvent_t> spare_events_;
  uint64_t pending_seq_ = 0;
  AllocatorStats stats_[2];  // [host]
};

}  // namespace ctx::exec::cuda
