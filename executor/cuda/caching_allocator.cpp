// The stream-ordered caching allocator (design in caching_allocator.hpp). The block logic is
// verified on the CPU with a fake device (tests/test_caching_allocator.cpp); CudaAllocatorDevice,
// at the bottom, ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md) in the gpu tests and ctxrun runs.
#include "executor/cuda/caching_allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "executor/cuda/cuda_check.hpp"

namespace ctx::exec::cuda {

// An event recorded on `stream` when a block was freed. The pieces of a split block share it;
// when the last piece lets go, the event goes back to the allocator's spares.
struct CachingAllocator::Pending {
  CachingAllocator* owner;
  cudaEvent_t event;
  cudaStream_t stream;
  uint64_t seq;       // record order: on one stream a later event covers an earlier one
  bool done = false;  // memo of a successful query
  Pending(CachingAllocator* o, cudaEvent_t e, cudaStream_t s, uint64_t q) : owner(o), event(e), stream(s), seq(q) {}
  ~Pending() { owner->spare_events_.push_back(event); }
};

struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  int64_t requested = 0;  // live: the bytes asked for
  bool host = false;
  bool large = false;
  bool allocated = false;
  bool in_pending_set = false;
  cudaStream_t stream = nullptr;       // live: the stream it was allocated for
  cudaStream_t wait_stream = nullptr;  // free and pending: the stream of its event (the set's key)
  std::shared_ptr<Pending> pending;    // free: the event to wait for before another stream uses it
  Block* prev = nullptr;               // neighbours in the same segment
  Block* next = nullptr;
};

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}
bool CachingAllocator::ByStreamSize::operator()(const Block* a, const Block* b) const {
  const auto sa = reinterpret_cast<uintptr_t>(a->wait_stream), sb = reinterpret_cast<uintptr_t>(b->wait_stream);
  if (sa != sb) return sa < sb;
  return BySize{}(a, b);
}

namespace {

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

size_t segment_bytes_for(size_t size) {
  if (size <= static_cast<size_t>(CachingAllocator::kSmallRequestBytes))
    return static_cast<size_t>(CachingAllocator::kSmallSegmentBytes);
  if (size < static_cast<size_t>(CachingAllocator::kMediumRequestBytes))
    return static_cast<size_t>(CachingAllocator::kMediumSegmentBytes);
  return round_up(size, static_cast<size_t>(CachingAllocator::kLargeRoundBytes));
}

// Split when the rest is worth keeping: any 512-byte piece in the small pool, more than the
// small-request limit in the large pool (smaller rests stay inside the block, as PyTorch does).
bool should_split(size_t rest, bool large) {
  return large ? rest > static_cast<size_t>(CachingAllocator::kSmallRequestBytes)
               : rest >= static_cast<size_t>(CachingAllocator::kRoundBytes);
}

std::string mib(int64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

CachingAllocator::CachingAllocator(int device, bool managed, cudaStream_t default_stream)
    : CachingAllocator(make_cuda_allocator_device(device, managed), default_stream) {}

CachingAllocator::CachingAllocator(std::unique_ptr<AllocatorDevice> dev, cudaStream_t default_stream)
    : dev_(std::move(dev)), default_stream_(default_stream) {}

CachingAllocator::~CachingAllocator() {
  try {
    dev_->synchronize();
  } catch (...) {  // a destructor must not throw; the device error was or will be reported elsewhere
  }
  // Every segment, live blocks included (tensors that outlived the backend): find the heads.
  std::unordered_set<Block*> heads;
  auto head_of = [](Block* b) {
    while (b->prev) b = b->prev;
    return b;
  };
  for (auto& [p, b] : live_) heads.insert(head_of(b));
  for (auto& kind : pools_)
    for (Pool& pool : kind) {
      for (Block* b : pool.ready) heads.insert(head_of(b));
      for (Block* b : pool.pending) heads.insert(head_of(b));
    }
  for (Block* h : heads) {
    dev_->free(h->ptr, h->host);
    for (Block* b = h; b;) {
      Block* n = b->next;
      delete b;  // drops its Pending: the event goes to the spares
      b = n;
    }
  }
  for (cudaEvent_t e : spare_events_) dev_->event_destroy(e);
}

CachingAllocator::Pool& CachingAllocator::pool_of(const Block* b) { return pools_[b->host ? 1 : 0][b->large ? 1 : 0]; }

void CachingAllocator::insert_free(Block* b) {
  Pool& pool = pool_of(b);
  b->in_pending_set = b->pending != nullptr;
  b->wait_stream = b->pending ? b->pending->stream : nullptr;
  if (b->in_pending_set) pool.pending.insert(b);
  else pool.ready.insert(b);
}

void CachingAllocator::erase_free(Block* b) {
  Pool& pool = pool_of(b);
  if (b->in_pending_set) pool.pending.erase(b);
  else pool.ready.erase(b);
}

CachingAllocator::Block* CachingAllocator::best_fit(Pool& pool, size_t size, cudaStream_t stream) {
  Block key;
  key.size = size;
  key.wait_stream = stream;
  Block* best = nullptr;
  auto r = pool.ready.lower_bound(&key);
  if (r != pool.ready.end()) best = *r;
  auto p = pool.pending.lower_bound(&key);  // the freeing stream reuses its own blocks at once
  if (p != pool.pending.end() && (*p)->wait_stream == stream && (!best || (*p)->size < best->size)) best = *p;
  return best;
}

CachingAllocator::Block* CachingAllocator::try_merge(Block* a, Block* b) {
  // Both free, a directly before b, neither in a set. A completed event is no constraint.
  for (Block* x : {a, b})
    if (x->pending && (x->pending->done || (x->pending->done = dev_->event_done(x->pending->event))))
      x->pending.reset();
  if (a->pending && b->pending && a->pending->stream != b->pending->stream) return nullptr;
  // The merged block waits for the stricter of the two: on one stream the later event covers both.
  std::shared_ptr<Pending> keep = a->pending;
  if (!keep || (b->pending && b->pending->seq > keep->seq)) keep = b->pending;
  a->size += b->size;
  a->next = b->next;
  if (b->next) b->next->prev = a;
  a->pending = std::move(keep);
  delete b;
  return a;
}

void CachingAllocator::free_block(Block* b, cudaStream_t stream) {
  b->allocated = false;
  b->requested = 0;
  b->pending = record_pending(stream);
  coalesce_and_insert(b);
}

void CachingAllocator::coalesce_and_insert(Block* b) {
  // Free neighbours that could not merge (pending on different streams) leave runs of free
  // blocks: merge as far as the constraints allow on both sides.
  for (bool merged = true; merged;) {
    merged = false;
    if (b->prev && !b->prev->allocated) {
      Block* a = b->prev;
      erase_free(a);
      if (Block* m = try_merge(a, b)) {
        b = m;
        merged = true;
      } else {
        insert_free(a);
      }
    }
    if (b->next && !b->next->allocated) {
      Block* c = b->next;
      erase_free(c);
      if (Block* m = try_merge(b, c)) {
        b = m;
        merged = true;
      } else {
        insert_free(c);
      }
    }
  }
  insert_free(b);
}

bool CachingAllocator::promote_completed(Pool& pool) {
  bool any = false;
  for (Block* b : pool.pending)
    if (!b->pending->done && dev_->event_done(b->pending->event)) b->pending->done = true;
  for (;;) {
    auto it = std::find_if(pool.pending.begin(), pool.pending.end(), [](Block* b) { return b->pending->done; });
    if (it == pool.pending.end()) return any;
    Block* b = *it;
    pool.pending.erase(it);
    b->in_pending_set = false;
    b->pending.reset();
    any = true;
    coalesce_and_insert(b);  // now usable by any stream: merge with free neighbours
  }
}

std::shared_ptr<CachingAllocator::Pending> CachingAllocator::record_pending(cudaStream_t stream) {
  cudaEvent_t e;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else {
    e = dev_->event_create();
  }
  dev_->event_record(e, stream);
  return std::make_shared<Pending>(this, e, stream, ++pending_seq_);
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t segment_bytes, bool host, bool large) {
  void* p = dev_->malloc(segment_bytes, host);
  if (!p) return nullptr;
  Block* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = segment_bytes;
  b->host = host;
  b->large = large;
  AllocatorStats& s = stats_[host ? 1 : 0];
  s.reserved_bytes += static_cast<int64_t>(segment_bytes);
  s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, s.reserved_bytes);
  s.segments += 1;
  s.cuda_malloc_calls += 1;
  insert_free(b);
  return b;
}

void CachingAllocator::release_free_segments(bool host, bool only_completed) {
  for (Pool& pool : pools_[host ? 1 : 0]) {
    promote_completed(pool);
    std::vector<Block*> whole;
    for (Block* b : pool.ready)
      if (!b->prev && !b->next) whole.push_back(b);
    if (!only_completed)
      for (Block* b : pool.pending)
        if (!b->prev && !b->next) whole.push_back(b);
    for (Block* b : whole) {
      erase_free(b);
      dev_->free(b->ptr, host);
      AllocatorStats& s = stats_[host ? 1 : 0];
      s.reserved_bytes -= static_cast<int64_t>(b->size);
      s.segments -= 1;
      s.cuda_free_calls += 1;
      delete b;
    }
  }
}

void* CachingAllocator::alloc(int64_t bytes, cudaStream_t stream, const std::string& what, bool host) {
  if (bytes < 0) throw std::invalid_argument("CUDA caching allocator: negative size for " + what);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t size = round_up(static_cast<size_t>(std::max<int64_t>(bytes, 1)), static_cast<size_t>(kRoundBytes));
  const bool large = size > static_cast<size_t>(kSmallRequestBytes);
  Pool& pool = pools_[host ? 1 : 0][large ? 1 : 0];
  Block* b = best_fit(pool, size, stream);
  if (!b && promote_completed(pool)) b = best_fit(pool, size, stream);
  if (!b) b = new_segment(segment_bytes_for(size), host, large);
  if (!b) {
    // Out of memory: wait for the device (every event completes), give the cache back, retry once
    // at the request's own size.
    stats_[host ? 1 : 0].oom_retries += 1;
    dev_->synchronize();
    promote_completed(pool);
    b = best_fit(pool, size, stream);
    if (!b) {
      release_free_segments(host, true);
      b = new_segment(size, host, large);
    }
    if (!b) throw_oom(bytes, size, host, what);
  }
  erase_free(b);
  if (should_split(b->size - size, large)) {
    Block* rest = new Block;
    rest->ptr = b->ptr + size;
    rest->size = b->size - size;
    rest->host = host;
    rest->large = large;
    rest->pending = b->pending;  // still waits for what the whole block waited for
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    insert_free(rest);
  }
  b->allocated = true;
  b->stream = stream;
  b->pending.reset();
  b->requested = bytes;
  live_.emplace(b->ptr, b);
  AllocatorStats& s = stats_[host ? 1 : 0];
  s.allocated_bytes += static_cast<int64_t>(b->size);
  s.requested_bytes += bytes;
  s.live_blocks += 1;
  s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, s.allocated_bytes);
  return b->ptr;
}

void CachingAllocator::free(void* p, cudaStream_t stream) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) throw std::logic_error("CUDA caching allocator: freeing a pointer it did not allocate");
  Block* b = it->second;
  live_.erase(it);
  AllocatorStats& s = stats_[b->host ? 1 : 0];
  s.allocated_bytes -= static_cast<int64_t>(b->size);
  s.requested_bytes -= b->requested;
  s.live_blocks -= 1;
  free_block(b, stream);
}

void CachingAllocator::free_on_block_stream(void* p) {
  if (!p) return;
  cudaStream_t s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) throw std::logic_error("CUDA caching allocator: freeing a pointer it did not allocate");
    s = it->second->stream;
  }
  free(p, s);
}

void CachingAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  release_free_segments(false, true);
  release_free_segments(true, true);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  dev_->synchronize();
  release_free_segments(false, true);
  release_free_segments(true, true);
}

std::string CachingAllocator::check_consistency() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_set<const Block*> heads;
  auto head_of = [](const Block* b) {
    while (b->prev) b = b->prev;
    return b;
  };
  size_t free_blocks = 0;
  for (const auto& [p, b] : live_) {
    if (!b->allocated || b->ptr != p) return "a live block is marked free or keyed by another address";
    heads.insert(head_of(b));
  }
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 2; ++l) {
      const Pool& pool = pools_[h][l];
      for (const Block* b : pool.ready) {
        if (b->allocated || b->pending || b->in_pending_set || b->host != (h == 1) || b->large != (l == 1))
          return "a block in a ready set is allocated, pending or in the wrong pool";
        heads.insert(head_of(b));
      }
      for (const Block* b : pool.pending) {
        if (b->allocated || !b->pending || !b->in_pending_set || b->wait_stream != b->pending->stream)
          return "a block in a pending set is allocated or has no event";
        heads.insert(head_of(b));
      }
      free_blocks += pool.ready.size() + pool.pending.size();
    }
  int64_t reserved[2] = {0, 0}, allocated[2] = {0, 0};
  size_t free_seen = 0;
  for (const Block* hd : heads) {
    for (const Block* b = hd; b; b = b->next) {
      (b->allocated ? allocated : reserved)[b->host ? 1 : 0] += static_cast<int64_t>(b->size);
      if (b->allocated) {
        if (!live_.count(b->ptr)) return "an allocated block is not in the live map";
      } else {
        ++free_seen;
        const Pool& pool = pools_[b->host ? 1 : 0][b->large ? 1 : 0];
        if (b->in_pending_set ? !pool.pending.count(const_cast<Block*>(b)) : !pool.ready.count(const_cast<Block*>(b)))
          return "a free block is missing from its set";
      }
      if (b->next) {
        if (b->next->prev != b || b->ptr + b->size != b->next->ptr) return "segment links are broken";
        const Block* n = b->next;
        if (!b->allocated && !n->allocated) {
          // (a completed event not yet seen by promote_completed is a legitimate, lazy state)
          if (!b->pending || !n->pending || b->pending->stream == n->pending->stream)
            return "two neighbouring free blocks that could merge were left apart";
        }
      }
    }
  }
  if (free_seen != free_blocks) return "a set holds a block that is in no segment";
  for (int h = 0; h < 2; ++h) {
    if (reserved[h] + allocated[h] != stats_[h].reserved_bytes) return "segment sizes do not add up to reserved";
    if (allocated[h] != stats_[h].allocated_bytes) return "live block sizes do not add up to allocated";
  }
  return {};
}

AllocatorStats CachingAllocator::stats(bool host) const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats s = stats_[host ? 1 : 0];
  s.cached_bytes = s.reserved_bytes - s.allocated_bytes;
  return s;
}

void CachingAllocator::throw_oom(int64_t bytes, size_t rounded, bool host, const std::string& what) {
  const AllocatorStats& s = stats_[host ? 1 : 0];
  size_t free_b = 0, total_b = 0;
  dev_->mem_get_info(&free_b, &total_b);
  throw OutOfDeviceMemory(
      std::string("CUDA backend: out of ") + (host ? "pinned host" : "device") + " memory allocating " +
          std::to_string(bytes) + " bytes (" + mib(bytes) + ", " + std::to_string(rounded) + " rounded) for " + what +
          (oom_context_ ? oom_context_() : std::string()) + "; the caching allocator holds " + std::to_string(s.reserved_bytes) + " bytes reserved (" +
          mib(s.reserved_bytes) + ", " + std::to_string(s.segments) + " segments) of which " +
          std::to_string(s.allocated_bytes) + " allocated (" + mib(s.allocated_bytes) +
          ") after giving its cache back; cudaMemGetInfo: " + std::to_string(free_b) + " bytes free (" +
          mib(static_cast<int64_t>(free_b)) + ") of " + std::to_string(total_b) + " (" +
          mib(static_cast<int64_t>(total_b)) + ")",
      bytes);
}

// ---- the CUDA runtime (ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md)) ----

namespace {

class CudaAllocatorDevice final : public AllocatorDevice {
 public:
  CudaAllocatorDevice(int device, bool managed) : device_(device), managed_(managed) {
    int concurrent = 0;
    CTX_CUDA(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device));
    advise_ = managed && concurrent != 0;
  }
  void* malloc(size_t bytes, bool host) override {
    void* p = nullptr;
    cudaError_t e;
    if (host) e = cudaMallocHost(&p, bytes);
    else if (managed_) e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
    else e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the error state of a failed allocation
      return nullptr;
    }
    if (!host && advise_) {
      // Live on the GPU; the CPU maps the pages instead of migrating them (managed is for debugging).
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
  void free(void* p, bool host) override {
    if (host) cudaFreeHost(p);
    else cudaFree(p);
  }
  cudaEvent_t event_create() override {
    cudaEvent_t e = nullptr;
    CTX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void event_destroy(cudaEvent_t e) override { cudaEventDestroy(e); }
  void event_record(cudaEvent_t e, cudaStream_t s) override { CTX_CUDA(cudaEventRecord(e, s)); }
  bool event_done(cudaEvent_t e) override {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return true;
    if (q == cudaErrorNotReady) return false;
    throw_cuda(q, "cudaEventQuery (caching allocator)", __FILE__, __LINE__);
  }
  void synchronize() override { CTX_CUDA(cudaDeviceSynchronize()); }
  void mem_get_info(size_t* f, size_t* t) override {
    if (cudaMemGetInfo(f, t) != cudaSuccess) {
      (void)cudaGetLastError();
      *f = *t = 0;
    }
  }

 private:
  int device_;
  bool managed_;
  bool advise_ = false;  // the device supports concurrent managed access: set placement hints
};

}  // namespace

std::unique_ptr<AllocatorDevice> make_cuda_allocator_device(int device, bool managed) {
  return std::make_unique<CudaAllocatorDevice>(device, managed);
}

}  // namespace ctx::exec::cuda
